//! The frame protocol over channels in one process: each pair of shards
//! joined by an ordered channel and a task that hands its frames over, and
//! a task running the quiet detector. It carries exactly what a network
//! transport carries, with the same asynchrony (a frame arrives some time
//! after it was sent, interleaved with other senders' frames however the
//! runtime schedules the tasks), so the engine's tests run the protocol
//! itself through it; it has no flow control.

use std::sync::{Arc, Weak};

use tokio::sync::mpsc;

use super::frames::{Frame, Report};
use super::peer::{FrameWire, PeerEnd};
use super::quiet::QuietDetector;
use super::{ShardId, ShardLayout, ShardLink};

/// One shard's outgoing channels.
struct ChannelWire {
    /// Per shard, the channel to it (none to this shard).
    peers: Vec<Option<mpsc::UnboundedSender<Frame>>>,
    detector: mpsc::UnboundedSender<Report>,
}

impl FrameWire for ChannelWire {
    fn to_peer(&self, to: ShardId, frame: Frame) {
        if let Some(Some(peer)) = self.peers.get(to.index()) {
            // A closed channel: the receiver's job is over.
            let _ = peer.send(frame);
        }
    }

    fn to_detector(&self, report: Report) {
        let _ = self.detector.send(report);
    }

    fn taken(&self, _from: ShardId, _bytes: usize) {}

    fn full(&self) -> bool {
        false
    }
}

impl ShardLink {
    /// The links of every shard of `layout`, joined by the frame protocol
    /// over channels in this process, in shard order. Must be called in a
    /// Tokio runtime, which runs the tasks that carry the frames; they end
    /// with the links.
    pub fn over_channels(layout: ShardLayout) -> Vec<ShardLink> {
        let n = layout.shards() as usize;
        let mut inbound: Vec<Vec<(ShardId, mpsc::UnboundedReceiver<Frame>)>> =
            (0..n).map(|_| Vec::new()).collect();
        let mut reports = Vec::new();
        let mut ends = Vec::new();
        for from in layout.ids() {
            let peers = layout
                .ids()
                .map(|to| {
                    (to != from).then(|| {
                        let (tx, rx) = mpsc::unbounded_channel();
                        inbound[to.index()].push((from, rx));
                        tx
                    })
                })
                .collect();
            let (detector, report_rx) = mpsc::unbounded_channel();
            reports.push((from, report_rx));
            ends.push(PeerEnd::new(
                from,
                layout,
                Arc::new(ChannelWire { peers, detector }),
            ));
        }
        let weak: Vec<Weak<PeerEnd>> = ends.iter().map(Arc::downgrade).collect();
        for (to, streams) in inbound.into_iter().enumerate() {
            for (from, rx) in streams {
                tokio::spawn(carry_frames(from, rx, weak[to].clone()));
            }
        }
        tokio::spawn(detect_quiet(layout, reports, weak));
        ends.iter().map(|end| end.link(layout)).collect()
    }
}

/// Hands `from`'s frames to `to` in order, until either is gone.
async fn carry_frames(
    from: ShardId,
    mut frames: mpsc::UnboundedReceiver<Frame>,
    to: Weak<PeerEnd>,
) {
    while let Some(frame) = frames.recv().await {
        let Some(end) = to.upgrade() else {
            return;
        };
        end.receive(from, frame);
    }
}

/// Runs the job's quiet detector over every shard's reports (each shard's
/// in order), telling the shards what it decides.
async fn detect_quiet(
    layout: ShardLayout,
    reports: Vec<(ShardId, mpsc::UnboundedReceiver<Report>)>,
    ends: Vec<Weak<PeerEnd>>,
) {
    let (merged_tx, mut merged) = mpsc::unbounded_channel();
    for (from, mut rx) in reports {
        let merged_tx = merged_tx.clone();
        tokio::spawn(async move {
            while let Some(report) = rx.recv().await {
                if merged_tx.send((from, report)).is_err() {
                    return;
                }
            }
        });
    }
    drop(merged_tx);
    let mut detector = QuietDetector::new(layout);
    while let Some((from, report)) = merged.recv().await {
        for (to, note) in detector.hear(from, report) {
            if let Some(end) = ends.get(to.index()).and_then(Weak::upgrade) {
                end.hear(note);
            }
        }
    }
}
