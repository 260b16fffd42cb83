//! The SDK workers of one environment, and which of them runs a bundle.
//!
//! A bundle goes to the live worker with the fewest bundles running (ties
//! taken in turn), not simply the next one in turn: bundles take very
//! different times, and a worker still busy with a long one should not
//! get another while a neighbour idles. The set also says whether some
//! worker is idle, which is when a long splittable bundle is worth
//! splitting so the idle worker can take half of what remains.
//!
//! A set given a target ([`WorkerSet::keep`]; pooled environments, whose
//! workers live on other hosts) keeps that many live workers: a worker
//! lost with its host, or on a pool that went away, is replaced in the
//! background on a live pool, with a pause that doubles while starts
//! fail, and a bundle finding no live worker waits for it. A target may
//! follow the pools' capacity, so a pool added while a job runs gets
//! workers of it. Other sets replace a dead worker when none is left.
//!
//! How many bundles the set runs at once is the engine's to keep to, from
//! the set's [`BundleSlots`]: one per worker for an SDK that runs a worker's
//! bundles on one core (no `multi_core_bundle_processing` capability), no
//! bound for one that runs them in parallel.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use refract_engine::bundle_slots::BundleSlots;
use refract_engine::executor::ExecError;
use refract_engine::plan::StageIdx;
use refract_observability::insights::ConnectedWorkers;
use refract_sdk_harness::{HarnessError, Worker};
use tracing::warn;

/// How many live workers a set keeps, asked each time it looks.
pub type Target = Arc<dyn Fn() -> usize + Send + Sync>;

/// Starts a replacement worker for an environment (its argument numbers
/// the replacement, for a unique worker id).
pub type WorkerFactory =
    Arc<dyn Fn(usize) -> BoxFuture<'static, Result<Arc<Worker>, HarnessError>> + Send + Sync>;

/// The first pause before topping up again after a failed start.
const FIRST_TOP_UP_PAUSE: Duration = Duration::from_millis(500);
/// The longest pause between top-up attempts.
const MAX_TOP_UP_PAUSE: Duration = Duration::from_secs(30);
/// How long a bundle of a set with a target waits for a worker when none
/// is live.
const TOP_UP_WAIT: Duration = Duration::from_secs(300);

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
    /// Live workers to keep, replacing lost ones in the background.
    target: Option<Target>,
    /// A background top-up is running.
    topping_up: AtomicBool,
    /// Signalled when the top-up added a worker.
    grown: tokio::sync::Notify,
    /// The job ended: no more workers are started.
    closed: AtomicBool,
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
            target: None,
            topping_up: AtomicBool::new(false),
            grown: tokio::sync::Notify::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// Keeps as many live workers as `target` says (at least one),
    /// starting more in the background as workers are lost or the target
    /// grows (see the module docs).
    pub fn keep(mut self, target: Target) -> Self {
        self.target = Some(target);
        self
    }

    /// The workers to keep now, if the set keeps a number.
    fn target(&self) -> Option<usize> {
        self.target.as_ref().map(|t| t().max(1))
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
    fn lease_live(self: &Arc<Self>) -> Option<Lease> {
        let mut slots = self.slots.lock();
        slots.retain(|s| match s.worker.disconnected() {
            None => true,
            Some(why) => {
                warn!(worker = %s.worker.id(), reason = %why, "dropping a dead SDK worker");
                false
            }
        });
        let n = slots.len();
        if self.target().is_some_and(|t| n < t) {
            self.top_up();
        }
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

    /// Starts workers in the background if the set has fewer than its
    /// target (which may have grown), unless the job ended. Whether the
    /// set is still in use.
    pub fn top_up_if_short(self: &Arc<Self>) -> bool {
        if self.closed.load(Ordering::Relaxed) {
            return false;
        }
        if self.target().is_some_and(|t| self.live_workers() < t) {
            self.top_up();
        }
        true
    }

    /// Starts workers in the background until the set has its target,
    /// unless that is already under way.
    fn top_up(self: &Arc<Self>) {
        let (Some(_), Some(factory)) = (self.target(), self.factory.clone()) else {
            return;
        };
        if self.closed.load(Ordering::Relaxed) || self.topping_up.swap(true, Ordering::AcqRel) {
            return;
        }
        let set = Arc::clone(self);
        tokio::spawn(async move {
            let mut pause = FIRST_TOP_UP_PAUSE;
            while !set.closed.load(Ordering::Relaxed)
                && set.target().is_some_and(|t| set.live_workers() < t)
            {
                let n = set.replacements.fetch_add(1, Ordering::Relaxed);
                match factory(n).await {
                    Ok(worker) => {
                        pause = FIRST_TOP_UP_PAUSE;
                        if set.closed.load(Ordering::Relaxed) {
                            worker.stop().await;
                            break;
                        }
                        warn!(worker = %worker.id(), "started a replacement SDK worker");
                        {
                            let mut slots = set.slots.lock();
                            slots.push(Slot::new(worker));
                            set.bundle_slots
                                .set_capacity(set.per_worker.capacity(slots.len()));
                        }
                        set.grown.notify_waiters();
                    }
                    Err(error) => {
                        warn!(%error, retry_in = ?pause, "cannot start a replacement SDK worker");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(MAX_TOP_UP_PAUSE);
                    }
                }
            }
            set.topping_up.store(false, Ordering::Release);
        });
    }

    /// Workers still connected.
    fn live_workers(&self) -> usize {
        self.slots
            .lock()
            .iter()
            .filter(|s| s.worker.disconnected().is_none())
            .count()
    }

    /// A live worker for one bundle, starting a replacement if none is
    /// left (a set with a target waits for its top-up instead).
    pub async fn lease(self: &Arc<Self>) -> Result<Lease, ExecError> {
        if let Some(l) = self.lease_live() {
            return Ok(l);
        }
        if self.target.is_some() {
            return self.lease_after_top_up().await;
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

    /// Waits for the background top-up to bring a worker, up to
    /// [`TOP_UP_WAIT`].
    async fn lease_after_top_up(self: &Arc<Self>) -> Result<Lease, ExecError> {
        let deadline = tokio::time::Instant::now() + TOP_UP_WAIT;
        loop {
            let grown = self.grown.notified();
            if let Some(l) = self.lease_live() {
                return Ok(l);
            }
            self.top_up();
            if tokio::time::timeout_at(deadline, grown).await.is_err() {
                return Err(ExecError::Harness(format!(
                    "no live SDK worker: none could be started within {TOP_UP_WAIT:?}"
                )));
            }
        }
    }

    /// Whether some live worker runs no bundle at all.
    pub fn has_idle_worker(&self) -> bool {
        self.slots
            .lock()
            .iter()
            .any(|s| s.worker.disconnected().is_none() && s.running.load(Ordering::Relaxed) == 0)
    }

    /// Every worker.
    pub fn workers(&self) -> Vec<Arc<Worker>> {
        self.slots.lock().iter().map(|s| s.worker.clone()).collect()
    }

    /// Every worker, for shutdown: no worker is started after this.
    pub fn close(&self) -> Vec<Arc<Worker>> {
        self.closed.store(true, Ordering::Relaxed);
        self.workers()
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

impl ConnectedWorkers for WorkerSet {
    fn connected(&self) -> usize {
        self.workers()
            .iter()
            .filter(|w| w.disconnected().is_none())
            .count()
    }
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
