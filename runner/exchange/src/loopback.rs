//! The exchange of one job run whose shards all live in this process,
//! over gRPC on the loopback interface: every frame, credit, report and
//! note crosses a real connection, as between hosts, and the server
//! listens on 127.0.0.1 only, for one random session key.

use std::net::SocketAddr;

use refract_engine::shards::{ShardLayout, ShardLink};
use tracing::debug;

use crate::connection::channel_to;
use crate::error::ExchangeError;
use crate::join::{join_session, Joining};
use crate::listener::ExchangeServer;
use crate::session::SessionKey;
use crate::wire::Routes;

/// A running loopback exchange: its server stops, and its session is
/// forgotten, when it is dropped.
#[derive(Debug)]
pub struct LoopbackExchange {
    addr: SocketAddr,
    server: Option<ExchangeServer>,
    key: SessionKey,
}

impl LoopbackExchange {
    /// Starts a server on a free loopback port and joins every shard of
    /// `layout` through it, `window` bytes of credit per stream; returns
    /// it with the shards' links, in shard order. In a Tokio runtime.
    pub async fn start(
        layout: ShardLayout,
        window: usize,
    ) -> Result<(LoopbackExchange, Vec<ShardLink>), ExchangeError> {
        let server = ExchangeServer::bind("127.0.0.1:0").await?;
        let channel = channel_to(server.addr())?;
        let routes = Routes {
            shards: vec![channel.clone(); layout.shards() as usize],
            detector: channel,
        };
        let key = SessionKey::random()?;
        let local: Vec<_> = layout.ids().collect();
        let links = join_session(
            server.host(),
            Joining {
                key: &key,
                layout,
                local: &local,
                routes: &routes,
                window,
                detector: true,
            },
        );
        debug!(addr = %server.addr(), shards = layout.shards(), "a loopback exchange started");
        Ok((
            LoopbackExchange {
                addr: server.addr(),
                server: Some(server),
                key,
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
        if let Some(server) = self.server.take() {
            server.host().remove(&self.key);
            server.stop().await;
        }
    }
}

impl Drop for LoopbackExchange {
    fn drop(&mut self) {
        if let Some(server) = &self.server {
            server.host().remove(&self.key);
        }
    }
}
