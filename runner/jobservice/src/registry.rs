//! All jobs this service has prepared, by id, kept in memory for the life of
//! the server so clients can query them after they end.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::RwLock;
use refract_proto::pipeline::Pipeline;
use refract_proto::prost_types;

use crate::job::{Job, JobSettings};

/// Longest prefix of the job name kept in a job id.
const MAX_NAME_PREFIX: usize = 40;

/// The job table.
pub(crate) struct JobRegistry {
    staging_root: PathBuf,
    max_retained_events: usize,
    retain_artifacts: bool,
    jobs: RwLock<Table>,
}

#[derive(Default)]
struct Table {
    by_id: HashMap<String, Arc<Job>>,
    /// Ids in preparation order, for GetJobs.
    order: Vec<String>,
}

impl JobRegistry {
    /// An empty table whose jobs stage under `staging_root` (absolute).
    pub(crate) fn new(
        staging_root: PathBuf,
        max_retained_events: usize,
        retain_artifacts: bool,
    ) -> Self {
        Self {
            staging_root,
            max_retained_events,
            retain_artifacts,
            jobs: RwLock::new(Table::default()),
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
        let job = Arc::new(Job::new(
            id.clone(),
            name,
            pipeline,
            options,
            JobSettings {
                artifact_dir: self.staging_root.join(&id),
                max_retained_events: self.max_retained_events,
                retain_artifacts: self.retain_artifacts,
            },
        ));
        let mut table = self.jobs.write();
        table.by_id.insert(id.clone(), Arc::clone(&job));
        table.order.push(id);
        job
    }

    /// Registers a job taken over from an earlier server, under its own id.
    pub(crate) fn adopt(&self, recovered: crate::RecoveredJob) -> Arc<Job> {
        let id = recovered.id;
        let job = Arc::new(Job::new(
            id.clone(),
            recovered.name,
            recovered.pipeline,
            recovered.options,
            JobSettings {
                artifact_dir: self.staging_root.join(&id),
                max_retained_events: self.max_retained_events,
                retain_artifacts: self.retain_artifacts,
            },
        ));
        job.artifacts().adopt(&recovered.staged);
        let mut table = self.jobs.write();
        if table.by_id.insert(id.clone(), Arc::clone(&job)).is_none() {
            table.order.push(id);
        }
        job
    }

    /// The job with this id (which is also its preparation id and staging
    /// token).
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Job>> {
        self.jobs.read().by_id.get(id).cloned()
    }

    /// Every job, oldest first.
    pub(crate) fn all(&self) -> Vec<Arc<Job>> {
        let table = self.jobs.read();
        table
            .order
            .iter()
            .filter_map(|id| table.by_id.get(id).cloned())
            .collect()
    }
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
    fn ids_are_unique_and_path_safe() {
        let a = new_job_id("../../etc/passwd");
        let b = new_job_id("../../etc/passwd");
        assert_ne!(a, b);
        assert!(a.starts_with("______etc_passwd-"), "{a}");
        assert!(!a.contains('/') && !a.contains('.'));
        assert!(new_job_id("").starts_with("job-"));
    }

    #[test]
    fn jobs_are_listed_in_order_and_found_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let reg = JobRegistry::new(dir.path().to_path_buf(), 10, false);
        let a = reg.create("a".into(), Pipeline::default(), Default::default());
        let b = reg.create("b".into(), Pipeline::default(), Default::default());
        let ids: Vec<String> = reg.all().iter().map(|j| j.id().to_string()).collect();
        assert_eq!(ids, [a.id(), b.id()]);
        assert!(reg.get(b.id()).is_some());
        assert!(reg.get("[fake]").is_none());
        assert_eq!(a.artifacts().dir(), dir.path().join(a.id()));
    }
}
