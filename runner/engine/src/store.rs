//! In-memory homes for the state the SDK reads and writes.
//!
//! [`SideInputStore`] holds materialized side inputs by (consumer transform,
//! tag, window); [`UserStateStore`] holds user state — bags, ordered lists
//! and multimaps — by (transform, state id, window, key). A bundle never
//! writes to either directly: it writes to a [`BundleOverlay`], which reads
//! through to the stores and is applied by the engine only when the bundle
//! succeeded. That is what makes a bundle a transaction: a failed bundle's
//! state writes are simply dropped with its overlay.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::coder::Coder;
use crate::spill::{SpillError, SpillStore};
use crate::state::{
    decode_ordered_entries, encode_ordered_entry, BundleState, SortKeyRange, StateError, StateKey,
    StatePage,
};

mod bag_spill;
#[cfg(test)]
mod bag_spill_tests;
use bag_spill::BagSpill;
pub(crate) use bag_spill::SpilledBags;

/// (consumer transform, side input tag, encoded window).
type SideInputWindow = (String, String, Bytes);
/// Keys in first-seen order, and values by key.
type MultimapValues = (Vec<Bytes>, HashMap<Bytes, Vec<Bytes>>);

/// Values and keys of side inputs, per window, readable by state key.
#[derive(Debug, Default)]
pub struct SideInputStore {
    /// (transform, tag, window) -> whole nested values.
    iterable: HashMap<SideInputWindow, Vec<Bytes>>,
    /// (transform, tag, window) -> key -> values; keys kept in first-seen order.
    multimap: HashMap<SideInputWindow, MultimapValues>,
    /// Side inputs whose PCollection is complete and may be read.
    ready: std::collections::HashSet<(String, String)>,
}

impl SideInputStore {
    /// Record one value of an iterable side input in a window.
    pub fn add_iterable(&mut self, transform: &str, tag: &str, window: Bytes, value: Bytes) {
        self.iterable
            .entry((transform.to_string(), tag.to_string(), window))
            .or_default()
            .push(value);
    }

    /// Record one key/value of a multimap side input in a window.
    pub fn add_multimap(
        &mut self,
        transform: &str,
        tag: &str,
        window: Bytes,
        key: Bytes,
        value: Bytes,
    ) {
        let (keys, values) = self
            .multimap
            .entry((transform.to_string(), tag.to_string(), window))
            .or_default();
        let entry = values.entry(key.clone()).or_insert_with(|| {
            keys.push(key);
            Vec::new()
        });
        entry.push(value);
    }

    /// Whether any value of the side input has arrived (in any window):
    /// in streaming, a globally windowed side input becomes readable with
    /// its first pane and is updated by later ones.
    pub fn has_values(&self, transform: &str, tag: &str) -> bool {
        self.iterable
            .keys()
            .chain(self.multimap.keys())
            .any(|(t, s, _)| t == transform && s == tag)
    }

    /// Mark a side input as complete (its producer's watermark is final).
    pub fn mark_ready(&mut self, transform: &str, tag: &str) {
        self.ready.insert((transform.to_string(), tag.to_string()));
    }

    fn read(&self, key: &StateKey) -> Result<Vec<Bytes>, StateError> {
        let check = |t: &str, s: &str| {
            if self.ready.contains(&(t.to_string(), s.to_string())) {
                Ok(())
            } else {
                Err(StateError(format!(
                    "side input '{s}' of transform '{t}' was read before it was complete"
                )))
            }
        };
        match key {
            StateKey::IterableSideInput {
                transform_id,
                side_input_id,
                window,
            } => {
                check(transform_id, side_input_id)?;
                Ok(self
                    .iterable
                    .get(&(transform_id.clone(), side_input_id.clone(), window.clone()))
                    .cloned()
                    .unwrap_or_default())
            }
            StateKey::MultimapSideInput {
                transform_id,
                side_input_id,
                window,
                key,
            } => {
                check(transform_id, side_input_id)?;
                Ok(self
                    .multimap
                    .get(&(transform_id.clone(), side_input_id.clone(), window.clone()))
                    .and_then(|(_, values)| values.get(key).cloned())
                    .unwrap_or_default())
            }
            StateKey::MultimapKeysSideInput {
                transform_id,
                side_input_id,
                window,
            } => {
                check(transform_id, side_input_id)?;
                Ok(self
                    .multimap
                    .get(&(transform_id.clone(), side_input_id.clone(), window.clone()))
                    .map(|(keys, _)| keys.clone())
                    .unwrap_or_default())
            }
            StateKey::BagUserState { .. }
            | StateKey::OrderedListUserState { .. }
            | StateKey::MultimapUserState { .. }
            | StateKey::MultimapKeysUserState { .. }
            | StateKey::MultimapEntriesUserState { .. } => Err(StateError(
                "user state requested from the side-input store".into(),
            )),
            StateKey::RunnerIterable { .. } => Err(StateError(
                "a handed-out iterable requested from the side-input store".into(),
            )),
        }
    }
}

/// Identifies one cell of user state of any kind: (transform id, state id,
/// encoded window, nested-encoded user key).
pub type CellId = (String, String, Bytes, Bytes);

/// Identifies one bag of user state (a [`CellId`]; the name predates the
/// other kinds of user state).
pub type BagId = CellId;

/// Committed ordered list: values by sort key, equal keys in append order.
type OrderedList = BTreeMap<i64, Vec<Bytes>>;

/// Committed multimap: appended value chunks by map key. A map key is
/// present while it has at least one chunk, even an empty one (Java's
/// `SetState` stores `Void` values, which encode to nothing).
type Multimap = BTreeMap<Bytes, Vec<Bytes>>;

/// The kind of user state a [`StateKey`] addresses, with its cell.
enum UserKey<'a> {
    Bag(CellId),
    OrderedList(CellId, Option<SortKeyRange>),
    MultimapValues(CellId, &'a Bytes),
    MultimapKeys(CellId),
    MultimapEntries(CellId),
}

fn cell(transform_id: &str, state_id: &str, window: &Bytes, key: &Bytes) -> CellId {
    (
        transform_id.to_string(),
        state_id.to_string(),
        window.clone(),
        key.clone(),
    )
}

/// `None` for side-input keys.
fn user_key(key: &StateKey) -> Option<UserKey<'_>> {
    Some(match key {
        StateKey::BagUserState {
            transform_id,
            state_id,
            window,
            key,
        } => UserKey::Bag(cell(transform_id, state_id, window, key)),
        StateKey::OrderedListUserState {
            transform_id,
            state_id,
            window,
            key,
            range,
        } => UserKey::OrderedList(cell(transform_id, state_id, window, key), *range),
        StateKey::MultimapUserState {
            transform_id,
            state_id,
            window,
            key,
            map_key,
        } => UserKey::MultimapValues(cell(transform_id, state_id, window, key), map_key),
        StateKey::MultimapKeysUserState {
            transform_id,
            state_id,
            window,
            key,
        } => UserKey::MultimapKeys(cell(transform_id, state_id, window, key)),
        StateKey::MultimapEntriesUserState {
            transform_id,
            state_id,
            window,
            key,
        } => UserKey::MultimapEntries(cell(transform_id, state_id, window, key)),
        StateKey::IterableSideInput { .. }
        | StateKey::MultimapSideInput { .. }
        | StateKey::MultimapKeysSideInput { .. }
        | StateKey::RunnerIterable { .. } => return None,
    })
}

/// Gets and clears of an ordered list must say which sort keys they cover.
fn required_range(range: Option<SortKeyRange>, op: &str) -> Result<SortKeyRange, StateError> {
    range.ok_or_else(|| {
        StateError(format!(
            "ordered list user state {op} without a sort key range (the range is required \
             for gets and clears)"
        ))
    })
}

/// Removes every sort key in `range` from `list`.
fn remove_range(list: &mut OrderedList, range: SortKeyRange) {
    if range.is_empty() {
        return;
    }
    // O(removed · log n): clearing a few sort keys of a long list (the
    // usual pattern: drop what was just processed) stays cheap.
    let doomed: Vec<i64> = list
        .range(range.start..range.end)
        .map(|(k, _)| *k)
        .collect();
    for k in doomed {
        list.remove(&k);
    }
}

/// A multimap side input in one window: its keys in first-seen order, and
/// values by key, sorted.
type MultimapSnapshot = (SideInputWindow, Vec<Bytes>, Vec<(Bytes, Vec<Bytes>)>);

/// What a checkpoint keeps of a [`SideInputStore`], in a stable order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct SideInputSnapshot {
    iterable: Vec<(SideInputWindow, Vec<Bytes>)>,
    multimap: Vec<MultimapSnapshot>,
    ready: Vec<(String, String)>,
}

impl SideInputStore {
    /// What a checkpoint keeps: everything, sorted.
    pub(crate) fn snapshot(&self) -> SideInputSnapshot {
        let mut iterable: Vec<_> = self
            .iterable
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        iterable.sort_by(|a, b| a.0.cmp(&b.0));
        let mut multimap: Vec<_> = self
            .multimap
            .iter()
            .map(|(k, (order, values))| {
                let mut values: Vec<_> =
                    values.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                values.sort_by(|a, b| a.0.cmp(&b.0));
                (k.clone(), order.clone(), values)
            })
            .collect();
        multimap.sort_by(|a, b| a.0.cmp(&b.0));
        let mut ready: Vec<_> = self.ready.iter().cloned().collect();
        ready.sort();
        SideInputSnapshot {
            iterable,
            multimap,
            ready,
        }
    }

    /// The store a checkpoint kept.
    pub(crate) fn restore(snapshot: SideInputSnapshot) -> Self {
        SideInputStore {
            iterable: snapshot.iterable.into_iter().collect(),
            multimap: snapshot
                .multimap
                .into_iter()
                .map(|(k, order, values)| (k, (order, values.into_iter().collect())))
                .collect(),
            ready: snapshot.ready.into_iter().collect(),
        }
    }
}

/// What a checkpoint keeps of a [`UserStateStore`], in a stable order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct UserStateSnapshot {
    bags: Vec<(BagId, Vec<Bytes>)>,
    ordered_lists: Vec<(CellId, OrderedList)>,
    multimaps: Vec<(CellId, Multimap)>,
}

impl UserStateStore {
    /// What a checkpoint keeps: every cell, sorted, spilled bags read
    /// back.
    pub(crate) fn snapshot(&self) -> Result<UserStateSnapshot, SpillError> {
        let mut bags = self.bags.clone();
        if let Some(spill) = &self.bag_spill {
            for (id, mut chunks) in spill.read_back()? {
                chunks.extend(self.bags.get(&id).into_iter().flatten().cloned());
                bags.insert(id, chunks);
            }
        }
        Ok(UserStateSnapshot {
            bags: sorted(&bags),
            ordered_lists: sorted(&self.ordered_lists),
            multimaps: sorted(&self.multimaps),
        })
    }

    /// What checkpoint `number` (counting those sent to be written) keeps:
    /// as [`Self::snapshot`], except that bags on a durable store are named,
    /// not copied (the second half; see `bag_spill`).
    pub(crate) fn checkpoint(
        &mut self,
        number: u64,
    ) -> Result<(UserStateSnapshot, Option<SpilledBags>), SpillError> {
        match &mut self.bag_spill {
            Some(spill) if spill.is_durable() => {
                let spilled = spill.checkpoint(number);
                let snapshot = UserStateSnapshot {
                    bags: sorted(&self.bags),
                    ordered_lists: sorted(&self.ordered_lists),
                    multimaps: sorted(&self.multimaps),
                };
                Ok((snapshot, Some(spilled)))
            }
            _ => Ok((self.snapshot()?, None)),
        }
    }

    /// Checkpoints up to `number` are durable: the parts of bags cleared
    /// before them may go.
    pub(crate) fn checkpoint_durable(&mut self, number: u64) -> Result<(), SpillError> {
        match &mut self.bag_spill {
            Some(spill) => spill.checkpoint_durable(number),
            None => Ok(()),
        }
    }

    /// Puts back the cells a checkpoint kept (registered coders stay) —
    /// with `spilled`, the bags it named on the durable store — and spills
    /// bags again if they are more than memory allows.
    pub(crate) fn restore(
        &mut self,
        snapshot: UserStateSnapshot,
        spilled: Option<SpilledBags>,
    ) -> Result<(), SpillError> {
        self.bags = snapshot.bags.into_iter().collect();
        self.ordered_lists = snapshot.ordered_lists.into_iter().collect();
        self.multimaps = snapshot.multimaps.into_iter().collect();
        match &mut self.bag_spill {
            Some(spill) if spill.is_durable() => spill.restore(spilled)?,
            other => {
                if spilled.as_ref().is_some_and(SpilledBags::names_bags) {
                    return Err(SpillError(
                        "the checkpoint names user state kept beside it, and this run keeps \
                         none (was it taken by a server with --state_dir?)"
                            .into(),
                    ));
                }
                if let Some(spill) = other {
                    spill.clear()?;
                }
            }
        }
        self.windows.clear();
        let on_disk_only = self
            .bag_spill
            .iter()
            .flat_map(|s| s.cells())
            .filter(|id| !self.bags.contains_key(*id));
        let cells = (self.bags.keys())
            .chain(on_disk_only)
            .chain(self.ordered_lists.keys())
            .chain(self.multimaps.keys());
        for (_, _, window, _) in cells {
            *self.windows.entry(window.clone()).or_default() += 1;
        }
        self.bag_bytes = self.bags.values().flatten().map(Bytes::len).sum();
        self.maybe_spill_bags()
    }
}

/// `map`'s cells, sorted (a checkpoint part's bytes must not depend on a
/// hash map's order).
fn sorted<V: Clone>(map: &HashMap<CellId, V>) -> Vec<(CellId, V)> {
    let mut cells: Vec<_> = map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    cells.sort_by(|a, b| a.0.cmp(&b.0));
    cells
}

/// The cell `id` of `cells`, made empty if new, and whether it was there.
fn cell_entry<'a, V: Default>(cells: &'a mut HashMap<CellId, V>, id: &CellId) -> (&'a mut V, bool) {
    match cells.entry(id.clone()) {
        Entry::Occupied(cell) => (cell.into_mut(), true),
        Entry::Vacant(slot) => (slot.insert(V::default()), false),
    }
}

/// Counts a cell of `window` that came or went.
fn count_cell(windows: &mut HashMap<Bytes, usize>, window: &Bytes, existed: bool, exists: bool) {
    match (existed, exists) {
        (false, true) => *windows.entry(window.clone()).or_default() += 1,
        (true, false) => {
            if let Some(n) = windows.get_mut(window) {
                *n -= 1;
                if *n == 0 {
                    windows.remove(window);
                }
            }
        }
        _ => {}
    }
}

/// Committed user state of one stage.
#[derive(Debug, Default)]
pub struct UserStateStore {
    /// Bags' chunks in memory (after their parts on disk, if any).
    bags: HashMap<BagId, Vec<Bytes>>,
    /// Bytes of those chunks.
    bag_bytes: usize,
    /// Where bags go past the stage's share of memory, if anywhere.
    bag_spill: Option<BagSpill>,
    ordered_lists: HashMap<CellId, OrderedList>,
    multimaps: HashMap<CellId, Multimap>,
    /// How many cells (of any kind) each encoded window has: expiring
    /// windows is asked about at every watermark advance, and must not
    /// walk every cell to find that none expired.
    windows: HashMap<Bytes, usize>,
    /// (transform id, state id) -> the multimap's value coder, needed only to
    /// count values when serving multimap entries.
    multimap_value_coders: HashMap<(String, String), Coder>,
}

impl UserStateStore {
    /// Lets the stage's bags spill to `store` under `prefix` once their
    /// values in memory pass `limit` bytes (see `bag_spill`).
    pub fn enable_bag_spill(&mut self, store: Arc<dyn SpillStore>, prefix: Vec<u8>, limit: usize) {
        self.bag_spill = Some(BagSpill::scratch(store, prefix, limit));
    }

    /// Lets the stage's bags spill to durable `store` under `prefix` once
    /// their values in memory pass `limit` bytes: checkpoints name what is
    /// there instead of copying it, so state on disk does not hold periodic
    /// checkpoints back (see `bag_spill`).
    pub fn enable_durable_bag_spill(
        &mut self,
        store: Arc<dyn SpillStore>,
        prefix: Vec<u8>,
        limit: usize,
    ) {
        self.bag_spill = Some(BagSpill::durable(store, prefix, limit));
    }

    /// Keeps the stage's bags in memory after all, when the job turns out
    /// to be one whose state could stay on disk for good (a checkpointed
    /// streaming job): bags already on disk (a restore may have spilled
    /// them) are read back and their parts forgotten. If they cannot be
    /// read, nothing changes; if their parts cannot be deleted, the bags
    /// are in memory all the same and the parts stay behind as garbage
    /// (the job's spill space is reclaimed when it ends).
    pub fn disable_bag_spill(&mut self) -> Result<(), SpillError> {
        let Some(spill) = &self.bag_spill else {
            return Ok(());
        };
        let back = spill.read_back()?;
        for (id, mut chunks) in back {
            self.bag_bytes += chunks.iter().map(Bytes::len).sum::<usize>();
            let bag = self.bags.entry(id).or_default();
            // Parts on disk come before the chunks appended since.
            chunks.append(bag);
            *bag = chunks;
        }
        match self.bag_spill.take() {
            Some(mut spill) => spill.clear(),
            None => Ok(()),
        }
    }

    /// Whether some bag has parts on disk.
    pub fn has_spilled(&self) -> bool {
        self.bag_spill.as_ref().is_some_and(BagSpill::holds_data)
    }

    /// Whether some bag has parts on scratch disk, which a checkpoint would
    /// have to read back.
    pub fn holds_scratch_spill(&self) -> bool {
        self.bag_spill
            .as_ref()
            .is_some_and(|s| s.holds_data() && !s.is_durable())
    }

    /// How many parts bags have on disk.
    #[cfg(test)]
    pub(crate) fn parts_on_disk(&self) -> usize {
        self.bag_spill
            .as_ref()
            .map_or(0, |s| s.cells().map(|id| s.parts(id)).sum())
    }

    /// Bytes of bags written to disk so far.
    pub fn spilled_bytes(&self) -> u64 {
        self.bag_spill.as_ref().map_or(0, BagSpill::spilled_bytes)
    }

    fn bag_on_disk(&self, id: &BagId) -> bool {
        self.bag_spill.as_ref().is_some_and(|s| s.contains(id))
    }

    /// Apply a committed bundle's writes (spilling bags if they are now
    /// more than memory allows).
    pub fn apply(&mut self, writes: UserStateWrites) -> Result<(), SpillError> {
        for (id, write) in writes.bags {
            let existed = self.bags.contains_key(&id) || self.bag_on_disk(&id);
            if write.cleared {
                if let Some(chunks) = self.bags.remove(&id) {
                    self.bag_bytes -= chunks.iter().map(Bytes::len).sum::<usize>();
                }
                if let Some(spill) = &mut self.bag_spill {
                    spill.forget(&id)?;
                }
            }
            if !write.appended.is_empty() {
                self.bag_bytes += write.appended.iter().map(Bytes::len).sum::<usize>();
                self.bags
                    .entry(id.clone())
                    .or_default()
                    .extend(write.appended);
            }
            let exists = self.bags.contains_key(&id) || self.bag_on_disk(&id);
            count_cell(&mut self.windows, &id.2, existed, exists);
        }
        for (id, write) in writes.ordered_lists {
            let (list, existed) = cell_entry(&mut self.ordered_lists, &id);
            for op in write.ops {
                match op {
                    OrderedListOp::Clear(range) => remove_range(list, range),
                    OrderedListOp::Append(entries) => {
                        for (sort_key, value) in entries {
                            list.entry(sort_key).or_default().push(value);
                        }
                    }
                }
            }
            let exists = !list.is_empty();
            if !exists {
                self.ordered_lists.remove(&id);
            }
            count_cell(&mut self.windows, &id.2, existed, exists);
        }
        for (id, write) in writes.multimaps {
            let (map, existed) = cell_entry(&mut self.multimaps, &id);
            if write.cleared {
                map.clear();
            }
            for (map_key, w) in write.keys {
                if w.cleared {
                    map.remove(&map_key);
                }
                if !w.appended.is_empty() {
                    map.entry(map_key).or_default().extend(w.appended);
                }
            }
            let exists = !map.is_empty();
            if !exists {
                self.multimaps.remove(&id);
            }
            count_cell(&mut self.windows, &id.2, existed, exists);
        }
        self.maybe_spill_bags()
    }

    /// Moves every bag's chunks to disk if they take more than the limit.
    fn maybe_spill_bags(&mut self) -> Result<(), SpillError> {
        let Some(spill) = &mut self.bag_spill else {
            return Ok(());
        };
        if self.bag_bytes <= spill.limit() {
            return Ok(());
        }
        spill.spill(&mut self.bags)?;
        self.bag_bytes = 0;
        Ok(())
    }

    /// Tell the store the value coder of a multimap user state.
    ///
    /// Serving `multimap_entries_user_state` means writing each map key's
    /// value *count*, and values are appended as opaque concatenations, so
    /// the store must walk them with their coder. Without a registered coder
    /// (or with one the runner cannot walk) entries requests fail with a
    /// state error; every other multimap request works without it.
    pub fn set_multimap_value_coder(&mut self, transform_id: &str, state_id: &str, coder: Coder) {
        self.multimap_value_coders
            .insert((transform_id.to_string(), state_id.to_string()), coder);
    }

    /// Drop all state (of every kind) of windows whose expiry has passed:
    /// `keep` decides from the encoded window, once per window. Walks the
    /// cells only when some window goes.
    pub fn retain_windows(
        &mut self,
        mut keep: impl FnMut(&Bytes) -> bool,
    ) -> Result<(), SpillError> {
        let gone: HashSet<Bytes> = self.windows.keys().filter(|w| !keep(w)).cloned().collect();
        if gone.is_empty() {
            return Ok(());
        }
        let bag_bytes = &mut self.bag_bytes;
        self.bags.retain(|(_, _, window, _), chunks| {
            let keep = !gone.contains(window);
            if !keep {
                *bag_bytes -= chunks.iter().map(Bytes::len).sum::<usize>();
            }
            keep
        });
        if let Some(spill) = &mut self.bag_spill {
            spill.forget_windows(&gone)?;
        }
        self.ordered_lists
            .retain(|(_, _, window, _), _| !gone.contains(window));
        self.multimaps
            .retain(|(_, _, window, _), _| !gone.contains(window));
        self.windows.retain(|window, _| !gone.contains(window));
        Ok(())
    }

    /// Number of non-empty state cells (bags, ordered lists and multimaps),
    /// for tests and metrics.
    pub fn len(&self) -> usize {
        let only_on_disk = self.bag_spill.as_ref().map_or(0, |s| {
            s.cells().filter(|id| !self.bags.contains_key(*id)).count()
        });
        self.bags.len() + only_on_disk + self.ordered_lists.len() + self.multimaps.len()
    }

    /// Whether no state is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A bundle's tentative writes to one bag (or to one map key of a multimap).
#[derive(Debug, Default, Clone)]
pub struct BagWrite {
    /// The bag was cleared (before `appended`).
    pub cleared: bool,
    /// Chunks appended after the last clear.
    pub appended: Vec<Bytes>,
}

/// One change to an ordered list, kept in request order because a clear
/// only removes what was there before it.
#[derive(Debug, Clone)]
pub enum OrderedListOp {
    /// Remove every entry whose sort key is in the range.
    Clear(SortKeyRange),
    /// Add `(sort key, value)` entries, in append order.
    Append(Vec<(i64, Bytes)>),
}

/// A bundle's tentative writes to one ordered list.
#[derive(Debug, Default, Clone)]
pub struct OrderedListWrite {
    /// Clears and appends in the order the SDK sent them.
    pub ops: Vec<OrderedListOp>,
}

/// A bundle's tentative writes to one multimap.
#[derive(Debug, Default, Clone)]
pub struct MultimapWrite {
    /// Every map key was removed (before the writes in `keys`).
    pub cleared: bool,
    /// Per map key: removed (`cleared`) and/or values appended since.
    pub keys: BTreeMap<Bytes, BagWrite>,
}

/// All tentative user-state writes of one bundle, applied together by
/// [`UserStateStore::apply`] when the bundle succeeds.
#[derive(Debug, Default, Clone)]
pub struct UserStateWrites {
    /// Writes to bags.
    pub bags: HashMap<BagId, BagWrite>,
    /// Writes to ordered lists.
    pub ordered_lists: HashMap<CellId, OrderedListWrite>,
    /// Writes to multimaps.
    pub multimaps: HashMap<CellId, MultimapWrite>,
}

impl UserStateWrites {
    /// Whether the bundle wrote no user state.
    pub fn is_empty(&self) -> bool {
        self.bags.is_empty() && self.ordered_lists.is_empty() && self.multimaps.is_empty()
    }
}

/// Maximum bytes returned in one page of a state read (unless one unit —
/// a value chunk, entry or key — is larger on its own).
const PAGE_BYTES: usize = 4 << 20;

/// One bundle's view of state: reads see committed state plus the bundle's
/// own writes; writes stay here until [`BundleOverlay::take_writes`].
///
/// The overlay never holds its own lock and the store's at the same time,
/// so a read racing the engine's commit cannot deadlock.
pub struct BundleOverlay {
    side_inputs: Arc<Mutex<SideInputStore>>,
    user_state: Arc<Mutex<UserStateStore>>,
    writes: Mutex<UserStateWrites>,
    page_bytes: usize,
    /// Where handed-out iterables are read from: the spill store and the
    /// job's space in it (a token from elsewhere is refused).
    runner_iterables: Option<(Arc<dyn SpillStore>, Bytes)>,
}

impl BundleOverlay {
    /// A fresh overlay over the job's stores.
    pub fn new(
        side_inputs: Arc<Mutex<SideInputStore>>,
        user_state: Arc<Mutex<UserStateStore>>,
    ) -> Self {
        BundleOverlay {
            side_inputs,
            user_state,
            writes: Mutex::new(UserStateWrites::default()),
            page_bytes: PAGE_BYTES,
            runner_iterables: None,
        }
    }

    /// The same overlay, answering reads of iterables a GroupByKey handed
    /// out (`StateKey::RunnerIterable`) from `store`, for tokens under
    /// `job_space`.
    pub fn with_runner_iterables(mut self, store: Arc<dyn SpillStore>, job_space: Bytes) -> Self {
        self.runner_iterables = Some((store, job_space));
        self
    }

    /// The same overlay with a different page size (at least one unit is
    /// always returned per page), so tests can exercise paging cheaply.
    pub fn with_page_bytes(mut self, page_bytes: usize) -> Self {
        self.page_bytes = page_bytes;
        self
    }

    /// The bundle's writes, to be applied on commit.
    pub fn take_writes(&self) -> UserStateWrites {
        std::mem::take(&mut *self.writes.lock())
    }

    /// The page of bag `id` that starts at its chunk `start`: its chunks
    /// are those on disk, then those in memory, then the bundle's own
    /// appends (unless the bundle cleared it), and the continuation token
    /// is the next chunk's index — which a spill between two pages does
    /// not move (see `bag_spill`).
    fn bag_page(&self, id: &BagId, start: usize) -> Result<StatePage, StateError> {
        let write = self.writes.lock().bags.get(id).cloned();
        let cleared = write.as_ref().is_some_and(|w| w.cleared);
        let appended = write.map(|w| w.appended).unwrap_or_default();
        let state = self.user_state.lock();
        let (on_disk, in_memory): (usize, &[Bytes]) = if cleared {
            (0, &[])
        } else {
            (
                state.bag_spill.as_ref().map_or(0, |s| s.parts(id)),
                state.bags.get(id).map_or(&[], Vec::as_slice),
            )
        };
        let total = on_disk + in_memory.len() + appended.len();
        let mut data = Vec::new();
        let mut next = start;
        while next < total {
            let chunk = match &state.bag_spill {
                Some(spill) if next < on_disk => spill
                    .read_part(id, next)
                    .map_err(|e| StateError(e.to_string()))?,
                _ if next < on_disk + in_memory.len() => in_memory[next - on_disk].clone(),
                _ => appended[next - on_disk - in_memory.len()].clone(),
            };
            if !data.is_empty() && data.len() + chunk.len() > self.page_bytes {
                break;
            }
            data.extend_from_slice(&chunk);
            next += 1;
        }
        Ok(StatePage {
            data: Bytes::from(data),
            continuation: (next < total).then(|| Bytes::from(next.to_string())),
        })
    }

    /// Everything `key` currently holds, as whole units that a page may not
    /// split (value chunks, encoded entries, map keys).
    fn read_all(&self, key: &StateKey) -> Result<Vec<Bytes>, StateError> {
        let Some(user) = user_key(key) else {
            return self.side_inputs.lock().read(key);
        };
        match user {
            // Paged by `bag_page`, which reads only the chunks a page takes.
            UserKey::Bag(_) => Err(StateError("a bag is read a page at a time".into())),
            UserKey::OrderedList(id, range) => {
                let range = required_range(range, "get")?;
                let ops = self
                    .writes
                    .lock()
                    .ordered_lists
                    .get(&id)
                    .map(|w| w.ops.clone())
                    .unwrap_or_default();
                let mut view: OrderedList = if range.is_empty() {
                    OrderedList::new()
                } else {
                    self.user_state
                        .lock()
                        .ordered_lists
                        .get(&id)
                        .map(|list| {
                            list.range(range.start..range.end)
                                .map(|(k, v)| (*k, v.clone()))
                                .collect()
                        })
                        .unwrap_or_default()
                };
                for op in ops {
                    match op {
                        OrderedListOp::Clear(cleared) => remove_range(
                            &mut view,
                            SortKeyRange {
                                start: cleared.start.max(range.start),
                                end: cleared.end.min(range.end),
                            },
                        ),
                        OrderedListOp::Append(entries) => {
                            for (sort_key, value) in entries {
                                if range.contains(sort_key) {
                                    view.entry(sort_key).or_default().push(value);
                                }
                            }
                        }
                    }
                }
                let mut units = Vec::new();
                for (sort_key, values) in view {
                    for value in values {
                        let mut entry = Vec::with_capacity(value.len() + 20);
                        encode_ordered_entry(sort_key, &value, &mut entry);
                        units.push(Bytes::from(entry));
                    }
                }
                Ok(units)
            }
            UserKey::MultimapValues(id, map_key) => {
                let (multimap_cleared, write) = {
                    let writes = self.writes.lock();
                    let w = writes.multimaps.get(&id);
                    (
                        w.is_some_and(|w| w.cleared),
                        w.and_then(|w| w.keys.get(map_key)).cloned(),
                    )
                };
                let mut chunks = if multimap_cleared || write.as_ref().is_some_and(|w| w.cleared) {
                    Vec::new()
                } else {
                    self.user_state
                        .lock()
                        .multimaps
                        .get(&id)
                        .and_then(|m| m.get(map_key))
                        .cloned()
                        .unwrap_or_default()
                };
                if let Some(w) = write {
                    chunks.extend(w.appended);
                }
                Ok(chunks)
            }
            UserKey::MultimapKeys(id) => {
                Ok(self.multimap_view(&id).into_keys().collect::<Vec<Bytes>>())
            }
            UserKey::MultimapEntries(id) => {
                let coder = self
                    .user_state
                    .lock()
                    .multimap_value_coders
                    .get(&(id.0.clone(), id.1.clone()))
                    .cloned()
                    .ok_or_else(|| {
                        StateError(format!(
                            "multimap entries of state '{}' of transform '{}' are not available: \
                             the runner does not know the state's value coder, so it cannot \
                             count values",
                            id.1, id.0
                        ))
                    })?;
                let mut units = Vec::new();
                for (map_key, chunks) in self.multimap_view(&id) {
                    let mut count = 0usize;
                    for chunk in &chunks {
                        count += count_values(&coder, chunk).map_err(|detail| {
                            StateError(format!(
                                "multimap entries of state '{}' of transform '{}': {detail}",
                                id.1, id.0
                            ))
                        })?;
                    }
                    let count = i32::try_from(count).map_err(|_| {
                        StateError(format!(
                            "multimap entries of state '{}' of transform '{}': a map key has \
                             {count} values, more than an iterable can carry",
                            id.1, id.0
                        ))
                    })?;
                    let len = map_key.len() + 4 + chunks.iter().map(Bytes::len).sum::<usize>();
                    let mut entry = Vec::with_capacity(len);
                    entry.extend_from_slice(&map_key);
                    entry.extend_from_slice(&count.to_be_bytes());
                    for chunk in &chunks {
                        entry.extend_from_slice(chunk);
                    }
                    units.push(Bytes::from(entry));
                }
                Ok(units)
            }
        }
    }

    /// A multimap as this bundle sees it: present map keys (bytewise order)
    /// with their value chunks.
    fn multimap_view(&self, id: &CellId) -> Multimap {
        let write = self.writes.lock().multimaps.get(id).cloned();
        let mut view = if write.as_ref().is_some_and(|w| w.cleared) {
            Multimap::new()
        } else {
            self.user_state
                .lock()
                .multimaps
                .get(id)
                .cloned()
                .unwrap_or_default()
        };
        if let Some(w) = write {
            for (map_key, kw) in w.keys {
                if kw.cleared {
                    view.remove(&map_key);
                }
                if !kw.appended.is_empty() {
                    view.entry(map_key).or_default().extend(kw.appended);
                }
            }
        }
        view
    }
}

/// How many nested values of `coder` a chunk of concatenated values holds.
fn count_values(coder: &Coder, chunk: &[u8]) -> Result<usize, String> {
    let mut pos = 0usize;
    let mut count = 0usize;
    while pos < chunk.len() {
        let len = coder
            .nested_len(&chunk[pos..])
            .map_err(|e| format!("values do not decode with the value coder: {e}"))?;
        if len == 0 {
            return Err("the value coder writes zero-byte values, which cannot be counted".into());
        }
        pos += len;
        count += 1;
    }
    Ok(count)
}

fn read_only(key: &StateKey) -> StateError {
    match key {
        StateKey::MultimapKeysUserState { .. } => {
            StateError("multimap keys user state supports only get and clear".into())
        }
        StateKey::MultimapEntriesUserState { .. } => {
            StateError("multimap entries user state supports only get and clear".into())
        }
        StateKey::RunnerIterable { .. } => {
            StateError("a state-backed iterable the runner handed out is read-only".into())
        }
        _ => StateError("side inputs are read-only".into()),
    }
}

impl BundleState for BundleOverlay {
    fn get(&self, key: &StateKey, continuation: Option<&[u8]>) -> Result<StatePage, StateError> {
        // (Its continuation token is its own: a store key.)
        if let StateKey::RunnerIterable { token } = key {
            let Some((store, job_space)) = &self.runner_iterables else {
                return Err(StateError(
                    "no state-backed iterable was handed out to this bundle".into(),
                ));
            };
            let page =
                crate::grouping::read_iterable_page(store.as_ref(), job_space, token, continuation)
                    .map_err(|e| StateError(e.to_string()))?;
            return Ok(StatePage {
                data: page.data,
                continuation: page.continuation,
            });
        }
        let start = match continuation {
            None => 0,
            Some(token) => std::str::from_utf8(token)
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
                .ok_or_else(|| StateError("invalid continuation token".into()))?,
        };
        if let Some(UserKey::Bag(id)) = user_key(key) {
            return self.bag_page(&id, start);
        }
        let units = self.read_all(key)?;
        let mut data = Vec::new();
        let mut next = start;
        while next < units.len() {
            if !data.is_empty() && data.len() + units[next].len() > self.page_bytes {
                break;
            }
            data.extend_from_slice(&units[next]);
            next += 1;
        }
        Ok(StatePage {
            data: Bytes::from(data),
            continuation: (next < units.len()).then(|| Bytes::from(next.to_string())),
        })
    }

    fn append(&self, key: &StateKey, data: Bytes) -> Result<(), StateError> {
        match user_key(key) {
            Some(UserKey::Bag(id)) => {
                self.writes
                    .lock()
                    .bags
                    .entry(id)
                    .or_default()
                    .appended
                    .push(data);
            }
            Some(UserKey::OrderedList(id, _)) => {
                // Parse before touching the overlay: a malformed append
                // changes nothing.
                let entries = decode_ordered_entries(&data)?;
                if entries.is_empty() {
                    return Ok(());
                }
                let mut writes = self.writes.lock();
                let ops = &mut writes.ordered_lists.entry(id).or_default().ops;
                match ops.last_mut() {
                    Some(OrderedListOp::Append(prev)) => prev.extend(entries),
                    _ => ops.push(OrderedListOp::Append(entries)),
                }
            }
            Some(UserKey::MultimapValues(id, map_key)) => {
                self.writes
                    .lock()
                    .multimaps
                    .entry(id)
                    .or_default()
                    .keys
                    .entry(map_key.clone())
                    .or_default()
                    .appended
                    .push(data);
            }
            Some(UserKey::MultimapKeys(_) | UserKey::MultimapEntries(_)) | None => {
                return Err(read_only(key))
            }
        }
        Ok(())
    }

    fn clear(&self, key: &StateKey) -> Result<(), StateError> {
        match user_key(key) {
            Some(UserKey::Bag(id)) => {
                let mut writes = self.writes.lock();
                let w = writes.bags.entry(id).or_default();
                w.cleared = true;
                w.appended.clear();
            }
            Some(UserKey::OrderedList(id, range)) => {
                let range = required_range(range, "clear")?;
                if range.is_empty() {
                    return Ok(());
                }
                self.writes
                    .lock()
                    .ordered_lists
                    .entry(id)
                    .or_default()
                    .ops
                    .push(OrderedListOp::Clear(range));
            }
            Some(UserKey::MultimapValues(id, map_key)) => {
                self.writes
                    .lock()
                    .multimaps
                    .entry(id)
                    .or_default()
                    .keys
                    .insert(
                        map_key.clone(),
                        BagWrite {
                            cleared: true,
                            appended: Vec::new(),
                        },
                    );
            }
            Some(UserKey::MultimapKeys(id) | UserKey::MultimapEntries(id)) => {
                let mut writes = self.writes.lock();
                let w = writes.multimaps.entry(id).or_default();
                w.cleared = true;
                w.keys.clear();
            }
            None => return Err(read_only(key)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bag(key: &str) -> StateKey {
        StateKey::BagUserState {
            transform_id: "t".into(),
            state_id: "s".into(),
            window: Bytes::new(),
            key: Bytes::copy_from_slice(key.as_bytes()),
        }
    }

    fn ordered(range: Option<(i64, i64)>) -> StateKey {
        StateKey::OrderedListUserState {
            transform_id: "t".into(),
            state_id: "ol".into(),
            window: Bytes::from_static(b"w"),
            key: Bytes::from_static(b"k"),
            range: range.map(|(start, end)| SortKeyRange { start, end }),
        }
    }

    fn all() -> StateKey {
        ordered(Some((i64::MIN, i64::MAX)))
    }

    fn mm_values(map_key: &str) -> StateKey {
        StateKey::MultimapUserState {
            transform_id: "t".into(),
            state_id: "mm".into(),
            window: Bytes::from_static(b"w"),
            key: Bytes::from_static(b"k"),
            map_key: nested(map_key),
        }
    }

    fn mm_keys() -> StateKey {
        StateKey::MultimapKeysUserState {
            transform_id: "t".into(),
            state_id: "mm".into(),
            window: Bytes::from_static(b"w"),
            key: Bytes::from_static(b"k"),
        }
    }

    fn mm_entries() -> StateKey {
        StateKey::MultimapEntriesUserState {
            transform_id: "t".into(),
            state_id: "mm".into(),
            window: Bytes::from_static(b"w"),
            key: Bytes::from_static(b"k"),
        }
    }

    /// A string as Beam's string coder nests it: varint length, bytes.
    fn nested(s: &str) -> Bytes {
        let mut out = vec![s.len() as u8];
        out.extend_from_slice(s.as_bytes());
        Bytes::from(out)
    }

    fn nested_all(values: &[&str]) -> Bytes {
        Bytes::from(
            values
                .iter()
                .flat_map(|v| nested(v).to_vec())
                .collect::<Vec<u8>>(),
        )
    }

    fn entries(items: &[(i64, &str)]) -> Bytes {
        let mut out = Vec::new();
        for (k, v) in items {
            encode_ordered_entry(*k, v.as_bytes(), &mut out);
        }
        Bytes::from(out)
    }

    fn stores() -> (Arc<Mutex<SideInputStore>>, Arc<Mutex<UserStateStore>>) {
        (Arc::default(), Arc::default())
    }

    fn read(o: &BundleOverlay, key: &StateKey) -> Vec<u8> {
        let mut out = Vec::new();
        let mut token: Option<Bytes> = None;
        loop {
            let page = o.get(key, token.as_deref()).unwrap();
            out.extend_from_slice(&page.data);
            match page.continuation {
                Some(t) => token = Some(t),
                None => return out,
            }
        }
    }

    fn read_ordered(o: &BundleOverlay, key: &StateKey) -> Vec<(i64, String)> {
        decode_ordered_entries(&Bytes::from(read(o, key)))
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8(v.to_vec()).unwrap()))
            .collect()
    }

    fn owned(items: &[(i64, &str)]) -> Vec<(i64, String)> {
        items.iter().map(|(k, v)| (*k, v.to_string())).collect()
    }

    #[test]
    fn overlay_reads_its_own_writes_and_commits_only_when_applied() {
        let (si, us) = stores();
        let o = BundleOverlay::new(si.clone(), us.clone());
        o.append(&bag("k"), Bytes::from_static(b"\x01a")).unwrap();
        assert_eq!(&o.get(&bag("k"), None).unwrap().data[..], b"\x01a");
        assert!(us.lock().is_empty());
        us.lock().apply(o.take_writes()).unwrap();
        let o2 = BundleOverlay::new(si.clone(), us.clone());
        o2.clear(&bag("k")).unwrap();
        o2.append(&bag("k"), Bytes::from_static(b"\x01b")).unwrap();
        assert_eq!(&o2.get(&bag("k"), None).unwrap().data[..], b"\x01b");
        // A failed bundle's overlay is dropped: committed state is unchanged.
        drop(o2);
        let o3 = BundleOverlay::new(si, us);
        assert_eq!(&o3.get(&bag("k"), None).unwrap().data[..], b"\x01a");
    }

    #[test]
    fn side_inputs_must_be_ready() {
        let si = Arc::new(Mutex::new(SideInputStore::default()));
        si.lock()
            .add_iterable("t", "s", Bytes::new(), Bytes::from_static(b"\x01"));
        let o = BundleOverlay::new(si.clone(), Arc::default());
        let key = StateKey::IterableSideInput {
            transform_id: "t".into(),
            side_input_id: "s".into(),
            window: Bytes::new(),
        };
        assert!(o.get(&key, None).is_err());
        si.lock().mark_ready("t", "s");
        assert_eq!(&o.get(&key, None).unwrap().data[..], b"\x01");
        assert!(o.append(&key, Bytes::new()).is_err());
        assert!(o.clear(&key).is_err());
    }

    #[test]
    fn ordered_list_sorts_stably_reads_its_writes_and_commits_on_apply() {
        let (si, us) = stores();
        let o = BundleOverlay::new(si.clone(), us.clone());
        o.append(
            &ordered(None),
            entries(&[(5, "a"), (-3, "neg"), (5, "b"), (1, "one")]),
        )
        .unwrap();
        o.append(&ordered(None), entries(&[(5, "c"), (i64::MIN, "min")]))
            .unwrap();
        let expected = owned(&[
            (i64::MIN, "min"),
            (-3, "neg"),
            (1, "one"),
            (5, "a"),
            (5, "b"),
            (5, "c"),
        ]);
        assert_eq!(read_ordered(&o, &all()), expected);
        assert!(us.lock().is_empty(), "nothing is committed before apply");
        us.lock().apply(o.take_writes()).unwrap();
        assert_eq!(us.lock().len(), 1);

        // Committed entries come before a later bundle's equal sort keys.
        let o2 = BundleOverlay::new(si.clone(), us.clone());
        o2.append(&ordered(None), entries(&[(5, "d"), (0, "zero")]))
            .unwrap();
        assert_eq!(
            read_ordered(&o2, &ordered(Some((0, 6)))),
            owned(&[
                (0, "zero"),
                (1, "one"),
                (5, "a"),
                (5, "b"),
                (5, "c"),
                (5, "d")
            ])
        );
        drop(o2); // failed bundle
        let o3 = BundleOverlay::new(si, us);
        assert_eq!(read_ordered(&o3, &all()), expected);
    }

    #[test]
    fn ordered_list_ranges_and_clears_follow_request_order() {
        let (si, us) = stores();
        let o = BundleOverlay::new(si.clone(), us.clone());
        o.append(
            &ordered(None),
            entries(&[(1, "a"), (2, "b"), (3, "c"), (4, "d"), (10, "e")]),
        )
        .unwrap();
        us.lock().apply(o.take_writes()).unwrap();

        let o = BundleOverlay::new(si.clone(), us.clone());
        assert_eq!(
            read_ordered(&o, &ordered(Some((2, 4)))),
            owned(&[(2, "b"), (3, "c")])
        );
        assert!(read_ordered(&o, &ordered(Some((4, 4)))).is_empty());
        assert!(read_ordered(&o, &ordered(Some((9, 2)))).is_empty());
        // Clear [2, 4), then re-add 3: the re-added entry survives the clear.
        o.clear(&ordered(Some((2, 4)))).unwrap();
        o.append(&ordered(None), entries(&[(3, "c2"), (2, "b2")]))
            .unwrap();
        o.clear(&ordered(Some((2, 3)))).unwrap();
        // An empty or inverted range clears nothing.
        o.clear(&ordered(Some((10, 10)))).unwrap();
        o.clear(&ordered(Some((11, 0)))).unwrap();
        let expected = owned(&[(1, "a"), (3, "c2"), (4, "d"), (10, "e")]);
        assert_eq!(read_ordered(&o, &all()), expected);
        assert_eq!(
            read_ordered(&o, &ordered(Some((3, 5)))),
            owned(&[(3, "c2"), (4, "d")])
        );
        us.lock().apply(o.take_writes()).unwrap();
        let o = BundleOverlay::new(si.clone(), us.clone());
        assert_eq!(read_ordered(&o, &all()), expected);

        // A full clear empties the list, and the store drops it on commit.
        o.clear(&all()).unwrap();
        assert!(read_ordered(&o, &all()).is_empty());
        us.lock().apply(o.take_writes()).unwrap();
        assert!(us.lock().is_empty());
    }

    #[test]
    fn ordered_list_pages_never_split_an_entry() {
        let (si, us) = stores();
        let items: Vec<(i64, String)> = (0..50)
            .map(|i| ((i * 7919) % 101 - 50, format!("value-{i}")))
            .collect();
        let o = BundleOverlay::new(si, us).with_page_bytes(40);
        let refs: Vec<(i64, &str)> = items.iter().map(|(k, v)| (*k, v.as_str())).collect();
        o.append(&ordered(None), entries(&refs)).unwrap();
        let mut pages = 0;
        let mut got = Vec::new();
        let mut token: Option<Bytes> = None;
        loop {
            let page = o.get(&all(), token.as_deref()).unwrap();
            assert!(page.data.len() <= 40, "page of {} bytes", page.data.len());
            // Every page decodes on its own, as the SDK decodes it.
            got.extend(decode_ordered_entries(&page.data).unwrap());
            pages += 1;
            match page.continuation {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        assert!(pages > 10);
        let mut expected = items.clone();
        expected.sort_by_key(|(k, _)| *k); // stable, like the store
        let got: Vec<(i64, String)> = got
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8(v.to_vec()).unwrap()))
            .collect();
        assert_eq!(got, expected);
        // A token past the end (the state shrank) reads as the end.
        let past = o.get(&all(), Some(b"999")).unwrap();
        assert!(past.data.is_empty() && past.continuation.is_none());
        assert!(o.get(&all(), Some(b"x")).is_err());
    }

    #[test]
    fn malformed_ordered_list_requests_are_errors_and_write_nothing() {
        let (si, us) = stores();
        let o = BundleOverlay::new(si, us);
        o.append(&ordered(None), entries(&[(1, "a")])).unwrap();
        // The second entry claims more bytes than there are.
        let mut bad = entries(&[(2, "b")]).to_vec();
        bad.extend_from_slice(&[0x03, 0x09, b'x']);
        let err = o.append(&ordered(None), Bytes::from(bad)).unwrap_err();
        assert!(err.0.contains("malformed ordered list entry"), "{err}");
        assert_eq!(read_ordered(&o, &all()), owned(&[(1, "a")]));
        // Gets and clears must carry a range.
        assert!(o.get(&ordered(None), None).unwrap_err().0.contains("range"));
        assert!(o.clear(&ordered(None)).unwrap_err().0.contains("range"));
        // An empty append is a no-op.
        o.append(&ordered(None), Bytes::new()).unwrap();
        assert_eq!(o.take_writes().ordered_lists.len(), 1);
    }

    #[test]
    fn multimap_values_keys_and_clears() {
        let (si, us) = stores();
        let o = BundleOverlay::new(si.clone(), us.clone());
        o.append(&mm_values("b"), nested_all(&["1", "2"])).unwrap();
        o.append(&mm_values("a"), nested_all(&["x"])).unwrap();
        o.append(&mm_values("b"), nested_all(&["3"])).unwrap();
        // A zero-byte value (Java's Void) still makes its key present.
        o.append(&mm_values("v"), Bytes::new()).unwrap();
        assert_eq!(read(&o, &mm_values("b")), nested_all(&["1", "2", "3"]));
        assert!(read(&o, &mm_values("zzz")).is_empty());
        assert_eq!(read(&o, &mm_keys()), nested_all(&["a", "b", "v"]));
        assert!(us.lock().is_empty());
        us.lock().apply(o.take_writes()).unwrap();
        assert_eq!(us.lock().len(), 1);

        let o = BundleOverlay::new(si.clone(), us.clone());
        assert_eq!(read(&o, &mm_values("b")), nested_all(&["1", "2", "3"]));
        o.clear(&mm_values("b")).unwrap();
        assert!(read(&o, &mm_values("b")).is_empty());
        assert_eq!(read(&o, &mm_keys()), nested_all(&["a", "v"]));
        o.append(&mm_values("b"), nested_all(&["4"])).unwrap();
        assert_eq!(read(&o, &mm_values("b")), nested_all(&["4"]));
        assert_eq!(read(&o, &mm_keys()), nested_all(&["a", "b", "v"]));
        drop(o); // failed bundle: nothing changes
        let o = BundleOverlay::new(si.clone(), us.clone());
        assert_eq!(read(&o, &mm_values("b")), nested_all(&["1", "2", "3"]));

        // Clearing the keys removes every map key; later appends survive.
        o.clear(&mm_keys()).unwrap();
        assert!(read(&o, &mm_keys()).is_empty());
        assert!(read(&o, &mm_values("a")).is_empty());
        o.append(&mm_values("c"), nested_all(&["5"])).unwrap();
        assert_eq!(read(&o, &mm_keys()), nested_all(&["c"]));
        us.lock().apply(o.take_writes()).unwrap();
        let o = BundleOverlay::new(si.clone(), us.clone());
        assert_eq!(read(&o, &mm_keys()), nested_all(&["c"]));
        assert_eq!(read(&o, &mm_values("c")), nested_all(&["5"]));
        o.clear(&mm_values("c")).unwrap();
        us.lock().apply(o.take_writes()).unwrap();
        assert!(us.lock().is_empty());

        // Keys and entries are get/clear only.
        let o = BundleOverlay::new(si, us);
        assert!(o.append(&mm_keys(), Bytes::new()).is_err());
        assert!(o.append(&mm_entries(), Bytes::new()).is_err());
    }

    #[test]
    fn multimap_entries_are_kv_of_key_and_iterable_of_values() {
        let (si, us) = stores();
        let o = BundleOverlay::new(si.clone(), us.clone());
        o.append(&mm_values("a"), nested_all(&["1", "22"])).unwrap();
        o.append(&mm_values("b"), nested_all(&["333"])).unwrap();
        // Without the value coder the runner cannot count values.
        let err = o.get(&mm_entries(), None).unwrap_err();
        assert!(err.0.contains("value coder"), "{err}");
        us.lock()
            .set_multimap_value_coder("t", "mm", Coder::StringUtf8);
        o.append(&mm_values("a"), nested_all(&["4444"])).unwrap();
        let mut expected = nested("a").to_vec();
        expected.extend_from_slice(&3i32.to_be_bytes());
        expected.extend_from_slice(&nested_all(&["1", "22", "4444"]));
        expected.extend_from_slice(&nested("b"));
        expected.extend_from_slice(&1i32.to_be_bytes());
        expected.extend_from_slice(&nested_all(&["333"]));
        assert_eq!(read(&o, &mm_entries()), expected);

        // Clearing through the entries key clears the whole multimap.
        o.clear(&mm_entries()).unwrap();
        assert!(read(&o, &mm_entries()).is_empty());
        drop(o);

        // Values that do not walk with the coder are an error, not a panic.
        let o = BundleOverlay::new(si, us);
        o.append(&mm_values("a"), Bytes::from_static(b"\x05ab"))
            .unwrap();
        let err = o.get(&mm_entries(), None).unwrap_err();
        assert!(err.0.contains("do not decode"), "{err}");
    }

    #[test]
    fn retain_windows_drops_every_kind_of_state() {
        let (si, us) = stores();
        let o = BundleOverlay::new(si.clone(), us.clone());
        let in_window = |w: &'static [u8]| {
            [
                StateKey::BagUserState {
                    transform_id: "t".into(),
                    state_id: "s".into(),
                    window: Bytes::from_static(w),
                    key: Bytes::new(),
                },
                StateKey::OrderedListUserState {
                    transform_id: "t".into(),
                    state_id: "ol".into(),
                    window: Bytes::from_static(w),
                    key: Bytes::new(),
                    range: None,
                },
                StateKey::MultimapUserState {
                    transform_id: "t".into(),
                    state_id: "mm".into(),
                    window: Bytes::from_static(w),
                    key: Bytes::new(),
                    map_key: nested("m"),
                },
            ]
        };
        for w in [&b"old"[..], &b"new"[..]] {
            let [b, l, m] = in_window(w);
            o.append(&b, nested("x")).unwrap();
            o.append(&l, entries(&[(1, "x")])).unwrap();
            o.append(&m, nested("x")).unwrap();
        }
        us.lock().apply(o.take_writes()).unwrap();
        assert_eq!(us.lock().len(), 6);
        us.lock().retain_windows(|w| &w[..] != b"old").unwrap();
        assert_eq!(us.lock().len(), 3);
        us.lock().retain_windows(|_| false).unwrap();
        assert!(us.lock().is_empty());
    }

    /// Expiry asks about each window that has state, once, and only those:
    /// a window whose cells were all cleared is not asked about, nor after
    /// a checkpoint's restore.
    #[test]
    fn expiry_asks_only_about_windows_that_have_state() {
        let (si, us) = stores();
        let bag = |w: &'static [u8], key: &'static str| StateKey::BagUserState {
            transform_id: "t".into(),
            state_id: "s".into(),
            window: Bytes::from_static(w),
            key: nested(key),
        };
        let o = BundleOverlay::new(si.clone(), us.clone());
        for (w, key) in [(&b"a"[..], "k"), (b"a", "j"), (b"b", "k"), (b"b", "j")] {
            o.append(&bag(w, key), nested("x")).unwrap();
        }
        us.lock().apply(o.take_writes()).unwrap();
        let o = BundleOverlay::new(si.clone(), us.clone());
        o.clear(&bag(b"a", "k")).unwrap();
        o.clear(&bag(b"a", "j")).unwrap();
        us.lock().apply(o.take_writes()).unwrap();
        let asked = |us: &Mutex<UserStateStore>| {
            let mut asked = Vec::new();
            us.lock()
                .retain_windows(|w| {
                    asked.push(w.clone());
                    true
                })
                .unwrap();
            asked
        };
        assert_eq!(asked(&us), [Bytes::from_static(b"b")]);
        let snapshot = us.lock().snapshot().unwrap();
        let restored = Mutex::new(UserStateStore::default());
        restored.lock().restore(snapshot, None).unwrap();
        assert_eq!(asked(&restored), [Bytes::from_static(b"b")]);
        us.lock().retain_windows(|w| &w[..] != b"b").unwrap();
        assert!(us.lock().is_empty());
        assert!(asked(&us).is_empty());
    }
}
