//! A spill filed by window: for window functions that do not merge.
//!
//! Layout in the store, under the buffer's prefix: for each window, the
//! window's encoded bytes (length first) and a number no other spilled
//! window of the buffer gets (see `durable`), then each run of it as
//! sorted blocks of records (`blocks`). A window's entries are therefore
//! contiguous. A spill writes every pane in memory that may go as one run
//! ([`WindowSpill::write_run`]), and the buffer hands them over.
//!
//! A spilled window the watermark passes is emitted from the store if it
//! closes then too (no allowed lateness, or the watermark jumped past its
//! lateness as well, as it does at the end of a batch input): it writes
//! its in-memory panes as one last run, then its runs are merged, keys
//! coming out ordered by (length, bytes) (`drain`). One that stays open
//! for late data comes back into memory instead and fires from there: its
//! on-time panes must stay as panes that fired (late panes count from
//! them, and accumulate onto them), which only memory keeps. Panes of such
//! a window stay in memory until it closes.
//!
//! A spilled window keeps the output-time holds of its panes, so the
//! stage's output watermark stays behind everything not yet emitted until
//! the window's last key is out.

use std::cmp::Ordering;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;

use super::blocks::{self, BlockWriter, Record};
use super::encoding::{key_order, put_len, SpilledPane};
use super::{drop_prefix, large, next_number, BufferSide, RunWriter, Spillable};
use crate::coder::Coder;
use crate::grouping::pane::{position, KeyPanes, Pane};
use crate::grouping::GroupingError;
use crate::holds::Holds;
use crate::plan::{Trigger, WindowingStrategy};
use crate::spill::{delete_prefix, PagedRange, Reclaim, SpillError, SpillSpace};
use crate::time::Timestamp;
use crate::window::Window;

mod drain;
mod durable;

use drain::Drain;
pub(crate) use durable::SpilledWindows;

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

/// A by-window buffer's spill space and what it put there.
#[derive(Debug)]
pub(in crate::grouping) struct WindowSpill {
    store: Arc<dyn SpillSpace>,
    /// Every key of this buffer starts with it.
    prefix: Vec<u8>,
    /// Bytes the buffer may hold in memory before it spills.
    limit: usize,
    /// Runs written so far (the next run's number).
    pub(super) runs: u32,
    /// Bytes written to the store so far.
    pub(super) spilled_bytes: u64,
    /// Windows with spilled panes.
    windows: BTreeMap<Window, SpilledWindow>,
    /// Windows being emitted, oldest first.
    drains: VecDeque<Drain>,
    /// Bytes the last spill left in memory (panes that may not spill): the
    /// next spill waits until the limit is exceeded past them, so that
    /// such panes are not walked again at every element.
    pub(super) pinned: usize,
    /// The coder of the values, to cut a large pane between them (`None`
    /// if the input is not a `KV`: nothing is written out of line).
    value_coder: Option<Coder>,
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
    /// When the spaces of windows gone are deleted: on a durable spill space,
    /// once no checkpoint may name them (see `durable`).
    reclaim: Reclaim<Vec<u8>>,
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

/// Whether `pane` of `window` may go to the store at `input_watermark`: it
/// has not fired (a spilled pane comes back as one that has not), and its
/// window is not open past its end (see the module docs).
fn may_spill(
    strategy: &WindowingStrategy,
    window: &Window,
    pane: &Pane,
    input_watermark: Timestamp,
) -> bool {
    let past_end = window.max_timestamp() < input_watermark;
    let closed = crate::grouping::firing::expired(strategy, window, input_watermark);
    !pane.has_fired() && (!past_end || closed)
}

/// A key a spill sorts, by its position in the buffer's memory, with its
/// length and first bytes alongside so that most comparisons need not
/// look at the key.
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

impl WindowSpill {
    /// Spill space in `store` under `prefix`, used once the buffer holds
    /// more than `limit` bytes; values of `value_coder`, if known, may be
    /// written out of line.
    pub(super) fn new(
        store: Arc<dyn SpillSpace>,
        prefix: Vec<u8>,
        limit: usize,
        value_coder: Option<Coder>,
    ) -> Self {
        WindowSpill {
            store,
            prefix,
            limit,
            runs: 0,
            spilled_bytes: 0,
            windows: BTreeMap::new(),
            drains: VecDeque::new(),
            pinned: 0,
            value_coder,
            hand_out_above: None,
            handed_out: 0,
            live_hand_outs: 0,
            kept_spaces: Vec::new(),
            next_window: 0,
            reclaim: Reclaim::scratch(),
        }
    }

    /// Lets a drain hand a key too large for memory out (see `large`);
    /// whether it may: not from a durable spill space, whose keys a token's
    /// reads (which go to the job's spill space) would not find, and
    /// which a checkpoint could not name.
    pub(super) fn hand_out_large_keys(&mut self) -> bool {
        if self.value_coder.is_none() || self.reclaim.is_durable() {
            return false;
        }
        self.hand_out_above = Some(self.limit.clamp(HAND_OUT_MIN, HAND_OUT_MAX));
        true
    }

    /// Keys handed out so far.
    pub(super) fn handed_out(&self) -> u64 {
        self.handed_out
    }

    /// Whether keys it handed out may still be read.
    pub(super) fn has_live_hand_outs(&self) -> bool {
        self.live_hand_outs > 0
    }

    /// The consumers of the keys handed out so far are done: the spaces
    /// only they needed go.
    pub(super) fn release_hand_outs(&mut self) -> Result<(), SpillError> {
        let kept = std::mem::take(&mut self.kept_spaces);
        self.forget_spaces(kept)?;
        self.live_hand_outs = 0;
        Ok(())
    }

    /// Whether some window has panes in the store.
    pub(super) fn has_spilled(&self) -> bool {
        !self.windows.is_empty()
    }

    /// Whether a window is being emitted.
    pub(super) fn is_draining(&self) -> bool {
        !self.drains.is_empty()
    }

    /// The earliest hold of the spilled windows.
    pub(super) fn hold(&self) -> Option<Timestamp> {
        self.windows.values().filter_map(|w| w.holds.min()).min()
    }

    /// Writes a run if the buffer's memory holds more than the limit past
    /// what the last spill had to leave there.
    pub(super) fn maybe_spill(
        &mut self,
        buffer: &mut BufferSide<'_, impl Spillable>,
        input_watermark: Timestamp,
    ) -> Result<(), GroupingError> {
        if self.over_limit(buffer.memory.bytes()) {
            self.pinned = self.write_run(buffer, input_watermark, None)?;
        }
        Ok(())
    }

    /// See [`super::BufferSpill::over_limit`].
    pub(super) fn over_limit(&self, bytes: usize) -> bool {
        bytes > self.limit + self.pinned
    }

    /// The spilled window `window`, created (with its store prefix) if new.
    fn window(
        &mut self,
        window: &Window,
        window_coder: &Coder,
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

    /// Writes every pane in the buffer's memory that may spill
    /// ([`may_spill`]) — of the windows in `only`, if given — to the store
    /// as one run, their holds to their windows', and has the memory hand
    /// them over; the bytes it kept.
    fn write_run(
        &mut self,
        buffer: &mut BufferSide<'_, impl Spillable>,
        input_watermark: Timestamp,
        only: Option<&BTreeSet<Window>>,
    ) -> Result<usize, GroupingError> {
        let (strategy, window_coder) = (buffer.firing.strategy, buffer.firing.window_coder);
        let memory = &mut *buffer.memory;
        let goes = |window: &Window, pane: &Pane| {
            may_spill(strategy, window, pane, input_watermark)
                && only.is_none_or(|only| only.contains(window))
        };
        let run = next_number(&mut self.runs, "runs")?;
        // What goes, by window, sorted by key; the holds move to the
        // windows' as it is picked.
        // (Most panes are in the window of the pane before: that is looked
        // at first.)
        let mut by_window: Vec<(Window, Vec<SortedKey>)> = Vec::new();
        let mut group_of: BTreeMap<Window, usize> = BTreeMap::new();
        let mut last = None;
        let mut keys = 0usize;
        for (at, (key, windows)) in memory.entries().enumerate() {
            keys += 1;
            for (window, pane) in windows {
                if pane.count() == 0 || !goes(window, pane) {
                    continue;
                }
                let group = match last.filter(|&g: &usize| by_window[g].0 == *window) {
                    Some(group) => group,
                    None => match group_of.get(window) {
                        Some(&group) => group,
                        None => {
                            let spilled = self.window(window, window_coder)?;
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
                if let Some(h) = pane.hold(strategy, window) {
                    if let Some(spilled) = self.windows.get_mut(window) {
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
                    .then_with(|| key_order(memory.entry_at(a.at).0, memory.entry_at(b.at).0))
            });
            let Some(spilled) = self.windows.get(&window) else {
                continue;
            };
            let mut blocks =
                BlockWriter::new(&spilled.start, run, self.out_of_line(&spilled.start));
            for k in &keys {
                let (key, windows) = memory.entry_at(k.at);
                let Ok(at) = position(windows, &window) else {
                    continue;
                };
                let end = window.max_timestamp();
                let (store, bytes) = (self.store.as_ref(), &mut self.spilled_bytes);
                blocks.push(key, &windows[at].1, end, &mut writer, store, bytes)?;
            }
            blocks.flush(&mut writer, self.store.as_ref(), &mut self.spilled_bytes)?;
            spilled_panes += keys.len();
        }
        writer.flush(self.store.as_ref(), &mut self.spilled_bytes)?;
        let bytes = memory.bytes();
        let kept_bytes = memory.hand_over_panes(strategy, goes);
        tracing::debug!(
            run,
            keys,
            spilled_panes,
            bytes,
            kept_bytes,
            spilled_total = self.spilled_bytes,
            "GroupByKey buffer spilled"
        );
        Ok(kept_bytes)
    }

    /// Everything of this buffer's range still in the store (for a
    /// checkpoint), with what drains hold, by window. An error once a key
    /// was handed out: its values are in the store only, and elements
    /// waiting downstream name them by a token no restore could honour.
    fn read_back(&self, trigger: &Trigger) -> Result<Vec<(Window, Bytes, Pane)>, SpillError> {
        if self.live_hand_outs > 0 {
            return Err(SpillError(format!(
                "a GroupByKey handed {} key(s) too large for memory to its consumers as \
                 state-backed iterables, whose values only the spill space holds: no checkpoint \
                 can be taken until its consumers are done with them",
                self.live_hand_outs
            )));
        }
        let mut out = Vec::new();
        let store = self.store.as_ref();
        let mut add = |window: &Window, start: &[u8], records: Vec<Record>| {
            for Record { key, part } in records {
                let part = self.resolved(start, &key, part)?;
                out.push((window.clone(), key, part.into_pane(trigger)));
            }
            Ok::<(), SpillError>(())
        };
        for drain in &self.drains {
            add(drain.window(), drain.start(), drain.rest(store)?)?;
        }
        for (window, spilled) in &self.windows {
            if !spilled.draining {
                let records = blocks::read_all(&PagedRange::prefixed(&spilled.start), store)?;
                add(window, &spilled.start, records)?;
            }
        }
        Ok(out)
    }

    /// For a checkpoint: every spilled pane read back, merged into `panes`.
    pub(super) fn read_back_into(
        &self,
        panes: &mut BTreeMap<Bytes, KeyPanes>,
        trigger: &Trigger,
    ) -> Result<(), SpillError> {
        for (window, key, pane) in self.read_back(trigger)? {
            let windows = panes.entry(key).or_default();
            match position(windows, &window) {
                Ok(at) => windows[at].1.absorb(pane),
                Err(at) => windows.insert(at, (window, pane)),
            }
        }
        Ok(())
    }

    /// After a restore: forgets what was spilled before (the checkpoint
    /// holds it) — on a durable spill space, all but the windows `named` names,
    /// which are put back.
    pub(super) fn reset(&mut self, named: Option<SpilledWindows>) -> Result<(), GroupingError> {
        self.drains.clear();
        self.pinned = 0;
        self.live_hand_outs = 0;
        self.kept_spaces.clear();
        if self.reclaim.is_durable() {
            self.restore(named.unwrap_or_default())?;
        } else {
            delete_prefix(self.store.as_ref(), &self.prefix)?;
            self.windows.clear();
            if named.is_some_and(|n| n.names_windows()) {
                return Err(GroupingError::Spill(SpillError(
                    "the checkpoint names spilled windows of a GroupByKey that has no durable \
                     store here"
                        .into(),
                )));
            }
        }
        Ok(())
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
    fn out_of_line(&self, start: &[u8]) -> Option<(Vec<u8>, Coder)> {
        let coder = self.value_coder.clone()?;
        Some((self.window_space(start), coder))
    }

    /// Deletes the window whose entries start with `start` (it was
    /// emitted or came back into memory): its entries, and its out-of-line
    /// space unless `keep_out_of_line` (keys it handed out are read from
    /// there). On a durable spill space, once no checkpoint a restore may read
    /// names it.
    fn forget_window(&mut self, start: &[u8], keep_out_of_line: bool) -> Result<(), SpillError> {
        let mut spaces = vec![start.to_vec()];
        if !keep_out_of_line {
            spaces.push(self.window_space(start));
        }
        self.forget_spaces(spaces)
    }

    /// Deletes everything under each of `spaces`: at once on scratch, on a
    /// durable spill space once a later checkpoint is durable.
    fn forget_spaces(&mut self, spaces: Vec<Vec<u8>>) -> Result<(), SpillError> {
        let store = &self.store;
        self.reclaim
            .consumed(spaces, |space| delete_prefix(store.as_ref(), space))
    }
}

impl Drop for WindowSpill {
    /// Spilled bytes on scratch are gone with the buffer; on a durable
    /// store they are the checkpoints', and go with the job.
    fn drop(&mut self) {
        if !self.reclaim.is_durable() {
            drop_prefix(self.store.as_ref(), &self.prefix);
        }
    }
}
