//! Spilling a sessions GroupByKey.
//!
//! A session window is not known until every element of its key is: two
//! elements far apart make two windows until a third between them merges
//! them into one. So a spilled session cannot be filed under its window, as
//! the other spilled buffers file theirs (`windows`); the pieces
//! are filed under their *key*, and merged only when they are read back.
//!
//! What is written, under the buffer's prefix: for each *generation* (four
//! bytes, big-endian), for each key (length first) and run (big-endian),
//! one entry holding every window the key had in memory at that run, each
//! with its values, count and output-time holds. A key's runs are thus
//! adjacent, in the order they were written.
//!
//! Once the input watermark passes the end of some spilled or buffered
//! window (or late data arrives for a key that may have pieces in the
//! store), a *pass* starts: what is in memory is written out as one more
//! run, later data goes to the next generation, and the generation is read
//! back key by key. Each key's pieces are merged as they would have been
//! in memory and evaluated as memory would have been at the watermark the
//! pass started at: windows past their end fire, closed ones are emitted
//! for the last time and dropped, and the others go back into memory,
//! where later data merges with them (and which spills again, to the next
//! generation, if they outgrow it). The generation is deleted when the
//! pass is done.
//!
//! With allowed lateness a window stays open after its on-time pane, as a
//! pane that fired, for late data to join. A spilled pane comes back as
//! one that has not fired, so such a window may not spill; nor may the
//! rest of its key, which late data could merge with it: a key with a
//! window that fired stays *whole* in memory until that window closes.
//! The pass that fires a key's window takes the key's pieces that the
//! generation being written holds (data that arrived during the pass)
//! back into memory, so that a whole key has nothing in the store; such
//! keys are then evaluated in memory as usual, while the others wait for
//! a pass. What stays whole counts against the limit, and the next spill
//! waits until the buffer outgrows its limit past it.
//!
//! The pass decides at the watermark it started at, as an evaluation
//! would have at that watermark. Data that arrives while it runs is
//! buffered in memory as for any evaluation the buffer has not done yet
//! (one postponed by backpressure, say): for a key the pass has not
//! reached, it stays out of the windows the pass emits (they were closed
//! at that watermark), and it merges with the windows the pass puts back.
//!
//! Cost: a batch pipeline's input watermark jumps to the end of time once,
//! so its spilled sessions are read once. A streaming one re-reads what it
//! spilled whenever a session may close — the price of not keeping a
//! per-key index in memory, which for many keys is what did not fit.
//!
//! A pass holds the stage's output watermark at the earliest hold of what
//! it read until it is done; spilled pieces hold at their own output time,
//! which is never later than that of the window they merge into.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use super::encoding::{
    corrupt, put_len, put_spilled_pane, read_spilled_pane, run_key, run_key_user_key, take,
    SpilledPane,
};
use super::{drop_prefix, next_number, BufferSide, InMemory, RunWriter, Spillable};
use crate::coder::Coder;
use crate::grouping::fired::Fired;
use crate::grouping::firing::Evaluation;
use crate::grouping::merging::merge_intervals;
use crate::grouping::pane::{insert_pane, KeyPanes, Pane};
use crate::grouping::GroupingError;
use crate::holds::Holds;
use crate::plan::WindowingStrategy;
use crate::spill::{delete_prefix, PagedRange, SpillError, SpillSpace};
use crate::time::{earliest, Timestamp, MAX_TIMESTAMP};
use crate::window::Window;

/// A sessions buffer's spill space and what it put there.
#[derive(Debug)]
pub(in crate::grouping) struct SessionSpill {
    store: Arc<dyn SpillSpace>,
    /// Every key of this buffer starts with it.
    prefix: Vec<u8>,
    /// Bytes the buffer may hold in memory before it spills.
    limit: usize,
    /// Bytes the last spill left in memory (keys kept whole): the next
    /// spill waits until the limit is exceeded past them.
    pub(super) pinned: usize,
    /// The generation runs are written to now.
    generation: u32,
    /// Runs written to it so far (the next run's number).
    runs: u32,
    /// Pieces (a key's window) written to it.
    pieces: usize,
    /// The earliest end of those pieces: no pass is due before the
    /// watermark passes it.
    earliest_end: Timestamp,
    /// Their output-time holds.
    holds: Holds,
    /// Bytes written to the store so far.
    pub(super) spilled_bytes: u64,
    /// The generation being read back and emitted, if any.
    pass: Option<Pass>,
}

/// A key and its spilled pieces (window and pane), as read back.
type KeyPieces = (Bytes, Vec<(Window, SpilledPane)>);

/// A generation being read back, key by key.
#[derive(Debug)]
struct Pass {
    /// Windows that end before it are emitted.
    watermark: Timestamp,
    /// The earliest hold of everything it read (held until it is done).
    hold: Option<Timestamp>,
    /// The generation's first key.
    start: Vec<u8>,
    /// Entries read from the store and not merged yet: (key, pieces).
    page: VecDeque<KeyPieces>,
    /// What is left to read of the generation.
    range: PagedRange,
}

impl SessionSpill {
    /// Spill space under `prefix`, used once the buffer holds `limit` bytes.
    pub(super) fn new(store: Arc<dyn SpillSpace>, prefix: Vec<u8>, limit: usize) -> Self {
        SessionSpill {
            store,
            prefix,
            limit,
            pinned: 0,
            generation: 0,
            runs: 0,
            pieces: 0,
            earliest_end: MAX_TIMESTAMP,
            holds: Holds::default(),
            spilled_bytes: 0,
            pass: None,
        }
    }

    /// Whether some of the buffer's data is in the store (written, or
    /// being read back).
    pub(super) fn holds_data(&self) -> bool {
        self.pieces > 0 || self.pass.is_some()
    }

    /// Whether a pass is reading a generation back.
    pub(super) fn in_pass(&self) -> bool {
        self.pass.is_some()
    }

    /// The earliest output-time hold of what is in the store.
    pub(super) fn hold(&self) -> Option<Timestamp> {
        earliest(self.holds.min(), self.pass.as_ref().and_then(|p| p.hold))
    }

    /// The first store key of generation `generation`.
    fn generation_start(&self, generation: u32) -> Vec<u8> {
        let mut start = self.prefix.clone();
        start.extend_from_slice(&generation.to_be_bytes());
        start
    }

    /// Forgets everything written (after a restore, which brought it back
    /// into memory).
    pub(super) fn clear(&mut self) -> Result<(), SpillError> {
        delete_prefix(self.store.as_ref(), &self.prefix)?;
        self.runs = 0;
        self.pieces = 0;
        self.earliest_end = MAX_TIMESTAMP;
        self.holds = Holds::default();
        self.pass = None;
        self.pinned = 0;
        Ok(())
    }

    /// Every spilled piece still unread, by key (for a checkpoint).
    fn read_back(
        &self,
        window_coder: &Coder,
    ) -> Result<Vec<(Bytes, Window, SpilledPane)>, SpillError> {
        let mut out = Vec::new();
        let store = self.store.as_ref();
        let mut read = |start: &[u8], range: &PagedRange| {
            for (k, v) in range.rest(store)? {
                let (key, pieces) = decode_entry(start, &k, v, window_coder)?;
                out.extend(pieces.into_iter().map(|(w, p)| (key.clone(), w, p)));
            }
            Ok::<(), SpillError>(())
        };
        if let Some(pass) = &self.pass {
            read(&pass.start, &pass.range)?;
        }
        if self.pieces > 0 {
            let start = self.generation_start(self.generation);
            read(&start, &PagedRange::prefixed(&start))?;
        }
        if let Some(pass) = &self.pass {
            for (key, pieces) in &pass.page {
                for (window, piece) in pieces {
                    out.push((key.clone(), window.clone(), piece.clone()));
                }
            }
        }
        Ok(out)
    }
}

impl Drop for SessionSpill {
    /// Spilled bytes are scratch: gone with the buffer.
    fn drop(&mut self) {
        drop_prefix(self.store.as_ref(), &self.prefix);
    }
}

impl Pass {
    /// Reads the next page from the store if the current one is used up.
    fn refill(&mut self, store: &dyn SpillSpace, window_coder: &Coder) -> Result<(), SpillError> {
        if !self.page.is_empty() {
            return Ok(());
        }
        for (k, v) in self.range.next_page(store)? {
            self.page
                .push_back(decode_entry(&self.start, &k, v, window_coder)?);
        }
        Ok(())
    }

    /// The next key and every piece of it (all its runs), or `None` when
    /// the generation is read out.
    fn next_key(
        &mut self,
        store: &dyn SpillSpace,
        window_coder: &Coder,
    ) -> Result<Option<KeyPieces>, SpillError> {
        self.refill(store, window_coder)?;
        let Some((key, mut pieces)) = self.page.pop_front() else {
            return Ok(None);
        };
        self.refill(store, window_coder)?;
        while self.page.front().is_some_and(|(k, _)| *k == key) {
            if let Some((_, more)) = self.page.pop_front() {
                pieces.extend(more);
            }
            self.refill(store, window_coder)?;
        }
        Ok(Some((key, pieces)))
    }
}

/// Whether a key's windows stay in memory, whole, until the one that
/// fired closes (see the module docs).
fn kept_whole(windows: &KeyPanes) -> bool {
    windows.iter().any(|(_, pane)| pane.has_fired())
}

/// Appends a spilled piece's stored form.
fn put_piece(
    out: &mut Vec<u8>,
    window: &[u8],
    pane: &Pane,
    end: Timestamp,
) -> Result<(), SpillError> {
    put_len(out, window.len())?;
    out.extend_from_slice(window);
    put_spilled_pane(out, pane, end);
    Ok(())
}

/// Reads a stored entry of the generation whose keys start with `start`:
/// its key and its pieces (windows in `window_coder`'s form).
fn decode_entry(
    start: &[u8],
    key: &[u8],
    value: Vec<u8>,
    window_coder: &Coder,
) -> Result<KeyPieces, SpillError> {
    let value = Bytes::from(value);
    let user_key = run_key_user_key(start, key)?;
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < value.len() {
        let window_len = u32::from_be_bytes(take::<4>(&value, at, "window length")?) as usize;
        at += 4;
        let window = value
            .get(at..at + window_len)
            .ok_or_else(|| corrupt("window"))?;
        let (window, _) = window_coder
            .decode_window(window)
            .map_err(|e| corrupt(&e.to_string()))?;
        let (piece, end) = read_spilled_pane(&value, at + window_len)?;
        at = end;
        pieces.push((window, piece));
    }
    Ok((Bytes::copy_from_slice(user_key), pieces))
}

impl SessionSpill {
    /// Spills the buffer's memory if it holds more than the limit past
    /// what the last spill had to leave there.
    pub(super) fn maybe_spill(
        &mut self,
        buffer: &mut BufferSide<'_, impl Spillable>,
    ) -> Result<(), GroupingError> {
        if self.over_limit(buffer.memory.bytes()) {
            self.spill(buffer)?;
        }
        Ok(())
    }

    /// See [`super::BufferSpill::over_limit`].
    pub(super) fn over_limit(&self, bytes: usize) -> bool {
        bytes > self.limit + self.pinned
    }

    /// Writes every key in the buffer's memory to the current generation
    /// as one run, except keys kept whole ([`kept_whole`]), which stay in
    /// memory.
    fn spill(&mut self, buffer: &mut BufferSide<'_, impl Spillable>) -> Result<(), GroupingError> {
        let (strategy, window_coder) = (buffer.firing.strategy, buffer.firing.window_coder);
        let memory = &mut *buffer.memory;
        if memory.entries().next().is_none() {
            return Ok(());
        }
        let run = next_number(&mut self.runs, "runs")?;
        let start = self.generation_start(self.generation);
        let mut writer = RunWriter::default();
        let mut encoded_window = Vec::new();
        let mut keys = 0usize;
        let bytes = memory.bytes();
        let kept_bytes = memory.hand_over_keys(
            strategy,
            kept_whole,
            |key, windows| -> Result<(), GroupingError> {
                let mut v = Vec::new();
                for (window, pane) in windows {
                    if pane.count() == 0 {
                        continue;
                    }
                    if let Some(h) = pane.hold(strategy, window) {
                        self.holds.add(h);
                    }
                    let end = window.max_timestamp();
                    self.earliest_end = self.earliest_end.min(end);
                    self.pieces += 1;
                    encoded_window.clear();
                    window_coder.encode_window(window, &mut encoded_window)?;
                    put_piece(&mut v, &encoded_window, pane, end)?;
                }
                if v.is_empty() {
                    return Ok(());
                }
                keys += 1;
                let k = run_key(&start, key, run)?;
                writer.push(self.store.as_ref(), (k, v), &mut self.spilled_bytes)?;
                Ok(())
            },
        )?;
        writer.flush(self.store.as_ref(), &mut self.spilled_bytes)?;
        tracing::debug!(
            generation = self.generation,
            run,
            keys,
            bytes,
            kept_bytes,
            spilled_total = self.spilled_bytes,
            "GroupByKey sessions spilled"
        );
        // Keys that got data since the last evaluation stay owed a look
        // even when they went to the store: late data there makes a pass
        // due.
        self.pinned = kept_bytes;
        Ok(())
    }

    /// Before an evaluation at `input_watermark` of a buffer with data in
    /// the store: only keys kept whole fire from memory (any other key's
    /// windows may merge with its pieces in the store), and a pass starts
    /// once the watermark passes the end of some window, or late data
    /// arrived for a key that is not whole. Every key, when nothing is
    /// spilled (the buffer evaluates as usual); none while a pass runs.
    pub(super) fn prepare_evaluation(
        &mut self,
        buffer: &mut BufferSide<'_, impl Spillable>,
        input_watermark: Timestamp,
    ) -> Result<InMemory, GroupingError> {
        if !self.holds_data() {
            return Ok(InMemory::All);
        }
        if self.in_pass() {
            // The pass decides at its own watermark; what else is owed a
            // look waits for its end, which looks at every key.
            return Ok(InMemory::None);
        }
        let late_data = buffer.memory.touched_beyond(kept_whole);
        let due = late_data || input_watermark > self.earliest_end.min(buffer.memory.next_wake());
        if due {
            self.spill(buffer)?;
            // What stayed in memory is looked at now, all of it.
            buffer.memory.owe_every_key();
            let generation = next_number(&mut self.generation, "generations")?;
            let start = self.generation_start(generation);
            self.pass = Some(Pass {
                watermark: input_watermark,
                hold: self.holds.min(),
                range: PagedRange::prefixed(&start),
                start,
                page: VecDeque::new(),
            });
            self.runs = 0;
            self.pieces = 0;
            self.earliest_end = MAX_TIMESTAMP;
            self.holds = Holds::default();
        }
        // The keys kept whole fire from memory (the walk still counts every
        // key's wake point).
        Ok(InMemory::Only(kept_whole))
    }

    /// The next keys of the pass, emitted as the buffer's panes fire
    /// until `out` holds about `max_bytes`; what stays open goes back into
    /// the buffer's memory.
    pub(super) fn drain(
        &mut self,
        buffer: &mut BufferSide<'_, impl Spillable>,
        now: Timestamp,
        out: &mut Fired,
        max_bytes: usize,
    ) -> Result<usize, GroupingError> {
        let mut emitted = 0;
        while out.bytes.len() < max_bytes {
            let store = self.store.clone();
            let Some(pass) = self.pass.as_mut() else {
                break;
            };
            let watermark = pass.watermark;
            match pass.next_key(store.as_ref(), buffer.firing.window_coder)? {
                Some((key, pieces)) => {
                    emitted += self.settle_key(buffer, &key, pieces, watermark, now, out)?;
                    self.maybe_spill(buffer)?;
                }
                None => {
                    delete_prefix(store.as_ref(), &pass.start)?;
                    self.pass = None;
                    // Windows put back may be due at the watermark as it is
                    // now: the next evaluation looks.
                    buffer.memory.owe_every_key();
                    break;
                }
            }
        }
        Ok(emitted)
    }

    /// Merges one key's spilled pieces and evaluates them as memory would
    /// have at `watermark` (firing the windows past their end, dropping the
    /// closed ones), then puts what stays open back into memory, merged
    /// with what the key has there; how many panes it emitted. A key left
    /// with a window that fired is kept whole: its pieces in the generation
    /// being written come back too.
    fn settle_key(
        &mut self,
        buffer: &mut BufferSide<'_, impl Spillable>,
        key: &[u8],
        pieces: Vec<(Window, SpilledPane)>,
        watermark: Timestamp,
        now: Timestamp,
        out: &mut Fired,
    ) -> Result<usize, GroupingError> {
        let strategy = buffer.firing.strategy;
        // Holds, bytes and wake points of the pieces were the pass's; these
        // are scratch.
        let mut scratch_holds = Holds::default();
        let mut scratch_wake = MAX_TIMESTAMP;
        let mut scratch_bytes = 0usize;
        let mut windows = KeyPanes::new();
        for (window, piece) in pieces {
            let pane = piece.into_pane(&strategy.trigger);
            insert_pane(&mut windows, window, pane, strategy, &mut scratch_holds);
        }
        merge_intervals(&mut windows, strategy, &mut scratch_holds);
        let mut evaluation = Evaluation::new(
            buffer.firing,
            watermark,
            now,
            &mut scratch_holds,
            &mut scratch_wake,
            &mut scratch_bytes,
        );
        evaluation.key(key, &mut windows, out);
        let emitted = evaluation.finish()?;
        if windows.is_empty() {
            return Ok(emitted);
        }
        let whole = kept_whole(&windows);
        buffer
            .memory
            .take_back_key(strategy, key, windows, watermark);
        if whole {
            self.take_back_written(buffer, key, watermark)?;
        }
        Ok(emitted)
    }

    /// Brings `key`'s pieces in the generation being written back into
    /// memory (and out of the store), so that the key is whole there.
    fn take_back_written(
        &mut self,
        buffer: &mut BufferSide<'_, impl Spillable>,
        key: &[u8],
        watermark: Timestamp,
    ) -> Result<(), GroupingError> {
        let (strategy, window_coder) = (buffer.firing.strategy, buffer.firing.window_coder);
        if self.pieces == 0 {
            return Ok(());
        }
        let start = self.generation_start(self.generation);
        let mut prefix = start.clone();
        put_len(&mut prefix, key.len())?;
        prefix.extend_from_slice(key);
        let store = self.store.clone();
        let entries = PagedRange::prefixed(&prefix).rest(store.as_ref())?;
        if entries.is_empty() {
            return Ok(());
        }
        delete_prefix(store.as_ref(), &prefix)?;
        let mut windows = KeyPanes::new();
        let mut scratch = Holds::default();
        for (k, v) in entries {
            let (_, pieces) = decode_entry(&start, &k, v, window_coder)?;
            for (window, piece) in pieces {
                let pane = piece.into_pane(&strategy.trigger);
                // The hold it added when it was written, computed again.
                if let Some(h) = pane.hold(strategy, &window) {
                    self.holds.remove(h);
                }
                self.pieces = self.pieces.saturating_sub(1);
                insert_pane(&mut windows, window, pane, strategy, &mut scratch);
            }
        }
        buffer
            .memory
            .take_back_key(strategy, key, windows, watermark);
        Ok(())
    }

    /// For a checkpoint: every spilled piece read back, merged into `panes`
    /// as memory would have merged it.
    pub(super) fn read_back_into(
        &self,
        panes: &mut std::collections::BTreeMap<Bytes, KeyPanes>,
        strategy: &WindowingStrategy,
        window_coder: &Coder,
    ) -> Result<(), SpillError> {
        let mut scratch = Holds::default();
        for (key, window, piece) in self.read_back(window_coder)? {
            let pane = piece.into_pane(&strategy.trigger);
            let windows = panes.entry(key).or_default();
            insert_pane(windows, window, pane, strategy, &mut scratch);
        }
        for windows in panes.values_mut() {
            merge_intervals(windows, strategy, &mut scratch);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
