//! Spilling a grouping buffer that outgrew its share of memory (see
//! [`crate::spill`] for why and where).
//!
//! Only buffers whose trigger first fires when the watermark passes the end
//! of a window (the default trigger, or an `AfterWatermark` without early
//! firings: every batch GroupByKey of a pipeline that does not ask for
//! more) spill, and only panes that have not fired: such a pane needs no
//! trigger state, so a spilled pane is just its values, their count and
//! its output-time holds. Windows that do not merge are filed as below;
//! sessions, whose windows are only known once a key's pieces are merged,
//! by key (`sessions`). Windows the SDK merges (custom merging window
//! functions) do not spill.
//!
//! A spilled window the watermark passes is emitted from the store if it
//! closes then too (no allowed lateness, or the watermark jumped past its
//! lateness as well, as it does at the end of a batch input). One that
//! stays open for late data comes back into memory instead and fires from
//! there: its on-time panes must stay as panes that fired (late panes count
//! from them, and accumulate onto them), which only memory keeps. Panes of
//! such a window stay in memory until it closes.
//!
//! Layout in the store, under the buffer's prefix: for each window, the
//! window's encoded bytes (length first) and a number no other spilled
//! window of the buffer gets (see `durable`), then each run of it as
//! sorted blocks of records (`blocks`). A window's entries are therefore
//! contiguous; a window that drains first writes its in-memory panes as
//! one last run, then its runs are merged, keys coming out ordered by
//! (length, bytes).
//!
//! A spilled window keeps the output-time holds of its panes, so the
//! stage's output watermark stays behind everything not yet emitted until
//! the window's last key is out.

use std::cmp::Ordering;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;

use super::{
    pane_hold, update_holds, Fired, Firing, GroupingBuffer, GroupingError, KeyPanes, KeyTable,
    Pane, PaneValues,
};
use crate::holds::Holds;
use crate::plan::{Trigger, WindowFn};
use crate::spill::{delete_prefix, OwedDeletes, PagedRange, SpillError, SpillStore};
use crate::time::Timestamp;
use crate::trigger::TriggerContext;
use crate::window::Window;

mod blocks;
mod durable;
#[cfg(test)]
mod durable_tests;
mod large;
#[cfg(test)]
mod large_tests;
#[cfg(test)]
mod lateness_tests;
#[cfg(test)]
mod merge_tests;
mod sessions;
use blocks::{BlockWriter, MergedRuns, Record};
pub(crate) use durable::SpilledWindows;
pub use large::{read_iterable_page, IterablePage};
use sessions::SessionSpill;

/// Bookkeeping bytes of a buffered key besides its bytes (its table entry
/// less its first pane, and its index slot): an estimate for the bound.
pub(super) const KEY_OVERHEAD: usize = 64;
/// Bookkeeping bytes of a buffered pane besides its values (a window and
/// its pane, 160 bytes, in the key's entry or its heap vector).
pub(super) const PANE_OVERHEAD: usize = 160;
/// Most bytes written to the store in one batch.
const WRITE_BATCH_BYTES: usize = 8 << 20;
/// Bytes of a spilled pane before its values: count, earliest and latest
/// hold, the values' length.
const PANE_HEADER: usize = 32;
/// Set in a spilled pane's values length when its values are out of line
/// (`large`): the run's number follows instead of the values.
const OUT_OF_LINE: u64 = 1 << 63;
/// Most bytes of one key a drain reads back into memory before it hands
/// the key out instead (where its consumers may be handed keys): the
/// buffer's share of memory, within these bounds. Not less: a handed-out
/// key costs its consumer more than one in the element (a state request
/// per page, and Python's SDK reads a sampled element's iterable once
/// more to estimate its size), and the elements are small, so several in
/// one bundle go to one worker; with keys of a tenth of the share handed
/// out, a job took twice as long.
const HAND_OUT_MIN: usize = 16 << 20;
const HAND_OUT_MAX: usize = 256 << 20;

/// Where a buffer spills, by how it files what it spills.
#[derive(Debug)]
pub(super) enum SpillSpace {
    /// Windows that do not merge: filed by window. (Boxed: a buffer that
    /// does not spill holds neither.)
    ByWindow(Box<Spill>),
    /// Sessions: filed by key, merged when read back. (Boxed: it is the
    /// larger, and rarer.)
    ByKey(Box<SessionSpill>),
}

/// A by-window buffer's spill space and what it put there.
#[derive(Debug)]
pub(super) struct Spill {
    store: Arc<dyn SpillStore>,
    /// Every key of this buffer starts with it.
    prefix: Vec<u8>,
    /// Bytes the buffer may hold in memory before it spills.
    limit: usize,
    /// Runs written so far (the next run's number).
    runs: u32,
    /// Bytes written to the store so far.
    pub(super) spilled_bytes: u64,
    /// Windows with spilled panes.
    windows: BTreeMap<Window, SpilledWindow>,
    /// Windows being emitted, oldest first.
    drains: VecDeque<Drain>,
    /// Bytes the last spill left in memory (panes that may not spill): the
    /// next spill waits until the limit is exceeded past them, so that
    /// such panes are not walked again at every element.
    pinned: usize,
    /// The coder of the values, to cut a large pane between them (`None`
    /// if the input is not a `KV`: nothing is written out of line).
    value_coder: Option<crate::coder::Coder>,
    /// A drain hands out a key with more bytes than this (`large`), if
    /// set: every consumer reads the output through a state-backed
    /// iterable.
    hand_out_above: Option<usize>,
    /// Keys handed out so far.
    handed_out: u64,
    /// Keys handed out whose elements may still be waiting or running
    /// downstream: while any is, no checkpoint (see `read_back`).
    live_hand_outs: u64,
    /// Out-of-line spaces of drained windows that handed keys out, kept
    /// until their consumers are done with them.
    kept_spaces: Vec<Vec<u8>>,
    /// The number the next spilled window gets in its prefix: a window
    /// that spills again after its data went gets a space of its own.
    next_window: u64,
    /// On a durable store, the window spaces gone that a checkpoint may
    /// still name (see `durable`); `None` on scratch. (Boxed: most
    /// buffers spill to scratch, if at all.)
    owed: Option<Box<OwedDeletes<Vec<u8>>>>,
}

/// A window some of whose panes are in the store.
#[derive(Debug)]
struct SpilledWindow {
    /// The store key prefix of its entries.
    start: Vec<u8>,
    /// Output-time holds of its panes not yet emitted (spilled ones, and
    /// the in-memory ones a drain took).
    holds: Holds,
    /// A drain emits it now.
    draining: bool,
    /// The runs that wrote some of its panes, ascending.
    runs: Vec<u32>,
}

/// A spilled window being emitted, key by key.
#[derive(Debug)]
struct Drain {
    window: Window,
    start: Vec<u8>,
    /// Its runs, merged (its in-memory panes were written as the last).
    runs: MergedRuns,
    /// Some key of it was handed out: its out-of-line space stays.
    handed_out: bool,
}

/// A drained key: its whole pane, or (too large for memory) a pane with
/// its count and holds but no values, which are behind a token.
enum DrainedKey {
    Whole(Bytes, Pane),
    HandedOut(Bytes, Pane, Vec<u8>),
}

/// The store key of `key`'s part in run `run`, under `start`.
fn run_key(start: &[u8], key: &[u8], run: u32) -> Result<Vec<u8>, SpillError> {
    let mut k = Vec::with_capacity(start.len() + key.len() + 8);
    k.extend_from_slice(start);
    put_len(&mut k, key.len())?;
    k.extend_from_slice(key);
    k.extend_from_slice(&run.to_be_bytes());
    Ok(k)
}

/// Appends a spilled pane: its count, the earliest and latest hold of its
/// values (`end`, the window's, if it has none), the values' length and
/// the values.
fn put_spilled_pane(out: &mut Vec<u8>, pane: &Pane, end: Timestamp) {
    out.reserve(PANE_HEADER + pane.values.len());
    put_pane_header(out, pane, end, pane.values.len() as u64);
    out.extend_from_slice(&pane.values);
}

/// Appends a spilled pane whose values run `run` wrote out of line: the
/// header as [`put_spilled_pane`] writes it, flagged, then the run.
fn put_out_of_line_pane(out: &mut Vec<u8>, pane: &Pane, end: Timestamp, run: u32) {
    put_pane_header(out, pane, end, pane.values.len() as u64 | OUT_OF_LINE);
    out.extend_from_slice(&run.to_le_bytes());
}

fn put_pane_header(out: &mut Vec<u8>, pane: &Pane, end: Timestamp, values_len: u64) {
    out.extend_from_slice(&u64::from(pane.count).to_le_bytes());
    out.extend_from_slice(&pane.holds.min().unwrap_or(end).to_le_bytes());
    out.extend_from_slice(&pane.holds.max().unwrap_or(end).to_le_bytes());
    out.extend_from_slice(&values_len.to_le_bytes());
}

/// A run's entries on their way to the store, written a batch at a time.
#[derive(Default)]
struct RunWriter {
    batch: crate::spill::Entries,
    bytes: usize,
}

impl RunWriter {
    /// Adds an entry; writes the batch once it is big enough. Counts what
    /// it writes in `spilled_bytes`.
    fn push(
        &mut self,
        store: &dyn SpillStore,
        entry: (Vec<u8>, Vec<u8>),
        spilled_bytes: &mut u64,
    ) -> Result<(), SpillError> {
        self.bytes += entry.0.len() + entry.1.len();
        self.batch.push(entry);
        if self.bytes >= WRITE_BATCH_BYTES {
            self.flush(store, spilled_bytes)?;
        }
        Ok(())
    }

    /// Writes what is left.
    fn flush(&mut self, store: &dyn SpillStore, spilled_bytes: &mut u64) -> Result<(), SpillError> {
        if !self.batch.is_empty() {
            store.put(std::mem::take(&mut self.batch))?;
            *spilled_bytes += std::mem::take(&mut self.bytes) as u64;
        }
        Ok(())
    }
}

/// [`delete_prefix`] when the buffer goes (job done, failed or cancelled):
/// a failure only leaves garbage a restart clears.
fn drop_prefix(store: &dyn SpillStore, prefix: &[u8]) {
    if let Err(error) = delete_prefix(store, prefix) {
        tracing::warn!(%error, "cannot remove a GroupByKey's spilled data");
    }
}

/// Takes the next number of `counter` (a run or a generation); an error
/// once it would wrap.
fn next_number(counter: &mut u32, what: &str) -> Result<u32, SpillError> {
    let n = *counter;
    *counter = n
        .checked_add(1)
        .ok_or_else(|| SpillError(format!("too many spill {what}")))?;
    Ok(n)
}

/// One run's part of a pane, as stored.
#[derive(Debug, Clone)]
struct SpilledPane {
    count: usize,
    hold_min: Timestamp,
    hold_max: Timestamp,
    values: Bytes,
    /// Values written out of line instead, by this run, this many bytes.
    elsewhere: Option<(u32, u64)>,
}

impl SpilledPane {
    /// Bytes of its values, wherever they are.
    fn bytes(&self) -> u64 {
        self.elsewhere.map_or(self.values.len() as u64, |(_, n)| n)
    }
}

/// How a buffer with some strategy spills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SpillKind {
    /// Filed by window (windows that do not merge).
    ByWindow,
    /// Filed by key, merged when read back (sessions).
    ByKey,
}

/// How a buffer with this strategy may spill, if at all: only if its
/// trigger fires first at the end of the window.
fn spill_kind(strategy: &crate::plan::WindowingStrategy) -> Option<SpillKind> {
    if !strategy.trigger.first_fires_at_window_end() {
        return None;
    }
    match strategy.window_fn {
        WindowFn::Sessions { .. } => Some(SpillKind::ByKey),
        WindowFn::Custom { merging: true } => None,
        _ => Some(SpillKind::ByWindow),
    }
}

/// Whether `pane` of `window` may go to the store at `input_watermark`: it
/// has not fired (a spilled pane comes back as one that has not), and its
/// window is not open past its end (see the module docs).
fn may_spill(
    strategy: &crate::plan::WindowingStrategy,
    window: &Window,
    pane: &Pane,
    input_watermark: Timestamp,
) -> bool {
    let past_end = window.max_timestamp() < input_watermark;
    let closed = window.garbage_collection_time(strategy.allowed_lateness) < input_watermark;
    pane.fired == 0 && (!past_end || closed)
}

/// A key a spill sorts, by its position in the key table, with its length
/// and first bytes alongside so that most comparisons need not look at the
/// table.
#[derive(Debug, Clone, Copy)]
struct SortedKey {
    len: u32,
    head: u64,
    at: u32,
}

impl SortedKey {
    fn new(key: &[u8], at: usize) -> Result<Self, SpillError> {
        let mut head = [0u8; 8];
        let n = key.len().min(8);
        head[..n].copy_from_slice(&key[..n]);
        Ok(SortedKey {
            len: u32::try_from(key.len())
                .map_err(|_| SpillError(format!("a key of {} bytes is too large", key.len())))?,
            head: u64::from_be_bytes(head),
            at: u32::try_from(at)
                .map_err(|_| SpillError(format!("cannot spill a table of {at} keys or more")))?,
        })
    }

    /// [`key_order`] as far as length and first bytes tell.
    fn order(&self, other: &Self) -> Ordering {
        (self.len, self.head).cmp(&(other.len, other.head))
    }
}

/// Store keys order keys by (length, bytes); so must the in-memory side.
fn key_order(a: &[u8], b: &[u8]) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

fn put_len(out: &mut Vec<u8>, len: usize) -> Result<(), SpillError> {
    let len = u32::try_from(len)
        .map_err(|_| SpillError(format!("a key or window of {len} bytes is too large")))?;
    out.extend_from_slice(&len.to_be_bytes());
    Ok(())
}

fn corrupt(what: &str) -> SpillError {
    SpillError(format!("a spilled entry is corrupt ({what})"))
}

/// `N` bytes of `buf` at `at`; `what` names them if they are missing.
fn take<const N: usize>(buf: &[u8], at: usize, what: &str) -> Result<[u8; N], SpillError> {
    buf.get(at..at + N)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt(what))
}

/// The user key of a store key written by [`run_key`] under `start`.
fn run_key_user_key<'a>(start: &[u8], key: &'a [u8]) -> Result<&'a [u8], SpillError> {
    let rest = key.strip_prefix(start).ok_or_else(|| corrupt("prefix"))?;
    let len = u32::from_be_bytes(take::<4>(rest, 0, "key length")?) as usize;
    rest.get(4..4 + len).ok_or_else(|| corrupt("key"))
}

/// Reads what [`put_spilled_pane`] wrote at `at` of `bytes` (the values
/// a slice of them, not a copy): the pane, and where it ends.
fn read_spilled_pane(bytes: &Bytes, at: usize) -> Result<(SpilledPane, usize), SpillError> {
    let word = |at: usize| take::<8>(bytes, at, "pane header");
    let values_len = u64::from_le_bytes(take::<8>(bytes, at + 24, "values length")?);
    let start = at + PANE_HEADER;
    let count = usize::try_from(u64::from_le_bytes(word(at)?)).map_err(|_| corrupt("count"))?;
    let (hold_min, hold_max) = (
        i64::from_le_bytes(word(at + 8)?),
        i64::from_le_bytes(word(at + 16)?),
    );
    if values_len & OUT_OF_LINE != 0 {
        let run = u32::from_le_bytes(take::<4>(bytes, start, "run")?);
        let pane = SpilledPane {
            count,
            hold_min,
            hold_max,
            values: Bytes::new(),
            elsewhere: Some((run, values_len & !OUT_OF_LINE)),
        };
        return Ok((pane, start + 4));
    }
    let values_len = usize::try_from(values_len).map_err(|_| corrupt("values length"))?;
    let end = start
        .checked_add(values_len)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| corrupt("values"))?;
    let pane = SpilledPane {
        count,
        hold_min,
        hold_max,
        values: bytes.slice(start..end),
        elsewhere: None,
    };
    Ok((pane, end))
}

impl Pane {
    /// A pane that has not fired, holding one spilled part (a session's
    /// piece as read back).
    fn of_spilled(trigger: &Trigger, part: SpilledPane) -> Pane {
        let mut pane = Pane::new(trigger);
        pane.add_spilled(part);
        pane
    }

    fn add_spilled(&mut self, part: SpilledPane) {
        if self.values.is_empty() {
            self.values = PaneValues::from_slice(&part.values);
        } else {
            self.values.extend_from_slice(&part.values);
        }
        // Saturating: a pane past an int32's count fails when it is
        // encoded, which is where that limit is reported.
        let count = u32::try_from(part.count).unwrap_or(u32::MAX);
        self.count = self.count.saturating_add(count);
        self.new_data = true;
        self.holds.add(part.hold_min);
        self.holds.add(part.hold_max);
    }
}

impl Spill {
    /// The spilled window `window`, created (with its store prefix) if new.
    fn window(
        &mut self,
        window: &Window,
        window_coder: &crate::coder::Coder,
    ) -> Result<&mut SpilledWindow, GroupingError> {
        match self.windows.entry(window.clone()) {
            Entry::Occupied(spilled) => Ok(spilled.into_mut()),
            Entry::Vacant(slot) => {
                let mut encoded = Vec::new();
                window_coder.encode_window(window, &mut encoded)?;
                let mut start = self.prefix.clone();
                put_len(&mut start, encoded.len())?;
                start.extend_from_slice(&encoded);
                start.extend_from_slice(&self.next_window.to_be_bytes());
                self.next_window += 1;
                Ok(slot.insert(SpilledWindow {
                    start,
                    holds: Holds::default(),
                    draining: false,
                    runs: Vec::new(),
                }))
            }
        }
    }

    /// Everything of this buffer's range still in the store (for a
    /// checkpoint), with what drains hold, by window. An error once a key
    /// was handed out: its values are in the store only, and elements
    /// waiting downstream name them by a token no restore could honour.
    fn read_back(&self, trigger: &Trigger) -> Result<Vec<(Window, Bytes, Pane)>, SpillError> {
        if self.live_hand_outs > 0 {
            return Err(SpillError(format!(
                "a GroupByKey handed {} key(s) too large for memory to its consumers as \
                 state-backed iterables, whose values only the spill store holds: no checkpoint \
                 can be taken until its consumers are done with them",
                self.live_hand_outs
            )));
        }
        let mut out = Vec::new();
        let store = self.store.as_ref();
        let mut add = |window: &Window, start: &[u8], records: Vec<Record>| {
            for Record { key, part } in records {
                let part = self.resolved(start, &key, part)?;
                out.push((window.clone(), key, Pane::of_spilled(trigger, part)));
            }
            Ok::<(), SpillError>(())
        };
        for drain in &self.drains {
            add(&drain.window, &drain.start, drain.runs.rest(store)?)?;
        }
        for (window, spilled) in &self.windows {
            if !spilled.draining {
                let records = blocks::read_all(&PagedRange::prefixed(&spilled.start), store)?;
                add(window, &spilled.start, records)?;
            }
        }
        Ok(out)
    }

    /// The out-of-line space of the window whose entries start with
    /// `start`.
    fn window_space(&self, start: &[u8]) -> Vec<u8> {
        large::window_space(&self.prefix, start)
    }

    /// `part` of `key` in the window whose entries start with `start`, its
    /// values read back if they were written out of line.
    fn resolved(
        &self,
        start: &[u8],
        key: &[u8],
        mut part: SpilledPane,
    ) -> Result<SpilledPane, SpillError> {
        if let Some((run, _)) = part.elsewhere.take() {
            let space = large::key_space(&self.window_space(start), key)?;
            part.values = Bytes::from(large::read_part(self.store.as_ref(), &space, run)?);
        }
        Ok(part)
    }

    /// Where a run of the window whose entries start with `start` writes
    /// large panes, if anywhere.
    fn out_of_line(&self, start: &[u8]) -> Option<(Vec<u8>, crate::coder::Coder)> {
        let coder = self.value_coder.clone()?;
        Some((self.window_space(start), coder))
    }

    /// Deletes the window whose entries start with `start` (it was
    /// emitted or came back into memory): its entries, and its out-of-line
    /// space unless `keep_out_of_line` (keys it handed out are read from
    /// there). On a durable store, once no checkpoint a restore may read
    /// names it.
    fn forget_window(&mut self, start: &[u8], keep_out_of_line: bool) -> Result<(), SpillError> {
        let mut spaces = vec![start.to_vec()];
        if !keep_out_of_line {
            spaces.push(self.window_space(start));
        }
        self.forget_spaces(spaces)
    }

    /// Deletes everything under each of `spaces`: at once on scratch, on a
    /// durable store once a later checkpoint is durable.
    fn forget_spaces(&mut self, spaces: Vec<Vec<u8>>) -> Result<(), SpillError> {
        match &mut self.owed {
            Some(owed) => owed.owe(spaces),
            None => {
                for space in spaces {
                    delete_prefix(self.store.as_ref(), &space)?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for Spill {
    /// Spilled bytes on scratch are gone with the buffer; on a durable
    /// store they are the checkpoints', and go with the job.
    fn drop(&mut self) {
        if self.owed.is_none() {
            drop_prefix(self.store.as_ref(), &self.prefix);
        }
    }
}

impl Drain {
    /// The next key, or `None` when the window is done: its whole pane
    /// (its runs in order), or, if `spill` hands out keys and its parts
    /// add up to more than it allows, a pane without values and the token
    /// its consumers read them by (its parts that were in blocks are
    /// copied out of line first, so that the token covers every part).
    fn next_group(
        &mut self,
        spill: &Spill,
        trigger: &Trigger,
    ) -> Result<Option<DrainedKey>, SpillError> {
        let store = spill.store.as_ref();
        let Some(key) = self.runs.peek_key(store)?.cloned() else {
            return Ok(None);
        };
        // A key's parts: one per run it was spilled in, usually a few.
        let mut parts: SmallVec<[(SpilledPane, u32); 4]> = SmallVec::new();
        while let Some(part) = self.runs.take_if(&key, store)? {
            parts.push(part);
        }
        let bytes: u64 = parts.iter().map(|(part, _)| part.bytes()).sum();
        let hand_out = match (spill.hand_out_above, &spill.value_coder) {
            (Some(limit), Some(coder)) if bytes > limit as u64 => Some(coder),
            _ => None,
        };
        let mut pane = Pane::new(trigger);
        let Some(coder) = hand_out else {
            for (part, _) in parts {
                pane.add_spilled(spill.resolved(&self.start, &key, part)?);
            }
            return Ok(Some(DrainedKey::Whole(key, pane)));
        };
        let space = large::key_space(&spill.window_space(&self.start), &key)?;
        let mut writer = RunWriter::default();
        let mut copied = 0;
        for (mut part, run) in parts {
            if part.elsewhere.is_none() {
                large::write_part(
                    &space,
                    run,
                    &part.values,
                    coder,
                    &mut writer,
                    store,
                    &mut copied,
                )?;
            }
            part.values = Bytes::new();
            part.elsewhere = None;
            pane.add_spilled(part);
        }
        writer.flush(store, &mut copied)?;
        self.handed_out = true;
        tracing::debug!(
            bytes,
            values = pane.count,
            "a key too large for memory handed out"
        );
        Ok(Some(DrainedKey::HandedOut(key, pane, large::token(&space))))
    }
}

impl GroupingBuffer {
    /// Lets this buffer spill to `store` under `prefix` once it holds more
    /// than `limit` bytes, if its strategy allows (see the module docs);
    /// whether it does.
    pub fn enable_spill(
        &mut self,
        store: Arc<dyn SpillStore>,
        prefix: Vec<u8>,
        limit: usize,
    ) -> bool {
        let Some(kind) = spill_kind(&self.strategy) else {
            return false;
        };
        self.spill = Some(match kind {
            SpillKind::ByKey => {
                SpillSpace::ByKey(Box::new(SessionSpill::new(store, prefix, limit)))
            }
            SpillKind::ByWindow => SpillSpace::ByWindow(Box::new(Spill {
                store,
                prefix,
                limit,
                runs: 0,
                spilled_bytes: 0,
                windows: BTreeMap::new(),
                drains: VecDeque::new(),
                pinned: 0,
                value_coder: match &self.key_coder_kv {
                    crate::coder::Coder::Kv(_, value) => Some(value.as_ref().clone()),
                    _ => None,
                },
                hand_out_above: None,
                handed_out: 0,
                live_hand_outs: 0,
                kept_spaces: Vec::new(),
                next_window: 0,
                owed: None,
            })),
        });
        true
    }

    /// Lets a spilling buffer hand a key too large for memory to its
    /// consumers as a state-backed iterable (see `large`): call only when
    /// every consumer reads this buffer's output through one. Whether it
    /// may (only a spill filed by window on scratch does).
    pub fn hand_out_large_keys(&mut self) -> bool {
        match &mut self.spill {
            // Not from a durable store: a token's reads go to the job's
            // spill space (and a checkpoint could not name a key handed out).
            Some(SpillSpace::ByWindow(spill))
                if spill.value_coder.is_some() && spill.owed.is_none() =>
            {
                spill.hand_out_above = Some(spill.limit.clamp(HAND_OUT_MIN, HAND_OUT_MAX));
                true
            }
            _ => false,
        }
    }

    /// Keys handed out as state-backed iterables so far.
    pub fn handed_out(&self) -> u64 {
        match &self.spill {
            Some(SpillSpace::ByWindow(spill)) => spill.handed_out,
            _ => 0,
        }
    }

    /// Whether keys it handed out may still be read: their elements may
    /// wait or run downstream, naming values only the spill store holds,
    /// so the buffer cannot be checkpointed.
    pub fn has_live_hand_outs(&self) -> bool {
        matches!(&self.spill, Some(SpillSpace::ByWindow(spill)) if spill.live_hand_outs > 0)
    }

    /// Forgets the keys handed out so far, once the caller knows that
    /// every element that carried one was consumed and committed (no
    /// retry reads them again): the buffer may be checkpointed again, and
    /// the chunks of the windows it finished go.
    pub fn release_hand_outs(&mut self) -> Result<(), GroupingError> {
        if let Some(SpillSpace::ByWindow(spill)) = &mut self.spill {
            let kept = std::mem::take(&mut spill.kept_spaces);
            spill.forget_spaces(kept)?;
            spill.live_hand_outs = 0;
        }
        Ok(())
    }

    /// Bytes written to the spill store so far.
    pub fn spilled_bytes(&self) -> u64 {
        match &self.spill {
            Some(SpillSpace::ByWindow(s)) => s.spilled_bytes,
            Some(SpillSpace::ByKey(s)) => s.spilled_bytes,
            None => 0,
        }
    }

    /// Bytes the last spill had to leave in memory (tests check the bound
    /// past them).
    #[cfg(test)]
    pub(super) fn spill_pinned(&self) -> usize {
        match &self.spill {
            Some(SpillSpace::ByWindow(s)) => s.pinned,
            Some(SpillSpace::ByKey(s)) => s.pinned,
            None => 0,
        }
    }

    /// Whether some of what this buffer holds is in the spill store.
    pub fn has_spilled(&self) -> bool {
        match &self.spill {
            Some(SpillSpace::ByWindow(s)) => !s.windows.is_empty(),
            Some(SpillSpace::ByKey(s)) => s.holds_data(),
            None => false,
        }
    }

    /// Whether a spilled window is ready and waits to be emitted
    /// ([`Self::drain_spilled`]).
    pub fn is_draining(&self) -> bool {
        match &self.spill {
            Some(SpillSpace::ByWindow(s)) => !s.drains.is_empty(),
            Some(SpillSpace::ByKey(s)) => s.in_pass(),
            None => false,
        }
    }

    /// The earliest hold of the spilled windows.
    pub(super) fn spilled_hold(&self) -> Option<Timestamp> {
        match self.spill.as_ref()? {
            SpillSpace::ByWindow(s) => s.windows.values().filter_map(|w| w.holds.min()).min(),
            SpillSpace::ByKey(s) => s.hold(),
        }
    }

    /// Spills if the buffer holds more than its limit (past what the last
    /// spill had to leave in memory), given the input watermark.
    pub(super) fn maybe_spill(&mut self, input_watermark: Timestamp) -> Result<(), GroupingError> {
        match &self.spill {
            Some(SpillSpace::ByWindow(s)) if self.memory_bytes > s.limit + s.pinned => {
                let kept = self.write_run(input_watermark, None)?;
                if let Some(SpillSpace::ByWindow(spill)) = self.spill.as_mut() {
                    spill.pinned = kept;
                }
                Ok(())
            }
            Some(SpillSpace::ByKey(s)) if self.memory_bytes > s.limit + s.pinned => {
                self.spill_sessions()
            }
            _ => Ok(()),
        }
    }

    /// Writes every buffered pane that may spill ([`may_spill`]) — of the
    /// windows in `only`, if given — to the store as one run, and keeps
    /// only the others in memory; the bytes kept.
    fn write_run(
        &mut self,
        input_watermark: Timestamp,
        only: Option<&BTreeSet<Window>>,
    ) -> Result<usize, GroupingError> {
        let GroupingBuffer {
            strategy,
            window_coder,
            panes,
            holds,
            spill,
            touched,
            memory_bytes,
            ..
        } = self;
        let Some(SpillSpace::ByWindow(spill)) = spill.as_mut() else {
            return Ok(*memory_bytes);
        };
        let goes = |window: &Window, pane: &Pane| {
            may_spill(strategy, window, pane, input_watermark)
                && only.is_none_or(|only| only.contains(window))
        };
        let run = next_number(&mut spill.runs, "runs")?;
        // What goes, by window, sorted by key; the holds move to the
        // windows' as it is picked.
        // (Most panes are in the window of the pane before: that is looked
        // at first.)
        let mut by_window: Vec<(Window, Vec<SortedKey>)> = Vec::new();
        let mut group_of: BTreeMap<Window, usize> = BTreeMap::new();
        let mut last = None;
        for (at, (key, windows)) in panes.iter().enumerate() {
            for (window, pane) in windows {
                if pane.count == 0 || !goes(window, pane) {
                    continue;
                }
                let group = match last.filter(|&g: &usize| by_window[g].0 == *window) {
                    Some(group) => group,
                    None => match group_of.get(window) {
                        Some(&group) => group,
                        None => {
                            let spilled = spill.window(window, window_coder)?;
                            if spilled.runs.last() != Some(&run) {
                                spilled.runs.push(run);
                            }
                            by_window.push((window.clone(), Vec::new()));
                            group_of.insert(window.clone(), by_window.len() - 1);
                            by_window.len() - 1
                        }
                    },
                };
                last = Some(group);
                if let Some(h) = pane_hold(strategy, window, pane) {
                    holds.remove(h);
                    if let Some(spilled) = spill.windows.get_mut(window) {
                        spilled.holds.add(h);
                    }
                }
                by_window[group].1.push(SortedKey::new(key, at)?);
            }
        }
        let mut writer = RunWriter::default();
        let mut spilled_panes = 0usize;
        for (window, mut keys) in by_window {
            keys.sort_unstable_by(|a, b| {
                a.order(b)
                    .then_with(|| key_order(panes.key_at(a.at), panes.key_at(b.at)))
            });
            let Some(spilled) = spill.windows.get(&window) else {
                continue;
            };
            let mut blocks =
                BlockWriter::new(&spilled.start, run, spill.out_of_line(&spilled.start));
            for k in &keys {
                let (key, windows) = panes.entry_at(k.at);
                let Ok(at) = super::position(windows, &window) else {
                    continue;
                };
                let end = window.max_timestamp();
                let (store, bytes) = (spill.store.as_ref(), &mut spill.spilled_bytes);
                blocks.push(key, &windows[at].1, end, &mut writer, store, bytes)?;
            }
            blocks.flush(&mut writer, spill.store.as_ref(), &mut spill.spilled_bytes)?;
            spilled_panes += keys.len();
        }
        writer.flush(spill.store.as_ref(), &mut spill.spilled_bytes)?;
        // The table is given up and the few panes that stay go to a new
        // one: a table keeps the room it grew to, which after a spill of
        // many keys would be most of what the spill freed.
        let mut kept = KeyTable::<KeyPanes>::default();
        let mut kept_bytes = 0usize;
        let keys = panes.len();
        for (key, windows) in std::mem::take(panes).into_entries() {
            let mut stay = KeyPanes::new();
            for (window, pane) in windows {
                if goes(&window, &pane) {
                    continue;
                }
                kept_bytes += pane.values.len() + PANE_OVERHEAD;
                stay.push((window, pane));
            }
            if !stay.is_empty() {
                kept_bytes += key.len() + KEY_OVERHEAD;
                *kept.get_or_default(&key) = stay;
            }
        }
        tracing::debug!(
            run,
            keys,
            spilled_panes,
            bytes = *memory_bytes,
            kept_bytes,
            spilled_total = spill.spilled_bytes,
            "GroupByKey buffer spilled"
        );
        *panes = kept;
        if panes.is_empty() {
            touched.clear();
        } else {
            touched.retain(|key| panes.get(key).is_some());
        }
        *memory_bytes = kept_bytes;
        Ok(kept_bytes)
    }

    /// Starts emitting every spilled window the watermark has passed and
    /// closed: its in-memory panes that have not fired go to the store as
    /// one last run (their holds to the window's), so that a drain only
    /// merges runs. A spilled window the watermark has passed but which
    /// stays open for late data comes back into memory instead
    /// ([`Self::bring_back`]).
    pub(super) fn start_drains(&mut self, input_watermark: Timestamp) -> Result<(), GroupingError> {
        let Some(SpillSpace::ByWindow(spill)) = self.spill.as_ref() else {
            return Ok(());
        };
        let mut ready = BTreeSet::new();
        let mut open = Vec::new();
        for (window, spilled) in &spill.windows {
            if spilled.draining || window.max_timestamp() >= input_watermark {
                continue;
            }
            if self.expired(window, input_watermark) {
                ready.insert(window.clone());
            } else {
                open.push(window.clone());
            }
        }
        for window in open {
            self.bring_back(&window)?;
        }
        if ready.is_empty() {
            return Ok(());
        }
        // (A pane that fired came back with its window and closes from
        // memory; `may_spill` leaves it there.)
        self.write_run(input_watermark, Some(&ready))?;
        let Some(SpillSpace::ByWindow(spill)) = self.spill.as_mut() else {
            return Ok(());
        };
        for window in ready {
            let Some(spilled) = spill.windows.get_mut(&window) else {
                continue;
            };
            spilled.draining = true;
            let start = spilled.start.clone();
            spill.drains.push_back(Drain {
                runs: MergedRuns::new(&start, &spilled.runs),
                start,
                window,
                handed_out: false,
            });
        }
        Ok(())
    }

    /// Reads spilled window `window` back into memory, as panes that have
    /// not fired, and deletes it from the store; the next evaluation looks
    /// at every key.
    fn bring_back(&mut self, window: &Window) -> Result<(), GroupingError> {
        let GroupingBuffer {
            strategy,
            panes,
            holds,
            spill,
            memory_bytes,
            rescan,
            ..
        } = self;
        let Some(SpillSpace::ByWindow(spill)) = spill.as_mut() else {
            return Ok(());
        };
        let Some(spilled) = spill.windows.remove(window) else {
            return Ok(());
        };
        let store = spill.store.as_ref();
        let mut range = PagedRange::prefixed(&spilled.start);
        let mut entries = 0usize;
        loop {
            let page = range.next_page(store)?;
            if page.is_empty() {
                break;
            }
            let mut records = blocks::Records::of_entries(page);
            while let Some(Record { key, part }) = records.next_record()? {
                let part = spill.resolved(&spilled.start, &key, part)?;
                entries += 1;
                let (windows, new_key) = panes.get_or_insert_with(&key, KeyPanes::new);
                if new_key {
                    *memory_bytes += key.len() + KEY_OVERHEAD;
                }
                let at = match super::position(windows, window) {
                    Ok(at) => at,
                    Err(at) => {
                        windows.insert(at, (window.clone(), Pane::new(&strategy.trigger)));
                        *memory_bytes += PANE_OVERHEAD;
                        at
                    }
                };
                *memory_bytes += part.values.len();
                let (w, pane) = &mut windows[at];
                let before = pane_hold(strategy, w, pane);
                pane.add_spilled(part);
                update_holds(holds, before, pane_hold(strategy, w, pane));
            }
        }
        spill.forget_window(&spilled.start, false)?;
        *rescan = true;
        tracing::debug!(
            entries,
            bytes = *memory_bytes,
            "a spilled window open for late data came back into memory"
        );
        Ok(())
    }

    /// Emits the next keys of ready spilled windows into `out`, until it
    /// holds about `max_bytes` or no window is left to emit; the number of
    /// panes emitted. A window's spilled bytes are deleted once it is out.
    pub fn drain_spilled(
        &mut self,
        input_watermark: Timestamp,
        now: Timestamp,
        out: &mut Fired,
        max_bytes: usize,
    ) -> Result<usize, GroupingError> {
        let GroupingBuffer {
            strategy,
            window_coder,
            spill,
            output_watermark,
            ..
        } = self;
        let spill = match spill.as_mut() {
            Some(SpillSpace::ByWindow(spill)) => spill,
            Some(SpillSpace::ByKey(_)) => {
                return self.drain_sessions(input_watermark, now, out, max_bytes)
            }
            None => return Ok(0),
        };
        let firing = Firing {
            strategy,
            window_coder,
            output_watermark: *output_watermark,
        };
        let mut emitted = 0;
        while out.bytes.len() < max_bytes {
            // Off the queue while it reads, which looks at the spill.
            let Some(mut drain) = spill.drains.pop_front() else {
                break;
            };
            let ctx = TriggerContext {
                window_end: drain.window.max_timestamp(),
                watermark: input_watermark,
                now,
            };
            let next = drain.next_group(spill, &strategy.trigger);
            let window = drain.window.clone();
            let done = matches!(next, Ok(None));
            if done {
                spill.forget_window(&drain.start, drain.handed_out)?;
                if drain.handed_out {
                    let space = spill.window_space(&drain.start);
                    spill.kept_spaces.push(space);
                }
                spill.windows.remove(&drain.window);
            } else {
                spill.drains.push_front(drain);
            }
            match next? {
                Some(DrainedKey::Whole(key, mut pane)) => {
                    emitted += firing.emit(&key, &window, &mut pane, &ctx, true, None, out)?;
                }
                Some(DrainedKey::HandedOut(key, mut pane, token)) => {
                    let token = Some(token.as_slice());
                    emitted += firing.emit(&key, &window, &mut pane, &ctx, true, token, out)?;
                    spill.handed_out += 1;
                    spill.live_hand_outs += 1;
                }
                None => {}
            }
        }
        self.publish(input_watermark);
        Ok(emitted)
    }

    /// For a checkpoint: every spilled pane read back, merged into `panes`
    /// (so the checkpoint needs no spill store to be restored).
    pub(super) fn with_spilled(
        &self,
        panes: &mut BTreeMap<Bytes, KeyPanes>,
    ) -> Result<(), SpillError> {
        let spill = match &self.spill {
            Some(SpillSpace::ByWindow(spill)) => spill,
            Some(SpillSpace::ByKey(_)) => return self.with_spilled_sessions(panes),
            None => return Ok(()),
        };
        for (window, key, pane) in spill.read_back(&self.strategy.trigger)? {
            let windows = panes.entry(key).or_default();
            match super::position(windows, &window) {
                Ok(at) => windows[at].1.absorb(pane),
                Err(at) => windows.insert(at, (window, pane)),
            }
        }
        Ok(())
    }

    /// After a restore: forget what was spilled before (the checkpoint
    /// holds it) — on a durable store, all but the windows `named` names,
    /// which are put back — then spill again if what came back is too
    /// much.
    pub(super) fn reset_spill(
        &mut self,
        named: Option<SpilledWindows>,
    ) -> Result<(), GroupingError> {
        match &mut self.spill {
            Some(SpillSpace::ByWindow(spill)) => {
                spill.drains.clear();
                spill.pinned = 0;
                spill.live_hand_outs = 0;
                spill.kept_spaces.clear();
                if spill.owed.is_some() {
                    spill.restore(named.unwrap_or_default())?;
                } else {
                    delete_prefix(spill.store.as_ref(), &spill.prefix)?;
                    spill.windows.clear();
                    if named.is_some_and(|n| n.names_windows()) {
                        return Err(GroupingError::Spill(SpillError(
                            "the checkpoint names spilled windows of a GroupByKey that has no \
                             durable store here"
                                .into(),
                        )));
                    }
                }
            }
            Some(SpillSpace::ByKey(spill)) => spill.clear()?,
            None => {}
        }
        // The watermark is not known here: what spills is only what has not
        // fired; a window it passed comes back at the next evaluation if
        // it is still open.
        self.maybe_spill(crate::time::MIN_TIMESTAMP)
    }
}

#[cfg(test)]
mod tests;
