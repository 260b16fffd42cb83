//! Live views of jobs for the web UI, `/metrics` and OTLP export: the job
//! runner registers each job here with its stream of stage snapshots, its
//! SDK workers and its bundle durations, and readers take the latest
//! values without asking the engine. Finished jobs keep their last
//! snapshot, so a page opened after the end still shows the final
//! watermarks and counts.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use prometheus_client::metrics::histogram::Histogram;
use refract_engine::manager::SavepointRequest;
use refract_engine::manager::StageStats;
use refract_engine::time::wall_clock_ms;
use refract_jobservice::Job;
use refract_proto::job_api::job_state::Enum as JobState;
use refract_store::CheckpointStats;
use tokio::sync::{mpsc, watch};

use crate::bundle_failures::{BundleFailures, FailureGroup};
use crate::stage_history::{SeriesPoint, StageHistory, SAMPLE_EVERY};
use crate::stalled_bundles::StalledBundles;

/// A set of a job's SDK workers, as the job's view counts them: the runner
/// owns the workers, and this crate only asks how many are connected.
pub trait ConnectedWorkers: Send + Sync {
    /// How many of the set's workers have a live connection now.
    fn connected(&self) -> usize;
}

/// What the runner shows of one job.
pub struct JobView {
    job: Arc<Job>,
    stages: watch::Receiver<Vec<StageStats>>,
    /// Bundle durations per stage name.
    latency: Mutex<BTreeMap<String, BundleDurations>>,
    /// The job's SDK workers while it runs (emptied when it ends).
    workers: Mutex<Vec<Arc<dyn ConnectedWorkers>>>,
    /// Its checkpoints so far.
    checkpoints: Mutex<CheckpointSummary>,
    /// Where to ask the running engine for a savepoint.
    savepoints: Mutex<Option<mpsc::Sender<SavepointRequest>>>,
    /// Its failed bundle attempts, by transform.
    failures: Mutex<BundleFailures>,
    /// Its bundles that make no progress now.
    stalled: Arc<StalledBundles>,
    /// Its stages' recent past.
    history: Mutex<StageHistory>,
}

/// One stage's bundle durations: the histogram `/metrics` exports, and
/// their count and sum, which the UI shows.
#[derive(Debug, Clone)]
pub struct BundleDurations {
    /// Bundles by duration, in [`crate::metric_catalog::BUNDLE_DURATION`]'s
    /// buckets.
    pub histogram: Histogram,
    /// Bundles observed.
    pub count: u64,
    /// Their durations' sum, in seconds.
    pub sum_seconds: f64,
}

impl BundleDurations {
    /// Upper bounds of the histogram's buckets, in seconds, on `/metrics`
    /// and in OTLP alike: bundles range from a fraction of a millisecond
    /// (a tiny batch stage) to many seconds (a long SDF restriction).
    pub const BOUNDS_SECONDS: [f64; 14] = [
        0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ];

    /// No bundles yet.
    fn new() -> BundleDurations {
        BundleDurations {
            histogram: Histogram::new(Self::BOUNDS_SECONDS),
            count: 0,
            sum_seconds: 0.0,
        }
    }
}

/// A job's checkpoints, for the UI and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointSummary {
    /// The job checkpoints (the server has a state directory).
    pub enabled: bool,
    /// Checkpoints written by this server.
    pub taken: u64,
    /// Time spent writing them.
    pub total_duration: std::time::Duration,
    /// Bytes written (changed parts only).
    pub bytes_written: u64,
    /// The latest one.
    pub last: Option<CheckpointStats>,
    /// The checkpoint the job was resumed from, if it was.
    pub restored_from: Option<u64>,
    /// Writes that failed.
    pub failed: u64,
    /// Why the latest write failed, when none was written since.
    pub last_error: Option<String>,
    /// When the latest checkpoint was written, or (before the first) when
    /// the job started checkpointing: its age says how much a restart
    /// would redo.
    pub since: Option<std::time::SystemTime>,
}

impl CheckpointSummary {
    /// How long ago the latest checkpoint was written (or checkpointing
    /// started), if the job checkpoints.
    pub fn age(&self) -> Option<std::time::Duration> {
        self.age_at(std::time::SystemTime::now())
    }

    /// [`Self::age`] as of `now`.
    pub fn age_at(&self, now: std::time::SystemTime) -> Option<std::time::Duration> {
        self.since
            .map(|t| now.duration_since(t).unwrap_or(std::time::Duration::ZERO))
    }
}

impl std::fmt::Debug for JobView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobView")
            .field("job", &self.job.id())
            .finish()
    }
}

impl JobView {
    /// The job's id.
    pub fn id(&self) -> &str {
        self.job.id()
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        self.job.name()
    }

    /// The job's state now.
    pub fn state(&self) -> JobState {
        self.job.state()
    }

    /// A page of the job's messages and state changes (see
    /// [`Job::history`]).
    pub fn history(
        &self,
        after: Option<u64>,
        limit: usize,
        keep: &dyn Fn(&refract_jobservice::JobEvent) -> bool,
    ) -> refract_jobservice::HistoryPage {
        self.job.history(after, limit, keep)
    }

    /// The latest stage snapshot (empty before the engine started).
    pub fn stages(&self) -> Vec<StageStats> {
        self.stages.borrow().clone()
    }

    /// Bundle durations per stage, for `/metrics` and the UI (each
    /// histogram shares its counts with the view).
    pub fn bundle_latency(&self) -> Vec<(String, BundleDurations)> {
        self.latency
            .lock()
            .iter()
            .map(|(stage, d)| (stage.clone(), d.clone()))
            .collect()
    }

    /// Adds one bundle of `stage` that took `seconds`.
    pub fn observe_bundle(&self, stage: &str, seconds: f64) {
        let mut latency = self.latency.lock();
        let durations = match latency.get_mut(stage) {
            Some(d) => d,
            None => latency
                .entry(stage.to_string())
                .or_insert_with(BundleDurations::new),
        };
        durations.histogram.observe(seconds);
        durations.count += 1;
        durations.sum_seconds += seconds;
    }

    /// Notes a failed attempt of a bundle of `stage`, with the error the
    /// worker (or the runner) gave.
    pub fn observe_bundle_failure(&self, stage: &str, error: &str) {
        self.failures
            .lock()
            .observe(stage, error, refract_engine::time::wall_clock_ms());
    }

    /// The job's failed bundle attempts, grouped by transform.
    pub fn bundle_failures(&self) -> Vec<FailureGroup> {
        self.failures.lock().groups()
    }

    /// Its running bundles that have made no progress for the stall
    /// timeout; the executor keeps the list.
    pub fn stalled_bundles(&self) -> Arc<StalledBundles> {
        self.stalled.clone()
    }

    /// Samples the latest stage snapshot into the stages' history.
    pub fn record_history(&self, at_ms: i64) {
        let stages = self.stages();
        self.history.lock().record(at_ms, &stages);
    }

    /// Samples the stages every [`SAMPLE_EVERY`] until the job ends, and
    /// once more then, so the charts of an ended job show how it ended.
    pub async fn sample_history_while_running(self: Arc<Self>) {
        let mut ticks = tokio::time::interval(SAMPLE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let ended = refract_jobservice::is_terminal(self.state());
            self.record_history(wall_clock_ms());
            if ended {
                return;
            }
        }
    }

    /// Each stage's recent series (see [`StageHistory::series`]).
    pub fn stage_history(&self) -> Vec<Vec<SeriesPoint>> {
        self.history.lock().series()
    }

    /// Notes a written checkpoint.
    pub fn observe_checkpoint(&self, stats: CheckpointStats) {
        let mut c = self.checkpoints.lock();
        c.taken += 1;
        c.total_duration += stats.duration;
        c.bytes_written += stats.bytes_written;
        c.last = Some(stats);
        c.last_error = None;
        c.since = Some(std::time::SystemTime::now());
    }

    /// Notes a checkpoint that could not be written, and why.
    pub fn observe_checkpoint_failure(&self, error: String) {
        let mut c = self.checkpoints.lock();
        c.failed += 1;
        c.last_error = Some(error);
    }

    /// Lets [`Self::savepoint`] reach the job's engine (`None` when it
    /// stops).
    pub fn set_savepoint_channel(&self, tx: Option<mpsc::Sender<SavepointRequest>>) {
        *self.savepoints.lock() = tx;
    }

    /// A checkpoint of the running job taken now, as parts for a savepoint
    /// file; with `stop`, the job ends (CANCELLED) right after it.
    pub async fn savepoint(&self, stop: bool) -> Result<Vec<(String, Bytes)>, String> {
        let Some(tx) = self.savepoints.lock().clone() else {
            return Err(format!("job {} is not running", self.id()));
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        tx.send(SavepointRequest { stop, reply })
            .await
            .map_err(|_| format!("job {} is not running", self.id()))?;
        answer
            .await
            .map_err(|_| format!("job {} ended before its savepoint", self.id()))?
            .map_err(|e| e.to_string())
    }

    /// Notes that the job checkpoints (from now on).
    pub fn enable_checkpoints(&self) {
        let mut c = self.checkpoints.lock();
        c.enabled = true;
        c.since.get_or_insert_with(std::time::SystemTime::now);
    }

    /// Notes that the job resumed from checkpoint `id`.
    pub fn observe_restore(&self, id: u64) {
        self.checkpoints.lock().restored_from = Some(id);
    }

    /// The job's checkpoints so far.
    pub fn checkpoints(&self) -> CheckpointSummary {
        self.checkpoints.lock().clone()
    }

    /// Tracks the SDK workers of one of the job's environments.
    pub fn add_workers(&self, set: Arc<dyn ConnectedWorkers>) {
        self.workers.lock().push(set);
    }

    /// The job's workers are gone (it ended).
    pub fn clear_workers(&self) {
        self.workers.lock().clear();
    }

    /// SDK workers of the job whose connection is up.
    pub fn live_workers(&self) -> usize {
        self.workers.lock().iter().map(|set| set.connected()).sum()
    }
}

/// Every job's view, shared by the runner, the UI and the exporters.
#[derive(Debug, Default, Clone)]
pub struct Insights {
    jobs: Arc<Mutex<HashMap<String, Arc<JobView>>>>,
}

impl Insights {
    /// Registers `job`; its engine publishes stage snapshots on the
    /// returned sender.
    pub fn register(&self, job: Arc<Job>) -> (Arc<JobView>, watch::Sender<Vec<StageStats>>) {
        let (tx, rx) = watch::channel(Vec::new());
        let view = Arc::new(JobView {
            job: job.clone(),
            stages: rx,
            latency: Mutex::default(),
            workers: Mutex::default(),
            checkpoints: Mutex::default(),
            savepoints: Mutex::default(),
            failures: Mutex::default(),
            stalled: Arc::default(),
            history: Mutex::default(),
        });
        self.jobs.lock().insert(job.id().to_string(), view.clone());
        (view, tx)
    }

    /// The latest snapshot of `job_id`'s stages, if it ever ran.
    pub fn stages(&self, job_id: &str) -> Option<Vec<StageStats>> {
        self.job(job_id).map(|view| view.stages())
    }

    /// One job's view.
    pub fn job(&self, job_id: &str) -> Option<Arc<JobView>> {
        self.jobs.lock().get(job_id).cloned()
    }

    /// Forgets a job's view (the job was deleted or left memory).
    pub fn remove(&self, job_id: &str) {
        self.jobs.lock().remove(job_id);
    }

    /// Every job's view.
    pub fn jobs(&self) -> Vec<Arc<JobView>> {
        self.jobs.lock().values().cloned().collect()
    }

    /// SDK workers connected now, over all jobs.
    pub fn live_workers(&self) -> usize {
        self.jobs().iter().map(|view| view.live_workers()).sum()
    }
}
