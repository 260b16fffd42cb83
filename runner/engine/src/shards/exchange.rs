//! What a shard's engine exchanges with the other shards of its job, and
//! the handle it does so through: a [`ShardLink`] over one
//! [`ExchangeEnd`].
//!
//! Two exchanges implement it. The in-process board
//! ([`ShardLink::in_process`]) holds every shard's inbox and published watermarks
//! behind one lock. The frame protocol ([`super::peer`]) gives each shard
//! a board of its own, fed by ordered streams of frames from every other
//! shard and told by a quiet detector ([`super::quiet`]) when the job is
//! quiet: what runs over gRPC between shards in separate places.
//!
//! Both keep one rule that keeps watermarks honest (see [`super`]): a
//! shard hands elements over ([`ShardLink::send`]) before it publishes the
//! watermarks that held them ([`ShardLink::publish`]), and a receiver
//! empties its inbox and reads the others' watermarks in one step
//! ([`ShardLink::take`]), so a watermark it reads never passed an element
//! still on its way to it.
//!
//! Every change that can give a shard work (elements handed over, a
//! watermark moved, a shard finished, a checkpoint epoch cut) raises the
//! shard's *version*; a parked shard waits for the version to change.
//!
//! For checkpoints each shard's last cut [`Epoch`] is known to the
//! others, and each delivery is tagged with its sender's epoch when it was
//! sent (see `manager/shard_epochs.rs` for how a shard uses the tags).

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::watch;

use super::{Epoch, ShardId, ShardLayout};
use crate::plan::{PCollectionIdx, StageVec};
use crate::time::Timestamp;

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
    /// elements, borrowed.
    pub fn parts(&self) -> (PCollectionIdx, bool, &Bytes) {
        match self {
            Delivery::Owned {
                pcollection,
                elements,
            } => (*pcollection, false, elements),
            Delivery::SideInput {
                pcollection,
                elements,
            } => (*pcollection, true, elements),
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
    /// The exchange holds as much of this shard's output for others as
    /// its flow control allows: producers whose output goes to other
    /// shards wait (never for the in-process board).
    pub exchange_full: bool,
    /// The exchange lost this shard's connection to another, and why: the
    /// run cannot go on (it is retried from its last checkpoint).
    pub lost: Option<String>,
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

/// One shard's end of an exchange: what [`ShardLink`] calls. Each call
/// is short and never blocks on another shard (a transport queues what it
/// cannot send yet), since the engine calls it from its loop.
pub trait ExchangeEnd: Send + Sync {
    /// Hands `deliveries` to their shards (none to this one), after
    /// everything this shard handed or published before.
    fn send(&self, deliveries: Vec<(ShardId, Delivery)>);

    /// Empties this shard's inbox and reads the other shards' watermarks
    /// of `stages` stages, in one step.
    fn take(&self, stages: usize) -> Received;

    /// Every shard is to stop once its cut of `epoch` is complete.
    fn stop_after(&self, epoch: Epoch);

    /// This shard cut checkpoint epoch `epoch`.
    fn cut(&self, epoch: Epoch);

    /// Publishes the scripted processing time of the shard replaying the
    /// job's TestStream.
    fn publish_processing_time(&self, now: Timestamp);

    /// Publishes, per stage in stage order, this shard's output watermark
    /// and whether the stage's queue here is over its bound.
    fn publish(&self, stages: Vec<(Timestamp, bool)>);

    /// This shard is done: every stage of it at +∞.
    fn finish(&self);

    /// Parks this quiet shard unless its view changed since the take at
    /// version `seen` (see [`ShardLink::park`]).
    fn park(&self, seen: u64, can_step: bool, waking: bool) -> Parked;

    /// This parked shard has work again.
    fn unpark(&self);

    /// The version of this shard's view, to wait on while parked.
    fn subscribe(&self) -> watch::Receiver<u64>;
}

/// One shard's end of the exchange: what its engine hands over, takes,
/// publishes and parks through.
#[derive(Clone)]
pub struct ShardLink {
    id: ShardId,
    layout: ShardLayout,
    end: Arc<dyn ExchangeEnd>,
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
    /// Shard `id` of `layout`, exchanging through `end`.
    pub fn new(id: ShardId, layout: ShardLayout, end: Arc<dyn ExchangeEnd>) -> Self {
        ShardLink { id, layout, end }
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
        let deliveries: Vec<_> = deliveries.into_iter().collect();
        if !deliveries.is_empty() {
            self.end.send(deliveries);
        }
    }

    /// Empties this shard's inbox and reads the other shards' watermarks of
    /// `stages` stages, in one step.
    pub fn take(&self, stages: usize) -> Received {
        self.end.take(stages)
    }

    /// Every shard is to stop once its cut of `epoch` is complete (a
    /// savepoint with stop): wakes them all.
    pub fn stop_after(&self, epoch: Epoch) {
        self.end.stop_after(epoch);
    }

    /// This shard cut checkpoint epoch `epoch`: what it sends from now on
    /// belongs to the next one. Wakes the others, who cut it too.
    pub fn cut(&self, epoch: Epoch) {
        self.end.cut(epoch);
    }

    /// Publishes the scripted processing time of the shard replaying the
    /// job's TestStream, for the others' clocks to follow.
    pub fn publish_processing_time(&self, now: Timestamp) {
        self.end.publish_processing_time(now);
    }

    /// Publishes, for every stage in stage order, this shard's output
    /// watermark and whether the stage's queue here is over its bound;
    /// wakes the others only if something changed.
    pub fn publish(&self, stages: impl Iterator<Item = (Timestamp, bool)>) {
        self.end.publish(stages.collect());
    }

    /// This shard is done: every stage of it at +∞.
    pub fn finish(&self) {
        self.end.finish();
    }

    /// Parks this shard, which is quiet: nothing running, nothing to run
    /// now (`can_step`: but TestStream events to apply; `waking`: but
    /// something due later), unless its view changed since its take at
    /// `seen`. Once every unfinished shard is parked and nothing is on its
    /// way between them, the pipeline is quiet: a shard with TestStream
    /// events left gets its turn to apply the next one; with none, and
    /// nothing due later anywhere, the job is stuck, and every shard is
    /// told so. The in-process board decides that at once (and may answer
    /// [`Parked::YourTurn`] or [`Parked::AllParked`]); the frame protocol
    /// answers later, through the next take.
    pub fn park(&self, seen: u64, can_step: bool, waking: bool) -> Parked {
        self.end.park(seen, can_step, waking)
    }

    /// This shard, parked, has work again (a wake-up came due): it is no
    /// longer quiet.
    pub fn unpark(&self) {
        self.end.unpark();
    }

    /// The version of this shard's view, to wait on while parked.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.end.subscribe()
    }
}
