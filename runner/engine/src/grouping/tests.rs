//! Tests of the grouping buffer as the engine uses it, and the helpers
//! the other grouping tests share.

use bytes::Bytes;

use super::{Fired, GroupingBuffer};
use crate::coder::{decode_windowed_values, Coder, DecodedElement, PaneInfo, WindowedValueHeader};
use crate::plan::{WindowFn, WindowingStrategy};
use crate::time::{Timestamp, MAX_TIMESTAMP};
use crate::window::Window;

/// `KV<bytes, varint>`, what the buffer tests (here and in `spill`)
/// group.
pub(super) fn kv_coder() -> Coder {
    Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Varint))
}

/// A `KV<bytes, varint>` element (`value` below 128: a one-byte varint).
pub(super) fn element(key: &[u8], value: u8, ts: Timestamp, window: Window) -> DecodedElement {
    let mut v = vec![key.len() as u8];
    v.extend_from_slice(key);
    v.push(value);
    let header = WindowedValueHeader {
        timestamp: ts,
        windows: smallvec::smallvec![window],
        pane: PaneInfo::NO_FIRING,
    };
    DecodedElement::new(header, Bytes::from(v), 0)
}

/// What a firing emitted, as the engine routes it; checked against
/// decoding its bytes (what a consumer will do).
pub(super) fn emitted(out: Fired, window_coder: &Coder) -> Vec<DecodedElement> {
    let bytes = bytes::Bytes::from(out.bytes.clone());
    let got = out.into_elements();
    let want = decode_windowed_values(&bytes, &out_coder(), window_coder).unwrap();
    assert_eq!(got, want, "what the firing recorded is what its bytes hold");
    got
}

/// An emitted `KV<key, Iterable<varint>>`'s key and its values
/// sorted (for keys and values under 128: one-byte lengths and
/// varints, as the tests write them).
pub(super) fn key_and_sorted_values(e: &DecodedElement) -> (Vec<u8>, Vec<u8>) {
    let klen = e.value()[0] as usize;
    let key = e.value()[1..1 + klen].to_vec();
    let mut values = e.value()[1 + klen + 4..].to_vec();
    values.sort();
    (key, values)
}

pub(super) fn out_coder() -> Coder {
    Coder::Kv(
        Box::new(Coder::Bytes),
        Box::new(Coder::Iterable(Box::new(Coder::Varint))),
    )
}

#[test]
fn groups_by_key_and_fires_at_watermark() {
    let mut g = GroupingBuffer::new(
        WindowingStrategy::global_default(),
        kv_coder(),
        Coder::GlobalWindow,
    );
    g.add(&element(b"a", 1, 0, Window::Global), 0, 0).unwrap();
    g.add(&element(b"b", 2, 5, Window::Global), 0, 0).unwrap();
    g.add(&element(b"a", 3, 7, Window::Global), 0, 0).unwrap();
    let mut out = Fired::default();
    assert_eq!(g.evaluate(1000, 0, &mut out, usize::MAX).unwrap(), 0);
    assert_eq!(g.hold(), Some(Window::Global.max_timestamp()));
    assert_eq!(
        g.evaluate(MAX_TIMESTAMP, 0, &mut out, usize::MAX).unwrap(),
        2
    );
    assert!(g.is_empty());
    let decoded = emitted(out, &Coder::GlobalWindow);
    // Keys come out in no particular order (Beam promises none); each
    // key's values in the order they came.
    let mut values: Vec<Vec<u8>> = decoded.iter().map(|e| e.value().to_vec()).collect();
    values.sort();
    assert_eq!(
        values,
        vec![
            vec![1, b'a', 0, 0, 0, 2, 1, 3],
            vec![1, b'b', 0, 0, 0, 1, 2]
        ]
    );
    assert!(decoded[0].header.pane.is_first && decoded[0].header.pane.is_last);
}

#[test]
fn merges_sessions() {
    let mut strategy = WindowingStrategy::global_default();
    strategy.window_fn = WindowFn::Sessions { gap: 10 };
    let mut g = GroupingBuffer::new(strategy, kv_coder(), Coder::IntervalWindow);
    let w = |s| Window::Interval {
        start: s,
        end: s + 10,
    };
    g.add(&element(b"a", 1, 0, w(0)), 0, 0).unwrap();
    g.add(&element(b"a", 2, 25, w(25)), 0, 0).unwrap();
    g.add(&element(b"a", 3, 5, w(5)), 0, 0).unwrap();
    let mut out = Fired::default();
    assert_eq!(
        g.evaluate(MAX_TIMESTAMP, 0, &mut out, usize::MAX).unwrap(),
        2
    );
    let decoded = emitted(out, &Coder::IntervalWindow);
    let windows: Vec<Window> = decoded
        .iter()
        .map(|e| e.header.windows[0].clone())
        .collect();
    assert_eq!(windows, vec![Window::Interval { start: 0, end: 15 }, w(25)]);
    assert_eq!(decoded[0].header.timestamp, 14);
}

#[test]
fn fires_only_passed_windows() {
    let mut strategy = WindowingStrategy::global_default();
    strategy.window_fn = WindowFn::Fixed {
        size: 10,
        offset: 0,
    };
    let mut g = GroupingBuffer::new(strategy, kv_coder(), Coder::IntervalWindow);
    let w = |s| Window::Interval {
        start: s,
        end: s + 10,
    };
    g.add(&element(b"a", 1, 1, w(0)), 0, 0).unwrap();
    g.add(&element(b"a", 2, 11, w(10)), 0, 0).unwrap();
    assert_eq!(g.hold(), Some(9));
    let mut out = Fired::default();
    assert_eq!(g.evaluate(10, 0, &mut out, usize::MAX).unwrap(), 1);
    assert_eq!(g.hold(), Some(19));
    // Late data for the fired window is dropped once the window expired.
    g.add(&element(b"a", 3, 2, w(0)), 10, 0).unwrap();
    assert_eq!(g.dropped_late(), 1);
}

#[test]
fn a_batch_buffer_keeps_data_for_windows_the_watermark_passed() {
    let mut strategy = WindowingStrategy::global_default();
    strategy.window_fn = WindowFn::Fixed {
        size: 10,
        offset: 0,
    };
    let mut g =
        GroupingBuffer::new(strategy, kv_coder(), Coder::IntervalWindow).keeping_late_data();
    let w0 = Window::Interval { start: 0, end: 10 };
    // The watermark is far past [0, 10) when its data arrives.
    g.add(&element(b"a", 1, 1, w0.clone()), 1_000, 0).unwrap();
    g.add(&element(b"a", 2, 2, w0.clone()), 1_000, 0).unwrap();
    assert_eq!(g.dropped_late(), 0);
    let mut out = Fired::default();
    assert_eq!(
        g.evaluate(MAX_TIMESTAMP, 0, &mut out, usize::MAX).unwrap(),
        1
    );
    let decoded = emitted(out, &Coder::IntervalWindow);
    assert_eq!(decoded.len(), 1);
    assert_eq!(decoded[0].header.windows[0], w0);
}
