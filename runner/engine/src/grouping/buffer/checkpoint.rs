//! What a checkpoint keeps of a grouping buffer, and putting it back.
//!
//! A checkpoint keeps the panes (spilled ones read back, unless a durable
//! spill space lets it name them instead) and what the buffer counts; the
//! strategy and coders come from the plan. Keys are sorted so that an
//! unchanged buffer snapshots to the same bytes (and an incremental
//! checkpoint can skip it).

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::GroupingBuffer;
use crate::grouping::pane::KeyPanes;
use crate::grouping::spill::SpilledWindows;
use crate::grouping::GroupingError;
use crate::spill::SpillError;
use crate::time::Timestamp;

/// The changing part of a grouping buffer, for checkpoints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct GroupingSnapshot {
    /// Every key's panes, sorted by key.
    pub(in crate::grouping) panes: Vec<(Bytes, KeyPanes)>,
    dropped_late: u64,
    output_watermark: Timestamp,
    unmerged: Vec<Bytes>,
}

impl GroupingSnapshot {
    /// Whether the buffer held no pane and no window waiting to merge.
    pub(crate) fn is_empty(&self) -> bool {
        self.panes.is_empty() && self.unmerged.is_empty()
    }

    /// The keys `keep` accepts of every snapshot in `parts`, in one (for
    /// moving key groups between shards): their panes and windows waiting
    /// to merge, the late data dropped by those whose count goes with it
    /// (the `bool`), and the least of their watermarks. `None` without
    /// parts.
    pub(crate) fn merged_where(
        parts: Vec<(GroupingSnapshot, bool)>,
        keep: impl Fn(&[u8]) -> bool,
    ) -> Option<GroupingSnapshot> {
        let mut merged: Option<GroupingSnapshot> = None;
        for (part, counts) in parts {
            let into = merged.get_or_insert_with(|| GroupingSnapshot {
                panes: Vec::new(),
                dropped_late: 0,
                output_watermark: part.output_watermark,
                unmerged: Vec::new(),
            });
            into.panes
                .extend(part.panes.into_iter().filter(|(key, _)| keep(key)));
            into.unmerged
                .extend(part.unmerged.into_iter().filter(|key| keep(key)));
            if counts {
                into.dropped_late += part.dropped_late;
            }
            into.output_watermark = into.output_watermark.min(part.output_watermark);
        }
        if let Some(merged) = &mut merged {
            merged.panes.sort_by(|a, b| a.0.cmp(&b.0));
        }
        merged
    }
}

impl GroupingBuffer {
    /// What a checkpoint keeps of this buffer: everything, spilled panes
    /// read back included.
    pub(crate) fn snapshot(&self) -> Result<GroupingSnapshot, SpillError> {
        // (A buffer that handed a key out refuses: see `WindowSpill::read_back`.)
        let spill = match &self.spill {
            Some(spill) if spill.has_spilled() || spill.has_live_hand_outs() => spill,
            _ => return Ok(self.memory_snapshot()),
        };
        let mut all: BTreeMap<Bytes, KeyPanes> =
            self.memory.copy_panes(&self.strategy).into_iter().collect();
        spill.read_back_into(&mut all, &self.strategy, &self.window_coder)?;
        Ok(self.snapshot_of(all.into_iter().collect()))
    }

    /// The panes in memory, and what the buffer counts, as a checkpoint
    /// keeps them.
    pub(crate) fn memory_snapshot(&self) -> GroupingSnapshot {
        self.snapshot_of(self.memory.copy_panes(&self.strategy))
    }

    fn snapshot_of(&self, mut panes: Vec<(Bytes, KeyPanes)>) -> GroupingSnapshot {
        panes.sort_by(|a, b| a.0.cmp(&b.0));
        GroupingSnapshot {
            panes,
            dropped_late: self.dropped_late,
            output_watermark: self.output_watermark,
            unmerged: self.unmerged.iter().cloned().collect(),
        }
    }

    /// What a checkpoint keeps of this buffer: with `named` (a periodic
    /// checkpoint) and a spill that can be named, the panes in memory and
    /// the spilled windows by name; else everything, spilled panes read
    /// back.
    pub(crate) fn checkpoint(
        &self,
        named: bool,
    ) -> Result<(GroupingSnapshot, Option<SpilledWindows>), SpillError> {
        let spilled = self
            .spill
            .as_ref()
            .filter(|_| named)
            .and_then(|s| s.named());
        match spilled {
            Some(spilled) => Ok((self.memory_snapshot(), Some(spilled))),
            None => Ok((self.snapshot()?, None)),
        }
    }

    /// Puts back what [`Self::checkpoint`] kept: `snapshot`, and the
    /// spilled windows `named` names on a durable spill space (what is there and
    /// not named is deleted); the next evaluation looks at every pane
    /// again. (Spills again if that is more than memory allows.)
    pub(crate) fn restore(
        &mut self,
        snapshot: GroupingSnapshot,
        named: Option<SpilledWindows>,
    ) -> Result<(), GroupingError> {
        self.memory.restore(&self.strategy, snapshot.panes);
        self.dropped_late = snapshot.dropped_late;
        self.output_watermark = snapshot.output_watermark;
        self.unmerged = snapshot.unmerged.into_iter().collect();
        if let Some(spill) = &mut self.spill {
            spill.reset(named)?;
        }
        // The watermark is not known here: what spills is only what has not
        // fired; a window it passed comes back at the next evaluation if
        // it is still open.
        self.maybe_spill(crate::time::MIN_TIMESTAMP)
    }

    /// Periodic checkpoint `number` was taken: windows gone before it are
    /// deleted once it is durable.
    pub(crate) fn checkpoint_taken(&mut self, number: u64) {
        if let Some(spill) = &mut self.spill {
            spill.checkpoint_taken(number);
        }
    }

    /// Checkpoints up to `number` are durable: windows gone before them
    /// are named by none a restore would read. A failed delete is owed
    /// again.
    pub(crate) fn checkpoint_durable(&mut self, number: u64) -> Result<(), SpillError> {
        match &mut self.spill {
            Some(spill) => spill.checkpoint_durable(number),
            None => Ok(()),
        }
    }
}
