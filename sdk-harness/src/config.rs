//! What the caller supplies to start a worker: its identity, environment,
//! provisioning and the hooks through which the worker's artifacts and logs
//! flow back to the job.

use std::path::PathBuf;
use std::sync::Arc;

use refract_proto::fn_api::{LogEntry, ProvisionInfo};
use refract_proto::pipeline::{ArtifactInformation, Environment};

use crate::error::HarnessError;

/// Everything needed to start one SDK harness worker.
pub struct WorkerConfig {
    /// Unique id of the worker; the SDK echoes it in the `worker_id` header of
    /// every call, which is how the shared server routes it, and the only
    /// credential Beam's SDKs send: make it with [`unguessable_worker_id`].
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

/// A worker id that starts with the readable `name` and ends in 128 bits
/// from the operating system's random source, in hex.
///
/// Whoever knows a worker's id can act as that worker on the Fn API: read
/// its pipeline options, its artifacts and its bundles' state, and return
/// output for its bundles. A readable id alone (`job-e0-w1`) is guessed by
/// anyone who knows the job's id.
pub fn unguessable_worker_id(name: &str) -> Result<String, HarnessError> {
    let mut secret = [0u8; 16];
    getrandom::fill(&mut secret).map_err(|e| HarnessError::WorkerStart {
        worker_id: name.to_string(),
        reason: format!("the operating system gave no random bytes for its id: {e}"),
    })?;
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{name}-{hex}"))
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

#[cfg(test)]
mod tests {
    use super::unguessable_worker_id;

    #[test]
    fn worker_ids_keep_their_name_and_differ_in_128_random_bits() {
        let a = unguessable_worker_id("job-e0-w1").unwrap();
        let b = unguessable_worker_id("job-e0-w1").unwrap();
        assert_ne!(a, b);
        let secret = a.strip_prefix("job-e0-w1-").unwrap();
        assert_eq!(secret.len(), 32);
        assert!(secret.bytes().all(|c| c.is_ascii_hexdigit()));
    }
}
