//! How a spilled pane and its key are written in the store, and read back.
//!
//! Both ways of filing a spill (by window, in `blocks`; by key, for
//! sessions) write a pane the same way: its count, the earliest and latest
//! hold of its values, the values' length and the values — or, for a pane
//! written out of line (`large`), a flag in the length and the run that
//! wrote the values. A spilled pane carries no trigger state: only panes
//! that have not fired spill, and they come back as such. Store keys put
//! lengths before variable parts, so that no key's entries are the start
//! of another's, and order keys by (length, bytes) ([`key_order`]).

use std::cmp::Ordering;

use bytes::Bytes;

use crate::grouping::pane::Pane;
use crate::plan::Trigger;
use crate::spill::SpillError;
use crate::time::Timestamp;

/// Bytes of a spilled pane before its values: count, earliest and latest
/// hold, the values' length.
pub(super) const PANE_HEADER: usize = 32;
/// Set in a spilled pane's values length when its values are out of line
/// (`large`): the run's number follows instead of the values.
const OUT_OF_LINE: u64 = 1 << 63;

/// One run's part of a pane, as stored.
#[derive(Debug, Clone)]
pub(super) struct SpilledPane {
    /// How many values it holds.
    pub(super) count: usize,
    /// The earliest output-time hold of its values.
    pub(super) hold_min: Timestamp,
    /// The latest output-time hold of its values.
    pub(super) hold_max: Timestamp,
    /// The values (empty if they are elsewhere).
    pub(super) values: Bytes,
    /// Values written out of line instead, by this run, this many bytes.
    pub(super) elsewhere: Option<(u32, u64)>,
}

impl SpilledPane {
    /// Bytes of its values, wherever they are.
    pub(super) fn bytes(&self) -> u64 {
        self.elsewhere.map_or(self.values.len() as u64, |(_, n)| n)
    }

    /// Adds it to `pane`, as unfired data.
    pub(super) fn add_to(&self, pane: &mut Pane) {
        pane.add_part(&self.values, self.count, self.hold_min, self.hold_max);
    }

    /// A pane that has not fired, holding only this part (a session's
    /// piece as read back), with fresh state for `trigger`.
    pub(super) fn into_pane(self, trigger: &Trigger) -> Pane {
        let mut pane = Pane::new(trigger);
        self.add_to(&mut pane);
        pane
    }
}

/// The store key of `key`'s part in run `run`, under `start`.
pub(super) fn run_key(start: &[u8], key: &[u8], run: u32) -> Result<Vec<u8>, SpillError> {
    let mut k = Vec::with_capacity(start.len() + key.len() + 8);
    k.extend_from_slice(start);
    put_len(&mut k, key.len())?;
    k.extend_from_slice(key);
    k.extend_from_slice(&run.to_be_bytes());
    Ok(k)
}

/// The user key of a store key written by [`run_key`] under `start`.
pub(super) fn run_key_user_key<'a>(start: &[u8], key: &'a [u8]) -> Result<&'a [u8], SpillError> {
    let rest = key.strip_prefix(start).ok_or_else(|| corrupt("prefix"))?;
    let len = u32::from_be_bytes(take::<4>(rest, 0, "key length")?) as usize;
    rest.get(4..4 + len).ok_or_else(|| corrupt("key"))
}

/// Appends a spilled pane: its count, the earliest and latest hold of its
/// values (`end`, the window's, if it has none), the values' length and
/// the values.
pub(super) fn put_spilled_pane(out: &mut Vec<u8>, pane: &Pane, end: Timestamp) {
    let values = pane.values();
    out.reserve(PANE_HEADER + values.len());
    put_pane_header(out, pane, end, values.len() as u64);
    out.extend_from_slice(values);
}

/// Appends a spilled pane whose values run `run` wrote out of line: the
/// header as [`put_spilled_pane`] writes it, flagged, then the run.
pub(super) fn put_out_of_line_pane(out: &mut Vec<u8>, pane: &Pane, end: Timestamp, run: u32) {
    put_pane_header(out, pane, end, pane.values().len() as u64 | OUT_OF_LINE);
    out.extend_from_slice(&run.to_le_bytes());
}

fn put_pane_header(out: &mut Vec<u8>, pane: &Pane, end: Timestamp, values_len: u64) {
    let holds = pane.holds();
    out.extend_from_slice(&u64::from(pane.count()).to_le_bytes());
    out.extend_from_slice(&holds.min().unwrap_or(end).to_le_bytes());
    out.extend_from_slice(&holds.max().unwrap_or(end).to_le_bytes());
    out.extend_from_slice(&values_len.to_le_bytes());
}

/// Reads what [`put_spilled_pane`] wrote at `at` of `bytes` (the values
/// a slice of them, not a copy): the pane, and where it ends.
pub(super) fn read_spilled_pane(
    bytes: &Bytes,
    at: usize,
) -> Result<(SpilledPane, usize), SpillError> {
    let word = |at: usize| take::<8>(bytes, at, "pane header");
    let values_len = u64::from_le_bytes(take::<8>(bytes, at + 24, "values length")?);
    let start = at + PANE_HEADER;
    let count = usize::try_from(u64::from_le_bytes(word(at)?)).map_err(|_| corrupt("count"))?;
    let (hold_min, hold_max) = (
        i64::from_le_bytes(word(at + 8)?),
        i64::from_le_bytes(word(at + 16)?),
    );
    if values_len & OUT_OF_LINE != 0 {
        let run = u32::from_le_bytes(take::<4>(bytes, start, "run")?);
        let pane = SpilledPane {
            count,
            hold_min,
            hold_max,
            values: Bytes::new(),
            elsewhere: Some((run, values_len & !OUT_OF_LINE)),
        };
        return Ok((pane, start + 4));
    }
    let values_len = usize::try_from(values_len).map_err(|_| corrupt("values length"))?;
    let end = start
        .checked_add(values_len)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| corrupt("values"))?;
    let pane = SpilledPane {
        count,
        hold_min,
        hold_max,
        values: bytes.slice(start..end),
        elsewhere: None,
    };
    Ok((pane, end))
}

/// Store keys order keys by (length, bytes); so must the in-memory side.
pub(super) fn key_order(a: &[u8], b: &[u8]) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// Appends `len` as a big-endian `u32`; an error for what is larger.
pub(super) fn put_len(out: &mut Vec<u8>, len: usize) -> Result<(), SpillError> {
    let len = u32::try_from(len)
        .map_err(|_| SpillError(format!("a key or window of {len} bytes is too large")))?;
    out.extend_from_slice(&len.to_be_bytes());
    Ok(())
}

/// The error for a stored entry that does not read back as written.
pub(super) fn corrupt(what: &str) -> SpillError {
    SpillError(format!("a spilled entry is corrupt ({what})"))
}

/// `N` bytes of `buf` at `at`; `what` names them if they are missing.
pub(super) fn take<const N: usize>(
    buf: &[u8],
    at: usize,
    what: &str,
) -> Result<[u8; N], SpillError> {
    buf.get(at..at + N)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt(what))
}
