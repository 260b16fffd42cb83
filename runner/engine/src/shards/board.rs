//! The in-process exchange: one board holding every shard's inbox and what
//! every shard published, behind one lock. The one lock is the ordering
//! rule of [`super::exchange`] for free: a send lands in the inbox before
//! the publish that follows it, and a take reads inbox and watermarks
//! under the same lock. It also decides at once when the job is quiet,
//! since it sees every shard park.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

use super::exchange::{Delivery, ExchangeEnd, Handed, Parked, Received};
use super::views::Published;
use super::{Epoch, ShardId, ShardLayout, ShardLink};
use crate::time::Timestamp;

/// The shared board.
struct Board {
    version: u64,
    inboxes: Vec<Vec<Handed>>,
    published: Published,
    /// Every shard stops once its cut of this epoch is complete.
    stop_after: Option<Epoch>,
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
}

/// The board and its version's broadcast.
struct Shared {
    board: Mutex<Board>,
    version: watch::Sender<u64>,
}

/// One shard's end of the board.
struct BoardEnd {
    me: usize,
    shared: Arc<Shared>,
}

impl ShardLink {
    /// The links of every shard of `layout`, joined by one board in this
    /// process, in shard order.
    pub fn in_process(layout: ShardLayout) -> Vec<ShardLink> {
        let n = layout.shards() as usize;
        let shared = Arc::new(Shared {
            board: Mutex::new(Board {
                version: 0,
                inboxes: vec![Vec::new(); n],
                published: Published::new(n),
                stop_after: None,
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
            .map(|id| {
                let end = BoardEnd {
                    me: id.index(),
                    shared: shared.clone(),
                };
                ShardLink::new(id, layout, Arc::new(end))
            })
            .collect()
    }
}

impl ExchangeEnd for BoardEnd {
    fn send(&self, deliveries: Vec<(ShardId, Delivery)>) {
        let mut board = self.shared.board.lock();
        let epoch = board.published.cut_of(self.me);
        let mut any = false;
        for (to, delivery) in deliveries {
            if let Some(inbox) = board.inboxes.get_mut(to.index()) {
                inbox.push(Handed { epoch, delivery });
                any = true;
            }
        }
        if any {
            board.bump(&self.shared.version);
        }
    }

    fn take(&self, stages: usize) -> Received {
        let mut board = self.shared.board.lock();
        let me = self.me;
        let deliveries = std::mem::take(&mut board.inboxes[me]);
        let turn = board.turn == Some(me);
        if turn {
            board.turn = None;
        }
        Received {
            deliveries,
            watermarks: board.published.others_watermarks(me, stages),
            over: board.published.others_over(me, stages),
            version: board.version,
            stuck: board.stuck,
            turn,
            processing_time: board.processing_time,
            newest_cut: board.published.newest_cut(),
            others_cut: board.published.others_cut(me),
            stop_after: board.stop_after,
            exchange_full: false,
            lost: None,
        }
    }

    fn stop_after(&self, epoch: Epoch) {
        let mut board = self.shared.board.lock();
        board.stop_after = Some(board.stop_after.map_or(epoch, |e| e.min(epoch)));
        board.bump(&self.shared.version);
    }

    fn cut(&self, epoch: Epoch) {
        let mut board = self.shared.board.lock();
        board.published.cut(self.me, epoch);
        board.bump(&self.shared.version);
    }

    fn publish_processing_time(&self, now: Timestamp) {
        let mut board = self.shared.board.lock();
        if board.processing_time != Some(now) {
            board.processing_time = Some(now);
            board.bump(&self.shared.version);
        }
    }

    fn publish(&self, stages: Vec<(Timestamp, bool)>) {
        let mut board = self.shared.board.lock();
        if board.published.publish(self.me, &stages) {
            board.bump(&self.shared.version);
        }
    }

    fn finish(&self) {
        let mut board = self.shared.board.lock();
        board.published.finish(self.me);
        board.bump(&self.shared.version);
    }

    fn park(&self, seen: u64, can_step: bool, waking: bool) -> Parked {
        let mut board = self.shared.board.lock();
        if board.version != seen {
            return Parked::Changed;
        }
        let me = self.me;
        board.parked[me] = true;
        board.can_step[me] = can_step;
        board.waking[me] = waking;
        let shards = 0..board.parked.len();
        if !shards
            .clone()
            .all(|s| board.parked[s] || board.published.finished(s))
        {
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
                board.bump(&self.shared.version);
                Parked::Waiting
            }
            None if shards.clone().any(|s| board.parked[s] && board.waking[s]) => Parked::Waiting,
            None => {
                board.stuck = true;
                board.bump(&self.shared.version);
                Parked::AllParked
            }
        }
    }

    fn unpark(&self) {
        self.shared.board.lock().parked[self.me] = false;
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.version.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PCollectionIdx;
    use crate::time::{MAX_TIMESTAMP, MIN_TIMESTAMP};
    use bytes::Bytes;

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
