//! How many pipelines are planned at once: a `Prepare` is decoded and
//! validated, and a job that `Run` started is translated, only with a turn
//! from one shared set of [`PlanningSlots`]. Each of those holds the whole
//! pipeline in memory, several times over while it is planned, so their
//! number bounds what requests can make the server hold (see
//! [`crate::JobServiceConfig::max_concurrent_prepares`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use refract_proto::tonic::Status;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The shared turns, and how many `Prepare`s may wait for one.
#[derive(Debug)]
pub(crate) struct PlanningSlots {
    running: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_waiting: usize,
}

/// A turn to plan one pipeline; the slot is free again when it is dropped.
#[derive(Debug)]
pub struct PlanningTurn {
    _permit: OwnedSemaphorePermit,
}

impl PlanningSlots {
    /// `concurrent` turns (at least one); `max_waiting` `Prepare`s may wait.
    pub(crate) fn new(concurrent: usize, max_waiting: usize) -> Self {
        PlanningSlots {
            running: Arc::new(Semaphore::new(concurrent.max(1))),
            waiting: AtomicUsize::new(0),
            max_waiting,
        }
    }

    /// A turn for a `Prepare`, or `RESOURCE_EXHAUSTED` when too many
    /// already wait (each waiting one holds a connection and its stream).
    // `Status` is large, but it is what every tonic handler returns.
    #[allow(clippy::result_large_err)]
    pub(crate) async fn turn(&self) -> Result<PlanningTurn, Status> {
        if let Ok(permit) = Arc::clone(&self.running).try_acquire_owned() {
            return Ok(PlanningTurn { _permit: permit });
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_waiting {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Status::resource_exhausted(format!(
                "more than {} pipelines are waiting to be prepared; try again later",
                self.max_waiting
            )));
        }
        let permit = Arc::clone(&self.running).acquire_owned().await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        permit
            .map(|permit| PlanningTurn { _permit: permit })
            .map_err(|_| Status::unavailable("job service is shutting down"))
    }

    /// A turn for a job already accepted (its `Run`), waiting as long as
    /// it takes: such jobs are few, each was prepared under a turn.
    pub(crate) async fn turn_after_others(&self) -> Option<PlanningTurn> {
        Arc::clone(&self.running)
            .acquire_owned()
            .await
            .ok()
            .map(|permit| PlanningTurn { _permit: permit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_are_shared_and_waiting_prepares_are_bounded() {
        let slots = Arc::new(PlanningSlots::new(1, 1));
        let first = slots.turn().await.expect("a free turn");
        // One Prepare may wait; the next is refused at once.
        let waiting = tokio::spawn({
            let slots = Arc::clone(&slots);
            async move { slots.turn().await.map(|_| ()) }
        });
        while slots.waiting.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let refused = slots.turn().await.expect_err("too many waiting");
        assert_eq!(
            refused.code(),
            refract_proto::tonic::Code::ResourceExhausted
        );
        // A running job's translation waits its turn too.
        let translating = tokio::spawn({
            let slots = Arc::clone(&slots);
            async move { slots.turn_after_others().await.is_some() }
        });
        drop(first);
        assert!(waiting.await.expect("joined").is_ok());
        assert!(translating.await.expect("joined"));
    }
}
