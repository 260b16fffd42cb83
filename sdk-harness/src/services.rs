//! The gRPC services of the shared Fn API server. Each one routes every call
//! to a worker through the `worker_id` header (see [`crate::hub::Hub`]),
//! checked before the call's body is read ([`caller::CallerCheck`]).

pub(crate) mod artifact;
pub(crate) mod caller;
pub(crate) mod control;
pub(crate) mod data;
pub(crate) mod logging;
pub(crate) mod provision;
pub(crate) mod state;

use std::pin::Pin;

use futures::Stream;
use tonic::Status;

/// The boxed response stream type every streaming service returns.
pub(crate) type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Why a worker's `stream` ("control" or "data") ended without an error:
/// from here a worker that closed it cleanly and one whose connection
/// stopped answering keepalive pings (a stopped or cut-off process) look
/// the same, and whichever of its streams ends first names the failure of
/// its bundles.
pub(crate) fn stream_ended(stream: &str, worker: &str) -> String {
    format!(
        "the {stream} stream of worker {worker} ended: the worker closed it, or it stopped \
         answering keepalive pings and was declared lost"
    )
}
