//! When a key's panes fire and its windows close, and how a pane is
//! emitted.
//!
//! An evaluation ([`Evaluation::key`]) asks each of a key's panes' trigger
//! whether it is ready, fires the ready ones, closes the windows that
//! expired (with the final pane Beam owes them) and keeps the buffer's
//! holds, wake point and byte count right as it goes. A firing
//! ([`Firing::emit`]) writes a pane as a windowed `KV<K, Iterable<V>>`
//! with the pane info Beam would give it. Panes in memory and panes a
//! spill reads back fire through the same code, so that spilling changes
//! where values wait, never what is emitted.

use super::fired::Fired;
use super::pane::{update_holds, KeyPanes, Pane, KEY_OVERHEAD, PANE_OVERHEAD};
use crate::coder::{
    iterable_len_bytes, Coder, CoderError, PaneInfo, PaneTiming, WindowedValueHeader,
};
use crate::holds::Holds;
use crate::plan::{AccumulationMode, ClosingBehavior, OnTimeBehavior, WindowingStrategy};
use crate::time::Timestamp;
use crate::trigger::TriggerContext;
use crate::window::Window;

/// What emitting a pane needs besides the pane: borrowed from the buffer,
/// apart from its panes, so that panes in memory and panes read back from
/// a spill are emitted alike.
#[derive(Debug, Clone, Copy)]
pub(super) struct Firing<'a> {
    /// The buffer's windowing strategy.
    pub(super) strategy: &'a WindowingStrategy,
    /// How windows are encoded in the output.
    pub(super) window_coder: &'a Coder,
    /// The output watermark the stage last published: a pane for a window
    /// behind it is late.
    pub(super) output_watermark: Timestamp,
}

/// One evaluation of some of a buffer's keys at an input watermark and a
/// processing time, and what it has done so far.
pub(super) struct Evaluation<'a> {
    firing: Firing<'a>,
    input_watermark: Timestamp,
    now: Timestamp,
    holds: &'a mut Holds,
    next_wake: &'a mut Timestamp,
    memory_bytes: &'a mut usize,
    /// What `out` is given room for at the first pane: when every key is
    /// looked at (a window closing over the whole buffer), what is
    /// buffered, up to the byte limit, so that a big firing does not grow
    /// `out` by doubling, copying what it holds each time. Nothing when
    /// only the keys that got data are (a streaming trigger firing after
    /// an element: a pane or two, not the buffer).
    room: usize,
    /// Likewise, how many elements `out` is given room to record
    /// ([`expected_elements`]).
    room_elements: usize,
    /// Elements emitted.
    emitted: usize,
    /// The first failure; evaluation stops at it.
    error: Option<CoderError>,
}

/// A window is garbage-collected once the watermark passes its end plus
/// the allowed lateness, capped at the end of the global window (as Beam
/// caps it), so that huge lateness still closes at the end of time.
pub(super) fn expired(strategy: &WindowingStrategy, window: &Window, watermark: Timestamp) -> bool {
    window.garbage_collection_time(strategy.allowed_lateness) < watermark
}

/// The watermark past which `window` needs a look without new data: its
/// end (triggers waiting for the watermark fire), then its
/// garbage-collection time (it closes).
pub(super) fn wake(window: &Window, watermark: Timestamp, allowed_lateness: i64) -> Timestamp {
    let end = window.max_timestamp();
    if watermark <= end {
        end
    } else {
        window.garbage_collection_time(allowed_lateness)
    }
}

/// Lowers `next_wake` to `window`'s wake point at `watermark` (see
/// [`wake`]): a window buffered, kept or left unevaluated counts towards
/// the earliest.
pub(super) fn count_wake(
    next_wake: &mut Timestamp,
    window: &Window,
    watermark: Timestamp,
    allowed_lateness: i64,
) {
    *next_wake = (*next_wake).min(wake(window, watermark, allowed_lateness));
}

impl<'a> Evaluation<'a> {
    /// An evaluation at `input_watermark` and `now` that keeps its holds,
    /// wake point and byte count in the given places, with no room given
    /// to `out` up front.
    pub(super) fn new(
        firing: Firing<'a>,
        input_watermark: Timestamp,
        now: Timestamp,
        holds: &'a mut Holds,
        next_wake: &'a mut Timestamp,
        memory_bytes: &'a mut usize,
    ) -> Self {
        Evaluation {
            firing,
            input_watermark,
            now,
            holds,
            next_wake,
            memory_bytes,
            room: 0,
            room_elements: 0,
            emitted: 0,
            error: None,
        }
    }

    /// Gives `out` room for `bytes` and `elements` at the first pane.
    pub(super) fn with_room(mut self, bytes: usize, elements: usize) -> Self {
        self.room = bytes;
        self.room_elements = elements;
        self
    }

    /// Whether it failed, and so stopped.
    pub(super) fn failed(&self) -> bool {
        self.error.is_some()
    }

    /// Starts the wake point over (an evaluation of every key recomputes
    /// it).
    pub(super) fn reset_wake(&mut self) {
        *self.next_wake = crate::time::MAX_TIMESTAMP;
    }

    /// Counts `window` towards the wake point (a window it evaluated and
    /// kept, or one of a key it does not evaluate).
    pub(super) fn wake_for(&mut self, window: &Window) {
        let lateness = self.firing.strategy.allowed_lateness;
        count_wake(self.next_wake, window, self.input_watermark, lateness);
    }

    /// The panes it emitted, or its failure.
    pub(super) fn finish(self) -> Result<usize, CoderError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.emitted),
        }
    }

    /// Fires what is ready in one key's windows and closes the expired
    /// ones (removing them from `windows`), appending the panes to `out`.
    pub(super) fn key(&mut self, key: &[u8], windows: &mut KeyPanes, out: &mut Fired) {
        let strategy = self.firing.strategy;
        let mut i = 0;
        while i < windows.len() {
            let (window, pane) = &mut windows[i];
            let before = pane.hold(strategy, window);
            let size_before = pane.values().len();
            let ctx = TriggerContext {
                window_end: window.max_timestamp(),
                watermark: self.input_watermark,
                now: self.now,
            };
            let expired = expired(strategy, window, self.input_watermark);
            let mut emitted_last = false;
            if pane.trigger().should_fire(&ctx) {
                pane.trigger_mut().on_fire(&ctx);
                let last = expired || pane.trigger().is_finished();
                let fire_empty = ctx.watermark > ctx.window_end
                    && pane.nonspeculative_fired() == 0
                    && strategy.on_time_behavior == OnTimeBehavior::FireAlways;
                if pane.has_new_data() || fire_empty {
                    make_room(out, &mut self.room, &mut self.room_elements);
                    let emitted = self.firing.emit(key, window, pane, &ctx, last, None, out);
                    if !self.counted(emitted) {
                        return;
                    }
                    emitted_last = last;
                }
            }
            if expired {
                // A finished trigger closed the window: nothing more is
                // owed. Otherwise EMIT_ALWAYS asks for a final pane.
                let final_pane = pane.has_new_data()
                    || (strategy.closing_behavior == ClosingBehavior::EmitAlways
                        && pane.has_fired()
                        && !pane.trigger().is_finished()
                        && !emitted_last);
                if final_pane {
                    make_room(out, &mut self.room, &mut self.room_elements);
                    let emitted = self.firing.emit(key, window, pane, &ctx, true, None, out);
                    if !self.counted(emitted) {
                        return;
                    }
                }
                update_holds(self.holds, before, None);
                if i + 1 == windows.len() {
                    // Dropped where it is (removing it would move it out
                    // first): the last window, often the key's only one.
                    windows.truncate(i);
                } else {
                    windows.remove(i);
                }
                *self.memory_bytes = self
                    .memory_bytes
                    .saturating_sub(size_before + PANE_OVERHEAD);
                continue;
            }
            // A discarding firing emptied the pane.
            *self.memory_bytes = self
                .memory_bytes
                .saturating_sub(size_before.saturating_sub(pane.values().len()));
            update_holds(self.holds, before, pane.hold(strategy, window));
            self.wake_for(window);
            i += 1;
        }
        if windows.is_empty() {
            *self.memory_bytes = self.memory_bytes.saturating_sub(key.len() + KEY_OVERHEAD);
        }
    }

    /// Counts what [`Firing::emit`] emitted or keeps its error; whether it
    /// succeeded.
    fn counted(&mut self, emitted: Result<usize, CoderError>) -> bool {
        match emitted {
            Ok(n) => {
                self.emitted += n;
                true
            }
            Err(e) => {
                self.error = Some(e);
                false
            }
        }
    }
}

/// Gives `out` the room an evaluation expects to fill, once (both are
/// zeroed after).
fn make_room(out: &mut Fired, room: &mut usize, room_elements: &mut usize) {
    if *room > 0 || *room_elements > 0 {
        out.reserve(std::mem::take(room), std::mem::take(room_elements));
    }
}

/// The bytes a fired element takes besides its key and values: a header
/// (timestamp, window count, pane byte) and the iterable's count.
const FIRED_ELEMENT_FRAMING: usize = 8 + 4 + 1 + 4;

/// About how many panes a walk over every key emits before it reaches
/// `max_bytes`: a pane per key, each its key's share of the buffered bytes
/// without their bookkeeping estimates, plus framing.
pub(super) fn expected_elements(keys: usize, memory_bytes: usize, max_bytes: usize) -> usize {
    let payload = (memory_bytes / keys.max(1)).saturating_sub(KEY_OVERHEAD + PANE_OVERHEAD);
    keys.min(max_bytes / (payload + FIRED_ELEMENT_FRAMING))
}

impl Firing<'_> {
    /// The header `pane` of `window` goes out with: its output timestamp,
    /// and its pane info as Beam labels panes — LATE once the published
    /// output watermark is past the window (downstream already considers
    /// it done), else EARLY before the input watermark passes the end of
    /// the window, and ON_TIME for the first pane after that. (Inlined:
    /// the header is built where [`Self::emit`] encodes it.)
    #[inline]
    pub(super) fn header(
        &self,
        window: &Window,
        pane: &Pane,
        ctx: &TriggerContext,
        is_last: bool,
    ) -> WindowedValueHeader {
        let timing = if self.output_watermark > ctx.window_end {
            PaneTiming::Late
        } else if ctx.watermark <= ctx.window_end {
            PaneTiming::Early
        } else if pane.nonspeculative_fired() == 0 {
            PaneTiming::OnTime
        } else {
            PaneTiming::Late
        };
        let nonspeculative_index = if timing == PaneTiming::Early {
            -1
        } else {
            pane.nonspeculative_fired()
        };
        WindowedValueHeader {
            timestamp: pane.output_timestamp(self.strategy, window),
            windows: smallvec::smallvec![window.clone()],
            pane: PaneInfo {
                is_first: pane.fired() == 0,
                is_last,
                timing,
                index: pane.fired(),
                nonspeculative_index,
            },
        }
    }

    /// Emits `pane` of `key` in `window` into `out`; with `token`, as the
    /// last pane of a key whose values a drain left in the spill space:
    /// `KV<key, Iterable<V>>` in the state-backed form, no values inline,
    /// then the token, which the consumer reads them by.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn emit(
        &self,
        key: &[u8],
        window: &Window,
        pane: &mut Pane,
        ctx: &TriggerContext,
        is_last: bool,
        token: Option<&[u8]>,
        out: &mut Fired,
    ) -> Result<usize, CoderError> {
        let header = self.header(window, pane, ctx, is_last);
        let timing = header.pane.timing;
        // Straight into `out`: header, key, count, values (checked first,
        // so that an error writes nothing).
        let count = match token {
            None => iterable_len_bytes(pane.count() as usize)?,
            Some(_) => (-1i32).to_be_bytes(),
        };
        let start = out.bytes.len();
        header.encode(self.window_coder, &mut out.bytes)?;
        let value_start = out.bytes.len();
        let bytes = &mut out.bytes;
        bytes.reserve(key.len() + count.len() + pane.values().len());
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(&count);
        match token {
            None => bytes.extend_from_slice(pane.values()),
            Some(token) => {
                // No block of values inline: the continuation marker (a
                // block count of -1), then the token, length first.
                crate::coder::encode_varint_u64(u64::MAX, bytes);
                crate::coder::encode_varint_u64(token.len() as u64, bytes);
                bytes.extend_from_slice(token);
            }
        }
        tracing::trace!(?window, values = pane.count(), pane = ?header.pane, "pane fired");
        out.record(header, start, value_start);
        pane.record_firing(
            timing == PaneTiming::Early,
            self.strategy.accumulation == AccumulationMode::Discarding,
        );
        Ok(1)
    }
}

/// The pane every key of a closing window's arrivals fires as (see
/// `arrivals`): what [`Evaluation::key`] emits for a pane of that window
/// with data whose trigger never fired, which is alike for every key but
/// for the key and its values — so its header is made and encoded once.
pub(super) struct ClosingPane {
    header: WindowedValueHeader,
    encoded: Vec<u8>,
}

impl Firing<'_> {
    /// The pane arrivals of `window` fire as at `ctx` (their window
    /// expired: the pane is the last).
    pub(super) fn closing_pane(
        &self,
        window: &Window,
        ctx: &TriggerContext,
    ) -> Result<ClosingPane, CoderError> {
        let mut pane = Pane::new(&self.strategy.trigger);
        pane.add(&[], window.max_timestamp());
        let header = self.header(window, &pane, ctx, true);
        let mut encoded = Vec::new();
        header.encode(self.window_coder, &mut encoded)?;
        Ok(ClosingPane { header, encoded })
    }
}

impl ClosingPane {
    /// The bytes each pane takes besides its key and values: the header
    /// and the iterable's count.
    pub(super) fn framing(&self) -> usize {
        self.encoded.len() + 4
    }

    /// Emits `key` with its `count` nested-encoded `values` as this pane
    /// into `out` (nothing if `count` does not fit an iterable); the
    /// values' bytes. Inlined: it runs once per key of a closing window,
    /// from another module's loop (`MemoryPanes::fire_arrivals`), and as a
    /// call it cost a sixth more instructions per pane.
    #[inline]
    pub(super) fn emit<'v>(
        &self,
        key: &[u8],
        count: usize,
        values: impl Iterator<Item = &'v [u8]>,
        out: &mut Fired,
    ) -> Result<usize, CoderError> {
        let count = iterable_len_bytes(count)?;
        let start = out.bytes.len();
        out.bytes.extend_from_slice(&self.encoded);
        let value_start = out.bytes.len();
        out.bytes.extend_from_slice(key);
        out.bytes.extend_from_slice(&count);
        let values_start = out.bytes.len();
        for value in values {
            out.bytes.extend_from_slice(value);
        }
        out.record_shared(&self.header, start, value_start);
        Ok(out.bytes.len() - values_start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A firing over every key expects a pane per key, as many as fit its
    /// byte limit at the keys' average size (their bookkeeping estimates
    /// taken off).
    #[test]
    fn a_firing_expects_what_fits_its_limit() {
        let per_key = KEY_OVERHEAD + PANE_OVERHEAD + 18;
        let per_element = 18 + FIRED_ELEMENT_FRAMING;
        assert_eq!(expected_elements(1000, 1000 * per_key, 4 << 20), 1000);
        assert_eq!(
            expected_elements(1_000_000, 1_000_000 * per_key, 4 << 20),
            (4 << 20) / per_element
        );
        assert_eq!(expected_elements(0, 0, 4 << 20), 0);
        // Estimates above what is buffered: framing alone.
        assert_eq!(expected_elements(10, 10, 170), 10);
    }
}
