//! A run of a job on shard hosts, from the coordinator's side: place each
//! of the run's shards on an attached host, tell every host its part (the
//! pipeline, its options, its staged files, its shards and where all the
//! others live), host the run's quiet detector, and follow what the hosts
//! report until each part ended. The coordinator carries no element: the
//! hosts' shards exchange with each other directly.
//!
//! A run ends well when every host's part did. The first part that fails,
//! or a host that is lost, ends the run with that failure, after the
//! other hosts were told to stop; cancelling or draining the job is
//! passed on to every host.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use refract_engine::key_groups::KEY_GROUPS;
use refract_engine::manager::{
    collect_epochs, CheckpointProgress, EngineConfig, EngineError, EpochRequest, RunSummary,
    SavepointRequest, ShardCheckpoints, StageStats,
};
use refract_engine::shards::Epoch;
use refract_engine::shards::ShardLayout;
use refract_exchange::connection::channel_to_address;
use refract_exchange::server::ExchangeHost;
use refract_exchange::session::SessionKey;
use refract_exchange::wire::Routes;
use refract_exchange::{join_session, Joining};
use refract_hosts::{HostDirectory, HostId, HostInfo, RunEvent, RunHandle};
use refract_jobservice::{Job, StagedArtifact};
use refract_proto::hosts::{
    host_command, run_ended, run_report, CheckpointPart, CutPiece, RunShards, StagedFile, StopRun,
};
use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::pipeline::MonitoringInfo;
use refract_proto::prost::Message;
use refract_store::Checkpoint;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{info, warn};

use super::host_reports::{decode_metrics, stage_stats, summary};
use super::rescale::HostPlacement;
use super::shard_savepoints::{answer_savepoints, pass_epochs, refuse_savepoints, StopAnswer};
use super::sharded::{exchange_window, shard_share, ShardedCheckpoints};
use super::JobError;

/// How long the end of a failed run waits for the other hosts' parts to
/// stop before it gives up on them.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// How long the attached hosts must stay as they are before a run follows
/// the ones that joined.
const JOIN_SETTLE: Duration = Duration::from_secs(1);

/// How long the end of a run stopped by a savepoint waits for its answer.
const STOP_ANSWER_WAIT: Duration = Duration::from_secs(10);

/// Runs on this coordinator, numbered.
static RUNS: AtomicU64 = AtomicU64::new(0);

/// The coordinator's access to its shard hosts: where they are, and the
/// exchange server hosting each run's quiet detector.
#[derive(Debug, Clone)]
pub struct ShardHostsAccess {
    /// The attached hosts and open runs.
    pub directory: Arc<HostDirectory>,
    /// The exchange sessions of the coordinator's listener.
    pub exchange: ExchangeHost,
}

/// What one run on the hosts needs.
pub(super) struct OnHosts<'a> {
    pub(super) hosts: &'a ShardHostsAccess,
    pub(super) job: &'a Arc<Job>,
    /// The shards the job asked for; without, one per attached host.
    pub(super) layout: Option<ShardLayout>,
    pub(super) config: &'a EngineConfig,
    /// Where the job's stage snapshots go.
    pub(super) stats: watch::Sender<Vec<StageStats>>,
    /// Which attempt of the job this is.
    pub(super) attempt: u32,
    /// How the job's checkpoints are written, if it is checkpointed:
    /// each epoch is put together from the hosts' cuts of it.
    pub(super) checkpoints: Option<ShardedCheckpoints>,
    /// The checkpoint to start from, if any.
    pub(super) resume_from: Option<&'a Checkpoint>,
    /// Savepoint requests (`refract savepoint`, a rescale, an update),
    /// each answered with an epoch shard 0 cuts for it, or refused when
    /// the job is not checkpointed.
    pub(super) savepoints: mpsc::Receiver<SavepointRequest>,
    /// Where the run says how many shards it placed, and asks to follow
    /// hosts that join (when the job left its number to the hosts).
    pub(super) placement: Option<HostPlacement>,
}

/// Runs `on` to its end: the hosts' summaries added up, or the first
/// failure.
pub(super) async fn run_on_hosts(on: OnHosts<'_>) -> Result<RunSummary, JobError> {
    let job = on.job;
    let mut cancel = job.cancel_requested();
    let Some(hosts) = hosts_to_place(&on, &mut cancel).await else {
        return Err(EngineError::Cancelled.into());
    };
    let layout = match on.layout {
        Some(layout) => layout,
        None => one_per_host(hosts.len())?,
    };
    let placement: Vec<&HostInfo> = (0..layout.shards() as usize)
        .map(|shard| &hosts[shard % hosts.len()])
        .collect();
    let routes: Vec<String> = placement
        .iter()
        .map(|h| h.exchange_address.clone())
        .collect();
    let max_pending_bytes = shard_share(on.config.max_pending_bytes, layout.shards() as usize);
    let window = exchange_window(layout, max_pending_bytes);
    let key = host_detector(&on.hosts.exchange, layout, &routes, window)?;
    let run = format!("{}-r{}", job.id(), RUNS.fetch_add(1, Ordering::Relaxed));
    let staged = job.artifacts().staged();
    let handle = on.hosts.directory.open_run(
        &run,
        &placement.iter().map(|h| h.id).collect::<Vec<_>>(),
        staged
            .iter()
            .map(|a| (a.sha256.clone(), a.path.clone()))
            .collect(),
    );
    let parts = parts_by_host(&placement);
    let base = RunShards {
        run: run.clone(),
        shards: layout.shards(),
        routes,
        session: key.as_str().to_string(),
        window: window as u64,
        max_pending_bytes: max_pending_bytes as u64,
        ..run_command(&on, &staged)
    };
    let placed: Vec<String> = parts
        .values()
        .map(|(name, shards)| format!("{name} ({})", join_numbers(shards)))
        .collect();
    job.message(
        MessageImportance::JobMessageBasic,
        format!(
            "running on {} on {}: {}",
            counted(layout.shards() as usize, "engine shard"),
            counted(parts.len(), "shard host"),
            placed.join(", ")
        ),
    );
    info!(run = %run, shards = layout.shards(), hosts = parts.len(), "a run placed on shard hosts");
    // A job that left its number of shards to the hosts, and can move
    // (it is checkpointed), follows hosts that join.
    let follows_joins = on.layout.is_none() && on.checkpoints.is_some();
    let collecting = Collecting::start(on.checkpoints, layout, on.savepoints);
    let (epochs, tasks) = match collecting {
        Some(c) => (
            Some((c.epochs, c.epoch_requests)),
            Some((c.collector, c.passing, c.writer, c.savepointing, c.stopping)),
        ),
        None => (None, None),
    };
    let placed_shards = placement.iter().map(|h| h.id).collect();
    let epochs = epochs.map(|(mut epochs, requests)| {
        epochs.requests = Some(requests);
        epochs
    });
    let mut following = Following::new(job, on.stats, parts.keys().copied(), placed_shards, epochs);
    if on.resume_from.is_some() {
        // The hosts restore the checkpoint's metrics with its state, each
        // its own shards' part.
        following.base_metrics.clear();
    }
    for (host, (_, shards)) in &parts {
        let command = RunShards {
            local: shards.clone(),
            ..base.clone()
        };
        if let Err(e) = handle.send(*host, host_command::Body::Run(command)).await {
            following.fail(JobError::HostLost(e.to_string()));
            following.pending.remove(host);
        }
    }
    let joins = match &on.placement {
        Some(placement) => {
            placement.placed(layout.shards());
            follows_joins.then(|| {
                tokio::spawn(follow_joining_hosts(
                    on.hosts.directory.clone(),
                    layout.shards(),
                    placement.clone(),
                ))
            })
        }
        None => None,
    };
    let outcome = following.follow(handle, cancel).await;
    if let Some(joins) = joins {
        joins.abort();
    }
    on.hosts.exchange.remove(&key);
    if let Some(tasks) = tasks {
        finish_collecting(tasks).await;
    }
    outcome
}

/// Ends a run's epoch collection once every cut's way to the collector
/// is closed: the collector hands the writer what it has and ends, then
/// the writer; a savepoint that stopped the run is answered first.
async fn finish_collecting(
    (collector, passing, writer, mut savepointing, stopping): (
        tokio::task::JoinHandle<()>,
        tokio::task::JoinHandle<()>,
        tokio::task::JoinHandle<()>,
        tokio::task::JoinHandle<()>,
        StopAnswer,
    ),
) {
    let _ = collector.await;
    let _ = passing.await;
    let _ = writer.await;
    // The savepoint's epoch is assembled now: its answer carries the cut
    // a rescale moves with.
    if stopping.asked() {
        let _ = tokio::time::timeout(STOP_ANSWER_WAIT, &mut savepointing).await;
    }
    savepointing.abort();
}

/// The hosts to place `on`'s run over, once one is attached (saying so
/// while none is); `None` if the job is cancelled first.
async fn hosts_to_place(
    on: &OnHosts<'_>,
    cancel: &mut watch::Receiver<bool>,
) -> Option<Vec<HostInfo>> {
    let directory = &on.hosts.directory;
    let waited = directory.hosts().is_empty();
    if waited {
        on.job.message(
            MessageImportance::JobMessageBasic,
            "waiting for a shard host to attach (`refract shard --coordinator ADDR`)",
        );
    }
    let hosts = directory.hosts_when_any(cancel).await?;
    if !(waited && on.layout.is_none()) {
        return Some(hosts);
    }
    // Hosts attach together (after a coordinator's restart): a run of one
    // shard per host waits for the rest of them, rather than moving onto
    // them right after it starts.
    tokio::time::sleep(JOIN_SETTLE).await;
    let now = directory.hosts();
    Some(if now.is_empty() { hosts } else { now })
}

/// The layout of one shard per attached host (up to one key group each).
fn one_per_host(hosts: usize) -> Result<ShardLayout, JobError> {
    let shards = u32::try_from(hosts).unwrap_or(u32::MAX).min(KEY_GROUPS);
    ShardLayout::new(shards).map_err(|e| EngineError::InvalidPlan(e.to_string()).into())
}

/// Waits until more hosts are attached than the run's `placed` shards
/// (the attached set left to settle for [`JOIN_SETTLE`] first and after
/// each change, so hosts attaching together, as after a coordinator's
/// restart, move the job once), then asks the job to move onto one shard
/// per host.
async fn follow_joining_hosts(
    directory: Arc<HostDirectory>,
    placed: u32,
    placement: HostPlacement,
) {
    let mut changes = directory.changes();
    tokio::time::sleep(JOIN_SETTLE).await;
    loop {
        let attached = directory.hosts().len();
        if attached > placed as usize {
            match one_per_host(attached) {
                Ok(layout) if layout.shards() > placed => {
                    info!(
                        placed,
                        attached, "shard hosts joined: moving the job onto one shard per host"
                    );
                    placement.follow(layout.shards()).await;
                    return;
                }
                // As many shards as key groups already.
                _ => return,
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(JOIN_SETTLE).await;
    }
}

/// Where the hosts' cuts of each checkpoint epoch go: each shard's end of
/// the collector, the cut each shard is sending, and how far the writing
/// has got.
struct Epochs {
    /// Savepoints' requests for an epoch, until the savepoints end.
    requests: Option<mpsc::Receiver<EpochRequest>>,
    /// Requests sent to shard 0's host, by number, waiting for its cut.
    asked: HashMap<u64, oneshot::Sender<Epoch>>,
    next_request: u64,
    ends: Vec<mpsc::Sender<Vec<(String, Bytes)>>>,
    cutting: HashMap<u32, Cutting>,
    /// How far the writing has got, until the collector ends.
    progress: Option<watch::Receiver<CheckpointProgress>>,
}

/// A cut on its way from a host: the parts in, and the part coming.
#[derive(Default)]
struct Cutting {
    parts: Vec<(String, Bytes)>,
    part: Vec<u8>,
}

impl Epochs {
    fn new(ends: Vec<ShardCheckpoints>) -> Self {
        let progress = ends.first().map(|end| end.progress.clone());
        Epochs {
            requests: None,
            asked: HashMap::new(),
            next_request: 0,
            ends: ends.into_iter().map(|end| end.tx).collect(),
            cutting: HashMap::new(),
            progress,
        }
    }

    /// Takes a piece of `shard`'s cut in; a whole cut goes to the
    /// collector (waiting while it is behind).
    async fn take(&mut self, piece: CutPiece) {
        let cutting = self.cutting.entry(piece.shard).or_default();
        cutting.part.extend_from_slice(&piece.data);
        if piece.part_done {
            let part = Bytes::from(std::mem::take(&mut cutting.part));
            cutting.parts.push((piece.part, part));
        }
        if piece.cut_done {
            let cut = std::mem::take(&mut cutting.parts);
            if let Some(end) = self.ends.get(piece.shard as usize) {
                let _ = end.send(cut).await;
            }
        }
    }
}

/// Joins the run's exchange session on the coordinator, which hosts its
/// quiet detector and no shard; the session's key.
fn host_detector(
    exchange: &ExchangeHost,
    layout: ShardLayout,
    routes: &[String],
    window: usize,
) -> Result<SessionKey, JobError> {
    let key = SessionKey::random()?;
    let channels = routes
        .iter()
        .map(|address| channel_to_address(address))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(first) = channels.first().cloned() else {
        return Err(EngineError::InvalidPlan("a run of no shard".into()).into());
    };
    let routes = Routes {
        detector: first,
        shards: channels,
    };
    let _links = join_session(
        exchange,
        Joining {
            key: &key,
            layout,
            local: &[],
            routes: &routes,
            window,
            detector: true,
        },
    );
    Ok(key)
}

/// Each host of `placement` (shard `i` on `placement[i]`) with its name
/// and the shards placed on it.
fn parts_by_host(placement: &[&HostInfo]) -> BTreeMap<HostId, (String, Vec<u32>)> {
    let mut parts: BTreeMap<HostId, (String, Vec<u32>)> = BTreeMap::new();
    for (shard, host) in placement.iter().enumerate() {
        parts
            .entry(host.id)
            .or_insert_with(|| (host.name.clone(), Vec::new()))
            .1
            .push(shard as u32);
    }
    parts
}

/// What every host's command of a run of `on` says about the job: the
/// pipeline, its options and staged files, the engine's settings, the
/// checkpointing and the checkpoint to start from.
fn run_command(on: &OnHosts<'_>, staged: &[StagedArtifact]) -> RunShards {
    let job = on.job;
    let checkpointing = on.checkpoints.as_ref().map(|c| {
        (
            u64::try_from(c.every.as_millis()).unwrap_or(u64::MAX),
            c.tolerable_failures,
        )
    });
    RunShards {
        job_id: job.id().to_string(),
        job_name: job.name().to_string(),
        attempt: on.attempt,
        pipeline: job.pipeline().encode_to_vec(),
        options: job.options().encode_to_vec(),
        staged: staged
            .iter()
            .map(|a| StagedFile {
                type_urn: a.type_urn.clone(),
                type_payload: a.type_payload.clone(),
                sha256: a.sha256.clone(),
                len: a.len,
            })
            .collect(),
        streaming: on.config.streaming,
        max_attempts: on.config.max_attempts,
        checkpointed: checkpointing.is_some(),
        checkpoint_every_ms: checkpointing.map_or(0, |(every, _)| every),
        tolerable_checkpoint_failures: checkpointing.map_or(0, |(_, n)| n),
        resume_id: on.resume_from.map_or(0, |c| c.id),
        resume: on
            .resume_from
            .map(|c| {
                c.parts
                    .iter()
                    .map(|(name, data)| CheckpointPart {
                        name: name.clone(),
                        data: data.to_vec(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        ..RunShards::default()
    }
}

/// A checkpointed run's epoch collection, started: where the hosts'
/// cuts go, where savepoints ask shard 0 for an epoch, and the tasks
/// (collector, passing on to the writer, writer, answering savepoints).
struct Collecting {
    epochs: Epochs,
    epoch_requests: mpsc::Receiver<EpochRequest>,
    collector: tokio::task::JoinHandle<()>,
    passing: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
    savepointing: tokio::task::JoinHandle<()>,
    stopping: StopAnswer,
}

impl Collecting {
    /// Starts collecting the epochs of a run on `layout`, if it is
    /// checkpointed; else refuses its savepoints.
    fn start(
        checkpoints: Option<ShardedCheckpoints>,
        layout: ShardLayout,
        savepoints: mpsc::Receiver<SavepointRequest>,
    ) -> Option<Collecting> {
        let Some(checkpoints) = checkpoints else {
            tokio::spawn(refuse_savepoints(savepoints));
            return None;
        };
        let (to_writer, assembled, passing) = pass_epochs(checkpoints.writer.tx);
        let (ends, collector) = collect_epochs(
            layout.shards(),
            Vec::new(),
            to_writer,
            Some(checkpoints.writer.progress),
        );
        let (epoch_tx, epoch_requests) = mpsc::channel(4);
        let stopping = StopAnswer::default();
        Some(Collecting {
            epochs: Epochs::new(ends),
            epoch_requests,
            collector: tokio::spawn(collector),
            passing,
            writer: checkpoints.writer.task,
            savepointing: tokio::spawn(answer_savepoints(
                savepoints,
                epoch_tx,
                assembled,
                stopping.clone(),
            )),
            stopping,
        })
    }
}

/// `1 thing`, `2 things`.
fn counted(n: usize, thing: &str) -> String {
    match n {
        1 => format!("1 {thing}"),
        n => format!("{n} {thing}s"),
    }
}

/// `1, 3, 5`.
fn join_numbers(numbers: &[u32]) -> String {
    numbers
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the coordinator knows of a run as its hosts report.
struct Following<'a> {
    job: &'a Arc<Job>,
    stats: watch::Sender<Vec<StageStats>>,
    /// Hosts whose part has not ended.
    pending: HashSet<HostId>,
    /// Each host's latest stage snapshot.
    snapshots: HashMap<HostId, Vec<StageStats>>,
    /// The job's metrics when the run started (a resumed job's, say), and
    /// each host's committed totals since.
    base_metrics: Vec<MonitoringInfo>,
    metrics: HashMap<HostId, Vec<MonitoringInfo>>,
    summary: RunSummary,
    failure: Option<JobError>,
    stopping: bool,
    /// The host each shard was placed on.
    placement: Vec<HostId>,
    /// Where checkpoint cuts go, if the run is checkpointed.
    epochs: Option<Epochs>,
}

impl<'a> Following<'a> {
    fn new(
        job: &'a Arc<Job>,
        stats: watch::Sender<Vec<StageStats>>,
        hosts: impl Iterator<Item = HostId>,
        placement: Vec<HostId>,
        epochs: Option<Epochs>,
    ) -> Self {
        Following {
            job,
            stats,
            pending: hosts.collect(),
            snapshots: HashMap::new(),
            base_metrics: job.metrics().committed_infos(),
            metrics: HashMap::new(),
            summary: RunSummary::default(),
            failure: None,
            stopping: false,
            placement,
            epochs,
        }
    }

    /// Keeps the first failure.
    fn fail(&mut self, error: JobError) {
        if self.failure.is_none() {
            self.failure = Some(error);
        }
    }

    /// Follows the run until every host's part ended (or, once stopping,
    /// until [`STOP_WAIT`] passed).
    async fn follow(
        mut self,
        mut handle: RunHandle,
        mut cancel: watch::Receiver<bool>,
    ) -> Result<RunSummary, JobError> {
        let mut drain = self.job.drain_requested();
        let (mut cancel_told, mut drain_told) = (false, false);
        let mut deadline: Option<tokio::time::Instant> = None;
        if self.failure.is_some() {
            self.stop_all(&handle, false).await;
            deadline = Some(tokio::time::Instant::now() + STOP_WAIT);
        }
        while !self.pending.is_empty() {
            let give_up = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let mut progress = self.epochs.as_ref().and_then(|e| e.progress.clone());
            let progressed = async {
                match &mut progress {
                    Some(progress) => progress.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let mut requests = self.epochs.as_mut().and_then(|e| e.requests.take());
            let requested = async {
                match &mut requests {
                    Some(requests) => requests.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                event = handle.events.recv() => match event {
                    Some(event) => self.take(event).await,
                    None => break,
                },
                request = requested => match request {
                    Some(request) => self.ask_shard_zero(&handle, request).await,
                    // The savepoints ended: no more requests.
                    None => requests = None,
                },
                going = progressed => {
                    if going {
                        self.pass_progress(&handle).await;
                    } else if let Some(epochs) = &mut self.epochs {
                        // The collector is done: nothing will progress.
                        epochs.progress = None;
                    }
                }
                _ = async { let _ = cancel.wait_for(|c| *c).await; }, if !cancel_told => {
                    cancel_told = true;
                    self.fail(EngineError::Cancelled.into());
                }
                _ = async { let _ = drain.wait_for(|d| *d).await; }, if !drain_told => {
                    drain_told = true;
                    self.stop_all(&handle, true).await;
                }
                _ = give_up => {
                    warn!(hosts = self.pending.len(), "shard hosts did not stop their parts within 30 s");
                    break;
                }
            }
            if let Some(epochs) = &mut self.epochs {
                epochs.requests = requests;
            }
            if self.failure.is_some() && !self.stopping {
                self.stop_all(&handle, false).await;
                deadline = Some(tokio::time::Instant::now() + STOP_WAIT);
            }
        }
        match self.failure {
            Some(error) => Err(error),
            None => Ok(self.summary),
        }
    }

    /// Tells every host whose part has not ended to stop it (drain: let
    /// it finish as a drained job does).
    async fn stop_all(&mut self, handle: &RunHandle, drain: bool) {
        if !drain {
            self.stopping = true;
        }
        for host in self.pending.clone() {
            let stop = StopRun {
                run: handle.run().to_string(),
                drain,
            };
            if handle
                .send(host, host_command::Body::Stop(stop))
                .await
                .is_err()
            {
                self.pending.remove(&host);
            }
        }
    }

    /// Asks shard 0's host to cut the epoch `request` wants.
    async fn ask_shard_zero(&mut self, handle: &RunHandle, request: EpochRequest) {
        let (Some(epochs), Some(&host)) = (&mut self.epochs, self.placement.first()) else {
            return;
        };
        epochs.next_request += 1;
        let number = epochs.next_request;
        let cut = refract_proto::hosts::CutEpoch {
            run: handle.run().to_string(),
            request: number,
            stop: request.stop,
        };
        // A request the host does not get is dropped: its requester hears
        // that the engines ended before it.
        if handle
            .send(host, host_command::Body::CutEpoch(cut))
            .await
            .is_ok()
        {
            epochs.asked.insert(number, request.cut);
        }
    }

    /// Tells every host whose part runs how far the checkpoints got.
    async fn pass_progress(&mut self, handle: &RunHandle) {
        let Some(progress) = self.epochs.as_mut().and_then(|e| e.progress.as_mut()) else {
            return;
        };
        let now = *progress.borrow_and_update();
        for host in self.pending.clone() {
            let progress = refract_proto::hosts::CheckpointProgress {
                run: handle.run().to_string(),
                durable: now.durable,
                finished: now.finished,
            };
            let _ = handle
                .send(host, host_command::Body::Progress(progress))
                .await;
        }
    }

    /// Takes one event of the run in.
    async fn take(&mut self, event: RunEvent) {
        match event {
            RunEvent::HostLost(host) => {
                if self.pending.remove(&host) {
                    self.fail(JobError::HostLost(format!(
                        "shard host {host} was lost while it ran shards of the job (its process \
                         ended, or nothing answered its connection's pings for 10 s)"
                    )));
                }
            }
            RunEvent::Report { host, body } => match body {
                run_report::Body::Message(message) => {
                    let importance = MessageImportance::try_from(message.importance)
                        .unwrap_or(MessageImportance::JobMessageBasic);
                    self.job.message(importance, message.text);
                }
                run_report::Body::Metrics(metrics) => {
                    self.metrics.insert(host, decode_metrics(&metrics.infos));
                    let totals = self.job.metrics();
                    totals.restore(&self.base_metrics);
                    for infos in self.metrics.values() {
                        totals.commit(infos);
                    }
                }
                run_report::Body::Stages(numbers) => {
                    self.snapshots.insert(host, stage_stats(&numbers));
                    let parts: Vec<Vec<StageStats>> = self.snapshots.values().cloned().collect();
                    self.stats.send_replace(StageStats::across_shards(&parts));
                }
                run_report::Body::Cut(piece) => {
                    let placed = self.placement.get(piece.shard as usize) == Some(&host);
                    match &mut self.epochs {
                        Some(epochs) if placed => epochs.take(piece).await,
                        _ => {
                            warn!(%host, shard = piece.shard, "a cut of a shard not placed on its host, or of a run without checkpoints; dropped")
                        }
                    }
                }
                run_report::Body::EpochCut(cut) => {
                    let answered = self.placement.first() == Some(&host);
                    if let (Some(epochs), true) = (&mut self.epochs, answered) {
                        if let Some(asked) = epochs.asked.remove(&cut.request) {
                            let _ = asked.send(Epoch::from_number(cut.epoch));
                        }
                    }
                }
                run_report::Body::Ended(ended) => {
                    if !self.pending.remove(&host) {
                        return;
                    }
                    match ended.outcome {
                        Some(run_ended::Outcome::Done(done)) => {
                            add_summary(&mut self.summary, summary(&done));
                        }
                        Some(run_ended::Outcome::Failed(failed)) if failed.cancelled => {
                            self.fail(EngineError::Cancelled.into());
                        }
                        Some(run_ended::Outcome::Failed(failed)) => self.fail(JobError::OnHost {
                            text: failed.text,
                            may_pass: failed.may_pass,
                        }),
                        None => self.fail(JobError::OnHost {
                            text: format!("shard host {host} ended its part without an outcome"),
                            may_pass: true,
                        }),
                    }
                }
            },
        }
    }
}

/// Adds one host's summary to the run's.
fn add_summary(run: &mut RunSummary, host: RunSummary) {
    run.bundles += host.bundles;
    run.dropped_late += host.dropped_late;
    run.dropped_late_by_stage.extend(host.dropped_late_by_stage);
    run.spilled_bytes += host.spilled_bytes;
    run.output_spilled_bytes += host.output_spilled_bytes;
    run.queue_spilled_bytes += host.queue_spilled_bytes;
    run.state_spilled_bytes += host.state_spilled_bytes;
    run.handed_out_keys += host.handed_out_keys;
}
