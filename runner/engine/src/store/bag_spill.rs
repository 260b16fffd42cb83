//! Bag user state past a stage's share of the memory budget, on disk.
//!
//! A stateful DoFn that buffers its input in bags (`GroupIntoBatches`, a
//! buffer a timer flushes) holds as much state as it has read until its
//! timers fire — in a batch pipeline, until the end of the input. Once the
//! values of a stage's bags in memory pass the stage's share, every bag's
//! values move to the job's spill store and memory starts over: a bag is
//! then its parts on disk followed by what was appended since.
//!
//! Each value chunk (what one append wrote) becomes one part, in order, so
//! a chunk keeps its place in the bag when it moves: a read paging through
//! a bag (by chunk index) while another bundle's commit spills finds the
//! next chunk where it was. The cell itself — transform, state id, window,
//! key — and its number of parts stay in memory: that bookkeeping is what a
//! spill cannot shrink.
//!
//! Layout under the stage's prefix: the cell's number (given when it first
//! spills; big-endian), then the part's number (big-endian). Clearing a
//! bag or expiring its window forgets its parts. A checkpoint reads them
//! back (the store's snapshot), and periodic checkpoints are skipped while
//! a stage has state on disk, as for GroupByKeys.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;

use super::BagId;
use crate::spill::{forget_prefix, prefix_end, PagedRange, SpillError, SpillStore};

/// Most bytes written to the store in one batch.
const WRITE_BATCH_BYTES: usize = 8 << 20;

/// A stage's bags on disk.
#[derive(Debug)]
pub(super) struct BagSpill {
    store: Arc<dyn SpillStore>,
    /// Every key of this stage's bags starts with it.
    prefix: Vec<u8>,
    /// Bytes of bag values the stage may hold in memory.
    limit: usize,
    /// The next cell's number.
    next_cell: u64,
    /// Bags with parts on disk.
    cells: HashMap<BagId, SpilledBag>,
    /// Bytes written so far.
    spilled_bytes: u64,
}

/// Where a bag's parts are, and how many.
#[derive(Debug, Clone, Copy)]
struct SpilledBag {
    number: u64,
    parts: u32,
}

impl BagSpill {
    /// Bags spilled to `store` under `prefix` once their values in memory
    /// pass `limit` bytes.
    pub(super) fn new(store: Arc<dyn SpillStore>, prefix: Vec<u8>, limit: usize) -> Self {
        BagSpill {
            store,
            prefix,
            limit,
            next_cell: 0,
            cells: HashMap::new(),
            spilled_bytes: 0,
        }
    }

    /// Bytes of bag values the stage may hold in memory.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes written to the store so far.
    pub(super) fn spilled_bytes(&self) -> u64 {
        self.spilled_bytes
    }

    /// Whether some bag has parts on disk.
    pub(super) fn holds_data(&self) -> bool {
        !self.cells.is_empty()
    }

    /// Whether bag `id` has parts on disk.
    pub(super) fn contains(&self, id: &BagId) -> bool {
        self.cells.contains_key(id)
    }

    /// How many parts of bag `id` are on disk (they come before its chunks
    /// in memory).
    pub(super) fn parts(&self, id: &BagId) -> usize {
        self.cells.get(id).map_or(0, |c| c.parts as usize)
    }

    /// The bags with parts on disk.
    pub(super) fn cells(&self) -> impl Iterator<Item = &BagId> {
        self.cells.keys()
    }

    fn cell_prefix(&self, number: u64) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.prefix.len() + 12);
        key.extend_from_slice(&self.prefix);
        key.extend_from_slice(&number.to_be_bytes());
        key
    }

    fn part_key(&self, number: u64, part: u32) -> Vec<u8> {
        let mut key = self.cell_prefix(number);
        key.extend_from_slice(&part.to_be_bytes());
        key
    }

    /// Moves every chunk of `bags` to the store, after the parts its bag
    /// already has there, and empties `bags`.
    pub(super) fn spill(
        &mut self,
        bags: &mut HashMap<BagId, Vec<Bytes>>,
    ) -> Result<(), SpillError> {
        let mut batch = Vec::new();
        let mut batch_bytes = 0usize;
        let mut cells = 0usize;
        // Taken whole: the map keeps the room it grew to otherwise.
        for (id, chunks) in std::mem::take(bags) {
            cells += 1;
            let next_cell = &mut self.next_cell;
            let cell = self.cells.entry(id).or_insert_with(|| {
                let number = *next_cell;
                *next_cell += 1;
                SpilledBag { number, parts: 0 }
            });
            let (number, first) = (cell.number, cell.parts);
            cell.parts = u32::try_from(chunks.len())
                .ok()
                .and_then(|n| first.checked_add(n))
                .ok_or_else(|| SpillError("a bag of more than 2^32 appends".into()))?;
            for (at, chunk) in (first..).zip(chunks) {
                batch_bytes += chunk.len();
                batch.push((self.part_key(number, at), chunk.to_vec()));
                if batch_bytes >= WRITE_BATCH_BYTES {
                    self.store.put(std::mem::take(&mut batch))?;
                    self.spilled_bytes += std::mem::take(&mut batch_bytes) as u64;
                }
            }
        }
        if !batch.is_empty() {
            self.store.put(batch)?;
            self.spilled_bytes += batch_bytes as u64;
        }
        tracing::debug!(
            cells,
            spilled_total = self.spilled_bytes,
            "user state bags spilled"
        );
        Ok(())
    }

    /// Part `part` of bag `id`.
    pub(super) fn read_part(&self, id: &BagId, part: usize) -> Result<Bytes, SpillError> {
        let missing = || SpillError(format!("part {part} of a spilled bag is missing"));
        let cell = self.cells.get(id).ok_or_else(missing)?;
        let part = u32::try_from(part).map_err(|_| missing())?;
        let from = self.part_key(cell.number, part);
        let to = prefix_end(&from).unwrap_or_default();
        let mut entries = self.store.scan(&from, &to, 0)?;
        match entries.pop() {
            Some((key, value)) if key == from => Ok(Bytes::from(value)),
            _ => Err(missing()),
        }
    }

    /// Every part of bag `id`, in order (for a checkpoint): one scan of
    /// the cell's range, whose part numbers sort as written.
    pub(super) fn read_bag(&self, id: &BagId) -> Result<Vec<Bytes>, SpillError> {
        let Some(cell) = self.cells.get(id) else {
            return Ok(Vec::new());
        };
        let parts =
            PagedRange::prefixed(&self.cell_prefix(cell.number)).rest(self.store.as_ref())?;
        if parts.len() != cell.parts as usize {
            return Err(SpillError(format!(
                "a spilled bag has {} of its {} parts",
                parts.len(),
                cell.parts
            )));
        }
        Ok(parts.into_iter().map(|(_, v)| Bytes::from(v)).collect())
    }

    /// Every bag with parts on disk, with those parts in order: what a
    /// checkpoint copies, or what memory takes back when spilling stops.
    pub(super) fn read_back(&self) -> Result<Vec<(BagId, Vec<Bytes>)>, SpillError> {
        self.cells
            .keys()
            .map(|id| Ok((id.clone(), self.read_bag(id)?)))
            .collect()
    }

    /// Forgets bag `id`'s parts (it was cleared).
    pub(super) fn forget(&mut self, id: &BagId) -> Result<(), SpillError> {
        if let Some(cell) = self.cells.remove(id) {
            forget_prefix(self.store.as_ref(), &self.cell_prefix(cell.number))?;
        }
        Ok(())
    }

    /// Forgets the parts of every bag in a window of `gone`.
    pub(super) fn forget_windows(&mut self, gone: &HashSet<Bytes>) -> Result<(), SpillError> {
        let doomed: Vec<BagId> = self
            .cells
            .keys()
            .filter(|(_, _, window, _)| gone.contains(window))
            .cloned()
            .collect();
        for id in doomed {
            self.forget(&id)?;
        }
        Ok(())
    }

    /// Forgets every part (a restore puts the checkpoint's state back).
    pub(super) fn clear(&mut self) -> Result<(), SpillError> {
        self.cells.clear();
        forget_prefix(self.store.as_ref(), &self.prefix)
    }
}

impl Drop for BagSpill {
    /// Spilled bags are scratch: gone with the job's state.
    fn drop(&mut self) {
        if self.cells.is_empty() {
            return;
        }
        if let Err(error) = forget_prefix(self.store.as_ref(), &self.prefix) {
            tracing::warn!(%error, "cannot remove spilled user state");
        }
    }
}
