//! Runs the engine's SDK-stage bundles on SDK harness workers.
//!
//! The engine hands over a proto-free [`BundleInput`]; this adapter turns it
//! into a Fn API bundle on a worker of the stage's environment (using the
//! bundle descriptor translation built), and turns the worker's answer back
//! into a [`BundleOutput`]. Metrics of successful bundles are folded into
//! the job's committed metrics when the engine commits the bundle (so a
//! checkpoint holds exactly the metrics of the bundles it holds); a failed
//! bundle's are dropped.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use refract_engine::bundle_slots::BundleSlots;
use refract_engine::executor::{
    BundleInput, BundleOutput, BundleSplit, CommitAction, ExecError, Residual, SplitSink,
    StageExecutor, TimerInput,
};
use refract_engine::plan::StageIdx;
use refract_jobservice::Job;
use refract_observability::stalled_bundles::StalledBundles;
use refract_observability::telemetry::{BundleRecord, BundleRecorder};
use refract_proto::fn_api::{
    instruction_request, instruction_response, process_bundle_split_request,
    process_bundle_split_response, DelayedBundleApplication, ProcessBundleSplitRequest,
    ProcessBundleSplitResponse, StateRequest, StateResponse,
};
use refract_proto::job_api::job_message::MessageImportance;
use refract_sdk_harness::{BundleError, BundleRequest, BundleResult, StateHandler, Worker};
use refract_translate::{SdkStageDescriptor, WindowMerger};
use tracing::{debug, warn};

use crate::bundle_finalizations::BundleFinalizations;
use crate::output_spill::{BundleOutputSpill, JobOutputSpill};
use crate::shard_metrics::ShardMetrics;
use crate::split_policy::SplitPolicy;
use crate::stall_watch::{BundleWatch, StallPolicy};
use crate::state_bridge::StateBridge;
use crate::worker_set::WorkerSet;

/// A [`StageExecutor`] backed by SDK harness workers.
pub struct HarnessExecutor {
    stages: HashMap<StageIdx, Arc<SdkStageDescriptor>>,
    mergers: HashMap<StageIdx, Arc<WindowMerger>>,
    workers: HashMap<String, Arc<WorkerSet>>,
    job: Arc<Job>,
    /// Stage names, for the telemetry of each bundle.
    stage_names: Arc<HashMap<StageIdx, String>>,
    recorder: BundleRecorder,
    /// A bundle that has sent back this many bytes is split (its output
    /// waits in memory until it ends).
    split_output_bytes: u64,
    /// Where a bundle's output past that goes while the bundle runs on
    /// (one element's output cannot be split).
    output_spill: Option<Arc<JobOutputSpill>>,
    /// Finalization calls the job must see through before it ends.
    finalizations: Arc<BundleFinalizations>,
    /// The job runs with streaming semantics: long bundles are split for
    /// time whatever else could run, so their outputs reach consumers.
    streaming: bool,
    /// How bundles without progress are found, and where they are listed.
    stall: Option<(StallPolicy, Arc<StalledBundles>)>,
    /// On a job on shards: each shard's committed metrics, for its cuts.
    shard_metrics: Option<Arc<ShardMetrics>>,
}

/// A deferred application (an SDK checkpoint or the residual of a split)
/// as the engine's residual.
fn residual(r: &DelayedBundleApplication) -> Option<Residual> {
    let app = r.application.as_ref()?;
    let delay_ms = r
        .requested_time_delay
        .as_ref()
        .map(|d| d.seconds * 1000 + i64::from(d.nanos) / 1_000_000)
        .unwrap_or(0);
    let watermark = app
        .output_watermarks
        .values()
        .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
        .min();
    Some(Residual {
        element: bytes::Bytes::copy_from_slice(&app.element),
        delay_ms,
        watermark,
    })
}

/// Output of a bundle past which it is split, without a budget.
const DEFAULT_SPLIT_OUTPUT_BYTES: u64 = 64 << 20;

/// How often a running bundle's output size is looked at.
const SPLIT_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// What a split of a running bundle gave.
struct SplitOutcome {
    /// Residual restrictions and the input elements the bundle will not
    /// reach.
    residuals: Vec<Residual>,
    /// The new end of the bundle's inputs.
    end: usize,
    /// How many input elements the bundle still does whole, and its
    /// primary restrictions, when the SDK said (a channel split, or a
    /// one-element bundle).
    kept: Option<(usize, Vec<bytes::Bytes>)>,
}

/// Ask the SDK to split the bundle `bundle_id` reading `source`, keeping
/// `fraction` of what remains (giving back from one of `allowed` element
/// indices, if any are given). What the SDK gives back — residual
/// restrictions, and the input elements it will not reach (`inputs` are
/// the bundle's elements not given back by an earlier split) — becomes
/// residual work for the engine. Failures are logged and mean no split:
/// the bundle simply runs to the end.
async fn split_bundle(
    worker: &Worker,
    bundle_id: &str,
    source: &str,
    inputs: &[bytes::Bytes],
    fraction: f64,
    allowed: &[usize],
) -> SplitOutcome {
    let unsplit = SplitOutcome {
        residuals: Vec::new(),
        end: inputs.len(),
        kept: None,
    };
    let request = instruction_request::Request::ProcessBundleSplit(ProcessBundleSplitRequest {
        instruction_id: bundle_id.to_string(),
        desired_splits: [(
            source.to_string(),
            process_bundle_split_request::DesiredSplit {
                fraction_of_remainder: fraction,
                estimated_input_elements: inputs.len() as i64,
                allowed_split_points: allowed
                    .iter()
                    .filter_map(|&at| i64::try_from(at).ok())
                    .collect(),
            },
        )]
        .into_iter()
        .collect(),
    });
    let response = match worker.instruct(request).await {
        Ok(r) if r.error.is_empty() => r,
        Ok(r) => {
            debug!(bundle = bundle_id, error = %r.error, "split refused");
            return unsplit;
        }
        Err(e) => {
            debug!(bundle = bundle_id, error = %e, "split failed");
            return unsplit;
        }
    };
    let Some(instruction_response::Response::ProcessBundleSplit(split)) = response.response else {
        return unsplit;
    };
    let mut out: Vec<Residual> = split.residual_roots.iter().filter_map(residual).collect();
    let primaries: Vec<bytes::Bytes> = split
        .primary_roots
        .iter()
        .map(|p| bytes::Bytes::copy_from_slice(&p.element))
        .collect();
    let mut end = inputs.len();
    let mut kept = None;
    for channel in channel_splits_of(&split, source) {
        let first = usize::try_from(channel.first_residual_element)
            .unwrap_or(usize::MAX)
            .min(end);
        out.extend(inputs[first..end].iter().map(|element| Residual {
            element: element.clone(),
            delay_ms: 0,
            watermark: None,
        }));
        end = first;
        // `last_primary_element` is -1 when the split is in the first one.
        let whole = usize::try_from(channel.last_primary_element.saturating_add(1))
            .unwrap_or(0)
            .min(first);
        kept = Some((whole, primaries.clone()));
    }
    if kept.is_none() && inputs.len() == 1 && !primaries.is_empty() {
        kept = Some((0, primaries));
    }
    if out.is_empty() {
        kept = None;
    }
    debug!(
        bundle = bundle_id,
        residuals = out.len(),
        fraction,
        "bundle split"
    );
    SplitOutcome {
        residuals: out,
        end,
        kept,
    }
}

/// The channel splits of `split` that are about the data input `source`.
/// Java's harness (2.x) leaves a channel split's `transform_id` empty; the
/// split was asked for `source` alone, so an empty one is about it too.
/// Ignoring it would lose the elements after the split point: the SDK
/// stops there whatever the runner makes of its answer.
fn channel_splits_of<'a>(
    split: &'a ProcessBundleSplitResponse,
    source: &'a str,
) -> impl Iterator<Item = &'a process_bundle_split_response::ChannelSplit> + 'a {
    split
        .channel_splits
        .iter()
        .filter(move |c| c.transform_id == source || c.transform_id.is_empty())
}

/// State for bundles that must not use any (window merging).
struct NoState;

impl StateHandler for NoState {
    fn handle(&self, req: &StateRequest) -> StateResponse {
        StateResponse {
            id: req.id.clone(),
            error: "this bundle has no state".into(),
            response: None,
        }
    }
}

impl HarnessExecutor {
    /// An executor for one job's SDK stages and the workers of their environments.
    pub fn new(
        stages: HashMap<StageIdx, Arc<SdkStageDescriptor>>,
        mergers: HashMap<StageIdx, Arc<WindowMerger>>,
        workers: HashMap<String, Arc<WorkerSet>>,
        job: Arc<Job>,
        stage_names: HashMap<StageIdx, String>,
        recorder: BundleRecorder,
    ) -> Self {
        HarnessExecutor {
            stages,
            mergers,
            workers,
            job,
            stage_names: Arc::new(stage_names),
            recorder,
            split_output_bytes: DEFAULT_SPLIT_OUTPUT_BYTES,
            output_spill: None,
            finalizations: Arc::default(),
            streaming: false,
            stall: None,
            shard_metrics: None,
        }
    }

    /// Follow each bundle's progress reports, list those that make none
    /// for `policy`'s timeout in `stalled`, and tell the job (failing them
    /// if the policy says so; see [`refract_observability::stalled_bundles`]).
    pub fn with_stall_watch(mut self, policy: StallPolicy, stalled: Arc<StalledBundles>) -> Self {
        self.stall = Some((policy, stalled));
        self
    }

    /// Runs a streaming job's bundles (see [`SplitPolicy`]).
    pub fn with_streaming(mut self, streaming: bool) -> Self {
        self.streaming = streaming;
        self
    }

    /// The bundle finalization calls this executor starts, for the job to
    /// wait for before it ends.
    pub fn finalizations(&self) -> Arc<BundleFinalizations> {
        self.finalizations.clone()
    }

    /// Split a bundle once its output reaches `bytes` (its part of a
    /// stage's share of the job's memory budget: the share over the
    /// bundles a stage may run at once) — a splittable one also after it
    /// has run for a while.
    pub fn with_split_output_bytes(mut self, bytes: usize) -> Self {
        self.split_output_bytes = bytes as u64;
        self
    }

    /// Keeps each shard's committed metrics in `metrics` too, as well as
    /// the job's (a job on shards; see [`ShardMetrics`]).
    pub fn with_shard_metrics(mut self, metrics: Arc<ShardMetrics>) -> Self {
        self.shard_metrics = Some(metrics);
        self
    }

    /// Write a bundle's output to `spill` once more of it waits in memory
    /// than its limit, instead of holding it all until the bundle ends.
    pub fn with_output_spill(mut self, spill: JobOutputSpill) -> Self {
        self.output_spill = Some(Arc::new(spill));
        self
    }
}

impl StageExecutor for HarnessExecutor {
    fn bundle_slots(&self, stage: StageIdx) -> Option<Arc<BundleSlots>> {
        let environment = &self.stages.get(&stage)?.environment_id;
        Some(self.workers.get(environment)?.bundle_slots())
    }

    fn merge_windows(
        &self,
        stage: StageIdx,
        bundle_id: String,
        request: bytes::Bytes,
    ) -> BoxFuture<'static, Result<bytes::Bytes, ExecError>> {
        let Some(merger) = self.mergers.get(&stage).cloned() else {
            let msg = format!("no window merger for stage {stage}");
            return async move { Err(ExecError::Runner(msg)) }.boxed();
        };
        let Some(set) = self.workers.get(&merger.environment_id).cloned() else {
            let msg = format!("no worker for environment '{}'", merger.environment_id);
            return async move { Err(ExecError::Runner(msg)) }.boxed();
        };
        async move {
            let lease = set.lease().await?;
            let worker = lease.worker();
            let request = BundleRequest {
                instruction_id: bundle_id,
                descriptor_id: merger.descriptor.id.clone(),
                inputs: vec![(merger.source.clone(), vec![request])],
                timers: Vec::new(),
                expected_sinks: vec![merger.sink.clone()],
                expected_timer_families: Vec::new(),
                state: Arc::new(NoState),
                overflow: None,
            };
            let mut result = worker.process_bundle(request).await.map_err(exec_error)?;
            Ok(result
                .outputs
                .remove(&merger.sink)
                .unwrap_or_default()
                .concat())
        }
        .boxed()
    }

    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let Some(stage) = self.stages.get(&input.stage).cloned() else {
            let msg = format!("no bundle descriptor for stage {}", input.stage);
            return async move { Err(ExecError::Runner(msg)) }.boxed();
        };
        let Some(set) = self.workers.get(&stage.environment_id).cloned() else {
            let msg = format!("no worker for environment '{}'", stage.environment_id);
            return async move { Err(ExecError::Runner(msg)) }.boxed();
        };
        let job = self.job.clone();
        let recorder = self.recorder.clone();
        let split_output_bytes = self.split_output_bytes;
        let streaming = self.streaming;
        let output_spill = self.output_spill.clone();
        let finalizations = self.finalizations.clone();
        let stall = self.stall.clone();
        let shard_metrics = self.shard_metrics.clone();
        let stage_name = self
            .stage_names
            .get(&input.stage)
            .cloned()
            .unwrap_or_default();
        async move {
            let lease = set.lease().await?;
            let worker = lease.worker();
            let started = SystemTime::now();
            let clock = Instant::now();
            let bundle_id = input.bundle_id.clone();
            let input_bytes: usize = input.elements.iter().map(bytes::Bytes::len).sum();
            let rules = BundleRules {
                split_bytes: split_output_bytes,
                spill: output_spill.as_deref(),
                streaming,
                stall: stall
                    .as_ref()
                    .map(|(policy, stalled)| (*policy, &**stalled, &*stage_name)),
                shard_metrics: shard_metrics.as_ref(),
            };
            let result = run_bundle(worker, &set, &stage, input, &job, rules, &finalizations).await;
            let error = result.as_ref().err().map(ToString::to_string);
            recorder.record(&BundleRecord {
                stage: &stage_name,
                worker: worker.id(),
                bundle_id: &bundle_id,
                started,
                duration: clock.elapsed(),
                input_bytes,
                error: error.as_deref(),
            });
            // The job's message stream shows every failed attempt (the
            // engine retries it, or fails the job with the last one).
            if let Some(error) = &error {
                job.message(
                    MessageImportance::JobMessageWarning,
                    format!("a bundle of stage '{stage_name}' failed: {error}"),
                );
            }
            result
        }
        .boxed()
    }
}

/// A worker's failure in the engine's terms: the SDK's own text stays the
/// SDK's.
fn exec_error(error: BundleError) -> ExecError {
    match error {
        BundleError::Sdk(text) => ExecError::Sdk(text),
        other => ExecError::Harness(other.to_string()),
    }
}

/// The elements of a bundle's input, one `Bytes` each (slices of its
/// chunks, not copies), for a split to give back those after its point.
fn element_slices(chunks: &[bytes::Bytes], lengths: &[usize]) -> Vec<bytes::Bytes> {
    let mut out = Vec::with_capacity(lengths.len());
    let mut lengths = lengths.iter();
    for chunk in chunks {
        let mut at = 0;
        while at < chunk.len() {
            let Some(&len) = lengths.next() else {
                return out;
            };
            let end = (at + len).min(chunk.len());
            out.push(chunk.slice(at..end));
            at = end;
        }
    }
    out
}

/// How a running bundle may be split: a splittable DoFn's for time, size
/// and idle workers; any other bundle that reads data at an element
/// boundary (its timers, which arrive on their own streams, all stay with
/// what it keeps), once its output passes the limit — a DoFn that
/// emits far more than it reads must not hold a whole bundle's output in
/// the runner's memory — and when a worker idles while it runs (a few slow
/// elements are one bundle, which one worker would otherwise do alone): a
/// stateful stage's only if it may split between key groups (`split_points`
/// not empty), since what it gives back must hold keys it no longer needs
/// to run beside it.
fn split_policy(
    stage: &SdkStageDescriptor,
    elements: usize,
    split_points: &[usize],
    output_limit: u64,
) -> Option<SplitPolicy> {
    stage.input_transform_id.as_ref()?;
    if stage.splittable {
        Some(SplitPolicy::new(output_limit, Instant::now()))
    } else if elements > 1 {
        Some(SplitPolicy::for_elements(
            output_limit,
            Instant::now(),
            !stage.stateful || !split_points.is_empty(),
        ))
    } else {
        None
    }
}

/// How a bundle is split, and where its output goes past its limit.
#[derive(Clone, Copy)]
struct BundleRules<'a> {
    /// The bundle is split once it has sent back this many bytes.
    split_bytes: u64,
    /// Where the output of a bundle that cannot be split at any position
    /// goes past the stage's share, if anywhere.
    spill: Option<&'a JobOutputSpill>,
    /// The job is streaming (see [`HarnessExecutor::with_streaming`]).
    streaming: bool,
    /// The stall policy, the job's list of stalled bundles and the stage's
    /// name, when bundles are watched.
    stall: Option<(StallPolicy, &'a StalledBundles, &'a str)>,
    /// Each shard's committed metrics, on a job on shards.
    shard_metrics: Option<&'a Arc<ShardMetrics>>,
}

/// Runs one bundle of `stage` on `worker` (splitting one that takes long or
/// whose output passes its limit, see [`split_policy`], and spilling output
/// that still passes it) and turns the worker's answer into the engine's
/// terms.
async fn run_bundle(
    worker: &Arc<Worker>,
    workers: &WorkerSet,
    stage: &SdkStageDescriptor,
    input: BundleInput,
    job: &Arc<Job>,
    rules: BundleRules<'_>,
    finalizations: &Arc<BundleFinalizations>,
) -> Result<BundleOutput, ExecError> {
    let BundleInput {
        stage: stage_idx,
        bundle_id,
        shard,
        elements,
        element_lengths,
        split_points,
        timers,
        state,
        draining,
        splits,
    } = input;
    let policy = split_policy(
        stage,
        element_lengths.len(),
        &split_points,
        rules.split_bytes,
    );
    // Not a splittable DoFn's bundle: splits at any position bound its
    // output, and its output to disk would be written twice for nothing.
    // (Splits take effect late — the SDK is ahead of what has arrived — so
    // such a bundle can still send back several times its limit.)
    let overflow = rules
        .spill
        .filter(|_| !stage.splittable)
        .map(|spill| spill.for_bundle(stage.outputs.iter().map(|(s, _)| s.clone()).collect()));
    let splitter = policy.map(|policy| Splitter {
        policy,
        worker,
        workers,
        stage: stage_idx,
        streaming: rules.streaming,
        bundle_id: &bundle_id,
        source: stage.input_transform_id.clone().unwrap_or_default(),
        // A splittable stage's chunks are one element each.
        chunks: elements.clone(),
        element_lengths,
        split_points,
        sink: splits,
    });
    let request = BundleRequest {
        instruction_id: bundle_id.clone(),
        descriptor_id: match (&stage.drain_descriptor, draining) {
            (Some(drain), true) => drain.id.clone(),
            _ => stage.descriptor.id.clone(),
        },
        inputs: match &stage.input_transform_id {
            Some(t) => vec![(t.clone(), elements)],
            None => Vec::new(),
        },
        timers: timers
            .into_iter()
            .map(|t| (t.transform_id, t.family_id, t.data))
            .collect(),
        expected_sinks: stage.outputs.iter().map(|(sink, _)| sink.clone()).collect(),
        expected_timer_families: stage.timer_families.clone(),
        state: Arc::new(StateBridge::new(state)),
        overflow: overflow
            .clone()
            .map(|o| o as Arc<dyn refract_sdk_harness::OutputSpill>),
    };
    let received = Arc::new(AtomicU64::new(0));
    let bundle = watched_bundle(worker, request, &received, &bundle_id, job, rules.stall);
    tokio::pin!(bundle);
    let (result, split_residuals) = match splitter {
        Some(splitter) => splitter.split_while(bundle, &received).await,
        None => (bundle.await, Vec::new()),
    };
    let mut result = result?;
    let metrics = std::mem::take(&mut result.response.monitoring_infos);
    let needs_finalization = result.response.requires_finalization;
    let mut output = bundle_output(stage, result, overflow, split_residuals);
    output.on_commit = Some({
        let job = job.clone();
        let shard_metrics = shard.zip(rules.shard_metrics.cloned());
        CommitAction::new(move || {
            job.metrics().commit(&metrics);
            if let Some((shard, totals)) = shard_metrics {
                totals.commit(shard, &metrics);
            }
        })
    });
    // Finalization (a source acknowledging what it read) waits until the
    // engine has made the bundle's effects durable.
    output.on_durable = needs_finalization.then(|| {
        let worker = worker.clone();
        let bundle_id = bundle_id.clone();
        let finalizations = finalizations.clone();
        CommitAction::new(move || {
            finalizations.spawn(async move {
                if let Err(e) = worker.finalize_bundle(&bundle_id).await {
                    warn!(bundle = %bundle_id, error = %e, "bundle finalization failed");
                }
            });
        })
    });
    Ok(output)
}

/// The bundle on `worker`, failed if the stall policy says it stalled
/// (`stall`: the policy, the job's stalled list and the stage's name).
async fn watched_bundle(
    worker: &Arc<Worker>,
    request: BundleRequest,
    received: &Arc<AtomicU64>,
    bundle_id: &str,
    job: &Arc<Job>,
    stall: Option<(StallPolicy, &StalledBundles, &str)>,
) -> Result<BundleResult, ExecError> {
    let bundle = worker
        .process_bundle_counted(request, received.clone())
        .map(|result| result.map_err(exec_error));
    let Some((policy, stalled, stage_name)) = stall else {
        return bundle.await;
    };
    let watch = BundleWatch {
        worker,
        bundle_id,
        stage: stage_name,
        received,
        policy,
        job,
        stalled,
    };
    tokio::select! {
        result = bundle => result,
        why = watch.until_failed() => Err(ExecError::Harness(why)),
    }
}

/// What splits a running bundle when its [`SplitPolicy`] says so: the
/// bundle's input, cut into elements when first needed, and where a split
/// that keeps a prefix is told to the engine.
struct Splitter<'a> {
    policy: SplitPolicy,
    worker: &'a Arc<Worker>,
    workers: &'a WorkerSet,
    stage: StageIdx,
    streaming: bool,
    bundle_id: &'a str,
    /// The transform the bundle's input goes to.
    source: String,
    chunks: Vec<Bytes>,
    element_lengths: Vec<usize>,
    split_points: Vec<usize>,
    sink: SplitSink,
}

impl Splitter<'_> {
    /// Waits for `bundle`, splitting it as the policy asks meanwhile: its
    /// result, and the residuals of splits the engine was not told of
    /// (they run after the bundle commits).
    async fn split_while<F>(
        mut self,
        mut bundle: Pin<&mut F>,
        received: &AtomicU64,
    ) -> (Result<BundleResult, ExecError>, Vec<Residual>)
    where
        F: Future<Output = Result<BundleResult, ExecError>>,
    {
        let mut residuals = Vec::new();
        let mut elements: Option<Vec<Bytes>> = None;
        let mut end = self.element_lengths.len();
        loop {
            tokio::select! {
                r = bundle.as_mut() => return (r, residuals),
                _ = tokio::time::sleep(SPLIT_CHECK_EVERY) => {
                    let Some(fraction) = self.policy.due(
                        Instant::now(),
                        received.load(Ordering::Relaxed),
                        self.workers.has_idle_worker(),
                        self.streaming || self.workers.split_adds_parallelism(self.stage),
                    ) else {
                        continue;
                    };
                    let elements = elements
                        .get_or_insert_with(|| element_slices(&self.chunks, &self.element_lengths));
                    let outcome = split_bundle(
                        self.worker,
                        self.bundle_id,
                        &self.source,
                        &elements[..end.min(elements.len())],
                        fraction,
                        &self.split_points,
                    )
                    .await;
                    if outcome.residuals.is_empty() {
                        self.policy.refused();
                    } else {
                        self.policy.accepted();
                    }
                    end = outcome.end;
                    match outcome.kept {
                        // The engine runs the residuals now, and a retry
                        // of this bundle does only what it kept.
                        Some((kept_elements, primaries)) if self.sink.is_connected() => {
                            self.sink.send(BundleSplit {
                                kept_elements,
                                primaries,
                                residuals: outcome.residuals,
                            });
                        }
                        _ => residuals.extend(outcome.residuals),
                    }
                }
            }
        }
    }
}

/// `result` in the engine's terms: outputs by PCollection, spilled output,
/// timers, and the residuals the SDK returned plus `split_residuals`.
fn bundle_output(
    stage: &SdkStageDescriptor,
    result: BundleResult,
    overflow: Option<Arc<BundleOutputSpill>>,
    split_residuals: Vec<Residual>,
) -> BundleOutput {
    let mut outputs = Vec::with_capacity(stage.outputs.len());
    let mut results = result.outputs;
    for (sink, pcoll) in &stage.outputs {
        if let Some(chunks) = results.remove(sink) {
            outputs.extend(chunks.into_chunks().into_iter().map(|c| (*pcoll, c)));
        }
    }
    let spilled = overflow.map_or_else(Vec::new, |o| {
        o.take()
            .into_iter()
            .filter_map(|(at, output)| Some((stage.outputs.get(at)?.1, output)))
            .collect()
    });
    let timers = result
        .timers
        .into_iter()
        .map(|((transform_id, family_id), data)| TimerInput {
            transform_id,
            family_id,
            data,
        })
        .collect();
    let mut residuals: Vec<Residual> = result
        .response
        .residual_roots
        .iter()
        .filter_map(residual)
        .collect();
    residuals.extend(split_residuals);
    BundleOutput {
        outputs,
        spilled,
        timers,
        residuals,
        on_commit: None,
        on_durable: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_split_without_a_transform_id_is_about_the_input_split() {
        let channel = |id: &str, first| process_bundle_split_response::ChannelSplit {
            transform_id: id.into(),
            last_primary_element: first - 1,
            first_residual_element: first,
        };
        let split = ProcessBundleSplitResponse {
            channel_splits: vec![channel("", 410), channel("other", 3), channel("in", 7)],
            ..Default::default()
        };
        let firsts: Vec<i64> = channel_splits_of(&split, "in")
            .map(|c| c.first_residual_element)
            .collect();
        assert_eq!(firsts, [410, 7]);
    }

    #[test]
    fn a_bundles_chunks_are_cut_into_its_elements_without_copies() {
        let chunks = [
            bytes::Bytes::from_static(b"aabbbc"),
            bytes::Bytes::from_static(b"dddd"),
        ];
        let elements = element_slices(&chunks, &[2, 3, 1, 4]);
        assert_eq!(elements, ["aa", "bbb", "c", "dddd"].map(str::as_bytes));
        assert_eq!(elements[1].as_ptr(), chunks[0][2..].as_ptr());
        // Lengths that do not match the chunks give what they can.
        assert_eq!(element_slices(&chunks, &[2]).len(), 1);
        assert_eq!(element_slices(&chunks, &[5, 9]).len(), 2);
    }
}
