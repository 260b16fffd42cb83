//! Windowed values: the unit of data on the data plane.
//!
//! `beam:coder:windowed_value:v1` writes, in order: the timestamp (8 bytes,
//! shifted), the windows as an iterable (int32 count, then each window), the
//! pane, and finally the value. A data-plane message is a plain concatenation
//! of such elements with the value nested, so the runner reads each header,
//! walks the value with its coder to find where the element ends, and keeps
//! the element's bytes as zero-copy slices of the message: elements that only
//! pass through are never re-encoded.
//!
//! A window costs at least one byte in every window coder but the global
//! one, and an element in more global windows than the bytes left in its
//! buffer is garbage rather than data; such counts are rejected so a few
//! bytes cannot make the runner allocate gigabytes of windows.

use bytes::Bytes;

use super::iterable::for_each_block;
use super::primitive::encode_timestamp;
use super::reader::Reader;
use super::{Coder, CoderError, PaneInfo, WindowedValueHeader, Windows};
use crate::window::Window;

/// One element of a stream of concatenated nested windowed values: its
/// header and its bytes (a zero-copy slice of the input). This is what
/// the engine stores and routes; `encoded` lets it forward the element
/// unchanged without re-encoding the header.
///
/// The value is found by its offset in `encoded` rather than held as a
/// `Bytes` of its own: most elements are only queued and forwarded, and a
/// second `Bytes` cost two atomic reference-count updates per element (a
/// GroupByKey over distinct keys routes one element per input element).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedElement {
    /// Timestamp, windows and pane.
    pub header: WindowedValueHeader,
    /// The whole element, header included.
    pub encoded: Bytes,
    /// Where the value starts in `encoded` (it runs to the end).
    value_start: usize,
}

impl DecodedElement {
    /// The element whose bytes are `encoded`, its value from `value_start`
    /// on (clamped to the end: an element is never made of bytes that do
    /// not hold its value).
    pub fn new(header: WindowedValueHeader, encoded: Bytes, value_start: usize) -> Self {
        DecodedElement {
            header,
            value_start: value_start.min(encoded.len()),
            encoded,
        }
    }

    /// The value, still nested-encoded in the value coder.
    pub fn value(&self) -> &[u8] {
        // `new` keeps `value_start` within `encoded`: the fallback never
        // applies.
        self.encoded.get(self.value_start..).unwrap_or_default()
    }

    /// [`Self::value`] as shared bytes, for whoever keeps it (side inputs,
    /// timer keys).
    pub fn value_bytes(&self) -> Bytes {
        self.encoded.slice(self.value_start..)
    }

    /// Where the value starts in [`Self::encoded`](DecodedElement::encoded).
    pub fn value_start(&self) -> usize {
        self.value_start
    }
}

impl WindowedValueHeader {
    /// Reads the header of a windowed value at the start of `buf`; the
    /// `usize` is the header's length, and the value follows it.
    pub fn decode(
        buf: &[u8],
        window_coder: &Coder,
    ) -> Result<(WindowedValueHeader, usize), CoderError> {
        let mut r = Reader::new(buf);
        let header = read_header(&mut r, window_coder)?;
        Ok((header, r.pos()))
    }

    /// Appends this header, so that the runner can emit elements it made
    /// (grouping output, timers' outputs) or changed. Errors (a window the
    /// coder cannot encode, more than 2^31 - 1 windows) write nothing.
    pub fn encode(&self, window_coder: &Coder, out: &mut Vec<u8>) -> Result<(), CoderError> {
        let mark = out.len();
        let written = self.write(window_coder, out);
        if written.is_err() {
            out.truncate(mark);
        }
        written
    }

    fn write(&self, window_coder: &Coder, out: &mut Vec<u8>) -> Result<(), CoderError> {
        encode_timestamp(self.timestamp, out);
        encode_windows(&self.windows, window_coder, out)?;
        self.pane.encode(out);
        Ok(())
    }
}

/// Splits a data-plane payload (concatenated nested windowed values) into
/// elements, without copying any bytes. Errors if the payload does not end
/// exactly at an element boundary.
pub fn decode_windowed_values(
    buf: &Bytes,
    value_coder: &Coder,
    window_coder: &Coder,
) -> Result<Vec<DecodedElement>, CoderError> {
    let mut r = Reader::shared(buf);
    let mut elements = Vec::new();
    while !r.is_empty() {
        elements.push(read_element(&mut r, value_coder, window_coder)?);
    }
    Ok(elements)
}

/// The whole windowed values at the start of `buf`, and how many bytes
/// they take: [`decode_windowed_values`] for a stream read in parts, cut
/// anywhere, which stops at the start of an element the buffer ends inside
/// (decoding each element once, where [`whole_elements_len`] and then
/// decoding would read each twice).
pub fn decode_whole_windowed_values(
    buf: &Bytes,
    value_coder: &Coder,
    window_coder: &Coder,
) -> Result<(Vec<DecodedElement>, usize), CoderError> {
    let mut r = Reader::shared(buf);
    let mut elements = Vec::new();
    while !r.is_empty() {
        let start = r.pos();
        match read_element(&mut r, value_coder, window_coder) {
            Ok(element) => elements.push(element),
            Err(CoderError::Truncated(_)) => return Ok((elements, start)),
            Err(e) => return Err(e),
        }
    }
    Ok((elements, buf.len()))
}

fn read_element(
    r: &mut Reader<'_>,
    value_coder: &Coder,
    window_coder: &Coder,
) -> Result<DecodedElement, CoderError> {
    let start = r.pos();
    let header = read_header(r, window_coder)?;
    let value_start = r.pos();
    value_coder.skip(r)?;
    Ok(DecodedElement::new(
        header,
        r.bytes_since(start)?,
        value_start - start,
    ))
}

/// How many bytes at the start of `buf` are whole nested windowed values:
/// up to the start of the first that the buffer ends inside (a stream read
/// in parts, cut anywhere). Bytes that cannot be a windowed value at all
/// are an error, not a cut.
pub fn whole_elements_len(
    buf: &[u8],
    value_coder: &Coder,
    window_coder: &Coder,
) -> Result<usize, CoderError> {
    let mut r = Reader::new(buf);
    let mut whole = 0;
    while !r.is_empty() {
        match read_header(&mut r, window_coder).and_then(|_| value_coder.skip(&mut r)) {
            Ok(()) => whole = r.pos(),
            Err(CoderError::Truncated(_)) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(whole)
}

/// The windowed values of a buffer, one at a time, borrowed: each is its
/// header, its value bytes and its whole encoded length. For consumers that
/// copy what they keep (grouping), this saves making two `Bytes` (two
/// atomic reference counts) per element.
pub struct BorrowedWindowedValues<'a> {
    reader: Reader<'a>,
    value_coder: &'a Coder,
    window_coder: &'a Coder,
}

impl<'a> BorrowedWindowedValues<'a> {
    /// Reads `buf` as concatenated nested windowed values.
    pub fn new(buf: &'a [u8], value_coder: &'a Coder, window_coder: &'a Coder) -> Self {
        BorrowedWindowedValues {
            reader: Reader::new(buf),
            value_coder,
            window_coder,
        }
    }
}

impl<'a> Iterator for BorrowedWindowedValues<'a> {
    type Item = Result<(WindowedValueHeader, &'a [u8], usize), CoderError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.reader.is_empty() {
            return None;
        }
        let r = &mut self.reader;
        let start = r.pos();
        let read = read_header(r, self.window_coder).and_then(|header| {
            let value_start = r.pos();
            self.value_coder.skip(r)?;
            let value = r.slice_since(value_start)?;
            Ok((header, value, r.pos() - start))
        });
        if read.is_err() {
            // Nothing after a malformed element can be trusted.
            self.reader = Reader::new(&[]);
        }
        Some(read)
    }
}

/// Appends one nested windowed value made of `header` and `value` (already
/// nested-encoded in its coder): how the runner writes elements it produced.
/// On error nothing is written.
pub fn encode_windowed_value(
    header: &WindowedValueHeader,
    window_coder: &Coder,
    value: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), CoderError> {
    header.encode(window_coder, out)?;
    out.extend_from_slice(value);
    Ok(())
}

/// Write the known-length iterable prefix (int32 BE count). Grouping writes
/// `KV<K, Iterable<V>>` by hand (prefix, then the values' bytes), so it needs
/// the prefix alone; counts beyond `i32::MAX` cannot be written.
pub fn encode_iterable_len(count: usize, out: &mut Vec<u8>) -> Result<(), CoderError> {
    out.extend_from_slice(&iterable_len_bytes(count)?);
    Ok(())
}

/// [`encode_iterable_len`]'s bytes on the stack: a firing checks the count
/// before it writes anything, without a heap buffer per pane.
pub fn iterable_len_bytes(count: usize) -> Result<[u8; 4], CoderError> {
    let count = i32::try_from(count).map_err(|_| CoderError::Invalid {
        what: "iterable length",
        detail: format!("{count} elements do not fit a known-length iterable"),
    })?;
    Ok(count.to_be_bytes())
}

/// Reads a windowed-value header; shared with walking. (Inlined: the
/// header is then built where its reader wants it, not copied there.)
#[inline]
pub(super) fn read_header(
    r: &mut Reader<'_>,
    window_coder: &Coder,
) -> Result<WindowedValueHeader, CoderError> {
    let timestamp = r.timestamp("windowed value timestamp")?;
    let windows = read_windows(r, window_coder, "windowed value windows")?;
    let pane = PaneInfo::read(r)?;
    Ok(WindowedValueHeader {
        timestamp,
        windows,
        pane,
    })
}

/// The known-length iterable prefix of a list of one window.
const ONE_WINDOW: [u8; 4] = 1i32.to_be_bytes();

/// Reads a list of windows (iterable framing); shared with timers.
pub(super) fn read_windows(
    r: &mut Reader<'_>,
    window_coder: &Coder,
    what: &'static str,
) -> Result<Windows, CoderError> {
    // One window, counted up front: nearly every element is in exactly one,
    // and this is read for each of them.
    if r.next_is(&ONE_WINDOW) {
        r.skip(ONE_WINDOW.len(), what)?;
        return Ok(smallvec::smallvec![window_coder.read_window(r)?]);
    }
    let mut windows = Windows::new();
    let token = for_each_block(r, what, |r, n| {
        let left = r.remaining();
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| CoderError::Invalid {
                what,
                detail: format!("{n} windows with only {left} bytes left"),
            })?;
        windows.reserve(n);
        for _ in 0..n {
            windows.push(window_coder.read_window(r)?);
        }
        Ok(())
    })?;
    match token {
        None => Ok(windows),
        Some(_) => Err(CoderError::Invalid {
            what,
            detail: "windows cannot be state-backed".to_string(),
        }),
    }
}

/// Writes a list of windows in the known-length iterable form.
pub(super) fn encode_windows(
    windows: &[Window],
    window_coder: &Coder,
    out: &mut Vec<u8>,
) -> Result<(), CoderError> {
    encode_iterable_len(windows.len(), out)?;
    windows
        .iter()
        .try_for_each(|w| window_coder.encode_window(w, out))
}

#[cfg(test)]
// Tests index what they built: out of bounds is a failed test.
#[allow(clippy::indexing_slicing)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::coder::primitive::encode_varint_u64;
    use crate::coder::tests::{arb_header_with, arb_window_coder, hex};

    #[test]
    fn example_from_the_notes() -> Result<(), CoderError> {
        let header = WindowedValueHeader {
            timestamp: 0,
            windows: smallvec::smallvec![Window::Global],
            pane: PaneInfo::NO_FIRING,
        };
        let mut out = Vec::new();
        encode_windowed_value(&header, &Coder::GlobalWindow, &[0x05], &mut out)?;
        assert_eq!(out, hex("8000000000000000 00000001 0f 05"));
        assert_eq!(
            WindowedValueHeader::decode(&out, &Coder::GlobalWindow),
            Ok((header, 13))
        );
        Ok(())
    }

    #[test]
    fn iterable_len_prefix() {
        let mut out = Vec::new();
        assert_eq!(encode_iterable_len(2, &mut out), Ok(()));
        assert_eq!(out, [0, 0, 0, 2]);
        assert!(encode_iterable_len(1 << 31, &mut out).is_err());
        assert_eq!(out, [0, 0, 0, 2]);
    }

    #[test]
    fn encode_errors_write_nothing() {
        let header = WindowedValueHeader {
            timestamp: 0,
            windows: smallvec::smallvec![Window::Global, Window::Interval { start: 0, end: 1 }],
            pane: PaneInfo::NO_FIRING,
        };
        let mut out = vec![0xaa];
        assert!(encode_windowed_value(&header, &Coder::GlobalWindow, &[1], &mut out).is_err());
        assert_eq!(out, [0xaa]);
    }

    /// One window read by the counted form's short path, and the same
    /// window in blocks (as a writer that did not count them sends it),
    /// decode alike; so do two windows.
    #[test]
    fn one_window_reads_the_same_counted_or_in_blocks() {
        let counted = hex("8000000000000005 00000001 8000000000000009 03 0f 01 aa");
        let blocks = hex("8000000000000005 ffffffff 01 8000000000000009 03 00 0f 01 aa");
        let two = hex("8000000000000005 00000002 8000000000000009 03 8000000000000011 02 0f 01 aa");
        let read = |buf: Vec<u8>| {
            decode_windowed_values(&Bytes::from(buf), &Coder::Bytes, &Coder::IntervalWindow)
        };
        let (counted, blocks, two) = (read(counted), read(blocks), read(two));
        let window = Window::Interval { start: 6, end: 9 };
        let header = &counted.as_ref().expect("counted")[0].header;
        assert_eq!(header.timestamp, 5);
        assert_eq!(header.windows.as_slice(), std::slice::from_ref(&window));
        assert_eq!(
            counted.as_ref().map(|e| e[0].value().to_vec()),
            Ok(vec![1, 0xaa])
        );
        assert_eq!(
            blocks.as_ref().map(|e| e[0].header.clone()),
            Ok(header.clone())
        );
        let later = Window::Interval { start: 15, end: 17 };
        assert_eq!(
            two.map(|e| e[0].header.windows.to_vec()),
            Ok(vec![window, later])
        );
    }

    /// A stream of three elements cut at every position: the whole
    /// elements before the cut come back, decoded as the uncut stream
    /// decodes them, with their length; bytes that are no element at all
    /// are still an error.
    #[test]
    fn a_cut_stream_gives_its_whole_elements_and_where_they_end() {
        let mut buf = Vec::new();
        let mut ends = Vec::new();
        for (ts, value) in [(1, &b"a"[..]), (2, &b"bcdef"[..]), (3, &b""[..])] {
            let header = WindowedValueHeader {
                timestamp: ts,
                windows: smallvec::smallvec![Window::Global],
                pane: PaneInfo::NO_FIRING,
            };
            let mut value_bytes = Vec::new();
            encode_varint_u64(value.len() as u64, &mut value_bytes);
            value_bytes.extend_from_slice(value);
            encode_windowed_value(&header, &Coder::GlobalWindow, &value_bytes, &mut buf)
                .expect("encodes");
            ends.push(buf.len());
        }
        let all = decode_windowed_values(
            &Bytes::from(buf.clone()),
            &Coder::Bytes,
            &Coder::GlobalWindow,
        )
        .expect("decodes");
        for cut in 0..=buf.len() {
            let part = Bytes::copy_from_slice(&buf[..cut]);
            let (got, whole) =
                decode_whole_windowed_values(&part, &Coder::Bytes, &Coder::GlobalWindow)
                    .expect("a cut is not an error");
            let n = ends.iter().filter(|&&end| end <= cut).count();
            assert_eq!(whole, if n == 0 { 0 } else { ends[n - 1] }, "cut at {cut}");
            assert_eq!(got.len(), n, "cut at {cut}");
            for (g, a) in got.iter().zip(&all) {
                assert_eq!((&g.header, g.value()), (&a.header, a.value()));
            }
        }
        // A window count no element could have.
        let bad = Bytes::from(hex("8000000000000000 7fffffff 0f 05"));
        assert!(decode_whole_windowed_values(&bad, &Coder::Varint, &Coder::GlobalWindow).is_err());
    }

    #[test]
    fn absurd_window_counts_are_rejected() {
        // 2^31 - 1 global windows, then a pane and a one-byte value.
        let buf = Bytes::from(hex("8000000000000000 7fffffff 0f 05"));
        assert!(matches!(
            decode_windowed_values(&buf, &Coder::Varint, &Coder::GlobalWindow),
            Err(CoderError::Invalid { .. })
        ));
    }

    proptest! {
        #[test]
        fn streams_round_trip_zero_copy(
            (window_coder, headers) in arb_window_coder().prop_flat_map(|c| {
                (Just(c.clone()), proptest::collection::vec(arb_header_with(c), 0..5))
            }),
            values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 5),
        ) {
            let mut buf = Vec::new();
            let mut expected = Vec::new();
            for (header, value) in headers.iter().zip(&values) {
                let mut nested = Vec::new();
                encode_varint_u64(value.len() as u64, &mut nested);
                nested.extend_from_slice(value);
                let start = buf.len();
                encode_windowed_value(header, &window_coder, &nested, &mut buf)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                expected.push((header.clone(), nested, buf[start..].to_vec()));
            }
            let buf = Bytes::from(buf);
            let decoded = decode_windowed_values(&buf, &Coder::LengthPrefix, &window_coder)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(decoded.len(), expected.len());
            for (element, (header, value, encoded)) in decoded.iter().zip(&expected) {
                prop_assert_eq!(&element.header, header);
                prop_assert_eq!(element.value(), &value[..]);
                prop_assert_eq!(&element.encoded[..], &encoded[..]);
                // Zero-copy: the slices point into the input buffer.
                prop_assert!(buf.as_ptr_range().contains(&element.encoded.as_ptr()) || element.encoded.is_empty());
                prop_assert_eq!(
                    WindowedValueHeader::decode(&element.encoded, &window_coder),
                    Ok((header.clone(), encoded.len() - value.len()))
                );
            }
            // Any cut inside the last element is an error.
            if let Some((_, _, last)) = expected.last() {
                for cut in 1..last.len() {
                    let short = buf.slice(..buf.len() - cut);
                    prop_assert!(decode_windowed_values(&short, &Coder::LengthPrefix, &window_coder).is_err());
                }
            }
        }
    }
}
