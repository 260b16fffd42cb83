//! The panes a GroupByKey holds in memory, and what keeps evaluating them
//! cheap.
//!
//! [`MemoryPanes`] owns the key table and everything that must change
//! with it: the multiset of the unfired panes' output-time holds (so the
//! stage's hold is read without a scan), the estimate of the bytes they
//! take (what the spill limit is checked against), and which keys an
//! evaluation owes a look. Evaluation is incremental: a trigger can only
//! become ready when its window gets data, when the watermark passes the
//! window's end or garbage-collection time, or when processing time moves.
//! So only keys that got data since the last evaluation are looked at,
//! unless the input watermark passed the earliest such point of any
//! buffered window (then every key is, once) or the trigger reads
//! processing time (then always).
//!
//! It is also the buffer's side of the interface with its spill space
//! ([`Spillable`]): the spill reads the panes here, and what it hands over
//! or takes back keeps the holds, bytes and keys owed a look right.
//!
//! While the table is empty, a GroupByKey whose panes fire only as their
//! window closes keeps what arrives as [`Arrivals`] instead, and fires
//! them by sorting when the window closes. Whatever else needs the panes
//! files the arrivals in the table first ([`MemoryPanes::settle`]): the
//! spill sees only the table, and a checkpoint sees the panes the
//! arrivals make.

use bytes::Bytes;
use rustc_hash::FxHashSet;

use super::arrivals::Arrivals;
use super::fired::Fired;
use super::firing::{count_wake, expected_elements, expired, Evaluation, Firing};
use super::key_table::{Key, KeyTable, Retain};
use super::merging::{merge_intervals, merge_windows};
use super::pane::{
    insert_pane, position, update_holds, KeyPanes, Pane, KEY_OVERHEAD, PANE_OVERHEAD,
};
use super::spill::Spillable;
use crate::coder::CoderError;
use crate::holds::Holds;
use crate::plan::{FinishedTrigger, WindowFn, WindowingStrategy};
use crate::time::{earliest, Timestamp, MAX_TIMESTAMP, MIN_TIMESTAMP};
use crate::trigger::{TriggerContext, TriggerState};
use crate::window::Window;

/// The panes a buffer holds in memory, with their holds, their size and
/// the keys an evaluation owes a look.
#[derive(Debug)]
pub(super) struct MemoryPanes {
    /// key -> its panes (keys are the runner's own encoded bytes).
    panes: KeyTable<KeyPanes>,
    /// Output times of the panes holding unfired data.
    holds: Holds,
    /// About how many bytes the panes take (values plus bookkeeping
    /// estimates).
    bytes: usize,
    /// Keys that got data or merged windows since the last evaluation.
    touched: FxHashSet<Key>,
    /// The earliest watermark at which some buffered window's trigger may
    /// fire or the window expire without new data (a lower bound).
    next_wake: Timestamp,
    /// Every key needs a look at the next evaluation (after a restore).
    rescan: bool,
    /// Elements not filed in `panes` yet (only while it is empty).
    arrivals: Arrivals,
    /// Whether the strategy lets elements wait as arrivals.
    keeps_arrivals: bool,
}

/// What `count` arrivals of `kv_bytes` `KV` bytes in all count for in
/// `bytes`: what they would take filed each under a key of its own, the
/// most they can take in the table once settled (so that the spill limit
/// is reached no later than without arrivals).
fn arrivals_bytes(count: usize, kv_bytes: usize) -> usize {
    kv_bytes + count * (KEY_OVERHEAD + PANE_OVERHEAD)
}

impl MemoryPanes {
    /// No panes, for a buffer with `strategy`.
    pub(super) fn new(strategy: &WindowingStrategy) -> Self {
        MemoryPanes {
            panes: KeyTable::default(),
            holds: Holds::default(),
            bytes: 0,
            touched: FxHashSet::default(),
            next_wake: MAX_TIMESTAMP,
            rescan: false,
            arrivals: Arrivals::default(),
            keeps_arrivals: Arrivals::suit(strategy),
        }
    }

    /// The same, but filing every element in the table at once (tests
    /// compare the two).
    #[cfg(test)]
    pub(super) fn without_arrivals(mut self) -> Self {
        self.keeps_arrivals = false;
        self
    }

    /// About `lookups` keys are about to be looked up: makes room for the
    /// keys they will likely add at once (see `KeyTable::expect_lookups`),
    /// or for as many arrivals.
    pub(super) fn expect_lookups(&mut self, lookups: usize) {
        if self.arrivals.is_empty() {
            self.panes.expect_lookups(lookups);
        } else {
            self.arrivals.reserve(lookups);
        }
    }

    /// Takes `kv` (the first `key_len` bytes its key) of `window` as an
    /// arrival if it may wait as one (see `arrivals`): the strategy allows
    /// it, the table is empty, and the element is on time for `window` at
    /// `ctx`. Whether it did.
    pub(super) fn arrive(
        &mut self,
        strategy: &WindowingStrategy,
        kv: &[u8],
        key_len: usize,
        window: &Window,
        ctx: &TriggerContext,
    ) -> bool {
        let takes = self.keeps_arrivals
            && ctx.watermark <= ctx.window_end
            && self.panes.is_empty()
            && self.arrivals.takes(window, kv.len());
        if !takes {
            return false;
        }
        self.arrivals.push(window, kv, key_len);
        self.bytes += arrivals_bytes(1, kv.len());
        count_wake(
            &mut self.next_wake,
            window,
            ctx.watermark,
            strategy.allowed_lateness,
        );
        true
    }

    /// Files the arrivals in the table, as [`Self::add`] would have filed
    /// them when they came: what every path but arriving and firing them
    /// needs first.
    pub(super) fn settle(&mut self, strategy: &WindowingStrategy) {
        let arrivals = std::mem::take(&mut self.arrivals);
        let counted = arrivals_bytes(arrivals.len(), arrivals.bytes_left());
        self.bytes = self.bytes.saturating_sub(counted);
        self.file(strategy, &arrivals);
    }

    /// Files `arrivals` in the table through [`Self::add`], each as it
    /// would have been filed when it came.
    fn file(&mut self, strategy: &WindowingStrategy, arrivals: &Arrivals) {
        let Some(window) = arrivals.window() else {
            return;
        };
        let end = window.max_timestamp();
        // The default trigger reads nothing of the context an element
        // brings, and the wake point already counts the window.
        let ctx = TriggerContext {
            window_end: end,
            watermark: MIN_TIMESTAMP,
            now: MIN_TIMESTAMP,
        };
        for (key, value) in arrivals.iter() {
            self.add(strategy, key, window, value, end, &ctx);
        }
    }

    /// Adds `value` of `key` to its pane in `window` (made if new),
    /// holding the output watermark at `hold`, and tells the trigger
    /// (`ctx`); sessions merge. Whether the value was taken: not when the
    /// window's trigger finished and closed it.
    pub(super) fn add(
        &mut self,
        strategy: &WindowingStrategy,
        key: &[u8],
        window: &Window,
        value: &[u8],
        hold: Timestamp,
        ctx: &TriggerContext,
    ) -> bool {
        if !self.arrivals.is_empty() {
            self.settle(strategy);
        }
        // Looked up by the borrowed bytes: a key is copied into the table
        // once, when it is new. A new key's entry is made with its pane in
        // it: written once, where it stays (a GroupByKey over distinct
        // keys makes one per element).
        let trigger = &strategy.trigger;
        let (windows, new_key) = self.panes.get_or_insert_with(key, || {
            KeyPanes::from_buf([(window.clone(), Pane::new(trigger))])
        });
        let at = if new_key {
            self.bytes += key.len() + KEY_OVERHEAD + PANE_OVERHEAD;
            0
        } else {
            match position(windows, window) {
                Ok(at) => at,
                Err(at) => {
                    windows.insert(at, (window.clone(), Pane::new(trigger)));
                    self.bytes += PANE_OVERHEAD;
                    at
                }
            }
        };
        let (window, pane) = &mut windows[at];
        let before = pane.hold(strategy, window);
        if pane.trigger().is_finished() {
            match strategy.finished_trigger {
                // The trigger closed the window: the data is dropped
                // (not late: Beam counts the two apart).
                FinishedTrigger::ClosesWindow => return false,
                // It starts over for data that still arrives before
                // the window expires; what it has not fired by then is
                // emitted when the window closes.
                FinishedTrigger::Restarts => *pane.trigger_mut() = TriggerState::new(trigger),
            }
        }
        pane.add(value, hold);
        self.bytes += value.len();
        pane.trigger_mut().on_element(ctx);
        let after = pane.hold(strategy, window);
        update_holds(&mut self.holds, before, after);
        count_wake(
            &mut self.next_wake,
            window,
            ctx.watermark,
            strategy.allowed_lateness,
        );
        if let WindowFn::Sessions { .. } = strategy.window_fn {
            merge_intervals(windows, strategy, &mut self.holds);
        }
        true
    }

    /// `key` owes a look at the next evaluation.
    pub(super) fn touch(&mut self, key: &[u8]) {
        if !self.touched.contains(key) {
            self.touched.insert(Key::from_slice(key));
        }
    }

    /// The windows `key` has panes in. (Merging windows only: arrivals
    /// are never of those.)
    pub(super) fn windows_of(&self, key: &[u8]) -> Vec<Window> {
        debug_assert!(self.arrivals.is_empty());
        self.panes
            .get(key)
            .map(|w| w.iter().map(|(w, _)| w.clone()).collect())
            .unwrap_or_default()
    }

    /// Applies the SDK's merge results for `key`: the panes of each
    /// result's originals become one pane of the result window. Windows
    /// the key no longer has are ignored.
    pub(super) fn apply_merges(
        &mut self,
        strategy: &WindowingStrategy,
        key: &[u8],
        merges: crate::window_merge::Merges,
    ) {
        self.settle(strategy);
        // Only this key's windows changed; the earliest wake point stays a
        // lower bound (a merged window ends no earlier than its parts).
        self.touched.insert(Key::from_slice(key));
        let Some(windows) = self.panes.get_mut(key) else {
            return;
        };
        for (result, originals) in merges {
            merge_windows(windows, originals, result, strategy, &mut self.holds);
        }
    }

    /// The earliest output-time hold of the unfired panes.
    pub(super) fn hold(&self) -> Option<Timestamp> {
        earliest(self.holds.min(), self.arrivals.hold())
    }

    /// The earliest processing time at which some pane's trigger may fire.
    pub(super) fn next_deadline(&self) -> Option<Timestamp> {
        self.panes
            .values()
            .flat_map(|w| w.iter())
            .filter_map(|(_, p)| p.trigger().next_deadline())
            .min()
    }

    /// Whether no key has panes here.
    pub(super) fn is_empty(&self) -> bool {
        self.panes.is_empty() && self.arrivals.is_empty()
    }

    /// Whether some keys wait for an evaluation to look at them.
    pub(super) fn has_unevaluated(&self) -> bool {
        self.rescan || !self.touched.is_empty() || self.arrivals.is_firing()
    }

    /// The input watermark reached `input_watermark` but evaluation has to
    /// wait: if that may make panes ready (or `always`, for a trigger that
    /// reads processing time), every key is owed a look.
    pub(super) fn postpone(&mut self, input_watermark: Timestamp, always: bool) {
        if always || input_watermark > self.next_wake {
            self.rescan = true;
        }
    }

    /// Fires every ready pane and closes every expired window of the keys
    /// owed a look that `evaluated` accepts (the others only count towards
    /// the wake point), through `firing`, into `out`: every key when the
    /// watermark passed the earliest wake point, after a restore, or
    /// `always`; else those that got data. When every key is looked at,
    /// `out` is given room for what is buffered, up to `max_bytes`, at the
    /// first pane. Stops once `out` holds `max_bytes`, leaving the keys not
    /// reached for the next call. The number of panes emitted.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn evaluate(
        &mut self,
        firing: Firing,
        input_watermark: Timestamp,
        now: Timestamp,
        out: &mut Fired,
        max_bytes: usize,
        always: bool,
        evaluated: impl Fn(&KeyPanes) -> bool,
    ) -> Result<usize, CoderError> {
        let every_key = always || self.rescan || input_watermark > self.next_wake;
        if let Some(window) = self.arrivals.window() {
            if expired(firing.strategy, window, input_watermark) {
                return self.fire_arrivals(firing, input_watermark, now, out, max_bytes);
            }
            if every_key {
                self.settle(firing.strategy);
            }
        }
        let (room, room_elements) = if every_key {
            (
                self.bytes.min(max_bytes),
                expected_elements(self.panes.len(), self.bytes, max_bytes),
            )
        } else {
            (0, 0)
        };
        let MemoryPanes {
            panes,
            holds,
            bytes,
            touched,
            next_wake,
            rescan,
            ..
        } = self;
        let mut evaluation = Evaluation::new(firing, input_watermark, now, holds, next_wake, bytes)
            .with_room(room, room_elements);
        let full = |out: &Fired, evaluation: &Evaluation| {
            out.bytes.len() >= max_bytes || evaluation.failed()
        };
        if every_key {
            touched.clear();
            *rescan = false;
            evaluation.reset_wake();
            let mut stopped = false;
            panes.retain(|key, windows| {
                if !evaluated(windows) {
                    for (window, _) in windows.iter() {
                        evaluation.wake_for(window);
                    }
                    return Retain::Keep;
                }
                if full(out, &evaluation) {
                    stopped = true;
                    return Retain::Stop;
                }
                evaluation.key(key, windows, out);
                Retain::keep_if(!windows.is_empty())
            });
            // The keys not reached are looked at by the next call (which
            // recomputes the wake point over every key).
            *rescan = stopped;
        } else {
            touched.retain(|key| {
                if full(out, &evaluation) {
                    return true;
                }
                if let Some(windows) = panes.get_mut(key).filter(|w| evaluated(w)) {
                    evaluation.key(key, windows, out);
                    if windows.is_empty() {
                        panes.remove(key);
                    }
                }
                false
            });
        }
        let emitted = evaluation.finish()?;
        if self.is_empty() {
            self.bytes = 0;
        }
        Ok(emitted)
    }

    /// Fires every arrival (their window closed at `input_watermark`), a
    /// pane per key, as [`Evaluation::key`] fires a pane of that window
    /// whose trigger never fired: the arrivals grouped by a sort, each
    /// group written behind one header. Stops once `out` holds
    /// `max_bytes`; the rest wait for the next call. The panes emitted.
    fn fire_arrivals(
        &mut self,
        firing: Firing,
        input_watermark: Timestamp,
        now: Timestamp,
        out: &mut Fired,
        max_bytes: usize,
    ) -> Result<usize, CoderError> {
        let Some(window) = self.arrivals.window().cloned() else {
            return Ok(0);
        };
        let ctx = TriggerContext {
            window_end: window.max_timestamp(),
            watermark: input_watermark,
            now,
        };
        let pane = firing.closing_pane(&window, &ctx)?;
        // Room for what is left (a pane per arrival at most), up to the
        // byte limit, as an evaluation of every key gives it.
        let left = self.arrivals.len();
        let payload = self.arrivals.bytes_left();
        out.reserve(
            (payload + left * pane.framing()).min(max_bytes),
            expected_elements(left, arrivals_bytes(left, payload), max_bytes),
        );
        self.arrivals.start_firing();
        let mut emitted = 0;
        while out.bytes.len() < max_bytes {
            let Some(group) = self.arrivals.next_group() else {
                break;
            };
            let (count, key_len) = (group.len(), group.key.len());
            let value_bytes = pane.emit(group.key, count, group.values(), out)?;
            let kv_bytes = count * key_len + value_bytes;
            self.arrivals.fired(kv_bytes);
            self.bytes = self.bytes.saturating_sub(arrivals_bytes(count, kv_bytes));
            emitted += 1;
        }
        if self.arrivals.is_empty() {
            // Nothing is left: the table was empty while they arrived.
            self.arrivals.clear();
            self.next_wake = MAX_TIMESTAMP;
            self.bytes = 0;
            self.touched.clear();
            self.rescan = false;
        }
        tracing::trace!(
            ?window,
            emitted,
            left = self.arrivals.len(),
            "arrivals fired"
        );
        Ok(emitted)
    }

    /// Every key with its panes, as copies (for a checkpoint): the table's,
    /// or the panes the arrivals would make in it.
    pub(super) fn copy_panes(&self, strategy: &WindowingStrategy) -> Vec<(Bytes, KeyPanes)> {
        let mut panes: Vec<(Bytes, KeyPanes)> = self
            .panes
            .iter()
            .map(|(key, windows)| (Bytes::copy_from_slice(key), windows.clone()))
            .collect();
        if !self.arrivals.is_empty() {
            let mut filed = MemoryPanes::new(strategy);
            filed.file(strategy, &self.arrivals);
            panes.extend(
                filed
                    .panes
                    .into_entries()
                    .map(|(key, windows)| (Bytes::copy_from_slice(&key), windows)),
            );
        }
        panes
    }

    /// Puts back `panes`, as a checkpoint kept them, in place of what is
    /// here: their holds and bytes are counted again, and the next
    /// evaluation looks at every key.
    pub(super) fn restore(&mut self, strategy: &WindowingStrategy, panes: Vec<(Bytes, KeyPanes)>) {
        self.arrivals.clear();
        self.panes = panes.into_iter().collect();
        self.touched.clear();
        self.rescan = true;
        self.holds = Holds::default();
        self.bytes = 0;
        for (key, windows) in self.panes.iter() {
            self.bytes += key.len() + KEY_OVERHEAD;
            for (window, pane) in windows {
                self.bytes += pane.values().len() + PANE_OVERHEAD;
                if let Some(h) = pane.hold(strategy, window) {
                    self.holds.add(h);
                }
            }
        }
    }
}

impl Spillable for MemoryPanes {
    fn bytes(&self) -> usize {
        self.bytes
    }

    fn entries(&self) -> impl Iterator<Item = (&[u8], &KeyPanes)> {
        debug_assert!(self.arrivals.is_empty(), "arrivals not settled");
        self.panes.iter()
    }

    fn entry_at(&self, at: u32) -> (&[u8], &KeyPanes) {
        self.panes.entry_at(at)
    }

    fn hand_over_panes(
        &mut self,
        strategy: &WindowingStrategy,
        goes: impl Fn(&Window, &Pane) -> bool,
    ) -> usize {
        self.settle(strategy);
        // The table is given up and the few panes that stay go to a new
        // one: a table keeps the room it grew to, which after a spill of
        // many keys would be most of what the spill freed.
        let mut kept = KeyTable::<KeyPanes>::default();
        let mut kept_bytes = 0usize;
        for (key, windows) in std::mem::take(&mut self.panes).into_entries() {
            let mut stay = KeyPanes::new();
            for (window, pane) in windows {
                if goes(&window, &pane) {
                    update_holds(&mut self.holds, pane.hold(strategy, &window), None);
                    continue;
                }
                kept_bytes += pane.values().len() + PANE_OVERHEAD;
                stay.push((window, pane));
            }
            if !stay.is_empty() {
                kept_bytes += key.len() + KEY_OVERHEAD;
                *kept.get_or_default(&key) = stay;
            }
        }
        self.panes = kept;
        if self.panes.is_empty() {
            self.touched.clear();
        } else {
            let panes = &self.panes;
            self.touched.retain(|key| panes.get(key).is_some());
        }
        self.bytes = kept_bytes;
        kept_bytes
    }

    fn hand_over_keys<E>(
        &mut self,
        strategy: &WindowingStrategy,
        stays: impl Fn(&KeyPanes) -> bool,
        mut take: impl FnMut(&[u8], &KeyPanes) -> Result<(), E>,
    ) -> Result<usize, E> {
        self.settle(strategy);
        // The table is given up (it keeps the room it grew to) and the keys
        // that stay go to a new one.
        let mut kept = KeyTable::<KeyPanes>::default();
        let mut kept_bytes = 0usize;
        for (key, windows) in std::mem::take(&mut self.panes).into_entries() {
            if stays(&windows) {
                kept_bytes += key.len()
                    + KEY_OVERHEAD
                    + windows
                        .iter()
                        .map(|(_, p)| p.values().len() + PANE_OVERHEAD)
                        .sum::<usize>();
                *kept.get_or_default(&key) = windows;
                continue;
            }
            for (window, pane) in &windows {
                update_holds(&mut self.holds, pane.hold(strategy, window), None);
            }
            take(&key, &windows)?;
        }
        self.panes = kept;
        self.bytes = kept_bytes;
        Ok(kept_bytes)
    }

    fn take_back(
        &mut self,
        strategy: &WindowingStrategy,
        key: &[u8],
        window: &Window,
        fill: impl FnOnce(&mut Pane),
    ) {
        self.settle(strategy);
        let (windows, new_key) = self.panes.get_or_insert_with(key, KeyPanes::new);
        if new_key {
            self.bytes += key.len() + KEY_OVERHEAD;
        }
        let at = match position(windows, window) {
            Ok(at) => at,
            Err(at) => {
                windows.insert(at, (window.clone(), Pane::new(&strategy.trigger)));
                self.bytes += PANE_OVERHEAD;
                at
            }
        };
        let (w, pane) = &mut windows[at];
        let before = pane.hold(strategy, w);
        let size_before = pane.values().len();
        fill(pane);
        self.bytes += pane.values().len().saturating_sub(size_before);
        update_holds(&mut self.holds, before, pane.hold(strategy, w));
    }

    fn take_back_key(
        &mut self,
        strategy: &WindowingStrategy,
        key: &[u8],
        windows: KeyPanes,
        watermark: Timestamp,
    ) {
        self.settle(strategy);
        let (kept, new_key) = self.panes.get_or_insert_with(key, KeyPanes::new);
        if new_key {
            self.bytes += key.len() + KEY_OVERHEAD;
        }
        for (window, pane) in windows {
            self.bytes += pane.values().len() + PANE_OVERHEAD;
            count_wake(
                &mut self.next_wake,
                &window,
                watermark,
                strategy.allowed_lateness,
            );
            insert_pane(kept, window, pane, strategy, &mut self.holds);
        }
        merge_intervals(kept, strategy, &mut self.holds);
    }

    fn touched_beyond(&self, stays: impl Fn(&KeyPanes) -> bool) -> bool {
        self.touched
            .iter()
            .any(|key| !self.panes.get(key).is_some_and(&stays))
    }

    fn next_wake(&self) -> Timestamp {
        self.next_wake
    }

    fn owe_every_key(&mut self) {
        self.rescan = true;
    }
}
