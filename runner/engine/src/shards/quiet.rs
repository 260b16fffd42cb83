//! The quiet detector of a job on shards that share no memory: it decides
//! what the in-process board decides as shards park (see
//! [`super::ShardLink::park`]), from the shards' [`Report`]s.
//!
//! A shard parked earlier may have been woken by a frame since, and its
//! report says so only by its counts: the job is quiet only when every
//! unfinished shard's last report is a park, and every frame any shard
//! reported sending to an unfinished shard is one that shard reported
//! taking. A frame on its way, or taken after the taker's report, breaks
//! the equality until the taker parks again.

use super::frames::{Note, Report};
use super::{ShardId, ShardLayout};

/// One shard, as its last report left it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Last {
    /// Working, or never reported.
    Running,
    /// Parked with these counts.
    Parked {
        can_step: bool,
        waking: bool,
        sent: Vec<u64>,
        received: Vec<u64>,
    },
    /// Finished, having sent these.
    Finished { sent: Vec<u64> },
}

impl Last {
    /// Frames this shard reported sending to shard `to` (none while
    /// running: a running shard makes the job not quiet anyway).
    fn sent_to(&self, to: usize) -> Option<u64> {
        match self {
            Last::Running => None,
            Last::Parked { sent, .. } | Last::Finished { sent } => sent.get(to).copied(),
        }
    }
}

/// A job's quiet detector: fed every shard's reports in each shard's
/// order, it answers with the notes to send.
#[derive(Debug)]
pub struct QuietDetector {
    shards: Vec<Last>,
    stuck: bool,
}

impl QuietDetector {
    /// A detector for the shards of `layout`, none of which reported.
    pub fn new(layout: ShardLayout) -> Self {
        QuietDetector {
            shards: vec![Last::Running; layout.shards() as usize],
            stuck: false,
        }
    }

    /// Takes `report` from shard `from`; returns what to tell whom.
    pub fn hear(&mut self, from: ShardId, report: Report) -> Vec<(ShardId, Note)> {
        let Some(last) = self.shards.get_mut(from.index()) else {
            return Vec::new();
        };
        *last = match report {
            Report::Parked {
                can_step,
                waking,
                sent,
                received,
            } => Last::Parked {
                can_step,
                waking,
                sent,
                received,
            },
            Report::Unparked => Last::Running,
            Report::Finished { sent } => Last::Finished { sent },
        };
        self.decide()
    }

    /// Whether every unfinished shard is parked, with every frame sent to
    /// it taken; and at least one is unfinished.
    fn quiet(&self) -> bool {
        let mut any = false;
        for (me, last) in self.shards.iter().enumerate() {
            let received = match last {
                Last::Running => return false,
                Last::Finished { .. } => continue,
                Last::Parked { received, .. } => received,
            };
            any = true;
            for (other, theirs) in self.shards.iter().enumerate() {
                if other == me {
                    continue;
                }
                let taken = received.get(other).copied().unwrap_or(0);
                if theirs.sent_to(me) != Some(taken) {
                    return false;
                }
            }
        }
        any
    }

    /// What a quiet job does next: the first parked shard with TestStream
    /// events applies one; with none, and nothing due later, the job is
    /// stuck.
    fn decide(&mut self) -> Vec<(ShardId, Note)> {
        if self.stuck || !self.quiet() {
            return Vec::new();
        }
        let stepper = self
            .shards
            .iter()
            .position(|l| matches!(l, Last::Parked { can_step: true, .. }));
        if let Some(s) = stepper {
            // About to apply the event: no longer quiet.
            self.shards[s] = Last::Running;
            return vec![(ShardId(s as u32), Note::Turn)];
        }
        if self
            .shards
            .iter()
            .any(|l| matches!(l, Last::Parked { waking: true, .. }))
        {
            return Vec::new();
        }
        self.stuck = true;
        (0..self.shards.len())
            .map(|s| (ShardId(s as u32), Note::Stuck))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parked(can_step: bool, waking: bool, sent: [u64; 2], received: [u64; 2]) -> Report {
        Report::Parked {
            can_step,
            waking,
            sent: sent.to_vec(),
            received: received.to_vec(),
        }
    }

    fn detector() -> QuietDetector {
        QuietDetector::new(ShardLayout::new(2).expect("a layout"))
    }

    const A: ShardId = ShardId(0);
    const B: ShardId = ShardId(1);

    #[test]
    fn a_frame_on_its_way_keeps_the_job_from_being_quiet() {
        let mut d = detector();
        assert!(d.hear(A, parked(false, false, [0, 3], [0, 0])).is_empty());
        // B took two of A's three frames.
        assert!(d.hear(B, parked(false, false, [0, 0], [2, 0])).is_empty());
        // The third arrived and B parked again: stuck, told to both.
        assert_eq!(
            d.hear(B, parked(false, false, [0, 0], [3, 0])),
            [(A, Note::Stuck), (B, Note::Stuck)]
        );
        // Told once.
        assert!(d.hear(A, parked(false, false, [0, 3], [0, 0])).is_empty());
    }

    #[test]
    fn the_shard_with_events_left_gets_the_turn_and_is_running() {
        let mut d = detector();
        assert!(d.hear(B, parked(false, false, [0, 0], [1, 0])).is_empty());
        assert_eq!(
            d.hear(A, parked(true, false, [0, 1], [0, 0])),
            [(A, Note::Turn)]
        );
        // A applies its event: B parking again decides nothing.
        assert!(d.hear(B, parked(false, false, [0, 0], [1, 0])).is_empty());
    }

    #[test]
    fn something_due_later_or_a_running_shard_is_not_stuck() {
        let mut d = detector();
        assert!(d.hear(A, parked(false, true, [0, 0], [0, 0])).is_empty());
        assert!(d.hear(B, parked(false, false, [0, 0], [0, 0])).is_empty());
        assert!(d.hear(A, Report::Unparked).is_empty());
        assert!(d.hear(B, parked(false, false, [0, 0], [0, 0])).is_empty());
        // A finishes having sent B one frame, which B has not taken yet.
        assert!(d.hear(A, Report::Finished { sent: vec![0, 1] }).is_empty());
        assert_eq!(
            d.hear(B, parked(false, false, [0, 0], [1, 0])),
            [(A, Note::Stuck), (B, Note::Stuck)]
        );
    }

    #[test]
    fn every_shard_finished_is_not_stuck() {
        let mut d = detector();
        assert!(d.hear(A, Report::Finished { sent: vec![0, 0] }).is_empty());
        assert!(d.hear(B, Report::Finished { sent: vec![0, 0] }).is_empty());
        assert!(d.hear(ShardId(7), Report::Unparked).is_empty());
    }
}
