//! The caller check every Fn API call passes before its handler runs and
//! before its body is read: a gRPC interceptor sees only the call's
//! headers, so a caller that names no worker of this server is turned away
//! without the server reading, let alone buffering, what it sent.

use std::sync::Arc;

use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::hub::{Hub, WORKER_ID_HEADER};

/// Admits calls whose `worker_id` header names a worker this server
/// started (the header is the worker's credential: ids carry secret random
/// bits, see `WorkerConfig::worker_id`).
#[derive(Clone)]
pub(crate) struct CallerCheck {
    hub: Arc<Hub>,
    /// Whether a call with no header at all is let through when it comes
    /// over loopback: the TypeScript SDK asks for bundle descriptors
    /// without one. Loopback connections passed the port's user gate, so
    /// such a caller is this user's own process.
    headerless_on_loopback: bool,
}

impl CallerCheck {
    /// A check that requires the header on every call.
    pub(crate) fn strict(hub: Arc<Hub>) -> Self {
        CallerCheck {
            hub,
            headerless_on_loopback: false,
        }
    }

    /// A check that lets headerless loopback calls through to the handler,
    /// which decides what they may have.
    pub(crate) fn headerless_on_loopback(hub: Arc<Hub>) -> Self {
        CallerCheck {
            hub,
            headerless_on_loopback: true,
        }
    }
}

impl Interceptor for CallerCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let headerless = request.metadata().get(WORKER_ID_HEADER).is_none();
        let on_loopback = request
            .remote_addr()
            .is_some_and(|peer| peer.ip().is_loopback() || is_mapped_loopback(peer.ip()));
        if headerless && self.headerless_on_loopback && on_loopback {
            return Ok(request);
        }
        self.hub.link_for(&request)?;
        Ok(request)
    }
}

fn is_mapped_loopback(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        std::net::IpAddr::V4(_) => false,
    }
}
