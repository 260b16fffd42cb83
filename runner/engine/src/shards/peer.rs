//! One shard's end of the frame protocol: a board of its own, fed by
//! frames from every other shard, for shards that share no memory.
//!
//! # Why frames keep watermarks honest
//!
//! Everything a shard tells another (elements, watermarks, cuts, that it
//! finished) goes as [`Frame`]s on one ordered stream from it to that
//! shard. A shard sends the elements that a watermark held before it
//! publishes the watermark, so on the receiver's stream they come first,
//! and the receiver applies each frame to its board under one lock: a
//! take sees a sender's watermark only with every element sent before it.
//! The same order carries checkpoint cuts: a cut arrives after everything
//! its sender sent in the epoch before.
//!
//! # Quiet, across shards
//!
//! No shard sees the others park, so a quiet detector
//! ([`super::quiet::QuietDetector`]) does: each shard reports when it
//! parks, with how many frames it has sent to each shard and taken from
//! each. The job is quiet when every unfinished shard is parked and every
//! frame sent was taken: nothing is on its way. The detector's answer (a
//! TestStream turn, or stuck) arrives as a [`Note`] and shows in the next
//! take.
//!
//! # Flow control
//!
//! A transport charges each frame ([`Frame::charge`]) against credit its
//! receiver grants; this end tells it when the engine took deliveries
//! ([`FrameWire::taken`]), and reads whether frames wait for credit
//! ([`FrameWire::full`]) into [`Received::exchange_full`], which holds back
//! the producers whose output goes to other shards.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;
use tracing::debug;

use super::exchange::{Delivery, ExchangeEnd, Handed, Parked, Received};
use super::frames::{Frame, Note, Report};
use super::views::Published;
use super::{Epoch, ShardId, ShardLayout, ShardLink};
use crate::time::Timestamp;

/// What carries one shard's frames and reports: a transport. Every call
/// only queues (it must not call back into a [`PeerEnd`]), and frames to
/// one shard, like reports, leave in the order queued.
pub trait FrameWire: Send + Sync {
    /// Queues `frame` for shard `to`.
    fn to_peer(&self, to: ShardId, frame: Frame);

    /// Queues `report` for the job's quiet detector.
    fn to_detector(&self, report: Report);

    /// This shard's engine took deliveries of shard `from` charged
    /// `bytes`: its credit may go back to the sender.
    fn taken(&self, from: ShardId, bytes: usize);

    /// Whether frames this shard sent wait for credit past the transport's
    /// bound.
    fn full(&self) -> bool;
}

/// One shard's board, as frames left it.
struct PeerBoard {
    version: u64,
    inbox: Vec<Handed>,
    /// Per sender, what the inbox's deliveries from it were charged.
    inbox_charge: Vec<usize>,
    /// What every shard published, this one's own included.
    published: Published,
    stop_after: Option<Epoch>,
    processing_time: Option<Timestamp>,
    turn: bool,
    stuck: bool,
    /// Per shard, frames sent to it.
    sent: Vec<u64>,
    /// Per shard, frames applied from it.
    received: Vec<u64>,
    parked: bool,
    finished: bool,
    /// Why the transport can no longer carry this shard's frames.
    lost: Option<String>,
}

impl PeerBoard {
    /// Something changed: a parked engine looks again.
    fn bump(&mut self, version: &watch::Sender<u64>) {
        self.version += 1;
        self.parked = false;
        version.send_replace(self.version);
    }
}

/// One shard's end of the frame protocol: the engine's side through
/// [`ShardLink`], the transport's through [`PeerEnd::receive`] and
/// [`PeerEnd::hear`].
pub struct PeerEnd {
    id: ShardId,
    board: Mutex<PeerBoard>,
    version: watch::Sender<u64>,
    wire: Arc<dyn FrameWire>,
}

impl std::fmt::Debug for PeerEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerEnd")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl PeerEnd {
    /// Shard `id` of `layout`, sending through `wire`. The transport
    /// hands it what arrives for it.
    pub fn new(id: ShardId, layout: ShardLayout, wire: Arc<dyn FrameWire>) -> Arc<PeerEnd> {
        let n = layout.shards() as usize;
        Arc::new(PeerEnd {
            id,
            board: Mutex::new(PeerBoard {
                version: 0,
                inbox: Vec::new(),
                inbox_charge: vec![0; n],
                published: Published::new(n),
                stop_after: None,
                processing_time: None,
                turn: false,
                stuck: false,
                sent: vec![0; n],
                received: vec![0; n],
                parked: false,
                finished: false,
                lost: None,
            }),
            version: watch::channel(0).0,
            wire,
        })
    }

    /// The engine's link to this end.
    pub fn link(self: &Arc<Self>, layout: ShardLayout) -> ShardLink {
        ShardLink::new(self.id, layout, self.clone())
    }

    /// Applies `frame` from shard `from`, in the order `from` sent it.
    pub fn receive(&self, from: ShardId, frame: Frame) {
        let mut board = self.board.lock();
        let sender = from.index();
        if sender == self.id.index() || sender >= board.received.len() {
            debug!(shard = %self.id, %from, "a frame from no other shard of the job: dropped");
            return;
        }
        board.received[sender] += 1;
        let charge = frame.charge();
        match frame {
            Frame::Deliver(_) if board.finished => {
                // Nothing runs here any more: its credit goes straight back.
                self.wire.taken(from, charge);
            }
            Frame::Deliver(handed) => {
                board.inbox_charge[sender] += charge;
                board.inbox.push(handed);
            }
            Frame::Watermarks(stages) => {
                board.published.publish(sender, &stages);
            }
            Frame::Cut(epoch) => board.published.cut(sender, epoch),
            Frame::ProcessingTime(now) => board.processing_time = Some(now),
            Frame::StopAfter(epoch) => {
                board.stop_after = Some(board.stop_after.map_or(epoch, |e| e.min(epoch)));
            }
            Frame::Finished => board.published.finish(sender),
        }
        board.bump(&self.version);
    }

    /// Applies what the job's quiet detector said.
    pub fn hear(&self, note: Note) {
        let mut board = self.board.lock();
        match note {
            Note::Turn => board.turn = true,
            Note::Stuck => board.stuck = true,
        }
        board.bump(&self.version);
    }

    /// The transport's flow control changed (credit came back, so frames
    /// that waited left): the engine looks again, for producers that
    /// waited on [`Received::exchange_full`].
    pub fn wake(&self) {
        self.board.lock().bump(&self.version);
    }

    /// The transport can no longer carry frames between this shard and
    /// another, for `why`: the engine's next take fails its run (the
    /// first reason is kept).
    pub fn lose(&self, why: String) {
        let mut board = self.board.lock();
        if board.lost.is_none() && !board.finished {
            board.lost = Some(why);
        }
        board.bump(&self.version);
    }

    /// This shard.
    pub fn id(&self) -> ShardId {
        self.id
    }

    /// Takes the inbox's deliveries out, giving their credit back to
    /// their senders.
    fn empty_inbox(&self, board: &mut PeerBoard) -> Vec<Handed> {
        for (from, charge) in board.inbox_charge.iter_mut().enumerate() {
            if *charge > 0 {
                self.wire
                    .taken(ShardId(from as u32), std::mem::take(charge));
            }
        }
        std::mem::take(&mut board.inbox)
    }

    /// Sends `frame` to every other shard.
    fn broadcast(&self, board: &mut PeerBoard, frame: Frame) {
        let me = self.id.index();
        for (to, sent) in board.sent.iter_mut().enumerate() {
            if to != me {
                *sent += 1;
                self.wire.to_peer(ShardId(to as u32), frame.clone());
            }
        }
    }
}

impl ExchangeEnd for PeerEnd {
    fn send(&self, deliveries: Vec<(ShardId, Delivery)>) {
        let mut board = self.board.lock();
        let epoch = board.published.cut_of(self.id.index());
        for (to, delivery) in deliveries {
            match board.sent.get_mut(to.index()) {
                Some(sent) if to != self.id => {
                    *sent += 1;
                    self.wire
                        .to_peer(to, Frame::Deliver(Handed { epoch, delivery }));
                }
                _ => {}
            }
        }
    }

    fn take(&self, stages: usize) -> Received {
        let mut board = self.board.lock();
        let me = self.id.index();
        let deliveries = self.empty_inbox(&mut board);
        Received {
            deliveries,
            watermarks: board.published.others_watermarks(me, stages),
            over: board.published.others_over(me, stages),
            version: board.version,
            stuck: board.stuck,
            turn: std::mem::take(&mut board.turn),
            processing_time: board.processing_time,
            newest_cut: board.published.newest_cut(),
            others_cut: board.published.others_cut(me),
            stop_after: board.stop_after,
            exchange_full: self.wire.full(),
            lost: board.lost.clone(),
        }
    }

    fn stop_after(&self, epoch: Epoch) {
        let mut board = self.board.lock();
        board.stop_after = Some(board.stop_after.map_or(epoch, |e| e.min(epoch)));
        self.broadcast(&mut board, Frame::StopAfter(epoch));
        board.bump(&self.version);
    }

    fn cut(&self, epoch: Epoch) {
        let mut board = self.board.lock();
        board.published.cut(self.id.index(), epoch);
        self.broadcast(&mut board, Frame::Cut(epoch));
    }

    fn publish_processing_time(&self, now: Timestamp) {
        let mut board = self.board.lock();
        if board.processing_time != Some(now) {
            board.processing_time = Some(now);
            self.broadcast(&mut board, Frame::ProcessingTime(now));
        }
    }

    fn publish(&self, stages: Vec<(Timestamp, bool)>) {
        let mut board = self.board.lock();
        if board.published.publish(self.id.index(), &stages) {
            self.broadcast(&mut board, Frame::Watermarks(stages));
        }
    }

    fn finish(&self) {
        let mut board = self.board.lock();
        board.finished = true;
        board.published.finish(self.id.index());
        self.broadcast(&mut board, Frame::Finished);
        // Deliveries left in the inbox will never be taken here.
        self.empty_inbox(&mut board);
        self.wire.to_detector(Report::Finished {
            sent: board.sent.clone(),
        });
    }

    fn park(&self, seen: u64, can_step: bool, waking: bool) -> Parked {
        let mut board = self.board.lock();
        if board.version != seen {
            return Parked::Changed;
        }
        board.parked = true;
        self.wire.to_detector(Report::Parked {
            can_step,
            waking,
            sent: board.sent.clone(),
            received: board.received.clone(),
        });
        Parked::Waiting
    }

    fn unpark(&self) {
        let mut board = self.board.lock();
        if std::mem::take(&mut board.parked) {
            self.wire.to_detector(Report::Unparked);
        }
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::plan::PCollectionIdx;
    use crate::shards::frames::FRAME_OVERHEAD_BYTES;
    use crate::time::MIN_TIMESTAMP;

    /// A wire that records what it was asked to carry.
    #[derive(Default)]
    struct Recorded {
        frames: Mutex<Vec<(ShardId, Frame)>>,
        reports: Mutex<Vec<Report>>,
        taken: Mutex<Vec<(ShardId, usize)>>,
        full: std::sync::atomic::AtomicBool,
    }

    impl FrameWire for Recorded {
        fn to_peer(&self, to: ShardId, frame: Frame) {
            self.frames.lock().push((to, frame));
        }
        fn to_detector(&self, report: Report) {
            self.reports.lock().push(report);
        }
        fn taken(&self, from: ShardId, bytes: usize) {
            self.taken.lock().push((from, bytes));
        }
        fn full(&self) -> bool {
            self.full.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    fn end(id: u32, shards: u32) -> (Arc<PeerEnd>, Arc<Recorded>) {
        let layout = ShardLayout::new(shards).expect("a layout");
        let wire = Arc::new(Recorded::default());
        (PeerEnd::new(ShardId(id), layout, wire.clone()), wire)
    }

    fn delivery(n: u8) -> Handed {
        Handed {
            epoch: Epoch::NONE,
            delivery: Delivery::Owned {
                pcollection: PCollectionIdx::new(0),
                elements: Bytes::from(vec![n; 10]),
            },
        }
    }

    #[test]
    fn a_take_sees_a_watermark_with_every_element_sent_before_it() {
        let (end, wire) = end(1, 3);
        end.receive(ShardId(0), Frame::Deliver(delivery(1)));
        end.receive(ShardId(0), Frame::Watermarks(vec![(5, false)]));
        let took = end.take(1);
        assert_eq!(took.deliveries.len(), 1);
        // Shard 2 published nothing: the least is still −∞.
        assert_eq!(
            took.watermarks.iter().copied().collect::<Vec<_>>(),
            [MIN_TIMESTAMP]
        );
        end.receive(ShardId(2), Frame::Watermarks(vec![(7, true)]));
        let took = end.take(1);
        assert_eq!(took.watermarks.iter().copied().collect::<Vec<_>>(), [5]);
        assert_eq!(took.over.iter().copied().collect::<Vec<_>>(), [true]);
        // The first take gave the delivery's credit back to its sender.
        assert_eq!(
            *wire.taken.lock(),
            [(ShardId(0), 10 + FRAME_OVERHEAD_BYTES)]
        );
    }

    #[test]
    fn what_a_shard_tells_goes_to_every_other_shard_counted() {
        let (end, wire) = end(0, 3);
        end.send(vec![
            (ShardId(2), delivery(1).delivery),
            (ShardId(0), delivery(2).delivery),
        ]);
        end.cut(Epoch::NONE.next());
        end.send(vec![(ShardId(2), delivery(3).delivery)]);
        end.publish(vec![(1, false)]);
        end.publish(vec![(1, false)]);
        let frames = wire.frames.lock();
        let to_two: Vec<String> = frames
            .iter()
            .filter(|(to, _)| *to == ShardId(2))
            .map(|(_, f)| match f {
                Frame::Deliver(h) => format!("deliver@{}", h.epoch.number()),
                Frame::Cut(e) => format!("cut {}", e.number()),
                Frame::Watermarks(_) => "watermarks".into(),
                other => format!("{other:?}"),
            })
            .collect();
        // Nothing to itself, the cut between, the unchanged publish once.
        assert_eq!(to_two, ["deliver@0", "cut 1", "deliver@1", "watermarks"]);
        assert_eq!(frames.len(), 6);
        drop(frames);
        let seen = end.take(1).version;
        end.receive(ShardId(1), Frame::Finished);
        assert_eq!(end.park(seen, false, false), Parked::Changed);
        let seen = end.take(1).version;
        assert_eq!(end.park(seen, true, false), Parked::Waiting);
        assert_eq!(
            wire.reports.lock().last(),
            Some(&Report::Parked {
                can_step: true,
                waking: false,
                sent: vec![0, 2, 4],
                received: vec![0, 1, 0],
            })
        );
        end.unpark();
        end.unpark();
        assert_eq!(wire.reports.lock().last(), Some(&Report::Unparked));
        assert_eq!(wire.reports.lock().len(), 2, "unparked once");
    }

    #[test]
    fn the_detector_s_notes_and_the_wire_s_flow_control_show_in_a_take() {
        let (end, wire) = end(0, 2);
        let before = end.take(0).version;
        end.hear(Note::Turn);
        let took = end.take(0);
        assert!(took.turn && !took.stuck && took.version != before);
        assert!(!end.take(0).turn, "a turn is taken once");
        wire.full.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(end.take(0).exchange_full);
        end.hear(Note::Stuck);
        assert!(end.take(0).stuck);
    }

    #[test]
    fn a_finished_shard_gives_credit_back_at_once_and_frames_from_nowhere_drop() {
        let (end, wire) = end(1, 2);
        end.receive(ShardId(0), Frame::Deliver(delivery(1)));
        end.finish();
        end.receive(ShardId(0), Frame::Deliver(delivery(2)));
        end.receive(ShardId(1), Frame::Deliver(delivery(3)));
        end.receive(ShardId(9), Frame::Deliver(delivery(4)));
        assert_eq!(
            *wire.taken.lock(),
            [
                (ShardId(0), 10 + FRAME_OVERHEAD_BYTES),
                (ShardId(0), 10 + FRAME_OVERHEAD_BYTES)
            ]
        );
        assert!(matches!(
            wire.reports.lock().last(),
            Some(Report::Finished { sent }) if sent == &[1, 0]
        ));
    }
}
