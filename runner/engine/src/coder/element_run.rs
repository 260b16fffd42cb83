//! Encoded elements that travel together: what a GroupByKey's firing
//! emits, queued and handed to a bundle as one run.
//!
//! A firing encodes thousands of `KV<K, Iterable<V>>` elements into one
//! buffer. Queued one by one, each would become a [`DecodedElement`] (a
//! shared slice of the buffer and a copy of its header), be moved into the
//! consumer's queue and out again, and its bytes copied into the bundle's
//! chunks: with every key distinct, that was a third of the engine's time
//! per element. A run keeps the buffer and the firing's record of where
//! each element lies, so a queue takes it in as one entry, a bundle takes
//! it out as one (or a part of it), and its chunks are slices of the
//! buffer. Where one element at a time is needed (a checkpoint, a keyed or
//! gated stage), [`ElementRun::elements`] gives them without decoding.
//!
//! A run holds its consumer's output watermark at the earliest timestamp
//! of all its elements, however many of them are left: a hold no later
//! than any element's, and one that a part of the run releases as a whole.
//!
//! The record ([`RunRecord`]) keeps a header once for each stretch of
//! elements that share it (a batch firing's panes all do): a header is
//! several times the size of an element's extent, and the record of a
//! firing over distinct keys is written once per element.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;

use super::{DecodedElement, WindowedValueHeader};
use crate::time::Timestamp;

/// Where one element of a run's buffer lies.
#[derive(Debug, Clone, Copy)]
struct Extent {
    /// Where its header starts.
    start: usize,
    /// Where its value starts (its header's end).
    value_start: usize,
    /// Where it ends.
    end: usize,
}

/// Where each element of an encoded buffer lies, and its header, in
/// order: what an encoder records while it writes them.
#[derive(Debug, Clone, Default)]
pub struct RunRecord {
    /// Each stretch of elements that share a header: where it starts in
    /// `extents`, and the header (the first starts at 0). One is kept in
    /// place: a streaming trigger's firing is often one element.
    stretches: SmallVec<[(usize, WindowedValueHeader); 1]>,
    /// One per element, in order.
    extents: Vec<Extent>,
}

impl RunRecord {
    /// Records an element whose `header` is encoded at `start..value_start`
    /// and its value at `value_start..end` (a header equal to the last
    /// one recorded is not kept again).
    pub fn push(
        &mut self,
        header: WindowedValueHeader,
        start: usize,
        value_start: usize,
        end: usize,
    ) {
        if !self.continues(&header) {
            self.stretches.push((self.extents.len(), header));
        }
        self.push_extent(start, value_start, end);
    }

    /// [`Self::push`] for a header the caller keeps (cloned only if it
    /// starts a stretch).
    pub fn push_shared(
        &mut self,
        header: &WindowedValueHeader,
        start: usize,
        value_start: usize,
        end: usize,
    ) {
        if !self.continues(header) {
            self.stretches.push((self.extents.len(), header.clone()));
        }
        self.push_extent(start, value_start, end);
    }

    /// Whether `header` is the last stretch's.
    fn continues(&self, header: &WindowedValueHeader) -> bool {
        self.stretches.last().map(|(_, h)| h) == Some(header)
    }

    fn push_extent(&mut self, start: usize, value_start: usize, end: usize) {
        self.extents.push(Extent {
            start,
            value_start,
            end,
        });
    }

    /// Room for `elements` more.
    pub fn reserve(&mut self, elements: usize) {
        self.extents.reserve(elements);
    }

    /// How many elements it records.
    pub fn len(&self) -> usize {
        self.extents.len()
    }

    /// Whether it records none.
    pub fn is_empty(&self) -> bool {
        self.extents.is_empty()
    }

    /// Each element as a shared slice of `buffer`, the buffer it records,
    /// in order: each stretch's header moved into its last element, cloned
    /// for the others (a streaming firing's elements have one each).
    pub fn into_elements(self, buffer: &Bytes) -> Vec<DecodedElement> {
        let mut out = Vec::with_capacity(self.extents.len());
        let mut stretches = self.stretches.into_iter().peekable();
        while let Some((first, header)) = stretches.next() {
            let end = stretches
                .peek()
                .map_or(self.extents.len(), |(next, _)| *next);
            let extents = self.extents.get(first..end).unwrap_or(&[]);
            if let Some((last, others)) = extents.split_last() {
                for e in others {
                    out.push(element_of(header.clone(), buffer, e));
                }
                out.push(element_of(header, buffer, last));
            }
        }
        out
    }

    /// The earliest timestamp of its elements (`None` if it has none).
    fn earliest(&self) -> Option<Timestamp> {
        self.stretches.iter().map(|(_, h)| h.timestamp).min()
    }

    /// Elements `range` as shared slices of `buffer`, the buffer it
    /// records, in order.
    pub fn elements<'a>(
        &'a self,
        buffer: &'a Bytes,
        range: Range<usize>,
    ) -> impl Iterator<Item = DecodedElement> + 'a {
        let mut stretch = self
            .stretches
            .partition_point(|(first, _)| *first <= range.start)
            .saturating_sub(1);
        let extents = self.extents.get(range.clone()).unwrap_or(&[]);
        extents.iter().zip(range).filter_map(move |(e, at)| {
            while self
                .stretches
                .get(stretch + 1)
                .is_some_and(|(first, _)| *first <= at)
            {
                stretch += 1;
            }
            // Every element is in a stretch (`push` starts one at 0).
            let (_, header) = self.stretches.get(stretch)?;
            Some(element_of(header.clone(), buffer, e))
        })
    }
}

/// The element `e` of `buffer`, whose header is `header`.
fn element_of(header: WindowedValueHeader, buffer: &Bytes, e: &Extent) -> DecodedElement {
    DecodedElement::new(
        header,
        buffer.slice(e.start..e.end),
        e.value_start - e.start,
    )
}

/// Whole encoded elements, back to back in one buffer, taken and handed
/// on as one. Cloning shares the buffer and the record of its elements.
#[derive(Debug, Clone)]
pub struct ElementRun {
    /// The buffer the elements were encoded into.
    buffer: Bytes,
    /// Every element of `buffer`, in order; the run is `range` of them.
    record: Arc<RunRecord>,
    /// Which of `elements` this run is (a part of a run is a run).
    range: Range<usize>,
    /// The earliest timestamp of all `elements`.
    hold: Timestamp,
}

impl ElementRun {
    /// The run of all the elements `record` records, recorded while
    /// encoding them into `buffer`; `None` if there are none. Each
    /// element's extent must lie within `buffer`, in order, as the encoder
    /// recorded it.
    pub fn new(buffer: Bytes, record: RunRecord) -> Option<Self> {
        if record.is_empty() {
            return None;
        }
        let hold = record.earliest()?;
        debug_assert!(record
            .extents
            .iter()
            .all(|e| e.start <= e.value_start && e.value_start <= e.end && e.end <= buffer.len()));
        Some(ElementRun {
            buffer,
            range: 0..record.len(),
            record: Arc::new(record),
            hold,
        })
    }

    /// How many elements it holds.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// Whether it holds none (never, for a run made by [`Self::new`] and
    /// split with [`Self::split_to`] within its length).
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// The timestamp it holds its consumer's output watermark at, for
    /// each of its elements.
    pub fn hold(&self) -> Timestamp {
        self.hold
    }

    fn own(&self) -> &[Extent] {
        // `range` stays within the record (splits clamp it).
        self.record.extents.get(self.range.clone()).unwrap_or(&[])
    }

    /// Its bytes' extent in the buffer.
    fn extent(&self) -> Range<usize> {
        match (self.own().first(), self.own().last()) {
            (Some(first), Some(last)) => first.start..last.end,
            _ => 0..0,
        }
    }

    /// Encoded bytes of its elements.
    pub fn encoded_len(&self) -> usize {
        self.extent().len()
    }

    /// Its elements' bytes, back to back: a slice of the buffer.
    pub fn bytes(&self) -> Bytes {
        self.buffer.slice(self.extent())
    }

    /// Each element's encoded length, in order.
    pub fn element_lengths(&self) -> impl Iterator<Item = usize> + '_ {
        self.own().iter().map(|e| e.end - e.start)
    }

    /// Takes its first `n` elements (all of them if it has fewer) as a run
    /// of their own; it keeps the rest.
    pub fn split_to(&mut self, n: usize) -> ElementRun {
        let at = self.range.start + n.min(self.len());
        let front = ElementRun {
            buffer: self.buffer.clone(),
            record: self.record.clone(),
            range: self.range.start..at,
            hold: self.hold,
        };
        self.range.start = at;
        front
    }

    /// Its elements as shared slices of the buffer, in order (no bytes are
    /// copied or decoded).
    pub fn elements(&self) -> impl Iterator<Item = DecodedElement> + '_ {
        self.record.elements(&self.buffer, self.range.clone())
    }

    /// Its bytes as chunks of whole elements, each about `chunk_bytes` long
    /// (at least one element; one element each for 0): slices of the
    /// buffer, not copies.
    pub fn chunks(&self, chunk_bytes: usize) -> Vec<Bytes> {
        let mut chunks = Vec::new();
        let mut from: Option<usize> = None;
        for e in self.own() {
            let start = *from.get_or_insert(e.start);
            if e.end - start >= chunk_bytes {
                chunks.push(self.buffer.slice(start..e.end));
                from = None;
            }
        }
        if let Some(start) = from {
            chunks.push(self.buffer.slice(start..self.extent().end));
        }
        chunks
    }
}

#[cfg(test)]
// Tests index what they built: out of bounds is a failed test.
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::coder::{decode_windowed_values, Coder, PaneInfo};
    use crate::window::Window;

    /// A run of elements with one-byte values `0..n` at timestamps
    /// `base - i`, as a firing would encode and record them.
    fn run(n: u8, base: i64) -> (ElementRun, Bytes) {
        let mut buffer = Vec::new();
        let mut record = RunRecord::default();
        for i in 0..n {
            let header = WindowedValueHeader {
                timestamp: base - i64::from(i),
                windows: smallvec::smallvec![Window::Global],
                pane: PaneInfo::NO_FIRING,
            };
            let start = buffer.len();
            header.encode(&Coder::GlobalWindow, &mut buffer).unwrap();
            let value_start = buffer.len();
            buffer.extend_from_slice(&[1, i]);
            record.push(header, start, value_start, buffer.len());
        }
        let buffer = Bytes::from(buffer);
        (ElementRun::new(buffer.clone(), record).unwrap(), buffer)
    }

    fn values(elements: impl Iterator<Item = DecodedElement>) -> Vec<u8> {
        elements.map(|e| e.value()[1]).collect()
    }

    #[test]
    fn its_elements_are_what_decoding_its_bytes_gives() {
        let (run, buffer) = run(5, 100);
        let want = decode_windowed_values(&buffer, &Coder::Bytes, &Coder::GlobalWindow).unwrap();
        assert_eq!(run.elements().collect::<Vec<_>>(), want);
        assert_eq!(run.len(), 5);
        assert_eq!(run.encoded_len(), buffer.len());
        assert_eq!(run.hold(), 96, "the earliest timestamp");
        let lengths: Vec<usize> = run.element_lengths().collect();
        assert_eq!(
            lengths,
            want.iter().map(|e| e.encoded.len()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_split_cuts_between_elements_and_keeps_the_hold() {
        let (mut run, _) = run(5, 100);
        let front = run.split_to(2);
        assert_eq!(values(front.elements()), [0, 1]);
        assert_eq!(values(run.elements()), [2, 3, 4]);
        assert_eq!(front.encoded_len() + run.encoded_len(), 5 * 15);
        assert_eq!((front.hold(), run.hold()), (96, 96));
        let all = run.split_to(10);
        assert_eq!(all.len(), 3);
        assert!(run.is_empty() && run.encoded_len() == 0 && run.chunks(1).is_empty());
        assert!(ElementRun::new(Bytes::new(), RunRecord::default()).is_none());
    }

    #[test]
    fn chunks_are_whole_elements_of_about_the_size_asked() {
        let (mut run, _) = run(5, 0);
        run.split_to(1);
        let sizes = |chunks: Vec<Bytes>| chunks.iter().map(Bytes::len).collect::<Vec<_>>();
        // Each element is 15 bytes (a 13-byte header and a 2-byte value).
        assert_eq!(sizes(run.chunks(0)), [15, 15, 15, 15]);
        assert_eq!(sizes(run.chunks(20)), [30, 30]);
        assert_eq!(sizes(run.chunks(40)), [45, 15]);
        assert_eq!(sizes(run.chunks(1 << 20)), [60]);
        let whole: Vec<u8> = run.chunks(20).concat();
        let want: Vec<u8> = run.elements().flat_map(|e| e.encoded.to_vec()).collect();
        assert_eq!(whole, want);
        assert_eq!(run.bytes(), want, "its bytes are its elements'");
    }

    /// Elements sharing a header keep one copy of it in the record; every
    /// part of a run, and the record taken apart, still gives each element
    /// its own header, as decoding the bytes does.
    #[test]
    fn elements_sharing_headers_each_get_theirs() {
        let timestamps = [5, 5, 9, 9, 9, 5, 7];
        let mut buffer = Vec::new();
        let mut record = RunRecord::default();
        for (i, &ts) in timestamps.iter().enumerate() {
            let header = WindowedValueHeader {
                timestamp: ts,
                windows: smallvec::smallvec![Window::Global],
                pane: PaneInfo::NO_FIRING,
            };
            let start = buffer.len();
            header.encode(&Coder::GlobalWindow, &mut buffer).unwrap();
            let value_start = buffer.len();
            buffer.extend_from_slice(&[1, i as u8]);
            if i % 2 == 0 {
                record.push(header, start, value_start, buffer.len());
            } else {
                record.push_shared(&header, start, value_start, buffer.len());
            }
        }
        assert_eq!(record.stretches.len(), 4, "one header per stretch");
        let buffer = Bytes::from(buffer);
        let want = decode_windowed_values(&buffer, &Coder::Bytes, &Coder::GlobalWindow).unwrap();
        assert_eq!(record.clone().into_elements(&buffer), want);
        for cut in 0..=timestamps.len() {
            let mut run = ElementRun::new(buffer.clone(), record.clone()).unwrap();
            assert_eq!(run.hold(), 5);
            let front = run.split_to(cut);
            let got: Vec<_> = front.elements().chain(run.elements()).collect();
            assert_eq!(got, want, "cut after {cut}");
        }
    }
}
