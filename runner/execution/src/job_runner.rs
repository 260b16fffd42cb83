//! Executes submitted jobs: the runner half of the Job API.
//!
//! For each job: translate the pipeline into a stage plan, start SDK
//! workers for the environments its stages use, run the engine, and report
//! the outcome through the job's state and message streams (`run`). A
//! failure ends as FAILED with the reason as the last ERROR message — for a
//! failing DoFn, the SDK's own traceback text — except that a streaming
//! job tries again, with growing waits (`retry`), after a failure that may
//! pass: workers that do not start, or a store that fails (a full disk) in
//! a job that resumes from its checkpoints. A failed durable job keeps its
//! record and latest checkpoint, to be resumed or deleted.

mod host_reports;
mod hosted;
mod job_options;
mod logs;
mod on_hosts;
mod rescale;
mod resume;
mod retry;
mod run;
mod shard_savepoints;
mod sharded;
mod strict;
mod update;
mod workers;

use std::sync::Arc;

use refract_engine::manager::{EngineConfig, EngineError, SnapshotError};
use refract_engine::spill::SpillSpace;
use refract_jobservice::{Job, JobRunner, RescaleError};
use refract_observability::insights::Insights;
use refract_observability::telemetry::{BundleRecorder, OtlpExport};
use refract_pools::WorkerPools;
use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::job_api::job_state;
use refract_proto::pipeline::Pipeline;
use refract_proto::prost_types;
use refract_sdk_harness::FnApiServer;
use refract_store::savepoint_dir::SavepointDir;
use refract_store::StoreError;
use refract_translate::{validate, EnvironmentPreference};
use thiserror::Error;
use tracing::{error, info, warn, Instrument};

use crate::activity::Activity;
use crate::durability::{Durability, DurabilityError};
use crate::memory::MemoryLedger;
use crate::stall_watch::StallPolicy;
use job_options::{JobOptions, StateStoreChoice};
use rescale::{RescaleDesk, RescaleInbox};
use retry::Backoff;
use run::{run_job, AttemptFacts, JobResources, JobWatchers};
use workers::WorkerCounts;

pub use hosted::{RunControl, RunStop, ShardHostRunner};
pub use on_hosts::ShardHostsAccess;
pub use strict::{STRICT_EXPERIMENT, STRICT_SEED_EXPERIMENT};

/// The experiment that starts a job draining (documented in
/// docs/compatibility.md): used by test suites that check drain semantics.
pub const DRAIN_ON_START: &str = "drain_on_start";

/// The experiment that starts a job from a savepoint file:
/// `--experiments=refract_savepoint=/path/to/file` (documented in
/// docs/operations.md). The pipeline must be the one the savepoint was
/// taken of.
pub const SAVEPOINT_EXPERIMENT: &str = "refract_savepoint";

/// The experiment bounding how often a failing bundle is tried:
/// `--experiments=refract_bundle_attempts=N`. Without it a batch job (or a
/// TestStream-fed test) gives up after the engine's few attempts, and a
/// streaming job retries for as long as it runs (documented in
/// docs/operations.md); with it, a streaming job whose bundle fails N times
/// fails with the SDK's error, as a test of a failing source expects.
pub const BUNDLE_ATTEMPTS_EXPERIMENT: &str = "refract_bundle_attempts";

/// The experiment running one job on several engine shards in this
/// process: `--experiments=refract_shards=N` (1 to 128; documented in
/// docs/scaling.md). Each shard owns an equal run of the key groups of
/// every keyed stage; the job's results are the same as on one engine.
/// On a server that checkpoints jobs, each checkpoint is an epoch every
/// shard cuts, and a job resumes on as many shards as wrote it.
pub const SHARDS_EXPERIMENT: &str = "refract_shards";

/// The experiment choosing how a job's shards exchange elements and
/// watermarks: `--experiments=refract_shard_exchange=board` (the default)
/// joins them by one lock in memory; `=grpc` by the frame protocol over
/// gRPC on the loopback interface, the transport shards on other hosts
/// use (documented in docs/scaling.md). Only with `refract_shards`.
pub const SHARD_EXCHANGE_EXPERIMENT: &str = "refract_shard_exchange";

/// The experiment choosing where one job keeps its state:
/// `--experiments=refract_state_store=memory` keeps it in memory on a
/// server with `--state_dir` (nothing checkpointed, nothing resumed);
/// `=rocksdb` insists on the durable spill space, and is refused at submission
/// by a server without one. Without it, the server's choice holds.
pub const STATE_STORE_EXPERIMENT: &str = "refract_state_store";

/// The store a job asked for (`choice`), checked against what the server
/// has.
fn job_durability(
    choice: StateStoreChoice,
    server: Option<&Arc<Durability>>,
) -> Result<Option<Arc<Durability>>, String> {
    match choice {
        StateStoreChoice::ServerDefault => Ok(server.cloned()),
        StateStoreChoice::Memory => Ok(None),
        StateStoreChoice::RocksDb => match server {
            Some(durability) => Ok(Some(durability.clone())),
            None => Err(format!(
                "--experiments={STATE_STORE_EXPERIMENT}=rocksdb needs a runner started with \
                 `refract serve --state_dir DIR`; this one keeps state in memory"
            )),
        },
    }
}

/// Why a job could not run.
#[derive(Debug, Error)]
pub(super) enum JobError {
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
    /// The savepoint a new job asked to start from cannot be read (where,
    /// what and why are in the text).
    #[error("{0}")]
    Savepoint(String),
    /// The exchange between the job's shards could not start.
    #[error("{0}")]
    Exchange(#[from] refract_exchange::ExchangeError),
    /// A shard host's part of the run failed: its text is the host's
    /// (for a failing DoFn, the SDK's own).
    #[error("{text}")]
    OnHost {
        /// What failed, as the host said.
        text: String,
        /// Whether the host judged that trying again may succeed.
        may_pass: bool,
    },
    /// A shard host with a part in the run is gone.
    #[error("{0}")]
    HostLost(String),
    /// The control plane to the shard hosts failed.
    #[error("{0}")]
    Hosts(#[from] refract_hosts::HostsError),
}

impl JobError {
    /// Whether trying again later may succeed: a worker that did not start
    /// (its pool or image may come), a store or spill directory that
    /// failed, checkpoints that kept failing (a disk may free up). Not: a pipeline that cannot run, a
    /// checkpoint that cannot be read, a DoFn that keeps failing.
    fn may_pass(&self) -> bool {
        match self {
            JobError::Harness(_)
            | JobError::Exchange(_)
            | JobError::HostLost(_)
            | JobError::Hosts(_) => true,
            JobError::OnHost { may_pass, .. } => *may_pass,
            JobError::Engine(e) => matches!(
                e,
                EngineError::Spill { .. }
                    | EngineError::OutputSpill { .. }
                    | EngineError::CheckpointsFailing { .. }
                    | EngineError::ExchangeLost { .. }
            ),
            JobError::Durability(DurabilityError::Store(StoreError::Backend(_))) => true,
            JobError::Translate(_)
            | JobError::Durability(_)
            | JobError::Restore(_)
            | JobError::Savepoint(_) => false,
        }
    }
}

impl JobError {
    /// Whether the run ended because it was cancelled.
    fn is_cancelled(&self) -> bool {
        matches!(self, JobError::Engine(EngineError::Cancelled))
    }
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
    /// The server's memory, and the most one job is granted of it.
    memory: Option<(Arc<MemoryLedger>, usize)>,
    /// Where GroupByKey buffers over their share of the budget spill.
    spill: Option<Arc<dyn SpillSpace>>,
    /// Which alternative of an AnyOf environment jobs start.
    environment_preference: EnvironmentPreference,
    /// Remote worker pools, if the server has any.
    pools: Option<Arc<WorkerPools>>,
    /// Workers per environment the server was told to start, if it was
    /// (else pooled environments get their pools' capacity).
    asked_default_workers: Option<usize>,
    /// Where jobs may start from savepoints; without it they may not.
    savepoints: Option<Arc<SavepointDir>>,
    /// How bundles without progress are found and handled, if they are.
    stall: Option<StallPolicy>,
    /// Running jobs' requests to move onto another number of shards.
    rescales: Arc<RescaleDesk>,
    /// The shard hosts this server coordinates, if any.
    shard_hosts: Option<ShardHostsAccess>,
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
            memory: None,
            spill: None,
            environment_preference: EnvironmentPreference::default(),
            pools: None,
            asked_default_workers: None,
            savepoints: None,
            stall: Some(StallPolicy::default()),
            rescales: Arc::default(),
            shard_hosts: None,
        }
    }

    /// Let jobs start from savepoints in `dir` (`--experiments=
    /// refract_savepoint=FILE`); without it, asking to fails the job.
    pub fn with_savepoints(mut self, dir: Option<Arc<SavepointDir>>) -> Self {
        self.savepoints = dir;
        self
    }

    /// Run every job's shards on the shard hosts attached to this
    /// coordinator (see [`refract_hosts`]), none of them here.
    pub fn with_shard_hosts(mut self, hosts: Option<ShardHostsAccess>) -> Self {
        self.shard_hosts = hosts;
        self
    }

    /// Start the workers of environments that `pools` serve on those
    /// pools (see [`refract_pools`]).
    pub fn with_pools(mut self, pools: Option<Arc<WorkerPools>>) -> Self {
        self.pools = pools;
        self
    }

    /// The server's pools, if it has any.
    pub fn pools(&self) -> Option<&Arc<WorkerPools>> {
        self.pools.as_ref()
    }

    /// Start the alternative of an AnyOf environment (as expansion
    /// services return) that comes first in `preference`.
    pub fn with_environment_preference(mut self, preference: EnvironmentPreference) -> Self {
        self.environment_preference = preference;
        self
    }

    /// Let a job's batch GroupByKey buffers spill to `store` once one holds
    /// more than a stage's share of the memory budget (see
    /// [`refract_engine::spill`]); without it they stay in memory.
    pub fn with_spill(mut self, store: Arc<dyn SpillSpace>) -> Self {
        self.spill = Some(store);
        self
    }

    /// Grant each job up to `per_job` bytes of `ledger`'s budget for its
    /// data (split over its stages; see [`crate::memory`]); a job for which
    /// not even its stages' floor is left waits. Without it, each stage
    /// keeps the engine's default bound.
    pub fn with_memory(mut self, ledger: Arc<MemoryLedger>, per_job: usize) -> Self {
        self.memory = Some((ledger, per_job));
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

    /// Watch running bundles' progress under `policy` (`None`: do not;
    /// default: report after [`StallPolicy::DEFAULT_TIMEOUT`]).
    pub fn with_stall_policy(mut self, policy: Option<StallPolicy>) -> Self {
        self.stall = policy;
        self
    }

    /// Workers per environment for jobs whose `sdk_worker_parallelism`
    /// option is 0 ("let the runner choose").
    pub fn with_default_workers(mut self, workers: usize) -> Self {
        self.default_workers = workers.max(1);
        self
    }

    /// Like [`Self::with_default_workers`], for a count the operator
    /// chose: it holds for pooled environments too, which otherwise get
    /// as many workers as their pools' capacity.
    pub fn with_asked_workers(mut self, workers: usize) -> Self {
        self.default_workers = workers.max(1);
        self.asked_default_workers = Some(workers.max(1));
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
        let options = JobOptions::read(options)?;
        job_durability(options.state_store, self.durability.as_ref()).map(|_| ())
    }

    fn replaced_job(
        &self,
        live: &[Arc<Job>],
        pipeline: &Pipeline,
        options: &prost_types::Struct,
    ) -> Result<Option<Arc<Job>>, String> {
        update::replaced_job(live, pipeline, options, &self.environment_preference)
    }

    fn resumable(&self, job: &Job) -> bool {
        let Some(durability) = &self.durability else {
            return false;
        };
        job.is_durable() && durability.can_resume(job.id())
    }

    fn delete(&self, job: &Job) -> Result<(), String> {
        self.insights.remove(job.id());
        match &self.durability {
            Some(durability) if job.is_durable() => {
                durability.forget(job.id()).map_err(|e| e.to_string())
            }
            _ => Ok(()),
        }
    }

    fn evicted(&self, job: &Job) {
        self.insights.remove(job.id());
    }

    fn describe(&self, job: &Job, description: &mut refract_proto::admin::JobDescription) {
        description.resumable = job.state() == job_state::Enum::Failed && self.resumable(job);
        description.shards = self.rescales.shards(job.id()).unwrap_or(0);
        let Some(view) = self.insights.job(job.id()) else {
            return;
        };
        let c = view.checkpoints();
        description.checkpoints = Some(refract_proto::admin::CheckpointSummary {
            enabled: c.enabled,
            written: c.taken,
            failed: c.failed,
            latest_id: c.last.as_ref().map_or(0, |l| l.id),
            age_ms: c
                .age()
                .map_or(0, |a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX)),
            last_error: c.last_error.clone().unwrap_or_default(),
            restored_from: c.restored_from.unwrap_or(0),
        });
    }

    fn durable(&self) -> bool {
        self.durability.is_some()
    }

    fn pools(&self) -> Vec<refract_proto::admin::WorkerPool> {
        let Some(pools) = &self.pools else {
            return Vec::new();
        };
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        pools
            .directory()
            .statuses()
            .into_iter()
            .map(|p| refract_proto::admin::WorkerPool {
                spec: p.spec,
                address: p.address,
                state: p.state,
                capacity: count(p.capacity),
                workers: count(p.workers),
                detail: p.detail,
            })
            .collect()
    }

    fn add_pool(&self, spec: &str) -> Result<(), String> {
        let Some(pools) = &self.pools else {
            return Err(format!(
                "cannot add worker pool {spec:?}: start the server with --worker_pool \
                 to use remote worker pools"
            ));
        };
        let spec: refract_pools::PoolSpec = spec.parse().map_err(|e| format!("{e}"))?;
        pools.add(spec).map_err(|e| e.to_string())
    }

    fn rescale(
        &self,
        job: Arc<Job>,
        shards: u32,
    ) -> futures::future::BoxFuture<'static, Result<u32, RescaleError>> {
        let desk = self.rescales.clone();
        Box::pin(async move { desk.ask(job.id(), shards).await })
    }

    fn remove_pool(&self, spec: &str) -> bool {
        self.pools.as_ref().is_some_and(|p| p.remove(spec))
    }

    fn start(&self, job: Arc<Job>) {
        let fn_server = self.fn_server.clone();
        let config = self.engine_config.clone();
        // Checked at submission (`validate`); a recovered job whose
        // options no longer read fails with the reason when it runs.
        let options = JobOptions::read(job.options());
        let counts = WorkerCounts::choose(
            options.as_ref().ok().and_then(|o| o.worker_parallelism),
            self.default_workers,
            self.asked_default_workers,
        );
        let resources = JobResources {
            workers_per_env: counts.local,
            asked_workers: counts.pooled,
            pools: self.pools.clone(),
            memory: self.memory.clone(),
            spill: self.spill.clone(),
            environment_preference: self.environment_preference.clone(),
            savepoints: self.savepoints.clone(),
            stall: self.stall,
            handed_over: None,
            shard_hosts: self.shard_hosts.clone(),
            placement: None,
        };
        let insights = self.insights.clone();
        let span = tracing::info_span!("job", id = %job.id());
        let activity = self.activity.clone();
        let (view, stats) = self.insights.register(job.clone());
        tokio::spawn(view.clone().sample_history_while_running());
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
        let state_store = options
            .as_ref()
            .map_or(StateStoreChoice::ServerDefault, |o| o.state_store);
        let durability = job_durability(state_store, self.durability.as_ref())
            .unwrap_or_else(|_| self.durability.clone());
        if durability.is_some() {
            // Before it can end: a failure then keeps what a resume needs.
            job.mark_durable();
        }
        let inbox = self.rescales.open(
            job.id(),
            options.as_ref().map_or(1, |o| rescale::count(o.shards)),
        );
        activity.job_started();
        tokio::spawn(
            async move {
                let watchers = JobWatchers {
                    stats,
                    view: view.clone(),
                    recorder,
                    durability: durability.clone(),
                };
                let mut resources = resources;
                let handed_over = match job.replaces() {
                    Some(old) => update::take_over(&insights, &job, old).await.map(Some),
                    None => Ok(None),
                };
                let outcome = match (options, handed_over) {
                    (Ok(mut options), Ok(handed_over)) => {
                        resources.handed_over = handed_over;
                        let mut inbox = inbox;
                        // A job moved onto another number of shards stays
                        // there (its record says so).
                        if let Some(shards) =
                            rescale::recorded_shards(durability.as_ref(), &job).await
                        {
                            options.shards = shards;
                            inbox.set_shards(rescale::count(shards));
                        }
                        run_with_retries(
                            &job, options, &fn_server, config, resources, watchers, &mut inbox,
                        )
                        .await
                    }
                    (Err(reason), _) | (_, Err(reason)) => {
                        Err(EngineError::InvalidPlan(reason).into())
                    }
                };
                view.clear_workers();
                activity.job_ended();
                let error = match &outcome {
                    Ok(()) | Err(JobError::Engine(EngineError::Cancelled)) => None,
                    Err(e) => Some(e.to_string()),
                };
                if let (Some(durability), Some(error)) = (&durability, &error) {
                    // Before the job ends: its last messages say what is kept.
                    keep_failed(durability, &job, error).await;
                }
                match outcome {
                    Ok(()) => {
                        info!("job done");
                        job.set_state(job_state::Enum::Done);
                    }
                    Err(JobError::Engine(EngineError::Cancelled)) => {
                        if let Some(by) = job.replaced_by() {
                            info!(replaced_by = %by, "job updated");
                            job.set_state(job_state::Enum::Updated);
                        } else {
                            info!("job cancelled");
                            job.set_state(job_state::Enum::Cancelled);
                        }
                    }
                    Err(e) => {
                        error!(error = %e, "job failed");
                        job.fail(e.to_string());
                    }
                }
                if let Some((_, span)) = job_span {
                    span.end(job.state().as_str_name(), error.as_deref());
                }
                if let Some(durability) = durability {
                    let durability_again = durability.clone();
                    let ended = job.clone();
                    let failed = error.is_some();
                    // The record goes first: a crash between the two then
                    // costs the history file, never a resumed ended job;
                    // and a history file says the record is gone.
                    let done = tokio::task::spawn_blocking(move || {
                        let forgotten = if failed {
                            Ok(())
                        } else {
                            durability.forget(ended.id())
                        };
                        if let Err(e) = durability.write_history(&ended) {
                            warn!(error = %e, "cannot write the ended job's history");
                        }
                        forgotten
                    })
                    .await;
                    if let Ok(Err(error)) = done {
                        error!(%error, "cannot mark the ended job ended in the state store; \
                               trying again until it is (else the next start would resume it)");
                        tokio::spawn(forget_until_done(durability_again, job.clone()));
                    }
                }
            }
            .instrument(span),
        );
    }
}

/// How often marking an ended job ended is tried again after it failed.
const FORGET_RETRY: std::time::Duration = std::time::Duration::from_secs(10);

/// Tries to mark `job` ended in the state store until that works: while it
/// is not, a restart would run the ended job again.
async fn forget_until_done(durability: Arc<Durability>, job: Arc<Job>) {
    loop {
        tokio::time::sleep(FORGET_RETRY).await;
        let (store, id) = (durability.clone(), job.id().to_string());
        match tokio::task::spawn_blocking(move || store.forget(&id)).await {
            Ok(Ok(())) => {
                info!(job_id = %job.id(), "the ended job is marked ended in the state store");
                return;
            }
            Ok(Err(error)) => {
                tracing::debug!(job_id = %job.id(), %error, "still cannot mark the ended job")
            }
            Err(_) => return,
        }
    }
}

/// Keeps a failed durable job's record and latest checkpoint (marked
/// failed, to be resumed or deleted), and tells the job so.
async fn keep_failed(durability: &Arc<Durability>, job: &Arc<Job>, error: &str) {
    let (store, id, error) = (durability.clone(), job.id().to_string(), error.to_string());
    match tokio::task::spawn_blocking(move || store.mark_failed(&id, &error)).await {
        Ok(Ok(())) => job.message(
            MessageImportance::JobMessageBasic,
            format!(
                "the job's record and latest checkpoint are kept: `refract resume {}` starts \
                 it again from there, `refract delete {}` forgets it",
                job.id(),
                job.id()
            ),
        ),
        Ok(Err(e)) => error!(error = %e, "cannot mark the failed job in the state store"),
        Err(e) => error!(error = %e, "marking the failed job crashed"),
    }
}

/// Runs attempts of `job` until one ends for good. After a failure that
/// may pass, a streaming job tries again after a growing wait — if nothing
/// can be lost by it: the job resumes from its checkpoints, or its engine
/// never started. A cancel during the wait ends it cancelled.
async fn run_with_retries(
    job: &Arc<Job>,
    mut options: JobOptions,
    fn_server: &Arc<FnApiServer>,
    config: EngineConfig,
    mut resources: JobResources,
    watchers: JobWatchers,
    inbox: &mut RescaleInbox,
) -> Result<(), JobError> {
    let mut backoff = Backoff::default();
    let mut cancel = job.cancel_requested();
    if resources.shard_hosts.is_some() {
        resources.placement = Some(inbox.placement());
    }
    loop {
        let mut facts = AttemptFacts {
            streaming: options.streaming,
            engine_ran: false,
            attempt: backoff.attempts(),
        };
        let attempt = run_job(
            job.clone(),
            options.clone(),
            fn_server.clone(),
            config.clone(),
            resources.clone(),
            watchers.clone(),
            &mut facts,
        );
        let (outcome, moved) =
            rescale::run_taking_requests(attempt, inbox, &watchers.view, job).await;
        if let Some(moved) = moved {
            if rescale::stopped_to_move(&outcome, job) {
                watchers.view.clear_workers();
                let next =
                    rescale::carry_out(moved, job, inbox, watchers.durability.as_ref()).await;
                if !next.follows_hosts {
                    options.shards = next.shards;
                    options.shards_chosen = true;
                }
                resources.handed_over = next.handed_over;
                continue;
            }
            moved.refuse(format!("job {} ended before it moved", job.id()));
        }
        let error = match outcome {
            Err(error) if error.may_pass() => error,
            other => return other,
        };
        let resumes = watchers.durability.is_some();
        if !facts.streaming || (facts.engine_ran && !resumes) {
            return Err(error);
        }
        watchers.view.clear_workers();
        let wait = backoff.next_wait();
        warn!(%error, attempt = backoff.attempts(), ?wait, "the job failed; trying again");
        job.message(
            MessageImportance::JobMessageWarning,
            format!(
                "the job failed ({error}); a streaming job tries again: attempt {} in {:.0?}{}",
                backoff.attempts() + 1,
                wait,
                if resumes {
                    ", from its latest checkpoint"
                } else {
                    ""
                }
            ),
        );
        if !Backoff::sleep(wait, &mut cancel).await {
            return Err(JobError::Engine(EngineError::Cancelled));
        }
    }
}
