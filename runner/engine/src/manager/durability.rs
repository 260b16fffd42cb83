//! What makes a run outlive its process and its memory: where checkpoints
//! and savepoints go, the extra parts they carry for the engine's owner,
//! and the stores state may move to (the scratch spill space, and the
//! durable spill space beside the checkpoints).

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::checkpointing::CheckpointSink;
use super::{EpochRequest, ExtraPart, SavepointRequest};
use crate::spill::SpillSpace;

/// The engine's durable side, each part optional (see
/// [`super::EngineBuilder`]).
#[derive(Default)]
pub(super) struct Durability {
    /// Where checkpoints go, and how often.
    pub(super) checkpoints: Option<CheckpointSink>,
    /// Requests for a checkpoint now (savepoints); the run loop takes it.
    pub(super) savepoints: Option<mpsc::Receiver<SavepointRequest>>,
    /// On a shard: requests for an epoch now (savepoints of the job); the
    /// run loop takes it.
    pub(super) epoch_requests: Option<mpsc::Receiver<EpochRequest>>,
    /// Parts checkpoints carry for the engine's owner, by name.
    pub(super) extra_parts: Vec<(String, ExtraPart)>,
    /// The spill space and the job's space in it, once spilling is on:
    /// bundles read the iterables GroupByKeys hand out from there.
    pub(super) spill_space: Option<(Arc<dyn SpillSpace>, Bytes)>,
    /// Where stateful stages' bags spill if not to the spill space: one
    /// that lasts as long as the checkpoints naming what is in it.
    pub(super) durable_state: Option<Arc<dyn SpillSpace>>,
}

impl Durability {
    /// Whether stateful stages' bags may move to disk: always to a durable
    /// store, which checkpoints name; to the spill space in batch, and in
    /// streaming jobs that take no periodic checkpoints. A checkpointed
    /// streaming job without a durable spill space keeps its bags in memory,
    /// since their state may never leave the disk again and no checkpoint
    /// would be taken while it is there.
    pub(super) fn bags_may_spill(&self, streaming: bool) -> bool {
        self.durable_state.is_some() || !streaming || self.checkpoints.is_none()
    }
}
