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
    /// the rest. Reads the queue only as far as it has to: a keyed stage
    /// takes a bundle for one slice of its keys out of a long queue again
    /// and again, and each take must not cost the whole queue.
    pub(super) fn take_where(
        &mut self,
        max: usize,
        mut ready: impl FnMut(&DecodedElement) -> bool,
    ) -> Vec<DecodedElement> {
        let takeable = self.takeable();
        let mut taken = Vec::new();
        let mut passed_over = Vec::new();
        let mut scanned = 0;
        let mut kept_durable = 0;
        while scanned < takeable && taken.len() < max {
            let Some(e) = self.queue.pop_front() else {
                break;
            };
            if ready(&e) {
                taken.push(e);
            } else {
                if scanned < self.durable {
                    kept_durable += 1;
                }
                passed_over.push(e);
            }
            scanned += 1;
        }
        for e in passed_over.into_iter().rev() {
            self.queue.push_front(e);
        }
        // Durable elements left behind are still the queue's first ones.
        self.durable = kept_durable + self.durable.saturating_sub(scanned);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coder::{PaneInfo, WindowedValueHeader};

    /// An element whose one byte of value is `n`, at timestamp `n`.
    fn element(n: u8) -> DecodedElement {
        let header = WindowedValueHeader {
            timestamp: i64::from(n),
            windows: smallvec::smallvec![Window::Global],
            pane: PaneInfo::NO_FIRING,
        };
        DecodedElement::new(header, Bytes::copy_from_slice(&[n]), 0)
    }

    fn values(elements: &[DecodedElement]) -> Vec<u8> {
        elements.iter().map(|e| e.value()[0]).collect()
    }

    fn queue(n: u8) -> Pending {
        let mut p = Pending::default();
        for i in 0..n {
            p.push_back(element(i));
        }
        p
    }

    #[test]
    fn a_take_where_stops_at_its_bound_and_keeps_the_order_of_the_rest() {
        let mut p = queue(10);
        let odd = |e: &DecodedElement| e.value()[0] % 2 == 1;
        assert_eq!(values(&p.take_where(2, odd)), [1, 3]);
        assert_eq!(
            values(&p.iter().cloned().collect::<Vec<_>>()),
            [0, 2, 4, 5, 6, 7, 8, 9]
        );
        assert_eq!((p.len(), p.bytes(), p.hold()), (8, 8, Some(0)));
        assert_eq!(values(&p.take_where(10, odd)), [5, 7, 9]);
        assert_eq!(values(&p.take_where(10, |_| true)), [0, 2, 4, 6, 8]);
        assert!(p.is_empty() && p.hold().is_none() && p.bytes() == 0);
    }

    /// A gated queue hands out only its durable prefix, and what it passes
    /// over there stays durable and first.
    #[test]
    fn a_gated_take_where_keeps_the_durable_prefix() {
        let mut p = queue(4);
        p.gate();
        let mark = p.checkpoint_mark();
        p.push_back(element(4));
        p.push_back(element(5));
        p.made_durable(mark);
        assert!(p.awaits_checkpoint());
        let even = |e: &DecodedElement| e.value()[0].is_multiple_of(2);
        assert_eq!(values(&p.take_where(1, even)), [0]);
        assert_eq!(values(&p.take_where(10, even)), [2], "4 is not durable");
        assert_eq!(values(&p.take(10)), [1, 3], "the durable rest, in order");
        assert!(p.take(10).is_empty());
        p.made_durable(p.checkpoint_mark());
        assert_eq!(values(&p.take_where(10, even)), [4]);
        assert_eq!(values(&p.take(10)), [5]);
    }
}
