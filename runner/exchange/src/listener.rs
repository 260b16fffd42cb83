//! An exchange server listening on a socket: the receiving side of a
//! process's shards, serving every session its [`ExchangeHost`] hosts,
//! with the pings of [`crate::connection`].

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::{debug, warn};

use crate::connection::server_builder;
use crate::error::ExchangeError;
use crate::server::ExchangeHost;

/// A running exchange server; it stops when stopped or dropped.
#[derive(Debug)]
pub struct ExchangeServer {
    addr: SocketAddr,
    host: ExchangeHost,
    stop: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl ExchangeServer {
    /// Listens on `listen` (`HOST:PORT`; port 0 picks a free one) and
    /// serves an empty host. In a Tokio runtime.
    pub async fn bind(listen: &str) -> Result<ExchangeServer, ExchangeError> {
        let failed = |source| ExchangeError::Listen {
            addr: listen.into(),
            source,
        };
        let listener = TcpListener::bind(listen).await.map_err(failed)?;
        let addr = listener.local_addr().map_err(failed)?;
        let host = ExchangeHost::default();
        let (stop, stopped) = oneshot::channel::<()>();
        let service = host.service();
        let server = tokio::spawn(async move {
            let served = server_builder()
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(error) = served {
                warn!(%error, "an exchange server stopped");
            }
        });
        debug!(%addr, "an exchange server listens");
        Ok(ExchangeServer {
            addr,
            host,
            stop: Some(stop),
            server: Some(server),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The sessions it serves.
    pub fn host(&self) -> &ExchangeHost {
        &self.host
    }

    /// Stops it once its streams ended (they end with their shards'
    /// ends), and waits until it did.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }
}

impl Drop for ExchangeServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
