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
    /// A window of a coder the runner does not understand
    /// (`beam:coder:custom_window:v1`), kept out of line: it is rare, and
    /// in place it would make every window (and every grouping buffer's
    /// pane) twice as big.
    Custom(Box<CustomWindow>),
}

/// A window the runner knows only by its max timestamp, which the SDK
/// prefixes to the window's own bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CustomWindow {
    /// The window's max timestamp, as written by the SDK.
    pub max_timestamp: Timestamp,
    /// The window's own length-prefixed bytes (without the timestamp
    /// prefix).
    pub encoded: Bytes,
}

impl Window {
    /// A custom window of `max_timestamp` whose own bytes (length-prefixed)
    /// are `encoded`.
    pub fn custom(max_timestamp: Timestamp, encoded: Bytes) -> Self {
        Window::Custom(Box::new(CustomWindow {
            max_timestamp,
            encoded,
        }))
    }

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
            Window::Custom(custom) => custom.max_timestamp,
        }
    }
}
