//! All jobs this service has prepared, by id, kept in memory for the life of
//! the server so clients can query them after they end.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::RwLock;
use refract_proto::pipeline::Pipeline;
use refract_proto::prost_types;

use crate::event_log::MessageRetention;
use crate::job::{Job, JobSettings};
use crate::planning::PlanningSlots;

/// Longest prefix of the job name kept in a job id.
const MAX_NAME_PREFIX: usize = 40;

/// The job table.
pub(crate) struct JobRegistry {
    staging_root: PathBuf,
    message_retention: MessageRetention,
    retain_artifacts: bool,
    jobs: RwLock<Table>,
    /// Where its jobs take turns to be translated.
    planning: Arc<PlanningSlots>,
}

/// Translations at once of a table given no [`PlanningSlots`] of its own.
const DEFAULT_PLANNING_TURNS: usize = 2;

#[derive(Default)]
struct Table {
    by_id: HashMap<String, (u64, Arc<Job>)>,
    /// Ids by the order they were prepared (a number per job), for
    /// listing and retention.
    order: BTreeMap<u64, String>,
    next_seq: u64,
}

impl Table {
    fn insert(&mut self, job: Arc<Job>) {
        let id = job.id().to_string();
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some((old, _)) = self.by_id.insert(id.clone(), (seq, job)) {
            self.order.remove(&old);
        }
        self.order.insert(seq, id);
    }
}

/// Which ended jobs to let go of ([`JobRegistry::evict`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retention {
    /// Ended jobs kept at most (the newest).
    pub max_finished: usize,
    /// Ended jobs are let go this long after they ended.
    pub max_age: std::time::Duration,
}

impl JobRegistry {
    /// An empty table whose jobs stage under `staging_root` (absolute).
    pub(crate) fn new(
        staging_root: PathBuf,
        message_retention: MessageRetention,
        retain_artifacts: bool,
    ) -> Self {
        Self {
            staging_root,
            message_retention,
            retain_artifacts,
            jobs: RwLock::new(Table::default()),
            planning: Arc::new(PlanningSlots::new(DEFAULT_PLANNING_TURNS, 0)),
        }
    }

    /// The same table, whose jobs take their translation turns from
    /// `planning` (shared with `Prepare`).
    pub(crate) fn with_planning(mut self, planning: Arc<PlanningSlots>) -> Self {
        self.planning = planning;
        self
    }

    fn settings(&self, id: &str) -> JobSettings {
        JobSettings {
            artifact_dir: self.staging_root.join(staging_dir_name(id)),
            message_retention: self.message_retention,
            retain_artifacts: self.retain_artifacts,
            planning: Arc::clone(&self.planning),
        }
    }

    /// Creates and registers a job under a fresh unique id.
    pub(crate) fn create(
        &self,
        name: String,
        pipeline: Pipeline,
        options: prost_types::Struct,
    ) -> Arc<Job> {
        let id = new_job_id(&name);
        let settings = self.settings(&id);
        let job = Arc::new(Job::new(id, name, pipeline, options, settings));
        self.jobs.write().insert(Arc::clone(&job));
        job
    }

    /// Registers a job taken over from an earlier server, under its own id.
    pub(crate) fn adopt(&self, recovered: crate::RecoveredJob) -> Arc<Job> {
        let settings = self.settings(&recovered.id);
        let job = Arc::new(Job::new(
            recovered.id,
            recovered.name,
            recovered.pipeline,
            recovered.options,
            settings,
        ));
        job.artifacts().adopt(&recovered.staged);
        self.jobs.write().insert(Arc::clone(&job));
        job
    }

    /// A fresh job in place of `ended` (same id, submission and staged
    /// files), to run again: how a failed job resumes. Whoever holds the
    /// old one keeps seeing it as it ended. `None` when `ended` is no
    /// longer the table's job of that id (another resume, or a delete,
    /// came first): a job is never renewed twice.
    pub(crate) fn renew(&self, ended: &Job) -> Option<Arc<Job>> {
        let id = ended.id().to_string();
        let job = Arc::new(Job::new(
            id.clone(),
            ended.name().to_string(),
            ended.pipeline().clone(),
            ended.options().clone(),
            self.settings(&id),
        ));
        job.artifacts().adopt(&ended.artifacts().staged());
        if ended.is_durable() {
            job.mark_durable();
        }
        let mut table = self.jobs.write();
        let entry = table.by_id.get_mut(&id)?;
        if !std::ptr::eq(Arc::as_ptr(&entry.1), ended) {
            return None;
        }
        entry.1 = Arc::clone(&job);
        Some(job)
    }

    /// Removes `job` if it is still the table's job of its id (not renewed
    /// by a resume meanwhile); whether it was.
    pub(crate) fn remove_exactly(&self, job: &Job) -> bool {
        let mut table = self.jobs.write();
        let seq = match table.by_id.get(job.id()) {
            Some((seq, held)) if std::ptr::eq(Arc::as_ptr(held), job) => *seq,
            _ => return false,
        };
        table.by_id.remove(job.id());
        table.order.remove(&seq);
        true
    }

    /// The job with this id (which is also its preparation id and staging
    /// token).
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Job>> {
        self.jobs.read().by_id.get(id).map(|(_, job)| job.clone())
    }

    /// Every job, oldest first.
    pub(crate) fn all(&self) -> Vec<Arc<Job>> {
        let table = self.jobs.read();
        table
            .order
            .values()
            .filter_map(|id| table.by_id.get(id).map(|(_, job)| job.clone()))
            .collect()
    }

    /// Up to `size` jobs, newest first, prepared before the job numbered
    /// `before` (all of them without it), and the number to continue
    /// from when more are left.
    pub(crate) fn page(&self, before: Option<u64>, size: usize) -> (Vec<Arc<Job>>, Option<u64>) {
        let table = self.jobs.read();
        let mut jobs = Vec::new();
        let mut older = table.order.range(..before.unwrap_or(u64::MAX)).rev();
        for (_, id) in older.by_ref().take(size) {
            if let Some((_, job)) = table.by_id.get(id) {
                jobs.push(job.clone());
            }
        }
        let next = older.next().map(|_| ()).and_then(|()| {
            jobs.last()
                .and_then(|last| table.by_id.get(last.id()))
                .map(|(seq, _)| *seq)
        });
        (jobs, next)
    }

    /// Lets go of ended jobs past `retention` (the oldest past the count,
    /// and those ended longer ago than the age), except failed durable
    /// ones, which wait to be resumed or deleted; returns them.
    pub(crate) fn evict(&self, retention: Retention, now_ms: u64) -> Vec<Arc<Job>> {
        let max_age_ms = u64::try_from(retention.max_age.as_millis()).unwrap_or(u64::MAX);
        let mut table = self.jobs.write();
        let ended: Vec<(u64, Arc<Job>)> = table
            .order
            .iter()
            .rev()
            .filter_map(|(seq, id)| table.by_id.get(id).map(|(_, job)| (*seq, job.clone())))
            .filter(|(_, job)| {
                job.ended_ms().is_some()
                    && !(job.state() == crate::JobState::Failed && job.is_durable())
            })
            .collect();
        let mut evicted = Vec::new();
        for (kept, (seq, job)) in ended.into_iter().enumerate() {
            let old = job
                .ended_ms()
                .is_some_and(|ended| now_ms.saturating_sub(ended) > max_age_ms);
            if kept >= retention.max_finished || old {
                table.order.remove(&seq);
                table.by_id.remove(job.id());
                evicted.push(job);
            }
        }
        evicted
    }

    /// Jobs prepared before `cutoff_ms` and never run.
    pub(crate) fn never_run_since(&self, cutoff_ms: u64) -> Vec<Arc<Job>> {
        self.jobs
            .read()
            .by_id
            .values()
            .map(|(_, job)| job.clone())
            .filter(|job| job.state() == crate::JobState::Stopped && job.created_ms() < cutoff_ms)
            .collect()
    }
}

/// Whether `id` is safe as a file or directory name: not empty, only
/// `[A-Za-z0-9_-]`. Every id this server makes is; one read from an
/// earlier server's record might not be, and must not name a path.
pub fn is_safe_job_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The name of `id`'s staging directory under the staging root: the id
/// itself when it is safe as one (every id this server makes is), else a
/// digest of it. Ids also come from records an earlier server wrote, and
/// deleting a job removes its staging directory: an id such as `..` must
/// never name a directory outside the job's own.
fn staging_dir_name(id: &str) -> String {
    if is_safe_job_id(id) {
        return id.to_string();
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(id.as_bytes());
    format!("id-{}", hex::encode(&digest[..16]))
}

/// A readable, unique id that is safe as a directory name: the job name
/// reduced to `[A-Za-z0-9_-]`, then a random UUID.
fn new_job_id(name: &str) -> String {
    let prefix: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(MAX_NAME_PREFIX)
        .collect();
    let prefix = if prefix.is_empty() { "job" } else { &prefix };
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_that_is_no_safe_directory_name_stages_under_a_digest() {
        let root = std::path::Path::new("/state/staging");
        let registry = JobRegistry::new(root.to_path_buf(), MessageRetention::events(16), false);
        for (id, kept) in [
            ("wordcount-0123abcd", true),
            ("a_b-c", true),
            ("..", false),
            ("../db", false),
            ("a/b", false),
            ("", false),
            ("/etc", false),
        ] {
            let dir = registry.settings(id).artifact_dir;
            assert_eq!(dir.parent(), Some(root), "{id:?} -> {}", dir.display());
            let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
            if kept {
                assert_eq!(name.as_deref(), Some(id));
            } else {
                let name = name.unwrap_or_default();
                assert!(
                    name.starts_with("id-") && name.len() == 35,
                    "{id:?} -> {name}"
                );
            }
        }
        assert_ne!(
            registry.settings("..").artifact_dir,
            registry.settings("../db").artifact_dir
        );
    }

    #[test]
    fn ids_are_unique_and_path_safe() {
        let a = new_job_id("../../etc/passwd");
        let b = new_job_id("../../etc/passwd");
        assert_ne!(a, b);
        assert!(a.starts_with("______etc_passwd-"), "{a}");
        assert!(!a.contains('/') && !a.contains('.'));
        assert!(new_job_id("").starts_with("job-"));
    }

    #[test]
    fn pages_go_from_the_newest_back() {
        let dir = tempfile::tempdir().unwrap();
        let reg = JobRegistry::new(
            dir.path().to_path_buf(),
            MessageRetention::events(10),
            false,
        );
        let ids: Vec<String> = (0..5)
            .map(|i| {
                reg.create(format!("j{i}"), Pipeline::default(), Default::default())
                    .id()
                    .to_string()
            })
            .collect();
        let names = |jobs: &[Arc<Job>]| {
            jobs.iter()
                .map(|j| j.name().to_string())
                .collect::<Vec<_>>()
        };
        let (first, next) = reg.page(None, 2);
        assert_eq!(names(&first), ["j4", "j3"]);
        let (second, next) = reg.page(next, 2);
        assert_eq!(names(&second), ["j2", "j1"]);
        let (last, next) = reg.page(next, 2);
        assert_eq!(names(&last), ["j0"]);
        assert_eq!(next, None);
        let (all, next) = reg.page(None, 5);
        assert_eq!(all.len(), 5);
        assert_eq!(next, None);
        let first = reg.get(&ids[0]).unwrap();
        assert!(reg.remove_exactly(&first));
        assert!(reg.get(&ids[0]).is_none());
        assert_eq!(reg.all().len(), 4);
    }

    #[test]
    fn ended_jobs_past_the_retention_go_and_failed_durable_ones_stay() {
        use crate::JobState;
        let dir = tempfile::tempdir().unwrap();
        let reg = JobRegistry::new(
            dir.path().to_path_buf(),
            MessageRetention::events(10),
            false,
        );
        let jobs: Vec<Arc<Job>> = (0..6)
            .map(|i| reg.create(format!("j{i}"), Pipeline::default(), Default::default()))
            .collect();
        // j0 failed durably; j1..j4 ended; j5 runs.
        jobs[0].mark_durable();
        jobs[0].fail("boom");
        for job in &jobs[1..5] {
            job.set_state(JobState::Done);
        }
        jobs[5].set_state(JobState::Running);
        let retention = Retention {
            max_finished: 2,
            max_age: std::time::Duration::from_secs(3600),
        };
        let evicted = reg.evict(retention, now());
        let names: Vec<&str> = evicted.iter().map(|j| j.name()).collect();
        assert_eq!(names, ["j2", "j1"]);
        let left: Vec<String> = reg.all().iter().map(|j| j.name().to_string()).collect();
        assert_eq!(left, ["j0", "j3", "j4", "j5"]);
        // By age: everything ended goes, but the failed durable job.
        let evicted = reg.evict(
            Retention {
                max_finished: 100,
                max_age: std::time::Duration::ZERO,
            },
            now() + 1,
        );
        assert_eq!(evicted.len(), 2);
        let left: Vec<String> = reg.all().iter().map(|j| j.name().to_string()).collect();
        assert_eq!(left, ["j0", "j5"]);
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    }

    #[test]
    fn one_update_claims_a_job_and_a_failed_one_gives_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let reg = JobRegistry::new(
            dir.path().to_path_buf(),
            MessageRetention::events(10),
            false,
        );
        let old = reg.create("old".into(), Pipeline::default(), Default::default());
        let new = reg.create("new".into(), Pipeline::default(), Default::default());
        new.set_replaces(old.clone());
        assert!(Arc::ptr_eq(new.replaces().expect("an update"), &old));
        assert!(old.claim_replacement(new.id()));
        assert!(!old.claim_replacement("another"), "claimed twice");
        old.release_replacement("another");
        assert_eq!(old.replaced_by().as_deref(), Some(new.id()));
        old.release_replacement(new.id());
        assert_eq!(old.replaced_by(), None);
        assert!(old.claim_replacement("another"));
    }

    #[test]
    fn a_job_is_renewed_once() {
        let dir = tempfile::tempdir().unwrap();
        let reg = JobRegistry::new(
            dir.path().to_path_buf(),
            MessageRetention::events(10),
            false,
        );
        let failed = reg.create("j".into(), Pipeline::default(), Default::default());
        failed.fail("boom");
        let renewed = reg.renew(&failed).expect("renewed");
        assert_eq!(renewed.id(), failed.id());
        assert!(Arc::ptr_eq(
            &reg.get(failed.id()).expect("listed"),
            &renewed
        ));
        assert!(reg.renew(&failed).is_none(), "renewed twice");
        assert!(
            !reg.remove_exactly(&failed),
            "removed a renewed job's old self"
        );
        assert!(reg.remove_exactly(&renewed));
        assert!(reg.renew(&renewed).is_none());
    }

    #[test]
    fn jobs_are_listed_in_order_and_found_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let reg = JobRegistry::new(
            dir.path().to_path_buf(),
            MessageRetention::events(10),
            false,
        );
        let a = reg.create("a".into(), Pipeline::default(), Default::default());
        let b = reg.create("b".into(), Pipeline::default(), Default::default());
        let ids: Vec<String> = reg.all().iter().map(|j| j.id().to_string()).collect();
        assert_eq!(ids, [a.id(), b.id()]);
        assert!(reg.get(b.id()).is_some());
        assert!(reg.get("[fake]").is_none());
        assert_eq!(a.artifacts().dir(), dir.path().join(a.id()));
    }
}
