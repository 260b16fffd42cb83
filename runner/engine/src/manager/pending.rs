//! The elements waiting for a stage, with what they hold and weigh.
//!
//! Every pending element holds its stage's output watermark at its
//! timestamp, and counts against the stage's share of memory: producers of
//! a stage whose queue is over its bound are not scheduled (backpressure).

use super::*;

/// A stage's queue of elements waiting for a bundle.
#[derive(Default)]
pub(super) struct Pending {
    queue: VecDeque<DecodedElement>,
    holds: Holds,
    bytes: usize,
}

impl Pending {
    /// Queue an element last.
    pub(super) fn push_back(&mut self, e: DecodedElement) {
        self.holds.add(e.header.timestamp);
        self.bytes += e.encoded.len();
        self.queue.push_back(e);
    }

    /// Queue an element first (a retried bundle's input).
    pub(super) fn push_front(&mut self, e: DecodedElement) {
        self.holds.add(e.header.timestamp);
        self.bytes += e.encoded.len();
        self.queue.push_front(e);
    }

    fn release(&mut self, e: &DecodedElement) {
        self.holds.remove(e.header.timestamp);
        self.bytes -= e.encoded.len();
    }

    /// Take up to `max` elements from the front.
    pub(super) fn take(&mut self, max: usize) -> Vec<DecodedElement> {
        let n = self.queue.len().min(max);
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
        for e in self.queue.drain(..) {
            if taken.len() < max && ready(&e) {
                taken.push(e);
            } else {
                waiting.push_back(e);
            }
        }
        self.queue = waiting;
        for e in &taken {
            self.release(e);
        }
        taken
    }

    /// Whether some waiting element satisfies `pred`.
    pub(super) fn any(&self, pred: impl FnMut(&DecodedElement) -> bool) -> bool {
        self.queue.iter().any(pred)
    }

    /// Number of waiting elements.
    /// The waiting elements, oldest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &DecodedElement> {
        self.queue.iter()
    }

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
