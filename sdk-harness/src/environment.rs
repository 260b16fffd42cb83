//! Starting and stopping SDK harness workers, per environment URN.

pub(crate) mod child;
mod docker;
mod external;
mod host_harness;
mod process;

use std::time::Duration;

use refract_proto::urns;
use tokio::sync::watch;

pub(crate) use child::ExitReport;
pub use host_harness::HostHarnesses;

use prost::Message;
use refract_proto::pipeline::{DockerPayload, Environment};

use crate::config::WorkerConfig;
use crate::error::HarnessError;
use crate::pool_token::PoolToken;

/// A started worker, as far as its environment is concerned.
pub(crate) enum Launched {
    /// Started through a worker pool (EXTERNAL, LOOPBACK).
    External(external::ExternalWorker),
    /// A process we spawned (PROCESS, or the `docker run` client for DOCKER).
    Child(Box<child::ChildWorker>),
}

impl Launched {
    /// Reports a process exit, for environments that have a process.
    pub(crate) fn exit_watch(&self) -> Option<watch::Receiver<Option<ExitReport>>> {
        match self {
            Launched::External(_) => None,
            Launched::Child(c) => Some(c.exit_watch()),
        }
    }

    /// Stops the worker: StopWorker for a pool, kill for a process.
    pub(crate) async fn stop(self) {
        match self {
            Launched::External(w) => w.stop().await,
            Launched::Child(c) => c.stop().await,
        }
    }
}

/// Starts the worker `cfg` describes, connecting to `url`. `timeout`
/// bounds the calls made here (not the wait for the connection); `hosts`
/// says how DOCKER environments run without a Docker engine; calls to a
/// worker pool carry `pool_token`.
pub(crate) async fn launch(
    cfg: &WorkerConfig,
    url: &str,
    timeout: Duration,
    hosts: &HostHarnesses,
    pool_token: Option<PoolToken>,
) -> Result<Launched, HarnessError> {
    let environment = &cfg.environment;
    let worker_id = cfg.worker_id.as_str();
    let urn = environment.urn.as_str();
    match urn {
        urns::env::EXTERNAL => {
            external::start(&environment.payload, worker_id, url, timeout, pool_token)
                .await
                .map(Launched::External)
        }
        urns::env::PROCESS => process::start(&environment.payload, worker_id, url)
            .map(|c| Launched::Child(Box::new(c))),
        urns::env::DOCKER => docker::start(cfg, url, hosts)
            .await
            .map(|c| Launched::Child(Box::new(c))),
        urns::env::EMBEDDED_PYTHON
        | urns::env::EMBEDDED_PYTHON_GRPC
        | urns::env::EMBEDDED_PYTHON_LOOPBACK => Err(HarnessError::EmbeddedEnvironment {
            urn: urn.to_string(),
        }),
        _ => Err(HarnessError::UnsupportedEnvironment {
            urn: urn.to_string(),
        }),
    }
}

/// One of Beam's SDKs, as far as choosing a worker pool that can run an
/// environment is concerned: a pool runs the harness of one SDK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BeamSdk {
    /// Beam's Python SDK.
    Python,
    /// Beam's Java SDK.
    Java,
    /// Beam's Go SDK.
    Go,
}

impl BeamSdk {
    /// The SDK's name as users write it (`python`, `java`, `go`).
    pub fn name(self) -> &'static str {
        match self {
            BeamSdk::Python => "python",
            BeamSdk::Java => "java",
            BeamSdk::Go => "go",
        }
    }

    /// The SDK `name` names (as [`Self::name`] writes it), if any.
    pub fn parse(name: &str) -> Option<BeamSdk> {
        match name {
            "python" => Some(BeamSdk::Python),
            "java" => Some(BeamSdk::Java),
            "go" => Some(BeamSdk::Go),
            _ => None,
        }
    }

    /// The SDK whose harness `environment` runs, when it says so: a DOCKER
    /// environment naming one of Beam's SDK images. PROCESS and EXTERNAL
    /// environments name a command or a pool, not an SDK.
    pub fn of_environment(environment: &Environment) -> Option<BeamSdk> {
        if environment.urn != urns::env::DOCKER {
            return None;
        }
        let payload = DockerPayload::decode(environment.payload.as_slice()).ok()?;
        match host_harness::SdkImage::parse(&payload.container_image)? {
            host_harness::SdkImage::Python { .. } => Some(BeamSdk::Python),
            host_harness::SdkImage::Java { .. } => Some(BeamSdk::Java),
            host_harness::SdkImage::Go => Some(BeamSdk::Go),
        }
    }
}

/// The standard flags a Beam boot program takes to find the runner.
pub(crate) fn boot_flags(worker_id: &str, url: &str) -> Vec<String> {
    vec![
        format!("--id={worker_id}"),
        format!("--provision_endpoint={url}"),
        format!("--logging_endpoint={url}"),
        format!("--artifact_endpoint={url}"),
        format!("--control_endpoint={url}"),
    ]
}
