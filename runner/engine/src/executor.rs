//! The boundary between the engine and whatever runs SDK stages.
//!
//! The engine decides *what* to run and *when*; a [`StageExecutor`] runs one
//! bundle of one SDK stage somewhere (an SDK harness, in production; a fake
//! in the engine's tests) and reports what the bundle produced. The engine
//! then commits the bundle's effects atomically — outputs, state writes,
//! timers, residuals — or, if the bundle failed, discards all of them.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use thiserror::Error;

use crate::bundle_slots::BundleSlots;
use crate::plan::{PCollectionIdx, StageIdx};
use crate::spilled_output::SpilledOutput;
use crate::state::BundleState;
use crate::time::Timestamp;

/// One bundle of work for an SDK stage.
pub struct BundleInput {
    /// Which stage.
    pub stage: StageIdx,
    /// Unique id of this bundle attempt (never reused).
    pub bundle_id: String,
    /// On a job on shards, the shard whose engine runs the bundle: what
    /// its commit does (its metrics) belongs to that shard's checkpoints.
    pub shard: Option<crate::shards::ShardId>,
    /// Main-input elements: concatenated nested windowed values in the
    /// stage's input port coder. Each chunk holds whole elements; for
    /// splittable stages each chunk is exactly one element.
    pub elements: Vec<Bytes>,
    /// The encoded length of each element, in order across `elements`: a
    /// split of a bundle that is not splittable is at an element boundary,
    /// and gives back the elements after it.
    pub element_lengths: Vec<usize>,
    /// Where a split may start what it gives back, if only there: the
    /// elements of a stateful stage go grouped by key group, and a split
    /// between two groups gives back keys the bundle then no longer holds
    /// (unless a timer it fires holds them), which another worker can take
    /// at once. Empty: anywhere, or for a stateful stage, nowhere.
    pub split_points: Vec<usize>,
    /// Timers to deliver, per (transform id, timer family id): concatenated
    /// nested timer values. Every family of the stage appears, possibly empty.
    pub timers: Vec<TimerInput>,
    /// The bundle's view of side inputs and user state; writes are tentative
    /// until the engine commits the bundle.
    pub state: Arc<dyn BundleState>,
    /// The job is draining: splittable stages must truncate their
    /// restrictions before processing them.
    pub draining: bool,
    /// Where the executor reports a split of this bundle as soon as the SDK
    /// agreed to it, so that the work split off runs at once (on another
    /// worker) instead of after the bundle.
    pub splits: SplitSink,
}

/// A split the SDK made of a running bundle: the bundle now does its first
/// `kept_elements` input elements and the `primaries`, and the `residuals`
/// are work of their own. If the bundle then fails, only what it kept is
/// done again.
#[derive(Debug, Clone, Default)]
pub struct BundleSplit {
    /// How many of the bundle's input elements, in order, it still does
    /// whole.
    pub kept_elements: usize,
    /// What the bundle keeps of the element it was in: encoded windowed
    /// values in the stage's input port coder (a splittable element's
    /// primary restriction).
    pub primaries: Vec<Bytes>,
    /// The work split off: residual restrictions, and input elements the
    /// bundle will not reach.
    pub residuals: Vec<Residual>,
}

/// Hands a running bundle's splits to the engine.
#[derive(Clone, Default)]
pub struct SplitSink(Option<Arc<dyn Fn(BundleSplit) + Send + Sync>>);

impl SplitSink {
    /// A sink calling `report` with every split.
    pub fn new(report: impl Fn(BundleSplit) + Send + Sync + 'static) -> Self {
        SplitSink(Some(Arc::new(report)))
    }

    /// Whether anyone takes splits (a sink made with `default` does not:
    /// the executor then returns residuals with the bundle's output).
    pub fn is_connected(&self) -> bool {
        self.0.is_some()
    }

    /// Reports `split`.
    pub fn send(&self, split: BundleSplit) {
        if let Some(report) = &self.0 {
            report(split);
        }
    }
}

impl std::fmt::Debug for SplitSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SplitSink")
    }
}

/// Timers for one (transform, family) pair in a bundle.
#[derive(Debug, Clone)]
pub struct TimerInput {
    /// Transform id in the stage's bundle descriptor.
    pub transform_id: String,
    /// Timer family id.
    pub family_id: String,
    /// Concatenated nested-encoded timers.
    pub data: Bytes,
}

/// What a successful bundle produced.
#[derive(Debug, Default)]
pub struct BundleOutput {
    /// Output elements per PCollection (concatenated nested windowed values,
    /// in the PCollection's port coder), in one chunk or several: a
    /// PCollection's chunks, in order, are its output, and an element may
    /// span two of them (an SDK's data messages need not end at element
    /// boundaries, and the runner does not copy them into one buffer).
    pub outputs: Vec<(PCollectionIdx, Bytes)>,
    /// Output that did not fit in memory, per PCollection: it comes before
    /// that PCollection's bytes in `outputs` (see [`crate::spilled_output`]).
    pub spilled: Vec<(PCollectionIdx, SpilledOutput)>,
    /// Timers set or cleared by the bundle, per (transform, family).
    pub timers: Vec<TimerInput>,
    /// Work the SDK deferred (splittable DoFn self-checkpoints).
    pub residuals: Vec<Residual>,
    /// Effects outside the engine that belong to the bundle (its metrics),
    /// applied when the engine commits it: a checkpoint cut then counts
    /// them exactly when it counts the bundle's outputs.
    pub on_commit: Option<CommitAction>,
    /// Something to do once the bundle's effects are durable (bundle
    /// finalization: a source acknowledging what it read): at commit when
    /// the job checkpoints nowhere, else once a checkpoint holding the
    /// commit is written, so that a recovery never redoes work whose input
    /// was already acknowledged away.
    pub on_durable: Option<CommitAction>,
}

/// Something to do when (and only if) the engine commits a bundle.
pub struct CommitAction(Box<dyn FnOnce() + Send>);

impl CommitAction {
    /// Run `action` at the bundle's commit.
    pub fn new(action: impl FnOnce() + Send + 'static) -> Self {
        CommitAction(Box::new(action))
    }

    /// Do it now.
    pub fn run(self) {
        (self.0)()
    }
}

impl std::fmt::Debug for CommitAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitAction")
    }
}

/// A deferred piece of a splittable DoFn's work.
#[derive(Debug, Clone)]
pub struct Residual {
    /// The element, as a nested windowed value in the stage's input port coder.
    pub element: Bytes,
    /// How long to wait before resuming it, in ms.
    pub delay_ms: i64,
    /// The SDK's estimate of the output watermark for this residual.
    pub watermark: Option<Timestamp>,
}

/// Why a bundle failed.
#[derive(Debug, Clone, Error)]
pub enum ExecError {
    /// The SDK reported an error processing the bundle (e.g. a DoFn raised);
    /// the text is the SDK's own (a traceback for Python).
    #[error("{0}")]
    Sdk(String),
    /// The harness could not be reached or died mid-bundle.
    #[error("SDK harness failure: {0}")]
    Harness(String),
    /// The runner could not prepare or read the bundle.
    #[error("runner error: {0}")]
    Runner(String),
}

/// `work` (an executor's bundle or merge), with a panic in it turned into
/// a runner error that names it. The engine runs such work on tasks of its
/// own and waits for their reports: a task that died of a panic would
/// never report, and the job would hang instead of failing.
pub async fn panics_as_errors<T>(
    work: BoxFuture<'static, Result<T, ExecError>>,
) -> Result<T, ExecError> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(work).catch_unwind().await {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            Err(ExecError::Runner(format!(
                "bundle execution panicked: {message}"
            )))
        }
    }
}

/// Runs bundles of SDK stages.
pub trait StageExecutor: Send + Sync {
    /// Run one bundle to completion. The future must not hold the engine's
    /// locks; many bundles may be in flight at once.
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>>;

    /// How many bundles of `stage` may run at once together with the other
    /// stages sharing its slots (see [`crate::bundle_slots`]); `None`: as
    /// many as the engine's own per-stage bound allows.
    fn bundle_slots(&self, stage: StageIdx) -> Option<Arc<BundleSlots>> {
        let _ = stage;
        None
    }

    /// Ask the SDK to merge windows of a custom merging window function for
    /// GroupByKey stage `stage` (see [`crate::window_merge`] for the bytes).
    /// Executors that cannot do this report it as an error, which fails the
    /// job with a message naming what is missing.
    fn merge_windows(
        &self,
        stage: StageIdx,
        bundle_id: String,
        request: Bytes,
    ) -> BoxFuture<'static, Result<Bytes, ExecError>> {
        let _ = (bundle_id, request);
        Box::pin(async move {
            Err(ExecError::Runner(format!(
                "stage {stage} needs a custom merging window function, which this executor cannot run"
            )))
        })
    }
}
