//! Bundle finalizations in flight.
//!
//! A bundle whose response asks for finalization (a source that will
//! acknowledge, delete or commit what it read) is finalized once the engine
//! has made the bundle's effects durable. That call runs in the
//! background; a job must not end before its calls did, or the SDK's
//! callbacks never run (the workers are stopped first) and a source never
//! hears that its data is safe. Beam's Go tests count those callbacks as
//! soon as the job is done.

use std::future::Future;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinHandle;

/// The finalization calls of one job that may not have finished.
#[derive(Debug, Default)]
pub struct BundleFinalizations {
    calls: Mutex<Vec<JoinHandle<()>>>,
}

impl BundleFinalizations {
    /// Runs `call` in the background, remembering it for [`Self::wait`].
    pub fn spawn(&self, call: impl Future<Output = ()> + Send + 'static) {
        let mut calls = self.calls.lock();
        calls.retain(|c| !c.is_finished());
        calls.push(tokio::spawn(call));
    }

    /// Waits until every call spawned so far has finished, for at most
    /// `limit`; how many had not finished by then (they run on).
    pub async fn wait(&self, limit: Duration) -> usize {
        let calls = std::mem::take(&mut *self.calls.lock());
        let deadline = tokio::time::Instant::now() + limit;
        let mut unfinished = 0;
        for mut call in calls {
            if tokio::time::timeout_at(deadline, &mut call).await.is_err() {
                unfinished += 1;
            }
        }
        unfinished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn waiting_sees_every_call_through_or_gives_up_at_the_limit() {
        let finalizations = BundleFinalizations::default();
        let done = Arc::new(AtomicUsize::new(0));
        for delay in [1, 5] {
            let done = done.clone();
            finalizations.spawn(async move {
                tokio::time::sleep(Duration::from_secs(delay)).await;
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        assert_eq!(finalizations.wait(Duration::from_secs(10)).await, 0);
        assert_eq!(done.load(Ordering::SeqCst), 2);

        finalizations.spawn(async {
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        assert_eq!(finalizations.wait(Duration::from_secs(1)).await, 1);
    }
}
