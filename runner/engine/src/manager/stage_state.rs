//! The run-time state of one stage, and what a stage answers about itself.
//!
//! Every stage has a [`StageQueue`] (the work waiting for it, delayed and
//! running) and a [`StageProgress`] (its watermarks and counters). What
//! only some kinds of stage carry is a [`KindState`]: a GroupByKey's
//! buffer, an SDK stage's timers and retries, a TestStream's cursor,
//! whether an Impulse has emitted. The [`Engine`](super::Engine)
//! orchestrates — it moves elements between stages, talks to the
//! executor and picks what runs next — while what follows from one
//! stage's own state alone (how far its output watermark may go, when it
//! next needs the clock, whether a retry may start) is answered here.

use std::borrow::Cow;

use tokio::time::Instant;

use super::grouping_stage::GroupingState;
use super::pending::{Pending, Queued};
use super::stats::StageCounters;
use super::EngineError;
use crate::coder::DecodedElement;
use crate::grouping::GroupingBuffer;
use crate::holds::Holds;
use crate::key_groups::KeyGroupSet;
use crate::plan::{StageKind, TestStreamEvent, TimeDomain, WindowingStrategy};
use crate::spill::SpillError;
use crate::time::{earliest, Timestamp, MAX_TIMESTAMP, MIN_TIMESTAMP};
use crate::timers::{FiredTimer, TimerStore};

/// Run-time state of one stage: its queue, its progress, and what only
/// its kind of stage carries.
pub(super) struct StageState {
    /// The work waiting for it and running.
    pub(super) queue: StageQueue,
    /// Its watermarks and counters.
    pub(super) progress: StageProgress,
    /// What only its kind of stage carries.
    pub(super) kind: KindState,
}

/// The work of a stage: elements waiting, elements whose delay has not
/// passed, and bundles in flight with what they hold.
pub(super) struct StageQueue {
    /// Elements waiting for a bundle.
    pub(super) pending: Pending,
    /// Bundles in flight.
    in_flight: usize,
    /// Input bytes of the bundles in flight: with `pending`, what the
    /// stage's queue bound limits.
    in_flight_bytes: usize,
    /// Timestamps the input of the bundles in flight holds.
    in_flight_holds: Holds,
    /// Residuals the SDK asked to have back later.
    delayed: Vec<Delayed>,
    /// Keyed stages: the key groups bundles in flight hold.
    locked_key_groups: KeyGroupSet,
}

/// An element that goes back to its stage's queue once `at` has passed (a
/// residual the SDK deferred), holding the stage's output at `hold`.
pub(super) struct Delayed {
    /// When it joins the queue.
    pub(super) at: Instant,
    /// The element.
    pub(super) element: DecodedElement,
    /// What it holds the stage's output watermark at meanwhile.
    pub(super) hold: Timestamp,
}

/// How far a stage has got, and what it did.
pub(super) struct StageProgress {
    /// The earliest output watermark of the stages producing its inputs.
    pub(super) input_wm: Timestamp,
    /// See [`StageState::output_watermark`]; it only ever rises.
    pub(super) output_wm: Timestamp,
    /// What the stage did, for [`StageStats`].
    pub(super) counters: StageCounters,
}

/// What only some kinds of stage carry, one variant per
/// [`StageKind`].
///
/// Not boxed, though a GroupByKey's buffer is larger than the other
/// kinds' state: there is one per stage (tens in a job), and routing reads
/// the buffers per element.
#[allow(clippy::large_enum_variant)]
pub(super) enum KindState {
    /// An Impulse: whether it emitted its one element.
    Impulse {
        /// It emitted.
        emitted: bool,
    },
    /// A Flatten: its queue is all it has.
    Flatten,
    /// A GroupByKey.
    Grouping(GroupingState),
    /// A fused chain of SDK transforms.
    Sdk(SdkState),
    /// A TestStream.
    TestStream(StreamCursor),
}

/// An SDK stage's timers, state collection and retries.
pub(super) struct SdkState {
    /// Timers its transforms set and have not had fired.
    pub(super) timers: TimerStore,
    /// Stateful stages: the input watermark of the last state collection.
    pub(super) state_gc_wm: Timestamp,
    /// Its bundles' failures in a row, and the backoff they earned.
    pub(super) retries: Retries,
}

/// Failed bundles of one stage in a row, and when its next may start.
#[derive(Default)]
pub(super) struct Retries {
    /// Bundles that failed in a row.
    failures: u32,
    /// No bundle starts before this (the backoff of the last failure).
    not_before: Option<Instant>,
}

/// How far a TestStream has replayed its events.
pub(super) struct StreamCursor {
    /// Index of the next event to apply.
    next: usize,
    /// The watermark its events advanced to.
    watermark: Timestamp,
    /// How many events it has.
    events: usize,
}

impl StageState {
    /// The state of a stage before it ran, with `kind`'s start state.
    pub(super) fn new(kind: KindState) -> Self {
        StageState {
            queue: StageQueue {
                pending: Pending::default(),
                in_flight: 0,
                in_flight_bytes: 0,
                in_flight_holds: Holds::default(),
                delayed: Vec::new(),
                locked_key_groups: 0,
            },
            progress: StageProgress {
                input_wm: MIN_TIMESTAMP,
                output_wm: MIN_TIMESTAMP,
                counters: StageCounters::default(),
            },
            kind,
        }
    }

    /// How far the stage's output watermark may go, given its input
    /// watermark `input_wm`:
    ///
    /// ```text
    /// output = min(input_wm,
    ///              hold of the elements waiting,
    ///              hold of the bundles in flight (their input and timers),
    ///              hold of the delayed residuals,
    ///              hold of the grouping buffer (its unfired panes),
    ///              hold of the pending timers)
    /// ```
    ///
    /// and below +∞ while anything at all is left (a timer at the end of
    /// time holds the stage open). An Impulse is at −∞ until it emitted and
    /// then at +∞; a TestStream is at the watermark its events set, and at
    /// +∞ once it replayed every event. The input watermark is the least
    /// output watermark of the stages producing the stage's inputs (+∞ for
    /// a source), so a stage never claims more than its producers did.
    /// The engine raises a stage's output watermark to this, never lowers
    /// it ([`Engine::advance`]).
    pub(super) fn output_watermark(&self, input_wm: Timestamp) -> Timestamp {
        match &self.kind {
            KindState::Impulse { emitted } => {
                return if *emitted {
                    MAX_TIMESTAMP
                } else {
                    MIN_TIMESTAMP
                };
            }
            KindState::TestStream(cursor) => return cursor.watermark(),
            _ => {}
        }
        let holds = [
            self.queue.hold(),
            self.grouping().and_then(GroupingBuffer::hold),
            self.timers().and_then(TimerStore::hold),
        ];
        let wm = holds.into_iter().flatten().fold(input_wm, Timestamp::min);
        if self.has_work_left() && wm >= MAX_TIMESTAMP {
            MAX_TIMESTAMP - 1
        } else {
            wm
        }
    }

    /// Whether anything is left: work queued, delayed or running, panes
    /// in the grouping buffer, timers pending.
    fn has_work_left(&self) -> bool {
        !self.queue.is_empty()
            || self.timers().is_some_and(|t| !t.is_empty())
            || self.grouping().is_some_and(|g| !g.is_empty())
    }

    /// The GroupByKey's buffer, if the stage is one.
    pub(super) fn grouping(&self) -> Option<&GroupingBuffer> {
        match &self.kind {
            KindState::Grouping(g) => Some(&g.buffer),
            _ => None,
        }
    }

    /// The GroupByKey's buffer, if the stage is one, to change.
    pub(super) fn grouping_mut(&mut self) -> Option<&mut GroupingBuffer> {
        self.grouping_state_mut().map(|g| &mut g.buffer)
    }

    /// A GroupByKey's whole state, if the stage is one.
    pub(super) fn grouping_state(&self) -> Option<&GroupingState> {
        match &self.kind {
            KindState::Grouping(g) => Some(g),
            _ => None,
        }
    }

    /// A GroupByKey's whole state, if the stage is one, to change.
    pub(super) fn grouping_state_mut(&mut self) -> Option<&mut GroupingState> {
        match &mut self.kind {
            KindState::Grouping(g) => Some(g),
            _ => None,
        }
    }

    /// An SDK stage's pending timers, if the stage is one.
    pub(super) fn timers(&self) -> Option<&TimerStore> {
        self.sdk().map(|sdk| &sdk.timers)
    }

    /// An SDK stage's state, if the stage is one.
    pub(super) fn sdk(&self) -> Option<&SdkState> {
        match &self.kind {
            KindState::Sdk(sdk) => Some(sdk),
            _ => None,
        }
    }

    /// An SDK stage's state, if the stage is one, to change.
    pub(super) fn sdk_mut(&mut self) -> Option<&mut SdkState> {
        match &mut self.kind {
            KindState::Sdk(sdk) => Some(sdk),
            _ => None,
        }
    }

    /// An SDK stage's queue, progress and state at once (the scheduler
    /// takes elements and timers together), if the stage is one.
    pub(super) fn sdk_parts(&mut self) -> Option<(&mut StageQueue, &StageProgress, &mut SdkState)> {
        match &mut self.kind {
            KindState::Sdk(sdk) => Some((&mut self.queue, &self.progress, sdk)),
            _ => None,
        }
    }

    /// When the stage next needs the wall clock: a delayed residual or a
    /// retry's backoff ending.
    pub(super) fn next_wakeup(&self) -> Option<Instant> {
        let retry = self.sdk().and_then(|sdk| sdk.retries.not_before);
        earliest(self.queue.next_delayed(), retry)
    }

    /// The processing time (ms) at which the stage next has something to
    /// do: a processing-time trigger of its buffer or a processing-time
    /// timer.
    pub(super) fn next_processing_deadline(&self) -> Option<Timestamp> {
        earliest(
            self.grouping().and_then(GroupingBuffer::next_deadline),
            self.timers().and_then(TimerStore::next_processing_time),
        )
    }

    /// Puts a bundle's input back at the front of the queue and its fired
    /// timers back in the timer store, as they were before it took them:
    /// the bundle left nothing behind (it failed, or strict mode drops its
    /// effects) and its work runs again.
    pub(super) fn run_again(
        &mut self,
        fired_timers: Vec<(TimeDomain, FiredTimer)>,
        elements: Vec<Queued>,
    ) {
        if let Some(sdk) = self.sdk_mut() {
            sdk.timers.restore(fired_timers);
        }
        for q in elements.into_iter().rev() {
            self.queue.pending.push_front(q);
        }
    }
}

impl StageQueue {
    /// Bundles in flight.
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Nothing waits and nothing runs (delayed residuals aside): what
    /// state collection and a hand-out's release wait for.
    pub(super) fn is_quiet(&self) -> bool {
        self.in_flight == 0 && self.pending.is_empty()
    }

    /// Nothing waits, is delayed or runs.
    pub(super) fn is_empty(&self) -> bool {
        self.is_quiet() && self.delayed.is_empty()
    }

    /// Bytes waiting and running: what the stage's queue bound limits.
    pub(super) fn backlog_bytes(&self) -> usize {
        self.pending.bytes() + self.in_flight_bytes
    }

    /// The key groups no bundle in flight holds.
    pub(super) fn free_key_groups(&self) -> KeyGroupSet {
        !self.locked_key_groups
    }

    /// A bundle started with input of `input_bytes` bytes holding `holds`
    /// (its elements' and fired timers' timestamps, each with how many
    /// hold there), locking `key_groups`.
    pub(super) fn bundle_started(
        &mut self,
        key_groups: KeyGroupSet,
        holds: &[(Timestamp, usize)],
        input_bytes: usize,
    ) {
        self.in_flight += 1;
        self.in_flight_bytes += input_bytes;
        self.locked_key_groups |= key_groups;
        for &(h, n) in holds {
            self.in_flight_holds.add_many(h, n);
        }
    }

    /// A bundle [`Self::bundle_started`] with these reported back.
    pub(super) fn bundle_ended(
        &mut self,
        key_groups: KeyGroupSet,
        holds: &[(Timestamp, usize)],
        input_bytes: usize,
    ) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(input_bytes);
        self.unlock_key_groups(key_groups);
        for &(h, n) in holds {
            self.in_flight_holds.remove_many(h, n);
        }
    }

    /// A split bundle no longer needs `key_groups`.
    pub(super) fn unlock_key_groups(&mut self, key_groups: KeyGroupSet) {
        self.locked_key_groups &= !key_groups;
    }

    /// Queues `element` once `at` has passed, holding output at `hold`.
    pub(super) fn delay(&mut self, at: Instant, element: DecodedElement, hold: Timestamp) {
        self.delayed.push(Delayed { at, element, hold });
    }

    /// The delayed residuals, for a checkpoint.
    pub(super) fn delayed(&self) -> &[Delayed] {
        &self.delayed
    }

    /// Replaces the delayed residuals with a checkpoint's.
    pub(super) fn restore_delayed(&mut self, delayed: Vec<Delayed>) {
        self.delayed = delayed;
    }

    /// Every delayed residual is due `now` (the job drains).
    pub(super) fn hurry_delayed(&mut self, now: Instant) {
        for d in &mut self.delayed {
            d.at = now;
        }
    }

    /// Moves the delayed residuals due by `now` to the queue.
    pub(super) fn release_delayed(&mut self, now: Instant) -> Result<(), SpillError> {
        let (ready, waiting): (Vec<_>, Vec<_>) = self.delayed.drain(..).partition(|d| d.at <= now);
        self.delayed = waiting;
        for d in ready {
            self.pending.push_back(d.element)?;
        }
        Ok(())
    }

    /// When the first delayed residual is due.
    fn next_delayed(&self) -> Option<Instant> {
        self.delayed.iter().map(|d| d.at).min()
    }

    /// The earliest timestamp waiting, delayed or running holds.
    fn hold(&self) -> Option<Timestamp> {
        let delayed = self.delayed.iter().map(|d| d.hold).min();
        earliest(
            earliest(self.pending.hold(), self.in_flight_holds.min()),
            delayed,
        )
    }
}

impl Retries {
    /// A bundle failed: how many have now failed in a row.
    pub(super) fn failed(&mut self) -> u32 {
        self.failures = self.failures.saturating_add(1);
        self.failures
    }

    /// No bundle starts before `at`.
    pub(super) fn back_off_until(&mut self, at: Instant) {
        self.not_before = Some(at);
    }

    /// A bundle succeeded: the count starts again.
    pub(super) fn succeeded(&mut self) {
        self.failures = 0;
    }

    /// Whether a bundle may start at `now`: no backoff is running.
    pub(super) fn may_start(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|at| at <= now)
    }

    /// The backoff is over (bundles are being started again).
    pub(super) fn end_backoff(&mut self) {
        self.not_before = None;
    }
}

impl StreamCursor {
    /// The next of `events` to apply, moving past it; none once all were.
    pub(super) fn next_event<'a>(
        &mut self,
        events: &'a [TestStreamEvent],
    ) -> Option<&'a TestStreamEvent> {
        let event = events.get(self.next)?;
        self.next += 1;
        Some(event)
    }

    /// A watermark event: the TestStream's output goes to `wm`, never back.
    pub(super) fn advance_watermark(&mut self, wm: Timestamp) {
        self.watermark = self.watermark.max(wm);
    }

    /// Whether events are left to apply.
    pub(super) fn has_events_left(&self) -> bool {
        self.next < self.events
    }

    /// Skips every event: on a shard that does not run the job's sources,
    /// the stream is done from the start.
    pub(super) fn skip_all(&mut self) {
        self.next = self.events;
    }

    /// The TestStream's output watermark.
    fn watermark(&self) -> Timestamp {
        if self.next >= self.events {
            MAX_TIMESTAMP
        } else {
            self.watermark
        }
    }
}

/// What a checkpoint keeps of a stage's [`KindState`], in the fields its
/// stage record has always had (one set for every kind, the ones a kind
/// does not use at their start values).
pub(super) struct KindRecord<'a> {
    /// An SDK stage's timers (empty for other kinds).
    pub(super) timers: Cow<'a, TimerStore>,
    /// An Impulse emitted.
    pub(super) impulse_done: bool,
    /// A TestStream's next event.
    pub(super) stream_cursor: u64,
    /// A TestStream's watermark.
    pub(super) stream_wm: Timestamp,
    /// An SDK stage's last state collection.
    pub(super) state_gc_wm: Timestamp,
}

impl KindState {
    /// The start state of a stage of `kind`; a GroupByKey's buffer is
    /// made by `grouping` from its windowing strategy, and fires as
    /// elements arrive if `streaming`.
    pub(super) fn of(
        kind: &StageKind,
        streaming: bool,
        grouping: impl FnOnce(&WindowingStrategy) -> Result<GroupingBuffer, EngineError>,
    ) -> Result<Self, EngineError> {
        Ok(match kind {
            StageKind::Impulse => KindState::Impulse { emitted: false },
            StageKind::Flatten => KindState::Flatten,
            StageKind::GroupByKey(strategy) => {
                KindState::Grouping(GroupingState::new(grouping(strategy)?, streaming))
            }
            StageKind::Sdk(_) => KindState::Sdk(SdkState {
                timers: TimerStore::default(),
                state_gc_wm: MIN_TIMESTAMP,
                retries: Retries::default(),
            }),
            StageKind::TestStream(events) => KindState::TestStream(StreamCursor {
                next: 0,
                watermark: MIN_TIMESTAMP,
                events: events.len(),
            }),
        })
    }

    /// What a checkpoint keeps of it.
    pub(super) fn record(&self) -> KindRecord<'_> {
        let mut record = KindRecord {
            timers: Cow::Owned(TimerStore::default()),
            impulse_done: false,
            stream_cursor: 0,
            stream_wm: MIN_TIMESTAMP,
            state_gc_wm: MIN_TIMESTAMP,
        };
        match self {
            KindState::Impulse { emitted } => record.impulse_done = *emitted,
            KindState::Sdk(sdk) => {
                record.timers = Cow::Borrowed(&sdk.timers);
                record.state_gc_wm = sdk.state_gc_wm;
            }
            KindState::TestStream(cursor) => {
                record.stream_cursor = cursor.next as u64;
                record.stream_wm = cursor.watermark;
            }
            KindState::Flatten | KindState::Grouping(_) => {}
        }
        record
    }

    /// Takes back what [`Self::record`] kept (the grouping buffer is
    /// restored on its own); an error names what a stage of this kind
    /// cannot have had.
    pub(super) fn restore(&mut self, record: KindRecord<'_>) -> Result<(), String> {
        if !matches!(self, KindState::Sdk(_)) && !record.timers.is_empty() {
            return Err("timers for a stage that is not an SDK stage".into());
        }
        match self {
            KindState::Impulse { emitted } => *emitted = record.impulse_done,
            KindState::Sdk(sdk) => {
                sdk.timers = record.timers.into_owned();
                sdk.state_gc_wm = record.state_gc_wm;
            }
            KindState::TestStream(cursor) => {
                cursor.next = usize::try_from(record.stream_cursor)
                    .map_err(|_| "a TestStream cursor past the address space".to_string())?;
                cursor.watermark = record.stream_wm;
            }
            KindState::Flatten | KindState::Grouping(_) => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coder::TimerValue;
    use crate::coder::{PaneInfo, WindowedValueHeader};
    use crate::plan::SdkStage;
    use crate::window::Window;
    use bytes::Bytes;
    use std::time::Duration;

    /// An element at `timestamp` (only its header matters here).
    fn element(timestamp: Timestamp) -> DecodedElement {
        let header = WindowedValueHeader {
            timestamp,
            windows: smallvec::smallvec![Window::Global],
            pane: PaneInfo::NO_FIRING,
        };
        DecodedElement::new(header, Bytes::from_static(&[7]), 0)
    }

    fn timer(fire: Timestamp, hold: Timestamp) -> TimerValue {
        TimerValue {
            user_key: Bytes::from_static(b"k"),
            dynamic_tag: String::new(),
            windows: smallvec::smallvec![Window::Global],
            clear: false,
            fire_timestamp: fire,
            hold_timestamp: hold,
            pane: PaneInfo::NO_FIRING,
        }
    }

    fn state_of(kind: &StageKind) -> StageState {
        StageState::new(
            KindState::of(kind, false, |_| {
                Err(EngineError::Misconfigured("no buffer".into()))
            })
            .expect("not a GroupByKey"),
        )
    }

    fn sdk_stage() -> StageState {
        state_of(&StageKind::Sdk(SdkStage::default()))
    }

    #[test]
    fn output_follows_the_input_when_nothing_holds_it() {
        let s = sdk_stage();
        assert_eq!(s.output_watermark(42), 42);
        assert_eq!(s.output_watermark(MAX_TIMESTAMP), MAX_TIMESTAMP);
    }

    #[test]
    fn each_hold_of_the_formula_holds_the_output() {
        // Waiting elements.
        let mut s = sdk_stage();
        s.queue.pending.push_back(element(10)).expect("in memory");
        assert_eq!(s.output_watermark(100), 10);
        // A bundle in flight, after its input left the queue.
        let taken = s.queue.pending.take(1);
        s.queue.bundle_started(0, &[taken[0].holds()], 1);
        assert_eq!(s.output_watermark(100), 10);
        s.queue.bundle_ended(0, &[(10, 1)], 1);
        assert_eq!(s.output_watermark(100), 100);
        // A delayed residual.
        s.queue.delay(Instant::now(), element(20), 15);
        assert_eq!(s.output_watermark(100), 15);
        s.queue.release_delayed(Instant::now()).expect("in memory");
        assert_eq!(s.output_watermark(100), 20);
        s.queue.pending.take(1);
        // A timer, at its hold.
        let sdk = s.sdk_mut().expect("an SDK stage");
        sdk.timers.set_if_absent("t", "f", timer(50, 30));
        assert_eq!(s.output_watermark(100), 30);
        assert_eq!(s.output_watermark(25), 25, "never past the input");
    }

    #[test]
    fn anything_left_keeps_the_output_below_the_end_of_time() {
        let mut s = sdk_stage();
        let sdk = s.sdk_mut().expect("an SDK stage");
        sdk.timers
            .set_if_absent("t", "f", timer(MAX_TIMESTAMP, MAX_TIMESTAMP));
        assert_eq!(s.output_watermark(MAX_TIMESTAMP), MAX_TIMESTAMP - 1);
        let mut s = sdk_stage();
        s.queue.bundle_started(0, &[], 0);
        assert_eq!(s.output_watermark(MAX_TIMESTAMP), MAX_TIMESTAMP - 1);
        s.queue.bundle_ended(0, &[], 0);
        assert_eq!(s.output_watermark(MAX_TIMESTAMP), MAX_TIMESTAMP);
    }

    #[test]
    fn a_test_stream_is_where_its_events_put_it_until_they_are_all_applied() {
        let events = vec![
            TestStreamEvent::Watermark(5),
            TestStreamEvent::Watermark(3),
            TestStreamEvent::ProcessingTime(1),
        ];
        let mut s = state_of(&StageKind::TestStream(events.clone()));
        let KindState::TestStream(cursor) = &mut s.kind else {
            panic!("a TestStream's state");
        };
        for _ in 0..2 {
            if let Some(TestStreamEvent::Watermark(wm)) = cursor.next_event(&events) {
                cursor.advance_watermark(*wm);
            }
        }
        assert_eq!(s.output_watermark(MAX_TIMESTAMP), 5, "never back");
        let KindState::TestStream(cursor) = &mut s.kind else {
            panic!("a TestStream's state");
        };
        assert!(cursor.next_event(&events).is_some());
        assert!(cursor.next_event(&events).is_none());
        assert_eq!(s.output_watermark(MIN_TIMESTAMP), MAX_TIMESTAMP);
    }

    #[test]
    fn retries_back_off_and_count_failures_in_a_row() {
        let mut retries = Retries::default();
        let now = Instant::now();
        assert!(retries.may_start(now));
        assert_eq!(retries.failed(), 1);
        assert_eq!(retries.failed(), 2);
        retries.back_off_until(now + Duration::from_secs(1));
        assert!(!retries.may_start(now));
        assert!(retries.may_start(now + Duration::from_secs(1)));
        retries.end_backoff();
        assert!(retries.may_start(now));
        retries.succeeded();
        assert_eq!(retries.failed(), 1, "a success starts the count again");
    }

    #[test]
    fn the_next_wakeup_is_the_first_delayed_residual_or_retry() {
        let mut s = sdk_stage();
        let now = Instant::now();
        assert_eq!(s.next_wakeup(), None);
        s.queue.delay(now + Duration::from_secs(5), element(1), 1);
        let sdk = s.sdk_mut().expect("an SDK stage");
        sdk.retries.back_off_until(now + Duration::from_secs(2));
        assert_eq!(s.next_wakeup(), Some(now + Duration::from_secs(2)));
        s.queue.hurry_delayed(now);
        assert_eq!(s.next_wakeup(), Some(now));
    }

    #[test]
    fn a_kind_record_restores_what_it_kept() {
        let events = vec![
            TestStreamEvent::Watermark(9),
            TestStreamEvent::Watermark(12),
        ];
        let mut stream = state_of(&StageKind::TestStream(events.clone()));
        if let KindState::TestStream(cursor) = &mut stream.kind {
            cursor.next_event(&events);
            cursor.advance_watermark(9);
        }
        let mut impulse = state_of(&StageKind::Impulse);
        impulse.kind = KindState::Impulse { emitted: true };
        let mut sdk = sdk_stage();
        if let Some(state) = sdk.sdk_mut() {
            state.timers.set_if_absent("t", "f", timer(40, 40));
            state.state_gc_wm = 33;
        }
        for (kind, original) in [
            (StageKind::TestStream(events.clone()), &stream),
            (StageKind::Impulse, &impulse),
            (StageKind::Sdk(SdkStage::default()), &sdk),
        ] {
            let mut restored = state_of(&kind);
            restored
                .kind
                .restore(original.kind.record())
                .expect("the same kind");
            for input in [MIN_TIMESTAMP, 35, MAX_TIMESTAMP] {
                assert_eq!(
                    restored.output_watermark(input),
                    original.output_watermark(input)
                );
            }
            let (a, b) = (restored.kind.record(), original.kind.record());
            assert_eq!(
                (a.impulse_done, a.stream_cursor, a.stream_wm, a.state_gc_wm),
                (b.impulse_done, b.stream_cursor, b.stream_wm, b.state_gc_wm)
            );
            assert_eq!(a.timers.is_empty(), b.timers.is_empty());
        }
        // Timers belong only to SDK stages.
        let mut flatten = state_of(&StageKind::Flatten);
        assert!(flatten.kind.restore(sdk.kind.record()).is_err());
    }
}
