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

use refract_engine::manager::{EngineConfig, EngineError, RunSummary, StageStats};
use refract_engine::shards::ShardLayout;
use refract_exchange::connection::channel_to_address;
use refract_exchange::server::ExchangeHost;
use refract_exchange::session::SessionKey;
use refract_exchange::wire::Routes;
use refract_exchange::{join_session, Joining};
use refract_hosts::{HostDirectory, HostId, HostInfo, RunEvent, RunHandle};
use refract_jobservice::Job;
use refract_proto::hosts::{host_command, run_ended, run_report, RunShards, StagedFile, StopRun};
use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::pipeline::MonitoringInfo;
use refract_proto::prost::Message;
use tokio::sync::watch;
use tracing::{info, warn};

use super::host_reports::{decode_metrics, stage_stats, summary};
use super::sharded::{exchange_window, shard_share};
use super::JobError;

/// How long the end of a failed run waits for the other hosts' parts to
/// stop before it gives up on them.
const STOP_WAIT: Duration = Duration::from_secs(30);

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
}

/// Runs `on` to its end: the hosts' summaries added up, or the first
/// failure.
pub(super) async fn run_on_hosts(on: OnHosts<'_>) -> Result<RunSummary, JobError> {
    let job = on.job;
    let mut cancel = job.cancel_requested();
    if on.hosts.directory.hosts().is_empty() {
        job.message(
            MessageImportance::JobMessageBasic,
            "waiting for a shard host to attach (`refract shard --coordinator ADDR`)",
        );
    }
    let Some(hosts) = on.hosts.directory.hosts_when_any(&mut cancel).await else {
        return Err(EngineError::Cancelled.into());
    };
    let layout = match on.layout {
        Some(layout) => layout,
        None => ShardLayout::new(hosts.len().min(128) as u32)
            .map_err(|e| EngineError::InvalidPlan(e.to_string()))?,
    };
    let placement: Vec<&HostInfo> = (0..layout.shards() as usize)
        .map(|shard| &hosts[shard % hosts.len()])
        .collect();
    let key = SessionKey::random()?;
    let routes: Vec<String> = placement
        .iter()
        .map(|h| h.exchange_address.clone())
        .collect();
    let max_pending_bytes = shard_share(on.config.max_pending_bytes, layout.shards() as usize);
    let window = exchange_window(layout, max_pending_bytes);
    // The coordinator hosts the run's quiet detector, and no shard.
    let channels = routes
        .iter()
        .map(|address| channel_to_address(address))
        .collect::<Result<Vec<_>, _>>()?;
    let detector_routes = Routes {
        detector: channels[0].clone(),
        shards: channels,
    };
    let _links = join_session(
        &on.hosts.exchange,
        Joining {
            key: &key,
            layout,
            local: &[],
            routes: &detector_routes,
            window,
            detector: true,
        },
    );
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
    let mut parts: BTreeMap<HostId, (String, Vec<u32>)> = BTreeMap::new();
    for (shard, host) in placement.iter().enumerate() {
        parts
            .entry(host.id)
            .or_insert_with(|| (host.name.clone(), Vec::new()))
            .1
            .push(shard as u32);
    }
    let base = RunShards {
        run: run.clone(),
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
        shards: layout.shards(),
        local: Vec::new(),
        routes,
        session: key.as_str().to_string(),
        window: window as u64,
        streaming: on.config.streaming,
        max_attempts: on.config.max_attempts,
        max_pending_bytes: max_pending_bytes as u64,
    };
    let placed: Vec<String> = parts
        .values()
        .map(|(name, shards)| format!("{name} ({})", join_numbers(shards)))
        .collect();
    job.message(
        MessageImportance::JobMessageBasic,
        format!(
            "running on {} engine shards on {} shard host(s): {}",
            layout.shards(),
            parts.len(),
            placed.join(", ")
        ),
    );
    info!(run = %run, shards = layout.shards(), hosts = parts.len(), "a run placed on shard hosts");
    let mut following = Following::new(job, on.stats, parts.keys().copied());
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
    let outcome = following.follow(handle, cancel).await;
    on.hosts.exchange.remove(&key);
    outcome
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
}

impl<'a> Following<'a> {
    fn new(
        job: &'a Arc<Job>,
        stats: watch::Sender<Vec<StageStats>>,
        hosts: impl Iterator<Item = HostId>,
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
            tokio::select! {
                event = handle.events.recv() => match event {
                    Some(event) => self.take(event),
                    None => break,
                },
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

    /// Takes one event of the run in.
    fn take(&mut self, event: RunEvent) {
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
