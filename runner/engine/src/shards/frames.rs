//! The frame protocol's messages: what one shard sends another over the
//! ordered stream between them, what a shard reports to the job's quiet
//! detector, and what the detector tells a shard. A transport carries them
//! (in one process over channels, between processes over gRPC); what they
//! mean is [`super::peer`]'s and [`super::quiet`]'s.

use super::exchange::Handed;
use super::Epoch;
use crate::time::Timestamp;

/// What flow control charges a frame that carries no elements: its header
/// and numbers, about.
pub const FRAME_OVERHEAD_BYTES: usize = 32;

/// One frame from one shard to another. Frames from one shard to another
/// arrive in the order they were sent, and each changes what the receiver
/// sees of the sender.
#[derive(Debug, Clone)]
pub enum Frame {
    /// Elements for the receiver, tagged with the sender's last cut epoch.
    Deliver(Handed),
    /// The sender's output watermark and queue bound, per stage in stage
    /// order.
    Watermarks(Vec<(Timestamp, bool)>),
    /// The sender cut this checkpoint epoch.
    Cut(Epoch),
    /// The scripted processing time of the shard replaying the TestStream.
    ProcessingTime(Timestamp),
    /// Every shard stops once its cut of this epoch is complete.
    StopAfter(Epoch),
    /// The sender finished: every stage of it at +∞.
    Finished,
}

impl Frame {
    /// What flow control charges for this frame.
    pub fn charge(&self) -> usize {
        match self {
            Frame::Deliver(handed) => {
                let (_, _, elements) = handed.delivery.parts();
                elements.len() + FRAME_OVERHEAD_BYTES
            }
            Frame::Watermarks(stages) => stages.len() * 9 + FRAME_OVERHEAD_BYTES,
            _ => FRAME_OVERHEAD_BYTES,
        }
    }
}

/// What a shard reports to its job's quiet detector, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// The shard is quiet (see [`super::ShardLink::park`]) and saw, per
    /// shard, `received` frames from it; it has sent, per shard, `sent`.
    Parked {
        /// TestStream events are left to apply here.
        can_step: bool,
        /// Something is due here later (a timer, a retry).
        waking: bool,
        /// Frames sent to each shard so far.
        sent: Vec<u64>,
        /// Frames taken from each shard so far.
        received: Vec<u64>,
    },
    /// The shard has work again.
    Unparked,
    /// The shard finished, having sent, per shard, `sent` frames.
    Finished {
        /// Frames sent to each shard, in all.
        sent: Vec<u64>,
    },
}

/// What the quiet detector tells a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    /// Every shard is quiet: apply the TestStream's next event.
    Turn,
    /// Every shard is quiet with nothing due: the job cannot progress.
    Stuck,
}
