//! Spilling a grouping buffer that outgrew its share of memory (see
//! [`crate::spill`] for why and where).
//!
//! Only buffers whose trigger first fires when the watermark passes the end
//! of a window ([`crate::plan::Trigger::first_fires_at_window_end`]: the default
//! trigger, or an `AfterWatermark` without early firings — every batch
//! GroupByKey of a pipeline that does not ask for more) spill, and only
//! panes that have not fired: such a pane needs no trigger state, so a
//! spilled pane is just its values, their count and its output-time holds
//! (`encoding`). Windows that do not merge are filed by window
//! (`windows`); sessions, whose windows are only known once a key's pieces
//! are merged, by key (`sessions`). Windows the SDK merges (custom merging
//! window functions) do not spill.
//!
//! The spill space sees the buffer only as the [`BufferSide`] the buffer
//! hands it at each call: its memory, through [`Spillable`], and the
//! [`Firing`] its panes are written and emitted by. Through `Spillable`
//! the spill reads the panes in memory to choose and write what goes, the
//! memory hands those over (forgets them, with their holds and bytes),
//! and takes back what the spill reads from the store. The buffer, in
//! turn, calls [`BufferSpill`]: to spill when it is over its limit, before
//! it evaluates (which may start emitting spilled windows), to emit them
//! a few megabytes at a time, and for checkpoints. Panes emitted from the
//! store fire through the same `Firing` as panes in memory.
//!
//! A spill keeps the output-time holds of what it holds, so the stage's
//! output watermark stays behind everything not yet emitted.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use super::fired::Fired;
use super::firing::Firing;
use super::pane::{KeyPanes, Pane};
use super::GroupingError;
use crate::coder::Coder;
use crate::plan::{WindowFn, WindowingStrategy};
use crate::spill::{delete_prefix, SpillError, SpillSpace};
use crate::time::Timestamp;
use crate::window::Window;

mod blocks;
mod encoding;
mod large;
mod sessions;
mod windows;

pub use large::{read_iterable_page, IterablePage};
use sessions::SessionSpill;
pub(crate) use windows::SpilledWindows;
use windows::WindowSpill;

/// Most bytes written to the store in one batch.
const WRITE_BATCH_BYTES: usize = 8 << 20;

/// What a spill space may do with the panes a buffer holds in memory, and
/// all it sees of the buffer: read them (to choose what goes, and write it
/// in the store's order), have the buffer hand over what it wrote, and
/// give back what it reads from the store. Whatever leaves or comes back
/// takes its holds and bytes with it.
pub(super) trait Spillable {
    /// About how many bytes the panes in memory take (what the spill
    /// limit is checked against).
    fn bytes(&self) -> usize;

    /// Every key in memory with its panes, in the order of the positions
    /// [`Self::entry_at`] takes.
    fn entries(&self) -> impl Iterator<Item = (&[u8], &KeyPanes)>;

    /// The key at position `at` of [`Self::entries`], with its panes.
    fn entry_at(&self, at: u32) -> (&[u8], &KeyPanes);

    /// Forgets every pane `goes` picks (the spill wrote it): keys left
    /// without panes leave, and are owed no look. The bytes that stay.
    fn hand_over_panes(
        &mut self,
        strategy: &WindowingStrategy,
        goes: impl Fn(&Window, &Pane) -> bool,
    ) -> usize;

    /// Hands every key whose panes `stays` rejects to `take` (which writes
    /// it) and forgets it; keys that got data stay owed a look. The bytes
    /// that stay, or `take`'s first error (what was handed over by then is
    /// gone from memory).
    fn hand_over_keys<E>(
        &mut self,
        strategy: &WindowingStrategy,
        stays: impl Fn(&KeyPanes) -> bool,
        take: impl FnMut(&[u8], &KeyPanes) -> Result<(), E>,
    ) -> Result<usize, E>;

    /// Takes values of `key` in `window` back: `fill` adds them to its
    /// pane there, made (unfired) if there is none.
    fn take_back(
        &mut self,
        strategy: &WindowingStrategy,
        key: &[u8],
        window: &Window,
        fill: impl FnOnce(&mut Pane),
    );

    /// Takes `windows` of `key` back, merged with what memory holds of the
    /// key, as of input watermark `watermark`.
    fn take_back_key(
        &mut self,
        strategy: &WindowingStrategy,
        key: &[u8],
        windows: KeyPanes,
        watermark: Timestamp,
    );

    /// Whether some key that got data since the last evaluation has no
    /// panes in memory, or panes `stays` rejects.
    fn touched_beyond(&self, stays: impl Fn(&KeyPanes) -> bool) -> bool;

    /// The earliest watermark at which a pane in memory may need a look
    /// without new data.
    fn next_wake(&self) -> Timestamp;

    /// Every key needs a look at the next evaluation (what came back may
    /// be due).
    fn owe_every_key(&mut self);
}

/// The buffer as it hands itself to its spill space at each call: its
/// panes in memory, seen only as [`Spillable`], and how its panes are
/// windowed, encoded and emitted.
pub(super) struct BufferSide<'a, M> {
    /// The panes in memory.
    pub(super) memory: &'a mut M,
    /// The strategy, window coder and published watermark that panes are
    /// written and emitted by.
    pub(super) firing: Firing<'a>,
}

/// Where a buffer spills, by how it files what it spills.
#[derive(Debug)]
pub(super) enum BufferSpill {
    /// Windows that do not merge: filed by window. (Boxed: a buffer that
    /// does not spill holds neither.)
    ByWindow(Box<WindowSpill>),
    /// Sessions: filed by key, merged when read back. (Boxed: it is the
    /// larger, and rarer.)
    ByKey(Box<SessionSpill>),
}

/// Which of the keys in memory an evaluation may look at while some of
/// the buffer is spilled.
pub(super) enum InMemory {
    /// Every key.
    All,
    /// Only the keys whose panes pass (the others may merge with pieces
    /// in the store).
    Only(fn(&KeyPanes) -> bool),
    /// None: a pass over the store decides at its own watermark, and what
    /// else is owed a look waits for its end.
    None,
}

impl BufferSpill {
    /// Spill space in `store` under `prefix`, used once the buffer holds
    /// more than `limit` bytes, for a buffer with `strategy` whose values
    /// are of `value_coder` (if known: large panes are then written out of
    /// line); `None` if the strategy may not spill (see the module docs).
    /// A `durable` store is one beside the checkpoints, which then name
    /// the spilled windows (`windows::durable`): only a spill filed by
    /// window may use one.
    pub(super) fn new(
        strategy: &WindowingStrategy,
        store: Arc<dyn SpillSpace>,
        prefix: Vec<u8>,
        limit: usize,
        value_coder: Option<Coder>,
        durable: bool,
    ) -> Option<Self> {
        if !strategy.trigger.first_fires_at_window_end() {
            return None;
        }
        match strategy.window_fn {
            WindowFn::Sessions { .. } if !durable => Some(BufferSpill::ByKey(Box::new(
                SessionSpill::new(store, prefix, limit),
            ))),
            WindowFn::Sessions { .. } | WindowFn::Custom { merging: true } => None,
            _ => {
                let mut spill = WindowSpill::new(store, prefix, limit, value_coder);
                if durable {
                    spill.make_durable();
                }
                Some(BufferSpill::ByWindow(Box::new(spill)))
            }
        }
    }

    /// Lets a drain hand a key too large for memory to its consumers as a
    /// state-backed iterable (`large`); whether it may (only a spill filed
    /// by window on scratch does).
    pub(super) fn hand_out_large_keys(&mut self) -> bool {
        match self {
            BufferSpill::ByWindow(spill) => spill.hand_out_large_keys(),
            BufferSpill::ByKey(_) => false,
        }
    }

    /// Keys handed out as state-backed iterables so far.
    pub(super) fn handed_out(&self) -> u64 {
        match self {
            BufferSpill::ByWindow(spill) => spill.handed_out(),
            BufferSpill::ByKey(_) => 0,
        }
    }

    /// Whether keys it handed out may still be read (so no checkpoint can
    /// be taken).
    pub(super) fn has_live_hand_outs(&self) -> bool {
        match self {
            BufferSpill::ByWindow(spill) => spill.has_live_hand_outs(),
            BufferSpill::ByKey(_) => false,
        }
    }

    /// Forgets the keys handed out so far (their consumers are done), and
    /// deletes what only they needed.
    pub(super) fn release_hand_outs(&mut self) -> Result<(), SpillError> {
        match self {
            BufferSpill::ByWindow(spill) => spill.release_hand_outs(),
            BufferSpill::ByKey(_) => Ok(()),
        }
    }

    /// Bytes written to the store so far.
    pub(super) fn spilled_bytes(&self) -> u64 {
        match self {
            BufferSpill::ByWindow(s) => s.spilled_bytes,
            BufferSpill::ByKey(s) => s.spilled_bytes,
        }
    }

    /// Whether some of the buffer's data is in the store.
    pub(super) fn has_spilled(&self) -> bool {
        match self {
            BufferSpill::ByWindow(s) => s.has_spilled(),
            BufferSpill::ByKey(s) => s.holds_data(),
        }
    }

    /// Whether spilled data is ready and waits to be emitted
    /// ([`Self::drain`]).
    pub(super) fn is_draining(&self) -> bool {
        match self {
            BufferSpill::ByWindow(s) => s.is_draining(),
            BufferSpill::ByKey(s) => s.in_pass(),
        }
    }

    /// Whether some of the buffer is on disk where a checkpoint taken now
    /// would have to copy it back.
    pub(super) fn holds_scratch_spill(&self) -> bool {
        match self {
            BufferSpill::ByWindow(s) => s.holds_scratch_spill(),
            BufferSpill::ByKey(s) => s.holds_data(),
        }
    }

    /// The earliest output-time hold of what is in the store.
    pub(super) fn hold(&self) -> Option<Timestamp> {
        match self {
            BufferSpill::ByWindow(s) => s.hold(),
            BufferSpill::ByKey(s) => s.hold(),
        }
    }

    /// Whether memory holding `bytes` is more than the limit, past what
    /// the last spill had to leave there: what makes it spill.
    pub(super) fn over_limit(&self, bytes: usize) -> bool {
        match self {
            BufferSpill::ByWindow(s) => s.over_limit(bytes),
            BufferSpill::ByKey(s) => s.over_limit(bytes),
        }
    }

    /// Whether it holds or emits anything of the buffer's: spilled data,
    /// a drain under way, keys handed out.
    pub(super) fn is_in_use(&self) -> bool {
        self.has_spilled() || self.is_draining() || self.has_live_hand_outs()
    }

    /// Spills if `memory` holds more than the limit (past what the last
    /// spill had to leave there), given the input watermark.
    pub(super) fn maybe_spill(
        &mut self,
        buffer: &mut BufferSide<'_, impl Spillable>,
        input_watermark: Timestamp,
    ) -> Result<(), GroupingError> {
        match self {
            BufferSpill::ByWindow(s) => s.maybe_spill(buffer, input_watermark),
            BufferSpill::ByKey(s) => s.maybe_spill(buffer),
        }
    }

    /// Before an evaluation at `input_watermark`: starts emitting what the
    /// watermark made ready, or takes it back into memory; which keys in
    /// memory the evaluation may look at.
    pub(super) fn prepare_evaluation(
        &mut self,
        buffer: &mut BufferSide<'_, impl Spillable>,
        input_watermark: Timestamp,
    ) -> Result<InMemory, GroupingError> {
        match self {
            BufferSpill::ByWindow(s) => {
                s.start_drains(buffer, input_watermark)?;
                Ok(InMemory::All)
            }
            BufferSpill::ByKey(s) => s.prepare_evaluation(buffer, input_watermark),
        }
    }

    /// Emits the next ready keys from the store into `out`, as the
    /// buffer's panes fire, until it holds about `max_bytes` or nothing
    /// ready is left; the number of panes emitted.
    pub(super) fn drain(
        &mut self,
        buffer: &mut BufferSide<'_, impl Spillable>,
        input_watermark: Timestamp,
        now: Timestamp,
        out: &mut Fired,
        max_bytes: usize,
    ) -> Result<usize, GroupingError> {
        match self {
            BufferSpill::ByWindow(s) => {
                s.drain(&buffer.firing, input_watermark, now, out, max_bytes)
            }
            BufferSpill::ByKey(s) => s.drain(buffer, now, out, max_bytes),
        }
    }

    /// For a checkpoint: every spilled pane read back, merged into `panes`
    /// as memory would have merged it (so the checkpoint needs no spill
    /// store to be restored).
    pub(super) fn read_back_into(
        &self,
        panes: &mut BTreeMap<Bytes, KeyPanes>,
        strategy: &WindowingStrategy,
        window_coder: &Coder,
    ) -> Result<(), SpillError> {
        match self {
            BufferSpill::ByWindow(s) => s.read_back_into(panes, &strategy.trigger),
            BufferSpill::ByKey(s) => s.read_back_into(panes, strategy, window_coder),
        }
    }

    /// After a restore: forgets what was spilled before (the checkpoint
    /// holds it) — on a durable spill space, all but the windows `named` names,
    /// which are put back.
    pub(super) fn reset(&mut self, named: Option<SpilledWindows>) -> Result<(), GroupingError> {
        match self {
            BufferSpill::ByWindow(s) => s.reset(named),
            BufferSpill::ByKey(s) => Ok(s.clear()?),
        }
    }

    /// What a checkpoint taken now may name instead of copying, if it can.
    pub(super) fn named(&self) -> Option<SpilledWindows> {
        match self {
            BufferSpill::ByWindow(s) => s.named_if_possible(),
            BufferSpill::ByKey(_) => None,
        }
    }

    /// Periodic checkpoint `number` was taken.
    pub(super) fn checkpoint_taken(&mut self, number: u64) {
        if let BufferSpill::ByWindow(s) = self {
            s.checkpoint_taken(number);
        }
    }

    /// Checkpoints up to `number` are durable.
    pub(super) fn checkpoint_durable(&mut self, number: u64) -> Result<(), SpillError> {
        match self {
            BufferSpill::ByWindow(s) => s.checkpoint_durable(number),
            BufferSpill::ByKey(_) => Ok(()),
        }
    }
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
        store: &dyn SpillSpace,
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
    fn flush(&mut self, store: &dyn SpillSpace, spilled_bytes: &mut u64) -> Result<(), SpillError> {
        if !self.batch.is_empty() {
            store.put(std::mem::take(&mut self.batch))?;
            *spilled_bytes += std::mem::take(&mut self.bytes) as u64;
        }
        Ok(())
    }
}

/// [`delete_prefix`] when the buffer goes (job done, failed or cancelled):
/// a failure only leaves garbage a restart clears.
fn drop_prefix(store: &dyn SpillSpace, prefix: &[u8]) {
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

#[cfg(test)]
impl BufferSpill {
    /// Bytes the last spill had to leave in memory.
    pub(super) fn pinned(&self) -> usize {
        match self {
            BufferSpill::ByWindow(s) => s.pinned,
            BufferSpill::ByKey(s) => s.pinned,
        }
    }

    /// Runs written so far, by a spill filed by window.
    pub(super) fn runs(&self) -> u32 {
        match self {
            BufferSpill::ByWindow(s) => s.runs,
            BufferSpill::ByKey(_) => 0,
        }
    }

    /// [`Self::prepare_evaluation`] for a spill filed by window only
    /// (tests look in between).
    pub(super) fn start_drains(
        &mut self,
        buffer: &mut BufferSide<'_, impl Spillable>,
        input_watermark: Timestamp,
    ) -> Result<(), GroupingError> {
        match self {
            BufferSpill::ByWindow(s) => s.start_drains(buffer, input_watermark),
            BufferSpill::ByKey(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod durable_tests;
#[cfg(test)]
mod large_tests;
#[cfg(test)]
mod lateness_tests;
#[cfg(test)]
mod merge_tests;
#[cfg(test)]
mod tests;
