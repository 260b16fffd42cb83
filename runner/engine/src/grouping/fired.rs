//! What a GroupByKey's firing emits, kept so that the engine can route it
//! without decoding it.
//!
//! A firing encodes each pane as a windowed `KV<K, Iterable<V>>` (the
//! bytes its consumers receive). Routing those bytes to a consumer's queue
//! needs each element's header and where its value starts and ends; the
//! firing had all of that in hand while encoding, whereas decoding it again
//! walks every value of every iterable (with all keys distinct, that second
//! walk was a fifth of the engine's time per element). So the firing
//! records it next to the bytes, and hands both on as one
//! [`ElementRun`].

use bytes::Bytes;

use crate::coder::{DecodedElement, ElementRun, RunRecord, WindowedValueHeader};

/// Encoded elements, back to back, and where each one lies in them.
#[derive(Debug, Default)]
pub struct Fired {
    /// The elements as their consumers receive them.
    pub bytes: Vec<u8>,
    /// Where each element lies in `bytes`, and its header.
    record: RunRecord,
}

impl Fired {
    /// Appends an element: `header` encoded as `bytes[start..value_start]`,
    /// then its value up to the current end of `bytes`.
    pub(super) fn record(&mut self, header: WindowedValueHeader, start: usize, value_start: usize) {
        self.record
            .push(header, start, value_start, self.bytes.len());
    }

    /// [`Self::record`] for a header the caller keeps for more elements.
    pub(super) fn record_shared(
        &mut self,
        header: &WindowedValueHeader,
        start: usize,
        value_start: usize,
    ) {
        self.record
            .push_shared(header, start, value_start, self.bytes.len());
    }

    /// Room for `bytes` more bytes and `elements` more elements (a big
    /// firing would otherwise grow both by doubling, copying each time).
    pub(super) fn reserve(&mut self, bytes: usize, elements: usize) {
        self.bytes.reserve(bytes);
        self.record.reserve(elements);
    }

    /// How many elements were emitted.
    pub fn element_count(&self) -> usize {
        self.record.len()
    }

    /// The bytes, frozen. Evaluation reserves room for all it may emit;
    /// what it did not fill must not stay allocated behind what is queued.
    fn frozen_bytes(mut bytes: Vec<u8>) -> Bytes {
        if bytes.capacity() > 2 * bytes.len() {
            bytes.shrink_to_fit();
        }
        Bytes::from(bytes)
    }

    /// The elements as one run (`None` if none fired).
    pub fn into_run(self) -> Option<ElementRun> {
        ElementRun::new(Self::frozen_bytes(self.bytes), self.record)
    }

    /// Each element as a slice of the bytes — what decoding the bytes
    /// would give, without decoding them.
    pub fn into_elements(self) -> Vec<DecodedElement> {
        let bytes = Self::frozen_bytes(self.bytes);
        self.record.into_elements(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coder::{decode_windowed_values, Coder, PaneInfo, PaneTiming};
    use crate::window::Window;

    #[test]
    fn recorded_elements_are_what_decoding_the_bytes_gives() {
        let window_coder = Coder::GlobalWindow;
        let value_coder = Coder::Bytes;
        let mut fired = Fired::default();
        for (i, (ts, value)) in [(5, &b"ab"[..]), (7, &b""[..]), (-3, &b"xyz"[..])]
            .into_iter()
            .enumerate()
        {
            let header = WindowedValueHeader {
                timestamp: ts,
                windows: smallvec::smallvec![Window::Global],
                pane: PaneInfo {
                    is_first: i == 0,
                    is_last: i == 2,
                    timing: PaneTiming::Late,
                    index: i as i64,
                    nonspeculative_index: i as i64,
                },
            };
            let start = fired.bytes.len();
            header.encode(&window_coder, &mut fired.bytes).unwrap();
            let value_start = fired.bytes.len();
            fired.bytes.push(value.len() as u8);
            fired.bytes.extend_from_slice(value);
            fired.record(header, start, value_start);
        }
        assert_eq!(fired.element_count(), 3);
        let bytes = Bytes::from(fired.bytes.clone());
        let got = fired.into_elements();
        let want = decode_windowed_values(&bytes, &value_coder, &window_coder).unwrap();
        assert_eq!(got, want);
    }
}
