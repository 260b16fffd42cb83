//! A bundle's output that did not fit in memory.
//!
//! A bundle's output is handed on only when the bundle succeeds (a failed
//! one is retried, and nothing of it may have been seen), so until then it
//! waits in the runner. Splitting a bundle once its output grows bounds
//! that for most stages, but not for one element whose DoFn emits far more
//! than it reads (`FlatMap` over a file name, a generator): its output
//! cannot be cut. So the executor writes a bundle's output to the spill
//! store once it outgrows the bundle's share of memory, as parts of each
//! output's byte stream in order, and the engine reads it back a page at a
//! time when it commits the bundle. Parts are not cut at element
//! boundaries (the SDK's data messages are not), so a page is handed on up
//! to its last whole element and the rest waits for the next.
//!
//! The parts are scratch space: they are deleted once read, or when the
//! output is dropped unread (the bundle failed, or the job ended).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::coder::{whole_elements_len, Coder, CoderError};
use crate::spill::{forget_prefix, prefix_end, PagedRange, SpillError, SpillSpace};

/// Parts of one output of one bundle in the spill space: every key under
/// a prefix, in key order.
#[derive(Debug)]
pub struct SpilledOutput {
    store: Arc<dyn SpillSpace>,
    prefix: Vec<u8>,
    bytes: u64,
}

/// Why spilled output could not be handed on.
#[derive(Debug, thiserror::Error)]
pub enum SpilledOutputError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] SpillError),
    /// The bytes are not the output's elements.
    #[error(transparent)]
    Decode(#[from] CoderError),
}

impl SpilledOutput {
    /// The `bytes` written under `prefix` (keys that order the parts as
    /// they were written). `None` for a prefix of only `0xFF` bytes, which
    /// has no end.
    pub fn new(store: Arc<dyn SpillSpace>, prefix: Vec<u8>, bytes: u64) -> Option<Self> {
        prefix_end(&prefix)?;
        Some(SpilledOutput {
            store,
            prefix,
            bytes,
        })
    }

    /// How many bytes were spilled.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Reads the output back a page at a time, handing `deliver` each
    /// page's whole elements (concatenated nested windowed values in
    /// `value_coder` and `window_coder`), and returns what is left after
    /// the last whole element: the start of one that continues in the
    /// bundle's in-memory output. Errors are `deliver`'s own, or the read's.
    pub fn read<E: From<SpilledOutputError>>(
        &self,
        value_coder: &Coder,
        window_coder: &Coder,
        mut deliver: impl FnMut(Bytes) -> Result<(), E>,
    ) -> Result<BytesMut, E> {
        let mut carry = BytesMut::new();
        let mut range = PagedRange::prefixed(&self.prefix);
        loop {
            let page = range
                .next_page(self.store.as_ref())
                .map_err(SpilledOutputError::from)?;
            if page.is_empty() {
                return Ok(carry);
            }
            for (_, part) in &page {
                carry.extend_from_slice(part);
            }
            let whole = whole_elements_len(&carry, value_coder, window_coder)
                .map_err(SpilledOutputError::from)?;
            if whole > 0 {
                deliver(carry.split_to(whole).freeze())?;
            }
        }
    }
}

impl Drop for SpilledOutput {
    fn drop(&mut self) {
        if let Err(e) = forget_prefix(self.store.as_ref(), &self.prefix) {
            tracing::warn!(error = %e, "could not delete a bundle's spilled output");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coder::{encode_varint_u64, encode_windowed_value, PaneInfo, WindowedValueHeader};
    use crate::spill::MemorySpillSpace;
    use crate::window::Window;

    /// `n` elements of `Bytes` values, each `i` repeated `i % 7` times.
    fn stream(n: u8) -> Vec<u8> {
        let header = WindowedValueHeader {
            timestamp: 0,
            windows: smallvec::smallvec![Window::Global],
            pane: PaneInfo::NO_FIRING,
        };
        let mut out = Vec::new();
        for i in 0..n {
            let len = usize::from(i % 7);
            let mut value = Vec::new();
            encode_varint_u64(len as u64, &mut value);
            value.extend(std::iter::repeat_n(i, len));
            encode_windowed_value(&header, &Coder::GlobalWindow, &value, &mut out).unwrap();
        }
        out
    }

    /// The stream written as parts of `part` bytes under `prefix`.
    fn spill(store: &Arc<MemorySpillSpace>, prefix: &[u8], bytes: &[u8], part: usize) {
        let entries = bytes
            .chunks(part)
            .enumerate()
            .map(|(i, c)| {
                let mut key = prefix.to_vec();
                key.extend_from_slice(&(i as u32).to_be_bytes());
                (key, c.to_vec())
            })
            .collect();
        store.put(entries).unwrap();
    }

    #[test]
    fn parts_cut_inside_elements_come_back_as_whole_elements_then_the_rest() {
        let bytes = stream(50);
        for part in [1, 3, 17, bytes.len()] {
            let store = MemorySpillSpace::shared();
            // Another output's parts, next to this one's, stay apart.
            spill(&store, b"o\x02", b"other", 2);
            let cut = bytes.len() - 2;
            spill(&store, b"o\x01", &bytes[..cut], part);
            let output = SpilledOutput::new(store.clone(), b"o\x01".to_vec(), cut as u64).unwrap();
            let mut delivered = Vec::new();
            let rest = output
                .read(
                    &Coder::Bytes,
                    &Coder::GlobalWindow,
                    |b| -> Result<(), SpilledOutputError> {
                        assert_eq!(
                            whole_elements_len(&b, &Coder::Bytes, &Coder::GlobalWindow).unwrap(),
                            b.len(),
                            "only whole elements"
                        );
                        delivered.extend_from_slice(&b);
                        Ok(())
                    },
                )
                .unwrap();
            delivered.extend_from_slice(&rest);
            assert_eq!(delivered, &bytes[..cut], "parts of {part}");
            assert!(!rest.is_empty(), "the last element continues in memory");
            drop(output);
            assert_eq!(store.len(), 3, "its parts are gone, the other's stay");
        }
    }

    #[test]
    fn bytes_that_are_not_elements_are_an_error() {
        let store = MemorySpillSpace::shared();
        // A global-window element whose pane byte is not a valid pane.
        spill(
            &store,
            b"p",
            &[0x7F, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xFF, 1],
            4,
        );
        let output = SpilledOutput::new(store, b"p".to_vec(), 14).unwrap();
        let read = output.read(&Coder::Bytes, &Coder::GlobalWindow, |_| {
            Ok::<(), SpilledOutputError>(())
        });
        assert!(
            matches!(read, Err(SpilledOutputError::Decode(_))),
            "{read:?}"
        );
    }
}
