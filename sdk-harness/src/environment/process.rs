//! PROCESS environments: spawn the payload's boot command with the standard
//! endpoint flags and the payload's environment variables.
//!
//! Each worker gets a private scratch directory, named to it in
//! `SEMI_PERSISTENT_DIRECTORY` (the variable Beam's boot programs hand the
//! harness for its staged files and pickled main session) unless the payload
//! names one itself; the directory is removed when the process has ended, so
//! boot commands that would otherwise make a temporary directory per worker
//! leave nothing behind.

use prost::Message;
use refract_proto::pipeline::ProcessPayload;
use refract_proto::urns;
use tokio::process::Command;

use super::boot_flags;
use super::child::{scratch_dir, ChildWorker};
use crate::error::HarnessError;

/// Spawns the worker process.
pub(crate) fn start(
    payload: &[u8],
    worker_id: &str,
    url: &str,
) -> Result<ChildWorker, HarnessError> {
    let payload = ProcessPayload::decode(payload).map_err(|e| HarnessError::InvalidPayload {
        urn: urns::env::PROCESS.to_string(),
        reason: e.to_string(),
    })?;
    if payload.command.is_empty() {
        return Err(HarnessError::InvalidPayload {
            urn: urns::env::PROCESS.to_string(),
            reason: "the payload has no command".to_string(),
        });
    }
    let mut command = Command::new(&payload.command);
    command.args(boot_flags(worker_id, url)).envs(&payload.env);
    tracing::info!(worker_id, command = %payload.command, "starting worker process");
    if payload.env.contains_key(SEMI_PERSISTENT_DIRECTORY) {
        return ChildWorker::spawn(worker_id, command, None);
    }
    let scratch = scratch_dir(worker_id).map_err(|e| HarnessError::WorkerStart {
        worker_id: worker_id.to_string(),
        reason: format!("cannot make a scratch directory: {e}"),
    })?;
    command.env(SEMI_PERSISTENT_DIRECTORY, &scratch);
    ChildWorker::spawn_with_scratch(worker_id, command, scratch)
}

/// The environment variable naming a worker's own directory for files it
/// keeps while it runs (Beam's boot programs set it for the SDK harness).
const SEMI_PERSISTENT_DIRECTORY: &str = "SEMI_PERSISTENT_DIRECTORY";
