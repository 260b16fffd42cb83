//! DOCKER environments: `docker run --network=host` the payload's image with
//! the standard endpoint flags, after checking that an engine is reachable;
//! without one, Beam's own SDK images run as local processes
//! ([`super::host_harness`]).

use std::process::Stdio;
use std::time::Duration;

use prost::Message;
use refract_proto::pipeline::DockerPayload;
use refract_proto::urns;
use tokio::process::Command;

use super::boot_flags;
use super::child::ChildWorker;
use super::host_harness::{self, HostHarnesses, SdkImage};
use crate::config::WorkerConfig;
use crate::error::HarnessError;

/// How long `docker info` may take to prove an engine is there.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Starts the container, attached, so its exit is the process's exit.
pub(crate) async fn start(
    cfg: &WorkerConfig,
    url: &str,
    hosts: &HostHarnesses,
) -> Result<ChildWorker, HarnessError> {
    let worker_id = cfg.worker_id.as_str();
    let payload = DockerPayload::decode(cfg.environment.payload.as_slice()).map_err(|e| {
        HarnessError::InvalidPayload {
            urn: urns::env::DOCKER.to_string(),
            reason: e.to_string(),
        }
    })?;
    if payload.container_image.is_empty() {
        return Err(HarnessError::InvalidPayload {
            urn: urns::env::DOCKER.to_string(),
            reason: "the payload names no container image".to_string(),
        });
    }
    if !engine_reachable().await {
        return match SdkImage::parse(&payload.container_image) {
            Some(image) if hosts.enabled => host_harness::start(&image, hosts, cfg, url).await,
            _ => Err(HarnessError::DockerUnavailable),
        };
    }
    let name = container_name(worker_id);
    let mut command = Command::new("docker");
    command
        .args(["run", "--rm", "--network=host"])
        .arg(format!("--name={name}"))
        .arg(&payload.container_image)
        .args(boot_flags(worker_id, url));
    let mut cleanup = Command::new("docker");
    cleanup.args(["kill", &name]);
    tracing::info!(worker_id, image = %payload.container_image, container = %name, "starting worker container");
    ChildWorker::spawn(worker_id, command, Some(cleanup))
}

/// Whether `docker info` succeeds (a client without an engine fails it).
async fn engine_reachable() -> bool {
    let probe = Command::new("docker")
        .arg("info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .status();
    match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(Ok(status)) => status.success(),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "cannot run docker");
            false
        }
        Err(_) => {
            tracing::debug!("docker info timed out");
            false
        }
    }
}

/// A container name derived from the worker id, restricted to the characters
/// Docker accepts.
fn container_name(worker_id: &str) -> String {
    let cleaned: String = worker_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("refract-{cleaned}-{}", uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use super::container_name;

    #[test]
    fn container_names_are_docker_safe() {
        let name = container_name("job 1/worker:2");
        assert!(name.starts_with("refract-job-1-worker-2-"));
        assert!(name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)));
    }
}
