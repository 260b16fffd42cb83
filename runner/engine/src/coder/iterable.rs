//! The framing of `beam:coder:iterable:v1`, shared by every list on the wire.
//!
//! An iterable starts with a big-endian int32. If it is a count `n >= 0`, `n`
//! nested elements follow. If it is `-1` the writer did not know the length
//! up front (Python does this for generators, e.g. a DoFn yielding a lazy
//! value), and the elements come in blocks: `varint(n)` then `n` elements,
//! repeated, ended by `varint(0)`. A state-backed iterable may instead end
//! with `varint(-1)` and a length-prefixed token naming the rest of the
//! elements in the state API. The windows of a windowed value and of a timer
//! use the same framing.
//!
//! This module only parses the framing; callers say what an element is.

use std::ops::Range;

use super::reader::Reader;
use super::CoderError;

/// The int32 that announces the chunked form.
const UNKNOWN_LENGTH: i32 = -1;
/// The block count that announces a state-backed continuation token.
const STATE_TOKEN: i64 = -1;

/// Walks an iterable's framing, calling `block(r, n)` for each run of `n`
/// elements (once for the known-length form); `block` must read exactly
/// those elements. Returns the byte range of the state-backed continuation
/// token when the iterable ends with one.
pub(super) fn for_each_block<'a>(
    r: &mut Reader<'a>,
    what: &'static str,
    mut block: impl FnMut(&mut Reader<'a>, u64) -> Result<(), CoderError>,
) -> Result<Option<Range<usize>>, CoderError> {
    let count = r.be_i32(what)?;
    if count >= 0 {
        block(r, u64::from(count.unsigned_abs()))?;
        return Ok(None);
    }
    if count != UNKNOWN_LENGTH {
        return Err(CoderError::Invalid {
            what,
            detail: format!("negative length {count}"),
        });
    }
    loop {
        match r.varint_i64(what)? {
            0 => return Ok(None),
            STATE_TOKEN => {
                let len = r.length(what)?;
                let start = r.pos();
                r.skip(len, what)?;
                return Ok(Some(start..r.pos()));
            }
            n if n > 0 => block(r, n.unsigned_abs())?,
            n => {
                return Err(CoderError::Invalid {
                    what,
                    detail: format!("negative block length {n}"),
                })
            }
        }
    }
}

/// The elements of one nested iterable at the start of `buf`, as slices,
/// and the number of bytes the iterable took. Both framings are accepted;
/// a state-backed continuation token is an error here (the runner only
/// splits iterables it wrote or asked an SDK to write in full).
pub fn split_iterable<'a>(
    buf: &'a [u8],
    element: &super::Coder,
) -> Result<(Vec<&'a [u8]>, usize), CoderError> {
    let mut r = Reader::new(buf);
    let mut items = Vec::new();
    let token = for_each_block(&mut r, "iterable", |r, n| {
        for _ in 0..n {
            let start = r.pos();
            element.skip(r)?;
            items.push(r.slice_since(start)?);
        }
        Ok(())
    })?;
    if token.is_some() {
        return Err(CoderError::Invalid {
            what: "iterable",
            detail: "unexpected state-backed continuation".into(),
        });
    }
    Ok((items, r.pos()))
}
