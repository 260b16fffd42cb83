//! State the SDK reads and writes through the Fn API's state service, in
//! engine terms: side inputs (read-only, materialized by the runner once
//! their window is complete) and keyed user state (read-your-writes within a
//! bundle, committed only when the bundle succeeds).
//!
//! User state comes in three shapes, each named by the same
//! (transform, state id, window, key) cell:
//!
//! * **bags** — opaque concatenations of nested values (Python's Bag, Set,
//!   Combining and ReadModifyWrite state all map here);
//! * **ordered lists** — entries with a signed 64-bit sort key, read back
//!   sorted and by half-open sort-key range (see [`decode_ordered_entries`]
//!   for the wire format);
//! * **multimaps** — map keys (opaque nested bytes, compared bytewise) each
//!   with a bag of values; Java's Map, Set and Multimap state use these.
//!
//! Where it is kept, in memory:
//!
//! [`SideInputTable`] holds materialized side inputs by (consumer transform,
//! tag, window); [`UserStateTable`] holds user state — bags, ordered lists
//! and multimaps — by (transform, state id, window, key). A bundle never
//! writes to either directly: it writes to a [`BundleOverlay`], which reads
//! through to the stores and is applied by the engine only when the bundle
//! succeeded. That is what makes a bundle a transaction: a failed bundle's
//! state writes are simply dropped with its overlay.
//!
//! One module each: `side_inputs`, `user_state` (with `bag_spill`, where
//! bags go past the stage's share of memory) and `overlay`.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::coder::{decode_varint_u64, encode_varint_i64, encode_varint_u64};
use crate::plan::{SideInputId, TransformId};

mod bag_spill;
#[cfg(test)]
mod bag_spill_tests;
mod overlay;
mod side_inputs;
#[cfg(test)]
mod tables_tests;
mod user_state;

pub(crate) use bag_spill::SpilledBags;
pub use overlay::BundleOverlay;
pub(crate) use side_inputs::SideInputSnapshot;
pub use side_inputs::SideInputTable;
pub(crate) use user_state::UserStateSnapshot;
pub use user_state::{
    BagWrite, MultimapWrite, OrderedListOp, OrderedListWrite, UserStateTable, UserStateWrites,
};

/// A half-open range `[start, end)` of ordered-list sort keys.
///
/// Sort keys are whatever the SDK chose (Python: microseconds, Java:
/// milliseconds); the runner only compares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SortKeyRange {
    /// First sort key included.
    pub start: i64,
    /// First sort key excluded.
    pub end: i64,
}

impl SortKeyRange {
    /// Every sort key an SDK can read back: SDKs read `[i64::MIN, i64::MAX)`,
    /// so this is also the range of a full clear.
    pub const ALL: SortKeyRange = SortKeyRange {
        start: i64::MIN,
        end: i64::MAX,
    };

    /// Whether `key` lies in the range.
    pub fn contains(&self, key: i64) -> bool {
        self.start <= key && key < self.end
    }

    /// Whether no key lies in the range (`start >= end`).
    pub fn is_empty(&self) -> bool {
        self.start >= self.end
    }
}

/// Identifies one cell of user state of any kind: the state API addresses
/// user state by these four, and the store keeps a map of cells by them.
///
/// The fields are in this order on purpose: cells sort (a checkpoint
/// writes them sorted) by transform, state id, window, then key, and a
/// checkpoint encodes a cell as these four in this order, as it did when
/// a cell was a tuple of them (a [`TransformId`] encodes as its string).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CellId {
    /// The transform that declared the state (in its stage's bundle
    /// descriptor).
    pub transform_id: TransformId,
    /// The state's id within that transform.
    pub state_id: String,
    /// The window the state is scoped to, encoded in the window coder:
    /// when the window expires, its cells go.
    pub window: Bytes,
    /// The user key the state is scoped to, nested-encoded in the key
    /// coder.
    pub key: Bytes,
}

impl CellId {
    /// The cell of state `state_id` of transform `transform_id` in
    /// `window` for `key`.
    pub fn new(
        transform_id: impl Into<TransformId>,
        state_id: impl Into<String>,
        window: Bytes,
        key: Bytes,
    ) -> Self {
        CellId {
            transform_id: transform_id.into(),
            state_id: state_id.into(),
            window,
            key,
        }
    }
}

/// What the SDK asks for, with every id already resolved by the caller:
/// a side input's values (named by the reading transform and its tag),
/// a cell of user state of one of its shapes, or the rest of an iterable
/// the runner handed out.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StateKey {
    /// All values of a side input in one window.
    IterableSideInput {
        /// The side input.
        side_input: SideInputId,
        /// Encoded side-input window.
        window: Bytes,
    },
    /// Values of one key of a multimap side input in one window.
    MultimapSideInput {
        /// The side input.
        side_input: SideInputId,
        /// Encoded side-input window.
        window: Bytes,
        /// Nested-encoded key.
        key: Bytes,
    },
    /// The keys of a multimap side input in one window.
    MultimapKeysSideInput {
        /// The side input.
        side_input: SideInputId,
        /// Encoded side-input window.
        window: Bytes,
    },
    /// A bag of user state.
    BagUserState(CellId),
    /// An ordered list of user state. Appends carry their own sort keys (the
    /// range is ignored); gets and clears act on `range` only.
    OrderedListUserState {
        /// The list's cell.
        cell: CellId,
        /// Sort keys a get or clear covers; `None` when the SDK sent no range
        /// (normal for appends, an error for gets and clears).
        range: Option<SortKeyRange>,
    },
    /// The values of one map key of a multimap user state: get, append, clear.
    MultimapUserState {
        /// The multimap's cell.
        cell: CellId,
        /// Nested-encoded map key; map keys are compared by these bytes.
        map_key: Bytes,
    },
    /// The map keys of a multimap user state: get (concatenated nested map
    /// keys) and clear (removes every map key).
    MultimapKeysUserState(CellId),
    /// All entries of a multimap user state: get, as concatenated
    /// `KV<K, Iterable<V>>` (map key bytes, int32 big-endian value count,
    /// the values), which is what Java's harness decodes; clear removes
    /// every map key. Counting values needs the state's value coder (see
    /// `UserStateTable::set_multimap_value_coder`).
    MultimapEntriesUserState(CellId),
    /// The rest of a state-backed iterable the runner handed out (a
    /// GroupByKey's key too large for memory): get only, by the token the
    /// element carried.
    RunnerIterable {
        /// The token, as the runner wrote it.
        token: Bytes,
    },
}

/// Why a state request failed; the text reaches the SDK (and the user).
#[derive(Debug, Clone, Error)]
#[error("{0}")]
pub struct StateError(pub String);

/// One page of a state read.
#[derive(Debug, Clone, Default)]
pub struct StatePage {
    /// Whole nested-encoded values.
    pub data: Bytes,
    /// Present when more pages follow; pass it back to read the next one.
    pub continuation: Option<Bytes>,
}

/// A bundle's view of state. Writes are visible to later reads of the same
/// bundle and become durable only when the engine commits the bundle.
pub trait BundleState: Send + Sync {
    /// Read a page of `key`.
    fn get(&self, key: &StateKey, continuation: Option<&[u8]>) -> Result<StatePage, StateError>;
    /// Append to user state: concatenated nested values for bags and
    /// multimap keys, concatenated entries for ordered lists.
    fn append(&self, key: &StateKey, data: Bytes) -> Result<(), StateError>;
    /// Clear user state: a bag, a range of an ordered list, one map key or a
    /// whole multimap.
    fn clear(&self, key: &StateKey) -> Result<(), StateError>;
}

/// Splits an ordered-list append payload into `(sort key, value)` entries,
/// in payload order.
///
/// Each entry is what Python's `TupleCoder([VarIntCoder(),
/// LengthPrefixCoder(value_coder)])` and Java's `KvCoder<VarLong,
/// LengthPrefix<V>>` write: the sort key as a signed varint (two's
/// complement, ten bytes when negative), then a varint length, then that
/// many value bytes. The values are slices of `data`, not copies. The bytes
/// come from the SDK, so any malformation is an error, never a panic.
pub fn decode_ordered_entries(data: &Bytes) -> Result<Vec<(i64, Bytes)>, StateError> {
    let mut entries = Vec::new();
    let mut pos = 0usize;
    while pos < data.len() {
        let entry_start = pos;
        let bad = |what: &str, detail: String| {
            StateError(format!(
                "malformed ordered list entry at byte {entry_start} of a {}-byte append: {what}: {detail}",
                data.len()
            ))
        };
        let (sort_key, n) =
            decode_varint_u64(&data[pos..]).map_err(|e| bad("sort key", e.to_string()))?;
        pos += n;
        let (len, n) =
            decode_varint_u64(&data[pos..]).map_err(|e| bad("value length", e.to_string()))?;
        pos += n;
        let remaining = data.len() - pos;
        let len = usize::try_from(len)
            .ok()
            .filter(|l| *l <= remaining)
            .ok_or_else(|| {
                bad(
                    "value",
                    format!("length {len} exceeds the {remaining} bytes left"),
                )
            })?;
        entries.push((sort_key as i64, data.slice(pos..pos + len)));
        pos += len;
    }
    Ok(entries)
}

/// Appends one ordered-list entry in the format [`decode_ordered_entries`]
/// reads, so that pages the runner serves decode with the SDK's own coder.
pub fn encode_ordered_entry(sort_key: i64, value: &[u8], out: &mut Vec<u8>) {
    encode_varint_i64(sort_key, out);
    encode_varint_u64(value.len() as u64, out);
    out.extend_from_slice(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_entries_round_trip_including_negative_keys() {
        let mut buf = Vec::new();
        encode_ordered_entry(-1, b"neg", &mut buf);
        encode_ordered_entry(1_700_000_000_000_000, b"", &mut buf);
        encode_ordered_entry(i64::MIN, b"min", &mut buf);
        // A negative sort key takes ten varint bytes, as Python writes it.
        assert_eq!(buf.len(), (10 + 1 + 3) + (8 + 1) + (10 + 1 + 3));
        let entries = decode_ordered_entries(&Bytes::from(buf)).unwrap();
        assert_eq!(
            entries,
            vec![
                (-1, Bytes::from_static(b"neg")),
                (1_700_000_000_000_000, Bytes::new()),
                (i64::MIN, Bytes::from_static(b"min")),
            ]
        );
    }

    #[test]
    fn malformed_ordered_entries_are_errors() {
        for bad in [
            &b"\x80"[..],              // truncated sort key
            &b"\x02"[..],              // no length
            &b"\x02\x05abc"[..],       // value shorter than its length
            &b"\x02\x01a\x04\x80"[..], // second entry truncated
            &[0xff; 11][..],           // varint longer than 64 bits
        ] {
            let err = decode_ordered_entries(&Bytes::copy_from_slice(bad)).unwrap_err();
            assert!(err.0.contains("malformed ordered list entry"), "{err}");
        }
        assert!(decode_ordered_entries(&Bytes::new()).unwrap().is_empty());
    }

    #[test]
    fn sort_key_ranges_are_half_open() {
        let r = SortKeyRange { start: -5, end: 5 };
        assert!(r.contains(-5) && r.contains(4) && !r.contains(5));
        assert!(SortKeyRange { start: 3, end: 3 }.is_empty());
        assert!(SortKeyRange { start: 4, end: 3 }.is_empty());
        assert!(!SortKeyRange::ALL.contains(i64::MAX));
    }
}
