//! How a process notices that a peer is gone: every exchange connection,
//! in both directions, sends HTTP/2 pings, and one whose ping is not
//! answered in time is closed. Its streams then fail, and with them the
//! runs of the shards on either side ([`refract_engine::manager::EngineError::ExchangeLost`]),
//! which the job retries as it retries a lost worker.
//!
//! Without pings a peer whose host went away, or whose link was cut,
//! looks like a quiet one for as long as TCP keeps the connection (hours):
//! nothing fails, and the job waits on it. With them a lost peer is
//! noticed within [`DETECTION_BOUND`].

use std::net::SocketAddr;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint, Server};

use crate::error::ExchangeError;

/// How often an exchange connection pings its peer, busy or idle.
pub const PING_EVERY: Duration = Duration::from_secs(4);

/// How long a ping may go unanswered before the connection is closed.
pub const PING_TIMEOUT: Duration = Duration::from_secs(6);

/// The longest a lost peer goes unnoticed: a ping due, then its timeout.
pub const DETECTION_BOUND: Duration = Duration::from_secs(10);

/// A channel to the exchange server at `addr`, connected on first use,
/// pinging its peer.
pub fn channel_to(addr: SocketAddr) -> Result<Channel, ExchangeError> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| ExchangeError::Malformed(format!("an exchange address: {e}")))?;
    Ok(endpoint
        .tcp_nodelay(true)
        .http2_keep_alive_interval(PING_EVERY)
        .keep_alive_timeout(PING_TIMEOUT)
        .keep_alive_while_idle(true)
        .connect_lazy())
}

/// A server builder whose connections ping their peers.
pub fn server_builder() -> Server {
    Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(PING_EVERY))
        .http2_keepalive_timeout(Some(PING_TIMEOUT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_peer_is_noticed_within_the_bound() {
        assert!(PING_EVERY + PING_TIMEOUT <= DETECTION_BOUND);
    }
}
