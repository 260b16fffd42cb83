//! One bundle's view of state ([`BundleOverlay`]): reads see the
//! committed stores plus the bundle's own writes, and the writes stay here
//! until the engine applies them after the bundle succeeded.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::side_inputs::SideInputTable;
use super::user_state::{
    remove_range, required_range, user_key, BagWrite, Multimap, OrderedList, OrderedListOp,
    UserKey, UserStateTable, UserStateWrites,
};
use crate::coder::Coder;
use crate::spill::SpillSpace;
use crate::state::{
    decode_ordered_entries, encode_ordered_entry, BundleState, CellId, SortKeyRange, StateError,
    StateKey, StatePage,
};

/// Maximum bytes returned in one page of a state read (unless one unit —
/// a value chunk, entry or key — is larger on its own).
pub(super) const PAGE_BYTES: usize = 4 << 20;

/// One bundle's view of state: reads see committed state plus the bundle's
/// own writes; writes stay here until [`BundleOverlay::take_writes`].
///
/// The overlay never holds its own lock and the store's at the same time,
/// so a read racing the engine's commit cannot deadlock.
pub struct BundleOverlay {
    side_inputs: Arc<Mutex<SideInputTable>>,
    user_state: Arc<Mutex<UserStateTable>>,
    writes: Mutex<UserStateWrites>,
    page_bytes: usize,
    /// Where handed-out iterables are read from: the spill space and the
    /// job's space in it (a token from elsewhere is refused).
    runner_iterables: Option<(Arc<dyn SpillSpace>, Bytes)>,
}

impl BundleOverlay {
    /// A fresh overlay over the job's stores.
    pub fn new(
        side_inputs: Arc<Mutex<SideInputTable>>,
        user_state: Arc<Mutex<UserStateTable>>,
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
    pub fn with_runner_iterables(mut self, store: Arc<dyn SpillSpace>, job_space: Bytes) -> Self {
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
    fn bag_page(&self, id: &CellId, start: usize) -> Result<StatePage, StateError> {
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
            UserKey::OrderedList(id, range) => self.read_ordered_list(&id, range),
            UserKey::MultimapValues(id, map_key) => Ok(self.read_multimap_values(&id, map_key)),
            UserKey::MultimapKeys(id) => {
                Ok(self.multimap_view(&id).into_keys().collect::<Vec<Bytes>>())
            }
            UserKey::MultimapEntries(id) => self.read_multimap_entries(&id),
        }
    }

    /// An ordered list's entries in `range` (which a get must give), as
    /// the committed list overlaid with this bundle's clears and appends.
    fn read_ordered_list(
        &self,
        id: &CellId,
        range: Option<SortKeyRange>,
    ) -> Result<Vec<Bytes>, StateError> {
        let range = required_range(range, "get")?;
        let ops = self
            .writes
            .lock()
            .ordered_lists
            .get(id)
            .map(|w| w.ops.clone())
            .unwrap_or_default();
        let mut view: OrderedList = if range.is_empty() {
            OrderedList::new()
        } else {
            self.user_state
                .lock()
                .ordered_lists
                .get(id)
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

    /// The values of one map key of a multimap: committed ones unless
    /// this bundle cleared the key or the whole multimap, then its appends.
    fn read_multimap_values(&self, id: &CellId, map_key: &Bytes) -> Vec<Bytes> {
        let (multimap_cleared, write) = {
            let writes = self.writes.lock();
            let w = writes.multimaps.get(id);
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
                .get(id)
                .and_then(|m| m.get(map_key))
                .cloned()
                .unwrap_or_default()
        };
        if let Some(w) = write {
            chunks.extend(w.appended);
        }
        chunks
    }

    /// Every entry of a multimap as `KV<K, Iterable<V>>` (map key, value
    /// count, values), which needs the state's value coder to count.
    fn read_multimap_entries(&self, id: &CellId) -> Result<Vec<Bytes>, StateError> {
        let coder = self
            .user_state
            .lock()
            .multimap_value_coders
            .get(&(id.transform_id.to_string(), id.state_id.clone()))
            .cloned()
            .ok_or_else(|| {
                StateError(format!(
                    "multimap entries of state '{}' of transform '{}' are not available: \
                     the runner does not know the state's value coder, so it cannot \
                     count values",
                    id.state_id, id.transform_id
                ))
            })?;
        let mut units = Vec::new();
        for (map_key, chunks) in self.multimap_view(id) {
            let mut count = 0usize;
            for chunk in &chunks {
                count += count_values(&coder, chunk).map_err(|detail| {
                    StateError(format!(
                        "multimap entries of state '{}' of transform '{}': {detail}",
                        id.state_id, id.transform_id
                    ))
                })?;
            }
            let count = i32::try_from(count).map_err(|_| {
                StateError(format!(
                    "multimap entries of state '{}' of transform '{}': a map key has \
                     {count} values, more than an iterable can carry",
                    id.state_id, id.transform_id
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
                    .multimap_key(id, map_key)
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
                *self.writes.lock().multimap_key(id, map_key) = BagWrite {
                    cleared: true,
                    appended: Vec::new(),
                };
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
