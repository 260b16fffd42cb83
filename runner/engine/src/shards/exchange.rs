//! The exchange between the shards of one job in one process: a board that
//! holds each shard's inbox of elements handed to it and the watermarks
//! each shard published, behind one lock.
//!
//! The one lock is what keeps watermarks honest (see [`super`]): a shard
//! hands elements over ([`ShardLink::send`]) before it publishes the
//! watermarks that held them ([`ShardLink::publish`]), and a receiver empties
//! its inbox and reads the others' watermarks in one step
//! ([`ShardLink::take`]), so a watermark it reads never passed an element
//! still in its inbox.
//!
//! Every change that can give a shard work (elements handed over, a
//! watermark moved, a shard finished, a checkpoint epoch cut) raises the
//! board's *version*; a parked shard waits for the version to change.
//!
//! For checkpoints the board also keeps the last [`Epoch`] each shard cut,
//! and tags each delivery with its sender's epoch when it was sent (see
//! `manager/shard_epochs.rs` for how a shard uses the tags).

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::{Epoch, ShardId, ShardLayout};
use crate::plan::{PCollectionIdx, StageVec};
use crate::time::{Timestamp, MAX_TIMESTAMP, MIN_TIMESTAMP};

/// Elements one shard hands another: encoded windowed values of one
/// PCollection, in its coders.
#[derive(Debug, Clone)]
pub enum Delivery {
    /// Elements of a partitioned PCollection whose keys the receiver owns,
    /// for every stage reading it there.
    Owned {
        /// The PCollection.
        pcollection: PCollectionIdx,
        /// Its elements, concatenated.
        elements: Bytes,
    },
    /// Elements of a broadcast PCollection, for the receiver's side inputs
    /// only (its main-input readers got them where they were made, or from
    /// an [`Delivery::Owned`]).
    SideInput {
        /// The PCollection.
        pcollection: PCollectionIdx,
        /// Its elements, concatenated.
        elements: Bytes,
    },
}

impl Delivery {
    /// Elements of `pcollection` for the receiver's side inputs
    /// (`side_input`) or for its stages reading them.
    pub fn new(pcollection: PCollectionIdx, side_input: bool, elements: Bytes) -> Self {
        if side_input {
            Delivery::SideInput {
                pcollection,
                elements,
            }
        } else {
            Delivery::Owned {
                pcollection,
                elements,
            }
        }
    }

    /// The delivery's PCollection, whether it is for side inputs, and its
    /// elements: what [`Delivery::new`] takes.
    pub fn into_parts(self) -> (PCollectionIdx, bool, Bytes) {
        match self {
            Delivery::Owned {
                pcollection,
                elements,
            } => (pcollection, false, elements),
            Delivery::SideInput {
                pcollection,
                elements,
            } => (pcollection, true, elements),
        }
    }
}

/// A delivery as the board holds it: with the last epoch its sender had
/// cut when it sent it.
#[derive(Debug, Clone)]
pub struct Handed {
    /// The sender's last cut epoch at the time: the delivery belongs to
    /// the next one (its effects are in no earlier epoch's cut of the
    /// sender).
    pub epoch: Epoch,
    /// What was handed over.
    pub delivery: Delivery,
}

/// What a shard takes from the board in one step.
#[derive(Debug)]
pub struct Received {
    /// What other shards handed it, in the order they did.
    pub deliveries: Vec<Handed>,
    /// Per stage, the least output watermark the *other* shards published
    /// (+∞ with no other shard).
    pub watermarks: StageVec<Timestamp>,
    /// Per stage, whether its queue on another shard is over its bound.
    pub over: StageVec<bool>,
    /// The board's version when taken: what [`ShardLink::park`] compares.
    pub version: u64,
    /// Every unfinished shard parked with nothing changed: the job cannot
    /// make progress.
    pub stuck: bool,
    /// Every unfinished shard parked with nothing changed, and this shard
    /// may apply its TestStream's next event now.
    pub turn: bool,
    /// Scripted processing time as the shard replaying the TestStream
    /// published it, if it did.
    pub processing_time: Option<Timestamp>,
    /// The newest epoch any shard has cut.
    pub newest_cut: Epoch,
    /// The oldest epoch every *other* unfinished shard has cut (finished
    /// shards and a lone shard count as having cut every epoch).
    pub others_cut: Epoch,
    /// The epoch after which every shard stops (a savepoint with stop),
    /// if one was asked for.
    pub stop_after: Option<Epoch>,
}

/// What [`ShardLink::park`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parked {
    /// The board changed since the shard last took from it: take again.
    Changed,
    /// Parked: wait for the version to change.
    Waiting,
    /// Every unfinished shard is parked and nothing changed: the job is
    /// stuck.
    AllParked,
    /// Every unfinished shard is parked and nothing changed, and this
    /// shard may apply its TestStream's next event.
    YourTurn,
}

/// The shared board.
struct Board {
    version: u64,
    inboxes: Vec<Vec<Handed>>,
    /// Per shard, the last checkpoint epoch it cut.
    cuts: Vec<Epoch>,
    /// Every shard stops once its cut of this epoch is complete.
    stop_after: Option<Epoch>,
    /// Per shard, per stage, its published output watermark (−∞ where it
    /// published nothing yet) and whether the stage's queue there is over
    /// its bound.
    published: Vec<Vec<(Timestamp, bool)>>,
    finished: Vec<bool>,
    parked: Vec<bool>,
    /// Per shard, whether it parked with TestStream events left to apply.
    can_step: Vec<bool>,
    /// Per shard, whether it parked with something due later (a timer, a
    /// retry): quiet now, but not stuck.
    waking: Vec<bool>,
    stuck: bool,
    /// The shard whose turn it is to apply a TestStream event.
    turn: Option<usize>,
    processing_time: Option<Timestamp>,
}

impl Board {
    /// Something changed: parked shards wake and look again.
    fn bump(&mut self, version: &watch::Sender<u64>) {
        self.version += 1;
        self.parked.iter_mut().for_each(|p| *p = false);
        version.send_replace(self.version);
    }

    /// Shard `shard`'s published output watermark of stage `stage`.
    fn watermark(&self, shard: usize, stage: usize) -> Timestamp {
        if self.finished[shard] {
            return MAX_TIMESTAMP;
        }
        self.published[shard]
            .get(stage)
            .map_or(MIN_TIMESTAMP, |&(wm, _)| wm)
    }

    /// Whether stage `stage`'s queue on shard `shard` is over its bound.
    fn over(&self, shard: usize, stage: usize) -> bool {
        !self.finished[shard]
            && self.published[shard]
                .get(stage)
                .is_some_and(|&(_, over)| over)
    }
}

/// The board and its version's broadcast.
struct Exchange {
    board: Mutex<Board>,
    version: watch::Sender<u64>,
}

/// One shard's end of the exchange: what its engine hands over, takes,
/// publishes and parks through.
#[derive(Clone)]
pub struct ShardLink {
    id: ShardId,
    layout: ShardLayout,
    exchange: Arc<Exchange>,
}

impl std::fmt::Debug for ShardLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardLink")
            .field("id", &self.id)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl ShardLink {
    /// The links of every shard of `layout`, joined by one exchange in
    /// this process, in shard order.
    pub fn in_process(layout: ShardLayout) -> Vec<ShardLink> {
        let n = layout.shards() as usize;
        let exchange = Arc::new(Exchange {
            board: Mutex::new(Board {
                version: 0,
                inboxes: vec![Vec::new(); n],
                cuts: vec![Epoch::NONE; n],
                stop_after: None,
                published: vec![Vec::new(); n],
                finished: vec![false; n],
                parked: vec![false; n],
                can_step: vec![false; n],
                waking: vec![false; n],
                stuck: false,
                turn: None,
                processing_time: None,
            }),
            version: watch::channel(0).0,
        });
        layout
            .ids()
            .map(|id| ShardLink {
                id,
                layout,
                exchange: exchange.clone(),
            })
            .collect()
    }

    /// This shard.
    pub fn id(&self) -> ShardId {
        self.id
    }

    /// The job's layout.
    pub fn layout(&self) -> ShardLayout {
        self.layout
    }

    /// Hands `deliveries` to their shards (none to this one).
    pub fn send(&self, deliveries: impl IntoIterator<Item = (ShardId, Delivery)>) {
        let mut board = self.exchange.board.lock();
        let epoch = board.cuts[self.id.index()];
        let mut any = false;
        for (to, delivery) in deliveries {
            if let Some(inbox) = board.inboxes.get_mut(to.index()) {
                inbox.push(Handed { epoch, delivery });
                any = true;
            }
        }
        if any {
            board.bump(&self.exchange.version);
        }
    }

    /// Empties this shard's inbox and reads the other shards' watermarks of
    /// `stages` stages, in one step.
    pub fn take(&self, stages: usize) -> Received {
        let mut board = self.exchange.board.lock();
        let me = self.id.index();
        let deliveries = std::mem::take(&mut board.inboxes[me]);
        let watermarks = (0..stages)
            .map(|stage| {
                (0..board.published.len())
                    .filter(|&shard| shard != me)
                    .map(|shard| board.watermark(shard, stage))
                    .min()
                    .unwrap_or(MAX_TIMESTAMP)
            })
            .collect();
        let over = (0..stages)
            .map(|stage| {
                (0..board.published.len()).any(|shard| shard != me && board.over(shard, stage))
            })
            .collect();
        let turn = board.turn == Some(me);
        if turn {
            board.turn = None;
        }
        let newest_cut = board.cuts.iter().copied().max().unwrap_or(Epoch::NONE);
        let others_cut = (0..board.cuts.len())
            .filter(|&shard| shard != me && !board.finished[shard])
            .map(|shard| board.cuts[shard])
            .min()
            .unwrap_or(Epoch::EVERY);
        Received {
            deliveries,
            watermarks,
            over,
            version: board.version,
            stuck: board.stuck,
            turn,
            processing_time: board.processing_time,
            newest_cut,
            others_cut,
            stop_after: board.stop_after,
        }
    }

    /// Every shard is to stop once its cut of `epoch` is complete (a
    /// savepoint with stop): wakes them all.
    pub fn stop_after(&self, epoch: Epoch) {
        let mut board = self.exchange.board.lock();
        board.stop_after = Some(board.stop_after.map_or(epoch, |e| e.min(epoch)));
        board.bump(&self.exchange.version);
    }

    /// This shard cut checkpoint epoch `epoch`: what it sends from now on
    /// belongs to the next one. Wakes the others, who cut it too.
    pub fn cut(&self, epoch: Epoch) {
        let mut board = self.exchange.board.lock();
        board.cuts[self.id.index()] = epoch;
        board.bump(&self.exchange.version);
    }

    /// Publishes the scripted processing time of the shard replaying the
    /// job's TestStream, for the others' clocks to follow.
    pub fn publish_processing_time(&self, now: Timestamp) {
        let mut board = self.exchange.board.lock();
        if board.processing_time != Some(now) {
            board.processing_time = Some(now);
            board.bump(&self.exchange.version);
        }
    }

    /// Publishes, for every stage in stage order, this shard's output
    /// watermark and whether the stage's queue here is over its bound;
    /// wakes the others only if something changed.
    pub fn publish(&self, stages: impl Iterator<Item = (Timestamp, bool)>) {
        let mut board = self.exchange.board.lock();
        let me = self.id.index();
        let mut changed = false;
        for (stage, now) in stages.enumerate() {
            let published = &mut board.published[me];
            if stage == published.len() {
                published.push(now);
                changed = true;
            } else if published[stage] != now {
                published[stage] = now;
                changed = true;
            }
        }
        if changed {
            board.bump(&self.exchange.version);
        }
    }

    /// This shard is done: every stage of it at +∞.
    pub fn finish(&self) {
        let mut board = self.exchange.board.lock();
        board.finished[self.id.index()] = true;
        board.bump(&self.exchange.version);
    }

    /// Parks this shard, which is quiet: nothing running, nothing to run
    /// now (`can_step`: but TestStream events to apply; `waking`: but
    /// something due later), unless the board changed since its take at
    /// `seen`. If that leaves every unfinished shard parked, the pipeline
    /// is quiet: a shard with TestStream events left gets its turn to
    /// apply the next one (at once if it is this one, else woken); with
    /// none, and nothing due later anywhere, the job is stuck, and every
    /// shard is woken to say so.
    pub fn park(&self, seen: u64, can_step: bool, waking: bool) -> Parked {
        let mut board = self.exchange.board.lock();
        if board.version != seen {
            return Parked::Changed;
        }
        let me = self.id.index();
        board.parked[me] = true;
        board.can_step[me] = can_step;
        board.waking[me] = waking;
        let shards = 0..board.parked.len();
        if !shards.clone().all(|s| board.parked[s] || board.finished[s]) {
            return Parked::Waiting;
        }
        match shards
            .clone()
            .find(|&s| board.parked[s] && board.can_step[s])
        {
            Some(s) if s == me => {
                // About to apply the event: no longer quiet.
                board.parked[me] = false;
                Parked::YourTurn
            }
            Some(s) => {
                board.turn = Some(s);
                board.bump(&self.exchange.version);
                Parked::Waiting
            }
            None if shards.clone().any(|s| board.parked[s] && board.waking[s]) => Parked::Waiting,
            None => {
                board.stuck = true;
                board.bump(&self.exchange.version);
                Parked::AllParked
            }
        }
    }

    /// This shard, parked, has work again (a wake-up came due): it is no
    /// longer quiet.
    pub fn unpark(&self) {
        self.exchange.board.lock().parked[self.id.index()] = false;
    }

    /// The board's version, to wait on while parked.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.exchange.version.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(n: u32) -> Vec<ShardLink> {
        ShardLink::in_process(ShardLayout::new(n).expect("a layout"))
    }

    fn owned(n: u8) -> Delivery {
        Delivery::Owned {
            pcollection: PCollectionIdx::new(0),
            elements: Bytes::from(vec![n]),
        }
    }

    #[test]
    fn watermarks_are_the_least_of_the_other_shards() {
        let links = links(3);
        let view = links[0].take(2).watermarks;
        assert_eq!(view.iter().copied().collect::<Vec<_>>(), [MIN_TIMESTAMP; 2]);
        links[1].publish([(5, false), (7, true)].into_iter());
        links[2].publish([(3, false), (9, false)].into_iter());
        links[0].publish([(0, true), (0, true)].into_iter());
        let took = links[0].take(2);
        assert_eq!(took.watermarks.iter().copied().collect::<Vec<_>>(), [3, 7]);
        // Only the others' queues count: stage 1 is over on shard 1.
        assert_eq!(took.over.iter().copied().collect::<Vec<_>>(), [false, true]);
        links[2].finish();
        let view = links[0].take(2).watermarks;
        assert_eq!(view.iter().copied().collect::<Vec<_>>(), [5, 7]);
        // A lone shard reads +∞: nobody else holds anything back.
        let alone = self::links(1);
        assert_eq!(
            alone[0].take(1).watermarks.iter().next(),
            Some(&MAX_TIMESTAMP)
        );
    }

    #[test]
    fn deliveries_arrive_once_in_order() {
        let links = links(2);
        links[0].send([(links[1].id(), owned(1)), (links[1].id(), owned(2))]);
        let first = links[1].take(0).deliveries;
        let got: Vec<u8> = first
            .iter()
            .map(|d| match &d.delivery {
                Delivery::Owned { elements, .. } => elements[0],
                Delivery::SideInput { .. } => 0,
            })
            .collect();
        assert_eq!(got, [1, 2]);
        assert!(links[1].take(0).deliveries.is_empty());
        assert!(links[0].take(0).deliveries.is_empty());
    }

    #[test]
    fn a_job_is_stuck_only_when_every_unfinished_shard_parked_unchanged() {
        let links = links(3);
        let seen: Vec<u64> = links.iter().map(|l| l.take(1).version).collect();
        assert_eq!(links[0].park(seen[0], false, false), Parked::Waiting);
        // A delivery to shard 0 wakes it: its park is undone.
        links[1].send([(links[0].id(), owned(1))]);
        assert_eq!(links[2].park(seen[2], false, false), Parked::Changed);
        let seen: Vec<u64> = links.iter().map(|l| l.take(1).version).collect();
        links[2].finish();
        let seen0 = links[0].take(1).version;
        assert_eq!(links[0].park(seen0, false, false), Parked::Waiting);
        assert_eq!(links[1].park(seen[1], false, false), Parked::Changed);
        let seen1 = links[1].take(1).version;
        assert!(!links[1].take(1).stuck);
        assert_eq!(links[1].park(seen1, false, false), Parked::AllParked);
        assert!(links[0].take(1).stuck);
    }

    #[test]
    fn a_quiet_pipeline_gives_the_test_stream_its_turn_not_a_stuck_job() {
        let links = links(2);
        let seen: Vec<u64> = links.iter().map(|l| l.take(1).version).collect();
        // Shard 0 replays the stream: parked first, it is woken with its
        // turn once shard 1 parks too.
        assert_eq!(links[0].park(seen[0], true, false), Parked::Waiting);
        assert_eq!(links[1].park(seen[1], false, false), Parked::Waiting);
        let took = links[0].take(1);
        assert!(took.turn && !took.stuck);
        assert!(!links[0].take(1).turn, "a turn is taken once");
        // Parked last, the stepper takes its turn at once.
        let seen1 = links[1].take(1).version;
        assert_eq!(links[1].park(seen1, false, false), Parked::Waiting);
        assert_eq!(links[0].park(took.version, true, false), Parked::YourTurn);
        // Shard 0 is busy with its event now: shard 1 parking again is not
        // a quiet pipeline.
        assert_eq!(links[1].park(seen1, false, false), Parked::Waiting);
        assert!(!links[0].take(1).turn);
        links[0].publish_processing_time(42);
        assert_eq!(links[1].take(1).processing_time, Some(42));
    }

    #[test]
    fn a_shard_due_to_wake_later_keeps_the_job_from_being_stuck() {
        let links = links(2);
        let seen: Vec<u64> = links.iter().map(|l| l.take(1).version).collect();
        assert_eq!(links[0].park(seen[0], false, true), Parked::Waiting);
        assert_eq!(links[1].park(seen[1], false, false), Parked::Waiting);
        assert!(!links[0].take(1).stuck);
        // Woken, shard 0 works again; parked for good, the job is stuck.
        links[0].unpark();
        let seen0 = links[0].take(1).version;
        assert_eq!(links[0].park(seen0, false, false), Parked::AllParked);
    }

    #[test]
    fn deliveries_carry_their_senders_epoch_and_cuts_are_seen() {
        let links = links(3);
        let to = links[1].id();
        links[0].send([(to, owned(1))]);
        links[0].cut(Epoch::NONE.next());
        links[0].send([(to, owned(2))]);
        let took = links[1].take(0);
        let epochs: Vec<Epoch> = took.deliveries.iter().map(|d| d.epoch).collect();
        assert_eq!(epochs, [Epoch::NONE, Epoch::NONE.next()]);
        assert_eq!(took.newest_cut, Epoch::NONE.next());
        // Shard 2 has not cut: not every other shard has.
        assert_eq!(took.others_cut, Epoch::NONE);
        links[2].finish();
        assert_eq!(links[1].take(0).others_cut, Epoch::NONE.next());
        // With every other shard finished, every epoch counts as cut.
        links[0].finish();
        assert_eq!(links[1].take(0).others_cut, Epoch::EVERY);
        // A stop after an epoch is every shard's, the earliest asked.
        assert_eq!(links[1].take(0).stop_after, None);
        links[2].stop_after(Epoch::NONE.next().next());
        links[0].stop_after(Epoch::NONE.next());
        assert_eq!(links[1].take(0).stop_after, Some(Epoch::NONE.next()));
    }

    #[test]
    fn publishing_the_same_watermarks_wakes_nobody() {
        let links = links(2);
        links[0].publish([(1, false)].into_iter());
        let version = links[1].take(1).version;
        links[0].publish([(1, false)].into_iter());
        assert_eq!(links[1].take(1).version, version);
        links[0].publish([(2, false)].into_iter());
        assert_ne!(links[1].take(1).version, version);
    }
}
