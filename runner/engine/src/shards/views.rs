//! What every shard of a job published, as one shard's exchange keeps it:
//! the watermarks and queue bounds each published, the epoch each cut, and
//! which finished. The in-process board keeps one for all shards; each
//! shard's end of the frame protocol keeps its own, fed by frames. Both
//! read it the same way, here.

use super::Epoch;
use crate::plan::StageVec;
use crate::time::{Timestamp, MAX_TIMESTAMP, MIN_TIMESTAMP};

/// Per shard, what it published.
#[derive(Debug, Clone)]
pub(super) struct Published {
    /// Per shard, per stage, its published output watermark (−∞ where it
    /// published nothing yet) and whether the stage's queue there is over
    /// its bound.
    stages: Vec<Vec<(Timestamp, bool)>>,
    /// Per shard, the last checkpoint epoch it cut.
    cuts: Vec<Epoch>,
    /// Per shard, whether it finished.
    finished: Vec<bool>,
}

impl Published {
    /// Nothing published yet by any of `shards` shards.
    pub(super) fn new(shards: usize) -> Self {
        Published {
            stages: vec![Vec::new(); shards],
            cuts: vec![Epoch::NONE; shards],
            finished: vec![false; shards],
        }
    }

    /// Records shard `shard`'s watermarks and queue bounds, stage by
    /// stage; says whether anything changed.
    pub(super) fn publish(&mut self, shard: usize, now: &[(Timestamp, bool)]) -> bool {
        let Some(published) = self.stages.get_mut(shard) else {
            return false;
        };
        if published.as_slice() == now {
            return false;
        }
        published.clear();
        published.extend_from_slice(now);
        true
    }

    /// Records that shard `shard` cut `epoch`.
    pub(super) fn cut(&mut self, shard: usize, epoch: Epoch) {
        if let Some(cut) = self.cuts.get_mut(shard) {
            *cut = epoch;
        }
    }

    /// The last epoch shard `shard` cut.
    pub(super) fn cut_of(&self, shard: usize) -> Epoch {
        self.cuts.get(shard).copied().unwrap_or(Epoch::NONE)
    }

    /// Records that shard `shard` finished.
    pub(super) fn finish(&mut self, shard: usize) {
        if let Some(finished) = self.finished.get_mut(shard) {
            *finished = true;
        }
    }

    /// Whether shard `shard` finished.
    pub(super) fn finished(&self, shard: usize) -> bool {
        self.finished.get(shard).copied().unwrap_or(false)
    }

    /// Shard `shard`'s output watermark of stage `stage`.
    fn watermark(&self, shard: usize, stage: usize) -> Timestamp {
        if self.finished(shard) {
            return MAX_TIMESTAMP;
        }
        self.stages[shard]
            .get(stage)
            .map_or(MIN_TIMESTAMP, |&(wm, _)| wm)
    }

    /// Whether stage `stage`'s queue on shard `shard` is over its bound.
    fn over(&self, shard: usize, stage: usize) -> bool {
        !self.finished(shard) && self.stages[shard].get(stage).is_some_and(|&(_, over)| over)
    }

    /// The shards other than `me`.
    fn others(&self, me: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.stages.len()).filter(move |&shard| shard != me)
    }

    /// Per stage of `stages`, the least output watermark the shards other
    /// than `me` published (+∞ with none).
    pub(super) fn others_watermarks(&self, me: usize, stages: usize) -> StageVec<Timestamp> {
        (0..stages)
            .map(|stage| {
                self.others(me)
                    .map(|shard| self.watermark(shard, stage))
                    .min()
                    .unwrap_or(MAX_TIMESTAMP)
            })
            .collect()
    }

    /// Per stage of `stages`, whether its queue on a shard other than `me`
    /// is over its bound.
    pub(super) fn others_over(&self, me: usize, stages: usize) -> StageVec<bool> {
        (0..stages)
            .map(|stage| self.others(me).any(|shard| self.over(shard, stage)))
            .collect()
    }

    /// The newest epoch any shard has cut.
    pub(super) fn newest_cut(&self) -> Epoch {
        self.cuts.iter().copied().max().unwrap_or(Epoch::NONE)
    }

    /// The oldest epoch every unfinished shard other than `me` has cut
    /// (every epoch with none).
    pub(super) fn others_cut(&self, me: usize) -> Epoch {
        self.others(me)
            .filter(|&shard| !self.finished(shard))
            .map(|shard| self.cuts[shard])
            .min()
            .unwrap_or(Epoch::EVERY)
    }
}
