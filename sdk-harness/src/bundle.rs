//! The engine-facing description of one bundle: what goes in, what comes out,
//! and who answers its state requests.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use refract_proto::fn_api::{ProcessBundleResponse, StateRequest, StateResponse};

/// Answers the SDK's state requests for one bundle. The engine implements it
/// (with its tentative, per-bundle state overlay).
///
/// Called synchronously, on a blocking thread, in the order the SDK sent the
/// requests: appends and clears are pipelined by the SDK, so order matters.
pub trait StateHandler: Send + Sync {
    /// Produces the response to one request. If the response's `id` is empty
    /// the harness fills in the request's id.
    fn handle(&self, request: &StateRequest) -> StateResponse;
}

/// One bundle to run on a worker.
pub struct BundleRequest {
    /// Unique instruction id; never reuse one (the SDK remembers old ids).
    pub instruction_id: String,
    /// Id of a descriptor registered with `FnApiServer::register_descriptor`.
    pub descriptor_id: String,
    /// Per data-source transform id: chunks of whole encoded elements. Each
    /// chunk is sent as its own Data entry (never split), then one empty
    /// `is_last` per source, even for sources with no chunks.
    pub inputs: Vec<(String, Vec<Bytes>)>,
    /// `(transform_id, timer_family_id, concatenated encoded timers)` to deliver.
    pub timers: Vec<(String, String, Bytes)>,
    /// Sink transform ids whose `is_last` the bundle waits for.
    pub expected_sinks: Vec<String>,
    /// `(transform_id, timer_family_id)` pairs the SDK will close; each also
    /// gets an inbound `is_last` from us, even with no timers.
    pub expected_timer_families: Vec<(String, String)>,
    /// Answers the bundle's state requests.
    pub state: Arc<dyn StateHandler>,
}

/// What a successful bundle produced.
#[derive(Debug, Clone, Default)]
pub struct BundleResult {
    /// The SDK's response (residuals, metrics, finalization flag).
    pub response: ProcessBundleResponse,
    /// Per sink transform id: all output bytes concatenated (elements may span
    /// Data messages, so only the whole is decodable).
    pub outputs: HashMap<String, Bytes>,
    /// Per `(transform_id, timer_family_id)`: all output timers concatenated.
    pub timers: HashMap<(String, String), Bytes>,
}
