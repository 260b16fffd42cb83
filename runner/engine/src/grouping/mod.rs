//! GroupByKey, done by the runner.
//!
//! Elements of a `KV<K, V>` PCollection are exploded into their windows and
//! buffered per (encoded key, window). Keys are compared as encoded bytes,
//! which is why key coders must be deterministic and why translation
//! length-prefixes key coders the runner cannot parse. Merging window
//! functions (sessions) merge a key's windows as elements arrive. A pane of
//! a (key, window) fires when the trigger says so — for the default trigger,
//! once the input watermark passes the end of the window — and is emitted as
//! `KV<K, Iterable<V>>` in the same window.
//!
//! While data is buffered, the stage holds its output watermark at the
//! timestamp its next pane will carry, so downstream stages never see a
//! watermark that has passed data still to come.
//!
//! A buffer given a spill store ([`GroupingBuffer::enable_spill`]) moves
//! what it holds there when it outgrows its memory share, and emits the
//! spilled windows a few megabytes at a time when they fire (`spill`).

mod fired;
mod hold_range;
mod key_table;
mod spill;

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

use rustc_hash::FxHashSet;
use smallvec::SmallVec;

use bytes::Bytes;
use thiserror::Error;

use crate::coder::{
    iterable_len_bytes, Coder, CoderError, DecodedElement, PaneInfo, PaneTiming,
    WindowedValueHeader,
};
use crate::holds::Holds;
use crate::plan::{
    AccumulationMode, ClosingBehavior, FinishedTrigger, OnTimeBehavior, OutputTime, Trigger,
    WindowFn, WindowingStrategy,
};
use crate::spill::SpillError;
use crate::time::{earliest, Timestamp, MAX_TIMESTAMP};
use crate::trigger::{TriggerContext, TriggerState};
use crate::window::Window;
pub use fired::Fired;
use hold_range::HoldRange;
use key_table::{KeyTable, Retain};
pub(crate) use spill::SpilledWindows;
pub use spill::{read_iterable_page, IterablePage};
use spill::{KEY_OVERHEAD, PANE_OVERHEAD};

/// Why a grouping buffer could not take or emit elements.
#[derive(Debug, Error)]
pub enum GroupingError {
    /// Element bytes did not match the coders.
    #[error(transparent)]
    Coder(#[from] CoderError),
    /// The spill store failed.
    #[error(transparent)]
    Spill(#[from] SpillError),
}

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

impl Pane {
    fn new(trigger: &Trigger) -> Self {
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

    fn add(&mut self, value: &[u8], hold: Timestamp) {
        self.values.extend_from_slice(value);
        self.count = self.count.saturating_add(1);
        self.new_data = true;
        self.holds.add(hold);
    }

    fn absorb(&mut self, other: Pane) {
        self.values.extend_from_slice(&other.values);
        self.count = self.count.saturating_add(other.count);
        self.new_data |= other.new_data;
        self.holds.absorb(other.holds);
        self.fired = self.fired.max(other.fired);
        self.nonspeculative_fired = self.nonspeculative_fired.max(other.nonspeculative_fired);
        self.trigger.merge(&other.trigger);
    }
}

/// A pane's values; up to 16 bytes need no allocation.
type PaneValues = SmallVec<[u8; 16]>;

/// One key's panes, sorted by window. Most keys have one window, kept in
/// place (in the key's table entry: no allocation per key, and an
/// evaluation walks the entries' memory in order); more go to the heap as
/// a sorted vector, which beats a map per key.
type KeyPanes = SmallVec<[(Window, Pane); 1]>;

/// Where `window` is (or would go) in `panes`.
fn position(panes: &KeyPanes, window: &Window) -> Result<usize, usize> {
    panes.binary_search_by(|(w, _)| w.cmp(window))
}

/// Buffers and fires the panes of one GroupByKey stage.
///
/// Evaluation is incremental: a trigger can only become ready when its
/// window gets data, when the watermark passes the window's end or
/// garbage-collection time, or when processing time moves. So only keys
/// that got data since the last evaluation are looked at, unless the input
/// watermark passed the earliest such point of any buffered window (then
/// every key is, once) or the trigger reads processing time (then always).
/// The output-time holds of panes with unfired data are kept in a
/// multiset, so the stage's hold is read without a scan.
#[derive(Debug)]
pub struct GroupingBuffer {
    strategy: WindowingStrategy,
    key_coder_kv: Coder,
    window_coder: Coder,
    /// key -> its panes (keys are the runner's own encoded bytes).
    panes: KeyTable<KeyPanes>,
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
    /// window (the default trigger, for one).
    fires_only_past_end: bool,
    /// Keys whose windows the SDK must merge before panes may fire
    /// (custom merging window functions only).
    unmerged: BTreeSet<Bytes>,
    /// Keys that got data or merged windows since the last evaluation.
    touched: FxHashSet<key_table::Key>,
    /// The earliest watermark at which some buffered window's trigger may
    /// fire or the window expire without new data (a lower bound).
    next_wake: Timestamp,
    /// Every key needs a look at the next evaluation (after a restore).
    rescan: bool,
    /// Output times of the panes holding unfired data.
    holds: Holds,
    /// About how many bytes the buffered panes take (values plus
    /// bookkeeping estimates): what the spill limit is checked against.
    memory_bytes: usize,
    /// Where the buffer spills, if it may.
    spill: Option<spill::SpillSpace>,
}

/// The changing part of a grouping buffer, for checkpoints: the strategy
/// and coders come from the plan. Keys are sorted so that an unchanged
/// buffer snapshots to the same bytes (and an incremental checkpoint can
/// skip it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct GroupingSnapshot {
    panes: Vec<(Bytes, KeyPanes)>,
    dropped_late: u64,
    output_watermark: Timestamp,
    unmerged: Vec<Bytes>,
}

/// What firing needs besides the pane, borrowed apart from the panes.
struct Firing<'a> {
    strategy: &'a WindowingStrategy,
    window_coder: &'a Coder,
    output_watermark: Timestamp,
}

/// One evaluation's view of a buffer, borrowed apart from its panes, and
/// what it has done so far.
struct Evaluation<'a> {
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

impl GroupingBuffer {
    /// A buffer for a GroupByKey whose input elements are `input_value_coder`
    /// (a `Kv` coder) in windows of `window_coder`.
    pub fn new(strategy: WindowingStrategy, input_value_coder: Coder, window_coder: Coder) -> Self {
        GroupingBuffer {
            uses_processing_time: strategy.trigger.fires_on_processing_time(),
            fires_only_past_end: !strategy.trigger.fires_before_window_end(),
            strategy,
            key_coder_kv: input_value_coder,
            window_coder,
            panes: KeyTable::default(),
            dropped_late: 0,
            drops_late_data: true,
            output_watermark: crate::time::MIN_TIMESTAMP,
            unmerged: BTreeSet::new(),
            touched: FxHashSet::default(),
            next_wake: MAX_TIMESTAMP,
            rescan: false,
            holds: Holds::default(),
            memory_bytes: 0,
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

    /// What a checkpoint keeps of this buffer: everything, spilled panes
    /// read back included.
    pub(crate) fn snapshot(&self) -> Result<GroupingSnapshot, SpillError> {
        // (A buffer that handed a key out refuses: see `read_back`.)
        if !self.has_spilled() && !self.has_live_hand_outs() {
            return Ok(self.memory_snapshot());
        }
        let mut all: std::collections::BTreeMap<Bytes, KeyPanes> = self
            .panes
            .iter()
            .map(|(key, windows)| (Bytes::copy_from_slice(key), windows.clone()))
            .collect();
        self.with_spilled(&mut all)?;
        Ok(self.snapshot_of(all.into_iter().collect()))
    }

    /// The panes in memory, and what the buffer counts, as a checkpoint
    /// keeps them.
    pub(crate) fn memory_snapshot(&self) -> GroupingSnapshot {
        self.snapshot_of(
            self.panes
                .iter()
                .map(|(key, windows)| (Bytes::copy_from_slice(key), windows.clone()))
                .collect(),
        )
    }

    fn snapshot_of(&self, mut panes: Vec<(Bytes, KeyPanes)>) -> GroupingSnapshot {
        panes.sort_by(|a, b| a.0.cmp(&b.0));
        GroupingSnapshot {
            panes,
            dropped_late: self.dropped_late,
            output_watermark: self.output_watermark,
            unmerged: self.unmerged.iter().cloned().collect(),
        }
    }

    /// Puts back what [`Self::checkpoint`] kept: `snapshot`, and the
    /// spilled windows `named` names on a durable store (what is there and
    /// not named is deleted); the next evaluation looks at every pane
    /// again. (Spills again if that is more than memory allows.)
    pub(crate) fn restore(
        &mut self,
        snapshot: GroupingSnapshot,
        named: Option<SpilledWindows>,
    ) -> Result<(), GroupingError> {
        self.panes = snapshot.panes.into_iter().collect();
        self.dropped_late = snapshot.dropped_late;
        self.output_watermark = snapshot.output_watermark;
        self.unmerged = snapshot.unmerged.into_iter().collect();
        self.touched.clear();
        self.rescan = true;
        self.holds = Holds::default();
        self.memory_bytes = 0;
        for (key, windows) in self.panes.iter() {
            self.memory_bytes += key.len() + KEY_OVERHEAD;
            for (window, pane) in windows {
                self.memory_bytes += pane.values.len() + PANE_OVERHEAD;
                if let Some(h) = pane_hold(&self.strategy, window, pane) {
                    self.holds.add(h);
                }
            }
        }
        self.reset_spill(named)
    }

    /// Number of late elements dropped so far.
    pub fn dropped_late(&self) -> u64 {
        self.dropped_late
    }

    /// Whether nothing is buffered (in memory or spilled).
    pub fn is_empty(&self) -> bool {
        self.panes.is_empty() && !self.has_spilled()
    }

    /// A window is garbage-collected once the watermark passes its end plus
    /// the allowed lateness, capped at the end of the global window (as
    /// Beam caps it), so that huge lateness still closes at the end of time.
    fn expired(&self, window: &Window, watermark: Timestamp) -> bool {
        window.garbage_collection_time(self.strategy.allowed_lateness) < watermark
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
        self.panes.expect_lookups(elements);
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
            if self.drops_late_data && self.expired(window, input_watermark) {
                self.dropped_late += 1;
                continue;
            }
            let ctx = TriggerContext {
                window_end: window.max_timestamp(),
                watermark: input_watermark,
                now,
            };
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
            // Looked up by the borrowed bytes: a key is copied into the
            // table once, when it is new (and again only when it is recorded
            // elsewhere, below). A new key's entry is made with its pane in
            // it: written once, where it stays (a GroupByKey over distinct
            // keys makes one per element).
            let trigger = &self.strategy.trigger;
            let (windows, new_key) = self.panes.get_or_insert_with(key, || {
                KeyPanes::from_buf([(window.clone(), Pane::new(trigger))])
            });
            let at = if new_key {
                self.memory_bytes += key.len() + KEY_OVERHEAD + PANE_OVERHEAD;
                0
            } else {
                match position(windows, window) {
                    Ok(at) => at,
                    Err(at) => {
                        windows.insert(at, (window.clone(), Pane::new(trigger)));
                        self.memory_bytes += PANE_OVERHEAD;
                        at
                    }
                }
            };
            let (window, pane) = &mut windows[at];
            let before = pane_hold(&self.strategy, window, pane);
            if pane.trigger.is_finished() {
                match self.strategy.finished_trigger {
                    // The trigger closed the window: the data is dropped
                    // (not late: Beam counts the two apart).
                    FinishedTrigger::ClosesWindow => continue,
                    // It starts over for data that still arrives before
                    // the window expires; what it has not fired by then is
                    // emitted when the window closes.
                    FinishedTrigger::Restarts => pane.trigger = TriggerState::new(trigger),
                }
            }
            pane.add(value, hold);
            self.memory_bytes += value.len();
            pane.trigger.on_element(&ctx);
            let after = pane_hold(&self.strategy, window, pane);
            update_holds(&mut self.holds, before, after);
            self.next_wake = self.next_wake.min(wake(
                window,
                input_watermark,
                self.strategy.allowed_lateness,
            ));
            match self.strategy.window_fn {
                WindowFn::Sessions { .. } => {
                    merge_intervals(windows, &self.strategy, &mut self.holds);
                }
                WindowFn::Custom { merging: true } if !self.unmerged.contains(key) => {
                    self.unmerged.insert(Bytes::copy_from_slice(key));
                }
                _ => {}
            }
            // Before the watermark passes the window, an element cannot
            // make a trigger that waits for it ready.
            if (late || !self.fires_only_past_end) && !self.touched.contains(key) {
                self.touched.insert(key_table::Key::from_slice(key));
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
            .map(|key| {
                let windows = self
                    .panes
                    .get(key)
                    .map(|w| w.iter().map(|(w, _)| w.clone()).collect())
                    .unwrap_or_default();
                (key.clone(), windows)
            })
            .collect()
    }

    /// Apply the SDK's merge results for `key`: the panes of each result's
    /// originals become one pane of the result window. Windows the key no
    /// longer has are ignored.
    pub fn apply_merges(&mut self, key: &Bytes, merges: crate::window_merge::Merges) {
        self.unmerged.remove(key);
        // Only this key's windows changed; the earliest wake point stays a
        // lower bound (a merged window ends no earlier than its parts).
        self.touched.insert(key_table::Key::from_slice(key));
        let Some(windows) = self.panes.get_mut(key) else {
            return;
        };
        for (result, originals) in merges {
            let mut combined: Option<Pane> = None;
            for original in originals {
                if let Ok(at) = position(windows, &original) {
                    let (w, p) = windows.remove(at);
                    update_holds(&mut self.holds, pane_hold(&self.strategy, &w, &p), None);
                    match combined.as_mut() {
                        Some(c) => c.absorb(p),
                        None => combined = Some(p),
                    }
                }
            }
            if let Some(c) = combined {
                insert_pane(windows, result, c, &self.strategy, &mut self.holds);
            }
        }
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
        let held = earliest(self.holds.min(), self.spilled_hold());
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
        self.panes
            .values()
            .flat_map(|w| w.iter())
            .filter_map(|(_, p)| p.trigger.next_deadline())
            .min()
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
        if let Some(emitted) =
            self.evaluate_spilled_sessions(input_watermark, now, out, max_bytes)?
        {
            return Ok(emitted);
        }
        self.start_drains(input_watermark)?;
        let emitted = self.evaluate_keys(input_watermark, now, out, max_bytes, |_| true)?;
        self.publish(input_watermark);
        Ok(emitted)
    }

    /// The walk of [`Self::evaluate`] over the keys in memory that
    /// `evaluated` accepts (the others only count towards the wake point):
    /// every key once the watermark passed the earliest wake point (or
    /// after a restore, or with a processing-time trigger), else those that
    /// got data. When every key is looked at, `out` is given room for what
    /// the buffer holds, up to `max_bytes`, at the first pane.
    fn evaluate_keys(
        &mut self,
        input_watermark: Timestamp,
        now: Timestamp,
        out: &mut Fired,
        max_bytes: usize,
        evaluated: impl Fn(&KeyPanes) -> bool,
    ) -> Result<usize, GroupingError> {
        let every_key =
            self.uses_processing_time || self.rescan || input_watermark > self.next_wake;
        let (room, room_elements) = if every_key {
            (
                self.memory_bytes.min(max_bytes),
                expected_elements(self.panes.len(), self.memory_bytes, max_bytes),
            )
        } else {
            (0, 0)
        };
        let mut view = self.evaluation_view(input_watermark, now);
        view.evaluation.room = room;
        view.evaluation.room_elements = room_elements;
        let emitted = view.walk(every_key, out, max_bytes, evaluated)?;
        if self.panes.is_empty() {
            self.memory_bytes = 0;
        }
        Ok(emitted)
    }

    /// The input watermark reached `input_watermark` but evaluation has to
    /// wait (the consumers are over their bound, or windows wait for the
    /// SDK to merge them): if that may make panes ready, every key is owed
    /// a look, and the output watermark stays where it is until then.
    pub fn postpone(&mut self, input_watermark: Timestamp) {
        if self.uses_processing_time || input_watermark > self.next_wake {
            self.rescan = true;
        }
    }

    /// About how many bytes the buffer holds in memory (what its spill
    /// limit is checked against): a GroupByKey's backlog.
    pub fn buffered_bytes(&self) -> usize {
        self.memory_bytes
    }

    /// Whether some keys wait for [`Self::evaluate`] to look at them (it
    /// stopped at its byte limit, or they got data since).
    pub fn has_unevaluated(&self) -> bool {
        self.rescan || !self.touched.is_empty()
    }

    /// An evaluation at `input_watermark` and `now`, borrowed apart from
    /// what it walks.
    fn evaluation_view(
        &mut self,
        input_watermark: Timestamp,
        now: Timestamp,
    ) -> EvaluationView<'_> {
        let GroupingBuffer {
            strategy,
            window_coder,
            panes,
            holds,
            output_watermark,
            next_wake,
            memory_bytes,
            touched,
            rescan,
            ..
        } = self;
        let firing = Firing {
            strategy,
            window_coder,
            output_watermark: *output_watermark,
        };
        EvaluationView {
            evaluation: Evaluation::new(
                firing,
                input_watermark,
                now,
                holds,
                next_wake,
                memory_bytes,
            ),
            panes,
            touched,
            rescan,
        }
    }

    /// Records the output watermark the stage publishes after a firing.
    fn publish(&mut self, input_watermark: Timestamp) {
        let published = self
            .hold()
            .map_or(input_watermark, |h| h.min(input_watermark));
        self.output_watermark = self.output_watermark.max(published);
    }
}

/// An evaluation and the parts of the buffer it walks, borrowed apart.
struct EvaluationView<'a> {
    evaluation: Evaluation<'a>,
    panes: &'a mut KeyTable<KeyPanes>,
    touched: &'a mut FxHashSet<key_table::Key>,
    rescan: &'a mut bool,
}

impl EvaluationView<'_> {
    /// Evaluates every key (`every_key`) or the keys that got data, those
    /// of them that `evaluated` accepts (the others only count towards the
    /// wake point); stops once `out` holds `max_bytes`, leaving the keys
    /// not reached for the next call. The number of panes emitted.
    fn walk(
        self,
        every_key: bool,
        out: &mut Fired,
        max_bytes: usize,
        evaluated: impl Fn(&KeyPanes) -> bool,
    ) -> Result<usize, CoderError> {
        let EvaluationView {
            evaluation: mut firing,
            panes,
            touched,
            rescan,
        } = self;
        let full = |out: &Fired, firing: &Evaluation| {
            out.bytes.len() >= max_bytes || firing.error.is_some()
        };
        if every_key {
            touched.clear();
            *rescan = false;
            *firing.next_wake = MAX_TIMESTAMP;
            let (watermark, lateness) = (
                firing.input_watermark,
                firing.firing.strategy.allowed_lateness,
            );
            let mut stopped = false;
            panes.retain(|key, windows| {
                if !evaluated(windows) {
                    for (window, _) in windows.iter() {
                        *firing.next_wake =
                            (*firing.next_wake).min(wake(window, watermark, lateness));
                    }
                    return Retain::Keep;
                }
                if full(out, &firing) {
                    stopped = true;
                    return Retain::Stop;
                }
                firing.key(key, windows, out);
                Retain::keep_if(!windows.is_empty())
            });
            // The keys not reached are looked at by the next call (which
            // recomputes the wake point over every key).
            *rescan = stopped;
        } else {
            touched.retain(|key| {
                if full(out, &firing) {
                    return true;
                }
                if let Some(windows) = panes.get_mut(key).filter(|w| evaluated(w)) {
                    firing.key(key, windows, out);
                    if windows.is_empty() {
                        panes.remove(key);
                    }
                }
                false
            });
        }
        match firing.error {
            Some(e) => Err(e),
            None => Ok(firing.emitted),
        }
    }
}

impl<'a> Evaluation<'a> {
    /// An evaluation at `input_watermark` and `now` that keeps its holds,
    /// wake point and byte count in the given places, with no room given
    /// to `out` up front.
    fn new(
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

    /// Fires what is ready in one key's windows and closes the expired
    /// ones (removing them from `windows`), appending the panes to `out`.
    fn key(&mut self, key: &[u8], windows: &mut KeyPanes, out: &mut Fired) {
        let strategy = self.firing.strategy;
        let mut i = 0;
        while i < windows.len() {
            let (window, pane) = &mut windows[i];
            let before = pane_hold(strategy, window, pane);
            let size_before = pane.values.len();
            let ctx = TriggerContext {
                window_end: window.max_timestamp(),
                watermark: self.input_watermark,
                now: self.now,
            };
            let expired =
                window.garbage_collection_time(strategy.allowed_lateness) < self.input_watermark;
            let mut emitted_last = false;
            if pane.trigger.should_fire(&ctx) {
                pane.trigger.on_fire(&ctx);
                let last = expired || pane.trigger.is_finished();
                let fire_empty = ctx.watermark > ctx.window_end
                    && pane.nonspeculative_fired == 0
                    && strategy.on_time_behavior == OnTimeBehavior::FireAlways;
                if pane.new_data || fire_empty {
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
                let final_pane = pane.new_data
                    || (strategy.closing_behavior == ClosingBehavior::EmitAlways
                        && pane.fired > 0
                        && !pane.trigger.is_finished()
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
                .saturating_sub(size_before.saturating_sub(pane.values.len()));
            update_holds(self.holds, before, pane_hold(strategy, window, pane));
            *self.next_wake = (*self.next_wake).min(wake(
                window,
                self.input_watermark,
                strategy.allowed_lateness,
            ));
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
fn expected_elements(keys: usize, memory_bytes: usize, max_bytes: usize) -> usize {
    let payload = (memory_bytes / keys.max(1)).saturating_sub(KEY_OVERHEAD + PANE_OVERHEAD);
    keys.min(max_bytes / (payload + FIRED_ELEMENT_FRAMING))
}

impl Firing<'_> {
    /// Emits `pane` of `key` in `window` into `out`; with `token`, as the
    /// last pane of a key whose values a drain left in the spill store:
    /// `KV<key, Iterable<V>>` in the state-backed form, no values inline,
    /// then the token, which the consumer reads them by.
    #[allow(clippy::too_many_arguments)]
    fn emit(
        &self,
        key: &[u8],
        window: &Window,
        pane: &mut Pane,
        ctx: &TriggerContext,
        is_last: bool,
        token: Option<&[u8]>,
        out: &mut Fired,
    ) -> Result<usize, CoderError> {
        // As Beam labels panes: LATE once the published output watermark is
        // past the window (downstream already considers it done), else
        // EARLY before the input watermark passes the end of the window,
        // and ON_TIME for the first pane after that.
        let timing = if self.output_watermark > ctx.window_end {
            PaneTiming::Late
        } else if ctx.watermark <= ctx.window_end {
            PaneTiming::Early
        } else if pane.nonspeculative_fired == 0 {
            PaneTiming::OnTime
        } else {
            PaneTiming::Late
        };
        let nonspeculative_index = if timing == PaneTiming::Early {
            -1
        } else {
            pane.nonspeculative_fired
        };
        let header = WindowedValueHeader {
            timestamp: output_timestamp(self.strategy, window, pane),
            windows: smallvec::smallvec![window.clone()],
            pane: PaneInfo {
                is_first: pane.fired == 0,
                is_last,
                timing,
                index: pane.fired,
                nonspeculative_index,
            },
        };
        // Straight into `out`: header, key, count, values (checked first,
        // so that an error writes nothing).
        let count = match token {
            None => iterable_len_bytes(pane.count as usize)?,
            Some(_) => (-1i32).to_be_bytes(),
        };
        let start = out.bytes.len();
        header.encode(self.window_coder, &mut out.bytes)?;
        let value_start = out.bytes.len();
        let bytes = &mut out.bytes;
        bytes.reserve(key.len() + count.len() + pane.values.len());
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(&count);
        match token {
            None => bytes.extend_from_slice(&pane.values),
            Some(token) => {
                // No block of values inline: the continuation marker (a
                // block count of -1), then the token, length first.
                crate::coder::encode_varint_u64(u64::MAX, bytes);
                crate::coder::encode_varint_u64(token.len() as u64, bytes);
                bytes.extend_from_slice(token);
            }
        }
        tracing::trace!(?window, values = pane.count, pane = ?header.pane, "pane fired");
        out.record(header, start, value_start);
        pane.fired += 1;
        if timing != PaneTiming::Early {
            pane.nonspeculative_fired += 1;
        }
        pane.new_data = false;
        // Holds are released by a firing, in either accumulation mode.
        pane.holds = HoldRange::EMPTY;
        if self.strategy.accumulation == AccumulationMode::Discarding {
            pane.values.clear();
            pane.count = 0;
        }
        Ok(1)
    }
}

/// The timestamp a pane of `window` is emitted at.
fn output_timestamp(strategy: &WindowingStrategy, window: &Window, pane: &Pane) -> Timestamp {
    let end = window.max_timestamp();
    match strategy.output_time {
        OutputTime::EndOfWindow => end,
        OutputTime::EarliestInPane => pane.holds.min().unwrap_or(end).min(end),
        OutputTime::LatestInPane => pane.holds.max().unwrap_or(end).min(end),
    }
}

/// What a pane holds the output watermark at: its output time while it has
/// unfired data.
fn pane_hold(strategy: &WindowingStrategy, window: &Window, pane: &Pane) -> Option<Timestamp> {
    pane.new_data
        .then(|| output_timestamp(strategy, window, pane))
}

/// A pane's hold went from `before` to `after`.
fn update_holds(holds: &mut Holds, before: Option<Timestamp>, after: Option<Timestamp>) {
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

/// The watermark past which `window` needs a look without new data: its
/// end (triggers waiting for the watermark fire), then its
/// garbage-collection time (it closes).
fn wake(window: &Window, watermark: Timestamp, allowed_lateness: i64) -> Timestamp {
    let end = window.max_timestamp();
    if watermark <= end {
        end
    } else {
        window.garbage_collection_time(allowed_lateness)
    }
}

/// Puts `pane` into `windows` under `window`, absorbing the pane already
/// there, if any.
fn insert_pane(
    windows: &mut KeyPanes,
    window: Window,
    pane: Pane,
    strategy: &WindowingStrategy,
    holds: &mut Holds,
) {
    match position(windows, &window) {
        Ok(at) => {
            let (w, existing) = &mut windows[at];
            let before = pane_hold(strategy, w, existing);
            existing.absorb(pane);
            update_holds(holds, before, pane_hold(strategy, w, existing));
        }
        Err(at) => {
            update_holds(holds, None, pane_hold(strategy, &window, &pane));
            windows.insert(at, (window, pane));
        }
    }
}

/// Merge overlapping interval windows of one key (sessions): a new
/// element's window `[t, t + gap)` joins every window it overlaps.
fn merge_intervals(windows: &mut KeyPanes, strategy: &WindowingStrategy, holds: &mut Holds) {
    let mut intervals: Vec<(Timestamp, Timestamp)> = windows
        .iter()
        .filter_map(|(w, _)| match w {
            Window::Interval { start, end } => Some((*start, *end)),
            _ => None,
        })
        .collect();
    if intervals.len() < 2 {
        return;
    }
    intervals.sort();
    type Interval = (Timestamp, Timestamp);
    let mut merged: Vec<(Interval, Vec<Interval>)> = Vec::new();
    for (start, end) in intervals {
        match merged.last_mut() {
            Some(((_, cur_end), members)) if start < *cur_end => {
                *cur_end = (*cur_end).max(end);
                members.push((start, end));
            }
            _ => merged.push(((start, end), vec![(start, end)])),
        }
    }
    for ((start, end), members) in merged {
        if members.len() == 1 && members[0] == (start, end) {
            continue;
        }
        let mut combined: Option<Pane> = None;
        for (s, e) in members {
            if let Ok(at) = position(windows, &Window::Interval { start: s, end: e }) {
                let (w, p) = windows.remove(at);
                update_holds(holds, pane_hold(strategy, &w, &p), None);
                match combined.as_mut() {
                    Some(c) => c.absorb(p),
                    None => combined = Some(p),
                }
            }
        }
        if let Some(c) = combined {
            insert_pane(windows, Window::Interval { start, end }, c, strategy, holds);
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod trigger_tests;
