//! The SDK workers of one environment, and which of them runs a bundle.
//!
//! A bundle goes to the live worker with the fewest bundles running (ties
//! taken in turn), not simply the next one in turn: bundles take very
//! different times, and a worker still busy with a long one should not
//! get another while a neighbour idles. The set also says whether some
//! worker is idle, which is when a long splittable bundle is worth
//! splitting so the idle worker can take half of what remains.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use refract_engine::executor::ExecError;
use refract_sdk_harness::{HarnessError, Worker};
use tracing::warn;

/// Starts a replacement worker for an environment (its argument numbers
/// the replacement, for a unique worker id).
pub type WorkerFactory =
    Arc<dyn Fn(usize) -> BoxFuture<'static, Result<Arc<Worker>, HarnessError>> + Send + Sync>;

/// One worker and how many bundles it is running.
struct Slot {
    worker: Arc<Worker>,
    running: Arc<AtomicUsize>,
}

/// A worker picked for one bundle; the worker counts the bundle as running
/// until this is dropped.
pub struct Lease {
    worker: Arc<Worker>,
    running: Arc<AtomicUsize>,
}

impl Lease {
    /// The worker to run the bundle on.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Workers of one environment. A worker whose connection died (its process
/// crashed, say) is dropped and, once no live worker is left, replaced
/// through the factory, so a retried bundle finds a healthy worker.
pub struct WorkerSet {
    slots: parking_lot::Mutex<Vec<Slot>>,
    next: AtomicUsize,
    replacements: AtomicUsize,
    factory: Option<WorkerFactory>,
    /// Serializes replacements so a burst of failures starts one worker.
    replacing: tokio::sync::Mutex<()>,
}

impl WorkerSet {
    /// A set over already started workers; `factory` starts replacements.
    pub fn new(workers: Vec<Arc<Worker>>, factory: Option<WorkerFactory>) -> Self {
        WorkerSet {
            slots: parking_lot::Mutex::new(workers.into_iter().map(Slot::new).collect()),
            next: AtomicUsize::new(0),
            replacements: AtomicUsize::new(0),
            factory,
            replacing: tokio::sync::Mutex::new(()),
        }
    }

    /// The live worker running the fewest bundles (the next in turn among
    /// equals), leased for one bundle.
    fn lease_live(&self) -> Option<Lease> {
        let mut slots = self.slots.lock();
        slots.retain(|s| match s.worker.disconnected() {
            None => true,
            Some(why) => {
                warn!(worker = %s.worker.id(), reason = %why, "dropping a dead SDK worker");
                false
            }
        });
        let n = slots.len();
        if n == 0 {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let running: Vec<usize> = slots
            .iter()
            .map(|s| s.running.load(Ordering::Relaxed))
            .collect();
        slots.get(least_loaded(&running, start)).map(Slot::lease)
    }

    /// A live worker for one bundle, starting a replacement if none is
    /// left.
    pub async fn lease(&self) -> Result<Lease, ExecError> {
        if let Some(l) = self.lease_live() {
            return Ok(l);
        }
        let _guard = self.replacing.lock().await;
        if let Some(l) = self.lease_live() {
            return Ok(l);
        }
        let Some(factory) = &self.factory else {
            return Err(ExecError::Harness("no live SDK worker".into()));
        };
        let n = self.replacements.fetch_add(1, Ordering::Relaxed);
        let worker = factory(n)
            .await
            .map_err(|e| ExecError::Harness(format!("replacing a dead SDK worker: {e}")))?;
        warn!(worker = %worker.id(), "started a replacement SDK worker");
        let slot = Slot::new(worker);
        let lease = slot.lease();
        self.slots.lock().push(slot);
        Ok(lease)
    }

    /// Whether some live worker runs no bundle at all.
    pub fn has_idle_worker(&self) -> bool {
        self.slots
            .lock()
            .iter()
            .any(|s| s.worker.disconnected().is_none() && s.running.load(Ordering::Relaxed) == 0)
    }

    /// Every worker, for shutdown.
    pub fn workers(&self) -> Vec<Arc<Worker>> {
        self.slots.lock().iter().map(|s| s.worker.clone()).collect()
    }
}

impl Slot {
    fn new(worker: Arc<Worker>) -> Self {
        Slot {
            worker,
            running: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn lease(&self) -> Lease {
        self.running.fetch_add(1, Ordering::Relaxed);
        Lease {
            worker: self.worker.clone(),
            running: self.running.clone(),
        }
    }
}

/// Index of the smallest of `running` (not empty), the first found going
/// round from `start` among equals, so that idle workers take turns.
fn least_loaded(running: &[usize], start: usize) -> usize {
    let n = running.len().max(1);
    (0..n)
        .map(|i| (start + i) % n)
        .min_by_key(|&i| running.get(i).copied().unwrap_or(usize::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::least_loaded;

    #[test]
    fn the_worker_running_fewest_bundles_gets_the_next() {
        assert_eq!(least_loaded(&[2, 0, 1], 0), 1);
        assert_eq!(least_loaded(&[2, 1, 1], 0), 1);
        // Among equals, the first from `start` on.
        assert_eq!(least_loaded(&[1, 1, 1], 2), 2);
        assert_eq!(least_loaded(&[0, 0], 5), 1);
        assert_eq!(least_loaded(&[3], 7), 0);
    }
}
