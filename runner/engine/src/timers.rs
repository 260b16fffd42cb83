//! Pending timers of a stateful stage.
//!
//! The SDK sets and clears timers by writing them to the data channel; the
//! runner keeps the latest write per (transform, family, key, tag, window)
//! — a later set overwrites, a clear deletes — and delivers a timer back to
//! the SDK once its time domain has passed its firing time. A pending timer
//! holds the stage's output watermark at its hold timestamp, so output the
//! timer will produce is never late.
//!
//! A stage may have a timer pending for every key it has seen (a stateful
//! DoFn's window-expiration callback sets one per key and window), and the
//! engine asks about them between every two bundles: what is ready, the
//! earliest hold, the next processing time. So nothing here walks all
//! pending timers. Each family keeps its timers in a hash map by identity
//! and again ordered by (firing time, arrival) per time domain, so that
//! taking the ready ones reads only those; the holds are a multiset, and
//! the windows with timers are counted. Timers due at the same time fire
//! in the order they were set.

use serde::de::Deserializer;
use serde::ser::{SerializeMap, SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use rustc_hash::FxHashMap;

use crate::coder::{Coder, TimerValue};
use crate::holds::Holds;
use crate::plan::{TimeDomain, TransformId};
use crate::time::{Timestamp, MAX_TIMESTAMP};
use crate::window::Window;

/// Identity of a timer: a later write with the same id replaces it. The
/// store keeps its timers by family and [`Slot`] instead; this is the form
/// checkpoints keep them in (the key of their map of timers).
///
/// The fields are in the order in which a checkpoint encodes them, the
/// order they had when the id was a tuple, so checkpoints keep their
/// bytes; ids sort in that order too. They borrow from the store while a
/// checkpoint is written, and own what they read back.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
struct TimerId<'a> {
    /// Transform id of the timer's ParDo.
    transform_id: Cow<'a, str>,
    /// The timer family (within the transform).
    family_id: Cow<'a, str>,
    /// The user key, nested-encoded in the family's key coder.
    user_key: Cow<'a, Bytes>,
    /// The dynamic timer tag (`""` outside a timer map).
    dynamic_tag: Cow<'a, str>,
    /// The one window the timer is set in.
    window: Cow<'a, Window>,
}

/// Where a timer sits in its family: what, with the family, makes its
/// [`TimerId`]. A family keeps its timers by slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Slot {
    /// The one window the timer is set in.
    window: Window,
    /// The user key, nested-encoded.
    user_key: Bytes,
    /// The dynamic timer tag.
    dynamic_tag: String,
}

impl Slot {
    /// The slot of `timer` in `window` (one of its windows).
    fn of(window: Window, timer: &TimerValue) -> Self {
        Slot {
            window,
            user_key: timer.user_key.clone(),
            dynamic_tag: timer.dynamic_tag.clone(),
        }
    }
}

/// A timer's place in its family's firing order: (firing time, arrival
/// number).
type Due = (Timestamp, u64);

/// A timer ready to be delivered, with where it goes.
#[derive(Debug, Clone)]
pub struct FiredTimer {
    /// Transform id of the timer's ParDo.
    pub transform_id: TransformId,
    /// Timer family id.
    pub family_id: String,
    /// The timer as it will be sent (one window).
    pub timer: TimerValue,
}

/// A pending timer, with where it is in its family's firing order.
#[derive(Debug, Clone)]
struct WaitingTimer {
    domain: TimeDomain,
    timer: TimerValue,
    arrival: u64,
}

impl WaitingTimer {
    fn due(&self) -> Due {
        (self.timer.fire_timestamp, self.arrival)
    }
}

/// The pending timers of one (transform, family).
#[derive(Debug, Clone)]
struct Family {
    transform_id: TransformId,
    family_id: String,
    /// Latest write per slot (one window each).
    timers: FxHashMap<Slot, WaitingTimer>,
    /// The same timers in firing order, per time domain
    /// ([`domain_index`]).
    by_time: [BTreeMap<Due, Slot>; 2],
    /// Arrival number of the next timer set.
    arrivals: u64,
}

/// Where a time domain's timers are in [`Family::by_time`].
fn domain_index(domain: TimeDomain) -> usize {
    match domain {
        TimeDomain::EventTime => 0,
        TimeDomain::ProcessingTime => 1,
    }
}

/// The pending timers of one window.
#[derive(Debug, Clone, Default)]
struct WindowTimers {
    count: usize,
    /// Expiry looked at them all since the last one was set (those left
    /// are due, and fire before the window goes).
    swept: bool,
}

/// What the store keeps over all families, updated with every timer that
/// comes or goes.
#[derive(Debug, Clone, Default)]
struct Totals {
    /// Hold timestamps of the pending timers.
    holds: Holds,
    /// The windows with pending timers.
    windows: BTreeMap<Window, WindowTimers>,
}

/// The watermark hold a pending timer keeps: its output timestamp, but for
/// an event-time timer never past its firing time. Once the input watermark
/// passes that, the timer is due work, and what it outputs must not reach
/// a consumer that was already told the stage is done: a timer set with no
/// output timestamp (Go's `WithNoOutputTimestamp`) holds at the end of
/// time, which holds nothing, yet its firing may still emit.
fn hold_of(domain: TimeDomain, timer: &TimerValue) -> Timestamp {
    match domain {
        TimeDomain::EventTime => timer.hold_timestamp.min(timer.fire_timestamp),
        _ => timer.hold_timestamp,
    }
}

impl Totals {
    fn added(&mut self, window: &Window, domain: TimeDomain, timer: &TimerValue) {
        self.holds.add(hold_of(domain, timer));
        match self.windows.get_mut(window) {
            Some(w) => {
                w.count += 1;
                w.swept = false;
            }
            None => {
                let one = WindowTimers {
                    count: 1,
                    swept: false,
                };
                self.windows.insert(window.clone(), one);
            }
        }
    }

    fn removed(&mut self, window: &Window, domain: TimeDomain, timer: &TimerValue) {
        self.holds.remove(hold_of(domain, timer));
        if let Some(w) = self.windows.get_mut(window) {
            w.count -= 1;
            if w.count == 0 {
                self.windows.remove(window);
            }
        }
    }
}

impl Family {
    fn new(transform_id: &str, family_id: &str) -> Self {
        Family {
            transform_id: TransformId::new(transform_id),
            family_id: family_id.to_string(),
            timers: FxHashMap::default(),
            by_time: [BTreeMap::new(), BTreeMap::new()],
            arrivals: 0,
        }
    }

    /// Sets the timer at `slot` (its `windows` the slot's one window),
    /// replacing what was there unless `keep_existing`.
    fn put(
        &mut self,
        slot: Slot,
        domain: TimeDomain,
        timer: TimerValue,
        keep_existing: bool,
        totals: &mut Totals,
    ) -> bool {
        // A runner-owned timer is set again for every element of its key
        // and window: that case is one lookup.
        if keep_existing && self.timers.contains_key(&slot) {
            return false;
        }
        totals.added(&slot.window, domain, &timer);
        let new = WaitingTimer {
            domain,
            timer,
            arrival: self.arrivals,
        };
        self.arrivals += 1;
        let due = new.due();
        let Family {
            timers, by_time, ..
        } = self;
        match timers.entry(slot) {
            Entry::Vacant(empty) => {
                by_time[domain_index(domain)].insert(due, empty.key().clone());
                empty.insert(new);
            }
            Entry::Occupied(mut set) => {
                let old = std::mem::replace(set.get_mut(), new);
                totals.removed(&set.key().window, old.domain, &old.timer);
                let slot = by_time[domain_index(old.domain)]
                    .remove(&old.due())
                    .unwrap_or_else(|| set.key().clone());
                by_time[domain_index(domain)].insert(due, slot);
            }
        }
        true
    }

    fn remove(&mut self, slot: &Slot, totals: &mut Totals) -> Option<(TimeDomain, TimerValue)> {
        let pending = self.timers.remove(slot)?;
        totals.removed(&slot.window, pending.domain, &pending.timer);
        self.by_time[domain_index(pending.domain)].remove(&pending.due());
        Some((pending.domain, pending.timer))
    }

    /// Removes the timer at `due` in `domain`'s order.
    fn remove_due(
        &mut self,
        domain: TimeDomain,
        due: &Due,
        totals: &mut Totals,
    ) -> Option<(TimeDomain, TimerValue)> {
        let slot = self.by_time[domain_index(domain)].remove(due)?;
        let pending = self.timers.remove(&slot)?;
        totals.removed(&slot.window, pending.domain, &pending.timer);
        Some((pending.domain, pending.timer))
    }

    /// Every timer in firing order, both domains merged: the order
    /// checkpoints keep them in, so that a restored store fires timers due
    /// together in the same order.
    fn in_firing_order(&self) -> Vec<(&Slot, &WaitingTimer)> {
        let [event, processing] = &self.by_time;
        let mut all: Vec<(&Due, &Slot)> = event.iter().chain(processing.iter()).collect();
        // Two sorted runs: a merge, in effect.
        all.sort_by_key(|(due, _)| **due);
        all.into_iter()
            .filter_map(|(_, slot)| self.timers.get(slot).map(|p| (slot, p)))
            .collect()
    }
}

/// Timers of one stage.
#[derive(Debug, Default, Clone)]
pub struct TimerStore {
    /// Ordered by (transform, family); a stage has a handful.
    families: Vec<Family>,
    totals: Totals,
}

/// The family (transform, family) of `families`, added if new.
fn family_of<'a>(
    families: &'a mut Vec<Family>,
    transform_id: &str,
    family_id: &str,
) -> &'a mut Family {
    let at = match families.binary_search_by(|f| {
        (f.transform_id.as_str(), f.family_id.as_str()).cmp(&(transform_id, family_id))
    }) {
        Ok(at) => at,
        Err(at) => {
            families.insert(at, Family::new(transform_id, family_id));
            at
        }
    };
    &mut families[at]
}

impl TimerStore {
    /// Sets `timer` in each of its windows; whether any was new.
    fn put(
        &mut self,
        transform_id: &str,
        family_id: &str,
        domain: TimeDomain,
        timer: TimerValue,
        keep_existing: bool,
    ) -> bool {
        let TimerStore { families, totals } = self;
        let family = family_of(families, transform_id, family_id);
        let mut put_one = |window: Window, timer: TimerValue| {
            let slot = Slot::of(window, &timer);
            family.put(slot, domain, timer, keep_existing, totals)
        };
        if timer.windows.len() == 1 {
            let window = timer.windows[0].clone();
            return put_one(window, timer);
        }
        let mut any = false;
        for window in &timer.windows {
            let mut one = timer.clone();
            one.windows = smallvec::smallvec![window.clone()];
            any |= put_one(window.clone(), one);
        }
        any
    }

    /// Apply the timer writes of a committed bundle, in order.
    pub fn apply(
        &mut self,
        transform_id: &str,
        family_id: &str,
        domain: TimeDomain,
        writes: Vec<TimerValue>,
    ) {
        for timer in writes {
            if timer.clear {
                let TimerStore { families, totals } = self;
                let family = family_of(families, transform_id, family_id);
                for window in &timer.windows {
                    family.remove(&Slot::of(window.clone(), &timer), totals);
                }
            } else {
                self.put(transform_id, family_id, domain, timer, false);
            }
        }
    }

    /// Set an event-time timer the runner owns (a window-expiration
    /// callback) unless one with the same identity is already pending: it
    /// is set again for every element of its key and window, and the first
    /// setting stands. Returns whether it was new.
    pub fn set_if_absent(
        &mut self,
        transform_id: &str,
        family_id: &str,
        timer: TimerValue,
    ) -> bool {
        if timer.windows.len() != 1 {
            return false;
        }
        self.put(transform_id, family_id, TimeDomain::EventTime, timer, true)
    }

    /// Adds the timers of `other` whose user key `keep` accepts (for
    /// moving key groups between shards), each family's in its firing
    /// order.
    pub fn absorb_where(&mut self, other: &TimerStore, keep: impl Fn(&[u8]) -> bool) {
        for family in &other.families {
            for (slot, pending) in family.in_firing_order() {
                if keep(&slot.user_key) {
                    let mut timer = pending.timer.clone();
                    timer.windows = smallvec::smallvec![slot.window.clone()];
                    self.put(
                        family.transform_id.as_str(),
                        &family.family_id,
                        pending.domain,
                        timer,
                        false,
                    );
                }
            }
        }
    }

    /// Put back timers of a bundle that failed, unless a newer write replaced them.
    pub fn restore(&mut self, fired: Vec<(TimeDomain, FiredTimer)>) {
        for (domain, f) in fired {
            self.put(&f.transform_id, &f.family_id, domain, f.timer, true);
        }
    }

    /// The earliest hold of any pending timer.
    pub fn hold(&self) -> Option<Timestamp> {
        self.totals.holds.min()
    }

    /// The earliest firing time of a pending processing-time timer.
    pub fn next_processing_time(&self) -> Option<Timestamp> {
        self.families
            .iter()
            .filter_map(|f| {
                f.by_time[domain_index(TimeDomain::ProcessingTime)]
                    .first_key_value()
                    .map(|((at, _), _)| *at)
            })
            .min()
    }

    /// Drop the timers of windows that `expired_at` says were garbage
    /// collected at a time behind `input_watermark`, unless they are
    /// event-time timers due by then (those fire first). Returns how many
    /// were dropped.
    pub fn drop_expired(
        &mut self,
        input_watermark: Timestamp,
        mut expired_at: impl FnMut(&Window) -> Timestamp,
    ) -> usize {
        // Windows swept before keep only timers that are due; a window
        // expiring is rare, so a sweep may read every timer.
        let expired: BTreeMap<Window, Timestamp> = self
            .totals
            .windows
            .iter()
            .filter(|(_, w)| !w.swept)
            .map(|(window, _)| (window.clone(), expired_at(window)))
            .filter(|(_, gc)| *gc < input_watermark)
            .collect();
        if expired.is_empty() {
            return 0;
        }
        let mut dropped = 0;
        for family in &mut self.families {
            let gone: Vec<Slot> = family
                .timers
                .iter()
                .filter(|(slot, p)| {
                    expired.get(&slot.window).is_some_and(|gc| {
                        p.domain != TimeDomain::EventTime || p.timer.fire_timestamp > *gc
                    })
                })
                .map(|(slot, _)| slot.clone())
                .collect();
            for slot in gone {
                family.remove(&slot, &mut self.totals);
                dropped += 1;
            }
        }
        for window in expired.keys() {
            if let Some(w) = self.totals.windows.get_mut(window) {
                w.swept = true;
            }
        }
        dropped
    }

    /// The windows that still have a pending timer (their state must live
    /// until those timers fired).
    pub fn windows(&self) -> BTreeSet<Window> {
        self.totals.windows.keys().cloned().collect()
    }

    /// Moves every family to the id `rename` gives its transform (a
    /// checkpoint restored onto a pipeline whose transform ids changed);
    /// a family with no timers and no new id goes. Fails with the first
    /// transform that has timers and no new id.
    pub fn rename_transforms(
        &mut self,
        rename: impl Fn(&TransformId) -> Option<TransformId>,
    ) -> Result<(), TransformId> {
        let mut kept = Vec::with_capacity(self.families.len());
        for mut family in std::mem::take(&mut self.families) {
            match rename(&family.transform_id) {
                Some(id) => {
                    family.transform_id = id;
                    kept.push(family);
                }
                None if family.timers.is_empty() => {}
                None => return Err(family.transform_id),
            }
        }
        kept.sort_by(|a, b| {
            (a.transform_id.as_str(), a.family_id.as_str())
                .cmp(&(b.transform_id.as_str(), b.family_id.as_str()))
        });
        self.families = kept;
        Ok(())
    }

    /// Whether no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.totals.windows.is_empty()
    }

    /// Remove and return the timers that may fire: event-time timers whose
    /// firing time the input watermark has passed, processing-time timers
    /// whose time `now` has reached, and every timer once the input is
    /// complete (`input_watermark` at +∞: a bounded input ends, so
    /// processing time is treated as having run out too). Ordered by firing
    /// time. Timers of the `last` family (transform, family) — the
    /// window-expiration callback — fire only when no other timer is ready,
    /// so they see the effects of every user timer of their window.
    pub fn take_ready(
        &mut self,
        input_watermark: Timestamp,
        now: Timestamp,
        last: Option<(&str, &str)>,
    ) -> Vec<(TimeDomain, FiredTimer)> {
        self.take_ready_where(input_watermark, now, last, usize::MAX, |_| true)
    }

    /// [`Self::take_ready`] among the timers whose user key `eligible`
    /// accepts (the others stay, ready or not: their keys are busy in
    /// another bundle), at most `max` of them: the earliest, so that the
    /// rest fire in later bundles after them (a bundle's timers are bounded
    /// like its elements; a window closing over a million keys is not one
    /// bundle). Reads only ready timers, in firing order, and of those at
    /// most `max` eligible ones per family and domain.
    pub fn take_ready_where(
        &mut self,
        input_watermark: Timestamp,
        now: Timestamp,
        last: Option<(&str, &str)>,
        max: usize,
        eligible: impl Fn(&[u8]) -> bool,
    ) -> Vec<(TimeDomain, FiredTimer)> {
        let max = max.max(1);
        let complete = input_watermark >= MAX_TIMESTAMP;
        let is_last =
            |f: &Family| last.is_some_and(|(t, id)| f.transform_id == *t && f.family_id == id);
        // (firing order, family, domain): small keys, copied while choosing.
        let mut ready: Vec<(Due, usize, TimeDomain)> = Vec::new();
        for last_family in [false, true] {
            for (at, family) in self.families.iter().enumerate() {
                if is_last(family) != last_family {
                    continue;
                }
                for domain in [TimeDomain::EventTime, TimeDomain::ProcessingTime] {
                    let due = |fire: Timestamp| {
                        complete
                            || match domain {
                                TimeDomain::EventTime => fire < input_watermark,
                                TimeDomain::ProcessingTime => fire <= now,
                            }
                    };
                    let of_this = family.by_time[domain_index(domain)]
                        .iter()
                        .take_while(|((fire, _), _)| due(*fire))
                        .filter(|(_, slot)| eligible(&slot.user_key))
                        .take(max)
                        .map(|(d, _)| (*d, at, domain));
                    ready.extend(of_this);
                }
            }
            if !ready.is_empty() {
                break;
            }
        }
        let order = |a: &(Due, usize, TimeDomain), b: &(Due, usize, TimeDomain)| {
            (a.0 .0, a.1, a.0 .1).cmp(&(b.0 .0, b.1, b.0 .1))
        };
        if ready.len() > max {
            ready.select_nth_unstable_by(max, order);
            ready.truncate(max);
        }
        ready.sort_unstable_by(order);
        let mut fired = Vec::with_capacity(ready.len());
        for (due, at, domain) in ready {
            let family = &mut self.families[at];
            if let Some((domain, timer)) = family.remove_due(domain, &due, &mut self.totals) {
                fired.push((
                    domain,
                    FiredTimer {
                        transform_id: family.transform_id.clone(),
                        family_id: family.family_id.clone(),
                        timer,
                    },
                ));
            }
        }
        fired
    }

    /// Encode fired timers of one (transform, family) for the data channel.
    pub fn encode(
        fired: &[&FiredTimer],
        window_coder: &Coder,
    ) -> Result<Bytes, crate::coder::CoderError> {
        let mut out = Vec::new();
        for f in fired {
            f.timer.encode(window_coder, &mut out)?;
        }
        Ok(Bytes::from(out))
    }
}

/// Checkpoints keep a store as `{ timers: map of TimerId to (domain,
/// timer) }`, the form it had before it was indexed, so that checkpoints
/// written by either form restore in the other. Families in order, each
/// in firing order: the same store always gives the same bytes, and the
/// store read back fires timers due together in the same order.
impl Serialize for TimerStore {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut record = serializer.serialize_struct("TimerStore", 1)?;
        record.serialize_field("timers", &Entries(self))?;
        record.end()
    }
}

/// The entries of a store, as the checkpoint's map.
struct Entries<'a>(&'a TimerStore);

impl Serialize for Entries<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let len = self.0.families.iter().map(|f| f.timers.len()).sum();
        let mut map = serializer.serialize_map(Some(len))?;
        for family in &self.0.families {
            for (slot, pending) in family.in_firing_order() {
                let id = TimerId {
                    transform_id: Cow::Borrowed(family.transform_id.as_str()),
                    family_id: Cow::Borrowed(&family.family_id),
                    user_key: Cow::Borrowed(&slot.user_key),
                    dynamic_tag: Cow::Borrowed(&slot.dynamic_tag),
                    window: Cow::Borrowed(&slot.window),
                };
                map.serialize_entry(&id, &(pending.domain, &pending.timer))?;
            }
        }
        map.end()
    }
}

/// The checkpoint form, read back (entries in the order written).
#[derive(Deserialize)]
#[serde(rename = "TimerStore")]
struct StoredTimers {
    timers: StoredEntries,
}

/// A checkpoint's entries, in the order they were written.
struct StoredEntries(Vec<(TimerId<'static>, (TimeDomain, TimerValue))>);

impl<'de> Deserialize<'de> for StoredEntries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> serde::de::Visitor<'de> for InOrder {
            type Value = StoredEntries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of timers")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<StoredEntries, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(StoredEntries(entries))
            }
        }
        deserializer.deserialize_map(InOrder)
    }
}

impl<'de> Deserialize<'de> for TimerStore {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let stored = StoredTimers::deserialize(deserializer)?;
        let mut store = TimerStore::default();
        for (id, (domain, mut timer)) in stored.timers.0 {
            timer.windows = smallvec::smallvec![id.window.into_owned()];
            store.put(&id.transform_id, &id.family_id, domain, timer, false);
        }
        Ok(store)
    }
}

#[cfg(test)]
mod tests;
