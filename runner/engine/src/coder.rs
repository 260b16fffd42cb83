//! The runner's view of Beam's standard coders.
//!
//! A runner must read a little of every element: where it ends, its
//! timestamp, windows and pane, and for keyed transforms the bytes of its key.
//! It never needs a user's value. So this module knows only the wire formats
//! of the standard coders that can appear *around* user data (see
//! `beam_runner_api.proto`'s `StandardCoders`), and treats everything else as
//! length-prefixed opaque bytes: translation wraps each unknown coder in
//! `length_prefix` before any SDK sees a bundle descriptor, so the bytes the
//! SDK writes are always walkable here.
//!
//! Encodings are "nested" (self-delimiting) unless a function says otherwise.
//!
//! # How the pieces fit
//!
//! * Varints and timestamps ([`encode_varint_u64`], [`encode_timestamp`]) —
//!   the two number formats every other coder is built from.
//! * Walking ([`Coder::nested_len`], [`Coder::kv_key_len`]) — finding where a
//!   value ends without decoding it. This is what lets the runner split a data
//!   channel's byte stream into elements and carve the key out of a `KV`
//!   without allocating anything.
//! * Windows ([`Coder::decode_window`]) and panes ([`PaneInfo::decode`]) —
//!   the only parts of an element whose *meaning* the runner needs.
//! * Windowed values ([`decode_windowed_values`]) and timers
//!   ([`decode_timers`]) — what actually crosses the data plane.
//!
//! Decoding is strict where a mistake would silently corrupt grouping (bad
//! pane bytes, bool bytes other than 0/1, varints longer than 64 bits) and is
//! always total: any byte string yields a value or a [`CoderError`], never a
//! panic, because the bytes come from another process. Indexing and
//! slicing, which panic out of bounds, are denied here for that reason.

#![deny(clippy::indexing_slicing)]

use serde::{Deserialize, Serialize};

mod context;
mod element_run;
mod iterable;
mod pane;
mod primitive;
mod reader;
mod timer;
mod walk;
mod window_coder;
mod windowed_value;

#[cfg(test)]
// Tests index what they built: out of bounds is a failed test.
#[allow(clippy::indexing_slicing)]
mod tests;

use thiserror::Error;

use crate::time::Timestamp;
use crate::window::Window;

pub use element_run::{ElementRun, RunRecord};
pub use iterable::split_iterable;
pub use primitive::{
    decode_timestamp, decode_varint_i64, decode_varint_u64, encode_timestamp, encode_varint_i64,
    encode_varint_u64,
};
pub use timer::{decode_timers, TimerValue};
pub use windowed_value::{
    decode_whole_windowed_values, decode_windowed_values, encode_iterable_len,
    encode_windowed_value, iterable_len_bytes, whole_elements_len, BorrowedWindowedValues,
    DecodedElement,
};

/// Why bytes could not be read as the coder said they would be.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CoderError {
    /// The buffer ended inside a value.
    #[error("unexpected end of input while decoding {0}")]
    Truncated(&'static str),
    /// The bytes are not a valid encoding for the coder.
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// Which coder or field was being read.
        what: &'static str,
        /// What was wrong with it.
        detail: String,
    },
}

/// A coder whose wire format the runner can walk. Opaque user coders appear
/// as [`Coder::LengthPrefix`]: a varint length followed by that many bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coder {
    /// `beam:coder:bytes:v1`.
    Bytes,
    /// `beam:coder:string_utf8:v1` (same framing as bytes).
    StringUtf8,
    /// `beam:coder:varint:v1`.
    Varint,
    /// `beam:coder:bool:v1`.
    Bool,
    /// `beam:coder:double:v1`.
    Double,
    /// `beam:coder:kv:v1`.
    Kv(Box<Coder>, Box<Coder>),
    /// `beam:coder:iterable:v1` (both the known-length and the chunked form).
    Iterable(Box<Coder>),
    /// `beam:coder:length_prefix:v1` over anything: opaque to the runner.
    LengthPrefix,
    /// `beam:coder:nullable:v1`.
    Nullable(Box<Coder>),
    /// `beam:coder:global_window:v1`.
    GlobalWindow,
    /// `beam:coder:interval_window:v1`.
    IntervalWindow,
    /// `beam:coder:custom_window:v1` around a length-prefixed user window:
    /// an 8-byte max timestamp, then the length-prefixed window bytes.
    CustomWindow,
    /// `beam:coder:windowed_value:v1`.
    WindowedValue {
        /// The element's coder.
        value: Box<Coder>,
        /// The window coder.
        window: Box<Coder>,
    },
    /// `beam:coder:timer:v1`.
    Timer {
        /// The user key's coder.
        key: Box<Coder>,
        /// The window coder.
        window: Box<Coder>,
    },
    /// `beam:coder:sharded_key:v1`.
    ShardedKey(Box<Coder>),
}

/// Whether a pane fired before, at or after the watermark passed the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PaneTiming {
    /// Before the watermark passed the end of the window.
    Early,
    /// The pane fired as the watermark passed the end of the window.
    OnTime,
    /// After the watermark passed the end of the window.
    Late,
    /// Not known (e.g. an element that was never grouped).
    Unknown,
}

/// `PaneInfo` as carried in every windowed value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PaneInfo {
    /// First pane of its window.
    pub is_first: bool,
    /// Last pane of its window.
    pub is_last: bool,
    /// Timing relative to the watermark.
    pub timing: PaneTiming,
    /// Zero-based index of the pane among all panes of the window.
    pub index: i64,
    /// Index among non-early panes; -1 for early panes.
    pub nonspeculative_index: i64,
}

impl PaneInfo {
    /// The pane of an element that has never been through a trigger (`0x0F`).
    pub const NO_FIRING: PaneInfo = PaneInfo {
        is_first: true,
        is_last: true,
        timing: PaneTiming::Unknown,
        index: 0,
        nonspeculative_index: 0,
    };
}

/// An element's windows: almost always one, stored inline.
pub type Windows = smallvec::SmallVec<[Window; 1]>;

/// The header of a windowed value: everything the runner needs to schedule it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowedValueHeader {
    /// Event time of the element.
    pub timestamp: Timestamp,
    /// The windows the element is in (usually one, kept inline: no
    /// allocation per element).
    pub windows: Windows,
    /// Pane of the element.
    pub pane: PaneInfo,
}
