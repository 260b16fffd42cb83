//! Starting bundles: which elements and timers go into the next bundle
//! of each SDK stage, and when.

use std::sync::Arc;

use rustc_hash::FxHashSet;
use smallvec::SmallVec;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::debug;

use super::pending::{chunk_entries, element_count, Queued};
use super::side_inputs::SideGate;
use super::{spill_failed, Engine, EngineError, InFlight, Report};
use crate::coder::{Coder, DecodedElement};
use crate::executor::{BundleInput, SplitSink, TimerInput};
use crate::key_groups::{group_of, key_group, slice_mask, KeyGroupSet, KEY_GROUPS};
use crate::plan::{StageIdx, StageKind, TimeDomain, TimerFamily, TransformId};
use crate::state::BundleOverlay;
use crate::time::{Timestamp, MIN_TIMESTAMP};
use crate::timers::{FiredTimer, TimerStore};

/// The key group of a keyed stage's input element (its `KV`'s key; the
/// stage's input value coder is `coder`), as a set. An element whose key
/// does not decode is put in group 0: its bundle fails on it anyway.
pub(super) fn element_key_group(coder: &Coder, e: &DecodedElement) -> KeyGroupSet {
    1 << element_key_group_index(coder, e)
}

/// [`element_key_group`] as the group's number.
pub(super) fn element_key_group_index(coder: &Coder, e: &DecodedElement) -> u32 {
    coder
        .kv_key_len(e.value())
        .map_or(0, |n| key_group(&e.value()[..n]))
}

/// Puts a keyed bundle's `elements` in key-group order (each key's in the
/// order they came) and returns where one group ends and the next starts:
/// the points a split may give back from, so that what it gives back holds
/// only groups the bundle no longer needs.
pub(super) fn group_by_key_group(
    coder: &Coder,
    elements: Vec<DecodedElement>,
) -> (Vec<DecodedElement>, Vec<usize>) {
    // A counting sort over the fixed number of groups: stable (one key's
    // elements keep their order), and each element moves once.
    let groups: Vec<usize> = elements
        .iter()
        .map(|e| element_key_group_index(coder, e) as usize)
        .collect();
    let mut starts = [0usize; KEY_GROUPS as usize + 1];
    for &g in &groups {
        starts[g + 1] += 1;
    }
    for g in 0..KEY_GROUPS as usize {
        starts[g + 1] += starts[g];
    }
    // Where each group after the first starts, once per boundary (an
    // empty group starts where the next one does).
    let mut points: Vec<usize> = starts[1..KEY_GROUPS as usize]
        .iter()
        .copied()
        .filter(|&at| at > 0 && at < elements.len())
        .collect();
    points.dedup();
    let mut slots: Vec<Option<DecodedElement>> = Vec::new();
    slots.resize_with(elements.len(), || None);
    let mut next = starts;
    for (e, g) in elements.into_iter().zip(groups) {
        slots[next[g]] = Some(e);
        next[g] += 1;
    }
    (slots.into_iter().flatten().collect(), points)
}

/// Adds `hold` (a timestamp, how many hold there) to a bundle's record,
/// beside the last one if it is at the same timestamp.
fn push_hold(holds: &mut Vec<(Timestamp, usize)>, (ts, n): (Timestamp, usize)) {
    match holds.last_mut() {
        Some((last, count)) if *last == ts => *count += n,
        _ => holds.push((ts, n)),
    }
}

/// What a bundle took from its stage's queue: entries as they were queued
/// (runs whole), or single elements picked one by one (a gated, keyed or
/// time-sorted stage's).
enum Taken {
    Entries(Vec<Queued>),
    Elements(Vec<DecodedElement>),
}

impl Taken {
    fn is_empty(&self) -> bool {
        match self {
            Taken::Entries(entries) => entries.is_empty(),
            Taken::Elements(elements) => elements.is_empty(),
        }
    }
}

impl Engine {
    /// Whether a consumer of `idx`'s outputs has more waiting than its
    /// bound and can work through it. (A consumer whose waiting elements
    /// all wait for a side input does not hold its producers back: that
    /// side input may need them, and backpressure must never deadlock.)
    ///
    /// Some consumers pass their backlog on: a Flatten (or a Reshuffle,
    /// which runs as one) passes what it takes in straight on, so its
    /// consumers' backlog is its producers' too; so is a GroupByKey's
    /// whose buffer waits to fire. Those are followed with a worklist and
    /// a visited set, not by recursion: a chain of them is as long as the
    /// pipeline, and a diamond of them would be walked once per path.
    pub(super) fn backpressured(&self, idx: StageIdx) -> bool {
        if self.exchange_holds_back(idx) {
            return true;
        }
        let mut todo: SmallVec<[StageIdx; 4]> = SmallVec::new();
        todo.push(idx);
        let mut seen: FxHashSet<StageIdx> = FxHashSet::default();
        while let Some(stage) = todo.pop() {
            for &p in &self.topology.plan.stages[stage].outputs {
                for &c in &self.topology.consumers[p].stages {
                    match self.backlog_of(c) {
                        Backlog::Over => return true,
                        Backlog::PassedOn => {
                            if seen.insert(c) {
                                todo.push(c);
                            }
                        }
                        Backlog::Under => {}
                    }
                }
            }
        }
        false
    }

    /// Which consumer of `idx`'s outputs holds it back, in words (for a
    /// stuck job's description).
    pub(super) fn holding_back(&self, idx: StageIdx) -> String {
        for &p in &self.topology.plan.stages[idx].outputs {
            for &c in &self.topology.consumers[p].stages {
                let name = &self.topology.plan.stages[c].name;
                if matches!(self.own_backlog(c), Backlog::Over) {
                    let queue = &self.stages[c].queue;
                    return format!(
                        "'{name}', whose queue here holds {} bytes ({} in bundles) past its bound of {}",
                        queue.backlog_bytes(),
                        queue.in_flight(),
                        self.config.max_pending_bytes
                    );
                }
                if self.over_elsewhere(c) {
                    return format!("'{name}', over its bound on another shard");
                }
            }
        }
        "a consumer further down over its bound".to_string()
    }

    /// How consumer `c`'s backlog bears on its producers: its own, or, on
    /// a shard, its copy's on another shard being over its bound (a
    /// producer here may be sending to it).
    fn backlog_of(&self, c: StageIdx) -> Backlog {
        match self.own_backlog(c) {
            Backlog::Over => Backlog::Over,
            _ if self.over_elsewhere(c) => Backlog::Over,
            backlog => backlog,
        }
    }

    /// Whether stage `c`'s own queue here is over its bound: what a shard
    /// publishes for the others' producers.
    pub(super) fn over_its_bound(&self, c: StageIdx) -> bool {
        matches!(self.own_backlog(c), Backlog::Over)
    }

    /// How consumer `c`'s own backlog bears on its producers.
    fn own_backlog(&self, c: StageIdx) -> Backlog {
        let s = &self.stages[c];
        if let Some(g) = s.grouping() {
            // A GroupByKey has no queue: what it takes in waits in its
            // buffer. Data there that is owed to consumers now (its keys
            // wait to fire, as a streaming trigger's do) but held back by
            // their bound is a backlog like a queue's, so its producers
            // wait too. (A batch buffer waiting for the watermark spills
            // instead.)
            return if g.has_unevaluated() && g.buffered_bytes() > self.config.max_pending_bytes {
                Backlog::PassedOn
            } else {
                Backlog::Under
            };
        }
        // What waits and what runs: a consumer that takes its whole queue
        // into bundles does not make room for more.
        let queue = &s.queue;
        let over = queue.backlog_bytes() > self.config.max_pending_bytes
            && (queue.in_flight() > 0 || self.topology.plan.stages[c].side_inputs.is_empty() || {
                let gate = self.side_input_gate(c);
                queue
                    .pending
                    .any(|e| gate.iter().all(|g| g.allows(e, self.config.streaming)))
            });
        match (over, &self.topology.plan.stages[c].kind) {
            (true, _) => Backlog::Over,
            (false, StageKind::Flatten) => Backlog::PassedOn,
            (false, _) => Backlog::Under,
        }
    }

    /// Starts what can start: window-merge requests, then bundles of every
    /// SDK stage, the stage that waited longest for a slot first.
    pub(super) fn schedule(
        &mut self,
        tx: &mpsc::UnboundedSender<Report>,
    ) -> Result<(), EngineError> {
        self.schedule_merges(tx)?;
        self.slot_groups.begin_look();
        let order = self.slot_groups.longest_waiting_first(&self.topology.order);
        for idx in order {
            let Some(shape) = self.bundle_shape(idx) else {
                continue;
            };
            if self.may_start_bundles(idx, &shape.gate) {
                self.start_bundles(idx, &shape, tx)?;
            }
        }
        Ok(())
    }

    /// What every bundle of SDK stage `idx` is cut by; `None` for a stage
    /// that runs no bundles.
    fn bundle_shape(&self, idx: StageIdx) -> Option<BundleShape> {
        let StageKind::Sdk(sdk) = &self.topology.plan.stages[idx].kind else {
            return None;
        };
        let families = sdk.timer_families.clone();
        // A keyed stage runs several bundles at once, on disjoint key
        // groups (see `key_groups`); its input is `KV`.
        let keyed = self.topology.plan.stages[idx].is_keyed();
        let key_coder = if keyed {
            self.topology.plan.stages[idx]
                .inputs
                .first()
                .map(|&p| self.topology.plan.pcollections[p].value_coder.clone())
        } else {
            None
        };
        Some(BundleShape {
            splittable: sdk.splittable,
            time_sorted: sdk.time_sorted_input,
            expiration: sdk
                .window_expiration
                .as_ref()
                .map(|e| (e.transform_id.clone(), e.family_id.clone())),
            families,
            keyed,
            key_coder,
            // As many slices as bundles of the stage may run at once: a
            // stage whose workers take one bundle at a time takes every
            // key group into it.
            key_slices: self
                .config
                .max_bundles_per_stage
                .min(self.slot_groups.capacity(idx))
                .clamp(1, KEY_GROUPS as usize),
            gate: self.side_input_gate(idx),
        })
    }

    /// Whether stage `idx` may start bundles now: every side input has
    /// something to read (`gate`; those that have are marked ready), no
    /// retry backoff runs and its consumers are under their bound (which
    /// the stage's throttle counter records).
    fn may_start_bundles(&mut self, idx: StageIdx, gate: &[SideGate]) -> bool {
        if gate
            .iter()
            .any(|g| g.watermark <= MIN_TIMESTAMP && !g.has_values)
        {
            return false;
        }
        if !gate.is_empty() {
            let mut store = self.side_inputs.lock();
            for si in &self.topology.plan.stages[idx].side_inputs {
                store.mark_ready(&si.id);
            }
        }
        let backing_off = self.stages[idx]
            .sdk()
            .is_some_and(|sdk| !sdk.retries.may_start(Instant::now()));
        if backing_off {
            return false;
        }
        let throttled = self.backpressured(idx);
        self.stages[idx]
            .progress
            .counters
            .set_throttled(throttled, Instant::now());
        if throttled {
            return false;
        }
        if let Some(sdk) = self.stages[idx].sdk_mut() {
            sdk.retries.end_backoff();
        }
        true
    }

    /// Starts bundles of stage `idx` while it has free slots and work.
    fn start_bundles(
        &mut self,
        idx: StageIdx,
        shape: &BundleShape,
        tx: &mpsc::UnboundedSender<Report>,
    ) -> Result<(), EngineError> {
        loop {
            let free_slots = self.slot_groups.free(idx);
            if free_slots == 0 {
                let queue = &self.stages[idx].queue;
                if !queue.pending.is_empty() {
                    self.slot_groups.wait(idx, queue.in_flight() > 0);
                }
                return Ok(());
            }
            let at_once = match self.strict.as_ref() {
                Some(strict) => strict.bundles_at_once(idx, self.config.max_bundles_per_stage),
                None => self.config.max_bundles_per_stage,
            };
            let Some(picked) = self.pick_bundle_input(idx, shape, at_once, free_slots)? else {
                return Ok(());
            };
            self.launch_bundle(idx, shape, picked, tx)?;
        }
    }

    /// The input of stage `idx`'s next bundle: elements and fired timers
    /// of one key slice (the first slice that has any), or `None` if no
    /// bundle should start (`at_once` already run, or nothing to do).
    fn pick_bundle_input(
        &mut self,
        idx: StageIdx,
        shape: &BundleShape,
        at_once: usize,
        free_slots: usize,
    ) -> Result<Option<Picked>, EngineError> {
        let now = self.now();
        let streaming = self.config.streaming;
        let max_bundle_elements = self.config.max_bundle_elements;
        let Some((queue, progress, state)) = self.stages[idx].sdk_parts() else {
            return Ok(None);
        };
        if queue.in_flight() >= at_once {
            return Ok(None);
        }
        // Bundles take from the queue's memory part: bring spilled
        // elements back as it drains.
        queue
            .pending
            .refill()
            .map_err(spill_failed(&self.topology.plan, idx))?;
        let (keyed, time_sorted, gate) = (shape.keyed, shape.time_sorted, &shape.gate);
        let element_group = |e: &DecodedElement| -> KeyGroupSet {
            match &shape.key_coder {
                Some(coder) => element_key_group(coder, e),
                None => 0,
            }
        };
        // Time-sorted input: an element goes out only once the input
        // watermark passed it, so nothing earlier can still arrive.
        let input_wm = progress.input_wm;
        let released = |e: &DecodedElement| !time_sorted || e.header.timestamp < input_wm;
        let has_input = if time_sorted {
            queue.pending.any(released)
        } else {
            !queue.pending.is_empty()
        };
        // Elements that already arrived are processed before any
        // timer they could precede fires, so a timer cannot overtake
        // data that would have reset or cleared it. In batch that
        // is all waiting input; in streaming, where input may never
        // stop, only waiting elements at or before a timer's time
        // hold it back (processing-time timers wait for the queue
        // to empty), so that event-time timers are not starved.
        let last = shape
            .expiration
            .as_ref()
            .map(|(t, f)| (t.as_str(), f.as_str()));
        // A keyed stage's bundle takes one slice of the key groups,
        // the part of it no bundle in flight holds (all of it but
        // for a bundle that gave some of its groups back when it
        // was split), so that the other slices are left for
        // bundles running beside it.
        let candidates: Vec<KeyGroupSet> = if keyed {
            (0..shape.key_slices)
                .map(|k| slice_mask(k, shape.key_slices) & queue.free_key_groups())
                .filter(|m| *m != 0)
                .collect()
        } else {
            vec![KeyGroupSet::MAX]
        };
        let bundle_elements = balanced_bundle_elements(
            queue.pending.len(),
            at_once.saturating_sub(queue.in_flight()).min(free_slots),
            max_bundle_elements,
            shape.splittable,
        );
        let bundle_elements = match self.strict.as_mut() {
            Some(strict) => strict.bundle_elements(idx, bundle_elements, queue.pending.len()),
            None => bundle_elements,
        };
        // A bundle fires at most as many timers as it may take
        // elements.
        let max_timers = max_bundle_elements;
        for allowed in candidates {
            let in_slice = |e: &DecodedElement| !keyed || element_group(e) & allowed != 0;
            let eligible = |key: &[u8]| !keyed || group_of(key) & allowed != 0;
            let fired = if shape.families.is_empty() {
                Vec::new()
            } else if !has_input {
                state
                    .timers
                    .take_ready_where(input_wm, now, last, max_timers, eligible)
            } else if streaming {
                let before_waiting = queue.pending.hold().map_or(input_wm, |h| h.min(input_wm));
                state.timers.take_ready_where(
                    before_waiting,
                    MIN_TIMESTAMP,
                    last,
                    max_timers,
                    eligible,
                )
            } else {
                Vec::new()
            };
            let elements = if gate.is_empty() && !time_sorted && !keyed {
                Taken::Entries(queue.pending.take(bundle_elements))
            } else {
                // Only elements whose side inputs are ready, in
                // the bundle's key slice.
                Taken::Elements(queue.pending.take_where(bundle_elements, |e| {
                    released(e) && in_slice(e) && gate.iter().all(|g| g.allows(e, streaming))
                }))
            };
            if !elements.is_empty() || !fired.is_empty() {
                return Ok(Some(Picked {
                    allowed,
                    taken: elements,
                    fired,
                }));
            }
        }
        Ok(None)
    }

    /// Starts a bundle of stage `idx` on `picked`: records it in flight
    /// (holds, key groups, input bytes) and hands it to the executor,
    /// which reports back on `tx`.
    fn launch_bundle(
        &mut self,
        idx: StageIdx,
        shape: &BundleShape,
        picked: Picked,
        tx: &mpsc::UnboundedSender<Report>,
    ) -> Result<(), EngineError> {
        let Picked {
            allowed,
            taken,
            fired,
        } = picked;
        let (keyed, time_sorted) = (shape.keyed, shape.time_sorted);
        // A stateful stage's bundle may be split between key
        // groups. Its timers fire in the bundle whatever the split;
        // a split keeps their groups (see the commit's
        // `release_given_back_groups`), and what it gives back
        // returns to the queue, where it holds back the timers it
        // could precede as any waiting element does.
        let mut split_points = Vec::new();
        let mut elements: Vec<Queued> = match taken {
            Taken::Entries(entries) => entries,
            Taken::Elements(mut elements) => {
                if time_sorted {
                    elements.sort_by_key(|e| e.header.timestamp);
                } else if let Some(coder) = shape.key_coder.as_ref().filter(|_| elements.len() > 1)
                {
                    (elements, split_points) = group_by_key_group(coder, elements);
                }
                elements.into_iter().map(Queued::One).collect()
            }
        };
        // Only a stateless stage's order is free: a keyed one keeps
        // each key's order, a time-sorted one its timestamps'.
        if let (Some(strict), false, false) = (self.strict.as_mut(), keyed, time_sorted) {
            strict.reorder(&mut elements);
        }
        let take = element_count(&elements);
        let key_groups: KeyGroupSet = if keyed { allowed } else { 0 };
        let mut holds = Vec::new();
        let mut element_lengths = Vec::with_capacity(take);
        for q in &elements {
            push_hold(&mut holds, q.holds());
            q.element_lengths(&mut element_lengths);
        }
        for (_, f) in &fired {
            push_hold(&mut holds, (f.timer.hold_timestamp, 1));
        }
        let input_bytes: usize = element_lengths.iter().sum();
        self.stages[idx]
            .queue
            .bundle_started(key_groups, &holds, input_bytes);
        self.slot_groups.take(idx);
        let timer_inputs = timer_inputs(&shape.families, &fired)?;
        // A splittable stage's inputs go one element per chunk, so
        // that the executor can hand back the elements a split
        // leaves unprocessed.
        let chunk_bytes = if shape.splittable {
            0
        } else {
            self.config.chunk_bytes
        };
        let chunks = chunk_entries(&elements, chunk_bytes);
        let mut overlay =
            BundleOverlay::new(self.side_inputs.clone(), self.user_state[idx].clone());
        if let Some((store, space)) = &self.durability.spill_space {
            overlay = overlay.with_runner_iterables(store.clone(), space.clone());
        }
        let overlay = Arc::new(overlay);
        let bundle = self.next_bundle;
        self.next_bundle += 1;
        self.in_flight.insert(
            bundle,
            InFlight {
                stage: idx,
                holds,
                overlay: overlay.clone(),
                fired_timers: fired,
                elements,
                key_groups,
                input_bytes,
            },
        );
        let input = BundleInput {
            stage: idx,
            bundle_id: format!("{}-b{}", self.bundle_prefix, bundle),
            shard: self.shard_id(),
            elements: chunks,
            element_lengths,
            split_points,
            timers: timer_inputs,
            state: overlay,
            draining: self.draining,
            splits: {
                let tx = tx.clone();
                SplitSink::new(move |split| {
                    let _ = tx.send(Report::Split { bundle, split });
                })
            },
        };
        debug!(stage = %self.topology.plan.stages[idx].name, bundle, elements = take, "starting bundle");
        let fut = self.executor.execute(input);
        let tx = tx.clone();
        tokio::spawn(async move {
            let result = crate::executor::panics_as_errors(fut).await;
            let _ = tx.send(Report::Bundle { bundle, result });
        });
        Ok(())
    }
}

/// What every bundle of one SDK stage is cut by, read from its plan once
/// per scheduling pass.
struct BundleShape {
    /// Its restrictions may be split (one element per chunk).
    splittable: bool,
    /// Its input goes out in timestamp order, behind the watermark.
    time_sorted: bool,
    /// The timer family of `@OnWindowExpiration` (fired after the others).
    expiration: Option<(TransformId, String)>,
    /// Its timer families.
    families: Vec<TimerFamily>,
    /// It runs on key groups: stateful, or with timers.
    keyed: bool,
    /// A keyed stage's input value coder (a `KV`).
    key_coder: Option<Coder>,
    /// How many key slices its bundles share out.
    key_slices: usize,
    /// Its side inputs, as the gate elements pass.
    gate: Vec<SideGate>,
}

/// The input picked for a bundle: the key groups it may take, its
/// elements and its fired timers.
struct Picked {
    allowed: KeyGroupSet,
    taken: Taken,
    fired: Vec<(TimeDomain, FiredTimer)>,
}

/// The timers a bundle fires, encoded per timer family (every family
/// gets an entry, empty or not).
fn timer_inputs(
    families: &[TimerFamily],
    fired: &[(TimeDomain, FiredTimer)],
) -> Result<Vec<TimerInput>, EngineError> {
    families
        .iter()
        .map(|fam| {
            let of_family: Vec<&FiredTimer> = fired
                .iter()
                .map(|(_, f)| f)
                .filter(|f| f.transform_id == fam.transform_id && f.family_id == fam.family_id)
                .collect();
            let data = TimerStore::encode(&of_family, &fam.window_coder).map_err(|source| {
                EngineError::Decode {
                    pcollection: format!("timers of '{}'", fam.transform_id),
                    source,
                }
            })?;
            Ok(TimerInput {
                transform_id: fam.transform_id.to_string(),
                family_id: fam.family_id.clone(),
                data,
            })
        })
        .collect()
}

/// Fewest elements a bundle is cut down to so that waiting work is shared
/// between bundles (a non-splittable stage's; each of a splittable stage's
/// elements is a whole restriction, so there it is one).
const MIN_SHARED_BUNDLE_ELEMENTS: usize = 1_000;

/// How many of `waiting` elements the next bundle of a stage with
/// `free_slots` bundles still to start takes: an even share, so that the
/// last of a stage's input (a GroupByKey's final firing, say) runs on
/// every worker at once rather than as one bundle on one worker while the
/// others idle. At most `max`, and not below a size whose per-bundle cost
/// would show.
fn balanced_bundle_elements(
    waiting: usize,
    free_slots: usize,
    max: usize,
    splittable: bool,
) -> usize {
    let floor = if splittable {
        1
    } else {
        MIN_SHARED_BUNDLE_ELEMENTS
    };
    waiting
        .div_ceil(free_slots.max(1))
        .max(floor)
        .min(max.max(1))
}

/// A consumer's backlog as its producers see it (`Engine::backpressured`).
enum Backlog {
    /// Over its bound, and it can work through it: its producers wait.
    Over,
    /// Its own queue is no measure: its consumers' backlog counts.
    PassedOn,
    /// Room to spare.
    Under,
}

#[cfg(test)]
mod tests {
    use super::{balanced_bundle_elements, group_by_key_group};
    use crate::coder::{
        decode_windowed_values, encode_windowed_value, Coder, PaneInfo, WindowedValueHeader,
    };
    use crate::key_groups::key_group;
    use crate::window::Window;
    use bytes::Bytes;
    use proptest::prelude::*;

    proptest! {
        /// Against a stable sort by group: the same order, and a split
        /// point wherever the group changes.
        #[test]
        fn a_bundle_is_put_in_key_group_order_as_a_stable_sort_would(
            keys in proptest::collection::vec(0u16..400, 0..300),
        ) {
            let coder = Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Bytes));
            let header = WindowedValueHeader {
                timestamp: 0,
                windows: smallvec::smallvec![Window::Global],
                pane: PaneInfo::NO_FIRING,
            };
            let mut encoded = Vec::new();
            for (at, k) in keys.iter().enumerate() {
                let key = format!("k{k}");
                let mut kv = vec![key.len() as u8];
                kv.extend_from_slice(key.as_bytes());
                kv.push(2);
                kv.extend_from_slice(&(at as u16).to_be_bytes());
                encode_windowed_value(&header, &Coder::GlobalWindow, &kv, &mut encoded)
                    .expect("encodes");
            }
            let elements =
                decode_windowed_values(&Bytes::from(encoded), &coder, &Coder::GlobalWindow)
                    .expect("decodes");
            let group = |v: &[u8]| key_group(&v[..v[0] as usize + 1]);
            let mut want: Vec<Vec<u8>> = elements.iter().map(|e| e.value().to_vec()).collect();
            want.sort_by_key(|v| group(v));
            let want_points: Vec<usize> = (1..want.len())
                .filter(|&i| group(&want[i]) != group(&want[i - 1]))
                .collect();
            let (grouped, points) = group_by_key_group(&coder, elements);
            let got: Vec<Vec<u8>> = grouped.iter().map(|e| e.value().to_vec()).collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(points, want_points);
        }
    }

    #[test]
    fn waiting_elements_are_shared_between_free_bundles() {
        // 100k waiting, four bundles may start: a quarter each.
        assert_eq!(balanced_bundle_elements(100_000, 4, 100_000, false), 25_000);
        assert_eq!(balanced_bundle_elements(75_000, 3, 100_000, false), 25_000);
        // Never more than the maximum...
        assert_eq!(
            balanced_bundle_elements(1_000_000, 2, 100_000, false),
            100_000
        );
        // ...nor tiny bundles of a cheap stage's few elements.
        assert_eq!(balanced_bundle_elements(10, 4, 100_000, false), 1_000);
        // A splittable stage's restrictions are shared one by one.
        assert_eq!(balanced_bundle_elements(10, 4, 100_000, true), 3);
        assert_eq!(balanced_bundle_elements(1, 4, 100_000, true), 1);
        // No free slot counts as one (the caller checks there is one).
        assert_eq!(balanced_bundle_elements(5_000, 0, 100_000, false), 5_000);
        assert_eq!(balanced_bundle_elements(5_000, 4, 0, false), 1);
    }
}
