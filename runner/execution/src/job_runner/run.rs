//! One attempt at running a job: record it, plan it, start its workers,
//! run the engine (from the latest checkpoint, if there is one), stop the
//! workers. The caller ([`super::RefractRunner`]) decides whether a failed
//! attempt is tried again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use refract_engine::manager::{Engine, EngineConfig, EngineError, RunSummary, StageStats};
use refract_engine::plan::StageIdx;
use refract_engine::plan::StageKind;
use refract_engine::shards::ShardLayout;
use refract_engine::spill::SpillSpace;
use refract_engine::time::wall_clock_ms;
use refract_jobservice::Job;
use refract_observability::insights::JobView;
use refract_observability::telemetry::BundleRecorder;
use refract_pools::WorkerPools;
use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::job_api::job_state::Enum as JobState;
use refract_sdk_harness::FnApiServer;
use refract_store::savepoint_dir::SavepointDir;
use refract_translate::{
    translate, EnvironmentPreference, SdkStageDescriptor, Translated, WindowMerger,
};
use tracing::{info, warn};

use super::job_options::JobOptions;
use super::logs::TransformOrigins;
use super::on_hosts::{run_on_hosts, OnHosts, ShardHostsAccess};
use super::rescale::HostPlacement;
use super::resume::resume;
use super::sharded::{run_on_shards, ShardedCheckpoints, ShardedJob};
use super::workers::WorkerStart;
use super::JobError;
use crate::durability::Durability;
use crate::harness_executor::HarnessExecutor;
use crate::memory::{Exhausted, MemoryGrant, MemoryLedger};
use crate::output_spill::JobOutputSpill;
use crate::shard_metrics::ShardMetrics;
use crate::stall_watch::StallPolicy;
use crate::worker_set::WorkerSet;

/// How long a finished job waits for its bundle finalization calls (each
/// is one round trip to a worker that is still up).
const FINALIZATION_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What one attempt learned about the job, for deciding whether to try
/// again after it failed.
#[derive(Debug, Default)]
pub(super) struct AttemptFacts {
    /// The job runs with streaming semantics (known once it is planned).
    pub(super) streaming: bool,
    /// The engine started: work may have been committed since the last
    /// checkpoint.
    pub(super) engine_ran: bool,
    /// Which attempt of the job this is (0 for the first).
    pub(super) attempt: u32,
}

/// What follows a job as it runs: its stage snapshots, its view for the
/// UI and metrics, its bundle telemetry, and its durable spill space.
#[derive(Clone)]
pub(super) struct JobWatchers {
    pub(super) stats: tokio::sync::watch::Sender<Vec<StageStats>>,
    pub(super) view: Arc<JobView>,
    pub(super) recorder: BundleRecorder,
    pub(super) durability: Option<Arc<Durability>>,
}

/// What the server gives each job to run with.
#[derive(Clone)]
pub(super) struct JobResources {
    pub(super) workers_per_env: usize,
    /// Workers per environment of a pooled environment the server or the
    /// job chose, if either did (else the pools' capacity).
    pub(super) asked_workers: Option<usize>,
    /// The server's remote worker pools, if any.
    pub(super) pools: Option<Arc<WorkerPools>>,
    /// The server's memory, and the most one job is granted of it.
    pub(super) memory: Option<(Arc<MemoryLedger>, usize)>,
    pub(super) spill: Option<Arc<dyn SpillSpace>>,
    /// Which alternative of an AnyOf environment to start.
    pub(super) environment_preference: EnvironmentPreference,
    /// Where savepoints to start from are, if the server has a place.
    pub(super) savepoints: Option<Arc<SavepointDir>>,
    /// How bundles without progress are found and handled, if they are.
    pub(super) stall: Option<StallPolicy>,
    /// The cut of the job this one updates, if it does (see `update.rs`).
    pub(super) handed_over: Option<super::update::HandedOver>,
    /// The server's shard hosts, if it coordinates some: the job's shards
    /// run there, and no worker or engine runs here.
    pub(super) shard_hosts: Option<ShardHostsAccess>,
    /// How a run on the shard hosts tells the job's rescale inbox where it
    /// was placed, and asks it to follow hosts that join.
    pub(super) placement: Option<HostPlacement>,
}

/// One attempt at `job` (see the module docs); `facts` learns what the
/// caller needs to decide whether to make another after a failure.
pub(super) async fn run_job(
    job: Arc<Job>,
    options: JobOptions,
    fn_server: Arc<FnApiServer>,
    config: EngineConfig,
    resources: JobResources,
    watchers: JobWatchers,
    facts: &mut AttemptFacts,
) -> Result<(), JobError> {
    let JobResources {
        workers_per_env,
        asked_workers,
        pools,
        memory,
        spill,
        environment_preference,
        savepoints,
        stall,
        handed_over,
        shard_hosts,
        placement,
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
            let shards = super::rescale::count(options.shards);
            tokio::task::spawn_blocking(move || {
                store.remember(&recorded, shards)?;
                store.latest_checkpoint(recorded.id())
            })
            .await
            .map_err(|e| EngineError::InvalidPlan(format!("reading the checkpoint: {e}")))??
        }
        None => None,
    };
    // A new job asked to start from a savepoint (a recovered job's own
    // checkpoint is newer, and wins).
    if let (None, Some(path)) = (&latest_checkpoint, &options.savepoint) {
        let parts = read_savepoint(&job, savepoints, path).await?;
        job.message(
            MessageImportance::JobMessageBasic,
            format!("starting from savepoint {path}"),
        );
        latest_checkpoint = Some(refract_store::Checkpoint { id: 0, parts });
    }
    // An update starts from the cut of the job it replaced, as from a
    // savepoint (the same rules, the same name mapping).
    if let (None, Some(parts)) = (&latest_checkpoint, &handed_over) {
        latest_checkpoint = Some(refract_store::Checkpoint {
            id: 0,
            parts: parts.as_ref().clone(),
        });
    }
    let streaming = options.streaming;
    let strict = options.strict;
    if let Some(strict) = strict {
        let coders = if strict.coders {
            "the pipeline's transforms run as stages of their own, so every element between \
             them crosses its coder, and "
        } else {
            ""
        };
        job.message(
            MessageImportance::JobMessageBasic,
            format!(
                "strict mode is on (seed {}): {coders}bundles run twice, cut small and reordered, \
                 as any runner may; --experiments={}=off turns it off",
                strict.seed,
                super::STRICT_EXPERIMENT
            ),
        );
    }
    let translation = options.translation(
        fn_server.url(),
        job.id().to_string(),
        environment_preference,
    );
    // Planning takes time and memory in proportion to the pipeline: off
    // the reactor, and only with one of the server's planning turns.
    let turn = {
        let mut cancel = job.cancel_requested();
        tokio::select! {
            turn = job.planning_turn() => turn,
            _ = cancel.wait_for(|c| *c) => return Err(EngineError::Cancelled.into()),
        }
    };
    let submitted = job.clone();
    let mut translated =
        tokio::task::spawn_blocking(move || translate(submitted.pipeline(), &translation))
            .await
            .map_err(|e| EngineError::InvalidPlan(format!("translation crashed: {e}")))??;
    drop(turn);
    // A pipeline with an unbounded PCollection runs with streaming semantics
    // whatever its options say (Java's test runner, for one, does not set
    // --streaming for unbounded pipelines).
    let streaming = streaming || translated.plan.pcollections.iter().any(|p| !p.bounded);
    facts.streaming = streaming;
    // A streaming job retries a failing bundle with backoff for as long as
    // it runs (it is someone's long-running job: the failure may pass, and
    // they can cancel it); a batch job, or a test fed by a TestStream (which
    // must see its assertion fail), gives up after a few attempts.
    let test_stream = translated
        .plan
        .stages
        .iter()
        .any(|s| matches!(s.kind, StageKind::TestStream(_)));
    let max_attempts = match options.bundle_attempts {
        Some(n) => n,
        None if streaming && !test_stream => u32::MAX,
        None => config.max_attempts,
    };
    let stage_count = translated.plan.stages.len();
    let Some(grant) = admit(&job, memory.as_ref(), stage_count).await else {
        return Err(JobError::Engine(EngineError::Cancelled));
    };
    if job.state() == JobState::Starting {
        job.set_state(JobState::Running);
    }
    let max_pending_bytes = grant.as_ref().map_or(config.max_pending_bytes, |grant| {
        crate::memory::per_stage_bytes(grant.bytes(), stage_count)
    });
    let config = EngineConfig {
        streaming,
        max_attempts,
        max_pending_bytes,
        strict,
        ..config
    };
    job.metrics()
        .set_transform_names(translated.unique_names.clone());
    if let Some(hosts) = &shard_hosts {
        facts.engine_ran = true;
        let checkpoints = durability.as_ref().map(|durability| {
            view.enable_checkpoints();
            ShardedCheckpoints {
                writer: durability.checkpoint_writer(job.clone(), view.clone()),
                every: durability.interval(),
                tolerable_failures: durability.tolerable_failures(),
            }
        });
        let (savepoint_tx, savepoints) = tokio::sync::mpsc::channel(4);
        view.set_savepoint_channel(Some(savepoint_tx));
        let summary = run_on_hosts(OnHosts {
            hosts,
            job: &job,
            layout: options.shards_on_hosts(),
            config: &config,
            stats,
            attempt: facts.attempt,
            checkpoints,
            resume_from: latest_checkpoint.as_ref(),
            savepoints,
            placement,
        })
        .await;
        view.set_savepoint_channel(None);
        let summary = summary?;
        // Each host told the job what its shards spilled and dropped.
        info!(
            bundles = summary.bundles,
            "the shard hosts finished the job's run"
        );
        return Ok(());
    }
    let RegisteredStages {
        stages,
        mergers,
        env_ids,
        descriptor_ids,
        origins,
        stage_names,
    } = register_stages(&fn_server, &mut translated);
    let mut started: Vec<Arc<WorkerSet>> = Vec::new();
    // Open before the workers start: a savepoint asked for while the job
    // is RUNNING but its workers still boot waits for the engine instead
    // of failing.
    let (savepoint_tx, savepoint_rx) = tokio::sync::mpsc::channel(4);
    view.set_savepoint_channel(Some(savepoint_tx));
    let result = async {
        let start = WorkerStart {
            job: &job,
            fn_server: &fn_server,
            environments: &translated.environments,
            origins: &origins,
            workers_per_env,
            asked_workers,
            pools: pools.as_ref(),
            view: &view,
            attempt: facts.attempt,
        };
        let workers = start.start(&env_ids, &mut started).await?;
        // Up to `max_bundles_per_stage` bundles of a stage run at once, and
        // their outputs wait until each commits: together they stay within
        // the stage's queue bound, in memory, so a bundle is split once its
        // output passes its part of it. Past the whole share, one that
        // cannot be split further (one element's output) goes to disk.
        let bundle_output_bytes = max_pending_bytes / config.max_bundles_per_stage.max(1);
        let mut executor =
            HarnessExecutor::new(stages, mergers, workers, job.clone(), stage_names, recorder)
                .with_split_output_bytes(bundle_output_bytes)
                .with_streaming(streaming);
        if let Some(policy) = stall {
            executor = executor.with_stall_watch(policy, view.stalled_bundles());
        }
        if let Some(store) = &spill {
            executor = executor.with_output_spill(JobOutputSpill::new(
                store.clone(),
                job.id().as_bytes(),
                max_pending_bytes,
            ));
        }
        let shard_metrics = options
            .shards
            .map(|layout| Arc::new(ShardMetrics::new(layout)));
        if let Some(metrics) = &shard_metrics {
            executor = executor.with_shard_metrics(metrics.clone());
        }
        let finalizations = executor.finalizations();
        let executor = Arc::new(executor);
        let state_backed_outputs = std::mem::take(&mut translated.state_backed_outputs);
        let metrics_part: refract_engine::manager::ExtraPart = {
            let job = job.clone();
            Arc::new(move || crate::durability::metrics_part(&job))
        };
        let mut checkpoint_writer = None;
        let summary = if let (Some(layout), Some(metrics)) = (options.shards, shard_metrics) {
            facts.engine_ran = true;
            let checkpoints = durability.as_ref().map(|durability| {
                view.enable_checkpoints();
                let writer = durability.checkpoint_writer(job.clone(), view.clone());
                ShardedCheckpoints {
                    writer,
                    every: durability.interval(),
                    tolerable_failures: durability.tolerable_failures(),
                }
            });
            run_on_shards(ShardedJob {
                layout,
                plan: translated.plan,
                executor,
                config,
                job: &job,
                view: &view,
                stats,
                spill: spill.clone().map(|store| (store, max_pending_bytes)),
                savepoints: savepoint_rx,
                checkpoints,
                resume_from: latest_checkpoint.as_ref(),
                mapping: &options.transform_name_mapping,
                metrics,
                exchange: options.shard_exchange,
            })
            .await
        } else {
            let mut builder = Engine::builder(
                translated.plan,
                executor,
                config,
                job.id().to_string(),
                Arc::new(wall_clock_ms),
            )
            .drain(job.drain_requested())
            .stats(stats)
            .extra_part(crate::durability::METRICS_PART, metrics_part)
            .savepoints(savepoint_rx);
            if let Some(store) = spill.clone() {
                // A GroupByKey may hold a stage's share of the budget before it
                // spills (without a budget, the engine's queue bound).
                builder = builder
                    .spill(store, job.id().as_bytes(), max_pending_bytes)
                    .state_backed_outputs(&state_backed_outputs);
                if let Some(durability) = &durability {
                    // Bags past their share go beside the checkpoints, which
                    // name them: a checkpointed job's state may outgrow memory.
                    builder = builder.durable_state(durability.state_store(job.id()));
                }
            }
            if let Some(durability) = &durability {
                view.enable_checkpoints();
                let writer = durability.checkpoint_writer(job.clone(), view.clone());
                builder = builder
                    .checkpoints(durability.interval(), writer.tx, Some(writer.progress))
                    .tolerable_checkpoint_failures(durability.tolerable_failures());
                checkpoint_writer = Some(writer.task);
            }
            let mut engine = builder.build()?;
            if let Some(checkpoint) = &latest_checkpoint {
                resume(
                    std::slice::from_mut(&mut engine),
                    checkpoint,
                    &options.transform_name_mapping,
                    &job,
                    &view,
                    None,
                )?;
            }
            facts.engine_ran = true;
            engine
                .run(job.cancel_requested())
                .await
                .map_err(JobError::from)
        };
        view.set_savepoint_channel(None);
        let spilled = summary.as_ref().map_or(true, |s| {
            s.spilled_bytes + s.output_spilled_bytes + s.queue_spilled_bytes + s.state_spilled_bytes
                > 0
        });
        if let (Some(store), true) = (&spill, spilled) {
            reclaim_job_spill(store.as_ref(), job.id(), options.shards);
        }
        let summary = summary?;
        let unfinished = finalizations.wait(FINALIZATION_LIMIT).await;
        if unfinished > 0 {
            warn!(
                unfinished,
                "bundle finalizations still running when the job ended"
            );
        }
        if let Some(task) = checkpoint_writer {
            // The engine dropped its sender: the task ends after the
            // checkpoint in hand, if any, is written.
            let _ = task.await;
        }
        report_summary(&job, &summary);
        Ok::<(), JobError>(())
    }
    .await;
    view.set_savepoint_channel(None);
    // All at once: a pool that is slow to answer StopWorker delays the job's
    // end by one timeout, not one per worker.
    let workers: Vec<_> = started.iter().flat_map(|set| set.close()).collect();
    futures::future::join_all(workers.iter().map(|w| w.stop())).await;
    for id in descriptor_ids {
        fn_server.forget_descriptor(&id);
    }
    result
}

/// A translated job's SDK side, registered with the Fn API server.
pub(super) struct RegisteredStages {
    /// The SDK stages and window mergers, by stage.
    pub(super) stages: HashMap<StageIdx, Arc<SdkStageDescriptor>>,
    pub(super) mergers: HashMap<StageIdx, Arc<WindowMerger>>,
    /// The environments they run in, sorted.
    pub(super) env_ids: Vec<String>,
    /// What to forget once the job's run ends.
    pub(super) descriptor_ids: Vec<String>,
    /// Each descriptor transform's stage and name, for worker log lines.
    pub(super) origins: Arc<TransformOrigins>,
    /// Each stage's name, for the executor's messages.
    pub(super) stage_names: HashMap<StageIdx, String>,
}

/// Registers `translated`'s SDK stages and window mergers (taken out of
/// it) with `fn_server`, so that workers can fetch their descriptors.
pub(super) fn register_stages(
    fn_server: &FnApiServer,
    translated: &mut Translated,
) -> RegisteredStages {
    let mut origins = TransformOrigins::new();
    for (idx, stage) in &translated.sdk_stages {
        let stage_name: Arc<str> = translated
            .plan
            .stages
            .get(*idx)
            .map_or_else(|| Arc::from(""), |s| Arc::from(s.name.as_str()));
        for id in stage.descriptor.transforms.keys() {
            let name = translated
                .unique_names
                .get(id)
                .cloned()
                .unwrap_or_else(|| id.clone());
            origins.insert(id.clone(), (stage_name.clone(), name));
        }
    }
    let mut stages = HashMap::new();
    let mut environments: HashSet<String> = HashSet::new();
    let mut descriptor_ids = Vec::new();
    for (idx, stage) in std::mem::take(&mut translated.sdk_stages) {
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
    for (idx, merger) in std::mem::take(&mut translated.window_mergers) {
        fn_server.register_descriptor(merger.descriptor.clone());
        descriptor_ids.push(merger.descriptor.id.clone());
        environments.insert(merger.environment_id.clone());
        mergers.insert(idx, Arc::new(merger));
    }
    let mut env_ids: Vec<String> = environments.into_iter().collect();
    env_ids.sort();
    let stage_names = translated
        .plan
        .stages
        .iter_enumerated()
        .map(|(idx, stage)| (idx, stage.name.clone()))
        .collect();
    RegisteredStages {
        stage_names,
        stages,
        mergers,
        env_ids,
        descriptor_ids,
        origins: Arc::new(origins),
    }
}

/// The parts of the savepoint a new job asked to start from, read from
/// the server's savepoint directory only; a cancel while it is read ends
/// the job at once.
async fn read_savepoint(
    job: &Job,
    savepoints: Option<Arc<SavepointDir>>,
    requested: &str,
) -> Result<Vec<(String, bytes::Bytes)>, JobError> {
    let Some(dir) = savepoints else {
        return Err(JobError::Savepoint(format!(
            "savepoint '{requested}' refused: this server has no savepoint directory \
             (--savepoint_dir)"
        )));
    };
    let name = requested.to_string();
    let reading = tokio::task::spawn_blocking(move || dir.read(&name));
    let mut cancel = job.cancel_requested();
    tokio::select! {
        read = reading => read
            .map_err(|e| EngineError::InvalidPlan(format!("reading the savepoint: {e}")))?
            .map_err(JobError::Savepoint),
        _ = cancel.wait_for(|c| *c) => Err(EngineError::Cancelled.into()),
    }
}

/// The job's share of the server's memory (`None` inside: no ledger),
/// waiting while not even its stages' floor is left; outer `None` if it
/// was cancelled meanwhile.
async fn admit(
    job: &Arc<Job>,
    memory: Option<&(Arc<MemoryLedger>, usize)>,
    stages: usize,
) -> Option<Option<MemoryGrant>> {
    let Some((ledger, per_job)) = memory else {
        return Some(None);
    };
    let floor = stages.max(1).saturating_mul(crate::memory::MIN_STAGE_BYTES);
    let told = job.clone();
    let waiting = move |full: Exhausted| {
        told.message(
            MessageImportance::JobMessageBasic,
            format!(
                "waiting for memory: {} running job(s) hold {} MiB of the server's {} MiB \
                 (--memory_budget), and this job needs at least {} MiB; it starts when one ends",
                full.jobs,
                full.held >> 20,
                full.total >> 20,
                floor >> 20
            ),
        );
    };
    let mut cancel = job.cancel_requested();
    tokio::select! {
        grant = ledger.grant(floor, *per_job, waiting) => Some(Some(grant)),
        _ = cancel.wait_for(|c| *c) => None,
    }
}

/// Logs what the engine did, and tells the job what went to disk.
pub(super) fn report_summary(job: &Job, summary: &RunSummary) {
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
    if let Some(strict) = &summary.strict {
        job.message(
            MessageImportance::JobMessageBasic,
            format!(
                "strict mode (seed {}) ran {} bundle(s) twice, cut {} smaller and reordered \
                 the input of {}",
                strict.seed,
                strict.replayed_bundles,
                strict.smaller_bundles,
                strict.reordered_bundles
            ),
        );
    }
    job.metrics()
        .commit(&dropped_late_metrics(&summary.dropped_late_by_stage));
}

/// Gives back the disk space of everything job `job_id` spilled: queues
/// and bundle outputs forget their parts as they read them without
/// compacting (cheap, but the space stays until RocksDB compacts those
/// files); one compaction over the job's whole space when it ends does it.
pub(super) fn reclaim_job_spill(store: &dyn SpillSpace, job_id: &str, shards: Option<ShardLayout>) {
    let job = job_id.as_bytes();
    let shard_prefixes = shards
        .iter()
        .flat_map(ShardLayout::ids)
        .map(|shard| shard.spill_prefix(job));
    for prefix in std::iter::once(job.to_vec()).chain(shard_prefixes) {
        let space = refract_engine::spill::job_space(&prefix);
        let Some(end) = refract_engine::spill::prefix_end(&space) else {
            continue;
        };
        if let Err(e) = store.delete_range(&space, &end) {
            warn!(job_id, error = %e, "could not give back a job's spill space");
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use refract_engine::plan::StageIdx;
    use refract_engine::spill::{MemorySpillSpace, SpillArea};

    #[test]
    fn a_sharded_job_gives_back_every_shards_spill_space() {
        let store = MemorySpillSpace::shared();
        let layout = ShardLayout::new(3).expect("a layout");
        let mut prefixes: Vec<Vec<u8>> = layout
            .ids()
            .map(|shard| shard.spill_prefix(b"job-1"))
            .collect();
        prefixes.push(b"job-1".to_vec());
        for prefix in &prefixes {
            let key = SpillArea::Stage(StageIdx::new(0)).prefix(prefix);
            store.put(vec![(key, b"v".to_vec())]).expect("put");
        }
        let other = SpillArea::Stage(StageIdx::new(0)).prefix(b"job-2");
        store.put(vec![(other, b"v".to_vec())]).expect("put");
        reclaim_job_spill(store.as_ref(), "job-1", Some(layout));
        assert_eq!(store.len(), 1, "only the other job's entry is left");
    }
}
