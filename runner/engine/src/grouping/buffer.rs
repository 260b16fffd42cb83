//! The grouping buffer of one GroupByKey stage: what the engine calls.
//!
//! [`GroupingBuffer`] takes elements, decides which are late, stamps each
//! with the output time it holds the watermark at, and asks the SDK to
//! merge windows it cannot merge itself; it evaluates its panes when the
//! engine says, and publishes the output watermark its next panes allow.
//! The panes themselves are kept by its memory (`memory`) and, past its
//! share of memory, by its spill space (`spill`), which it drives through
//! their interfaces without reaching into either: how it spills is in
//! `spilling`, how it is checkpointed in `checkpoint`.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::fired::Fired;
use super::firing::{expired, Firing};
use super::memory::MemoryPanes;
use super::spill::{BufferSide, BufferSpill, InMemory, Spillable};
use super::GroupingError;
use crate::coder::{Coder, DecodedElement, WindowedValueHeader};
use crate::plan::{WindowFn, WindowingStrategy};
use crate::time::{earliest, Timestamp};
use crate::trigger::TriggerContext;
use crate::window::Window;

mod checkpoint;
mod spilling;

pub(crate) use checkpoint::GroupingSnapshot;

/// Buffers and fires the panes of one GroupByKey stage.
///
/// Evaluation is incremental (see `memory`): only keys that got data since
/// the last evaluation are looked at, unless the watermark or processing
/// time may have made any pane ready. The output-time holds of panes with
/// unfired data are kept in a multiset, so the stage's hold is read
/// without a scan.
#[derive(Debug)]
pub struct GroupingBuffer {
    strategy: WindowingStrategy,
    key_coder_kv: Coder,
    window_coder: Coder,
    /// The panes in memory, with their holds and bytes.
    memory: MemoryPanes,
    /// Elements dropped because they arrived after their window expired.
    dropped_late: u64,
    /// Whether data for expired windows is dropped (streaming). A batch
    /// pipeline has no late data: its GroupByKeys see all their input
    /// before the end of time, whatever timestamps a DoFn gave it on the
    /// way (the TypeScript SDK's `assignTimestamps` after a Reshuffle moves
    /// elements from the end of the global window back into windows the
    /// watermark has passed).
    drops_late_data: bool,
    /// The output watermark this stage last published (as far as this
    /// buffer knows it): data behind it must not be emitted behind it.
    output_watermark: Timestamp,
    /// The trigger looks at processing time, so time alone can fire panes.
    uses_processing_time: bool,
    /// The trigger fires only once the watermark is past the end of the
    /// window (the default trigger, for one): an element before then
    /// cannot make it ready.
    fires_only_past_end: bool,
    /// Keys whose windows the SDK must merge before panes may fire
    /// (custom merging window functions only).
    unmerged: BTreeSet<Bytes>,
    /// Where the buffer spills, if it may.
    spill: Option<BufferSpill>,
}

impl GroupingBuffer {
    /// A buffer for a GroupByKey whose input elements are `input_value_coder`
    /// (a `Kv` coder) in windows of `window_coder`.
    pub fn new(strategy: WindowingStrategy, input_value_coder: Coder, window_coder: Coder) -> Self {
        GroupingBuffer {
            uses_processing_time: strategy.trigger.fires_on_processing_time(),
            fires_only_past_end: !strategy.trigger.fires_before_window_end(),
            memory: MemoryPanes::new(&strategy),
            strategy,
            key_coder_kv: input_value_coder,
            window_coder,
            dropped_late: 0,
            drops_late_data: true,
            output_watermark: crate::time::MIN_TIMESTAMP,
            unmerged: BTreeSet::new(),
            spill: None,
        }
    }

    /// Keeps data that arrives for expired windows instead of dropping it:
    /// for batch pipelines, which have no late data (see
    /// `drops_late_data`). Such data fires as a late pane of its window.
    pub fn keeping_late_data(mut self) -> Self {
        self.drops_late_data = false;
        self
    }

    /// Number of late elements dropped so far.
    pub fn dropped_late(&self) -> u64 {
        self.dropped_late
    }

    /// Whether nothing is buffered (in memory or spilled).
    pub fn is_empty(&self) -> bool {
        self.memory.is_empty() && !self.has_spilled()
    }

    /// Buffer one input element. Data for windows that already expired at
    /// `input_watermark` is dropped (and counted).
    pub fn add(
        &mut self,
        element: &DecodedElement,
        input_watermark: Timestamp,
        now: Timestamp,
    ) -> Result<(), GroupingError> {
        self.add_value(&element.header, element.value(), input_watermark, now)
    }

    /// About `elements` more are about to be added (the rest of the chunk
    /// being routed): makes room for the keys they will likely add at once
    /// rather than by doubling (see `KeyTable::expect_lookups`).
    pub fn expect_elements(&mut self, elements: usize) {
        self.memory.expect_lookups(elements);
    }

    /// [`Self::add`] for an element given as its header and its `KV` value
    /// bytes (which are copied, not kept).
    pub fn add_value(
        &mut self,
        header: &WindowedValueHeader,
        kv: &[u8],
        input_watermark: Timestamp,
        now: Timestamp,
    ) -> Result<(), GroupingError> {
        let key_len = self.key_coder_kv.kv_key_len(kv)?;
        let key = &kv[..key_len];
        let value = &kv[key_len..];
        let ts = header.timestamp;
        for window in &header.windows {
            if self.drops_late_data && expired(&self.strategy, window, input_watermark) {
                self.dropped_late += 1;
                continue;
            }
            let ctx = TriggerContext {
                window_end: window.max_timestamp(),
                watermark: input_watermark,
                now,
            };
            if self
                .memory
                .arrive(&self.strategy, kv, key_len, window, &ctx)
            {
                continue;
            }
            // An element behind the published output watermark holds (and
            // stamps its pane) at the end of its window instead, so the pane
            // is never emitted behind the watermark downstream already saw.
            let end = ctx.window_end;
            // Late data (the input watermark already passed the window's end)
            // is stamped at the end of the window too, as Beam does.
            let late = input_watermark > end;
            let hold = if late || ts < self.output_watermark {
                end
            } else {
                ts.min(end)
            };
            if !self
                .memory
                .add(&self.strategy, key, window, value, hold, &ctx)
            {
                continue;
            }
            if let WindowFn::Custom { merging: true } = self.strategy.window_fn {
                if !self.unmerged.contains(key) {
                    self.unmerged.insert(Bytes::copy_from_slice(key));
                }
            }
            // Before the watermark passes the window, an element cannot
            // make a trigger that waits for it ready.
            if late || !self.fires_only_past_end {
                self.memory.touch(key);
            }
        }
        self.maybe_spill(input_watermark)
    }

    /// Whether some key's windows wait for the SDK to merge them; panes are
    /// not evaluated until then.
    pub fn needs_merge(&self) -> bool {
        !self.unmerged.is_empty()
    }

    /// The keys whose windows must be merged, with their current windows,
    /// for [`crate::window_merge::encode_request`].
    pub fn merge_request(&self) -> Vec<(Bytes, Vec<Window>)> {
        self.unmerged
            .iter()
            .map(|key| (key.clone(), self.memory.windows_of(key)))
            .collect()
    }

    /// Apply the SDK's merge results for `key`: the panes of each result's
    /// originals become one pane of the result window. Windows the key no
    /// longer has are ignored.
    pub fn apply_merges(&mut self, key: &Bytes, merges: crate::window_merge::Merges) {
        self.unmerged.remove(key);
        self.memory.apply_merges(&self.strategy, key, merges);
    }

    /// Forget that `keys` need merging (the merge request failed and the job
    /// is failing anyway, or the keys were merged).
    pub fn clear_unmerged(&mut self, keys: &[Bytes]) {
        for k in keys {
            self.unmerged.remove(k);
        }
    }

    /// The earliest timestamp a pane still buffered here may be emitted at,
    /// which holds the stage's output watermark.
    ///
    /// While some keys wait for evaluation it is no later than the output
    /// watermark already published: a key not looked at yet may owe a pane
    /// that holds nothing (an empty closing pane), which must not come out
    /// behind a watermark that moved on without it.
    pub fn hold(&self) -> Option<Timestamp> {
        let spilled = self.spill.as_ref().and_then(BufferSpill::hold);
        let held = earliest(self.memory.hold(), spilled);
        if self.has_unevaluated() {
            return Some(held.map_or(self.output_watermark, |h| h.min(self.output_watermark)));
        }
        held
    }

    /// The earliest processing time at which some trigger may fire.
    pub fn next_deadline(&self) -> Option<Timestamp> {
        if !self.uses_processing_time {
            return None;
        }
        self.memory.next_deadline()
    }

    /// Fire every pane whose trigger is ready, and close every window that
    /// expired (emitting what its trigger left unfired), appending encoded
    /// `KV<K, Iterable<V>>` windowed values to `out`. Returns the number of
    /// elements emitted. Spilled windows that are ready are not emitted
    /// here but start draining ([`Self::drain_spilled`]).
    ///
    /// Stops taking keys once `out` holds `max_bytes` (at least one key is
    /// looked at): the rest wait for the next call ([`Self::has_unevaluated`])
    /// and keep holding the output watermark meanwhile. A GroupByKey whose
    /// window closes over half a million keys thus emits a few megabytes at
    /// a time, and its consumers start on the first while the rest is
    /// still being emitted. Keys come out in the map's order, not sorted:
    /// Beam promises no order, and sorting cost more than the emitting.
    pub fn evaluate(
        &mut self,
        input_watermark: Timestamp,
        now: Timestamp,
        out: &mut Fired,
        max_bytes: usize,
    ) -> Result<usize, GroupingError> {
        let always = self.uses_processing_time;
        if self.spill.as_ref().is_some_and(BufferSpill::is_in_use) {
            // The spill sees only the table.
            self.memory.settle(&self.strategy);
        }
        let (spill, mut side) = self.split();
        let in_memory = match spill {
            Some(spill) => spill.prepare_evaluation(&mut side, input_watermark)?,
            None => InMemory::All,
        };
        let (memory, firing, wm) = (side.memory, side.firing, input_watermark);
        let emitted = match in_memory {
            InMemory::None => 0,
            InMemory::All => memory.evaluate(firing, wm, now, out, max_bytes, always, |_| true)?,
            InMemory::Only(keys) => {
                memory.evaluate(firing, wm, now, out, max_bytes, always, keys)?
            }
        };
        self.publish(input_watermark);
        Ok(emitted)
    }

    /// The input watermark reached `input_watermark` but evaluation has to
    /// wait (the consumers are over their bound, or windows wait for the
    /// SDK to merge them): if that may make panes ready, every key is owed
    /// a look, and the output watermark stays where it is until then.
    pub fn postpone(&mut self, input_watermark: Timestamp) {
        self.memory
            .postpone(input_watermark, self.uses_processing_time);
    }

    /// About how many bytes the buffer holds in memory (what its spill
    /// limit is checked against): a GroupByKey's backlog.
    pub fn buffered_bytes(&self) -> usize {
        self.memory.bytes()
    }

    /// Whether some keys wait for [`Self::evaluate`] to look at them (it
    /// stopped at its byte limit, or they got data since).
    pub fn has_unevaluated(&self) -> bool {
        self.memory.has_unevaluated()
    }

    /// The spill space, and the buffer as the spill space sees it (its
    /// memory, and how its panes fire), borrowed apart.
    fn split(&mut self) -> (Option<&mut BufferSpill>, BufferSide<'_, MemoryPanes>) {
        let side = BufferSide {
            memory: &mut self.memory,
            firing: Firing {
                strategy: &self.strategy,
                window_coder: &self.window_coder,
                output_watermark: self.output_watermark,
            },
        };
        (self.spill.as_mut(), side)
    }

    /// Records the output watermark the stage publishes after a firing.
    fn publish(&mut self, input_watermark: Timestamp) {
        let published = self
            .hold()
            .map_or(input_watermark, |h| h.min(input_watermark));
        self.output_watermark = self.output_watermark.max(published);
    }
}

#[cfg(test)]
impl GroupingBuffer {
    /// The same buffer, filing every element under its key as it comes
    /// (the oracle arrivals are checked against).
    pub(in crate::grouping) fn without_arrivals(mut self) -> Self {
        self.memory = self.memory.without_arrivals();
        self
    }

    /// The output watermark this buffer last published (tests check
    /// what panes say against it).
    pub(in crate::grouping) fn output_watermark(&self) -> Timestamp {
        self.output_watermark
    }
}
