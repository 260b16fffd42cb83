//! The SDK workers of one environment, and which of them runs a bundle.
//!
//! A bundle goes to the live worker with the fewest bundles running (ties
//! taken in turn), not simply the next one in turn: bundles take very
//! different times, and a worker still busy with a long one should not
//! get another while a neighbour idles. The set also says whether some
//! worker is idle, which is when a long splittable bundle is worth
//! splitting so the idle worker can take half of what remains.
//!
//! How many bundles the set runs at once is the engine's to keep to, from
//! the set's [`BundleSlots`]: one per worker for an SDK that runs a worker's
//! bundles on one core (no `multi_core_bundle_processing` capability), no
//! bound for one that runs them in parallel.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use refract_engine::bundle_slots::BundleSlots;
use refract_engine::executor::ExecError;
use refract_engine::plan::StageIdx;
use refract_sdk_harness::{HarnessError, Worker};
use tracing::warn;

/// Starts a replacement worker for an environment (its argument numbers
/// the replacement, for a unique worker id).
pub type WorkerFactory =
    Arc<dyn Fn(usize) -> BoxFuture<'static, Result<Arc<Worker>, HarnessError>> + Send + Sync>;

/// How many bundles one worker of an environment runs at once to good
/// effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BundlesPerWorker {
    /// One: the SDK runs a worker's bundles on one core (Python behind its
    /// interpreter lock, TypeScript on its event loop), so a second bundle
    /// beside the first only slows both.
    One,
    /// As many as there is work: the SDK runs bundles in parallel.
    Many,
}

impl BundlesPerWorker {
    /// What an environment declaring `capabilities` runs.
    pub fn of_capabilities(capabilities: &[String]) -> Self {
        if capabilities
            .iter()
            .any(|c| c == refract_proto::urns::protocol::MULTI_CORE_BUNDLE_PROCESSING)
        {
            BundlesPerWorker::Many
        } else {
            BundlesPerWorker::One
        }
    }

    /// The bundles `workers` workers run at once.
    fn capacity(self, workers: usize) -> usize {
        match self {
            BundlesPerWorker::One => workers,
            BundlesPerWorker::Many => usize::MAX,
        }
    }
}

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
    per_worker: BundlesPerWorker,
    /// The engine's bound on the set's bundles, kept to its live workers.
    bundle_slots: Arc<BundleSlots>,
}

impl WorkerSet {
    /// A set over already started workers, each running `per_worker`
    /// bundles at once; `factory` starts replacements.
    pub fn new(
        workers: Vec<Arc<Worker>>,
        factory: Option<WorkerFactory>,
        per_worker: BundlesPerWorker,
    ) -> Self {
        let bundle_slots = Arc::new(BundleSlots::new(per_worker.capacity(workers.len())));
        WorkerSet {
            slots: parking_lot::Mutex::new(workers.into_iter().map(Slot::new).collect()),
            next: AtomicUsize::new(0),
            replacements: AtomicUsize::new(0),
            factory,
            replacing: tokio::sync::Mutex::new(()),
            per_worker,
            bundle_slots,
        }
    }

    /// How many of the set's bundles may run at once, for the engine.
    pub fn bundle_slots(&self) -> Arc<BundleSlots> {
        self.bundle_slots.clone()
    }

    /// Whether splitting a running bundle of `stage` for time lets more
    /// work run: its workers run bundles in parallel, one of them idles,
    /// or another stage of this environment waits for a slot.
    pub fn split_adds_parallelism(&self, stage: StageIdx) -> bool {
        self.per_worker == BundlesPerWorker::Many
            || self.bundle_slots.wanted_by_other_than(stage)
            || self.has_idle_worker()
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
        // A dead worker's slot goes with it (but one is always left: the
        // next lease starts a replacement).
        self.bundle_slots.set_capacity(self.per_worker.capacity(n));
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
        let mut slots = self.slots.lock();
        slots.push(slot);
        self.bundle_slots
            .set_capacity(self.per_worker.capacity(slots.len()));
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
    use super::{least_loaded, BundlesPerWorker};

    #[test]
    fn only_sdks_declaring_multi_core_processing_take_many_bundles_per_worker() {
        let python = vec!["beam:coder:bytes:v1".to_string()];
        assert_eq!(
            BundlesPerWorker::of_capabilities(&python),
            BundlesPerWorker::One
        );
        assert_eq!(BundlesPerWorker::One.capacity(2), 2);
        let java = vec![
            "beam:coder:bytes:v1".to_string(),
            "beam:protocol:multi_core_bundle_processing:v1".to_string(),
        ];
        assert_eq!(
            BundlesPerWorker::of_capabilities(&java),
            BundlesPerWorker::Many
        );
        assert_eq!(BundlesPerWorker::Many.capacity(1), usize::MAX);
    }

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
