//! How a grouping buffer uses its spill space: what the engine asks of a
//! spilling GroupByKey, answered by [`BufferSpill`], which the buffer hands
//! its memory to (see `spill` for the interface between the two).

use std::sync::Arc;

use super::GroupingBuffer;
use crate::coder::Coder;
use crate::grouping::fired::Fired;
use crate::grouping::spill::{BufferSpill, Spillable};
use crate::grouping::GroupingError;
use crate::spill::SpillSpace;
use crate::time::Timestamp;

impl GroupingBuffer {
    /// Lets this buffer spill to `store` under `prefix` once it holds more
    /// than `limit` bytes, if its strategy allows (see `spill`); whether it
    /// does.
    pub fn enable_spill(
        &mut self,
        store: Arc<dyn SpillSpace>,
        prefix: Vec<u8>,
        limit: usize,
    ) -> bool {
        self.spill_to(store, prefix, limit, false)
    }

    /// [`Self::enable_spill`] to `store`, a durable spill space beside the
    /// checkpoints, which then name the spilled windows; only a buffer
    /// filed by window may. Whether it does.
    pub fn enable_durable_spill(
        &mut self,
        store: Arc<dyn SpillSpace>,
        prefix: Vec<u8>,
        limit: usize,
    ) -> bool {
        self.spill_to(store, prefix, limit, true)
    }

    /// Spills to `store` (`durable` or not), if the strategy allows;
    /// whether it does.
    fn spill_to(
        &mut self,
        store: Arc<dyn SpillSpace>,
        prefix: Vec<u8>,
        limit: usize,
        durable: bool,
    ) -> bool {
        let value_coder = self.value_coder();
        let space = BufferSpill::new(&self.strategy, store, prefix, limit, value_coder, durable);
        let spills = space.is_some();
        if spills {
            self.spill = space;
        }
        spills
    }

    /// The coder of the input's values, if it is a `KV`: what a spill cuts
    /// a large pane between.
    fn value_coder(&self) -> Option<Coder> {
        match &self.key_coder_kv {
            Coder::Kv(_, value) => Some(value.as_ref().clone()),
            _ => None,
        }
    }

    /// Lets a spilling buffer hand a key too large for memory to its
    /// consumers as a state-backed iterable: call only when every consumer
    /// reads this buffer's output through one. Whether it may (only a
    /// spill filed by window on scratch does).
    pub fn hand_out_large_keys(&mut self) -> bool {
        self.spill
            .as_mut()
            .is_some_and(BufferSpill::hand_out_large_keys)
    }

    /// Keys handed out as state-backed iterables so far.
    pub fn handed_out(&self) -> u64 {
        self.spill.as_ref().map_or(0, BufferSpill::handed_out)
    }

    /// Whether keys it handed out may still be read: their elements may
    /// wait or run downstream, naming values only the spill space holds,
    /// so the buffer cannot be checkpointed.
    pub fn has_live_hand_outs(&self) -> bool {
        self.spill
            .as_ref()
            .is_some_and(BufferSpill::has_live_hand_outs)
    }

    /// Forgets the keys handed out so far, once the caller knows that
    /// every element that carried one was consumed and committed (no
    /// retry reads them again): the buffer may be checkpointed again, and
    /// the chunks of the windows it finished go.
    pub fn release_hand_outs(&mut self) -> Result<(), GroupingError> {
        if let Some(spill) = &mut self.spill {
            spill.release_hand_outs()?;
        }
        Ok(())
    }

    /// Bytes written to the spill space so far.
    pub fn spilled_bytes(&self) -> u64 {
        self.spill.as_ref().map_or(0, BufferSpill::spilled_bytes)
    }

    /// Whether some of what this buffer holds is in the spill space.
    pub fn has_spilled(&self) -> bool {
        self.spill.as_ref().is_some_and(BufferSpill::has_spilled)
    }

    /// Whether a spilled window is ready and waits to be emitted
    /// ([`Self::drain_spilled`]).
    pub fn is_draining(&self) -> bool {
        self.spill.as_ref().is_some_and(BufferSpill::is_draining)
    }

    /// Whether some of the buffer is on disk where a checkpoint taken now
    /// would have to copy it back (what periodic checkpoints wait for).
    pub fn holds_scratch_spill(&self) -> bool {
        self.spill
            .as_ref()
            .is_some_and(BufferSpill::holds_scratch_spill)
    }

    /// Emits the next keys of ready spilled windows into `out`, until it
    /// holds about `max_bytes` or no window is left to emit; the number of
    /// panes emitted. A window's spilled bytes are deleted once it is out.
    pub fn drain_spilled(
        &mut self,
        input_watermark: Timestamp,
        now: Timestamp,
        out: &mut Fired,
        max_bytes: usize,
    ) -> Result<usize, GroupingError> {
        let (spill, mut side) = self.split();
        let Some(spill) = spill else {
            return Ok(0);
        };
        let emitted = spill.drain(&mut side, input_watermark, now, out, max_bytes)?;
        self.publish(input_watermark);
        Ok(emitted)
    }

    /// Spills if the buffer holds more than its limit (past what the last
    /// spill had to leave in memory), given the input watermark.
    pub(super) fn maybe_spill(&mut self, input_watermark: Timestamp) -> Result<(), GroupingError> {
        let Some(spill) = &self.spill else {
            return Ok(());
        };
        if !spill.over_limit(self.memory.bytes()) {
            return Ok(());
        }
        // Filed in the table, arrivals may take less than they count for
        // (keys repeat): the spill sees only the table, and decides again.
        self.memory.settle(&self.strategy);
        match self.split() {
            (Some(spill), mut side) => spill.maybe_spill(&mut side, input_watermark),
            (None, _) => Ok(()),
        }
    }
}

#[cfg(test)]
impl GroupingBuffer {
    /// Bytes the last spill had to leave in memory (tests check the bound
    /// past them).
    pub(in crate::grouping) fn spill_pinned(&self) -> usize {
        self.spill.as_ref().map_or(0, BufferSpill::pinned)
    }

    /// Runs a spill filed by window wrote so far (tests count them).
    pub(in crate::grouping) fn spilled_runs(&self) -> u32 {
        self.spill.as_ref().map_or(0, BufferSpill::runs)
    }

    /// Starts emitting the spilled windows (filed by window) that the
    /// watermark closed, as an evaluation would first (tests look in
    /// between).
    pub(in crate::grouping) fn start_drains(
        &mut self,
        input_watermark: Timestamp,
    ) -> Result<(), GroupingError> {
        match self.split() {
            (Some(spill), mut side) => spill.start_drains(&mut side, input_watermark),
            (None, _) => Ok(()),
        }
    }
}
