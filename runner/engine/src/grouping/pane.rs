//! One (key, window)'s pane, and one key's panes.
//!
//! A pane is what a GroupByKey holds for one key in one window: the values
//! not emitted yet, kept as the bytes they are emitted as, and what a
//! firing needs to know besides (how many panes fired, the output-time
//! holds of the unfired values, the trigger's state). Memory, firing,
//! merging and spilling all move panes around; this module owns their
//! layout and the operations that keep a pane's holds and counts right,
//! and the estimates of what a pane and a key cost in memory
//! ([`KEY_OVERHEAD`], [`PANE_OVERHEAD`]) sit next to what they estimate.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use super::hold_range::HoldRange;
use crate::holds::Holds;
use crate::plan::{OutputTime, Trigger, WindowingStrategy};
use crate::time::Timestamp;
use crate::trigger::TriggerState;
use crate::window::Window;

/// Bookkeeping bytes of a buffered key besides its bytes (its table entry
/// less its first pane, and its index slot): an estimate for the spill
/// limit.
pub(super) const KEY_OVERHEAD: usize = 64;
/// Bookkeeping bytes of a buffered pane besides its values (a window and
/// its pane, 160 bytes, in the key's entry or its heap vector).
pub(super) const PANE_OVERHEAD: usize = 160;

/// Values buffered for one (key, window), with its trigger.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Pane {
    /// Nested-encoded values not yet discarded (all values when
    /// accumulating), one after another: a pane is emitted as exactly
    /// these bytes after the iterable's length, so they are kept that way
    /// (and copied out of the input, which is then free to go). A pane of
    /// one small value — a GroupByKey over distinct keys — keeps it in
    /// place, without an allocation of its own.
    values: PaneValues,
    /// How many values `values` holds. (32 bits: a pane is emitted as an
    /// iterable, whose length is an int32 on the wire, so a longer one could
    /// not be written anyway; it saturates and then fails to encode.)
    count: u32,
    /// Data arrived since the last firing.
    new_data: bool,
    /// Earliest and latest output-time hold of the elements since the
    /// last firing.
    holds: HoldRange,
    /// Panes already fired for this window.
    fired: i64,
    /// Non-early panes already fired.
    nonspeculative_fired: i64,
    /// The trigger's state.
    trigger: TriggerState,
}

/// A pane's values; up to 16 bytes need no allocation.
type PaneValues = SmallVec<[u8; 16]>;

/// One key's panes, sorted by window. Most keys have one window, kept in
/// place (in the key's table entry: no allocation per key, and an
/// evaluation walks the entries' memory in order); more go to the heap as
/// a sorted vector, which beats a map per key.
pub(super) type KeyPanes = SmallVec<[(Window, Pane); 1]>;

impl Pane {
    /// An empty pane that has not fired, with fresh state for `trigger`.
    pub(super) fn new(trigger: &Trigger) -> Self {
        Pane {
            values: PaneValues::new(),
            count: 0,
            new_data: false,
            holds: HoldRange::EMPTY,
            fired: 0,
            nonspeculative_fired: 0,
            trigger: TriggerState::new(trigger),
        }
    }

    /// Adds one nested-encoded value whose output time holds at `hold`.
    pub(super) fn add(&mut self, value: &[u8], hold: Timestamp) {
        self.values.extend_from_slice(value);
        self.count = self.count.saturating_add(1);
        self.new_data = true;
        self.holds.add(hold);
    }

    /// Adds values that come back from a spill: `count` of them, holding
    /// from `hold_min` to `hold_max`, as unfired data.
    pub(super) fn add_part(
        &mut self,
        values: &[u8],
        count: usize,
        hold_min: Timestamp,
        hold_max: Timestamp,
    ) {
        if self.values.is_empty() {
            self.values = PaneValues::from_slice(values);
        } else {
            self.values.extend_from_slice(values);
        }
        // Saturating: a pane past an int32's count fails when it is
        // encoded, which is where that limit is reported.
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        self.count = self.count.saturating_add(count);
        self.new_data = true;
        self.holds.add(hold_min);
        self.holds.add(hold_max);
    }

    /// Takes `other`, a pane of the same key in a window merged into this
    /// one's, in: its values, holds, firings and trigger state.
    pub(super) fn absorb(&mut self, other: Pane) {
        self.values.extend_from_slice(&other.values);
        self.count = self.count.saturating_add(other.count);
        self.new_data |= other.new_data;
        self.holds.absorb(other.holds);
        self.fired = self.fired.max(other.fired);
        self.nonspeculative_fired = self.nonspeculative_fired.max(other.nonspeculative_fired);
        self.trigger.merge(&other.trigger);
    }

    /// The values, nested-encoded one after another.
    pub(super) fn values(&self) -> &[u8] {
        &self.values
    }

    /// How many values it holds.
    pub(super) fn count(&self) -> u32 {
        self.count
    }

    /// The output-time holds of its unfired values.
    pub(super) fn holds(&self) -> HoldRange {
        self.holds
    }

    /// Whether data arrived since it last fired.
    pub(super) fn has_new_data(&self) -> bool {
        self.new_data
    }

    /// Panes fired for its window so far.
    pub(super) fn fired(&self) -> i64 {
        self.fired
    }

    /// Whether some pane of its window fired.
    pub(super) fn has_fired(&self) -> bool {
        self.fired > 0
    }

    /// Non-early panes fired for its window so far.
    pub(super) fn nonspeculative_fired(&self) -> i64 {
        self.nonspeculative_fired
    }

    /// Its trigger's state.
    pub(super) fn trigger(&self) -> &TriggerState {
        &self.trigger
    }

    /// Its trigger's state, to advance.
    pub(super) fn trigger_mut(&mut self) -> &mut TriggerState {
        &mut self.trigger
    }

    /// A pane of it was emitted (`early`, before the end of the window):
    /// its holds are released and, when `discarding`, its values go.
    pub(super) fn record_firing(&mut self, early: bool, discarding: bool) {
        self.fired += 1;
        if !early {
            self.nonspeculative_fired += 1;
        }
        self.new_data = false;
        // Holds are released by a firing, in either accumulation mode.
        self.holds = HoldRange::EMPTY;
        if discarding {
            self.values.clear();
            self.count = 0;
        }
    }

    /// The timestamp its next pane of `window` is emitted at.
    pub(super) fn output_timestamp(
        &self,
        strategy: &WindowingStrategy,
        window: &Window,
    ) -> Timestamp {
        let end = window.max_timestamp();
        match strategy.output_time {
            OutputTime::EndOfWindow => end,
            OutputTime::EarliestInPane => self.holds.min().unwrap_or(end).min(end),
            OutputTime::LatestInPane => self.holds.max().unwrap_or(end).min(end),
        }
    }

    /// What it holds the output watermark at in `window`: its output time
    /// while it has unfired data.
    pub(super) fn hold(&self, strategy: &WindowingStrategy, window: &Window) -> Option<Timestamp> {
        self.new_data
            .then(|| self.output_timestamp(strategy, window))
    }
}

/// Where `window` is (or would go) in `panes`.
pub(super) fn position(panes: &KeyPanes, window: &Window) -> Result<usize, usize> {
    panes.binary_search_by(|(w, _)| w.cmp(window))
}

/// A pane's hold went from `before` to `after`: `holds` follows.
pub(super) fn update_holds(holds: &mut Holds, before: Option<Timestamp>, after: Option<Timestamp>) {
    if before == after {
        return;
    }
    if let Some(h) = before {
        holds.remove(h);
    }
    if let Some(h) = after {
        holds.add(h);
    }
}

/// Puts `pane` into `windows` under `window`, absorbing the pane already
/// there, if any; `holds` follows.
pub(super) fn insert_pane(
    windows: &mut KeyPanes,
    window: Window,
    pane: Pane,
    strategy: &WindowingStrategy,
    holds: &mut Holds,
) {
    match position(windows, &window) {
        Ok(at) => {
            let (w, existing) = &mut windows[at];
            let before = existing.hold(strategy, w);
            existing.absorb(pane);
            update_holds(holds, before, existing.hold(strategy, w));
        }
        Err(at) => {
            update_holds(holds, None, pane.hold(strategy, &window));
            windows.insert(at, (window, pane));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GroupByKey over distinct keys writes a pane (with its window and
    /// trigger state) for every element and reads it back at the firing:
    /// its size is per-element memory traffic, so it must not creep up.
    #[test]
    fn a_pane_stays_small() {
        assert!(std::mem::size_of::<crate::trigger::TriggerState>() <= 40);
        assert!(std::mem::size_of::<Pane>() <= 104);
        assert!(std::mem::size_of::<(super::super::key_table::Key, KeyPanes)>() <= 168);
    }

    /// The spill bound counts memory by these estimates: they must not
    /// fall behind the real layout (a window and its pane; the rest of a
    /// key's table entry).
    #[test]
    fn the_overhead_estimates_cover_the_layout() {
        let pane = std::mem::size_of::<(Window, Pane)>();
        assert!(PANE_OVERHEAD >= pane, "a pane takes {pane} bytes");
        let entry = std::mem::size_of::<(super::super::key_table::Key, KeyPanes)>();
        let index_slot = std::mem::size_of::<usize>();
        assert!(
            KEY_OVERHEAD + PANE_OVERHEAD >= entry + index_slot,
            "a key's entry takes {entry} bytes"
        );
    }
}
