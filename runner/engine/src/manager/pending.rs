//! The elements waiting for a stage, with what they hold and weigh.
//!
//! Every pending element holds its stage's output watermark at its
//! timestamp, and counts against the stage's share of memory: producers of
//! a stage whose queue is over its bound are not scheduled (backpressure).
//!
//! A stage with stable input (`@RequiresStableInput`) in a checkpointed run
//! is *gated*: only the elements at the front of its queue that a durable
//! checkpoint holds may be taken. New elements join at the back, taken
//! ones leave from the front and a retried bundle's come back to the front
//! (they were durable when taken), so the durable elements are always a
//! prefix of the queue: its length is all the queue needs to know.

use super::*;

/// A stage's queue of elements waiting for a bundle.
#[derive(Default)]
pub(super) struct Pending {
    queue: VecDeque<DecodedElement>,
    holds: Holds,
    bytes: usize,
    /// Only the durable prefix may be taken.
    gated: bool,
    /// Length of the durable prefix.
    durable: usize,
    /// Elements ever queued last: a checkpoint's mark.
    pushed: u64,
}

impl Pending {
    /// Queue an element last.
    pub(super) fn push_back(&mut self, e: DecodedElement) {
        self.holds.add(e.header.timestamp);
        self.bytes += e.encoded.len();
        self.queue.push_back(e);
        self.pushed += 1;
    }

    /// Queue an element first (a retried bundle's input, durable if the
    /// stage is gated, as it was taken from the durable prefix).
    pub(super) fn push_front(&mut self, e: DecodedElement) {
        self.holds.add(e.header.timestamp);
        self.bytes += e.encoded.len();
        self.queue.push_front(e);
        self.durable += 1;
    }

    /// From now on, hand out only elements a durable checkpoint holds.
    pub(super) fn gate(&mut self) {
        self.gated = true;
    }

    /// Whether the stage is gated and some waiting element is not durable
    /// yet, so a checkpoint would let work go on.
    pub(super) fn awaits_checkpoint(&self) -> bool {
        self.gated && self.durable < self.queue.len()
    }

    /// Where a checkpoint taken now cuts this queue (see [`Self::made_durable`]).
    pub(super) fn checkpoint_mark(&self) -> u64 {
        self.pushed
    }

    /// The checkpoint taken at `mark` is durable: every element queued
    /// before it is. Those queued since are the queue's last ones (a gated
    /// stage never takes them), so the rest is the durable prefix.
    pub(super) fn made_durable(&mut self, mark: u64) {
        let since = usize::try_from(self.pushed.saturating_sub(mark)).unwrap_or(usize::MAX);
        self.durable = self.durable.max(self.queue.len().saturating_sub(since));
    }

    /// Everything waiting is durable (it was just restored from a checkpoint).
    pub(super) fn all_durable(&mut self) {
        self.durable = self.queue.len();
    }

    /// How many elements from the front may be taken.
    fn takeable(&self) -> usize {
        if self.gated {
            self.durable.min(self.queue.len())
        } else {
            self.queue.len()
        }
    }

    fn release(&mut self, e: &DecodedElement) {
        self.holds.remove(e.header.timestamp);
        self.bytes -= e.encoded.len();
    }

    /// Take up to `max` elements from the front.
    pub(super) fn take(&mut self, max: usize) -> Vec<DecodedElement> {
        let n = self.takeable().min(max);
        self.durable = self.durable.saturating_sub(n);
        if n == self.queue.len() {
            // Everything: hand over the queue's buffer instead of moving
            // each element, and drop the holds and bytes all at once.
            self.holds = Holds::default();
            self.bytes = 0;
            return Vec::from(std::mem::take(&mut self.queue));
        }
        let taken: Vec<DecodedElement> = self.queue.drain(..n).collect();
        for e in &taken {
            self.release(e);
        }
        taken
    }

    /// Take up to `max` elements that `ready` accepts, keeping the order of
    /// the rest.
    pub(super) fn take_where(
        &mut self,
        max: usize,
        mut ready: impl FnMut(&DecodedElement) -> bool,
    ) -> Vec<DecodedElement> {
        let mut taken = Vec::new();
        let mut waiting = VecDeque::with_capacity(self.queue.len());
        let takeable = self.takeable();
        let mut kept_durable = 0;
        for (i, e) in self.queue.drain(..).enumerate() {
            if i < takeable && taken.len() < max && ready(&e) {
                taken.push(e);
            } else {
                if i < self.durable {
                    kept_durable += 1;
                }
                waiting.push_back(e);
            }
        }
        self.queue = waiting;
        // Durable elements left behind are still the queue's first ones.
        self.durable = kept_durable;
        for e in &taken {
            self.release(e);
        }
        taken
    }

    /// Whether some waiting element satisfies `pred`.
    pub(super) fn any(&self, pred: impl FnMut(&DecodedElement) -> bool) -> bool {
        self.queue.iter().any(pred)
    }

    /// The waiting elements, oldest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &DecodedElement> {
        self.queue.iter()
    }

    /// Number of waiting elements.
    pub(super) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing waits.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Encoded bytes waiting.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The earliest timestamp waiting.
    pub(super) fn hold(&self) -> Option<Timestamp> {
        self.holds.min()
    }
}
