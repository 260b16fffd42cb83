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
//!
//! A GroupByKey's firing of many elements reaches an SDK stage's or a
//! Flatten's queue as one run of them ([`Queued::Run`]), which bundles
//! take whole or cut where they need; whatever needs one element at a time (a gated, keyed or
//! time-sorted stage's take, a checkpoint, the spill space) takes a run's
//! elements one by one.
//!
//! A queue far past its bound (one bundle's output can be any size) keeps
//! its back in the spill space (`overflow`); bundles take only from its
//! memory part, which is refilled from the store as it drains. With a
//! durable spill space beside the checkpoints, a periodic checkpoint names that
//! back instead of copying it.

use std::collections::VecDeque;

use crate::coder::{DecodedElement, ElementRun};
use crate::holds::Holds;
use crate::spill::SpillError;
use crate::time::Timestamp;

#[cfg(test)]
mod durable_tests;
mod overflow;
mod queued;
#[cfg(test)]
mod run_tests;
pub(super) use overflow::Overflow;
pub(crate) use overflow::SpilledQueue;
pub(super) use queued::{chunk_entries, element_count, truncate_elements, Queued};

/// A stage's queue of elements waiting for a bundle.
#[derive(Default)]
pub(super) struct Pending {
    /// The front of the queue, in memory.
    queue: VecDeque<Queued>,
    /// Elements in `queue` (a run counts each of its elements).
    queued: usize,
    /// Runs in `queue`.
    runs: usize,
    /// Holds of every waiting element, wherever it waits.
    holds: Holds,
    /// Bytes of every waiting element.
    bytes: usize,
    /// Bytes of the elements in `queue`.
    memory_bytes: usize,
    /// The back of the queue, in the spill space, if it may spill.
    overflow: Option<Overflow>,
    /// Only the durable prefix may be taken.
    gated: bool,
    /// Length of the durable prefix.
    durable: usize,
    /// Elements ever queued last: a checkpoint's mark.
    pushed: u64,
}

impl Pending {
    /// Let the queue keep its back in the spill space once it holds more
    /// than twice `overflow`'s bound (not for a gated queue, whose durable
    /// prefix is counted in memory).
    pub(super) fn enable_overflow(&mut self, overflow: Overflow) {
        if !self.gated {
            self.overflow = Some(overflow);
        }
    }

    /// An empty queue that spills as this one does.
    pub(super) fn emptied(&self) -> Pending {
        Pending {
            overflow: self.overflow.as_ref().map(Overflow::emptied),
            gated: self.gated,
            ..Pending::default()
        }
    }

    /// Bytes the queue wrote to the spill space so far.
    pub(super) fn spilled_bytes(&self) -> u64 {
        self.overflow.as_ref().map_or(0, |o| o.written)
    }

    /// Whether some waiting elements are in the spill space.
    pub(super) fn has_spilled(&self) -> bool {
        self.overflow.as_ref().is_some_and(|o| !o.is_empty())
    }

    /// Whether some waiting elements are on scratch disk, which a periodic
    /// checkpoint would have to copy back.
    pub(super) fn holds_scratch_spill(&self) -> bool {
        self.overflow
            .as_ref()
            .is_some_and(|o| !o.is_durable() && !o.is_empty())
    }

    /// A checkpoint of the queue. `front` is called with the elements it
    /// copies, oldest first; if `named` (a periodic checkpoint) and the
    /// queue spills to a durable spill space, the spilled segments are named
    /// instead of copied, and `tail` is called with the elements that come
    /// after them. Errors only if the store does.
    pub(super) fn checkpoint(
        &self,
        named: bool,
        mut front: impl FnMut(&DecodedElement),
        tail: impl FnMut(&DecodedElement),
    ) -> Result<Option<SpilledQueue>, SpillError> {
        match &self.overflow {
            Some(o) if named && o.is_durable() => {
                self.queue
                    .iter()
                    .for_each(|q| q.for_each_element(&mut front));
                Ok(Some(o.checkpoint(tail)))
            }
            _ => self.for_each(front).map(|()| None),
        }
    }

    /// Periodic checkpoint `number` was taken (see [`Overflow::checkpoint_taken`]).
    pub(super) fn checkpoint_taken(&mut self, number: u64) {
        if let Some(o) = &mut self.overflow {
            o.checkpoint_taken(number);
        }
    }

    /// Checkpoints up to `number` are durable: spilled segments only
    /// earlier ones named are deleted.
    pub(super) fn checkpoint_durable(&mut self, number: u64) -> Result<(), SpillError> {
        match &mut self.overflow {
            Some(o) => o.checkpoint_durable(number),
            None => Ok(()),
        }
    }

    /// Empties the queue and puts back what a checkpoint kept of it:
    /// `front`, then the segments `spilled` names on the durable spill space and
    /// the elements after them. What the durable spill space holds that the
    /// checkpoint does not name is deleted.
    pub(super) fn restore(
        &mut self,
        front: Vec<DecodedElement>,
        spilled: Option<(SpilledQueue, Vec<DecodedElement>)>,
    ) -> Result<(), SpillError> {
        *self = self.emptied();
        if let Some(o) = self.overflow.as_mut().filter(|o| o.is_durable()) {
            let unnamed = SpilledQueue::default();
            o.forget_unnamed(spilled.as_ref().map_or(&unnamed, |(record, _)| record))?;
        }
        for e in front {
            self.push_back(e)?;
        }
        let Some((record, tail)) = spilled else {
            return Ok(());
        };
        let Some(o) = self.overflow.as_mut().filter(|o| o.is_durable()) else {
            return Err(SpillError(
                "the checkpoint names spilled elements of a queue that has no durable spill space here"
                    .into(),
            ));
        };
        let (holds, bytes, pushed) = (&mut self.holds, &mut self.bytes, &mut self.pushed);
        o.append_restored(record, |e| {
            holds.add(e.header.timestamp);
            *bytes += e.encoded.len();
            *pushed += 1;
        })?;
        for e in tail {
            self.push_back(e)?;
        }
        Ok(())
    }

    /// Queue an element last. Errors only if the spill space does.
    pub(super) fn push_back(&mut self, e: DecodedElement) -> Result<(), SpillError> {
        self.holds.add(e.header.timestamp);
        let len = e.encoded.len();
        self.bytes += len;
        self.pushed += 1;
        match &mut self.overflow {
            Some(o) if o.takes(self.memory_bytes, len) => o.push(e)?,
            _ => {
                self.memory_bytes += len;
                self.queued += 1;
                self.queue.push_back(Queued::One(e));
            }
        }
        Ok(())
    }

    /// Queue a run of elements last, as one entry (element by element
    /// where the queue keeps them so: a gated queue counts its durable
    /// prefix in elements, and its spill space takes single elements).
    /// Errors only if the spill space does.
    pub(super) fn push_run(&mut self, run: ElementRun) -> Result<(), SpillError> {
        let len = run.encoded_len();
        let spills = self
            .overflow
            .as_ref()
            .is_some_and(|o| o.takes(self.memory_bytes, len));
        if self.gated || spills {
            return run.elements().try_for_each(|e| self.push_back(e));
        }
        let entry = Queued::Run(run);
        entry.hold_in(&mut self.holds);
        self.bytes += len;
        self.memory_bytes += len;
        self.pushed += entry.len() as u64;
        self.queued += entry.len();
        self.runs += 1;
        self.queue.push_back(entry);
        Ok(())
    }

    /// Queue an entry first (a retried bundle's input, durable if the
    /// stage is gated, as it was taken from the durable prefix).
    pub(super) fn push_front(&mut self, q: Queued) {
        q.hold_in(&mut self.holds);
        self.bytes += q.encoded_len();
        self.memory_bytes += q.encoded_len();
        self.durable += q.len();
        self.queued += q.len();
        self.runs += usize::from(matches!(q, Queued::Run(_)));
        self.queue.push_front(q);
    }

    /// Reads spilled elements back while the memory part holds less than
    /// the queue's bound. Bundles take only from memory: call it first.
    pub(super) fn refill(&mut self) -> Result<(), SpillError> {
        let Some(o) = &mut self.overflow else {
            return Ok(());
        };
        while self.memory_bytes < o.limit && !o.is_empty() {
            for e in o.pop_front()? {
                self.memory_bytes += e.encoded.len();
                self.queued += 1;
                self.queue.push_back(Queued::One(e));
            }
        }
        Ok(())
    }

    /// From now on, hand out only elements a durable checkpoint holds. (A
    /// gated queue does not spill; stages are gated before they run.)
    pub(super) fn gate(&mut self) {
        self.gated = true;
        self.split_runs();
        if !self.has_spilled() {
            self.overflow = None;
        }
    }

    /// Whether the stage is gated and some waiting element is not durable
    /// yet, so a checkpoint would let work go on.
    pub(super) fn awaits_checkpoint(&self) -> bool {
        self.gated && self.durable < self.queued
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
        self.durable = self.durable.max(self.queued.saturating_sub(since));
    }

    /// Everything waiting is durable (it was just restored from a checkpoint).
    pub(super) fn all_durable(&mut self) {
        self.durable = self.queued;
    }

    /// How many elements from the front may be taken.
    fn takeable(&self) -> usize {
        if self.gated {
            self.durable.min(self.queued)
        } else {
            self.queued
        }
    }

    fn release(&mut self, q: &Queued) {
        q.release_from(&mut self.holds);
        self.bytes -= q.encoded_len();
        self.memory_bytes -= q.encoded_len();
        self.queued -= q.len();
        self.runs -= usize::from(matches!(q, Queued::Run(_)));
    }

    /// Replaces every run in the memory part by its elements, in place,
    /// for what takes one element at a time. Each element then holds at
    /// its own timestamp.
    fn split_runs(&mut self) {
        if self.runs == 0 {
            return;
        }
        self.runs = 0;
        let mut split = VecDeque::with_capacity(self.queued);
        for q in std::mem::take(&mut self.queue) {
            match q {
                Queued::One(_) => split.push_back(q),
                Queued::Run(run) => {
                    self.holds.remove_many(run.hold(), run.len());
                    for e in run.elements() {
                        self.holds.add(e.header.timestamp);
                        split.push_back(Queued::One(e));
                    }
                }
            }
        }
        self.queue = split;
    }

    /// Take up to `max` elements from the front (of the memory part), a
    /// run as one entry (or the part of it that fits).
    pub(super) fn take(&mut self, max: usize) -> Vec<Queued> {
        let n = self.takeable().min(max);
        self.durable = self.durable.saturating_sub(n);
        if n == self.queued && !self.has_spilled() {
            // Everything: hand over the queue's buffer instead of moving
            // each entry, and drop the holds and bytes all at once.
            self.holds = Holds::default();
            self.bytes = 0;
            self.memory_bytes = 0;
            self.queued = 0;
            self.runs = 0;
            return Vec::from(std::mem::take(&mut self.queue));
        }
        if self.runs == 0 {
            // Single elements only: one entry per element.
            let taken: Vec<Queued> = self.queue.drain(..n.min(self.queue.len())).collect();
            for q in &taken {
                self.release(q);
            }
            return taken;
        }
        let mut taken = Vec::new();
        let mut left = n;
        while left > 0 {
            let Some(mut q) = self.queue.pop_front() else {
                break;
            };
            if q.len() > left {
                if let Queued::Run(run) = &mut q {
                    // The run's hold stays with both parts.
                    let front = Queued::Run(run.split_to(left));
                    self.release(&front);
                    // The rest of the run stays, still a run.
                    self.runs += 1;
                    taken.push(front);
                    self.queue.push_front(q);
                    break;
                }
            }
            left -= q.len();
            self.release(&q);
            taken.push(q);
        }
        taken
    }

    /// Take up to `max` elements of the memory part that `ready` accepts,
    /// keeping the order of the rest. Reads the queue only as far as it
    /// has to: a keyed stage takes a bundle for one slice of its keys out
    /// of a long queue again and again, and each take must not cost the
    /// whole queue.
    pub(super) fn take_where(
        &mut self,
        max: usize,
        mut ready: impl FnMut(&DecodedElement) -> bool,
    ) -> Vec<DecodedElement> {
        self.split_runs();
        let takeable = self.takeable();
        let mut taken = Vec::new();
        let mut passed_over = Vec::new();
        let mut scanned = 0;
        let mut kept_durable = 0;
        while scanned < takeable && taken.len() < max {
            let e = match self.queue.pop_front() {
                Some(Queued::One(e)) => e,
                // `split_runs` left none; were one here, it would stay.
                Some(run @ Queued::Run(_)) => {
                    self.queue.push_front(run);
                    break;
                }
                None => break,
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
            self.queue.push_front(Queued::One(e));
        }
        // Durable elements left behind are still the queue's first ones.
        self.durable = kept_durable + self.durable.saturating_sub(scanned);
        for e in &taken {
            self.holds.remove(e.header.timestamp);
            self.bytes -= e.encoded.len();
            self.memory_bytes -= e.encoded.len();
            self.queued -= 1;
        }
        taken
    }

    /// Whether some element of the memory part satisfies `pred` (what a
    /// bundle could take now).
    pub(super) fn any(&self, mut pred: impl FnMut(&DecodedElement) -> bool) -> bool {
        self.queue.iter().any(|q| match q {
            Queued::One(e) => pred(e),
            Queued::Run(run) => run.elements().any(|e| pred(&e)),
        })
    }

    /// Calls `f` with every waiting element, oldest first, reading spilled
    /// ones back (a checkpoint records them all).
    pub(super) fn for_each(&self, mut f: impl FnMut(&DecodedElement)) -> Result<(), SpillError> {
        self.queue.iter().for_each(|q| q.for_each_element(&mut f));
        match &self.overflow {
            Some(o) => o.for_each(f),
            None => Ok(()),
        }
    }

    /// How many segments of the queue are on disk.
    #[cfg(test)]
    pub(super) fn segments_on_disk(&self) -> usize {
        self.overflow.as_ref().map_or(0, Overflow::segment_count)
    }

    /// Number of waiting elements.
    pub(super) fn len(&self) -> usize {
        self.queued + self.overflow.as_ref().map_or(0, Overflow::len)
    }

    /// Whether nothing waits.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty() && !self.has_spilled()
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
    use crate::coder::{Coder, PaneInfo, WindowedValueHeader};
    use crate::spill::MemorySpillSpace;
    use crate::window::Window;
    use bytes::Bytes;
    use std::sync::Arc;

    /// An element whose one byte of value is `n`, at timestamp `n`.
    fn element(n: u8) -> DecodedElement {
        let header = WindowedValueHeader {
            timestamp: i64::from(n),
            windows: smallvec::smallvec![Window::Global],
            pane: PaneInfo::NO_FIRING,
        };
        DecodedElement::new(header, Bytes::copy_from_slice(&[n]), 0)
    }

    /// [`Pending::take`], element by element.
    fn take(p: &mut Pending, max: usize) -> Vec<DecodedElement> {
        p.take(max)
            .into_iter()
            .flat_map(Queued::into_elements)
            .collect()
    }

    fn values(elements: &[DecodedElement]) -> Vec<u8> {
        elements.iter().map(|e| e.value()[0]).collect()
    }

    fn queue(n: u8) -> Pending {
        let mut p = Pending::default();
        for i in 0..n {
            p.push_back(element(i)).unwrap();
        }
        p
    }

    fn all(p: &Pending) -> Vec<DecodedElement> {
        let mut out = Vec::new();
        p.for_each(|e| out.push(e.clone())).unwrap();
        out
    }

    #[test]
    fn a_take_where_stops_at_its_bound_and_keeps_the_order_of_the_rest() {
        let mut p = queue(10);
        let odd = |e: &DecodedElement| e.value()[0] % 2 == 1;
        assert_eq!(values(&p.take_where(2, odd)), [1, 3]);
        assert_eq!(values(&all(&p)), [0, 2, 4, 5, 6, 7, 8, 9]);
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
        p.push_back(element(4)).unwrap();
        p.push_back(element(5)).unwrap();
        p.made_durable(mark);
        assert!(p.awaits_checkpoint());
        let even = |e: &DecodedElement| e.value()[0].is_multiple_of(2);
        assert_eq!(values(&p.take_where(1, even)), [0]);
        assert_eq!(values(&p.take_where(10, even)), [2], "4 is not durable");
        assert_eq!(
            values(&take(&mut p, 10)),
            [1, 3],
            "the durable rest, in order"
        );
        assert!(take(&mut p, 10).is_empty());
        p.made_durable(p.checkpoint_mark());
        assert_eq!(values(&p.take_where(10, even)), [4]);
        assert_eq!(values(&take(&mut p, 10)), [5]);
    }

    /// A queue with a bound of `limit` bytes that spills to `store`.
    fn spilling(store: &Arc<MemorySpillSpace>, limit: usize) -> Pending {
        let mut p = Pending::default();
        p.enable_overflow(Overflow::new(
            store.clone(),
            b"q".to_vec(),
            Coder::GlobalWindow,
            limit,
        ));
        p
    }

    /// An element of about 1 MiB, at timestamp `n`.
    fn big(n: u8) -> DecodedElement {
        let header = WindowedValueHeader {
            timestamp: i64::from(n),
            windows: smallvec::smallvec![Window::Global],
            pane: PaneInfo::NO_FIRING,
        };
        let mut encoded = Vec::new();
        header.encode(&Coder::GlobalWindow, &mut encoded).unwrap();
        let value_start = encoded.len();
        encoded.push(n);
        encoded.resize(value_start + (1 << 20), n);
        DecodedElement::new(header, Bytes::from(encoded), value_start)
    }

    /// Past twice its bound a queue keeps its back in the store, counts
    /// it all (length, bytes, holds), hands out only what is in memory,
    /// reads the rest back in order as it drains, and leaves the store
    /// empty.
    #[test]
    fn a_queue_far_past_its_bound_spills_its_back_and_reads_it_back_in_order() {
        let store = MemorySpillSpace::shared();
        let mut p = spilling(&store, 2 << 20);
        for n in (0..40).rev() {
            p.push_back(big(n)).unwrap();
        }
        assert!(p.has_spilled());
        assert!(!store.is_empty(), "whole segments were written");
        assert_eq!(p.len(), 40);
        assert!(p.bytes() > 40 << 20);
        assert_eq!(p.hold(), Some(0), "the spilled elements hold too");
        assert!(p.spilled_bytes() > 30 << 20);
        let everything = all(&p);
        assert_eq!(everything.len(), 40);
        assert_eq!(everything[39].value()[0], 0);
        let mut order = Vec::new();
        while !p.is_empty() {
            p.refill().unwrap();
            let taken = take(&mut p, 3);
            assert!(!taken.is_empty(), "a refilled queue has something to take");
            assert!(p.memory_bytes <= 6 << 20, "memory holds about the bound");
            order.extend(taken.iter().map(|e| e.value()[0]));
        }
        assert_eq!(order, (0..40).rev().collect::<Vec<u8>>());
        assert_eq!((p.bytes(), p.hold()), (0, None));
        assert!(store.is_empty(), "segments are deleted as they are read");
    }

    /// A checkpoint sees every element; a restored queue spills as the
    /// old one did; a dropped one deletes what it spilled.
    #[test]
    fn spilled_elements_are_in_checkpoints_and_go_with_their_queue() {
        let store = MemorySpillSpace::shared();
        let mut p = spilling(&store, 1 << 20);
        for n in 0..12 {
            p.push_back(big(n)).unwrap();
        }
        let recorded = all(&p);
        assert_eq!(values(&recorded), (0..12).collect::<Vec<u8>>());
        let mut restored = p.emptied();
        drop(p);
        assert!(store.is_empty(), "a dropped queue's segments are deleted");
        for e in recorded {
            restored.push_back(e).unwrap();
        }
        assert!(restored.has_spilled() && !store.is_empty());
        // A gated queue never spills.
        let mut gated = Pending::default();
        gated.gate();
        gated.enable_overflow(Overflow::new(
            store.clone(),
            b"g".to_vec(),
            Coder::GlobalWindow,
            1,
        ));
        for n in 0..8 {
            gated.push_back(big(n)).unwrap();
        }
        assert!(!gated.has_spilled());
    }
}
