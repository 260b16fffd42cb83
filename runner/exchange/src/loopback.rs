//! The exchange of one job run whose shards all live in this process,
//! over gRPC on the loopback interface: every frame, credit, report and
//! note crosses a real connection, as between hosts, and the server
//! listens on 127.0.0.1 only, for one random session key.

use std::net::SocketAddr;
use std::sync::Arc;

use refract_engine::shards::{ShardLayout, ShardLink};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, warn};

use crate::error::ExchangeError;
use crate::server::ExchangeHost;
use crate::session::{CreditRoutes, HostedSession, LocalShard, SessionKey};
use crate::wire::{local_end, Routes};

/// Credit per stream unless told otherwise: what may be in flight from
/// one shard to another before its producers wait.
pub const DEFAULT_WINDOW_BYTES: usize = 4 << 20;

/// A running loopback exchange: its server stops, and its session is
/// forgotten, when it is dropped.
#[derive(Debug)]
pub struct LoopbackExchange {
    addr: SocketAddr,
    host: ExchangeHost,
    key: SessionKey,
    stop: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl LoopbackExchange {
    /// Starts a server on a free loopback port and joins every shard of
    /// `layout` through it, `window` bytes of credit per stream; returns
    /// it with the shards' links, in shard order. In a Tokio runtime.
    pub async fn start(
        layout: ShardLayout,
        window: usize,
    ) -> Result<(LoopbackExchange, Vec<ShardLink>), ExchangeError> {
        let listen = "127.0.0.1:0";
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ExchangeError::Listen {
                addr: listen.into(),
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ExchangeError::Listen {
                addr: listen.into(),
                source,
            })?;
        let host = ExchangeHost::default();
        let (stop, stopped) = oneshot::channel::<()>();
        let service = host.service();
        let server = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(error) = served {
                warn!(%error, "the loopback exchange's server stopped");
            }
        });
        let channel = channel_to(addr)?;
        let routes = Routes {
            shards: vec![channel.clone(); layout.shards() as usize],
            detector: channel,
        };
        let key = SessionKey::random()?;
        let mut ends = Vec::new();
        let mut local = Vec::new();
        let mut unopened = Vec::new();
        for id in layout.ids() {
            let credit = Arc::new(CreditRoutes::new(layout.shards() as usize));
            let (end, streams) = local_end(id, layout, &key, &routes, window, credit.clone());
            unopened.push(streams);
            local.push((
                id,
                LocalShard {
                    end: Arc::downgrade(&end),
                    credit,
                },
            ));
            ends.push(end);
        }
        host.insert(
            key.clone(),
            Arc::new(HostedSession::new(layout, local, true)),
        );
        for streams in unopened {
            streams.open();
        }
        debug!(%addr, shards = layout.shards(), "a loopback exchange started");
        let links = ends.iter().map(|end| end.link(layout)).collect();
        Ok((
            LoopbackExchange {
                addr,
                host,
                key,
                stop: Some(stop),
                server: Some(server),
            },
            links,
        ))
    }

    /// Where its server listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server once its streams ended (they end with their
    /// shards' ends, so drop the links first), and waits until it did.
    pub async fn stop(mut self) {
        self.host.remove(&self.key);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }
}

impl Drop for LoopbackExchange {
    fn drop(&mut self) {
        self.host.remove(&self.key);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A channel to the exchange server at `addr`, connected on first use.
fn channel_to(addr: SocketAddr) -> Result<Channel, ExchangeError> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| ExchangeError::Malformed(format!("an exchange address: {e}")))?;
    Ok(endpoint.tcp_nodelay(true).connect_lazy())
}
