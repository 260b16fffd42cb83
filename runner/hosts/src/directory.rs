//! The coordinator's directory of shard hosts and of the runs placed on
//! them: who is attached and where its exchange listens, which runs are
//! open, where each run's reports go and which staged files it may fetch.
//! A host that detaches is forgotten at once, and every open run it has a
//! part in hears that it was lost.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use refract_proto::hosts::{host_command, run_report, HostCommand, RunReport};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info};

use crate::error::HostsError;
use crate::secret::ClusterSecret;

/// Commands waiting for one host's stream; a host that does not read them
/// holds back whoever sends the next.
const COMMANDS_IN_FLIGHT: usize = 16;

/// Reports of one run waiting for the coordinator's run loop; a full
/// queue holds back the hosts' streams (HTTP/2 flow control does the rest).
const EVENTS_IN_FLIGHT: usize = 1024;

/// An attached host's number on this coordinator, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostId(u64);

impl HostId {
    /// The number, for logs and the wire.
    pub fn number(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for HostId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What the coordinator knows of an attached host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInfo {
    /// Its number here.
    pub id: HostId,
    /// The name it gave.
    pub name: String,
    /// `host:port` where other shards reach its exchange server.
    pub exchange_address: String,
}

/// What a run's loop hears.
#[derive(Debug)]
pub enum RunEvent {
    /// A host reported on its part of the run.
    Report {
        /// The host.
        host: HostId,
        /// What it said.
        body: run_report::Body,
    },
    /// A host with a part in the run is gone (its stream broke or ended).
    HostLost(HostId),
}

struct Attached {
    info: HostInfo,
    commands: mpsc::Sender<HostCommand>,
}

struct OpenRun {
    hosts: Vec<HostId>,
    events: mpsc::Sender<RunEvent>,
    /// Staged files by content hash.
    staged: HashMap<String, PathBuf>,
}

#[derive(Default)]
struct Inner {
    hosts: BTreeMap<HostId, Attached>,
    runs: HashMap<String, OpenRun>,
    next_host: u64,
}

/// The attached hosts and open runs of one coordinator.
pub struct HostDirectory {
    secret: ClusterSecret,
    inner: Mutex<Inner>,
    /// Bumped whenever a host attaches or detaches.
    changed: watch::Sender<u64>,
}

impl std::fmt::Debug for HostDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.lock();
        f.debug_struct("HostDirectory")
            .field("hosts", &inner.hosts.len())
            .field("runs", &inner.runs.len())
            .finish()
    }
}

impl HostDirectory {
    /// An empty directory whose hosts must know `secret`.
    pub fn new(secret: ClusterSecret) -> Arc<Self> {
        Arc::new(HostDirectory {
            secret,
            inner: Mutex::new(Inner::default()),
            changed: watch::channel(0).0,
        })
    }

    /// The secret hosts prove.
    pub fn secret(&self) -> &ClusterSecret {
        &self.secret
    }

    /// The attached hosts, in the order they attached.
    pub fn hosts(&self) -> Vec<HostInfo> {
        self.inner
            .lock()
            .hosts
            .values()
            .map(|h| h.info.clone())
            .collect()
    }

    /// A receiver that sees every attach and detach from now on, for runs
    /// that follow the hosts as they come and go.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The attached hosts once there is at least one; `None` if `cancel`
    /// turns true first.
    pub async fn hosts_when_any(
        &self,
        cancel: &mut watch::Receiver<bool>,
    ) -> Option<Vec<HostInfo>> {
        let mut changed = self.changed.subscribe();
        loop {
            let hosts = self.hosts();
            if !hosts.is_empty() {
                return Some(hosts);
            }
            tokio::select! {
                moved = changed.changed() => {
                    if moved.is_err() {
                        return None;
                    }
                }
                _ = cancel.wait_for(|c| *c) => return None,
            }
        }
    }

    /// Takes in a host that proved the secret: its number, and the
    /// commands for it.
    pub(crate) fn attach(
        &self,
        name: String,
        exchange_address: String,
    ) -> (HostId, mpsc::Receiver<HostCommand>) {
        let (tx, rx) = mpsc::channel(COMMANDS_IN_FLIGHT);
        let id = {
            let mut inner = self.inner.lock();
            inner.next_host += 1;
            let id = HostId(inner.next_host);
            let info = HostInfo {
                id,
                name,
                exchange_address,
            };
            info!(host = %id, name = %info.name, exchange = %info.exchange_address, "a shard host attached");
            inner.hosts.insert(id, Attached { info, commands: tx });
            id
        };
        self.changed.send_modify(|n| *n += 1);
        (id, rx)
    }

    /// Forgets `host`; every open run it has a part in hears it was lost.
    pub(crate) fn detach(&self, host: HostId) {
        let told: Vec<mpsc::Sender<RunEvent>> = {
            let mut inner = self.inner.lock();
            if inner.hosts.remove(&host).is_none() {
                return;
            }
            inner
                .runs
                .values()
                .filter(|run| run.hosts.contains(&host))
                .map(|run| run.events.clone())
                .collect()
        };
        info!(%host, "a shard host detached");
        self.changed.send_modify(|n| *n += 1);
        for events in told {
            if let Err(mpsc::error::TrySendError::Full(event)) =
                events.try_send(RunEvent::HostLost(host))
            {
                tokio::spawn(async move {
                    let _ = events.send(event).await;
                });
            }
        }
    }

    /// Opens run `run` on `hosts`, which may fetch the files in `staged`
    /// (by content hash); the run closes when the handle is dropped.
    pub fn open_run(
        self: &Arc<Self>,
        run: &str,
        hosts: &[HostId],
        staged: HashMap<String, PathBuf>,
    ) -> RunHandle {
        let (tx, rx) = mpsc::channel(EVENTS_IN_FLIGHT);
        let lost: Vec<HostId> = {
            let mut inner = self.inner.lock();
            inner.runs.insert(
                run.to_string(),
                OpenRun {
                    hosts: hosts.to_vec(),
                    events: tx.clone(),
                    staged,
                },
            );
            hosts
                .iter()
                .copied()
                .filter(|h| !inner.hosts.contains_key(h))
                .collect()
        };
        // A host that left before the run opened is lost to it too.
        for host in lost {
            let _ = tx.try_send(RunEvent::HostLost(host));
        }
        RunHandle {
            directory: self.clone(),
            run: run.to_string(),
            events: rx,
        }
    }

    /// Passes `host`'s report to its run, waiting while the run's queue is
    /// full; a report of a run that is not open, or that `host` has no
    /// part in, is dropped.
    pub(crate) async fn report(&self, host: HostId, report: RunReport) {
        let Some(body) = report.body else {
            return;
        };
        let events = {
            let inner = self.inner.lock();
            match inner.runs.get(&report.run) {
                Some(run) if run.hosts.contains(&host) => run.events.clone(),
                _ => {
                    debug!(%host, run = %report.run, "a report of no open run of the host's");
                    return;
                }
            }
        };
        let _ = events.send(RunEvent::Report { host, body }).await;
    }

    /// Where the staged file `sha256` of open run `run` is.
    pub(crate) fn staged_file(&self, run: &str, sha256: &str) -> Option<PathBuf> {
        self.inner
            .lock()
            .runs
            .get(run)
            .and_then(|r| r.staged.get(sha256).cloned())
    }

    fn commands_for(&self, host: HostId) -> Option<mpsc::Sender<HostCommand>> {
        self.inner
            .lock()
            .hosts
            .get(&host)
            .map(|h| h.commands.clone())
    }

    fn close_run(&self, run: &str) {
        self.inner.lock().runs.remove(run);
    }
}

/// An open run: its events, and the way to command its hosts. Dropping
/// it closes the run.
#[derive(Debug)]
pub struct RunHandle {
    directory: Arc<HostDirectory>,
    run: String,
    /// What the run's hosts report, and which of them were lost.
    pub events: mpsc::Receiver<RunEvent>,
}

impl RunHandle {
    /// The run's id.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// Sends `body` to `host`, waiting while its commands queue is full.
    pub async fn send(&self, host: HostId, body: host_command::Body) -> Result<(), HostsError> {
        let commands = self
            .directory
            .commands_for(host)
            .ok_or(HostsError::HostGone(host.number()))?;
        commands
            .send(HostCommand { body: Some(body) })
            .await
            .map_err(|_| HostsError::HostGone(host.number()))
    }
}

impl Drop for RunHandle {
    fn drop(&mut self) {
        self.directory.close_run(&self.run);
    }
}
