//! Committed user state of one stage — bags, ordered lists and
//! multimaps — by cell (transform, state id, window, key), the writes a
//! bundle makes to it, and what a checkpoint keeps of it. Bags past the
//! stage's share of memory spill (`bag_spill`).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::bag_spill::{BagSpill, SpilledBags};
use crate::coder::Coder;
use crate::plan::TransformId;
use crate::spill::{SpillError, SpillSpace};
use crate::state::{CellId, SortKeyRange, StateError, StateKey};

/// Committed ordered list: values by sort key, equal keys in append order.
pub(super) type OrderedList = BTreeMap<i64, Vec<Bytes>>;

/// Committed multimap: appended value chunks by map key. A map key is
/// present while it has at least one chunk, even an empty one (Java's
/// `SetState` stores `Void` values, which encode to nothing).
pub(super) type Multimap = BTreeMap<Bytes, Vec<Bytes>>;

/// The kind of user state a [`StateKey`] addresses, with its cell.
pub(super) enum UserKey<'a> {
    Bag(CellId),
    OrderedList(CellId, Option<SortKeyRange>),
    MultimapValues(CellId, &'a Bytes),
    MultimapKeys(CellId),
    MultimapEntries(CellId),
}

/// `None` for side-input keys.
pub(super) fn user_key(key: &StateKey) -> Option<UserKey<'_>> {
    Some(match key {
        StateKey::BagUserState(cell) => UserKey::Bag(cell.clone()),
        StateKey::OrderedListUserState { cell, range } => {
            UserKey::OrderedList(cell.clone(), *range)
        }
        StateKey::MultimapUserState { cell, map_key } => {
            UserKey::MultimapValues(cell.clone(), map_key)
        }
        StateKey::MultimapKeysUserState(cell) => UserKey::MultimapKeys(cell.clone()),
        StateKey::MultimapEntriesUserState(cell) => UserKey::MultimapEntries(cell.clone()),
        StateKey::IterableSideInput { .. }
        | StateKey::MultimapSideInput { .. }
        | StateKey::MultimapKeysSideInput { .. }
        | StateKey::RunnerIterable { .. } => return None,
    })
}

/// Gets and clears of an ordered list must say which sort keys they cover.
pub(super) fn required_range(
    range: Option<SortKeyRange>,
    op: &str,
) -> Result<SortKeyRange, StateError> {
    range.ok_or_else(|| {
        StateError(format!(
            "ordered list user state {op} without a sort key range (the range is required \
             for gets and clears)"
        ))
    })
}

/// Removes every sort key in `range` from `list`.
pub(super) fn remove_range(list: &mut OrderedList, range: SortKeyRange) {
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

/// What a checkpoint keeps of a [`UserStateTable`], in a stable order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct UserStateSnapshot {
    bags: Vec<(CellId, Vec<Bytes>)>,
    ordered_lists: Vec<(CellId, OrderedList)>,
    multimaps: Vec<(CellId, Multimap)>,
}

impl UserStateSnapshot {
    /// Whether the checkpoint kept no cell.
    pub(crate) fn is_empty(&self) -> bool {
        self.bags.is_empty() && self.ordered_lists.is_empty() && self.multimaps.is_empty()
    }

    /// Adds the cells of `other` that `keep` accepts (for moving key
    /// groups between shards: each cell is one key's, on one shard), in
    /// the checkpoint's order.
    pub(crate) fn absorb_where(
        &mut self,
        other: UserStateSnapshot,
        keep: impl Fn(&CellId) -> bool,
    ) {
        fn absorb<V>(
            mine: &mut Vec<(CellId, V)>,
            theirs: Vec<(CellId, V)>,
            keep: &impl Fn(&CellId) -> bool,
        ) {
            mine.extend(theirs.into_iter().filter(|(cell, _)| keep(cell)));
            mine.sort_by(|a, b| a.0.cmp(&b.0));
        }
        absorb(&mut self.bags, other.bags, &keep);
        absorb(&mut self.ordered_lists, other.ordered_lists, &keep);
        absorb(&mut self.multimaps, other.multimaps, &keep);
    }

    /// Moves every cell to the id `rename` gives its transform (see
    /// [`crate::timers::TimerStore::rename_transforms`]); fails with the
    /// first transform that has a cell and no new id.
    pub(crate) fn rename_transforms(
        &mut self,
        rename: impl Fn(&TransformId) -> Option<TransformId>,
    ) -> Result<(), TransformId> {
        fn renamed<V>(
            cells: &mut [(CellId, V)],
            rename: &impl Fn(&TransformId) -> Option<TransformId>,
        ) -> Result<(), TransformId> {
            for (cell, _) in cells.iter_mut() {
                cell.transform_id =
                    rename(&cell.transform_id).ok_or_else(|| cell.transform_id.clone())?;
            }
            cells.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(())
        }
        renamed(&mut self.bags, &rename)?;
        renamed(&mut self.ordered_lists, &rename)?;
        renamed(&mut self.multimaps, &rename)
    }
}

impl UserStateTable {
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
    /// as [`Self::snapshot`], except that bags on a durable spill space are named,
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
    /// with `spilled`, the bags it named on the durable spill space — and spills
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
        for cell in cells {
            *self.windows.entry(cell.window.clone()).or_default() += 1;
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
pub struct UserStateTable {
    /// Bags' chunks in memory (after their parts on disk, if any).
    pub(super) bags: HashMap<CellId, Vec<Bytes>>,
    /// Bytes of those chunks.
    pub(super) bag_bytes: usize,
    /// Where bags go past the stage's share of memory, if anywhere.
    pub(super) bag_spill: Option<BagSpill>,
    pub(super) ordered_lists: HashMap<CellId, OrderedList>,
    pub(super) multimaps: HashMap<CellId, Multimap>,
    /// How many cells (of any kind) each encoded window has: expiring
    /// windows is asked about at every watermark advance, and must not
    /// walk every cell to find that none expired.
    pub(super) windows: HashMap<Bytes, usize>,
    /// (transform id, state id) -> the multimap's value coder, needed only to
    /// count values when serving multimap entries.
    pub(super) multimap_value_coders: HashMap<(String, String), Coder>,
}

impl UserStateTable {
    /// Lets the stage's bags spill to `store` under `prefix` once their
    /// values in memory pass `limit` bytes (see `bag_spill`).
    pub fn enable_bag_spill(&mut self, store: Arc<dyn SpillSpace>, prefix: Vec<u8>, limit: usize) {
        self.bag_spill = Some(BagSpill::scratch(store, prefix, limit));
    }

    /// Lets the stage's bags spill to durable `store` under `prefix` once
    /// their values in memory pass `limit` bytes: checkpoints name what is
    /// there instead of copying it, so state on disk does not hold periodic
    /// checkpoints back (see `bag_spill`).
    pub fn enable_durable_bag_spill(
        &mut self,
        store: Arc<dyn SpillSpace>,
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

    pub(super) fn bag_on_disk(&self, id: &CellId) -> bool {
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
            count_cell(&mut self.windows, &id.window, existed, exists);
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
            count_cell(&mut self.windows, &id.window, existed, exists);
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
            count_cell(&mut self.windows, &id.window, existed, exists);
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
        self.bags.retain(|cell, chunks| {
            let keep = !gone.contains(&cell.window);
            if !keep {
                *bag_bytes -= chunks.iter().map(Bytes::len).sum::<usize>();
            }
            keep
        });
        if let Some(spill) = &mut self.bag_spill {
            spill.forget_windows(&gone)?;
        }
        self.ordered_lists
            .retain(|cell, _| !gone.contains(&cell.window));
        self.multimaps
            .retain(|cell, _| !gone.contains(&cell.window));
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
/// [`UserStateTable::apply`] when the bundle succeeds.
#[derive(Debug, Default, Clone)]
pub struct UserStateWrites {
    /// Writes to bags.
    pub bags: HashMap<CellId, BagWrite>,
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

    /// The writes to `map_key` of multimap `id` (made empty if new).
    pub(super) fn multimap_key(&mut self, id: CellId, map_key: &Bytes) -> &mut BagWrite {
        self.multimaps
            .entry(id)
            .or_default()
            .keys
            .entry(map_key.clone())
            .or_default()
    }
}
