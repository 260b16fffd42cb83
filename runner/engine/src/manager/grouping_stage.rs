//! A GroupByKey stage: its buffer, and when it fires.
//!
//! Elements are handed to the stage as they are delivered; panes leave it
//! through [`GroupingState::fire`], which the watermark pass calls when it
//! reaches the stage. In streaming, triggers are also evaluated after
//! every element that arrives (an `AfterCount(1)` fires once per element,
//! not once per delivered bundle); what that fires is kept in the stage
//! until delivery takes it ([`GroupingState::take_fired_on_arrival`]),
//! right after the element, as the stage's own output. Firing is the
//! stage's; delivery only hands on what it emitted.

use crate::coder::{DecodedElement, WindowedValueHeader};
use crate::grouping::{Fired, GroupingBuffer, GroupingError};
use crate::time::Timestamp;

/// A GroupByKey's buffer, and what the engine's passes over it track.
pub(super) struct GroupingState {
    /// What it groups, and fires.
    pub(super) buffer: GroupingBuffer,
    /// A window-merge request is with the SDK: nothing fires meanwhile.
    pub(super) merging: bool,
    /// Bytes of panes it may still emit before the engine schedules
    /// bundles again (refilled by every `advance` and commit), so that its
    /// consumers start on a big firing while the rest follows.
    fire_budget: usize,
    /// Triggers are evaluated after every element (streaming).
    fires_on_arrival: bool,
    /// Panes fired on arrival, not yet handed on, back to back.
    fired_on_arrival: Fired,
}

impl GroupingState {
    /// The state of a GroupByKey around `buffer`; `streaming` fires
    /// triggers as elements arrive.
    pub(super) fn new(buffer: GroupingBuffer, streaming: bool) -> Self {
        GroupingState {
            buffer,
            merging: false,
            fire_budget: 0,
            fires_on_arrival: streaming,
            fired_on_arrival: Fired::default(),
        }
    }

    /// Takes in a delivered element at input watermark `input_wm`; in
    /// streaming, evaluates the triggers after it (unless its consumers
    /// are over their bound: `blocked`).
    #[inline(always)]
    pub(super) fn add(
        &mut self,
        element: &DecodedElement,
        input_wm: Timestamp,
        now: Timestamp,
        blocked: bool,
    ) -> Result<(), GroupingError> {
        self.buffer.add(element, input_wm, now)?;
        if self.fires_on_arrival {
            self.fire_on_arrival(input_wm, now, blocked)?;
        }
        Ok(())
    }

    /// [`Self::add`] for an element read in place: its header and the
    /// bytes of its `KV`.
    #[inline(always)]
    pub(super) fn add_value(
        &mut self,
        header: &WindowedValueHeader,
        kv: &[u8],
        input_wm: Timestamp,
        now: Timestamp,
        blocked: bool,
    ) -> Result<(), GroupingError> {
        self.buffer.add_value(header, kv, input_wm, now)?;
        if self.fires_on_arrival {
            self.fire_on_arrival(input_wm, now, blocked)?;
        }
        Ok(())
    }

    /// Whether [`Self::add`] may fire (it fires on arrival and has budget
    /// left), and so needs to know whether the consumers are blocked.
    #[inline]
    pub(super) fn may_fire_on_arrival(&self) -> bool {
        self.fires_on_arrival && self.may_fire()
    }

    /// Whether the step's budget has room for more panes.
    #[inline]
    pub(super) fn may_fire(&self) -> bool {
        self.fire_budget > 0
    }

    /// Streaming: evaluates the triggers after an element arrived, adding
    /// what fired to what waits for delivery to take. Out of line: batch
    /// never calls it, and the check before the call is all it pays per
    /// element.
    #[inline(never)]
    fn fire_on_arrival(
        &mut self,
        input_wm: Timestamp,
        now: Timestamp,
        blocked: bool,
    ) -> Result<(), GroupingError> {
        let GroupingState {
            buffer,
            fire_budget,
            fired_on_arrival,
            ..
        } = self;
        evaluate_into(
            buffer,
            fire_budget,
            input_wm,
            now,
            blocked,
            fired_on_arrival,
        )?;
        Ok(())
    }

    /// The panes fired on arrival since the last call, in order, if any;
    /// delivery hands them on right after the element that fired them.
    #[inline]
    pub(super) fn take_fired_on_arrival(&mut self) -> Option<Fired> {
        (self.fired_on_arrival.element_count() > 0)
            .then(|| std::mem::take(&mut self.fired_on_arrival))
    }

    /// What the stage emits at input watermark `input_wm`: the panes its
    /// triggers let fire now, if any (none while the SDK merges its
    /// windows, or while its consumers are over their bound: `blocked`).
    /// Panes fired on arrival are never here: delivery took them right
    /// after their element.
    pub(super) fn fire(
        &mut self,
        input_wm: Timestamp,
        now: Timestamp,
        blocked: bool,
    ) -> Result<Option<Fired>, GroupingError> {
        debug_assert!(
            !self.holds_fired_panes(),
            "panes fired on arrival were not delivered"
        );
        if self.merging {
            return Ok(None);
        }
        let mut out = Fired::default();
        let fired = evaluate_into(
            &mut self.buffer,
            &mut self.fire_budget,
            input_wm,
            now,
            blocked,
            &mut out,
        )?;
        Ok((fired > 0).then_some(out))
    }

    /// A new step: the stage may emit `bytes` more.
    pub(super) fn refill_budget(&mut self, bytes: usize) {
        self.fire_budget = bytes;
    }

    /// Whether the stage stopped at its step's budget with panes still to
    /// emit and may go on now (no merge pending), if its consumers can
    /// take them.
    pub(super) fn has_more_to_fire(&self) -> bool {
        !self.merging
            && !self.buffer.needs_merge()
            && (self.buffer.has_unevaluated() || self.buffer.is_draining())
    }

    /// Whether panes fired on arrival wait to be handed on (never between
    /// two deliveries; a checkpoint must not be taken then: they are in
    /// neither the buffer nor a queue).
    #[inline]
    pub(super) fn holds_fired_panes(&self) -> bool {
        self.fired_on_arrival.element_count() > 0
    }
}

/// One evaluation of `buffer`'s triggers within the step's budget
/// (`fire_budget`, which it uses up), appending what fired to `out`: how
/// many elements. A blocked stage, or one whose windows wait for the SDK to
/// merge them, only notes that it owes an evaluation.
fn evaluate_into(
    buffer: &mut GroupingBuffer,
    fire_budget: &mut usize,
    input_wm: Timestamp,
    now: Timestamp,
    blocked: bool,
    out: &mut Fired,
) -> Result<usize, GroupingError> {
    // A GroupByKey emits only while its consumers are under their queue
    // bound, and a step's worth at a time: what it did not get to waits for
    // the next step (holding the output watermark).
    let budget = *fire_budget;
    if budget == 0 || blocked || buffer.needs_merge() {
        buffer.postpone(input_wm);
        return Ok(0);
    }
    // The buffer's limits are on what `out` holds in all.
    let start = out.bytes.len();
    let limit = start.saturating_add(budget);
    let mut fired = buffer.evaluate(input_wm, now, out, limit)?;
    if buffer.is_draining() && out.bytes.len() - start < budget {
        fired += buffer.drain_spilled(input_wm, now, out, limit)?;
    }
    *fire_budget = budget.saturating_sub(out.bytes.len() - start);
    Ok(fired)
}
