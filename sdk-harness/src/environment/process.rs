//! PROCESS environments: spawn the payload's boot command with the standard
//! endpoint flags and the payload's environment variables.

use prost::Message;
use refract_proto::pipeline::ProcessPayload;
use refract_proto::urns;
use tokio::process::Command;

use super::boot_flags;
use super::child::ChildWorker;
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
    ChildWorker::spawn(worker_id, command, None)
}
