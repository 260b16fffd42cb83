//! Merging windows of a window function the runner cannot evaluate.
//!
//! Session windows the runner merges itself. Any other merging window
//! function (a user's custom `WindowFn`) is merged by the SDK that defines
//! it, through the `beam:transform:merge_windows:v1` transform: the runner
//! sends, per key, a nonce and the key's windows; the SDK answers, per
//! nonce, the windows it left alone and, for each merge result, the
//! windows merged into it. This module encodes those requests and decodes
//! the answers; [`crate::grouping`] applies them.
//!
//! Request element: `KV<bytes nonce, Iterable<W>>`; answer element:
//! `KV<bytes nonce, KV<Iterable<W>, Iterable<KV<W, Iterable<W>>>>>`, both in
//! the global window. The nonce is the key's position in the request.
//!
//! The answer's bytes come from an SDK, so reading them never indexes or
//! slices (which panic out of bounds): a short answer is a [`CoderError`].

#![deny(clippy::indexing_slicing)]

use bytes::Bytes;

use crate::coder::{
    decode_varint_u64, decode_windowed_values, encode_iterable_len, encode_varint_u64,
    encode_windowed_value, split_iterable, Coder, CoderError, PaneInfo, WindowedValueHeader,
};
use crate::time::MIN_TIMESTAMP;
use crate::window::Window;

/// For one key of a request: (merge result, the windows merged into it).
pub type Merges = Vec<(Window, Vec<Window>)>;

/// Encode a merge request for `keys` (each with its current windows).
pub fn encode_request(
    keys: &[(Bytes, Vec<Window>)],
    window_coder: &Coder,
) -> Result<Bytes, CoderError> {
    let mut out = Vec::new();
    let header = WindowedValueHeader {
        timestamp: MIN_TIMESTAMP,
        windows: smallvec::smallvec![Window::Global],
        pane: PaneInfo::NO_FIRING,
    };
    for (i, (_, windows)) in keys.iter().enumerate() {
        let nonce = i.to_string();
        let mut value = Vec::new();
        encode_varint_u64(nonce.len() as u64, &mut value);
        value.extend_from_slice(nonce.as_bytes());
        encode_iterable_len(windows.len(), &mut value)?;
        for w in windows {
            window_coder.encode_window(w, &mut value)?;
        }
        encode_windowed_value(&header, &Coder::GlobalWindow, &value, &mut out)?;
    }
    Ok(Bytes::from(out))
}

/// Decode the SDK's answer into (index of the key in the request, merges).
pub fn decode_response(
    buf: &Bytes,
    window_coder: &Coder,
) -> Result<Vec<(usize, Merges)>, CoderError> {
    let w = Box::new(window_coder.clone());
    let windows = Box::new(Coder::Iterable(w.clone()));
    let answer = Coder::Kv(
        Box::new(Coder::Bytes),
        Box::new(Coder::Kv(
            windows.clone(),
            Box::new(Coder::Iterable(Box::new(Coder::Kv(w, windows)))),
        )),
    );
    let invalid = |detail: String| CoderError::Invalid {
        what: "merge_windows answer",
        detail,
    };
    let mut result = Vec::new();
    for element in decode_windowed_values(buf, &answer, &Coder::GlobalWindow)? {
        let value = element.value();
        let nonce_len = Coder::Bytes.nested_len(value)?;
        let (nonce_field, rest) = split_at(value, nonce_len)?;
        let (_, prefix) = decode_varint_u64(nonce_field)?;
        let (_, nonce_bytes) = split_at(nonce_field, prefix)?;
        let nonce = std::str::from_utf8(nonce_bytes)
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .ok_or_else(|| invalid("the nonce is not one Refract sent".into()))?;
        let (_, unmerged_len) = split_iterable(rest, window_coder)?;
        let pair = Coder::Kv(
            Box::new(window_coder.clone()),
            Box::new(Coder::Iterable(Box::new(window_coder.clone()))),
        );
        let (_, merged_part) = split_at(rest, unmerged_len)?;
        let (pairs, _) = split_iterable(merged_part, &pair)?;
        let mut merges = Vec::with_capacity(pairs.len());
        for p in pairs {
            let (merged, n) = window_coder.decode_window(p)?;
            let (_, originals) = split_at(p, n)?;
            let (originals, _) = split_iterable(originals, window_coder)?;
            let originals = originals
                .into_iter()
                .map(|o| window_coder.decode_window(o).map(|(w, _)| w))
                .collect::<Result<Vec<_>, _>>()?;
            merges.push((merged, originals));
        }
        result.push((nonce, merges));
    }
    Ok(result)
}

/// `buf` cut after its first `n` bytes, or [`CoderError::Truncated`] when it
/// is shorter than that.
fn split_at(buf: &[u8], n: usize) -> Result<(&[u8], &[u8]), CoderError> {
    buf.split_at_checked(n)
        .ok_or(CoderError::Truncated("merge_windows answer"))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn iw(start: i64, end: i64) -> Window {
        Window::Interval { start, end }
    }

    /// One answer element: `value` in the global window, as an SDK sends it.
    fn in_global_window(value: &[u8]) -> Bytes {
        let header = WindowedValueHeader {
            timestamp: 0,
            windows: smallvec::smallvec![Window::Global],
            pane: PaneInfo::NO_FIRING,
        };
        let mut out = Vec::new();
        encode_windowed_value(&header, &Coder::GlobalWindow, value, &mut out).unwrap();
        Bytes::from(out)
    }

    #[test]
    fn answers_round_trip_through_the_wire_format() {
        let coder = Coder::IntervalWindow;
        let req = encode_request(
            &[(
                Bytes::from_static(b"k"),
                vec![iw(0, 10), iw(5, 15), iw(30, 40)],
            )],
            &coder,
        )
        .unwrap();
        let decoded = decode_windowed_values(
            &req,
            &Coder::Kv(
                Box::new(Coder::Bytes),
                Box::new(Coder::Iterable(Box::new(coder.clone()))),
            ),
            &Coder::GlobalWindow,
        )
        .unwrap();
        assert_eq!(decoded.len(), 1);

        // Build the answer an SDK would send: [30,40) unmerged; [0,15) from two.
        let mut value = vec![1, b'0'];
        encode_iterable_len(1, &mut value).unwrap();
        coder.encode_window(&iw(30, 40), &mut value).unwrap();
        encode_iterable_len(1, &mut value).unwrap();
        coder.encode_window(&iw(0, 15), &mut value).unwrap();
        encode_iterable_len(2, &mut value).unwrap();
        coder.encode_window(&iw(0, 10), &mut value).unwrap();
        coder.encode_window(&iw(5, 15), &mut value).unwrap();
        let answer = decode_response(&in_global_window(&value), &coder).unwrap();
        assert_eq!(
            answer,
            vec![(0, vec![(iw(0, 15), vec![iw(0, 10), iw(5, 15)])])]
        );
    }

    proptest! {
        #[test]
        fn any_answer_is_decoded_or_refused_without_panicking(
            tail in proptest::collection::vec(any::<u8>(), 0..64)
        ) {
            // A nonce Refract sent, then anything.
            let mut value = vec![1, b'0'];
            value.extend_from_slice(&tail);
            let _ = decode_response(&in_global_window(&value), &Coder::IntervalWindow);
        }
    }
}
