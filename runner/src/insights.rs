//! Live views of jobs for the web UI and `/metrics`: the job runner
//! registers each job's stream of stage snapshots here, and readers take
//! the latest one. Finished jobs keep their last snapshot, so a page opened
//! after the end still shows the final watermarks and counts.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use refract_engine::manager::StageStats;
use tokio::sync::watch;

/// Stage snapshots per job id, shared by the runner and the UI.
#[derive(Debug, Default, Clone)]
pub struct Insights {
    jobs: Arc<Mutex<HashMap<String, watch::Receiver<Vec<StageStats>>>>>,
}

impl Insights {
    /// A channel for `job_id`'s engine to publish on.
    pub fn register(&self, job_id: &str) -> watch::Sender<Vec<StageStats>> {
        let (tx, rx) = watch::channel(Vec::new());
        self.jobs.lock().insert(job_id.to_string(), rx);
        tx
    }

    /// The latest snapshot of `job_id`'s stages, if it ever ran.
    pub fn stages(&self, job_id: &str) -> Option<Vec<StageStats>> {
        self.jobs.lock().get(job_id).map(|rx| rx.borrow().clone())
    }
}
