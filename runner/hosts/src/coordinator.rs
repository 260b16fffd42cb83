//! The coordinator's listener for shard hosts: one port serving the
//! control plane (`ShardHosts`) and the exchange service, through which
//! the coordinator hosts each run's quiet detector. Hosts dial it with
//! `refract shard --coordinator ADDR`.

use std::net::SocketAddr;
use std::sync::Arc;

use refract_exchange::connection::server_builder;
use refract_exchange::server::ExchangeHost;
use refract_proto::hosts::shard_hosts_server::ShardHostsServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::{info, warn};

use crate::directory::HostDirectory;
use crate::error::HostsError;
use crate::secret::ClusterSecret;
use crate::service::HostsService;

/// The most a host's message to the coordinator may hold: reports carry
/// a run's metrics and messages, never elements.
const MAX_HOST_MESSAGE: usize = 16 << 20;

/// A coordinator's listener for shard hosts; stops when dropped.
#[derive(Debug)]
pub struct CoordinatorServer {
    addr: SocketAddr,
    directory: Arc<HostDirectory>,
    exchange: ExchangeHost,
    stop: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl CoordinatorServer {
    /// Listens on `listen` (`host:port`; port 0 picks one) for hosts that
    /// know `secret`. In a Tokio runtime.
    pub async fn bind(listen: &str, secret: ClusterSecret) -> Result<Self, HostsError> {
        let failed = |source| HostsError::Listen {
            addr: listen.into(),
            source,
        };
        let listener = TcpListener::bind(listen).await.map_err(failed)?;
        let addr = listener.local_addr().map_err(failed)?;
        let directory = HostDirectory::new(secret);
        let exchange = ExchangeHost::default();
        let hosts = ShardHostsServer::new(HostsService {
            directory: directory.clone(),
        })
        .max_decoding_message_size(MAX_HOST_MESSAGE);
        let exchange_service = exchange.service();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let served = server_builder()
                .add_service(hosts)
                .add_service(exchange_service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(error) = served {
                warn!(%error, "the coordinator's shard host listener stopped");
            }
        });
        info!(%addr, "listening for shard hosts");
        Ok(CoordinatorServer {
            addr,
            directory,
            exchange,
            stop: Some(stop),
            server: Some(server),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its hosts and runs.
    pub fn directory(&self) -> &Arc<HostDirectory> {
        &self.directory
    }

    /// The exchange sessions it hosts (each run's quiet detector).
    pub fn exchange(&self) -> &ExchangeHost {
        &self.exchange
    }

    /// Stops listening and waits until the server did.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }
}

impl Drop for CoordinatorServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
