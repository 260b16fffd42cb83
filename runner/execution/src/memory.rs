//! `--memory_budget`: how much memory the jobs' data may take, on the
//! whole server.
//!
//! The engine bounds each stage's queue of waiting elements
//! (`EngineConfig::max_pending_bytes`): a stage whose consumer is over its
//! bound gets no new bundles, so a fast source or a slow sink cannot fill
//! memory. A job's budget is split evenly over its stages, so its queues
//! together stay near it (a bundle already running may overshoot its
//! consumer's share by what it outputs). A batch GroupByKey may hold one
//! share in memory and spills the rest (`refract_engine::spill`); a
//! splittable bundle is split once its output reaches a share.
//!
//! The server's budget is shared by its jobs through a [`MemoryLedger`]:
//! a starting job is granted up to `--job_memory_budget` (half the
//! server's, by default, so two jobs always run side by side at full
//! share), or what is left, but never less than its stages' floor
//! ([`MIN_STAGE_BYTES`] each); when not even that is left, it waits in
//! STARTING until a job ends. The default server budget is a quarter of
//! the memory this process may use: the machine's, or its cgroup's limit
//! when lower (a container).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// The smallest share a stage gets, whatever the budget: below this,
/// bundles would be too small to make progress efficiently.
pub const MIN_STAGE_BYTES: usize = 4 << 20;

/// Default budget when the machine's memory cannot be read.
const FALLBACK_BUDGET: usize = 1 << 30;

/// Parses a size: a number of bytes with an optional binary suffix
/// (`k`, `m`, `g`, `t`, optionally followed by `b` or `ib`, any case), as
/// in `--memory_budget 1g` or `512MiB`.
pub fn parse_byte_size(text: &str) -> Result<usize, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(digits_end);
    let number: usize = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (e.g. 512m, 2g, 1073741824)"))?;
    let unit: usize = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "unknown size unit '{other}' in '{text}' (use k, m, g or t)"
            ))
        }
    };
    number
        .checked_mul(unit)
        .filter(|&bytes| bytes > 0)
        .ok_or_else(|| format!("'{text}' is not a usable size"))
}

/// The default budget: a quarter of the memory this process may use
/// (leaving the rest to SDK workers and everything else): the machine's,
/// or its cgroup's limit when that is lower.
pub fn default_budget() -> usize {
    let machine = total_memory(Path::new("/proc/meminfo"));
    let cgroup = cgroup_limit(Path::new("/proc/self/cgroup"), Path::new("/sys/fs/cgroup"));
    match (machine, cgroup) {
        (Some(m), Some(c)) => m.min(c) / 4,
        (Some(m), None) => m / 4,
        (None, Some(c)) => c / 4,
        (None, None) => FALLBACK_BUDGET,
    }
}

/// The memory limit of this process's cgroup: the lowest limit from its
/// cgroup up to the root of its hierarchy, in cgroup v2 (`memory.max`
/// under `root`) and in v1's memory controller (`memory.limit_in_bytes`
/// under `root/memory`, where systems with v1 or both mount it); `None`
/// without one.
fn cgroup_limit(self_cgroup: &Path, root: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(self_cgroup).ok()?;
    let v2 = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .and_then(|path| lowest_limit(root, path, "memory.max"));
    let v1 = text
        .lines()
        .find_map(|line| {
            let mut fields = line.splitn(3, ':');
            let _id = fields.next()?;
            let controllers = fields.next()?;
            let path = fields.next()?;
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then_some(path)
        })
        .and_then(|path| lowest_limit(&root.join("memory"), path, "memory.limit_in_bytes"));
    match (v2, v1) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// v1 writes "no limit" as a number near `i64::MAX` (rounded to pages).
const V1_UNLIMITED: usize = 1 << 62;

/// The lowest of the `file` limits from `path` (a cgroup, as
/// `/proc/self/cgroup` names it) up to `root`, the hierarchy's mount.
fn lowest_limit(root: &Path, path: &str, file: &str) -> Option<usize> {
    let mut dir: PathBuf = root.join(path.trim().trim_start_matches('/'));
    let mut lowest: Option<usize> = None;
    loop {
        let limit = std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&limit| limit < V1_UNLIMITED);
        if let Some(limit) = limit {
            lowest = Some(lowest.map_or(limit, |l| l.min(limit)));
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            return lowest;
        }
    }
}

/// `MemTotal` of a `/proc/meminfo`-style file, in bytes.
fn total_memory(meminfo: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(meminfo).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// What each of a job's `stages` stages may have waiting.
pub fn per_stage_bytes(budget: usize, stages: usize) -> usize {
    (budget / stages.max(1)).max(MIN_STAGE_BYTES)
}

/// The server's memory budget and what running jobs were granted of it.
#[derive(Debug)]
pub struct MemoryLedger {
    total: usize,
    /// Bytes granted, and the number of jobs holding them.
    held: Mutex<(usize, usize)>,
    released: Notify,
}

/// What one job was granted; given back when dropped.
#[derive(Debug)]
pub struct MemoryGrant {
    bytes: usize,
    ledger: Arc<MemoryLedger>,
}

impl MemoryGrant {
    /// The job's budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for MemoryGrant {
    fn drop(&mut self) {
        {
            let mut held = self.ledger.held.lock();
            held.0 = held.0.saturating_sub(self.bytes);
            held.1 = held.1.saturating_sub(1);
        }
        self.ledger.released.notify_waiters();
    }
}

/// The ledger's state when a job could not be granted its minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exhausted {
    /// Bytes granted to running jobs.
    pub held: usize,
    /// Jobs holding them.
    pub jobs: usize,
    /// The server's budget.
    pub total: usize,
}

impl MemoryLedger {
    /// A ledger over `total` bytes.
    pub fn new(total: usize) -> Arc<Self> {
        Arc::new(MemoryLedger {
            total,
            held: Mutex::new((0, 0)),
            released: Notify::new(),
        })
    }

    /// The server's budget.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Grants up to `want` bytes, at least `min` (capped at the whole
    /// budget, so that a job larger than the server still runs when it is
    /// alone), or says how full the ledger is.
    pub fn try_grant(self: &Arc<Self>, min: usize, want: usize) -> Result<MemoryGrant, Exhausted> {
        let min = min.min(self.total);
        let mut held = self.held.lock();
        let available = self.total.saturating_sub(held.0);
        if available < min {
            return Err(Exhausted {
                held: held.0,
                jobs: held.1,
                total: self.total,
            });
        }
        let bytes = want.max(min).min(available);
        held.0 += bytes;
        held.1 += 1;
        Ok(MemoryGrant {
            bytes,
            ledger: Arc::clone(self),
        })
    }

    /// [`Self::try_grant`], waiting for jobs to end while not even `min`
    /// is left; `waiting` is told once, when the wait begins.
    pub async fn grant(
        self: &Arc<Self>,
        min: usize,
        want: usize,
        waiting: impl FnOnce(Exhausted),
    ) -> MemoryGrant {
        let mut waiting = Some(waiting);
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            match self.try_grant(min, want) {
                Ok(grant) => return grant,
                Err(exhausted) => {
                    if let Some(tell) = waiting.take() {
                        tell(exhausted);
                    }
                }
            }
            released.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_byte_size("1g"), Ok(1 << 30));
        assert_eq!(parse_byte_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_byte_size("64 m"), Ok(64 << 20));
        assert_eq!(parse_byte_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_byte_size("2Tb"), Ok(2 << 40));
    }

    #[test]
    fn bad_sizes_say_why() {
        assert!(parse_byte_size("lots").unwrap_err().contains("not a size"));
        assert!(parse_byte_size("1x")
            .unwrap_err()
            .contains("unknown size unit 'x'"));
        assert!(parse_byte_size("0")
            .unwrap_err()
            .contains("not a usable size"));
        assert!(parse_byte_size("99999999999t").is_err());
    }

    #[test]
    fn the_budget_is_split_over_stages_with_a_floor() {
        assert_eq!(per_stage_bytes(1 << 30, 4), 256 << 20);
        assert_eq!(per_stage_bytes(1 << 30, 0), 1 << 30);
        assert_eq!(per_stage_bytes(16 << 20, 100), MIN_STAGE_BYTES);
    }

    #[test]
    fn the_cgroup_limit_is_the_lowest_on_the_way_to_the_root() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let root = dir.path().join("cgroup");
        let leaf = root.join("system.slice/refract.service");
        std::fs::create_dir_all(&leaf).expect("dirs");
        std::fs::write(root.join("system.slice/memory.max"), "2147483648\n").expect("w");
        std::fs::write(leaf.join("memory.max"), "max\n").expect("w");
        let own = dir.path().join("self-cgroup");
        std::fs::write(&own, "0::/system.slice/refract.service\n").expect("w");
        assert_eq!(cgroup_limit(&own, &root), Some(2 << 30));
        std::fs::write(leaf.join("memory.max"), "1073741824\n").expect("w");
        assert_eq!(cgroup_limit(&own, &root), Some(1 << 30));
        std::fs::write(&own, "12:memory:/v1-only\n").expect("w");
        assert_eq!(cgroup_limit(&own, &root), None);
    }

    #[test]
    fn a_cgroup_v1_memory_limit_counts_too() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let root = dir.path().join("cgroup");
        let v1 = root.join("memory");
        let leaf = v1.join("docker/abc");
        std::fs::create_dir_all(&leaf).expect("dirs");
        // The root's "no limit", then the container's 512 MiB.
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").expect("w");
        std::fs::write(leaf.join("memory.limit_in_bytes"), "536870912\n").expect("w");
        let own = dir.path().join("self-cgroup");
        std::fs::write(
            &own,
            "4:cpu,cpuacct:/docker/abc\n9:memory:/docker/abc\n0::/\n",
        )
        .expect("w");
        assert_eq!(cgroup_limit(&own, &root), Some(512 << 20));
        // Unlimited everywhere: no limit.
        std::fs::write(leaf.join("memory.limit_in_bytes"), "9223372036854771712\n").expect("w");
        assert_eq!(cgroup_limit(&own, &root), None);
        // Both hierarchies (a hybrid system): the lower limit.
        std::fs::write(leaf.join("memory.limit_in_bytes"), "536870912\n").expect("w");
        std::fs::write(root.join("memory.max"), "268435456\n").expect("w");
        assert_eq!(cgroup_limit(&own, &root), Some(256 << 20));
    }

    #[test]
    fn jobs_get_their_share_or_what_is_left_and_wait_below_their_floor() {
        let ledger = MemoryLedger::new(100);
        let a = ledger.try_grant(10, 50).expect("room");
        let b = ledger.try_grant(10, 50).expect("room");
        assert_eq!((a.bytes(), b.bytes()), (50, 50));
        let full = ledger.try_grant(10, 50).expect_err("full");
        assert_eq!(
            full,
            Exhausted {
                held: 100,
                jobs: 2,
                total: 100
            }
        );
        drop(a);
        let c = ledger.try_grant(10, 80).expect("room again");
        assert_eq!(c.bytes(), 50);
        drop((b, c));
        // A job whose floor is larger than the server gets the server.
        assert_eq!(ledger.try_grant(500, 500).expect("alone").bytes(), 100);
    }

    // Paused time: the sleep ends only once every task is idle (tokio
    // moves the clock only then), so the waiter has done all it can.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_job_starts_when_another_ends() {
        let ledger = MemoryLedger::new(100);
        let first = ledger.try_grant(60, 100).expect("room");
        let told = Arc::new(Mutex::new(None));
        let waiter = {
            let (ledger, told) = (ledger.clone(), told.clone());
            tokio::spawn(async move {
                ledger
                    .grant(60, 100, move |e| *told.lock() = Some(e))
                    .await
                    .bytes()
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        assert_eq!(told.lock().map(|e| e.jobs), Some(1));
        drop(first);
        assert_eq!(waiter.await.expect("no panic"), 100);
    }

    #[test]
    fn total_memory_is_read_from_meminfo() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("meminfo");
        std::fs::write(&path, "MemTotal:       24576000 kB\nMemFree: 1 kB\n").expect("written");
        assert_eq!(total_memory(&path), Some(24_576_000 * 1024));
        assert_eq!(total_memory(&dir.path().join("missing")), None);
        assert!(default_budget() > 0);
    }
}
