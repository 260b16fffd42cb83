//! The running Fn API endpoint: the registry its gRPC services route
//! through, and the signal that stops it serving.
//!
//! [`crate::FnApiServer`] and every [`crate::Worker`] it started hold the
//! endpoint, so the port keeps serving until the server and all of its
//! workers are gone: a worker the runner still holds keeps its streams even
//! if the server handle was dropped first.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::hub::Hub;

/// The shared part of a started server: what its workers need from it.
pub(crate) struct Endpoint {
    hub: Arc<Hub>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Endpoint {
    /// An endpoint whose services route through `hub`, and which stops
    /// serving by sending on `shutdown` when the last holder drops it.
    pub(crate) fn new(hub: Arc<Hub>, shutdown: oneshot::Sender<()>) -> Self {
        Endpoint {
            hub,
            shutdown: Some(shutdown),
        }
    }

    /// The workers and descriptors the services route calls to.
    pub(crate) fn hub(&self) -> &Hub {
        &self.hub
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot::error::TryRecvError;

    use super::*;

    #[test]
    fn serving_stops_only_when_the_last_holder_is_gone() {
        let (tx, mut stopped) = oneshot::channel();
        let server = Arc::new(Endpoint::new(Arc::default(), tx));
        let worker = Arc::clone(&server);
        drop(server);
        assert_eq!(stopped.try_recv(), Err(TryRecvError::Empty));
        drop(worker);
        assert_eq!(stopped.try_recv(), Ok(()));
    }
}
