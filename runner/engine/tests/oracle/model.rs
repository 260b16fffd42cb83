//! The reference evaluator: what Beam says a GroupByKey must emit.
//!
//! Everything here is written from the Beam model, not from the engine, and
//! is kept deliberately naive — a map from (key, window) to the elements
//! seen, re-scanned on every question — so that it can be read as the
//! specification. Two evaluators share the vocabulary:
//!
//! * [`batch_reference`]: the whole input at once, default trigger. Every
//!   (key, window) — after merging sessions — gets exactly one pane holding
//!   all of its values: the first, on-time pane.
//! * [`StreamingReference`]: elements and watermark advances interleaved, with
//!   a few triggers. It follows Beam's `ReduceFnRunner` rules (late data,
//!   garbage collection, `needToEmit`) and its `PaneInfoTracker` (pane timing)
//!   and `WatermarkHold` (output timestamps), restated one window at a time.

use std::collections::BTreeMap;

use refract_engine::plan::{
    AccumulationMode, ClosingBehavior, OnTimeBehavior, OutputTime, Trigger, WindowFn,
    WindowingStrategy,
};
use refract_engine::time::{Timestamp, GLOBAL_WINDOW_MAX_TIMESTAMP};
use refract_engine::window::Window;

/// A key: one byte, encoded by the pipelines as a one-byte `bytes` value.
pub type Key = u8;

/// One input element. `id` is its value, unique within a test case, so that
/// every value seen in a pane can be traced back to the element it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Input {
    /// The element's key.
    pub key: Key,
    /// The element's value (unique per case).
    pub id: i64,
    /// Event time.
    pub ts: Timestamp,
}

/// Pane timing, ordered (unlike the engine's `PaneTiming`) so panes sort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Timing {
    /// Before the watermark passed the end of the window.
    Early,
    /// The one pane for the watermark passing the end of the window.
    OnTime,
    /// After the on-time pane, or behind the output watermark.
    Late,
    /// Never grouped (must not appear in grouped output).
    Unknown,
}

/// One grouped output element, as emitted by the engine or predicted by a
/// reference: `KV<key, Iterable<value>>` in one window, with its pane.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pane {
    /// The key.
    pub key: Key,
    /// The (merged, for sessions) window.
    pub window: Window,
    /// Zero-based index of the pane among its window's panes.
    pub index: i64,
    /// Timing of the pane.
    pub timing: Timing,
    /// Index among non-early panes, -1 for early panes.
    pub nonspeculative_index: i64,
    /// First pane of its window.
    pub is_first: bool,
    /// Last pane of its window.
    pub is_last: bool,
    /// Timestamp of the grouped element.
    pub timestamp: Timestamp,
    /// The grouped values, sorted (panes are compared as multisets).
    pub values: Vec<i64>,
}

/// The windows the SDK's `WindowInto` puts an element at `ts` in. This is the
/// SDK's job, not the runner's, so the tests do it themselves; both the
/// engine and the reference then see the same windows. Sessions start as the
/// proto-window `[ts, ts + gap)` and are merged at grouping time.
pub fn assign_windows(window_fn: &WindowFn, ts: Timestamp) -> Vec<Window> {
    // The start of the window (of length `period`, shifted by `offset`) that
    // contains `ts`: floor division, also for negative timestamps.
    let last_start = |period: i64, offset: i64| ts - (ts - offset).rem_euclid(period);
    match *window_fn {
        WindowFn::Global => vec![Window::Global],
        WindowFn::Fixed { size, offset } => {
            let start = last_start(size, offset);
            vec![Window::Interval {
                start,
                end: start + size,
            }]
        }
        WindowFn::Sliding {
            size,
            period,
            offset,
        } => {
            // Every window start s = offset + k * period with s <= ts < s + size.
            let mut windows = Vec::new();
            let mut start = last_start(period, offset);
            while start > ts - size {
                windows.push(Window::Interval {
                    start,
                    end: start + size,
                });
                start -= period;
            }
            windows
        }
        WindowFn::Sessions { gap } => vec![Window::Interval {
            start: ts,
            end: ts + gap,
        }],
        WindowFn::Custom { .. } => unreachable!("custom windows are assigned by the SDK"),
    }
}

/// When a window is garbage collected: its end plus the allowed lateness,
/// but never after the end of the global window (Beam's
/// `LateDataUtils.garbageCollectionTime`), so that every window closes once
/// the watermark reaches +∞.
pub fn garbage_collection_time(window: &Window, allowed_lateness: i64) -> Timestamp {
    let max = window.max_timestamp();
    if max > GLOBAL_WINDOW_MAX_TIMESTAMP.saturating_sub(allowed_lateness) {
        GLOBAL_WINDOW_MAX_TIMESTAMP
    } else {
        max + allowed_lateness
    }
}

/// Whether an element in `window` arriving at input watermark `watermark` is
/// dropped as too late: its window expired (`max + lateness < watermark`).
pub fn is_droppably_late(window: &Window, allowed_lateness: i64, watermark: Timestamp) -> bool {
    window.max_timestamp().saturating_add(allowed_lateness) < watermark
}

/// The timestamp of a pane whose timestamp-contributing elements are at
/// `timestamps`: the end of the window, or the earliest or latest of them,
/// never beyond the end of the window; the end of the window if there are
/// none.
pub fn output_timestamp(
    output_time: OutputTime,
    window: &Window,
    timestamps: impl IntoIterator<Item = Timestamp>,
) -> Timestamp {
    let end = window.max_timestamp();
    let timestamps = timestamps.into_iter();
    let combined = match output_time {
        OutputTime::EndOfWindow => None,
        OutputTime::EarliestInPane => timestamps.min(),
        OutputTime::LatestInPane => timestamps.max(),
    };
    combined.map_or(end, |t| t.min(end))
}

/// Merge a key's session proto-windows: intervals that overlap (share at
/// least one millisecond; touching is not enough) become their union,
/// transitively.
fn merge_sessions(
    groups: BTreeMap<(Key, Window), Vec<Input>>,
) -> BTreeMap<(Key, Window), Vec<Input>> {
    let mut merged: BTreeMap<(Key, Window), Vec<Input>> = BTreeMap::new();
    // (key, start, end, members) of the session being built.
    let mut current: Option<(Key, Timestamp, Timestamp, Vec<Input>)> = None;
    // BTreeMap order: by key, then by start.
    for ((key, window), members) in groups {
        let Window::Interval { start, end } = window else {
            unreachable!("sessions are interval windows");
        };
        match current.as_mut() {
            Some((k, _, cur_end, acc)) if *k == key && start < *cur_end => {
                *cur_end = (*cur_end).max(end);
                acc.extend(members);
            }
            _ => {
                if let Some((k, s, e, acc)) = current.take() {
                    merged.insert((k, Window::Interval { start: s, end: e }), acc);
                }
                current = Some((key, start, end, members));
            }
        }
    }
    if let Some((k, s, e, acc)) = current {
        merged.insert((k, Window::Interval { start: s, end: e }), acc);
    }
    merged
}

/// What a batch GroupByKey with the default trigger emits for `inputs`: one
/// pane per (key, window) with all of its values, first, on time and (the
/// window being complete) last. Sorted.
pub fn batch_reference(inputs: &[Input], strategy: &WindowingStrategy) -> Vec<Pane> {
    let mut groups: BTreeMap<(Key, Window), Vec<Input>> = BTreeMap::new();
    for input in inputs {
        for window in assign_windows(&strategy.window_fn, input.ts) {
            groups.entry((input.key, window)).or_default().push(*input);
        }
    }
    if let WindowFn::Sessions { .. } = strategy.window_fn {
        groups = merge_sessions(groups);
    }
    groups
        .into_iter()
        .map(|((key, window), members)| {
            let mut values: Vec<i64> = members.iter().map(|m| m.id).collect();
            values.sort_unstable();
            Pane {
                key,
                timestamp: output_timestamp(
                    strategy.output_time,
                    &window,
                    members.iter().map(|m| m.ts),
                ),
                window,
                index: 0,
                timing: Timing::OnTime,
                nonspeculative_index: 0,
                is_first: true,
                is_last: true,
                values,
            }
        })
        .collect()
}

/// The triggers the streaming reference knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefTrigger {
    /// `DefaultTrigger`: on time, then once per batch of late data.
    Default,
    /// `Repeatedly(AfterCount(n))`.
    EveryN(i64),
    /// `AfterWatermark(early=AfterCount(1), late=AfterCount(1))`.
    EarlyAndLate,
    /// `AfterWatermark()`: fires on time, then is finished — the window is
    /// closed and later data for it is dropped.
    OnTimeOnly,
}

impl RefTrigger {
    /// The engine's spelling of this trigger.
    pub fn to_engine(self) -> Trigger {
        let every = |n| Some(Box::new(Trigger::ElementCount(n)));
        match self {
            RefTrigger::Default => Trigger::Default,
            RefTrigger::EveryN(n) => Trigger::Repeat(Box::new(Trigger::ElementCount(n))),
            RefTrigger::EarlyAndLate => Trigger::AfterEndOfWindow {
                early: every(1),
                late: every(1),
            },
            RefTrigger::OnTimeOnly => Trigger::AfterEndOfWindow {
                early: None,
                late: None,
            },
        }
    }
}

/// An element accepted into a window.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    id: i64,
    ts: Timestamp,
    /// Whether it holds the output watermark (Beam's "element hold"): only if
    /// it arrived before the watermark passed the end of its window and its
    /// hold time was not already behind the output watermark. Only such
    /// elements contribute to a pane's timestamp.
    holds: bool,
}

/// Beam's per-window state, reduced to what the triggers above need.
#[derive(Debug, Default)]
struct WindowState {
    /// Elements accepted, in arrival order.
    arrivals: Vec<Arrival>,
    /// `arrivals[..emitted]` were in earlier panes.
    emitted: usize,
    /// Panes emitted so far.
    panes: i64,
    /// Non-early panes emitted so far.
    nonspeculative: i64,
    /// The watermark already passed the end of the window at an evaluation
    /// (the on-time firing point of `AfterWatermark` triggers is behind us).
    end_of_window_seen: bool,
    /// The trigger finished: the window takes no more data and emits no
    /// more panes.
    closed: bool,
}

/// Streaming GroupByKey per Beam, one (key, window) at a time. Non-merging
/// window functions only.
#[derive(Debug)]
pub struct StreamingReference {
    window_fn: WindowFn,
    trigger: RefTrigger,
    accumulation: AccumulationMode,
    output_time: OutputTime,
    allowed_lateness: i64,
    closing: ClosingBehavior,
    on_time: OnTimeBehavior,
    windows: BTreeMap<(Key, Window), WindowState>,
    /// (element, window) pairs dropped because the window had expired.
    pub dropped_late: u64,
    /// (element, window) pairs dropped because the trigger had finished.
    pub dropped_closed: u64,
}

impl StreamingReference {
    /// A reference for `strategy`, whose trigger is `trigger`.
    pub fn new(strategy: &WindowingStrategy, trigger: RefTrigger) -> Self {
        assert!(
            !strategy.window_fn.is_merging(),
            "merging windows are not modelled"
        );
        StreamingReference {
            window_fn: strategy.window_fn.clone(),
            trigger,
            accumulation: strategy.accumulation,
            output_time: strategy.output_time,
            allowed_lateness: strategy.allowed_lateness,
            closing: strategy.closing_behavior,
            on_time: strategy.on_time_behavior,
            windows: BTreeMap::new(),
            dropped_late: 0,
            dropped_closed: 0,
        }
    }

    /// `input` arrives while the input watermark is `watermark` and the
    /// stage's published output watermark is `output_watermark`.
    pub fn add(&mut self, input: Input, watermark: Timestamp, output_watermark: Timestamp) {
        for window in assign_windows(&self.window_fn, input.ts) {
            if is_droppably_late(&window, self.allowed_lateness, watermark) {
                self.dropped_late += 1;
                continue;
            }
            let max = window.max_timestamp();
            let state = self.windows.entry((input.key, window)).or_default();
            if state.closed {
                self.dropped_closed += 1;
                continue;
            }
            let hold_at = match self.output_time {
                OutputTime::EndOfWindow => max,
                OutputTime::EarliestInPane | OutputTime::LatestInPane => input.ts,
            };
            state.arrivals.push(Arrival {
                id: input.id,
                ts: input.ts,
                holds: watermark <= max && hold_at >= output_watermark,
            });
        }
    }

    /// Evaluate every window at input watermark `watermark`, with the stage's
    /// output watermark published so far at `output_watermark`; returns the
    /// panes emitted, sorted.
    pub fn evaluate(&mut self, watermark: Timestamp, output_watermark: Timestamp) -> Vec<Pane> {
        let mut panes = Vec::new();
        let mut collected = Vec::new();
        for ((key, window), state) in &mut self.windows {
            let max = window.max_timestamp();
            let past_end = watermark > max;
            let new = state.arrivals.len() - state.emitted;
            // PaneInfoTracker: early before the end of the window; after it,
            // the first non-early pane is on time unless it is already behind
            // the output watermark; everything after that is late.
            let timing = if !past_end {
                Timing::Early
            } else if state.nonspeculative > 0 || max < output_watermark {
                Timing::Late
            } else {
                Timing::OnTime
            };
            // ReduceFnRunner.needToEmit.
            let need_to_emit = |is_final: bool| {
                new > 0
                    || (timing == Timing::OnTime && self.on_time == OnTimeBehavior::FireAlways)
                    || (is_final && self.closing == ClosingBehavior::EmitAlways)
            };
            let expired = garbage_collection_time(window, self.allowed_lateness) < watermark;
            let on_time_point = past_end && !state.end_of_window_seen;
            if past_end {
                state.end_of_window_seen = true;
            }
            let mut emit_as = None;
            if state.closed {
                // A finished trigger owes nothing, not even at GC.
            } else if expired {
                // Garbage collection: one final pane with whatever is left.
                if need_to_emit(true) {
                    emit_as = Some(true);
                }
            } else {
                let (fires, finishes) = match self.trigger {
                    RefTrigger::Default => (past_end, false),
                    RefTrigger::EveryN(n) => (new as i64 >= n, false),
                    RefTrigger::EarlyAndLate => (on_time_point || new >= 1, false),
                    RefTrigger::OnTimeOnly => (on_time_point, on_time_point),
                };
                if fires && need_to_emit(finishes) {
                    emit_as = Some(finishes);
                }
                state.closed = finishes;
            }
            if let Some(is_last) = emit_as {
                let fresh = &state.arrivals[state.emitted..];
                let contents = match self.accumulation {
                    AccumulationMode::Discarding => fresh,
                    AccumulationMode::Accumulating => &state.arrivals[..],
                };
                let mut values: Vec<i64> = contents.iter().map(|a| a.id).collect();
                values.sort_unstable();
                panes.push(Pane {
                    key: *key,
                    window: window.clone(),
                    index: state.panes,
                    timing,
                    nonspeculative_index: if timing == Timing::Early {
                        -1
                    } else {
                        state.nonspeculative
                    },
                    is_first: state.panes == 0,
                    is_last,
                    // Holds are released at every pane, so only this pane's
                    // new, hold-setting elements count (WatermarkHold).
                    timestamp: output_timestamp(
                        self.output_time,
                        window,
                        fresh.iter().filter(|a| a.holds).map(|a| a.ts),
                    ),
                    values,
                });
                state.emitted = state.arrivals.len();
                state.panes += 1;
                if timing != Timing::Early {
                    state.nonspeculative += 1;
                }
            }
            if expired {
                collected.push((*key, window.clone()));
            }
        }
        for k in collected {
            self.windows.remove(&k);
        }
        panes.sort();
        panes
    }

    /// Whether no window is left (all garbage collected).
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }
}
