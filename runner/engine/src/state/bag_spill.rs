//! Bag user state past a stage's share of the memory budget, on disk.
//!
//! A stateful DoFn that buffers its input in bags (`GroupIntoBatches`, a
//! buffer a timer flushes) holds as much state as it has read until its
//! timers fire — in a batch pipeline, until the end of the input. Once the
//! values of a stage's bags in memory pass the stage's share, every bag's
//! values move to a store and memory starts over: a bag is then its parts
//! on disk followed by what was appended since.
//!
//! Each value chunk (what one append wrote) becomes one part, in order, so
//! a chunk keeps its place in the bag when it moves: a read paging through
//! a bag (by chunk index) while another bundle's commit spills finds the
//! next chunk where it was. The cell itself — transform, state id, window,
//! key — its number of parts, and the spills they came in stay in memory:
//! that bookkeeping is what a spill cannot shrink.
//!
//! Layout under the stage's prefix: the spill's *generation* (one more at
//! every spill), the cell's number (given when it first spills), then the
//! part's number, all big-endian. Parts are never rewritten: a bag that
//! spills again adds parts under the new generation, and a cleared bag's
//! parts are deleted, never reused (a bag appended to after a clear gets a
//! new number).
//!
//! The store is one of two kinds:
//!
//! * **Scratch** (the job's spill space, which a crash empties): clearing a
//!   bag or expiring its window deletes its parts at once, and a checkpoint
//!   reads them back (periodic checkpoints are skipped while a stage has
//!   state there, as for GroupByKeys).
//! * **Durable** (beside the job's checkpoints, [`BagSpill::durable`]): a
//!   checkpoint names the parts instead of copying them ([`SpilledBags`]),
//!   which is what lets a checkpointed streaming job's state outgrow
//!   memory. Parts are immutable, so a checkpoint needs only each bag's
//!   generations and part count, and the generation the next spill will
//!   use: a restore deletes every generation from that one on (spills after
//!   the checkpoint, which it does not name). A part a checkpoint names
//!   must outlive it: a cleared bag's parts are deleted only once a later
//!   checkpoint (which does not name them) is durable, and every checkpoint
//!   lists the deletes still owed, which a restore carries out (a crash may
//!   have come between the checkpoint and the deletes).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::spill::{forget_prefix, prefix_end, PagedRange, Reclaim, SpillError, SpillSpace};
use crate::state::CellId;

/// Most bytes written to the store in one batch.
const WRITE_BATCH_BYTES: usize = 8 << 20;

/// The parts one spill wrote of a bag: those numbered from `first` on, up
/// to the next run's first, under `generation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Run {
    generation: u32,
    first: u32,
}

/// Where a bag's parts are, and how many.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SpilledBag {
    number: u64,
    parts: u32,
    /// In part order; most bags have one.
    runs: SmallVec<[Run; 1]>,
}

/// One spill's parts of one bag: a key prefix, what a clear deletes.
type RunKey = (u32, u64);

/// What a checkpoint keeps of a stage's bags on a durable spill space: where
/// each bag's parts are (not the parts), and the deletes still owed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpilledBags {
    next_cell: u64,
    /// The generation of the first spill after the checkpoint: everything
    /// from it on is not the checkpoint's.
    generation: u32,
    /// Sorted by bag.
    cells: Vec<(CellId, SpilledBag)>,
    /// Parts of bags cleared before the checkpoint and not yet deleted
    /// (sorted): the checkpoint does not need them.
    owed: Vec<RunKey>,
}

impl SpilledBags {
    /// Whether some bag's parts are named (a restore must find them).
    pub(crate) fn names_bags(&self) -> bool {
        !self.cells.is_empty()
    }
}

/// A stage's bags on disk.
#[derive(Debug)]
pub(super) struct BagSpill {
    store: Arc<dyn SpillSpace>,
    /// Every key of this stage's bags starts with it.
    prefix: Vec<u8>,
    /// Bytes of bag values the stage may hold in memory.
    limit: usize,
    /// The next cell's number.
    next_cell: u64,
    /// The next spill's generation.
    generation: u32,
    /// Bags with parts on disk.
    cells: HashMap<CellId, SpilledBag>,
    /// Bytes written so far.
    spilled_bytes: u64,
    /// When a cleared bag's parts are deleted (by run).
    reclaim: Reclaim<RunKey>,
}

impl BagSpill {
    /// Bags spilled to scratch `store` under `prefix` once their values in
    /// memory pass `limit` bytes.
    pub(super) fn scratch(store: Arc<dyn SpillSpace>, prefix: Vec<u8>, limit: usize) -> Self {
        BagSpill {
            store,
            prefix,
            limit,
            next_cell: 0,
            generation: 0,
            cells: HashMap::new(),
            spilled_bytes: 0,
            reclaim: Reclaim::scratch(),
        }
    }

    /// Bags spilled to `store`, whose writes survive as long as the
    /// checkpoint that names them (see the module docs).
    pub(super) fn durable(store: Arc<dyn SpillSpace>, prefix: Vec<u8>, limit: usize) -> Self {
        let mut spill = Self::scratch(store, prefix, limit);
        spill.reclaim = Reclaim::durable();
        spill
    }

    /// Whether checkpoints name the parts instead of copying them.
    pub(super) fn is_durable(&self) -> bool {
        self.reclaim.is_durable()
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
    pub(super) fn contains(&self, id: &CellId) -> bool {
        self.cells.contains_key(id)
    }

    /// How many parts of bag `id` are on disk (they come before its chunks
    /// in memory).
    pub(super) fn parts(&self, id: &CellId) -> usize {
        self.cells.get(id).map_or(0, |c| c.parts as usize)
    }

    /// The bags with parts on disk.
    pub(super) fn cells(&self) -> impl Iterator<Item = &CellId> {
        self.cells.keys()
    }

    fn run_prefix(&self, run: RunKey) -> Vec<u8> {
        run_prefix(&self.prefix, run)
    }

    fn part_key(&self, run: RunKey, part: u32) -> Vec<u8> {
        let mut key = self.run_prefix(run);
        key.extend_from_slice(&part.to_be_bytes());
        key
    }

    /// Moves every chunk of `bags` to the store, after the parts its bag
    /// already has there, and empties `bags`.
    pub(super) fn spill(
        &mut self,
        bags: &mut HashMap<CellId, Vec<Bytes>>,
    ) -> Result<(), SpillError> {
        let generation = self.generation;
        self.generation = generation
            .checked_add(1)
            .ok_or_else(|| SpillError("more than 2^32 spills of user state".into()))?;
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
                SpilledBag {
                    number,
                    parts: 0,
                    runs: SmallVec::new(),
                }
            });
            let (number, first) = (cell.number, cell.parts);
            cell.parts = u32::try_from(chunks.len())
                .ok()
                .and_then(|n| first.checked_add(n))
                .ok_or_else(|| SpillError("a bag of more than 2^32 appends".into()))?;
            cell.runs.push(Run { generation, first });
            for (at, chunk) in (first..).zip(chunks) {
                batch_bytes += chunk.len();
                batch.push((self.part_key((generation, number), at), chunk.to_vec()));
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
            generation,
            spilled_total = self.spilled_bytes,
            "user state bags spilled"
        );
        Ok(())
    }

    /// Part `part` of bag `id`.
    pub(super) fn read_part(&self, id: &CellId, part: usize) -> Result<Bytes, SpillError> {
        let missing = || SpillError(format!("part {part} of a spilled bag is missing"));
        let cell = self.cells.get(id).ok_or_else(missing)?;
        let part = u32::try_from(part).map_err(|_| missing())?;
        if part >= cell.parts {
            return Err(missing());
        }
        let run = cell.runs[cell
            .runs
            .partition_point(|r| r.first <= part)
            .saturating_sub(1)];
        let from = self.part_key((run.generation, cell.number), part);
        let to = prefix_end(&from).unwrap_or_default();
        let mut entries = self.store.scan(&from, &to, 0)?;
        match entries.pop() {
            Some((key, value)) if key == from => Ok(Bytes::from(value)),
            _ => Err(missing()),
        }
    }

    /// Every part of bag `id`, in order (for a checkpoint that copies
    /// them): one scan per spill it was in, whose part numbers sort as
    /// written.
    pub(super) fn read_bag(&self, id: &CellId) -> Result<Vec<Bytes>, SpillError> {
        let Some(cell) = self.cells.get(id) else {
            return Ok(Vec::new());
        };
        let mut parts = Vec::with_capacity(cell.parts as usize);
        for run in &cell.runs {
            let prefix = self.run_prefix((run.generation, cell.number));
            let entries = PagedRange::prefixed(&prefix).rest(self.store.as_ref())?;
            parts.extend(entries.into_iter().map(|(_, v)| Bytes::from(v)));
        }
        if parts.len() != cell.parts as usize {
            return Err(SpillError(format!(
                "a spilled bag has {} of its {} parts",
                parts.len(),
                cell.parts
            )));
        }
        Ok(parts)
    }

    /// Every bag with parts on disk, with those parts in order: what a
    /// checkpoint that copies them takes, or what memory takes back when
    /// spilling stops.
    pub(super) fn read_back(&self) -> Result<Vec<(CellId, Vec<Bytes>)>, SpillError> {
        self.cells
            .keys()
            .map(|id| Ok((id.clone(), self.read_bag(id)?)))
            .collect()
    }

    /// Forgets bag `id`'s parts (it was cleared): at once on scratch; on a
    /// durable spill space once no checkpoint that may be restored names them.
    pub(super) fn forget(&mut self, id: &CellId) -> Result<(), SpillError> {
        let Some(cell) = self.cells.remove(id) else {
            return Ok(());
        };
        let runs = cell.runs.iter().map(|r| (r.generation, cell.number));
        let (store, prefix) = (&self.store, &self.prefix);
        self.reclaim
            .consumed(runs, |&run| forget_run(store.as_ref(), prefix, run))
    }

    /// Forgets the parts of every bag in a window of `gone`.
    pub(super) fn forget_windows(&mut self, gone: &HashSet<Bytes>) -> Result<(), SpillError> {
        let doomed: Vec<CellId> = self
            .cells
            .keys()
            .filter(|id| gone.contains(&id.window))
            .cloned()
            .collect();
        for id in doomed {
            self.forget(&id)?;
        }
        Ok(())
    }

    /// What checkpoint `number` (counting those sent to be written) keeps
    /// of a durable spill space's bags: where their parts are, and the deletes
    /// still owed, which are carried out once it is durable
    /// ([`Self::checkpoint_durable`]).
    pub(super) fn checkpoint(&mut self, number: u64) -> SpilledBags {
        let owed = self.reclaim.checkpoint(number);
        let mut cells: Vec<(CellId, SpilledBag)> = self
            .cells
            .iter()
            .map(|(id, cell)| (id.clone(), cell.clone()))
            .collect();
        cells.sort_by(|a, b| a.0.cmp(&b.0));
        SpilledBags {
            next_cell: self.next_cell,
            generation: self.generation,
            cells,
            owed,
        }
    }

    /// Checkpoints up to `number` are durable: the parts of bags cleared
    /// before them are no longer named by any checkpoint a restore would
    /// read. A failed delete leaves garbage that the next checkpoint still
    /// lists (and a restore deletes).
    pub(super) fn checkpoint_durable(&mut self, number: u64) -> Result<(), SpillError> {
        let (store, prefix) = (&self.store, &self.prefix);
        self.reclaim
            .checkpoint_durable(number, |&run| forget_run(store.as_ref(), prefix, run))
    }

    /// Puts back what checkpoint `record` kept of a durable spill space's bags
    /// (`None`: none were on disk), and deletes what it does not name:
    /// every generation from its next one on, and the deletes it owed.
    pub(super) fn restore(&mut self, record: Option<SpilledBags>) -> Result<(), SpillError> {
        let record = record.unwrap_or_default();
        let mut after = self.prefix.clone();
        after.extend_from_slice(&record.generation.to_be_bytes());
        let end = prefix_end(&self.prefix).unwrap_or_default();
        self.store.forget_range(&after, &end)?;
        for &run in &record.owed {
            forget_run(self.store.as_ref(), &self.prefix, run)?;
        }
        self.next_cell = record.next_cell;
        self.generation = record.generation;
        self.cells = record.cells.into_iter().collect();
        self.reclaim.restart();
        Ok(())
    }

    /// Forgets every part (a restore puts the checkpoint's state back in
    /// memory).
    pub(super) fn clear(&mut self) -> Result<(), SpillError> {
        self.cells.clear();
        forget_prefix(self.store.as_ref(), &self.prefix)
    }
}

/// Where run `(generation, cell number)` of the bags under `prefix` is.
fn run_prefix(prefix: &[u8], (generation, number): RunKey) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + 16);
    key.extend_from_slice(prefix);
    key.extend_from_slice(&generation.to_be_bytes());
    key.extend_from_slice(&number.to_be_bytes());
    key
}

/// Forgets a run of the bags under `prefix` (a cleared bag's parts).
fn forget_run(store: &dyn SpillSpace, prefix: &[u8], run: RunKey) -> Result<(), SpillError> {
    forget_prefix(store, &run_prefix(prefix, run))
}

impl Drop for BagSpill {
    /// Spilled bags on scratch are gone with the job's state; on a durable
    /// store they are the checkpoint's, and go with the job.
    fn drop(&mut self) {
        if self.cells.is_empty() || self.is_durable() {
            return;
        }
        if let Err(error) = forget_prefix(self.store.as_ref(), &self.prefix) {
            tracing::warn!(%error, "cannot remove spilled user state");
        }
    }
}
