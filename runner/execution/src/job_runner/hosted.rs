//! A shard host's side of a run (`refract shard`): fetch the job's staged
//! files, translate its pipeline as the coordinator did, start SDK workers
//! here, build an engine for each of the run's shards placed here, join
//! the run's exchange session (the other shards, wherever they live, and
//! the coordinator's quiet detector), run them, and report back the job's
//! messages, committed metrics, stage numbers and how the part ended.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use refract_engine::manager::{
    run_shards, CheckpointProgress, EngineConfig, EngineError, EpochRequest, RunSummary,
    ShardCheckpoints, StageStats,
};
use refract_engine::shards::{ShardId, ShardLayout, ShardLink};
use refract_engine::spill::SpillSpace;
use refract_exchange::connection::channel_to_address;
use refract_exchange::server::ExchangeHost;
use refract_exchange::session::SessionKey;
use refract_exchange::wire::Routes;
use refract_exchange::{join_session, Joining};
use refract_hosts::{Attachment, RunReporter};
use refract_jobservice::{Job, JobEvent, StagedArtifact};
use refract_observability::insights::Insights;
use refract_observability::telemetry::BundleRecorder;
use refract_pools::WorkerPools;
use refract_proto::hosts::{run_report, CutPiece, EpochCut, JobMessage, Metrics, RunShards};
use refract_proto::job_api::job_state::Enum as JobState;
use refract_proto::pipeline::Pipeline;
use refract_proto::prost::Message;
use refract_proto::prost_types;
use refract_sdk_harness::FnApiServer;
use refract_store::Checkpoint;
use refract_translate::{translate, EnvironmentPreference};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{info, warn};

use super::host_reports::{encode_metrics, ended, stage_numbers};
use super::job_options::JobOptions;
use super::resume::resume;
use super::run::{reclaim_job_spill, register_stages, report_summary, RegisteredStages};
use super::sharded::{add_up_snapshots, ShardCheckpointing, ShardParts};
use super::workers::{WorkerCounts, WorkerStart};
use super::JobError;
use crate::harness_executor::HarnessExecutor;
use crate::output_spill::JobOutputSpill;
use crate::shard_metrics::ShardMetrics;
use crate::worker_set::WorkerSet;

/// How often a run's metrics and stage numbers go to the coordinator.
const REPORT_EVERY: Duration = Duration::from_millis(500);

/// What the coordinator asked of a run after it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStop {
    /// Nothing yet.
    Running,
    /// Drain it: stop its sources, let its windows flush.
    Drain,
    /// Cancel it.
    Cancel,
}

/// What the coordinator tells a run on this host after it started.
#[derive(Debug)]
pub struct RunControl {
    /// Whether to stop it.
    pub stop: watch::Receiver<RunStop>,
    /// How far the job's checkpoints have got, for a checkpointed run.
    pub progress: watch::Receiver<CheckpointProgress>,
    /// Requests to cut an epoch now (request number, and whether to stop
    /// after it), for the host of shard 0.
    pub cut_requests: mpsc::Receiver<(u64, bool)>,
}

/// Runs the shards a coordinator places on this host.
#[derive(Clone)]
pub struct ShardHostRunner {
    fn_server: Arc<FnApiServer>,
    exchange: ExchangeHost,
    coordinator: String,
    work_dir: PathBuf,
    engine_config: EngineConfig,
    default_workers: usize,
    asked_workers: Option<usize>,
    environment_preference: EnvironmentPreference,
    pools: Option<Arc<WorkerPools>>,
    spill: Option<Arc<dyn SpillSpace>>,
}

impl ShardHostRunner {
    /// A host whose workers talk to `fn_server`, whose shards are reached
    /// through `exchange`, attached to the coordinator at `coordinator`
    /// (which hosts each run's quiet detector), keeping runs' staged
    /// files under `work_dir`.
    pub fn new(
        fn_server: Arc<FnApiServer>,
        exchange: ExchangeHost,
        coordinator: String,
        work_dir: PathBuf,
    ) -> Self {
        ShardHostRunner {
            fn_server,
            exchange,
            coordinator,
            work_dir,
            engine_config: EngineConfig::default(),
            default_workers: 1,
            asked_workers: None,
            environment_preference: EnvironmentPreference::default(),
            pools: None,
            spill: None,
        }
    }

    /// Where GroupByKey buffers, queues and bundle outputs past their
    /// share of memory go, as on a server (see [`crate::scratch_spill`]).
    pub fn with_spill(mut self, spill: Arc<dyn SpillSpace>) -> Self {
        self.spill = Some(spill);
        self
    }

    /// Start the workers of environments that `pools` serve on those
    /// pools (see [`refract_pools`]).
    pub fn with_pools(mut self, pools: Option<Arc<WorkerPools>>) -> Self {
        self.pools = pools;
        self
    }

    /// SDK workers per environment when a job does not ask (one per core
    /// by default), and whether the operator chose that number.
    pub fn with_workers(mut self, default_workers: usize, asked: bool) -> Self {
        self.default_workers = default_workers.max(1);
        self.asked_workers = asked.then_some(default_workers.max(1));
        self
    }

    /// Which alternative of an AnyOf environment runs.
    pub fn with_environment_preference(mut self, preference: EnvironmentPreference) -> Self {
        self.environment_preference = preference;
        self
    }

    /// Runs `command` to its end, reporting on `reporter` (the job's
    /// messages, metrics, stage numbers and checkpoint cuts as it goes,
    /// then how it ended); `control` says when the coordinator cancels or
    /// drains it, and how far its checkpoints have got.
    pub async fn run(
        &self,
        command: RunShards,
        attachment: &Attachment,
        reporter: RunReporter,
        control: RunControl,
    ) {
        let part = Part {
            dir: self.work_dir.join(safe_name(&command.run)),
            command,
            attachment,
            reporter: &reporter,
            progress: control.progress,
            cut_requests: Mutex::new(Some(control.cut_requests)),
        };
        let outcome = self.run_part(&part, control.stop).await;
        let run = &part.command.run;
        match &outcome {
            Ok(_) => info!(%run, "a run's part ended"),
            Err(error) => warn!(%run, %error, "a run's part failed"),
        }
        reporter
            .send(run_report::Body::Ended(ended(&outcome)))
            .await;
        if let Err(e) = std::fs::remove_dir_all(&part.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(dir = %part.dir.display(), error = %e, "could not remove a run's files");
            }
        }
    }

    /// Joins the run's session, fetches its staged files, runs its shards
    /// placed here, and tells the job what they did.
    async fn run_part(
        &self,
        part: &Part<'_>,
        stop: watch::Receiver<RunStop>,
    ) -> Result<RunSummary, JobError> {
        let command = &part.command;
        let pipeline = Pipeline::decode(command.pipeline.as_slice())
            .map_err(|e| invalid("the run's pipeline", e))?;
        let options = prost_types::Struct::decode(command.options.as_slice())
            .map_err(|e| invalid("the run's options", e))?;
        // Hosted before anything slow: the other hosts' shards open their
        // streams to these as soon as they joined themselves.
        let Joined { key, links } = self.join(command)?;
        let outcome = async {
            let staged = fetch_staged(part).await?;
            let job = Job::on_shard_host(
                command.job_id.clone(),
                command.job_name.clone(),
                pipeline,
                options,
                part.dir.clone(),
                &staged,
            );
            let (done, done_rx) = watch::channel(false);
            let forwarding = tokio::spawn(forward_messages(
                job.clone(),
                part.reporter.clone(),
                done_rx,
            ));
            tokio::spawn(pass_stops(job.clone(), stop));
            let outcome = self.run_shards_here(&job, part, links).await;
            if let Ok(summary) = &outcome {
                report_summary(&job, summary);
            }
            send_metrics(&job, part.reporter).await;
            let _ = done.send(true);
            let _ = forwarding.await;
            job.set_state(match &outcome {
                Ok(_) => JobState::Done,
                Err(e) if e.is_cancelled() => JobState::Cancelled,
                Err(_) => JobState::Failed,
            });
            outcome
        }
        .await;
        self.exchange.remove(&key);
        outcome
    }

    /// Joins `command`'s exchange session with the shards placed here.
    fn join(&self, command: &RunShards) -> Result<Joined, JobError> {
        let layout =
            ShardLayout::new(command.shards).map_err(|e| invalid("the run's shards", e))?;
        let local = command
            .local
            .iter()
            .map(|&n| {
                ShardId::of(layout, n).ok_or_else(|| {
                    invalid(
                        "the run's shards",
                        format!("shard {n} of {}", command.shards),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let routes = Routes {
            shards: command
                .routes
                .iter()
                .map(|address| channel_to_address(address))
                .collect::<Result<_, _>>()?,
            detector: channel_to_address(&self.coordinator)?,
        };
        if routes.shards.len() != layout.shards() as usize {
            let routes = format!(
                "{} routes for {} shards",
                routes.shards.len(),
                layout.shards()
            );
            return Err(invalid("the run's shards", routes).into());
        }
        let key = SessionKey::from_header(&command.session);
        let links = join_session(
            &self.exchange,
            Joining {
                key: &key,
                layout,
                local: &local,
                routes: &routes,
                window: usize::try_from(command.window).unwrap_or(usize::MAX),
                detector: false,
            },
        );
        Ok(Joined { key, links })
    }

    /// Translates the run's pipeline, starts its workers, and runs its
    /// shards placed here (on `links`) until they end.
    async fn run_shards_here(
        &self,
        job: &Arc<Job>,
        part: &Part<'_>,
        links: Vec<ShardLink>,
    ) -> Result<RunSummary, JobError> {
        let command = &part.command;
        let options = JobOptions::read(job.options()).map_err(EngineError::InvalidPlan)?;
        let translation = options.translation(
            self.fn_server.url(),
            job.id().to_string(),
            self.environment_preference.clone(),
        );
        let submitted = job.clone();
        let mut translated =
            tokio::task::spawn_blocking(move || translate(submitted.pipeline(), &translation))
                .await
                .map_err(|e| invalid("translation crashed", e))??;
        let config = EngineConfig {
            streaming: command.streaming,
            max_attempts: command.max_attempts,
            max_pending_bytes: usize::try_from(command.max_pending_bytes).unwrap_or(usize::MAX),
            strict: options.strict,
            ..self.engine_config.clone()
        };
        job.metrics()
            .set_transform_names(translated.unique_names.clone());
        let registered = register_stages(&self.fn_server, &mut translated);
        let mut started: Vec<Arc<WorkerSet>> = Vec::new();
        let prepared = Prepared {
            options: &options,
            translated: &translated,
            registered: &registered,
            config,
        };
        let outcome = self
            .start_and_run(job, part, prepared, links, &mut started)
            .await;
        let workers: Vec<_> = started.iter().flat_map(|set| set.close()).collect();
        futures::future::join_all(workers.iter().map(|w| w.stop())).await;
        for id in &registered.descriptor_ids {
            self.fn_server.forget_descriptor(id);
        }
        outcome
    }

    /// Starts the run's workers here (each set that came up goes to
    /// `started`), builds an engine per link and runs them to their end.
    async fn start_and_run(
        &self,
        job: &Arc<Job>,
        part: &Part<'_>,
        prepared: Prepared<'_>,
        links: Vec<ShardLink>,
        started: &mut Vec<Arc<WorkerSet>>,
    ) -> Result<RunSummary, JobError> {
        let Prepared {
            options,
            translated,
            registered,
            config,
        } = prepared;
        let counts = WorkerCounts::choose(
            options.worker_parallelism,
            self.default_workers,
            self.asked_workers,
        );
        let (view, _) = Insights::default().register(job.clone());
        let start = WorkerStart {
            job,
            fn_server: &self.fn_server,
            environments: &translated.environments,
            origins: &registered.origins,
            workers_per_env: counts.local,
            asked_workers: counts.pooled,
            pools: self.pools.as_ref(),
            view: &view,
            attempt: part.command.attempt,
        };
        let workers = start.start(&registered.env_ids, started).await?;
        let bundle_output_bytes = config.max_pending_bytes / config.max_bundles_per_stage.max(1);
        let layout =
            ShardLayout::new(part.command.shards).map_err(|e| invalid("the run's shards", e))?;
        let metrics = Arc::new(ShardMetrics::new(layout));
        let mut executor = HarnessExecutor::new(
            registered.stages.clone(),
            registered.mergers.clone(),
            workers,
            job.clone(),
            registered.stage_names.clone(),
            BundleRecorder::new(view.clone(), None),
        )
        .with_split_output_bytes(bundle_output_bytes)
        .with_streaming(config.streaming)
        .with_shard_metrics(metrics.clone());
        let spill = self
            .spill
            .clone()
            .map(|store| (store, config.max_pending_bytes));
        if let Some((store, bytes)) = &spill {
            executor = executor.with_output_spill(JobOutputSpill::new(
                store.clone(),
                job.id().as_bytes(),
                *bytes,
            ));
        }
        let finalizations = executor.finalizations();
        let executor: Arc<dyn refract_engine::executor::StageExecutor> = Arc::new(executor);
        let parts = ShardParts {
            plan: &translated.plan,
            executor: &executor,
            config: &config,
            job,
            spill: spill.as_ref(),
            metrics: &metrics,
        };
        let local: Vec<ShardId> = links.iter().map(ShardLink::id).collect();
        let (ends, forwarding_cuts) = checkpointing(part, &local);
        let (epoch_requests, answering) = epoch_answering(part, &local);
        let built =
            parts
                .engines(links, ends, epoch_requests)
                .and_then(|(mut engines, snapshots)| {
                    resume_part(part, &mut engines, (options, job, &view), &metrics, &local)?;
                    Ok((engines, snapshots))
                });
        let (engines, snapshots) = match built {
            Ok(built) => built,
            Err(e) => {
                answering.inspect(tokio::task::JoinHandle::abort);
                return Err(e);
            }
        };
        let (stats, stats_rx) = watch::channel(Vec::new());
        let adding = tokio::spawn(add_up_snapshots(snapshots, stats));
        let reporting = tokio::spawn(report_progress(
            job.clone(),
            part.reporter.clone(),
            stats_rx,
        ));
        let summary = run_shards(engines, job.cancel_requested()).await;
        let _ = adding.await;
        reporting.abort();
        if let Some(answering) = answering {
            answering.abort();
        }
        // The engines are gone: their last cuts are on their way.
        for forwarding in forwarding_cuts {
            let _ = forwarding.await;
        }
        if let Some((store, _)) = &spill {
            reclaim_job_spill(store.as_ref(), job.id(), Some(layout));
        }
        let unfinished = finalizations.wait(Duration::from_secs(30)).await;
        if unfinished > 0 {
            warn!(
                unfinished,
                "bundle finalizations still running when the part ended"
            );
        }
        Ok(summary?)
    }
}

/// One run's part on this host, as it runs.
struct Part<'a> {
    command: RunShards,
    attachment: &'a Attachment,
    reporter: &'a RunReporter,
    /// Where its staged files go; removed when it ends.
    dir: PathBuf,
    /// How far the job's checkpoints have got.
    progress: watch::Receiver<CheckpointProgress>,
    /// Requests to cut an epoch now, taken by the run's shard 0.
    cut_requests: Mutex<Option<mpsc::Receiver<(u64, bool)>>>,
}

/// A run's pipeline, translated and registered here, with the engine's
/// settings for it.
struct Prepared<'a> {
    options: &'a JobOptions,
    translated: &'a refract_translate::Translated,
    registered: &'a RegisteredStages,
    config: EngineConfig,
}

/// Fetches `part`'s staged files into its directory, each checked
/// against its hash.
async fn fetch_staged(part: &Part<'_>) -> Result<Vec<StagedArtifact>, JobError> {
    std::fs::create_dir_all(&part.dir).map_err(|e| invalid("the run's directory", e))?;
    let mut staged = Vec::new();
    for file in &part.command.staged {
        if file.sha256.len() != 64 || !file.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid("a staged file", format!("bad hash '{}'", file.sha256)).into());
        }
        let path = part.dir.join(&file.sha256);
        part.attachment
            .fetch(&part.command.run, &file.sha256, file.len, &path)
            .await?;
        staged.push(StagedArtifact {
            type_urn: file.type_urn.clone(),
            type_payload: file.type_payload.clone(),
            path,
            sha256: file.sha256.clone(),
            len: file.len,
        });
    }
    Ok(staged)
}

/// The checkpointing of each of `part`'s shards here (`local`), if the run
/// is checkpointed: their ends, whose cuts go to the coordinator, and the
/// tasks sending them.
fn checkpointing(
    part: &Part<'_>,
    local: &[ShardId],
) -> (
    Vec<Option<ShardCheckpointing>>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    if !part.command.checkpointed {
        return (local.iter().map(|_| None).collect(), Vec::new());
    }
    let every = Duration::from_millis(part.command.checkpoint_every_ms.max(1));
    let mut forwarding = Vec::new();
    let ends = local
        .iter()
        .map(|shard| {
            let (tx, rx) = mpsc::channel(1);
            forwarding.push(tokio::spawn(forward_cuts(
                shard.number(),
                rx,
                part.reporter.clone(),
            )));
            let end = ShardCheckpoints {
                tx,
                progress: part.progress.clone(),
            };
            Some((end, every, part.command.tolerable_checkpoint_failures))
        })
        .collect();
    (ends, forwarding)
}

/// Where shard 0's engine takes the epoch requests of savepoints, if
/// shard 0 is here (`local`) and the run is checkpointed, and the task
/// passing the coordinator's requests on.
fn epoch_answering(
    part: &Part<'_>,
    local: &[ShardId],
) -> (
    Option<mpsc::Receiver<EpochRequest>>,
    Option<tokio::task::JoinHandle<()>>,
) {
    let zero_here = local.iter().any(|shard| shard.number() == 0);
    match part.cut_requests.lock().take() {
        Some(requests) if zero_here && part.command.checkpointed => {
            let (tx, rx) = mpsc::channel(4);
            let answering = tokio::spawn(answer_cut_requests(requests, tx, part.reporter.clone()));
            (Some(rx), Some(answering))
        }
        _ => (None, None),
    }
}

/// Restores `engines` (the shards here, `local`) from the checkpoint the
/// run starts from, if any, and makes the host's part of the job's
/// metrics its own shards' only.
fn resume_part(
    part: &Part<'_>,
    engines: &mut [refract_engine::manager::Engine],
    (options, job, view): (&JobOptions, &Job, &refract_observability::insights::JobView),
    metrics: &ShardMetrics,
    local: &[ShardId],
) -> Result<(), JobError> {
    if part.command.resume.is_empty() {
        return Ok(());
    }
    let checkpoint = Checkpoint {
        id: part.command.resume_id,
        parts: part
            .command
            .resume
            .iter()
            .map(|p| (p.name.clone(), Bytes::from(p.data.clone())))
            .collect(),
    };
    let mapping = &options.transform_name_mapping;
    resume(engines, &checkpoint, mapping, job, view, Some(metrics))?;
    job.metrics().restore(&metrics.totals_of(local));
    Ok(())
}

/// Passes each request to cut an epoch on to shard 0's engine, and tells
/// the coordinator which epoch it cut.
async fn answer_cut_requests(
    mut requests: mpsc::Receiver<(u64, bool)>,
    engine: mpsc::Sender<EpochRequest>,
    reporter: RunReporter,
) {
    while let Some((request, stop)) = requests.recv().await {
        let (cut, epoch) = oneshot::channel();
        if engine.send(EpochRequest { stop, cut }).await.is_err() {
            return;
        }
        let Ok(epoch) = epoch.await else {
            return;
        };
        let answer = EpochCut {
            request,
            epoch: epoch.number(),
        };
        if !reporter.send(run_report::Body::EpochCut(answer)).await {
            return;
        }
    }
}

/// Bytes of a cut's part per piece.
const CUT_PIECE_BYTES: usize = 4 << 20;

/// Sends each cut of `shard` to the coordinator, in pieces, until its
/// engine is gone.
async fn forward_cuts(
    shard: u32,
    mut cuts: mpsc::Receiver<Vec<(String, Bytes)>>,
    reporter: RunReporter,
) {
    while let Some(cut) = cuts.recv().await {
        for (name, bytes) in cut {
            let mut pieces = bytes.chunks(CUT_PIECE_BYTES).peekable();
            if pieces.peek().is_none() {
                let piece = CutPiece {
                    shard,
                    part: name.clone(),
                    part_done: true,
                    ..CutPiece::default()
                };
                if !reporter.send(run_report::Body::Cut(piece)).await {
                    return;
                }
            }
            while let Some(data) = pieces.next() {
                let piece = CutPiece {
                    shard,
                    part: name.clone(),
                    data: data.to_vec(),
                    part_done: pieces.peek().is_none(),
                    cut_done: false,
                };
                if !reporter.send(run_report::Body::Cut(piece)).await {
                    return;
                }
            }
        }
        let done = CutPiece {
            shard,
            cut_done: true,
            ..CutPiece::default()
        };
        if !reporter.send(run_report::Body::Cut(done)).await {
            return;
        }
    }
}

/// A run this host cannot start, saying what of it and why.
fn invalid(what: &str, why: impl std::fmt::Display) -> EngineError {
    EngineError::InvalidPlan(format!("{what}: {why}"))
}

/// A run's exchange session as joined here: its key, and the links of
/// the shards placed here.
struct Joined {
    key: SessionKey,
    links: Vec<ShardLink>,
}

/// A run id as a directory name: only letters, digits, `-`, `_` and `.`.
fn safe_name(run: &str) -> String {
    run.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Raises `job`'s cancel or drain flag when the coordinator says so.
async fn pass_stops(job: Arc<Job>, mut stop: watch::Receiver<RunStop>) {
    let mut drained = false;
    loop {
        match *stop.borrow_and_update() {
            RunStop::Cancel => {
                job.request_cancel();
                return;
            }
            RunStop::Drain if !drained => {
                drained = true;
                job.request_drain();
            }
            _ => {}
        }
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Sends `job`'s committed metrics.
async fn send_metrics(job: &Job, reporter: &RunReporter) {
    let infos = encode_metrics(&job.metrics().committed_infos());
    reporter
        .send(run_report::Body::Metrics(Metrics { infos }))
        .await;
}

/// Sends the run's stage numbers whenever they change and its metrics, at
/// most every [`REPORT_EVERY`], until aborted or the snapshots end.
async fn report_progress(
    job: Arc<Job>,
    reporter: RunReporter,
    mut stats: watch::Receiver<Vec<StageStats>>,
) {
    while stats.changed().await.is_ok() {
        let numbers = stage_numbers(&stats.borrow_and_update());
        if !reporter.send(run_report::Body::Stages(numbers)).await {
            return;
        }
        send_metrics(&job, &reporter).await;
        tokio::time::sleep(REPORT_EVERY).await;
    }
}

/// Forwards `job`'s messages as they are posted, until `done` (then what
/// is left).
async fn forward_messages(job: Arc<Job>, reporter: RunReporter, mut done: watch::Receiver<bool>) {
    let mut events = job.watch_events();
    let mut next = job.history(None, 1, &|_| true).next;
    let is_message = |e: &JobEvent| matches!(e, JobEvent::Message(_));
    loop {
        let finished = *done.borrow();
        loop {
            let page = job.history(Some(next.saturating_sub(1)), 256, &is_message);
            let read = page.next;
            for (_, event) in page.entries {
                if let JobEvent::Message(message) = event {
                    let message = JobMessage {
                        importance: message.importance,
                        text: message.message_text,
                    };
                    if !reporter.send(run_report::Body::Message(message)).await {
                        return;
                    }
                }
            }
            if read == next {
                break;
            }
            next = read;
        }
        if finished {
            return;
        }
        tokio::select! {
            _ = events.changed() => {}
            _ = done.changed() => {}
        }
    }
}
