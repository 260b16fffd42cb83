//! The seam between the job service and execution.

use std::sync::Arc;

use futures::future::BoxFuture;
use refract_proto::{pipeline::Pipeline, prost_types};

use crate::Job;

/// Why a job was not moved onto another number of shards; it runs on as
/// it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RescaleError {
    /// The request itself is wrong (a number of shards out of range).
    #[error("{0}")]
    Invalid(String),
    /// This job cannot move now (not running, not on a server that keeps
    /// what moving needs, already on that many shards).
    #[error("{0}")]
    Refused(String),
}

/// Implemented by the runner: the job service handles the Job API and calls
/// into this trait for everything that needs knowledge of execution.
pub trait JobRunner: Send + Sync + 'static {
    /// Called in Prepare, so unsupported pipelines are rejected before the
    /// client stages artifacts. `Err(text)` makes Prepare fail with
    /// `INVALID_ARGUMENT` carrying that text, which the Python SDK raises
    /// from `pipeline.run()`; make it name what is unsupported and where
    /// (e.g. `unsupported transform URN beam:transform:foo:v1 (transform 'X')`).
    /// Runs on a blocking thread, so it may take a while on large pipelines.
    fn validate(&self, pipeline: &Pipeline, options: &prost_types::Struct) -> Result<(), String>;

    /// Called in Prepare after [`Self::validate`], with every job that has
    /// not ended: the one this submission replaces (Dataflow's `--update`
    /// of the running job of its `--job_name`), once the runner found the
    /// new pipeline able to take over what it holds; `None` for a plain
    /// submission. `Err(text)` refuses the submission, and the running job
    /// runs on. No runner updates jobs by default.
    fn replaced_job(
        &self,
        _live: &[Arc<Job>],
        _pipeline: &Pipeline,
        _options: &prost_types::Struct,
    ) -> Result<Option<Arc<Job>>, String> {
        Ok(None)
    }

    /// Called in Run after the job moved to `STARTING`; must return promptly
    /// (spawn the work) because Run answers only after it returns. The runner
    /// then drives the job through [`Job`]'s methods: `set_state(RUNNING)`,
    /// `message`, `metrics().commit`, and finally `set_state(DONE)`,
    /// `fail(text)`, or `set_state(CANCELLED)` after a cancel request.
    fn start(&self, job: Arc<Job>);

    /// Whether a failed `job` can start again from its latest checkpoint
    /// (its record and checkpoints are kept): then `ResumeJob` (or `Run`
    /// of its id) gives a fresh [`Job`] under the same id to
    /// [`Self::start`]. No runner resumes by default.
    fn resumable(&self, _job: &Job) -> bool {
        false
    }

    /// An ended job is deleted (`DeleteJob`): forget everything kept for
    /// it, durably or in memory. `Err(text)` keeps it, and the call fails
    /// with that text.
    fn delete(&self, _job: &Job) -> Result<(), String> {
        Ok(())
    }

    /// An ended job left memory (retention): drop what is kept in memory
    /// for it. Nothing durable changes.
    fn evicted(&self, _job: &Job) {}

    /// What the runner knows of a job beyond its state, for `DescribeJob`:
    /// it fills `description.durable`, `resumable` and `checkpoints`.
    fn describe(&self, _job: &Job, _description: &mut refract_proto::admin::JobDescription) {}

    /// Whether jobs are kept durably (for `GetServerInfo`).
    fn durable(&self) -> bool {
        false
    }

    /// The remote worker pools, for `ListPools`; none by default.
    fn pools(&self) -> Vec<refract_proto::admin::WorkerPool> {
        Vec::new()
    }

    /// Adds worker pools written `spec` (`AddPool`); `Err(text)` fails
    /// the call with `INVALID_ARGUMENT` and that text.
    fn add_pool(&self, spec: &str) -> Result<(), String> {
        Err(format!(
            "cannot add worker pool {spec:?}: this server runs no remote workers"
        ))
    }

    /// Removes the pools written `spec` (`RemovePool`); whether they were
    /// known.
    fn remove_pool(&self, _spec: &str) -> bool {
        false
    }

    /// Moves running `job` onto `shards` engine shards (`RescaleJob`):
    /// once it runs on them, the number it ran on before. No runner
    /// rescales by default.
    fn rescale(
        &self,
        _job: Arc<Job>,
        _shards: u32,
    ) -> BoxFuture<'static, Result<u32, RescaleError>> {
        Box::pin(async {
            Err(RescaleError::Refused(
                "this server does not move jobs between shards".into(),
            ))
        })
    }
}
