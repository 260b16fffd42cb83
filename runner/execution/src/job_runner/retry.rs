//! Waiting between attempts of a streaming job whose failure may pass (a
//! worker that does not start yet, a full disk): someone's long-running
//! job goes on trying, with growing waits, until it works or is cancelled.

use std::time::Duration;

use tokio::sync::watch;

/// The first wait.
const FIRST: Duration = Duration::from_secs(1);
/// The longest wait.
const MAX: Duration = Duration::from_secs(60);

/// Waits that double from [`FIRST`] up to [`MAX`].
#[derive(Debug)]
pub(super) struct Backoff {
    next: Duration,
    attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: FIRST,
            attempts: 0,
        }
    }
}

impl Backoff {
    /// The wait before the next attempt (and counts it).
    pub(super) fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(MAX);
        self.attempts += 1;
        wait
    }

    /// Attempts counted so far.
    pub(super) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Sleeps `wait`; `false` if `cancel` was raised first (or had been).
    pub(super) async fn sleep(wait: Duration, cancel: &mut watch::Receiver<bool>) -> bool {
        let slept = tokio::select! {
            _ = tokio::time::sleep(wait) => true,
            _ = cancel.wait_for(|c| *c) => false,
        };
        slept && !*cancel.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_a_minute() {
        let mut backoff = Backoff::default();
        let waits: Vec<u64> = (0..8).map(|_| backoff.next_wait().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(backoff.attempts(), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancel_ends_the_wait() {
        let (cancel, mut cancelled) = watch::channel(false);
        let waiting = tokio::spawn(async move { Backoff::sleep(MAX, &mut cancelled).await });
        tokio::time::sleep(FIRST).await;
        cancel.send_replace(true);
        assert!(!waiting.await.expect("no panic"));
        let (_cancel, mut quiet) = watch::channel(false);
        assert!(Backoff::sleep(FIRST, &mut quiet).await);
    }
}
