//! A GroupByKey's spill on a durable spill space, named by checkpoints.
//!
//! In a streaming job a window may stay spilled for as long as it is open
//! — hours, for a daily window — and a checkpoint that had to copy it
//! would hold it all in memory again, so on scratch disk periodic
//! checkpoints wait until it is emitted. Beside the checkpoints instead
//! (the runner's state database), a checkpoint names what is there: runs
//! are never rewritten, so a spilled window is its prefix, the runs that
//! wrote to it and the holds of its panes, and the buffer's next run
//! number says which runs came after the checkpoint.
//!
//! Windows (filed by window, [`super::WindowSpill`]) get a fresh prefix each
//! time they spill anew — the window, then a number never reused — so a
//! window emitted before a checkpoint (whose data the checkpoint does not
//! name) and one spilled after never share keys. A restore therefore
//! deletes everything under the buffer's prefix except the named windows'
//! spaces, and in those, the runs numbered from the checkpoint's next one
//! on (out-of-line parts those runs wrote are rewritten, never joined,
//! when their numbers are used again, and go with their window). While
//! running, an emitted window's data is deleted only once a later
//! checkpoint is durable (`Reclaim`).
//!
//! A checkpoint can name a buffer's spill only between drains: while a
//! window is being emitted (its keys partly out), periodic checkpoints
//! wait, as on scratch. Such a buffer hands no key out as a state-backed
//! iterable (the SDK's reads of a token go to the job's spill space).
//! Sessions (filed by key) keep to scratch.

use serde::{Deserialize, Serialize};

use super::{SpilledWindow, WindowSpill};
use crate::holds::Holds;
use crate::spill::{prefix_end, Reclaim, SpillError, SpillSpace};
use crate::time::Timestamp;
use crate::window::Window;

/// A spilled window as a checkpoint names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct NamedWindow {
    window: Window,
    start: Vec<u8>,
    /// Its panes' holds: (timestamp, how many).
    holds: Vec<(Timestamp, usize)>,
    runs: Vec<u32>,
}

/// What a checkpoint keeps of a buffer's spill on a durable spill space.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpilledWindows {
    /// The number of the first run after the checkpoint.
    runs: u32,
    next_window: u64,
    /// Sorted by window.
    windows: Vec<NamedWindow>,
}

impl SpilledWindows {
    /// Whether some window's data is named (a restore must find it).
    pub(crate) fn names_windows(&self) -> bool {
        !self.windows.is_empty()
    }
}

impl WindowSpill {
    /// Whether a checkpoint taken now can name what is on disk: the store
    /// is durable, no window is being emitted, and no key handed out may
    /// still be read.
    fn can_name(&self) -> bool {
        self.reclaim.is_durable() && self.drains.is_empty() && self.live_hand_outs == 0
    }

    fn named(&self) -> SpilledWindows {
        SpilledWindows {
            runs: self.runs,
            next_window: self.next_window,
            windows: self
                .windows
                .iter()
                .map(|(window, spilled)| NamedWindow {
                    window: window.clone(),
                    start: spilled.start.clone(),
                    holds: spilled.holds.entries(),
                    runs: spilled.runs.clone(),
                })
                .collect(),
        }
    }

    /// Deletes what `record` does not name (see the module docs) and puts
    /// its windows back.
    pub(super) fn restore(&mut self, record: SpilledWindows) -> Result<(), SpillError> {
        let store: &dyn SpillSpace = self.store.as_ref();
        let mut kept: Vec<Vec<u8>> = record
            .windows
            .iter()
            .flat_map(|w| [w.start.clone(), self.window_space(&w.start)])
            .collect();
        kept.sort();
        let mut from = self.prefix.clone();
        for space in &kept {
            if from < *space {
                store.delete_range(&from, space)?;
            }
            from = prefix_end(space).unwrap_or_default();
        }
        let end = prefix_end(&self.prefix).unwrap_or_default();
        if from < end {
            store.delete_range(&from, &end)?;
        }
        for w in &record.windows {
            let mut after = w.start.clone();
            after.extend_from_slice(&record.runs.to_be_bytes());
            store.delete_range(&after, &prefix_end(&w.start).unwrap_or_default())?;
            // Every run named must be there (a run wrote at least a block).
            for &run in &w.runs {
                let mut first = w.start.clone();
                first.extend_from_slice(&run.to_be_bytes());
                let end = prefix_end(&first).unwrap_or_default();
                if store.scan(&first, &end, 0)?.is_empty() {
                    return Err(SpillError(format!(
                        "run {run} of a spilled GroupByKey window the checkpoint names is missing"
                    )));
                }
            }
        }
        self.runs = record.runs;
        self.next_window = record.next_window;
        self.windows = record
            .windows
            .into_iter()
            .map(|w| {
                let spilled = SpilledWindow {
                    start: w.start,
                    holds: Holds::from_entries(&w.holds),
                    draining: false,
                    runs: w.runs,
                };
                (w.window, spilled)
            })
            .collect();
        self.reclaim = Reclaim::durable();
        Ok(())
    }
}

impl WindowSpill {
    /// Makes this spill one on a durable spill space beside the checkpoints,
    /// which then name its windows (see the module docs).
    pub(in crate::grouping::spill) fn make_durable(&mut self) {
        self.reclaim = Reclaim::durable();
    }

    /// Whether some of it is on disk where a checkpoint taken now would
    /// have to copy it back (what periodic checkpoints wait for). (Keys
    /// handed out are `has_live_hand_outs`.)
    pub(in crate::grouping::spill) fn holds_scratch_spill(&self) -> bool {
        !self.can_name() && !self.windows.is_empty()
    }

    /// What a checkpoint taken now names of it, if it can name it.
    pub(in crate::grouping::spill) fn named_if_possible(&self) -> Option<SpilledWindows> {
        self.can_name().then(|| self.named())
    }

    /// Periodic checkpoint `number` was taken: windows gone before it are
    /// deleted once it is durable.
    pub(in crate::grouping::spill) fn checkpoint_taken(&mut self, number: u64) {
        self.reclaim.checkpoint_taken(number);
    }

    /// Checkpoints up to `number` are durable: windows gone before them
    /// are named by none a restore would read. A failed delete is owed
    /// again.
    pub(in crate::grouping::spill) fn checkpoint_durable(
        &mut self,
        number: u64,
    ) -> Result<(), SpillError> {
        let store = &self.store;
        self.reclaim.checkpoint_durable(number, |space| {
            crate::spill::delete_prefix(store.as_ref(), space)
        })
    }
}
