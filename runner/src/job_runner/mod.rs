//! Executes submitted jobs: the runner half of the Job API.
//!
//! For each job: translate the pipeline into a stage plan, start SDK
//! workers for the environments its stages use, run the engine, and report
//! the outcome through the job's state and message streams. A failure of
//! any kind ends as FAILED with the reason as the last ERROR message — for a
//! failing DoFn, the SDK's own traceback text.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use refract_engine::manager::{Engine, EngineConfig, EngineError, SnapshotError, StageStats};
use refract_engine::plan::StageKind;
use refract_engine::spill::SpillStore;
use refract_engine::time::wall_clock_ms;
use refract_jobservice::{Job, JobRunner};
use refract_proto::fn_api::ProvisionInfo;
use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::job_api::job_state;
use refract_proto::pipeline::{ArtifactInformation, Pipeline};
use refract_proto::prost_types;
use refract_sdk_harness::{ArtifactSource, FnApiServer, LogSink, WorkerConfig};
use refract_translate::{translate, validate, TranslateOptions};
use thiserror::Error;
use tracing::{error, info, warn, Instrument};

use crate::activity::Activity;
use crate::durability::{Durability, DurabilityError};
use crate::harness_executor::HarnessExecutor;
use crate::insights::{Insights, JobView};
use crate::options::{experiment_value, has_experiment, option_bool, option_usize};
use crate::output_spill::OutputSpill;
use crate::telemetry::{BundleRecorder, OtlpExport};
use crate::worker_set::{WorkerFactory, WorkerSet};

/// The experiment that starts a job draining (documented in
/// docs/compatibility.md): used by test suites that check drain semantics.
pub const DRAIN_ON_START: &str = "drain_on_start";

/// The experiment that starts a job from a savepoint file:
/// `--experiments=refract_savepoint=/path/to/file` (documented in
/// docs/operations.md). The pipeline must be the one the savepoint was
/// taken of.
pub const SAVEPOINT_EXPERIMENT: &str = "refract_savepoint";

/// The experiment choosing where one job keeps its state:
/// `--experiments=refract_state_store=memory` keeps it in memory on a
/// server with `--state_dir` (nothing checkpointed, nothing resumed);
/// `=rocksdb` insists on the durable store, and is refused at submission
/// by a server without one. Without it, the server's choice holds.
pub const STATE_STORE_EXPERIMENT: &str = "refract_state_store";

/// The store a job asked for, checked against what the server has.
fn job_durability(
    options: &prost_types::Struct,
    server: Option<&Arc<Durability>>,
) -> Result<Option<Arc<Durability>>, String> {
    match experiment_value(options, STATE_STORE_EXPERIMENT).as_deref() {
        None => Ok(server.cloned()),
        Some("memory") => Ok(None),
        Some("rocksdb") => match server {
            Some(durability) => Ok(Some(durability.clone())),
            None => Err(format!(
                "--experiments={STATE_STORE_EXPERIMENT}=rocksdb needs a runner started with \
                 `refract serve --state_dir DIR`; this one keeps state in memory"
            )),
        },
        Some(other) => Err(format!(
            "unknown state store '{other}' in --experiments={STATE_STORE_EXPERIMENT}={other}; \
             use 'memory' or 'rocksdb'"
        )),
    }
}

/// Why a job could not run.
#[derive(Debug, Error)]
enum JobError {
    #[error("{0}")]
    Translate(#[from] refract_translate::TranslateError),
    #[error("{0}")]
    Harness(#[from] refract_sdk_harness::HarnessError),
    #[error("{0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Durability(#[from] DurabilityError),
    #[error("cannot resume from the job's checkpoint: {0}")]
    Restore(#[from] SnapshotError),
}

/// The [`JobRunner`] of the `refract` binary.
pub struct RefractRunner {
    fn_server: Arc<FnApiServer>,
    engine_config: EngineConfig,
    activity: Arc<Activity>,
    default_workers: usize,
    insights: Insights,
    otlp: Option<Arc<OtlpExport>>,
    durability: Option<Arc<Durability>>,
    /// Bytes a job's waiting elements may take, over all its stages.
    memory_budget: Option<usize>,
    /// Where GroupByKey buffers over their share of the budget spill.
    spill: Option<Arc<dyn SpillStore>>,
}

impl RefractRunner {
    /// A runner whose SDK workers talk to `fn_server`.
    pub fn new(fn_server: Arc<FnApiServer>) -> Self {
        RefractRunner {
            fn_server,
            engine_config: EngineConfig::default(),
            activity: Arc::default(),
            default_workers: 1,
            insights: Insights::default(),
            otlp: None,
            durability: None,
            memory_budget: None,
            spill: None,
        }
    }

    /// Let a job's batch GroupByKey buffers spill to `store` once one holds
    /// more than a stage's share of the memory budget (see
    /// [`refract_engine::spill`]); without it they stay in memory.
    pub fn with_spill(mut self, store: Arc<dyn SpillStore>) -> Self {
        self.spill = Some(store);
        self
    }

    /// Bound each job's waiting elements to `bytes` in all (split over its
    /// stages; see [`crate::memory`]). Without it, each stage keeps the
    /// engine's default bound.
    pub fn with_memory_budget(mut self, bytes: usize) -> Self {
        self.memory_budget = Some(bytes);
        self
    }

    /// Record every job in the state store, checkpoint it, and resume it
    /// from its latest checkpoint when it was recovered.
    pub fn with_durability(mut self, durability: Option<Arc<Durability>>) -> Self {
        self.durability = durability;
        self
    }

    /// Export each job's span and its bundles' spans and durations over
    /// OTLP (metrics read [`Self::insights`] on their own).
    pub fn with_otlp(mut self, otlp: Option<Arc<OtlpExport>>) -> Self {
        self.otlp = otlp;
        self
    }

    /// Where running jobs publish their stage snapshots (for the web UI).
    pub fn insights(&self) -> Insights {
        self.insights.clone()
    }

    /// Workers per environment for jobs whose `sdk_worker_parallelism`
    /// option is 0 ("let the runner choose").
    pub fn with_default_workers(mut self, workers: usize) -> Self {
        self.default_workers = workers.max(1);
        self
    }

    /// The job activity tracker, for idle shutdown.
    pub fn activity(&self) -> Arc<Activity> {
        self.activity.clone()
    }
}

impl JobRunner for RefractRunner {
    fn validate(&self, pipeline: &Pipeline, options: &prost_types::Struct) -> Result<(), String> {
        validate(pipeline).map_err(|e| e.to_string())?;
        job_durability(options, self.durability.as_ref()).map(|_| ())
    }

    fn start(&self, job: Arc<Job>) {
        let fn_server = self.fn_server.clone();
        let config = self.engine_config.clone();
        let resources = JobResources {
            workers_per_env: match option_usize(job.options(), "sdk_worker_parallelism") {
                Some(0) | None => self.default_workers,
                Some(n) => n,
            },
            memory_budget: self.memory_budget,
            spill: self.spill.clone(),
        };
        let span = tracing::info_span!("job", id = %job.id());
        let activity = self.activity.clone();
        let (view, stats) = self.insights.register(job.clone());
        let job_span = self
            .otlp
            .as_ref()
            .map(|otlp| (otlp.clone(), otlp.job_span(job.id(), job.name())));
        let recorder = BundleRecorder::new(
            view.clone(),
            job_span
                .as_ref()
                .map(|(otlp, span)| (otlp.clone(), span.context())),
        );
        // Checked at submission; a recovered job was durable, so the
        // server's store stands in if the check fails now.
        let durability = job_durability(job.options(), self.durability.as_ref())
            .unwrap_or_else(|_| self.durability.clone());
        activity.job_started();
        tokio::spawn(
            async move {
                job.set_state(job_state::Enum::Running);
                let watchers = JobWatchers {
                    stats,
                    view: view.clone(),
                    recorder,
                    durability: durability.clone(),
                };
                let outcome = run_job(job.clone(), fn_server, config, resources, watchers).await;
                view.clear_workers();
                activity.job_ended();
                let error = match outcome {
                    Ok(()) => {
                        info!("job done");
                        job.set_state(job_state::Enum::Done);
                        None
                    }
                    Err(JobError::Engine(EngineError::Cancelled)) => {
                        info!("job cancelled");
                        job.set_state(job_state::Enum::Cancelled);
                        None
                    }
                    Err(e) => {
                        error!(error = %e, "job failed");
                        job.fail(e.to_string());
                        Some(e.to_string())
                    }
                };
                if let Some((_, span)) = job_span {
                    span.end(job.state().as_str_name(), error.as_deref());
                }
                if let Some(durability) = durability {
                    let id = job.id().to_string();
                    let forgotten =
                        tokio::task::spawn_blocking(move || durability.forget(&id)).await;
                    if let Ok(Err(error)) = forgotten {
                        error!(%error, "cannot remove the ended job from the state store");
                    }
                }
            }
            .instrument(span),
        );
    }
}

/// Gives back the disk space of everything job `job_id` spilled: queues
/// and bundle outputs forget their parts as they read them without
/// compacting (cheap, but the space stays until RocksDB compacts those
/// files); one compaction over the job's whole space when it ends does it.
fn reclaim_spill_space(store: &dyn SpillStore, job_id: &str) {
    let space = refract_engine::spill::job_space(job_id.as_bytes());
    let Some(end) = refract_engine::spill::prefix_end(&space) else {
        return;
    };
    if let Err(e) = store.delete_range(&space, &end) {
        warn!(job_id, error = %e, "could not give back a job's spill space");
    }
}

/// Late data dropped by each GroupByKey, as the counter Beam's runners
/// report for it (`droppedDueToLateness`, in the grouping step).
fn dropped_late_metrics(dropped: &[(String, u64)]) -> Vec<refract_proto::pipeline::MonitoringInfo> {
    dropped
        .iter()
        .map(|(step, count)| {
            let mut payload = Vec::new();
            refract_engine::coder::encode_varint_u64(*count, &mut payload);
            refract_proto::pipeline::MonitoringInfo {
                urn: "beam:metric:user:sum_int64:v1".into(),
                r#type: "beam:metrics:sum_int64:v1".into(),
                payload,
                labels: [
                    ("PTRANSFORM".to_string(), step.clone()),
                    ("NAMESPACE".to_string(), "refract".to_string()),
                    ("NAME".to_string(), "droppedDueToLateness".to_string()),
                ]
                .into_iter()
                .collect(),
                ..Default::default()
            }
        })
        .collect()
}

struct JobArtifacts(Arc<Job>);

impl ArtifactSource for JobArtifacts {
    fn open(&self, a: &ArtifactInformation) -> Option<std::path::PathBuf> {
        self.0.artifacts().path_for(a)
    }
}

/// Where a worker's log lines go: the runner's log (with the worker, stage
/// and transform each came from) and the job's message stream.
struct JobLogs {
    job: Arc<Job>,
    /// Transform id → (its stage's name, its unique name in the pipeline).
    origins: Arc<HashMap<String, (String, String)>>,
}

impl LogSink for JobLogs {
    fn log(&self, worker_id: &str, entry: refract_proto::fn_api::LogEntry) {
        use refract_proto::fn_api::log_entry::severity::Enum as Severity;
        let severity = Severity::try_from(entry.severity).unwrap_or(Severity::Info);
        let text = if entry.trace.is_empty() {
            entry.message.clone()
        } else {
            format!("{}\n{}", entry.message, entry.trace)
        };
        let (stage, transform) = match self.origins.get(&entry.transform_id) {
            Some((stage, name)) => (stage.as_str(), name.as_str()),
            None => ("", entry.transform_id.as_str()),
        };
        match severity {
            Severity::Error | Severity::Critical => {
                tracing::error!(worker = worker_id, stage, transform, "{text}")
            }
            Severity::Warn => tracing::warn!(worker = worker_id, stage, transform, "{text}"),
            Severity::Notice | Severity::Info => {
                tracing::info!(worker = worker_id, stage, transform, "{text}")
            }
            _ => tracing::debug!(worker = worker_id, stage, transform, "{text}"),
        }
        let importance = match severity {
            Severity::Error | Severity::Critical | Severity::Warn => {
                Some(MessageImportance::JobMessageWarning)
            }
            Severity::Notice | Severity::Info => Some(MessageImportance::JobMessageBasic),
            _ => None,
        };
        // Which worker and transform it came from, so a reader can filter
        // the job's messages by step.
        if let Some(importance) = importance {
            let origin = if transform.is_empty() {
                worker_id.to_string()
            } else {
                format!("{worker_id} {transform}")
            };
            self.job.message(importance, format!("[{origin}] {text}"));
        }
    }
}

/// What follows a job as it runs: its stage snapshots, its view for the
/// UI and metrics, its bundle telemetry, and its durable store.
struct JobWatchers {
    stats: tokio::sync::watch::Sender<Vec<StageStats>>,
    view: Arc<JobView>,
    recorder: BundleRecorder,
    durability: Option<Arc<Durability>>,
}

/// What the server gives each job to run with.
struct JobResources {
    workers_per_env: usize,
    memory_budget: Option<usize>,
    spill: Option<Arc<dyn SpillStore>>,
}

async fn run_job(
    job: Arc<Job>,
    fn_server: Arc<FnApiServer>,
    config: EngineConfig,
    resources: JobResources,
    watchers: JobWatchers,
) -> Result<(), JobError> {
    let JobResources {
        workers_per_env,
        memory_budget,
        spill,
    } = resources;
    let JobWatchers {
        stats,
        view,
        recorder,
        durability,
    } = watchers;
    // Recorded before anything runs, so that a crash from here on leaves
    // a job to resume; a recovered job finds its latest checkpoint.
    let mut latest_checkpoint = match &durability {
        Some(durability) => {
            let (store, recorded) = (durability.clone(), job.clone());
            tokio::task::spawn_blocking(move || {
                store.remember(&recorded)?;
                store.latest_checkpoint(recorded.id())
            })
            .await
            .map_err(|e| EngineError::InvalidPlan(format!("reading the checkpoint: {e}")))??
        }
        None => None,
    };
    // A new job asked to start from a savepoint (a recovered job's own
    // checkpoint is newer, and wins).
    if let (None, Some(path)) = (
        &latest_checkpoint,
        experiment_value(job.options(), SAVEPOINT_EXPERIMENT),
    ) {
        let file = std::path::PathBuf::from(&path);
        let parts = tokio::task::spawn_blocking(move || refract_store::read_savepoint(&file))
            .await
            .map_err(|e| EngineError::InvalidPlan(format!("reading the savepoint: {e}")))?
            .map_err(DurabilityError::from)?;
        job.message(
            MessageImportance::JobMessageBasic,
            format!("starting from savepoint {path}"),
        );
        latest_checkpoint = Some(refract_store::Checkpoint { id: 0, parts });
    }
    let streaming = option_bool(job.options(), "streaming");
    let mut translated = translate(
        job.pipeline(),
        &TranslateOptions {
            fn_api_url: fn_server.url(),
            descriptor_id_prefix: job.id().to_string(),
            streaming,
            drain: has_experiment(job.options(), DRAIN_ON_START),
        },
    )?;
    // A pipeline with an unbounded PCollection runs with streaming semantics
    // whatever its options say (Java's test runner, for one, does not set
    // --streaming for unbounded pipelines).
    let streaming = streaming || translated.plan.pcollections.iter().any(|p| !p.bounded);
    // A streaming job retries a failing bundle with backoff for as long as
    // it runs (it is someone's long-running job: the failure may pass, and
    // they can cancel it); a batch job, or a test fed by a TestStream (which
    // must see its assertion fail), gives up after a few attempts.
    let test_stream = translated
        .plan
        .stages
        .iter()
        .any(|s| matches!(s.kind, StageKind::TestStream(_)));
    let max_attempts = if streaming && !test_stream {
        u32::MAX
    } else {
        config.max_attempts
    };
    let max_pending_bytes = memory_budget.map_or(config.max_pending_bytes, |budget| {
        crate::memory::per_stage_bytes(budget, translated.plan.stages.len())
    });
    let config = EngineConfig {
        streaming,
        max_attempts,
        max_pending_bytes,
        ..config
    };
    job.metrics()
        .set_transform_names(translated.unique_names.clone());
    // Each descriptor transform's stage and name, for worker log lines.
    let mut origins: HashMap<String, (String, String)> = HashMap::new();
    for (idx, stage) in &translated.sdk_stages {
        let stage_name = translated
            .plan
            .stages
            .get(*idx)
            .map_or_else(String::new, |s| s.name.clone());
        for id in stage.descriptor.transforms.keys() {
            let name = translated
                .unique_names
                .get(id)
                .cloned()
                .unwrap_or_else(|| id.clone());
            origins.insert(id.clone(), (stage_name.clone(), name));
        }
    }
    let origins = Arc::new(origins);
    let mut stages = HashMap::new();
    let mut environments: HashSet<String> = HashSet::new();
    let mut descriptor_ids = Vec::new();
    for (idx, stage) in translated.sdk_stages {
        fn_server.register_descriptor(stage.descriptor.clone());
        descriptor_ids.push(stage.descriptor.id.clone());
        if let Some(drain) = &stage.drain_descriptor {
            fn_server.register_descriptor(drain.clone());
            descriptor_ids.push(drain.id.clone());
        }
        environments.insert(stage.environment_id.clone());
        stages.insert(idx, Arc::new(stage));
    }
    let mut mergers = HashMap::new();
    for (idx, merger) in translated.window_mergers {
        fn_server.register_descriptor(merger.descriptor.clone());
        descriptor_ids.push(merger.descriptor.id.clone());
        environments.insert(merger.environment_id.clone());
        mergers.insert(idx, Arc::new(merger));
    }
    let mut workers = HashMap::new();
    let mut started: Vec<Arc<WorkerSet>> = Vec::new();
    let mut env_ids: Vec<String> = environments.into_iter().collect();
    env_ids.sort();
    let result = async {
        for (n, env_id) in env_ids.iter().enumerate() {
            let Some(environment) = translated.environments.get(env_id) else {
                continue;
            };
            let provision = ProvisionInfo {
                pipeline_options: Some(job.options().clone()),
                retrieval_token: job.id().to_string(),
                dependencies: job.artifacts().resolved_dependencies(env_id),
                metadata: [
                    ("job_id".to_string(), job.id().to_string()),
                    ("job_name".to_string(), job.name().to_string()),
                ]
                .into_iter()
                .collect(),
                ..Default::default()
            };
            // One way to start a worker of this environment, for the first
            // ones and for replacements of crashed ones.
            let factory: WorkerFactory = {
                let fn_server = fn_server.clone();
                let job = job.clone();
                let environment = environment.clone();
                let origins = origins.clone();
                let prefix = format!("{}-e{n}", job.id());
                Arc::new(move |w: usize| {
                    let fn_server = fn_server.clone();
                    let config = WorkerConfig {
                        worker_id: format!("{prefix}-w{w}"),
                        environment: environment.clone(),
                        provision: provision.clone(),
                        artifacts: Arc::new(JobArtifacts(job.clone())),
                        logs: Arc::new(JobLogs {
                            job: job.clone(),
                            origins: origins.clone(),
                        }),
                    };
                    Box::pin(async move { fn_server.start_worker(config).await })
                })
            };
            // Start the environment's workers together; keep the ones that
            // came up so they are stopped even if another one failed.
            let starts = (0..workers_per_env).map(|w| factory(w));
            let mut env_workers = Vec::with_capacity(workers_per_env);
            let mut failure = None;
            for outcome in futures::future::join_all(starts).await {
                match outcome {
                    Ok(worker) => env_workers.push(worker),
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            // Replacements are numbered after the first workers.
            let replacement_factory: WorkerFactory = {
                let factory = factory.clone();
                Arc::new(move |r: usize| factory(workers_per_env + r))
            };
            let set = Arc::new(WorkerSet::new(env_workers, Some(replacement_factory)));
            started.push(set.clone());
            view.add_workers(set.clone());
            if let Some(e) = failure {
                return Err(e.into());
            }
            workers.insert(env_id.clone(), set);
        }
        let stage_names = translated
            .plan
            .stages
            .iter()
            .enumerate()
            .map(|(idx, stage)| (idx, stage.name.clone()))
            .collect();
        // Up to `max_bundles_per_stage` bundles of a stage run at once, and
        // their outputs wait until each commits: together they stay within
        // the stage's queue bound, in memory, so a bundle is split once its
        // output passes its part of it. Past the whole share, one that
        // cannot be split further (one element's output) goes to disk.
        let bundle_output_bytes = max_pending_bytes / config.max_bundles_per_stage.max(1);
        let mut executor =
            HarnessExecutor::new(stages, mergers, workers, job.clone(), stage_names, recorder)
                .with_split_output_bytes(bundle_output_bytes);
        if let Some(store) = &spill {
            executor = executor.with_output_spill(OutputSpill::new(
                store.clone(),
                job.id().as_bytes(),
                max_pending_bytes,
            ));
        }
        let executor = Arc::new(executor);
        let state_backed_outputs = std::mem::take(&mut translated.state_backed_outputs);
        let mut engine = Engine::new(
            translated.plan,
            executor,
            config,
            job.id().to_string(),
            Arc::new(wall_clock_ms),
        )?
        .with_drain(job.drain_requested())
        .with_stats(stats);
        if let Some(store) = spill.clone() {
            if let Some(durability) = &durability {
                // Bags past their share go beside the checkpoints, which
                // name them: a checkpointed job's state may outgrow memory.
                engine = engine.with_durable_state(durability.state_store(job.id()));
            }
            // A GroupByKey may hold a stage's share of the budget before it
            // spills (without a budget, the engine's queue bound).
            engine = engine
                .with_spill(store, job.id().as_bytes(), max_pending_bytes)
                .with_state_backed_outputs(&state_backed_outputs);
        }
        if let Some(checkpoint) = latest_checkpoint {
            engine.restore(&checkpoint.parts)?;
            crate::durability::restore_metrics(&job, &checkpoint.parts)?;
            if checkpoint.id > 0 {
                view.observe_restore(checkpoint.id);
                info!(
                    checkpoint = checkpoint.id,
                    "resuming from the job's checkpoint"
                );
                job.message(
                    MessageImportance::JobMessageBasic,
                    format!("resumed from checkpoint {}", checkpoint.id),
                );
            }
        }
        let metrics_part: refract_engine::manager::ExtraPart = {
            let job = job.clone();
            Arc::new(move || crate::durability::metrics_part(&job))
        };
        engine = engine.with_extra_part(crate::durability::METRICS_PART, metrics_part);
        let mut checkpoint_writer = None;
        if let Some(durability) = &durability {
            view.enable_checkpoints();
            let writer = durability.checkpoint_writer(job.id(), view.clone());
            engine =
                engine.with_checkpoints(durability.interval(), writer.tx, Some(writer.progress));
            checkpoint_writer = Some(writer.task);
        }
        let (savepoint_tx, savepoint_rx) = tokio::sync::mpsc::channel(4);
        engine = engine.with_savepoints(savepoint_rx);
        view.set_savepoint_channel(Some(savepoint_tx));
        let summary = engine.run(job.cancel_requested()).await;
        view.set_savepoint_channel(None);
        let spilled = summary.as_ref().map_or(true, |s| {
            s.spilled_bytes + s.output_spilled_bytes + s.queue_spilled_bytes + s.state_spilled_bytes
                > 0
        });
        if let (Some(store), true) = (&spill, spilled) {
            reclaim_spill_space(store.as_ref(), job.id());
        }
        let summary = summary?;
        if let Some(task) = checkpoint_writer {
            // The engine dropped its sender: the task ends after the
            // checkpoint in hand, if any, is written.
            let _ = task.await;
        }
        info!(
            bundles = summary.bundles,
            dropped_late = summary.dropped_late,
            spilled_bytes = summary.spilled_bytes,
            output_spilled_bytes = summary.output_spilled_bytes,
            queue_spilled_bytes = summary.queue_spilled_bytes,
            state_spilled_bytes = summary.state_spilled_bytes,
            handed_out_keys = summary.handed_out_keys,
            "engine finished"
        );
        let waited_on_disk = summary.output_spilled_bytes + summary.queue_spilled_bytes;
        if waited_on_disk > 0 {
            job.message(
                MessageImportance::JobMessageBasic,
                format!(
                    "bundle outputs and queues larger than their share of the memory budget \
                     waited on disk ({:.1} MiB)",
                    waited_on_disk as f64 / f64::from(1 << 20)
                ),
            );
        }
        if summary.spilled_bytes > 0 {
            job.message(
                MessageImportance::JobMessageBasic,
                format!(
                    "GroupByKey buffers larger than their share of the memory budget spilled \
                     {:.1} MiB to disk",
                    summary.spilled_bytes as f64 / f64::from(1 << 20)
                ),
            );
        }
        if summary.handed_out_keys > 0 {
            job.message(
                MessageImportance::JobMessageBasic,
                format!(
                    "{} GroupByKey key(s) too large for memory went to their consumers as \
                     state-backed iterables, read from disk as they were iterated (no checkpoint \
                     was taken while one could be read)",
                    summary.handed_out_keys
                ),
            );
        }
        if summary.state_spilled_bytes > 0 {
            job.message(
                MessageImportance::JobMessageBasic,
                format!(
                    "user state larger than its stage's share of the memory budget spilled \
                     {:.1} MiB to disk",
                    summary.state_spilled_bytes as f64 / f64::from(1 << 20)
                ),
            );
        }
        job.metrics()
            .commit(&dropped_late_metrics(&summary.dropped_late_by_stage));
        Ok::<(), JobError>(())
    }
    .await;
    // All at once: a pool that is slow to answer StopWorker delays the job's
    // end by one timeout, not one per worker.
    let workers: Vec<_> = started.iter().flat_map(|set| set.workers()).collect();
    futures::future::join_all(workers.iter().map(|w| w.stop())).await;
    for id in descriptor_ids {
        fn_server.forget_descriptor(&id);
    }
    result
}
