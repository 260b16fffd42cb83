//! The gRPC services of the shared Fn API server. Each one routes every call
//! to a worker through the `worker_id` header (see [`crate::hub::Hub`]).

pub(crate) mod artifact;
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
