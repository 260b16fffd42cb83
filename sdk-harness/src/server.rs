//! The shared Fn API server: one port serving Control, Data, State, Logging,
//! Provision and ArtifactRetrieval for all workers of all jobs, plus worker
//! start-up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use refract_peercred::{LocalPeers, PeerGate};
use refract_proto::fn_api::beam_fn_control_server::BeamFnControlServer;
use refract_proto::fn_api::beam_fn_data_server::BeamFnDataServer;
use refract_proto::fn_api::beam_fn_logging_server::BeamFnLoggingServer;
use refract_proto::fn_api::beam_fn_state_server::BeamFnStateServer;
use refract_proto::fn_api::provision_service_server::ProvisionServiceServer;
use refract_proto::fn_api::ProcessBundleDescriptor;
use refract_proto::job_api::artifact_retrieval_service_server::ArtifactRetrievalServiceServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::service::interceptor::InterceptedService;

use crate::config::WorkerConfig;
use crate::endpoint::Endpoint;
use crate::environment::{self, ExitReport, HostHarnesses, Launched};
use crate::error::HarnessError;
use crate::hub::Hub;
use crate::link::{LinkStatus, WorkerLink};
use crate::pool_token::PoolToken;
use crate::services::{
    artifact::ArtifactService, caller::CallerCheck, control::ControlService, data::DataService,
    logging::LoggingService, provision::ProvisionServiceImpl, state::StateService,
};
use crate::worker::Worker;

/// Default wait for a new worker's control stream. Boot programs may install
/// packages or pull images first, so this is generous.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(180);

/// Largest GetProvisionInfo request read (the message has no fields).
const PROVISION_REQUEST_BYTES: usize = 64 << 10;
/// Largest ResolveArtifacts or GetArtifact request read: a list of an
/// environment's dependencies, which may embed small files.
const ARTIFACT_REQUEST_BYTES: usize = 16 << 20;

/// HTTP/2 flow-control windows: bundles move megabytes per message.
const STREAM_WINDOW_BYTES: u32 = 16 << 20;
const CONNECTION_WINDOW_BYTES: u32 = 64 << 20;

/// The runner's Fn API endpoint, shared by every worker of every job.
pub struct FnApiServer {
    /// Shared with every worker started here: serving stops when the
    /// server and all of them are gone.
    endpoint: Arc<Endpoint>,
    url: String,
    connect_timeout_ms: AtomicU64,
    /// How DOCKER environments run when no Docker engine is reachable.
    host_harnesses: parking_lot::RwLock<Arc<HostHarnesses>>,
    /// What StartWorker and StopWorker calls to worker pools carry.
    pool_token: parking_lot::RwLock<Option<PoolToken>>,
}

/// Default for [`FnApiServer::start_with`]'s liveness bound.
///
/// A worker on a host that died or was cut off from the network answers
/// no ping; this bounds how long its bundles wait before they are retried
/// elsewhere.
pub const DEFAULT_WORKER_LIVENESS_TIMEOUT: Duration = Duration::from_secs(12);

impl FnApiServer {
    /// [`Self::start_with`] on any free port of `bind_host`, with
    /// [`DEFAULT_WORKER_LIVENESS_TIMEOUT`], for this user's processes only.
    pub async fn start(bind_host: &str) -> Result<Arc<FnApiServer>, HarnessError> {
        Self::start_with(
            bind_host,
            0,
            DEFAULT_WORKER_LIVENESS_TIMEOUT,
            LocalPeers::SameUser,
        )
        .await
    }

    /// Binds `bind_host:port` (port 0: any free one) and serves all Fn API
    /// services there, with unlimited message sizes on the streams (SDKs
    /// send unlimited ones) and small ones on the unary calls.
    ///
    /// Connections of other users of this host are closed as they are
    /// accepted unless `local_peers` admits them ([`PeerGate`]); every call
    /// must then name a worker this server started in its `worker_id`
    /// header before its body is read.
    ///
    /// Workers are told to connect to the address bound, or, when
    /// `bind_host` is a DNS name other than `localhost`, to that name and
    /// the port: a worker on another host resolves the name the operator
    /// chose, which a pod or VM address may not be.
    ///
    /// Every connection is pinged (HTTP/2 PING) once it has been quiet for
    /// half of `liveness`, and closed when a ping is not answered within
    /// the other half: a worker that stopped (SIGSTOP, a hung process, a
    /// host cut off) answers no ping even though its socket looks open, and
    /// closing the connection fails its streams, so its bundles fail and
    /// are retried on another worker instead of waiting forever.
    pub async fn start_with(
        bind_host: &str,
        port: u16,
        liveness: Duration,
        local_peers: LocalPeers,
    ) -> Result<Arc<FnApiServer>, HarnessError> {
        let ping_every = (liveness / 2).max(Duration::from_millis(100));
        let bind_error = |source| HarnessError::Bind {
            host: bind_host.to_string(),
            source,
        };
        let listener = TcpListener::bind((bind_host, port))
            .await
            .map_err(bind_error)?;
        let bound = listener.local_addr().map_err(bind_error)?;
        let url = advertised_url(bind_host, bound);
        let hub = Arc::new(Hub::default());
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let strict = || CallerCheck::strict(Arc::clone(&hub));
        let router = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(ping_every))
            .http2_keepalive_timeout(Some(ping_every))
            .initial_stream_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            .add_service(InterceptedService::new(
                BeamFnControlServer::new(ControlService::new(Arc::clone(&hub)))
                    .max_decoding_message_size(usize::MAX)
                    .max_encoding_message_size(usize::MAX),
                CallerCheck::headerless_on_loopback(Arc::clone(&hub)),
            ))
            .add_service(InterceptedService::new(
                BeamFnDataServer::new(DataService::new(Arc::clone(&hub)))
                    .max_decoding_message_size(usize::MAX)
                    .max_encoding_message_size(usize::MAX),
                strict(),
            ))
            .add_service(InterceptedService::new(
                BeamFnStateServer::new(StateService::new(Arc::clone(&hub)))
                    .max_decoding_message_size(usize::MAX)
                    .max_encoding_message_size(usize::MAX),
                strict(),
            ))
            .add_service(InterceptedService::new(
                BeamFnLoggingServer::new(LoggingService::new(Arc::clone(&hub)))
                    .max_decoding_message_size(usize::MAX)
                    .max_encoding_message_size(usize::MAX),
                strict(),
            ))
            .add_service(InterceptedService::new(
                ProvisionServiceServer::new(ProvisionServiceImpl::new(Arc::clone(&hub)))
                    .max_decoding_message_size(PROVISION_REQUEST_BYTES)
                    .max_encoding_message_size(usize::MAX),
                strict(),
            ))
            .add_service(InterceptedService::new(
                ArtifactRetrievalServiceServer::new(ArtifactService::new(Arc::clone(&hub)))
                    .max_decoding_message_size(ARTIFACT_REQUEST_BYTES)
                    .max_encoding_message_size(usize::MAX),
                strict(),
            ));
        let serve_url = url.clone();
        let incoming = PeerGate::new(local_peers, "Fn API").admitted(listener);
        tokio::spawn(async move {
            let stopped = async {
                let _ = shutdown_rx.await;
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, stopped).await {
                tracing::error!(url = %serve_url, error = %e, "Fn API server failed");
            }
        });
        tracing::info!(%url, "Fn API server listening");
        Ok(Arc::new(FnApiServer {
            endpoint: Arc::new(Endpoint::new(hub, shutdown_tx)),
            url,
            connect_timeout_ms: AtomicU64::new(millis(DEFAULT_CONNECT_TIMEOUT)),
            host_harnesses: parking_lot::RwLock::new(Arc::default()),
            pool_token: parking_lot::RwLock::new(None),
        }))
    }

    /// `host:port` of the server, for every ApiServiceDescriptor we hand out.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Makes a bundle descriptor available to GetProcessBundleDescriptor.
    /// Ids must be globally unique: SDKs cache descriptors by id forever.
    pub fn register_descriptor(&self, d: ProcessBundleDescriptor) {
        self.endpoint.hub().register_descriptor(d);
    }

    /// Frees a descriptor once no worker can ask for it again (its job ended).
    pub fn forget_descriptor(&self, id: &str) {
        self.endpoint.hub().forget_descriptor(id);
    }

    /// Sets how long `start_worker` waits for a worker's control stream.
    pub fn set_connect_timeout(&self, timeout: Duration) {
        self.connect_timeout_ms
            .store(millis(timeout), Ordering::Relaxed);
    }

    /// Sets how DOCKER environments naming Beam's SDK images run when no
    /// Docker engine is reachable (see [`HostHarnesses`]).
    pub fn set_host_harnesses(&self, hosts: HostHarnesses) {
        *self.host_harnesses.write() = Arc::new(hosts);
    }

    /// Sends `token` with every call to a worker pool (Refract's pools
    /// given the same token refuse calls without it; Beam's ignore it).
    pub fn set_pool_token(&self, token: Option<PoolToken>) {
        *self.pool_token.write() = token;
    }

    fn host_harnesses(&self) -> Arc<HostHarnesses> {
        self.host_harnesses.read().clone()
    }

    fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms.load(Ordering::Relaxed))
    }

    /// Starts one worker for an environment and waits until its control
    /// stream is connected, so that bundles can be sent to it.
    pub async fn start_worker(&self, cfg: WorkerConfig) -> Result<Arc<Worker>, HarnessError> {
        let timeout = self.connect_timeout();
        let link = WorkerLink::new(&cfg, &self.url);
        self.endpoint.hub().add(Arc::clone(&link))?;
        let token = self.pool_token.read().clone();
        let launched = match environment::launch(
            &cfg,
            &self.url,
            timeout,
            &self.host_harnesses(),
            token,
        )
        .await
        {
            Ok(launched) => launched,
            Err(e) => {
                self.abandon(&link, &e);
                return Err(e);
            }
        };
        if let Err(e) = wait_connected(&link, &launched, &self.url, timeout).await {
            self.abandon(&link, &e);
            launched.stop().await;
            return Err(e);
        }
        tracing::info!(worker_id = %cfg.worker_id, urn = %cfg.environment.urn, "worker connected");
        Ok(Arc::new(Worker::new(
            Arc::clone(&self.endpoint),
            link,
            launched,
        )))
    }

    fn abandon(&self, link: &Arc<WorkerLink>, error: &HarnessError) {
        link.close(&error.to_string());
        self.endpoint.hub().remove(link);
    }
}

/// What workers are told to connect to: the bound address, unless the
/// server was bound by a DNS name (not `localhost`), which is kept.
fn advertised_url(bind_host: &str, bound: std::net::SocketAddr) -> String {
    let is_name = bind_host.parse::<std::net::IpAddr>().is_err()
        && !bind_host.eq_ignore_ascii_case("localhost");
    if is_name {
        format!("{bind_host}:{}", bound.port())
    } else {
        bound.to_string()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Waits for the control stream, a process exit or the timeout, whichever
/// comes first.
async fn wait_connected(
    link: &WorkerLink,
    launched: &Launched,
    url: &str,
    timeout: Duration,
) -> Result<(), HarnessError> {
    let worker_id = link.id().to_string();
    let mut status = link.subscribe();
    let connected = async {
        loop {
            let current = status.borrow_and_update().clone();
            if current != LinkStatus::Waiting {
                return current;
            }
            if status.changed().await.is_err() {
                return LinkStatus::Closed("the worker link was dropped".to_string());
            }
        }
    };
    let exit_watch = launched.exit_watch();
    let exited = async move {
        let Some(mut exit) = exit_watch else {
            return std::future::pending::<ExitReport>().await;
        };
        loop {
            if let Some(report) = exit.borrow_and_update().clone() {
                return report;
            }
            if exit.changed().await.is_err() {
                return std::future::pending::<ExitReport>().await;
            }
        }
    };
    tokio::select! {
        status = connected => match status {
            LinkStatus::Connected | LinkStatus::Waiting => Ok(()),
            LinkStatus::Closed(reason) => Err(HarnessError::StartupDisconnect { worker_id, reason }),
        },
        report = exited => Err(HarnessError::WorkerExited {
            worker_id,
            status: report.status,
            stderr_tail: report.stderr_tail,
        }),
        _ = tokio::time::sleep(timeout) => Err(HarnessError::ConnectTimeout {
            worker_id,
            url: url.to_string(),
            waited: timeout,
            hint: match launched {
                // A pool's worker may run on another host.
                Launched::External(_) => " (the worker pool started it: can the pool's host reach \
                    that address? --fn_api_host sets it)"
                    .to_string(),
                Launched::Child(_) => String::new(),
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::advertised_url;

    #[test]
    fn workers_are_told_the_bound_address_or_the_name_chosen() {
        let bound: std::net::SocketAddr = "10.1.2.3:4567".parse().unwrap();
        assert_eq!(advertised_url("10.1.2.3", bound), "10.1.2.3:4567");
        assert_eq!(advertised_url("0.0.0.0", bound), "10.1.2.3:4567");
        assert_eq!(advertised_url("localhost", bound), "10.1.2.3:4567");
        assert_eq!(
            advertised_url("refract.jobs.svc", bound),
            "refract.jobs.svc:4567"
        );
        let v6: std::net::SocketAddr = "[fd00::1]:80".parse().unwrap();
        assert_eq!(advertised_url("fd00::1", v6), "[fd00::1]:80");
    }
}
