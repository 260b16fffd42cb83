//! [`PeerGate`]: closes connections that other users of this host open to
//! one of Refract's ports, as they are accepted.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::TcpListenerStream;

use crate::socket_table::{current_uid, owner_of_peer, tables_readable};

/// Which users of this host may connect to a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LocalPeers {
    /// The user who started the server, and root (who can read and trace
    /// the server's process anyway). The default: what a port of a
    /// server that runs user code as its user must allow.
    #[default]
    SameUser,
    /// Every user of the host, for servers shared on purpose (a Prometheus
    /// scraper or workers running as another user); say so at start.
    Anyone,
}

/// Why a connection was closed unread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Another user of this host opened it.
    OtherUser {
        /// The connecting socket's owner.
        uid: u32,
    },
    /// It comes from this host's loopback, and its socket is not in the
    /// host's tables (it closed already, or another namespace's loopback,
    /// which cannot reach ours): its owner is unknown, so it is refused.
    Unidentified,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::OtherUser { uid } => write!(f, "opened by another user (uid {uid})"),
            Refusal::Unidentified => f.write_str("its owner could not be found"),
        }
    }
}

/// Admits the connections to one port that [`LocalPeers`] allows.
///
/// Connections from other hosts are admitted: the socket tables only know
/// this host's sockets, and a service reachable from other hosts must
/// authenticate its callers itself.
#[derive(Debug, Clone)]
pub struct PeerGate {
    inner: Arc<GateInner>,
}

#[derive(Debug)]
struct GateInner {
    /// `None`: every local user is admitted.
    own_uid: Option<u32>,
    service: &'static str,
}

impl PeerGate {
    /// A gate for the port of `service` (its name in log lines). When the
    /// host's socket tables cannot be read, local users cannot be told
    /// apart: the gate then admits everyone and says so.
    pub fn new(policy: LocalPeers, service: &'static str) -> Self {
        let own_uid = match policy {
            LocalPeers::Anyone => None,
            LocalPeers::SameUser => match current_uid().filter(|_| tables_readable()) {
                Some(uid) => Some(uid),
                None => {
                    tracing::warn!(
                        service,
                        "cannot read this host's socket tables (/proc/net/tcp): every local \
                         user can connect"
                    );
                    None
                }
            },
        };
        PeerGate {
            inner: Arc::new(GateInner { own_uid, service }),
        }
    }

    /// Whether the connection from `peer` to this host's `server_port`
    /// may be served.
    pub fn check(&self, peer: SocketAddr, server_port: u16) -> Result<(), Refusal> {
        let Some(own) = self.inner.own_uid else {
            return Ok(());
        };
        match owner_of_peer(peer, server_port) {
            Some(uid) if uid == own || uid == 0 => Ok(()),
            Some(uid) => Err(Refusal::OtherUser { uid }),
            None if is_loopback(peer) => Err(Refusal::Unidentified),
            None => Ok(()),
        }
    }

    /// The connections `listener` accepts that this gate admits, with
    /// `TCP_NODELAY` set (small request/response round trips dominate a
    /// job's start). Refused ones are closed before a byte is read and
    /// logged; accept errors are passed on.
    pub fn admitted(
        &self,
        listener: TcpListener,
    ) -> impl Stream<Item = io::Result<TcpStream>> + Send + 'static {
        let gate = self.clone();
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        TcpListenerStream::new(listener).filter_map(move |conn| {
            let gate = gate.clone();
            async move {
                let stream = match conn {
                    Ok(stream) => stream,
                    Err(e) => return Some(Err(e)),
                };
                if let Err(error) = stream.set_nodelay(true) {
                    tracing::debug!(%error, "could not set TCP_NODELAY");
                }
                let peer = match stream.peer_addr() {
                    Ok(peer) => peer,
                    Err(error) => {
                        tracing::debug!(%error, "a connection closed as it was accepted");
                        return None;
                    }
                };
                match gate.check(peer, port) {
                    Ok(()) => Some(Ok(stream)),
                    Err(refusal) => {
                        tracing::warn!(
                            service = gate.inner.service,
                            %peer,
                            "closed a connection {refusal}: only this user may use this port \
                             (see `refract serve --help`, --local_peers)"
                        );
                        None
                    }
                }
            }
        })
    }
}

fn is_loopback(addr: SocketAddr) -> bool {
    match addr.ip() {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn this_users_connections_are_admitted() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
        let addr = listener.local_addr().expect("address");
        let gate = PeerGate::new(LocalPeers::SameUser, "test");
        let mut admitted = Box::pin(gate.admitted(listener));
        let _client = TcpStream::connect(addr).await.expect("connected");
        let stream = admitted.next().await.expect("a connection").expect("ok");
        assert!(stream.nodelay().expect("nodelay"));
    }

    #[test]
    fn a_loopback_peer_with_no_socket_is_refused_unless_anyone_may_connect() {
        // Nothing on this host has this address: no row, so no owner.
        let peer: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let same = PeerGate::new(LocalPeers::SameUser, "test");
        assert_eq!(same.check(peer, 2), Err(Refusal::Unidentified));
        let remote: SocketAddr = "192.0.2.7:40000".parse().expect("addr");
        assert_eq!(same.check(remote, 2), Ok(()));
        let anyone = PeerGate::new(LocalPeers::Anyone, "test");
        assert_eq!(anyone.check(peer, 2), Ok(()));
    }
}
