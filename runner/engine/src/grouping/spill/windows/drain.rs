//! Emitting spilled windows once the watermark passes them, or taking
//! them back into memory.
//!
//! A spilled window the watermark passed and closed is *drained*: its
//! panes still in memory go to the store as one last run, then its runs
//! are merged ([`MergedRuns`]) and its keys emitted one at a time, each
//! with all its parts, a few megabytes per call, through the buffer's
//! [`Firing`]. A key too large for memory is handed out as a state-backed
//! iterable instead, where the buffer's consumers allow it (`large`). A
//! window that stays open for late data is taken back into memory, as
//! panes that have not fired, and fires from there.

use bytes::Bytes;
use smallvec::SmallVec;

use super::WindowSpill;
use crate::grouping::fired::Fired;
use crate::grouping::firing::{expired, Firing};
use crate::grouping::pane::Pane;
use crate::grouping::spill::blocks::{self, MergedRuns, Record};
use crate::grouping::spill::encoding::SpilledPane;
use crate::grouping::spill::{large, BufferSide, RunWriter, Spillable};
use crate::grouping::GroupingError;
use crate::plan::Trigger;
use crate::spill::{PagedRange, SpillError, SpillSpace};
use crate::time::Timestamp;
use crate::trigger::TriggerContext;
use crate::window::Window;

/// A spilled window being emitted, key by key.
#[derive(Debug)]
pub(super) struct Drain {
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

impl Drain {
    /// The window it emits.
    pub(super) fn window(&self) -> &Window {
        &self.window
    }

    /// The store key prefix of its window's entries.
    pub(super) fn start(&self) -> &[u8] {
        &self.start
    }

    /// Every record it has not emitted yet (for a checkpoint).
    pub(super) fn rest(&self, store: &dyn SpillSpace) -> Result<Vec<Record>, SpillError> {
        self.runs.rest(store)
    }

    /// The next key, or `None` when the window is done: its whole pane
    /// (its runs in order), or, if `spill` hands out keys and its parts
    /// add up to more than it allows, a pane without values and the token
    /// its consumers read them by (its parts that were in blocks are
    /// copied out of line first, so that the token covers every part).
    fn next_group(
        &mut self,
        spill: &WindowSpill,
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
                spill.resolved(&self.start, &key, part)?.add_to(&mut pane);
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
            part.add_to(&mut pane);
        }
        writer.flush(store, &mut copied)?;
        self.handed_out = true;
        tracing::debug!(
            bytes,
            values = pane.count(),
            "a key too large for memory handed out"
        );
        Ok(Some(DrainedKey::HandedOut(key, pane, large::token(&space))))
    }
}

impl WindowSpill {
    /// Starts emitting every spilled window the watermark has passed and
    /// closed: its in-memory panes that have not fired go to the store as
    /// one last run (their holds to the window's), so that a drain only
    /// merges runs. A spilled window the watermark has passed but which
    /// stays open for late data comes back into memory instead
    /// ([`Self::bring_back`]).
    pub(in crate::grouping::spill) fn start_drains(
        &mut self,
        buffer: &mut BufferSide<'_, impl Spillable>,
        input_watermark: Timestamp,
    ) -> Result<(), GroupingError> {
        let strategy = buffer.firing.strategy;
        let mut ready = std::collections::BTreeSet::new();
        let mut open = Vec::new();
        for (window, spilled) in &self.windows {
            if spilled.draining || window.max_timestamp() >= input_watermark {
                continue;
            }
            if expired(strategy, window, input_watermark) {
                ready.insert(window.clone());
            } else {
                open.push(window.clone());
            }
        }
        for window in open {
            self.bring_back(buffer, &window)?;
        }
        if ready.is_empty() {
            return Ok(());
        }
        // (A pane that fired came back with its window and closes from
        // memory; `may_spill` leaves it there.)
        self.write_run(buffer, input_watermark, Some(&ready))?;
        for window in ready {
            let Some(spilled) = self.windows.get_mut(&window) else {
                continue;
            };
            spilled.draining = true;
            let start = spilled.start.clone();
            self.drains.push_back(Drain {
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
    fn bring_back(
        &mut self,
        buffer: &mut BufferSide<'_, impl Spillable>,
        window: &Window,
    ) -> Result<(), GroupingError> {
        let (memory, strategy) = (&mut *buffer.memory, buffer.firing.strategy);
        let Some(spilled) = self.windows.remove(window) else {
            return Ok(());
        };
        let store = self.store.as_ref();
        let mut range = PagedRange::prefixed(&spilled.start);
        let mut entries = 0usize;
        loop {
            let page = range.next_page(store)?;
            if page.is_empty() {
                break;
            }
            let mut records = blocks::Records::of_entries(page);
            while let Some(Record { key, part }) = records.next_record()? {
                let part = self.resolved(&spilled.start, &key, part)?;
                entries += 1;
                memory.take_back(strategy, &key, window, |pane| part.add_to(pane));
            }
        }
        self.forget_window(&spilled.start, false)?;
        memory.owe_every_key();
        tracing::debug!(
            entries,
            bytes = memory.bytes(),
            "a spilled window open for late data came back into memory"
        );
        Ok(())
    }

    /// Emits the next keys of ready spilled windows into `out`, until it
    /// holds about `max_bytes` or no window is left to emit; the number of
    /// panes emitted. A window's spilled bytes are deleted once it is out.
    pub(in crate::grouping::spill) fn drain(
        &mut self,
        firing: &Firing,
        input_watermark: Timestamp,
        now: Timestamp,
        out: &mut Fired,
        max_bytes: usize,
    ) -> Result<usize, GroupingError> {
        let mut emitted = 0;
        while out.bytes.len() < max_bytes {
            // Off the queue while it reads, which looks at the spill.
            let Some(mut drain) = self.drains.pop_front() else {
                break;
            };
            let ctx = TriggerContext {
                window_end: drain.window.max_timestamp(),
                watermark: input_watermark,
                now,
            };
            let next = drain.next_group(self, &firing.strategy.trigger);
            let window = drain.window.clone();
            let done = matches!(next, Ok(None));
            if done {
                self.forget_window(&drain.start, drain.handed_out)?;
                if drain.handed_out {
                    let space = self.window_space(&drain.start);
                    self.kept_spaces.push(space);
                }
                self.windows.remove(&drain.window);
            } else {
                self.drains.push_front(drain);
            }
            match next? {
                Some(DrainedKey::Whole(key, mut pane)) => {
                    emitted += firing.emit(&key, &window, &mut pane, &ctx, true, None, out)?;
                }
                Some(DrainedKey::HandedOut(key, mut pane, token)) => {
                    let token = Some(token.as_slice());
                    emitted += firing.emit(&key, &window, &mut pane, &ctx, true, token, out)?;
                    self.handed_out += 1;
                    self.live_hand_outs += 1;
                }
                None => {}
            }
        }
        Ok(emitted)
    }
}
