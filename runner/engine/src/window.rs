//! Windows as the runner sees them.
//!
//! Windows are assigned by the SDK (`WindowInto` runs in the harness); the
//! runner reads them from element headers to group by (key, window), to know
//! when a window's end has passed the watermark, and to merge sessions.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::time::{Timestamp, GLOBAL_WINDOW_MAX_TIMESTAMP};

/// One window of an element.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Window {
    /// The single global window.
    Global,
    /// `[start, end)` in milliseconds.
    Interval {
        /// Inclusive start.
        start: Timestamp,
        /// Exclusive end.
        end: Timestamp,
    },
    /// A window of a coder the runner does not understand, prefixed by its
    /// max timestamp (`beam:coder:custom_window:v1`). `encoded` holds the
    /// window's own length-prefixed bytes (without the timestamp prefix).
    Custom {
        /// The window's max timestamp, as written by the SDK.
        max_timestamp: Timestamp,
        /// The length-prefixed window bytes.
        encoded: Bytes,
    },
}

impl Window {
    /// When the window's state is garbage-collected: its end plus the
    /// allowed lateness, capped at the end of the global window (as Beam
    /// caps it), so that even a huge lateness expires at the end of time.
    pub fn garbage_collection_time(&self, allowed_lateness: i64) -> Timestamp {
        self.max_timestamp()
            .saturating_add(allowed_lateness)
            .min(GLOBAL_WINDOW_MAX_TIMESTAMP)
    }

    /// The largest timestamp an element in this window may have; the window
    /// is complete once the watermark passes it.
    pub fn max_timestamp(&self) -> Timestamp {
        match self {
            Window::Global => GLOBAL_WINDOW_MAX_TIMESTAMP,
            Window::Interval { end, .. } => end.saturating_sub(1),
            Window::Custom { max_timestamp, .. } => *max_timestamp,
        }
    }
}
