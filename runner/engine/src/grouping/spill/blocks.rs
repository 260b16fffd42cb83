//! A spill run of a window as sorted blocks, and reading runs back merged.
//!
//! A spill writes every pane of a window that may go to disk as one *run*:
//! the panes sorted by key, one record after another, cut into blocks of
//! about [`BLOCK_BYTES`], each block one store entry. The store thus sees a
//! few large entries in key order rather than one small entry per key in
//! the order the keys arrived: with millions of distinct keys, inserting
//! each into the store's sorted memtable and compacting them was most of
//! what a spill cost (a skip-list search per key, comparing long shared
//! prefixes).
//!
//! A window is read back by merging its runs, each through a cursor that
//! holds one block: keys come out in (length, bytes) order, and one key's
//! parts in the order its runs were written.
//!
//! Store keys: the window's start, then the run's number and the block's
//! number (big-endian), so a window's blocks are contiguous and a run's
//! blocks sort in the order they were written.
//!
//! A record: the key's length (`u32`, little-endian) and bytes, then the
//! pane as [`put_spilled_pane`] writes it (count, earliest and latest hold,
//! the values' length and the values).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use bytes::Bytes;

use super::encoding::{
    corrupt, key_order, put_out_of_line_pane, put_spilled_pane, read_spilled_pane, take,
    SpilledPane, PANE_HEADER,
};
use super::{large, RunWriter};
use crate::coder::Coder;
use crate::grouping::pane::Pane;
use crate::spill::Entries;
use crate::spill::{PagedRange, SpillError, SpillSpace};
use crate::time::Timestamp;

/// Bytes of records a block gathers before it is written. (A record larger
/// than this is a block of its own.) A cursor holds one block while a
/// window is read back, so this times the number of runs is what a drain
/// holds besides what it emits.
const BLOCK_BYTES: usize = 32 << 10;

/// The store key prefix of run `run` of the window whose entries start
/// with `start`.
fn run_prefix(start: &[u8], run: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(start.len() + 8);
    k.extend_from_slice(start);
    k.extend_from_slice(&run.to_be_bytes());
    k
}

/// Writes one run of one window, in key order.
pub(super) struct BlockWriter {
    prefix: Vec<u8>,
    block: Vec<u8>,
    blocks: u32,
    run: u32,
    /// The window's out-of-line space and the values' coder: a large pane
    /// goes there (`large`), if given.
    out_of_line: Option<(Vec<u8>, Coder)>,
}

impl BlockWriter {
    /// A writer of run `run` of the window whose entries start with
    /// `start`, writing large panes to `out_of_line` if given.
    pub(super) fn new(start: &[u8], run: u32, out_of_line: Option<(Vec<u8>, Coder)>) -> Self {
        BlockWriter {
            prefix: run_prefix(start, run),
            block: Vec::new(),
            blocks: 0,
            run,
            out_of_line,
        }
    }

    /// Appends `key`'s pane (of a window ending at `end`). Keys must come
    /// in (length, bytes) order.
    pub(super) fn push(
        &mut self,
        key: &[u8],
        pane: &Pane,
        end: Timestamp,
        writer: &mut RunWriter,
        store: &dyn SpillSpace,
        spilled_bytes: &mut u64,
    ) -> Result<(), SpillError> {
        let len = u32::try_from(key.len())
            .map_err(|_| SpillError(format!("a key of {} bytes is too large", key.len())))?;
        let elsewhere = match &self.out_of_line {
            Some((space, coder)) if pane.values().len() >= large::OUT_OF_LINE_BYTES => {
                let space = large::key_space(space, key)?;
                let values = pane.values();
                large::write_part(
                    &space,
                    self.run,
                    values,
                    coder,
                    writer,
                    store,
                    spilled_bytes,
                )?;
                true
            }
            _ => false,
        };
        self.block.reserve(4 + key.len() + PANE_HEADER + 4);
        self.block.extend_from_slice(&len.to_le_bytes());
        self.block.extend_from_slice(key);
        if elsewhere {
            put_out_of_line_pane(&mut self.block, pane, end, self.run);
        } else {
            put_spilled_pane(&mut self.block, pane, end);
        }
        if self.block.len() >= BLOCK_BYTES {
            self.flush(writer, store, spilled_bytes)?;
        }
        Ok(())
    }

    /// Hands the block gathered so far to `writer`.
    pub(super) fn flush(
        &mut self,
        writer: &mut RunWriter,
        store: &dyn SpillSpace,
        spilled_bytes: &mut u64,
    ) -> Result<(), SpillError> {
        if self.block.is_empty() {
            return Ok(());
        }
        let mut key = Vec::with_capacity(self.prefix.len() + 4);
        key.extend_from_slice(&self.prefix);
        key.extend_from_slice(&self.blocks.to_be_bytes());
        self.blocks = self
            .blocks
            .checked_add(1)
            .ok_or_else(|| SpillError("too many blocks in one spill run".into()))?;
        let block = std::mem::replace(&mut self.block, Vec::with_capacity(BLOCK_BYTES));
        writer.push(store, (key, block), spilled_bytes)
    }
}

/// One key's part of a pane, read from a block.
#[derive(Debug, Clone)]
pub(super) struct Record {
    /// The key.
    pub(super) key: Bytes,
    /// What this block holds of the key's pane.
    pub(super) part: SpilledPane,
}

/// The records of one or more blocks, one after another.
#[derive(Debug, Clone, Default)]
pub(super) struct Records {
    bytes: Bytes,
    at: usize,
}

impl Records {
    /// The records of store entries (blocks), in order.
    pub(super) fn of_entries(entries: Entries) -> Self {
        let blocks: Vec<Vec<u8>> = entries.into_iter().map(|(_, block)| block).collect();
        let bytes = match <[Vec<u8>; 1]>::try_from(blocks) {
            Ok([one]) => Bytes::from(one),
            Err(many) => Bytes::from(many.concat()),
        };
        Records { bytes, at: 0 }
    }

    /// The next record, `None` at the end.
    pub(super) fn next_record(&mut self) -> Result<Option<Record>, SpillError> {
        let b = &self.bytes;
        let mut at = self.at;
        if at >= b.len() {
            return Ok(None);
        }
        let key_len = u32::from_le_bytes(take::<4>(b, at, "key length")?) as usize;
        at += 4;
        let key_end = at
            .checked_add(key_len)
            .filter(|&end| end <= b.len())
            .ok_or_else(|| corrupt("key"))?;
        let key = b.slice(at..key_end);
        let (part, end) = read_spilled_pane(b, key_end)?;
        self.at = end;
        Ok(Some(Record { key, part }))
    }

    /// Every record not read yet.
    fn rest(&self) -> Result<Vec<Record>, SpillError> {
        let mut copy = self.clone();
        let mut out = Vec::new();
        while let Some(record) = copy.next_record()? {
            out.push(record);
        }
        Ok(out)
    }
}

/// Every record of `range` (whole blocks), in store order.
pub(super) fn read_all(
    range: &PagedRange,
    store: &dyn SpillSpace,
) -> Result<Vec<Record>, SpillError> {
    Records::of_entries(range.rest(store)?).rest()
}

/// One run of a window, read a block at a time.
#[derive(Debug)]
struct RunCursor {
    range: PagedRange,
    records: Records,
}

impl RunCursor {
    /// Its next record; the next block is read when one is used up.
    fn next_record(&mut self, store: &dyn SpillSpace) -> Result<Option<Record>, SpillError> {
        loop {
            if let Some(record) = self.records.next_record()? {
                return Ok(Some(record));
            }
            let blocks = self.range.next_entries(store, 0)?;
            if blocks.is_empty() {
                return Ok(None);
            }
            self.records = Records::of_entries(blocks);
        }
    }

    /// Every record not read yet (for a checkpoint; the cursor stays).
    fn rest(&self, store: &dyn SpillSpace) -> Result<Vec<Record>, SpillError> {
        let mut out = self.records.rest()?;
        out.extend(read_all(&self.range, store)?);
        Ok(out)
    }
}

/// A cursor's next record, ordered for a min-heap by key and then by run.
#[derive(Debug)]
struct Head {
    record: Record,
    cursor: usize,
}

impl Ord for Head {
    fn cmp(&self, other: &Self) -> Ordering {
        key_order(&other.record.key, &self.record.key).then(other.cursor.cmp(&self.cursor))
    }
}

impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Head {}

/// A window's runs read back as one sequence of records in key order.
#[derive(Debug)]
pub(super) struct MergedRuns {
    /// In the order the runs were written.
    cursors: Vec<RunCursor>,
    /// Each cursor's run number.
    runs: Vec<u32>,
    /// Each cursor's next record, once started.
    heads: BinaryHeap<Head>,
    started: bool,
}

impl MergedRuns {
    /// The runs `runs` (ascending) of the window whose entries start with
    /// `start`. Nothing is read until the first record is asked for.
    pub(super) fn new(start: &[u8], runs: &[u32]) -> Self {
        MergedRuns {
            cursors: runs
                .iter()
                .map(|&run| RunCursor {
                    range: PagedRange::prefixed(&run_prefix(start, run)),
                    records: Records::default(),
                })
                .collect(),
            runs: runs.to_vec(),
            heads: BinaryHeap::new(),
            started: false,
        }
    }

    fn start(&mut self, store: &dyn SpillSpace) -> Result<(), SpillError> {
        if !self.started {
            self.started = true;
            for (cursor, run) in self.cursors.iter_mut().enumerate() {
                if let Some(record) = run.next_record(store)? {
                    self.heads.push(Head { record, cursor });
                }
            }
        }
        Ok(())
    }

    /// The smallest key not taken yet.
    pub(super) fn peek_key(
        &mut self,
        store: &dyn SpillSpace,
    ) -> Result<Option<&Bytes>, SpillError> {
        self.start(store)?;
        Ok(self.heads.peek().map(|h| &h.record.key))
    }

    /// Takes the next record if its key is `key`, with its run's number.
    pub(super) fn take_if(
        &mut self,
        key: &[u8],
        store: &dyn SpillSpace,
    ) -> Result<Option<(SpilledPane, u32)>, SpillError> {
        self.start(store)?;
        if self.heads.peek().is_none_or(|h| h.record.key != key) {
            return Ok(None);
        }
        let Some(Head { record, cursor }) = self.heads.pop() else {
            return Ok(None);
        };
        if let Some(next) = self.cursors[cursor].next_record(store)? {
            self.heads.push(Head {
                record: next,
                cursor,
            });
        }
        let run = self.runs.get(cursor).copied().unwrap_or_default();
        Ok(Some((record.part, run)))
    }

    /// Every record not taken yet (for a checkpoint), runs in order.
    pub(super) fn rest(&self, store: &dyn SpillSpace) -> Result<Vec<Record>, SpillError> {
        // (Before the merge starts there are no heads, and every cursor's
        // range is whole.)
        let mut out = Vec::new();
        for (i, cursor) in self.cursors.iter().enumerate() {
            let head = self.heads.iter().filter(|h| h.cursor == i);
            out.extend(head.map(|h| h.record.clone()));
            out.extend(cursor.rest(store)?);
        }
        Ok(out)
    }
}
