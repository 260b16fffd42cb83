//! GroupByKey, done by the runner.
//!
//! Elements of a `KV<K, V>` PCollection are exploded into their windows and
//! buffered per (encoded key, window). Keys are compared as encoded bytes,
//! which is why key coders must be deterministic and why translation
//! length-prefixes key coders the runner cannot parse. Merging window
//! functions (sessions) merge a key's windows as elements arrive. A pane of
//! a (key, window) fires when the trigger says so — for the default trigger,
//! once the input watermark passes the end of the window — and is emitted as
//! `KV<K, Iterable<V>>` in the same window.
//!
//! While data is buffered, the stage holds its output watermark at the
//! timestamp its next pane will carry, so downstream stages never see a
//! watermark that has passed data still to come.
//!
//! A buffer given a spill space ([`GroupingBuffer::enable_spill`]) moves
//! what it holds there when it outgrows its memory share, and emits the
//! spilled windows a few megabytes at a time when they fire (`spill`).
//!
//! The parts, from the bottom up: a pane and a key's panes (`pane`, with
//! `hold_range`), the table of keys (`key_table`), elements that wait
//! unfiled until their window closes (`arrivals`), merging windows
//! (`merging`), firing and closing panes (`firing`, writing into `fired`),
//! the panes in memory (`memory`), the spill space (`spill`, which sees
//! the memory only through its `Spillable` interface), and the buffer the
//! engine drives (`buffer`).

mod arrivals;
mod buffer;
mod fired;
mod firing;
mod hold_range;
mod key_table;
mod memory;
mod merging;
mod pane;
mod spill;

use thiserror::Error;

use crate::coder::CoderError;
use crate::spill::SpillError;

pub use buffer::GroupingBuffer;
pub(crate) use buffer::GroupingSnapshot;
pub use fired::Fired;
pub(crate) use spill::SpilledWindows;
pub use spill::{read_iterable_page, IterablePage};

/// Why a grouping buffer could not take or emit elements.
#[derive(Debug, Error)]
pub enum GroupingError {
    /// Element bytes did not match the coders.
    #[error(transparent)]
    Coder(#[from] CoderError),
    /// The spill space failed.
    #[error(transparent)]
    Spill(#[from] SpillError),
}

#[cfg(test)]
mod arrivals_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod trigger_tests;
