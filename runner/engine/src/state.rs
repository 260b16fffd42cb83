//! State the SDK reads and writes through the Fn API's state service, in
//! engine terms: side inputs (read-only, materialized by the runner once
//! their window is complete) and keyed user state (read-your-writes within a
//! bundle, committed only when the bundle succeeds).

use bytes::Bytes;
use thiserror::Error;

/// What the SDK asks for, with every id already resolved by the caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StateKey {
    /// All values of a side input in one window.
    IterableSideInput {
        /// Consuming transform id.
        transform_id: String,
        /// Side input tag.
        side_input_id: String,
        /// Encoded side-input window.
        window: Bytes,
    },
    /// Values of one key of a multimap side input in one window.
    MultimapSideInput {
        /// Consuming transform id.
        transform_id: String,
        /// Side input tag.
        side_input_id: String,
        /// Encoded side-input window.
        window: Bytes,
        /// Nested-encoded key.
        key: Bytes,
    },
    /// The keys of a multimap side input in one window.
    MultimapKeysSideInput {
        /// Consuming transform id.
        transform_id: String,
        /// Side input tag.
        side_input_id: String,
        /// Encoded side-input window.
        window: Bytes,
    },
    /// A bag of user state.
    BagUserState {
        /// Transform id.
        transform_id: String,
        /// State id.
        state_id: String,
        /// Encoded window.
        window: Bytes,
        /// Nested-encoded user key.
        key: Bytes,
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
    /// Append concatenated nested values to a bag.
    fn append(&self, key: &StateKey, data: Bytes) -> Result<(), StateError>;
    /// Clear a bag.
    fn clear(&self, key: &StateKey) -> Result<(), StateError>;
}
