//! Spilling a sessions GroupByKey.
//!
//! A session window is not known until every element of its key is: two
//! elements far apart make two windows until a third between them merges
//! them into one. So a spilled session cannot be filed under its window, as
//! the other spilled buffers file theirs (the parent module); the pieces
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

use super::{
    corrupt, drop_prefix, next_number, put_len, put_spilled_pane, read_spilled_pane, run_key,
    run_key_user_key, take, RunWriter, SpillSpace, SpilledPane,
};
use crate::coder::Coder;
use crate::grouping::key_table::KeyTable;
use crate::grouping::{
    insert_pane, merge_intervals, pane_hold, wake, Evaluation, Fired, Firing, GroupingBuffer,
    GroupingError, KeyPanes, Pane, KEY_OVERHEAD, PANE_OVERHEAD,
};
use crate::holds::Holds;
use crate::spill::{delete_prefix, PagedRange, SpillError, SpillStore};
use crate::time::{earliest, Timestamp, MAX_TIMESTAMP};
use crate::window::Window;

/// A sessions buffer's spill space and what it put there.
#[derive(Debug)]
pub(in crate::grouping) struct SessionSpill {
    store: Arc<dyn SpillStore>,
    /// Every key of this buffer starts with it.
    prefix: Vec<u8>,
    /// Bytes the buffer may hold in memory before it spills.
    pub(in crate::grouping) limit: usize,
    /// Bytes the last spill left in memory (keys kept whole): the next
    /// spill waits until the limit is exceeded past them.
    pub(in crate::grouping) pinned: usize,
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
    pub(in crate::grouping) spilled_bytes: u64,
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
    pub(in crate::grouping) fn new(
        store: Arc<dyn SpillStore>,
        prefix: Vec<u8>,
        limit: usize,
    ) -> Self {
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
    pub(in crate::grouping) fn holds_data(&self) -> bool {
        self.pieces > 0 || self.pass.is_some()
    }

    /// Whether a pass is reading a generation back.
    pub(in crate::grouping) fn in_pass(&self) -> bool {
        self.pass.is_some()
    }

    /// The earliest output-time hold of what is in the store.
    pub(in crate::grouping) fn hold(&self) -> Option<Timestamp> {
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
    pub(in crate::grouping) fn clear(&mut self) -> Result<(), SpillError> {
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
    fn refill(&mut self, store: &dyn SpillStore, window_coder: &Coder) -> Result<(), SpillError> {
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
        store: &dyn SpillStore,
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
    windows.iter().any(|(_, pane)| pane.fired > 0)
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

impl GroupingBuffer {
    /// The sessions spill space, if this buffer has one.
    fn sessions(&self) -> Option<&SessionSpill> {
        match &self.spill {
            Some(SpillSpace::ByKey(s)) => Some(s.as_ref()),
            _ => None,
        }
    }

    /// Writes every buffered key's windows to the current generation as one
    /// run, except keys kept whole ([`kept_whole`]), which stay in memory.
    pub(super) fn spill_sessions(&mut self) -> Result<(), GroupingError> {
        let GroupingBuffer {
            strategy,
            window_coder,
            panes,
            holds,
            spill,
            memory_bytes,
            ..
        } = self;
        let Some(SpillSpace::ByKey(spill)) = spill.as_mut() else {
            return Ok(());
        };
        if panes.is_empty() {
            return Ok(());
        }
        let run = next_number(&mut spill.runs, "runs")?;
        let start = spill.generation_start(spill.generation);
        let mut writer = RunWriter::default();
        let mut encoded_window = Vec::new();
        let mut keys = 0usize;
        // The table is given up (it keeps the room it grew to) and the keys
        // kept whole go to a new one.
        let mut kept = KeyTable::<KeyPanes>::default();
        let mut kept_bytes = 0usize;
        for (key, windows) in std::mem::take(panes).into_entries() {
            if kept_whole(&windows) {
                kept_bytes += key.len()
                    + KEY_OVERHEAD
                    + windows
                        .iter()
                        .map(|(_, p)| p.values.len() + PANE_OVERHEAD)
                        .sum::<usize>();
                *kept.get_or_default(&key) = windows;
                continue;
            }
            let mut v = Vec::new();
            for (window, pane) in &windows {
                if pane.count == 0 {
                    continue;
                }
                if let Some(h) = pane_hold(strategy, window, pane) {
                    holds.remove(h);
                    spill.holds.add(h);
                }
                let end = window.max_timestamp();
                spill.earliest_end = spill.earliest_end.min(end);
                spill.pieces += 1;
                encoded_window.clear();
                window_coder.encode_window(window, &mut encoded_window)?;
                put_piece(&mut v, &encoded_window, pane, end)?;
            }
            if v.is_empty() {
                continue;
            }
            keys += 1;
            let k = run_key(&start, &key, run)?;
            writer.push(spill.store.as_ref(), (k, v), &mut spill.spilled_bytes)?;
        }
        writer.flush(spill.store.as_ref(), &mut spill.spilled_bytes)?;
        tracing::debug!(
            generation = spill.generation,
            run,
            keys,
            bytes = *memory_bytes,
            kept_bytes,
            spilled_total = spill.spilled_bytes,
            "GroupByKey sessions spilled"
        );
        // Keys that got data since the last evaluation stay in `touched`
        // even when they went to the store: late data there makes a pass
        // due.
        *panes = kept;
        *memory_bytes = kept_bytes;
        spill.pinned = kept_bytes;
        Ok(())
    }

    /// [`GroupingBuffer::evaluate`] for a sessions buffer with data in the
    /// store: only keys kept whole fire from memory (any other key's
    /// windows may merge with its pieces in the store), and a pass starts
    /// once the watermark passes the end of some window, or late data
    /// arrived for a key that is not whole. `None` when nothing is spilled
    /// (the buffer evaluates as usual).
    pub(in crate::grouping) fn evaluate_spilled_sessions(
        &mut self,
        input_watermark: Timestamp,
        now: Timestamp,
        out: &mut Fired,
        max_bytes: usize,
    ) -> Result<Option<usize>, GroupingError> {
        let Some(spill) = self.sessions() else {
            return Ok(None);
        };
        if !spill.holds_data() {
            return Ok(None);
        }
        if spill.in_pass() {
            // The pass decides at its own watermark; what else is owed a
            // look waits for its end, which looks at every key.
            self.publish(input_watermark);
            return Ok(Some(0));
        }
        let late_data = self
            .touched
            .iter()
            .any(|key| !self.panes.get(key).is_some_and(kept_whole));
        let due = late_data || input_watermark > spill.earliest_end.min(self.next_wake);
        if due {
            self.spill_sessions()?;
            self.next_wake = MAX_TIMESTAMP;
            // What stayed in memory is looked at below, all of it.
            self.rescan = true;
            if let Some(SpillSpace::ByKey(spill)) = self.spill.as_mut() {
                let generation = next_number(&mut spill.generation, "generations")?;
                let start = spill.generation_start(generation);
                spill.pass = Some(Pass {
                    watermark: input_watermark,
                    hold: spill.holds.min(),
                    range: PagedRange::prefixed(&start),
                    start,
                    page: VecDeque::new(),
                });
                spill.runs = 0;
                spill.pieces = 0;
                spill.earliest_end = MAX_TIMESTAMP;
                spill.holds = Holds::default();
            }
        }
        // The keys kept whole fire from memory (the walk still counts every
        // key's wake point).
        let emitted = self.evaluate_keys(input_watermark, now, out, max_bytes, kept_whole)?;
        self.publish(input_watermark);
        Ok(Some(emitted))
    }

    /// [`GroupingBuffer::drain_spilled`] for a sessions buffer: the next
    /// keys of the pass, until `out` holds about `max_bytes`.
    pub(in crate::grouping) fn drain_sessions(
        &mut self,
        input_watermark: Timestamp,
        now: Timestamp,
        out: &mut Fired,
        max_bytes: usize,
    ) -> Result<usize, GroupingError> {
        let mut emitted = 0;
        while out.bytes.len() < max_bytes {
            let Some(SpillSpace::ByKey(spill)) = self.spill.as_mut() else {
                break;
            };
            let store = spill.store.clone();
            let Some(pass) = spill.pass.as_mut() else {
                break;
            };
            let watermark = pass.watermark;
            match pass.next_key(store.as_ref(), &self.window_coder)? {
                Some((key, pieces)) => {
                    emitted += self.settle_key(&key, pieces, watermark, now, out)?;
                    self.maybe_spill(watermark)?;
                }
                None => {
                    delete_prefix(store.as_ref(), &pass.start)?;
                    spill.pass = None;
                    // Windows put back may be due at the watermark as it is
                    // now: the next evaluation looks.
                    self.rescan = true;
                    break;
                }
            }
        }
        self.publish(input_watermark);
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
        key: &[u8],
        pieces: Vec<(Window, SpilledPane)>,
        watermark: Timestamp,
        now: Timestamp,
        out: &mut Fired,
    ) -> Result<usize, GroupingError> {
        let strategy = &self.strategy;
        // Holds, bytes and wake points of the pieces were the pass's; these
        // are scratch.
        let mut scratch_holds = Holds::default();
        let mut scratch_wake = MAX_TIMESTAMP;
        let mut scratch_bytes = 0usize;
        let mut windows = KeyPanes::new();
        for (window, piece) in pieces {
            let pane = Pane::of_spilled(&strategy.trigger, piece);
            insert_pane(&mut windows, window, pane, strategy, &mut scratch_holds);
        }
        merge_intervals(&mut windows, strategy, &mut scratch_holds);
        let firing = Firing {
            strategy,
            window_coder: &self.window_coder,
            output_watermark: self.output_watermark,
        };
        let mut evaluation = Evaluation::new(
            firing,
            watermark,
            now,
            &mut scratch_holds,
            &mut scratch_wake,
            &mut scratch_bytes,
        );
        evaluation.key(key, &mut windows, out);
        if let Some(e) = evaluation.error {
            return Err(e.into());
        }
        let emitted = evaluation.emitted;
        if windows.is_empty() {
            return Ok(emitted);
        }
        let whole = kept_whole(&windows);
        self.put_back(key, windows, watermark);
        if whole {
            self.take_back_written(key, watermark)?;
        }
        Ok(emitted)
    }

    /// Puts `windows` of `key` into memory, merged with what it has there.
    fn put_back(&mut self, key: &[u8], windows: KeyPanes, watermark: Timestamp) {
        let GroupingBuffer {
            strategy,
            panes,
            holds,
            next_wake,
            memory_bytes,
            ..
        } = self;
        let (kept, new_key) = panes.get_or_insert_with(key, KeyPanes::new);
        if new_key {
            *memory_bytes += key.len() + KEY_OVERHEAD;
        }
        for (window, pane) in windows {
            *memory_bytes += pane.values.len() + PANE_OVERHEAD;
            *next_wake = (*next_wake).min(wake(&window, watermark, strategy.allowed_lateness));
            insert_pane(kept, window, pane, strategy, holds);
        }
        merge_intervals(kept, strategy, holds);
    }

    /// Brings `key`'s pieces in the generation being written back into
    /// memory (and out of the store), so that the key is whole there.
    fn take_back_written(&mut self, key: &[u8], watermark: Timestamp) -> Result<(), GroupingError> {
        let Some(SpillSpace::ByKey(spill)) = self.spill.as_mut() else {
            return Ok(());
        };
        if spill.pieces == 0 {
            return Ok(());
        }
        let start = spill.generation_start(spill.generation);
        let mut prefix = start.clone();
        put_len(&mut prefix, key.len())?;
        prefix.extend_from_slice(key);
        let store = spill.store.clone();
        let entries = PagedRange::prefixed(&prefix).rest(store.as_ref())?;
        if entries.is_empty() {
            return Ok(());
        }
        delete_prefix(store.as_ref(), &prefix)?;
        let mut windows = KeyPanes::new();
        let mut scratch = Holds::default();
        for (k, v) in entries {
            let (_, pieces) = decode_entry(&start, &k, v, &self.window_coder)?;
            for (window, piece) in pieces {
                let pane = Pane::of_spilled(&self.strategy.trigger, piece);
                // The hold it added when it was written, computed again.
                if let Some(h) = pane_hold(&self.strategy, &window, &pane) {
                    spill.holds.remove(h);
                }
                spill.pieces = spill.pieces.saturating_sub(1);
                insert_pane(&mut windows, window, pane, &self.strategy, &mut scratch);
            }
        }
        self.put_back(key, windows, watermark);
        Ok(())
    }

    /// For a checkpoint: every spilled piece read back, merged into `panes`
    /// as memory would have merged it.
    pub(in crate::grouping) fn with_spilled_sessions(
        &self,
        panes: &mut std::collections::BTreeMap<Bytes, KeyPanes>,
    ) -> Result<(), SpillError> {
        let Some(spill) = self.sessions() else {
            return Ok(());
        };
        let trigger = &self.strategy.trigger;
        let mut scratch = Holds::default();
        for (key, window, piece) in spill.read_back(&self.window_coder)? {
            let pane = Pane::of_spilled(trigger, piece);
            let windows = panes.entry(key).or_default();
            insert_pane(windows, window, pane, &self.strategy, &mut scratch);
        }
        for windows in panes.values_mut() {
            merge_intervals(windows, &self.strategy, &mut scratch);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
