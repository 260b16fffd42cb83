//! A bounds-checked cursor over encoded bytes.
//!
//! Every decoder above the number formats (`primitive`, which this cursor
//! reads varints and timestamps with) reads through [`Reader`], so running
//! off the end of a buffer is a [`CoderError::Truncated`] and never a
//! slice-index panic. A reader built over a [`Bytes`] remembers it, which
//! lets decoders hand out zero-copy slices of the input (keys, values,
//! custom windows); one built over a plain slice copies those few bytes
//! instead.

use bytes::Bytes;

use super::primitive::{timestamp_from_be_bytes, varint_u64};
use super::CoderError;
use crate::time::Timestamp;

/// Position in a buffer being decoded. Invariant: `pos <= buf.len()`.
pub(super) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    shared: Option<&'a Bytes>,
}

impl<'a> Reader<'a> {
    /// A reader over borrowed bytes; slices taken from it are copied.
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Reader {
            buf,
            pos: 0,
            shared: None,
        }
    }

    /// A reader over shared bytes; slices taken from it are zero-copy.
    pub(super) fn shared(buf: &'a Bytes) -> Self {
        Reader {
            buf: buf.as_ref(),
            pos: 0,
            shared: Some(buf),
        }
    }

    /// Bytes consumed so far.
    pub(super) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes not consumed yet.
    pub(super) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Whether everything has been consumed.
    pub(super) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }

    /// Whether the next bytes are `prefix` (nothing is consumed): lets a
    /// decoder take a common encoding's short path.
    pub(super) fn next_is(&self, prefix: &[u8]) -> bool {
        self.rest().starts_with(prefix)
    }

    /// One byte.
    pub(super) fn byte(&mut self, what: &'static str) -> Result<u8, CoderError> {
        let b = *self.rest().first().ok_or(CoderError::Truncated(what))?;
        self.pos += 1;
        Ok(b)
    }

    /// The next `n` bytes.
    pub(super) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CoderError> {
        let taken = self.rest().get(..n).ok_or(CoderError::Truncated(what))?;
        self.pos += n;
        Ok(taken)
    }

    /// Skips the next `n` bytes.
    pub(super) fn skip(&mut self, n: usize, what: &'static str) -> Result<(), CoderError> {
        self.take(n, what).map(drop)
    }

    /// The next `N` bytes as an array.
    pub(super) fn array<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<[u8; N], CoderError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    /// A Beam varint, as the unsigned value of its 64 bits.
    pub(super) fn varint_u64(&mut self, what: &'static str) -> Result<u64, CoderError> {
        let (v, n) = varint_u64(self.rest(), what)?;
        self.pos += n;
        Ok(v)
    }

    /// A Beam varint, as the signed (two's-complement) value of its 64 bits.
    pub(super) fn varint_i64(&mut self, what: &'static str) -> Result<i64, CoderError> {
        self.varint_u64(what).map(|v| v as i64)
    }

    /// A varint that counts bytes or elements: negative values are invalid.
    pub(super) fn length(&mut self, what: &'static str) -> Result<usize, CoderError> {
        let v = self.varint_i64(what)?;
        usize::try_from(v).map_err(|_| CoderError::Invalid {
            what,
            detail: format!("negative or oversized length {v}"),
        })
    }

    /// A big-endian int32 (iterable and window counts).
    pub(super) fn be_i32(&mut self, what: &'static str) -> Result<i32, CoderError> {
        self.array(what).map(i32::from_be_bytes)
    }

    /// An 8-byte shifted big-endian timestamp.
    pub(super) fn timestamp(&mut self, what: &'static str) -> Result<Timestamp, CoderError> {
        self.array(what).map(timestamp_from_be_bytes)
    }

    /// The bytes from `start` (an earlier [`Reader::pos`]) to the current
    /// position, borrowed from the buffer: how a decoder hands out what it
    /// just walked over.
    pub(super) fn slice_since(&self, start: usize) -> Result<&'a [u8], CoderError> {
        // ok_or_else: the message is built only on the error path (this is
        // called for every decoded element).
        self.buf
            .get(start..self.pos)
            .ok_or_else(|| CoderError::Invalid {
                what: "reader",
                detail: format!("slice start {start} is past position {}", self.pos),
            })
    }

    /// The bytes from `start` (an earlier [`Reader::pos`]) to the current
    /// position, without copying when the reader is over shared bytes.
    pub(super) fn bytes_since(&self, start: usize) -> Result<Bytes, CoderError> {
        let slice = self.slice_since(start)?;
        Ok(match self.shared {
            // In bounds: `slice` above is the same range of the same bytes.
            Some(shared) => shared.slice(start..self.pos),
            None => Bytes::copy_from_slice(slice),
        })
    }
}
