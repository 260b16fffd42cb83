//! The pools known now: for each spec, the pools it stands for, their
//! health and how many of this server's workers run on each; and the one
//! decision made from that — which pool starts the next worker.
//!
//! A pool that fails to start a worker is *quarantined*: skipped for a
//! while that doubles with each failure in a row (1 s up to a minute),
//! then tried again by the next worker that needs one; a success makes it
//! live again. Pools come and go as their spec's source says (DNS, the
//! Ray cluster, `refract pools add|remove`); workers on a pool that went
//! away are stopped, so their jobs replace them on the pools left.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use refract_sdk_harness::{BeamSdk, Worker};
use tokio::sync::{watch, Notify};

use super::spec::PoolSpec;

/// The first quarantine of a pool; each failure in a row doubles it.
const FIRST_QUARANTINE: Duration = Duration::from_secs(1);
/// The longest quarantine.
const MAX_QUARANTINE: Duration = Duration::from_secs(60);

/// One pool as a source found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    /// `host:port` of its `BeamFnExternalWorkerPool` service.
    pub address: String,
    /// How many workers it runs well at once (its host's cores).
    pub capacity: usize,
    /// Where it runs, when the source knows (a Ray node id).
    pub node: Option<String>,
}

/// What an environment asks of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolNeed {
    /// The SDK the environment's workers run, when known; an environment
    /// whose SDK is not known only goes to pools labelled with none.
    pub sdk: Option<BeamSdk>,
}

impl PoolNeed {
    /// Whether pools of `spec` can run the environment: unlabelled pools
    /// run anything they are sent, labelled ones their SDK's workers.
    fn served_by(&self, spec: &PoolSpec) -> bool {
        match spec.sdk {
            None => true,
            Some(sdk) => self.sdk == Some(sdk),
        }
    }
}

/// Why no pool could start a worker.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// No pool for the environment is live, and none came within the wait.
    #[error("no live worker pool for {need} within {waited:?}{detail}")]
    NoLivePool {
        /// The environment's SDK, in words.
        need: String,
        /// How long it waited for one.
        waited: Duration,
        /// What is known of the pools that would do.
        detail: String,
    },
    /// `refract pools add` of a spec already known.
    #[error("worker pool {0} is already known")]
    Duplicate(String),
}

/// The health of one pool.
#[derive(Debug, Clone)]
enum Health {
    Live,
    Quarantined {
        until: Instant,
        failures: u32,
        reason: String,
    },
}

/// One pool and this server's workers on it.
struct Pool {
    found: Discovered,
    health: Health,
    /// Workers started on it, while they live.
    placed: Vec<Weak<Worker>>,
    /// Workers being started on it right now.
    starting: usize,
}

impl Pool {
    fn new(found: Discovered) -> Self {
        Pool {
            found,
            health: Health::Live,
            placed: Vec::new(),
            starting: 0,
        }
    }

    /// Its workers that are still connected.
    fn live_workers(&self) -> usize {
        self.placed
            .iter()
            .filter(|w| w.upgrade().is_some_and(|w| w.disconnected().is_none()))
            .count()
    }

    fn eligible(&self, now: Instant) -> bool {
        match &self.health {
            Health::Live => true,
            Health::Quarantined { until, .. } => *until <= now,
        }
    }

    /// Load per unit of capacity, as a fraction to compare exactly.
    fn load(&self) -> (usize, usize) {
        (
            self.live_workers() + self.starting,
            self.found.capacity.max(1),
        )
    }
}

/// A spec and the pools it stands for now.
struct SpecEntry {
    spec: PoolSpec,
    pools: Vec<Pool>,
    /// The latest trouble of its source (a failed lookup, Ray's error).
    trouble: Option<String>,
    /// Tells its source task to stop when the spec is removed.
    stop: watch::Sender<bool>,
}

/// One pool, as `refract pools list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStatus {
    /// The spec it comes from, as written back.
    pub spec: String,
    /// `host:port`; empty for a spec that found no pool yet.
    pub address: String,
    /// `live`, `quarantined`, or `none found` for an empty spec.
    pub state: String,
    /// Workers it runs well at once.
    pub capacity: usize,
    /// This server's connected workers on it.
    pub workers: usize,
    /// Why it is quarantined, or its source's trouble.
    pub detail: String,
}

/// Every pool this server may start workers on (see the module docs).
pub struct PoolDirectory {
    specs: parking_lot::Mutex<Vec<SpecEntry>>,
    /// Signalled whenever pools appear or change health.
    changed: Notify,
    /// Capacity of a pool named by address (its cores are not known here):
    /// this host's.
    address_capacity: usize,
}

impl PoolDirectory {
    /// An empty directory; pools named by address count `address_capacity`
    /// workers each.
    pub fn new(address_capacity: usize) -> Self {
        PoolDirectory {
            specs: parking_lot::Mutex::new(Vec::new()),
            changed: Notify::new(),
            address_capacity: address_capacity.max(1),
        }
    }

    /// Resolves at the next change of the pools: one found or gone, one
    /// quarantined or live again.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The capacity of a pool named by address.
    pub fn address_capacity(&self) -> usize {
        self.address_capacity
    }

    /// Records `spec` with no pools yet; its source fills them in. The
    /// receiver turns `true` when the spec is removed.
    pub(super) fn insert(&self, spec: PoolSpec) -> Result<watch::Receiver<bool>, PoolError> {
        let mut specs = self.specs.lock();
        if specs.iter().any(|e| e.spec == spec) {
            return Err(PoolError::Duplicate(spec.to_string()));
        }
        let (stop, stopped) = watch::channel(false);
        specs.push(SpecEntry {
            spec,
            pools: Vec::new(),
            trouble: None,
            stop,
        });
        Ok(stopped)
    }

    /// Forgets the spec written `text`; its workers are stopped. Whether
    /// it was known.
    pub fn remove(&self, text: &str) -> bool {
        let removed = {
            let mut specs = self.specs.lock();
            let Some(at) = specs.iter().position(|e| e.spec.to_string() == text.trim()) else {
                return false;
            };
            specs.remove(at)
        };
        let _ = removed.stop.send(true);
        self.retire(removed.pools.iter());
        self.changed.notify_waiters();
        true
    }

    /// The specs known, in the order they were added.
    pub fn specs(&self) -> Vec<PoolSpec> {
        self.specs.lock().iter().map(|e| e.spec.clone()).collect()
    }

    /// Sets the pools `spec` stands for now: pools still found keep their
    /// health and workers, new ones start live, and the workers of pools
    /// no longer found are stopped.
    pub(super) fn set_pools(&self, spec: &PoolSpec, found: Vec<Discovered>) {
        let gone = {
            let mut specs = self.specs.lock();
            let Some(entry) = specs.iter_mut().find(|e| &e.spec == spec) else {
                return;
            };
            entry.trouble = None;
            let mut old = std::mem::take(&mut entry.pools);
            for f in found {
                match old.iter().position(|p| p.found.address == f.address) {
                    Some(at) => {
                        let mut pool = old.swap_remove(at);
                        pool.found = f;
                        entry.pools.push(pool);
                    }
                    None => entry.pools.push(Pool::new(f)),
                }
            }
            old
        };
        if !gone.is_empty() {
            tracing::warn!(
                spec = %spec,
                pools = ?gone.iter().map(|p| p.found.address.as_str()).collect::<Vec<_>>(),
                "worker pools went away; their workers are replaced elsewhere"
            );
        }
        self.retire(gone.iter());
        self.changed.notify_waiters();
    }

    /// Notes trouble with `spec`'s source, for `refract pools list`.
    pub(super) fn set_trouble(&self, spec: &PoolSpec, trouble: String) {
        if let Some(entry) = self.specs.lock().iter_mut().find(|e| &e.spec == spec) {
            entry.trouble = Some(trouble);
        }
    }

    /// Stops this server's workers on `pools`: their bundles fail and are
    /// retried, and their jobs start replacements on the pools left.
    fn retire<'a>(&self, pools: impl Iterator<Item = &'a Pool>) {
        let workers: Vec<Arc<Worker>> = pools
            .flat_map(|p| p.placed.iter().filter_map(Weak::upgrade))
            .collect();
        if workers.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    futures::future::join_all(workers.iter().map(|w| w.stop())).await;
                });
            }
            Err(_) => tracing::warn!("pools removed outside a runtime; their workers stay"),
        }
    }

    /// Whether some spec's pools can run an environment needing `need`.
    pub fn serves(&self, need: PoolNeed) -> bool {
        self.specs.lock().iter().any(|e| need.served_by(&e.spec))
    }

    /// The label of the spec naming `address` (`host:port`) as an
    /// address spec, if one does: an EXTERNAL environment naming one
    /// pool of a cluster uses all of that cluster's pools.
    pub fn need_of_address(&self, address: &str) -> Option<PoolNeed> {
        let specs = self.specs.lock();
        specs.iter().find_map(|e| {
            let names = e.spec.to_string();
            let bare = names.rsplit('=').next().unwrap_or_default();
            let found = e.pools.iter().any(|p| p.found.address == address);
            (bare == address || found).then_some(PoolNeed { sdk: e.spec.sdk })
        })
    }

    /// Workers the live pools for `need` run well at once, together.
    pub fn capacity(&self, need: PoolNeed) -> usize {
        let now = Instant::now();
        self.specs
            .lock()
            .iter()
            .filter(|e| need.served_by(&e.spec))
            .flat_map(|e| e.pools.iter())
            .filter(|p| p.eligible(now))
            .map(|p| p.found.capacity.max(1))
            .sum()
    }

    /// How many pools could serve `need`, live or not: how many a start
    /// may try before giving up.
    pub fn pool_count(&self, need: PoolNeed) -> usize {
        self.specs
            .lock()
            .iter()
            .filter(|e| need.served_by(&e.spec))
            .map(|e| e.pools.len())
            .sum()
    }

    /// Picks the pool for one more worker needing `need`: the eligible one
    /// with the fewest workers per unit of capacity (live ones before
    /// quarantined ones due a retry), waiting up to `wait` for one to
    /// appear.
    pub async fn acquire(
        self: &Arc<Self>,
        need: PoolNeed,
        wait: Duration,
    ) -> Result<Placement, PoolError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let changed = self.changed.notified();
            if let Some(placement) = self.try_acquire(need) {
                return Ok(placement);
            }
            // A quarantine may end before anything changes.
            let retry_at = self.next_retry(need).map(tokio::time::Instant::from_std);
            let until = retry_at.map_or(deadline, |r| r.min(deadline));
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(until) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                if let Some(placement) = self.try_acquire(need) {
                    return Ok(placement);
                }
                return Err(PoolError::NoLivePool {
                    need: need
                        .sdk
                        .map_or("an environment of no known SDK".to_string(), |s| {
                            format!("the {} SDK", s.name())
                        }),
                    waited: wait,
                    detail: self.describe(need),
                });
            }
        }
    }

    fn try_acquire(self: &Arc<Self>, need: PoolNeed) -> Option<Placement> {
        let now = Instant::now();
        let mut specs = self.specs.lock();
        let mut best: Option<(bool, (usize, usize), usize, usize)> = None;
        for (s, entry) in specs.iter().enumerate() {
            if !need.served_by(&entry.spec) {
                continue;
            }
            for (p, pool) in entry.pools.iter().enumerate() {
                if !pool.eligible(now) {
                    continue;
                }
                let quarantined = matches!(pool.health, Health::Quarantined { .. });
                let load = pool.load();
                let better = match &best {
                    None => true,
                    Some((bq, bl, _, _)) => {
                        // Live first; then load a/b < c/d as a*d < c*b.
                        (quarantined, load.0 * bl.1) < (*bq, bl.0 * load.1)
                    }
                };
                if better {
                    best = Some((quarantined, load, s, p));
                }
            }
        }
        let (_, _, s, p) = best?;
        let entry = specs.get_mut(s)?;
        let spec = entry.spec.clone();
        let pool = entry.pools.get_mut(p)?;
        pool.starting += 1;
        Some(Placement {
            directory: Arc::clone(self),
            spec,
            address: pool.found.address.clone(),
            settled: false,
        })
    }

    /// When the next quarantine of a pool for `need` ends.
    fn next_retry(&self, need: PoolNeed) -> Option<Instant> {
        self.specs
            .lock()
            .iter()
            .filter(|e| need.served_by(&e.spec))
            .flat_map(|e| e.pools.iter())
            .filter_map(|p| match &p.health {
                Health::Quarantined { until, .. } => Some(*until),
                Health::Live => None,
            })
            .min()
    }

    /// What is known of the pools for `need`, for an error message.
    fn describe(&self, need: PoolNeed) -> String {
        let specs = self.specs.lock();
        let lines: Vec<String> = specs
            .iter()
            .filter(|e| need.served_by(&e.spec))
            .flat_map(|e| {
                let mut lines: Vec<String> = e
                    .pools
                    .iter()
                    .map(|p| match &p.health {
                        Health::Live => format!("{} live", p.found.address),
                        Health::Quarantined { reason, .. } => {
                            format!("{} quarantined: {reason}", p.found.address)
                        }
                    })
                    .collect();
                if e.pools.is_empty() {
                    lines.push(format!(
                        "{} found no pool{}",
                        e.spec,
                        e.trouble
                            .as_ref()
                            .map_or(String::new(), |t| format!(" ({t})"))
                    ));
                }
                lines
            })
            .collect();
        if lines.is_empty() {
            String::new()
        } else {
            format!(": {}", lines.join("; "))
        }
    }

    /// Every pool, for `refract pools list`.
    pub fn statuses(&self) -> Vec<PoolStatus> {
        let now = Instant::now();
        let specs = self.specs.lock();
        let mut out = Vec::new();
        for entry in specs.iter() {
            let spec = entry.spec.to_string();
            if entry.pools.is_empty() {
                out.push(PoolStatus {
                    spec: spec.clone(),
                    address: String::new(),
                    state: "none found".to_string(),
                    capacity: 0,
                    workers: 0,
                    detail: entry.trouble.clone().unwrap_or_default(),
                });
            }
            for pool in &entry.pools {
                let (state, detail) = match &pool.health {
                    Health::Live => ("live".to_string(), String::new()),
                    Health::Quarantined {
                        until,
                        failures,
                        reason,
                    } => (
                        "quarantined".to_string(),
                        format!(
                            "{failures} failure(s) in a row, next try in {:.0?}: {reason}",
                            until.saturating_duration_since(now)
                        ),
                    ),
                };
                out.push(PoolStatus {
                    spec: spec.clone(),
                    address: pool.found.address.clone(),
                    state,
                    capacity: pool.found.capacity,
                    workers: pool.live_workers(),
                    detail,
                });
            }
        }
        out
    }

    fn with_pool(&self, spec: &PoolSpec, address: &str, f: impl FnOnce(&mut Pool)) {
        let mut specs = self.specs.lock();
        let pool = specs
            .iter_mut()
            .filter(|e| &e.spec == spec)
            .flat_map(|e| e.pools.iter_mut())
            .find(|p| p.found.address == address);
        if let Some(pool) = pool {
            f(pool);
        }
    }
}

/// One worker being started on a chosen pool: counted against the pool's
/// load until it is [`Placement::started`] (then the worker counts) or
/// dropped.
pub struct Placement {
    directory: Arc<PoolDirectory>,
    spec: PoolSpec,
    address: String,
    settled: bool,
}

impl Placement {
    /// `host:port` of the pool chosen.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The worker came up: it counts on the pool from now on, and the
    /// pool is live.
    pub fn started(mut self, worker: &Arc<Worker>) {
        self.settled = true;
        let weak = Arc::downgrade(worker);
        let mut recovered = false;
        self.directory.with_pool(&self.spec, &self.address, |pool| {
            pool.starting = pool.starting.saturating_sub(1);
            pool.placed.retain(|w| w.strong_count() > 0);
            pool.placed.push(weak);
            recovered = matches!(pool.health, Health::Quarantined { .. });
            pool.health = Health::Live;
        });
        if recovered {
            tracing::info!(pool = %self.address, "worker pool is live again");
            self.directory.changed.notify_waiters();
        }
    }

    /// The pool failed to start the worker: it is quarantined, for longer
    /// with each failure in a row.
    pub fn failed(mut self, reason: &str) {
        self.settled = true;
        let mut quarantine = FIRST_QUARANTINE;
        self.directory.with_pool(&self.spec, &self.address, |pool| {
            pool.starting = pool.starting.saturating_sub(1);
            let failures = match &pool.health {
                Health::Live => 1,
                Health::Quarantined { failures, .. } => failures.saturating_add(1),
            };
            quarantine = quarantine_for(failures);
            pool.health = Health::Quarantined {
                until: Instant::now() + quarantine,
                failures,
                reason: reason.to_string(),
            };
        });
        tracing::warn!(pool = %self.address, ?quarantine, %reason, "worker pool quarantined");
        self.directory.changed.notify_waiters();
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        if !self.settled {
            self.directory.with_pool(&self.spec, &self.address, |pool| {
                pool.starting = pool.starting.saturating_sub(1);
            });
        }
    }
}

/// How long a pool that failed `failures` times in a row is skipped.
fn quarantine_for(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_QUARANTINE
        .saturating_mul(1u32 << doublings)
        .min(MAX_QUARANTINE)
}

#[cfg(test)]
mod tests;
