//! What the caller supplies to start a worker: its identity, environment,
//! provisioning and the hooks through which the worker's artifacts and logs
//! flow back to the job.

use std::path::PathBuf;
use std::sync::Arc;

use refract_proto::fn_api::{LogEntry, ProvisionInfo};
use refract_proto::pipeline::{ArtifactInformation, Environment};

/// Everything needed to start one SDK harness worker.
pub struct WorkerConfig {
    /// Unique id of the worker; the SDK echoes it in the `worker_id` header of
    /// every call, which is how the shared server routes it.
    pub worker_id: String,
    /// The environment to start (EXTERNAL, PROCESS or DOCKER).
    pub environment: Environment,
    /// Provisioning for the worker. The caller fills pipeline options,
    /// dependencies, retrieval token and metadata; the server overwrites the
    /// control, logging and artifact endpoints with its own URL.
    pub provision: ProvisionInfo,
    /// Where the artifact service finds the files of this worker's dependencies.
    pub artifacts: Arc<dyn ArtifactSource>,
    /// Where the worker's log entries go (usually the job's message stream).
    pub logs: Arc<dyn LogSink>,
}

/// Locates staged artifacts on local disk, so the artifact retrieval service
/// can stream them to the worker's boot program.
pub trait ArtifactSource: Send + Sync {
    /// The file holding the artifact's bytes, or `None` if it is unknown.
    fn open(&self, artifact: &ArtifactInformation) -> Option<PathBuf>;
}

/// Receives log entries that a worker sends over the logging service, so they
/// can join the job's message stream.
pub trait LogSink: Send + Sync {
    /// Called once per entry, in arrival order per logging stream.
    fn log(&self, worker_id: &str, entry: LogEntry);
}

/// An [`ArtifactSource`] that knows no artifacts: for workers (LOOPBACK) that
/// never retrieve any.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoArtifacts;

impl ArtifactSource for NoArtifacts {
    fn open(&self, _artifact: &ArtifactInformation) -> Option<PathBuf> {
        None
    }
}

/// A [`LogSink`] that forwards entries to `tracing`, for callers without a
/// job message stream (tools, tests).
#[derive(Debug, Default, Clone, Copy)]
pub struct TracingLogSink;

impl LogSink for TracingLogSink {
    fn log(&self, worker_id: &str, entry: LogEntry) {
        tracing::info!(
            worker_id,
            severity = entry.severity,
            location = %entry.log_location,
            "{}",
            entry.message
        );
    }
}
