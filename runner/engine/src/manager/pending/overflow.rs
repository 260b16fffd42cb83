//! The part of a stage's queue that waits in the spill space.
//!
//! Backpressure keeps a queue near its bound by not scheduling its
//! producers, but it cannot stop a bundle that is already running: one
//! element whose DoFn emits gigabytes, committed at once, lands in its
//! consumer's queue whole. Past twice its bound, later elements of a queue
//! go to the store instead, in segments of up to a few megabytes, oldest first;
//! the queue reads them back a segment at a time as its memory part drains
//! below its bound. Order is kept (the store part is always the queue's
//! back), and so are the holds and byte counts (the queue counts every
//! element, wherever it is, so producers stay throttled until the backlog,
//! not only its memory part, is worked off).
//!
//! A segment is its elements one after another, each as its value's
//! offset, its length (both `u32` little-endian) and its encoding; read
//! back, the elements are slices of the segment's one buffer.
//!
//! On the spill space (scratch, which a crash empties) a segment is
//! deleted as it is read back, and a checkpoint copies the spilled
//! elements (periodic checkpoints are skipped while a queue has some). On
//! a durable spill space beside the checkpoints ([`Overflow::durable`]) a
//! checkpoint names the segments instead ([`SpilledQueue`]): segments are
//! never rewritten and their numbers never reused, so a checkpoint needs
//! only their numbers and the next number, and a restore deletes every
//! number from that one on (written after the checkpoint). A segment read
//! back is deleted only once a later checkpoint (which does not name it)
//! is durable, and every checkpoint lists the deletes still owed.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::coder::{Coder, DecodedElement, WindowedValueHeader};
use crate::spill::{forget_prefix, prefix_end, Reclaim, SpillError, SpillSpace};

/// About how many bytes of elements one segment holds at most: half the
/// queue's bound, within these.
const SEGMENT_BYTES: (usize, usize) = (64 << 10, 4 << 20);

/// A queue's elements in the spill space, and those on their way there.
#[derive(Debug)]
pub(in crate::manager) struct Overflow {
    store: Arc<dyn SpillSpace>,
    /// Every key of this queue starts with it.
    prefix: Vec<u8>,
    /// The window coder of the queue's elements (their headers are decoded
    /// again when they are read back).
    window_coder: Coder,
    /// The queue's bound: it spills past twice this, and reads back while
    /// its memory part holds less.
    pub(super) limit: usize,
    /// Segments written, oldest first.
    segments: VecDeque<Segment>,
    /// Elements after the last segment, not written yet.
    open: Vec<DecodedElement>,
    open_bytes: usize,
    /// The next segment's number.
    next: u64,
    /// Elements here (segments and open).
    len: usize,
    /// Bytes written to the store so far.
    pub(super) written: u64,
    /// When segments read back are deleted (by segment number).
    reclaim: Reclaim<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Segment {
    number: u64,
    elements: u32,
}

/// What a checkpoint keeps of a queue's back on a durable spill space: the
/// segments by number (not their elements), and the deletes still owed.
/// The elements not written yet, which come after the segments, are in
/// the checkpoint with the queue's front.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpilledQueue {
    /// The number of the first segment written after the checkpoint:
    /// every number from it on is not the checkpoint's.
    next: u64,
    /// Oldest first.
    segments: Vec<Segment>,
    /// Segments read back before the checkpoint and not deleted yet.
    owed: Vec<u64>,
}

impl Overflow {
    /// An empty overflow under `prefix` for a queue bound to `limit` bytes.
    pub(in crate::manager) fn new(
        store: Arc<dyn SpillSpace>,
        prefix: Vec<u8>,
        window_coder: Coder,
        limit: usize,
    ) -> Self {
        Overflow {
            store,
            prefix,
            window_coder,
            limit,
            segments: VecDeque::new(),
            open: Vec::new(),
            open_bytes: 0,
            next: 0,
            len: 0,
            written: 0,
            reclaim: Reclaim::scratch(),
        }
    }

    /// An empty overflow on `store`, whose writes survive as long as the
    /// checkpoints that name them (see the module docs).
    pub(in crate::manager) fn durable(
        store: Arc<dyn SpillSpace>,
        prefix: Vec<u8>,
        window_coder: Coder,
        limit: usize,
    ) -> Self {
        let mut overflow = Overflow::new(store, prefix, window_coder, limit);
        overflow.reclaim = Reclaim::durable();
        overflow
    }

    /// The same space, empty (a queue restored from a checkpoint).
    pub(super) fn emptied(&self) -> Self {
        let mut overflow = Overflow::new(
            self.store.clone(),
            self.prefix.clone(),
            self.window_coder.clone(),
            self.limit,
        );
        if self.is_durable() {
            overflow.reclaim = Reclaim::durable();
        }
        overflow
    }

    /// Whether checkpoints name the segments instead of copying them.
    pub(super) fn is_durable(&self) -> bool {
        self.reclaim.is_durable()
    }

    /// How many elements wait here.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// How many segments are written (and not read back).
    #[cfg(test)]
    pub(super) fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Whether nothing waits here.
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether an element of `bytes` joining a queue whose memory part
    /// holds `memory_bytes` goes here: once anything is here (order), or
    /// once memory would hold more than twice the bound.
    pub(super) fn takes(&self, memory_bytes: usize, bytes: usize) -> bool {
        !self.is_empty() || memory_bytes + bytes > self.limit.saturating_mul(2)
    }

    /// Queues `e` last.
    pub(super) fn push(&mut self, e: DecodedElement) -> Result<(), SpillError> {
        self.open_bytes += e.encoded.len();
        self.open.push(e);
        self.len += 1;
        if self.open_bytes >= (self.limit / 2).clamp(SEGMENT_BYTES.0, SEGMENT_BYTES.1) {
            self.write_open()?;
        }
        Ok(())
    }

    fn key(&self, number: u64) -> Vec<u8> {
        segment_key(&self.prefix, number)
    }

    fn write_open(&mut self) -> Result<(), SpillError> {
        let mut value = Vec::with_capacity(self.open_bytes + 8 * self.open.len());
        for e in &self.open {
            for n in [e.value_start(), e.encoded.len()] {
                let n = u32::try_from(n).map_err(|_| {
                    SpillError(format!(
                        "an element of {} bytes is too large",
                        e.encoded.len()
                    ))
                })?;
                value.extend_from_slice(&n.to_le_bytes());
            }
            value.extend_from_slice(&e.encoded);
        }
        let number = self.next;
        let elements = u32::try_from(self.open.len())
            .map_err(|_| SpillError("a queue segment of more than 2^32 elements".into()))?;
        self.store.put(vec![(self.key(number), value)])?;
        self.written += self.open_bytes as u64;
        self.next += 1;
        self.segments.push_back(Segment { number, elements });
        self.open.clear();
        self.open_bytes = 0;
        Ok(())
    }

    /// The oldest elements here (a segment, or what was not written yet),
    /// removed; empty if nothing is here.
    pub(super) fn pop_front(&mut self) -> Result<Vec<DecodedElement>, SpillError> {
        let Some(segment) = self.segments.front() else {
            self.len -= self.open.len();
            self.open_bytes = 0;
            return Ok(std::mem::take(&mut self.open));
        };
        let number = segment.number;
        let elements = self.read(number, segment.elements)?;
        let (store, prefix) = (&self.store, &self.prefix);
        self.reclaim
            .consumed([number], |&n| forget_segment(store.as_ref(), prefix, n))?;
        self.segments.pop_front();
        self.len -= elements.len();
        Ok(elements)
    }

    fn read(&self, number: u64, count: u32) -> Result<Vec<DecodedElement>, SpillError> {
        let key = self.key(number);
        let mut end = key.clone();
        end.push(0);
        let mut found = self.store.scan(&key, &end, usize::MAX)?;
        let corrupt =
            |what: &str| SpillError(format!("a spilled queue segment is corrupt ({what})"));
        let (_, value) = found.pop().ok_or_else(|| corrupt("missing"))?;
        let buf = Bytes::from(value);
        let mut elements = Vec::with_capacity(count as usize);
        let mut at = 0;
        while at < buf.len() {
            let word = |at: usize| -> Result<usize, SpillError> {
                let bytes: [u8; 4] = buf
                    .get(at..at + 4)
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| corrupt("lengths"))?;
                Ok(u32::from_le_bytes(bytes) as usize)
            };
            let (value_start, len) = (word(at)?, word(at + 4)?);
            let start = at + 8;
            let encoded = buf
                .get(start..start + len)
                .map(|_| buf.slice(start..start + len))
                .ok_or_else(|| corrupt("element"))?;
            let (header, _) = WindowedValueHeader::decode(&encoded, &self.window_coder)
                .map_err(|e| corrupt(&e.to_string()))?;
            elements.push(DecodedElement::new(header, encoded, value_start));
            at = start + len;
        }
        if elements.len() != count as usize {
            return Err(corrupt("element count"));
        }
        Ok(elements)
    }

    /// Calls `f` with every element here, oldest first (a checkpoint
    /// that copies them records them).
    pub(super) fn for_each(&self, mut f: impl FnMut(&DecodedElement)) -> Result<(), SpillError> {
        for segment in &self.segments {
            for e in self.read(segment.number, segment.elements)? {
                f(&e);
            }
        }
        self.open.iter().for_each(f);
        Ok(())
    }

    /// What a checkpoint keeps of a durable overflow: the segments by
    /// number; `f` is called with the elements not written yet, which it
    /// copies. Once the checkpoint is sent, [`Self::checkpoint_taken`].
    pub(super) fn checkpoint(&self, f: impl FnMut(&DecodedElement)) -> SpilledQueue {
        self.open.iter().for_each(f);
        SpilledQueue {
            next: self.next,
            segments: self.segments.iter().copied().collect(),
            owed: self.reclaim.listed(),
        }
    }

    /// Checkpoint `number` (counting those sent to be written) was taken:
    /// segments read back before it are deleted once it is durable
    /// ([`Self::checkpoint_durable`]).
    pub(super) fn checkpoint_taken(&mut self, number: u64) {
        self.reclaim.checkpoint_taken(number);
    }

    /// Checkpoints up to `number` are durable: segments read back before
    /// them are named by no checkpoint a restore would read. A failed
    /// delete is owed again (the next checkpoint lists it).
    pub(super) fn checkpoint_durable(&mut self, number: u64) -> Result<(), SpillError> {
        let (store, prefix) = (&self.store, &self.prefix);
        self.reclaim
            .checkpoint_durable(number, |&n| forget_segment(store.as_ref(), prefix, n))
    }

    /// Deletes what checkpoint `record` does not name (`None`: it named no
    /// segment): every number from its next one on, and the deletes it
    /// owed. Call on an empty overflow, before the queue's front is pushed
    /// back; then [`Self::append_restored`].
    pub(super) fn forget_unnamed(&mut self, record: &SpilledQueue) -> Result<(), SpillError> {
        let end = prefix_end(&self.prefix).unwrap_or_default();
        self.store.forget_range(&self.key(record.next), &end)?;
        for &segment in &record.owed {
            forget_segment(self.store.as_ref(), &self.prefix, segment)?;
        }
        self.next = record.next;
        Ok(())
    }

    /// Puts the segments `record` names back at the end (after writing
    /// what is not written yet, to keep the order), calling `f` with each
    /// of their elements, read back one segment at a time (the queue
    /// counts their bytes and holds).
    pub(super) fn append_restored(
        &mut self,
        record: SpilledQueue,
        mut f: impl FnMut(&DecodedElement),
    ) -> Result<(), SpillError> {
        if !self.open.is_empty() {
            self.write_open()?;
        }
        for segment in record.segments {
            for e in self.read(segment.number, segment.elements)? {
                f(&e);
            }
            self.len += segment.elements as usize;
            self.segments.push_back(segment);
        }
        Ok(())
    }
}

/// The key of segment `number` under `prefix`.
fn segment_key(prefix: &[u8], number: u64) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(&number.to_be_bytes());
    key
}

/// Forgets segment `number` under `prefix`.
fn forget_segment(store: &dyn SpillSpace, prefix: &[u8], number: u64) -> Result<(), SpillError> {
    forget_prefix(store, &segment_key(prefix, number))
}

impl Drop for Overflow {
    /// Segments on scratch go with their queue; on a durable spill space they
    /// are the checkpoints', and go with the job (or a restore).
    fn drop(&mut self) {
        if self.segments.is_empty() || self.is_durable() {
            return;
        }
        if let Err(e) = forget_prefix(self.store.as_ref(), &self.prefix) {
            tracing::warn!(error = %e, "could not delete a queue's spilled elements");
        }
    }
}
