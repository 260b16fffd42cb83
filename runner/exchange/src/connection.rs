//! How exchange connections are made, client and server side alike.
//!
//! **Pings.** Every connection sends HTTP/2 pings, and one whose ping is
//! not answered in time is closed. Its streams then fail, and with them
//! the runs of the shards on either side
//! ([`refract_engine::manager::EngineError::ExchangeLost`]), which the job
//! retries as it retries a lost worker. Without pings a peer whose host
//! went away, or whose link was cut, looks like a quiet one for as long as
//! TCP keeps the connection (hours): nothing fails, and the job waits on
//! it. With them a lost peer is noticed within [`DETECTION_BOUND`].
//!
//! **Windows.** What bounds the bytes in flight between two shards is the
//! exchange's own credit (`wire.rs`, at most [`crate::DEFAULT_WINDOW_BYTES`]
//! per stream): HTTP/2's flow-control windows are set above it, so that
//! they never hold a stream back first. At HTTP/2's default of 64 KiB a
//! sender waited a round trip every 64 KiB, and two shards on one machine
//! exchanged about 100 MiB/s instead of about 950 MiB/s
//! (`benches/exchange.rs`).

use std::net::SocketAddr;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint, Server};

use crate::error::ExchangeError;
use crate::wire::DEFAULT_WINDOW_BYTES;

/// How often an exchange connection pings its peer, busy or idle.
pub const PING_EVERY: Duration = Duration::from_secs(4);

/// How long a ping may go unanswered before the connection is closed.
pub const PING_TIMEOUT: Duration = Duration::from_secs(6);

/// The longest a lost peer goes unnoticed: a ping due, then its timeout.
pub const DETECTION_BOUND: Duration = PING_EVERY.saturating_add(PING_TIMEOUT);

/// HTTP/2's window per stream: twice the largest credit window.
const STREAM_WINDOW_BYTES: u32 = 2 * DEFAULT_WINDOW_BYTES as u32;

/// HTTP/2's window per connection, which the streams between two
/// processes share.
const CONNECTION_WINDOW_BYTES: u32 = 4 * STREAM_WINDOW_BYTES;

/// A channel to the exchange server at `addr`, connected on first use,
/// pinging its peer, with windows above the exchange's credit.
pub fn channel_to(addr: SocketAddr) -> Result<Channel, ExchangeError> {
    channel_to_address(&addr.to_string())
}

/// A lazily connecting channel to the exchange server at `address`
/// (`host:port`, a name the resolver knows or an IP address), with the
/// same pings and windows as [`channel_to`]: shards placed by Kubernetes
/// reach each other by their pods' names.
pub fn channel_to_address(address: &str) -> Result<Channel, ExchangeError> {
    let endpoint = Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| ExchangeError::Malformed(format!("an exchange address '{address}': {e}")))?;
    Ok(endpoint
        .tcp_nodelay(true)
        .http2_keep_alive_interval(PING_EVERY)
        .keep_alive_timeout(PING_TIMEOUT)
        .keep_alive_while_idle(true)
        .initial_stream_window_size(Some(STREAM_WINDOW_BYTES))
        .initial_connection_window_size(Some(CONNECTION_WINDOW_BYTES))
        .connect_lazy())
}

/// A server builder whose connections ping their peers, with windows
/// above the exchange's credit.
pub fn server_builder() -> Server {
    Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(PING_EVERY))
        .http2_keepalive_timeout(Some(PING_TIMEOUT))
        .initial_stream_window_size(Some(STREAM_WINDOW_BYTES))
        .initial_connection_window_size(Some(CONNECTION_WINDOW_BYTES))
}

// HTTP/2 never holds back what the exchange's credit lets go: checked
// when the crate compiles.
const _: () = assert!(STREAM_WINDOW_BYTES as usize >= DEFAULT_WINDOW_BYTES);
const _: () = assert!(CONNECTION_WINDOW_BYTES >= STREAM_WINDOW_BYTES);
