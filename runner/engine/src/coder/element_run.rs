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

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use super::{DecodedElement, WindowedValueHeader};
use crate::time::Timestamp;

/// Where one element of a run's buffer lies, and its header.
#[derive(Debug, Clone)]
pub struct RunElement {
    /// Timestamp, windows and pane, as encoded at `start`.
    pub header: WindowedValueHeader,
    /// Where its header starts.
    pub start: usize,
    /// Where its value starts (its header's end).
    pub value_start: usize,
    /// Where it ends.
    pub end: usize,
}

/// Whole encoded elements, back to back in one buffer, taken and handed
/// on as one. Cloning shares the buffer and the record of its elements.
#[derive(Debug, Clone)]
pub struct ElementRun {
    /// The buffer the elements were encoded into.
    buffer: Bytes,
    /// Every element of `buffer`, in order; the run is `range` of them.
    elements: Arc<Vec<RunElement>>,
    /// Which of `elements` this run is (a part of a run is a run).
    range: Range<usize>,
    /// The earliest timestamp of all `elements`.
    hold: Timestamp,
}

impl ElementRun {
    /// The run of all `elements`, recorded while encoding them into
    /// `buffer`; `None` if there are none. Each element's extent must lie
    /// within `buffer`, in order, as the encoder recorded it.
    pub fn new(buffer: Bytes, elements: Vec<RunElement>) -> Option<Self> {
        let hold = elements.iter().map(|e| e.header.timestamp).min()?;
        debug_assert!(elements
            .iter()
            .all(|e| e.start <= e.value_start && e.value_start <= e.end && e.end <= buffer.len()));
        Some(ElementRun {
            buffer,
            range: 0..elements.len(),
            elements: Arc::new(elements),
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

    fn own(&self) -> &[RunElement] {
        // `range` stays within `elements` (splits clamp it).
        self.elements.get(self.range.clone()).unwrap_or(&[])
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
            elements: self.elements.clone(),
            range: self.range.start..at,
            hold: self.hold,
        };
        self.range.start = at;
        front
    }

    /// Its elements as shared slices of the buffer, in order (no bytes are
    /// copied or decoded).
    pub fn elements(&self) -> impl Iterator<Item = DecodedElement> + '_ {
        self.own().iter().map(|e| {
            DecodedElement::new(
                e.header.clone(),
                self.buffer.slice(e.start..e.end),
                e.value_start - e.start,
            )
        })
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
        let mut elements = Vec::new();
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
            elements.push(RunElement {
                header,
                start,
                value_start,
                end: buffer.len(),
            });
        }
        let buffer = Bytes::from(buffer);
        (ElementRun::new(buffer.clone(), elements).unwrap(), buffer)
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
        assert!(ElementRun::new(Bytes::new(), Vec::new()).is_none());
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
}
