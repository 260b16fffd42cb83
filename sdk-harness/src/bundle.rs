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
    /// Where the bundle's output goes once more of it waits than may stay
    /// in memory; `None` keeps it all in memory.
    pub overflow: Option<Arc<dyn OutputSpill>>,
}

/// Takes the part of a bundle's output that does not fit in memory.
///
/// A bundle's output can only be handed on once the bundle succeeds, and
/// one element of a DoFn that emits far more than it reads cannot be
/// split: without somewhere else to put it, its whole output would wait in
/// memory. The runner implements it over its spill space.
pub trait OutputSpill: Send + Sync {
    /// Bytes of output (all sinks together) a bundle keeps in memory before
    /// it writes what it holds here.
    fn memory_limit(&self) -> usize;
    /// Keeps `bytes`, the next part of `sink`'s output stream (not cut at
    /// element boundaries), out of memory. The parts of a sink written
    /// here come before what the bundle's result still holds for it.
    fn write(&self, sink: &str, bytes: Vec<u8>) -> Result<(), String>;
}

/// One sink's output as it arrived: the bytes of its Data messages, in
/// order, each kept as it was received. Copying them into one buffer would
/// copy every output byte once more and, growing by doubling, hold up to
/// three times a big bundle's output at once (a 150 MB output held 256 MB
/// and briefly 384 MB). An element may span two chunks: only the whole
/// sequence is sure to decode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputChunks {
    /// None of them empty.
    chunks: Vec<Bytes>,
}

impl OutputChunks {
    /// Appends the next chunk (an empty one is dropped).
    pub fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.chunks.push(chunk);
        }
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// All chunks' bytes, copied into one buffer.
    fn joined(chunks: &[Bytes]) -> Vec<u8> {
        let mut all = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
        for chunk in chunks {
            all.extend_from_slice(chunk);
        }
        all
    }

    /// The chunks, in order.
    pub fn into_chunks(self) -> Vec<Bytes> {
        self.chunks
    }

    /// All bytes in one buffer: the only chunk as it is, several copied
    /// together (for small outputs, and for tests).
    pub fn concat(&self) -> Bytes {
        match self.chunks.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => Bytes::from(Self::joined(many)),
        }
    }

    /// All bytes in one buffer, leaving none here (the only chunk's own
    /// buffer when it holds the only reference to it).
    pub(crate) fn take_concat(&mut self) -> Vec<u8> {
        let mut taken = std::mem::take(self);
        if taken.chunks.len() == 1 {
            if let Some(only) = taken.chunks.pop() {
                return Vec::from(only);
            }
        }
        Self::joined(&taken.chunks)
    }
}

/// What a successful bundle produced.
#[derive(Debug, Clone, Default)]
pub struct BundleResult {
    /// The SDK's response (residuals, metrics, finalization flag).
    pub response: ProcessBundleResponse,
    /// Per sink transform id: its output — or, if some went to the
    /// request's [`OutputSpill`], what came after that.
    pub outputs: HashMap<String, OutputChunks>,
    /// Per `(transform_id, timer_family_id)`: all output timers concatenated.
    pub timers: HashMap<(String, String), Bytes>,
}
