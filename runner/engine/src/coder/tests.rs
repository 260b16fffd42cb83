//! Cross-cutting tests: vectors produced by the Python SDK 2.77, strategies
//! shared by the submodules' property tests, and the properties that span
//! every coder (walking finds exact boundaries; garbage is an error, never a
//! panic).
//!
//! The hex vectors were printed by a small script running the installed
//! `apache_beam` (e.g. `WindowedValueCoder(...).get_impl().encode_nested(..)`,
//! a generator for the chunked iterable form, `_TimerCoder`) and are pinned
//! here as constants.

use bytes::Bytes;
use proptest::collection::vec;
use proptest::prelude::*;

use super::*;
use crate::time::MAX_TIMESTAMP;

/// Bytes from a hex literal; whitespace is ignored so vectors can show
/// their fields.
pub(super) fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s
        .chars()
        .filter(|c| !c.is_whitespace())
        .map(|c| c.to_digit(16).map_or(u8::MAX, |d| d as u8))
        .collect();
    assert!(
        digits.len().is_multiple_of(2) && digits.iter().all(|&d| d < 16),
        "bad hex literal {s}"
    );
    digits
        .chunks(2)
        .map(|pair| pair[0] << 4 | pair[1])
        .collect()
}

fn pane(is_first: bool, is_last: bool, timing: PaneTiming, index: i64, nonspec: i64) -> PaneInfo {
    PaneInfo {
        is_first,
        is_last,
        timing,
        index,
        nonspeculative_index: nonspec,
    }
}

fn kv(k: Coder, v: Coder) -> Coder {
    Coder::Kv(Box::new(k), Box::new(v))
}

fn iterable(e: Coder) -> Coder {
    Coder::Iterable(Box::new(e))
}

fn length_prefixed(mut bytes: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_varint_u64(bytes.len() as u64, &mut out);
    out.append(&mut bytes);
    out
}

// ---------------------------------------------------------------------------
// Strategies.

/// Panes that survive a round trip: unknown panes carry no indices, early
/// panes no non-speculative index, and a (0, 0) pane is implied to be the
/// first one.
pub(super) fn arb_pane() -> impl Strategy<Value = PaneInfo> {
    let timed = (
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(PaneTiming::OnTime), Just(PaneTiming::Late)],
        prop_oneof![any::<i64>(), 0..4i64],
        prop_oneof![any::<i64>(), 0..4i64],
    )
        .prop_filter("a (0, 0) pane must be first", |(first, _, _, i, n)| {
            *first || *i != 0 || *n != 0
        })
        .prop_map(|(f, l, t, i, n)| pane(f, l, t, i, n));
    let early = (any::<bool>(), any::<bool>(), any::<i64>())
        .prop_map(|(f, l, i)| pane(f, l, PaneTiming::Early, i, -1));
    let unknown = (any::<bool>(), any::<bool>())
        .prop_map(|(f, l)| pane(f, l, PaneTiming::Unknown, if f { 0 } else { -1 }, 0));
    prop_oneof![timed, early, unknown]
}

/// One of the three window coders.
pub(super) fn arb_window_coder() -> impl Strategy<Value = Coder> {
    prop_oneof![
        Just(Coder::GlobalWindow),
        Just(Coder::IntervalWindow),
        Just(Coder::CustomWindow)
    ]
}

/// A window that `coder` (a window coder) can encode.
pub(super) fn arb_window_with(coder: Coder) -> BoxedStrategy<Window> {
    match coder {
        Coder::IntervalWindow => prop_oneof![
            (-1_000_000i64..1_000_000, 0i64..100_000),
            (any::<i64>(), any::<i64>()),
        ]
        .prop_filter_map("span overflows", |(start, span)| {
            let end = start.checked_add(span)?;
            end.checked_sub(start)?;
            Some(Window::Interval { start, end })
        })
        .boxed(),
        Coder::CustomWindow => (any::<i64>(), vec(any::<u8>(), 0..20))
            .prop_map(|(max_timestamp, window)| {
                Window::custom(max_timestamp, Bytes::from(length_prefixed(window)))
            })
            .boxed(),
        _ => Just(Window::Global).boxed(),
    }
}

/// A window coder and a window it can encode.
pub(super) fn arb_window() -> impl Strategy<Value = (Coder, Window)> {
    arb_window_coder().prop_flat_map(|c| (Just(c.clone()), arb_window_with(c)))
}

/// Windows for a header or timer: at most one global window (see the
/// window-count bound in `windowed_value`), up to three others.
fn arb_windows_with(coder: Coder) -> impl Strategy<Value = Vec<Window>> {
    let max = if coder == Coder::GlobalWindow { 1 } else { 3 };
    vec(arb_window_with(coder), 0..=max)
}

/// A windowed-value header whose windows `window_coder` can encode.
pub(super) fn arb_header_with(window_coder: Coder) -> impl Strategy<Value = WindowedValueHeader> {
    (any::<i64>(), arb_windows_with(window_coder), arb_pane()).prop_map(
        |(timestamp, windows, pane)| WindowedValueHeader {
            timestamp,
            windows: windows.into(),
            pane,
        },
    )
}

/// A timer whose key bytes come from `key` and whose windows `window_coder`
/// can encode.
fn arb_timer(
    key: impl Strategy<Value = Vec<u8>>,
    window_coder: Coder,
) -> impl Strategy<Value = TimerValue> {
    (
        key,
        "\\PC{0,6}",
        arb_windows_with(window_coder),
        any::<bool>(),
        any::<i64>(),
        any::<i64>(),
        arb_pane(),
    )
        .prop_map(
            |(key, dynamic_tag, windows, clear, fire, hold, pane)| TimerValue {
                user_key: Bytes::from(key),
                dynamic_tag,
                windows: windows.into(),
                clear,
                fire_timestamp: if clear { MAX_TIMESTAMP } else { fire },
                hold_timestamp: if clear { MAX_TIMESTAMP } else { hold },
                pane: if clear { PaneInfo::NO_FIRING } else { pane },
            },
        )
}

/// A timer with a length-prefixed key.
pub(super) fn arb_timer_with(window_coder: Coder) -> impl Strategy<Value = TimerValue> {
    arb_timer(
        vec(any::<u8>(), 0..8).prop_map(length_prefixed),
        window_coder,
    )
}

/// Any coder the runner can walk, up to a few levels deep.
fn arb_coder() -> impl Strategy<Value = Coder> {
    let leaf = prop_oneof![
        Just(Coder::Bytes),
        Just(Coder::StringUtf8),
        Just(Coder::Varint),
        Just(Coder::Bool),
        Just(Coder::Double),
        Just(Coder::LengthPrefix),
        Just(Coder::GlobalWindow),
        Just(Coder::IntervalWindow),
        Just(Coder::CustomWindow),
    ];
    leaf.prop_recursive(3, 16, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(k, v)| kv(k, v)),
            inner.clone().prop_map(iterable),
            inner.clone().prop_map(|c| Coder::Nullable(Box::new(c))),
            inner.clone().prop_map(|c| Coder::ShardedKey(Box::new(c))),
            (inner.clone(), arb_window_coder()).prop_map(|(v, w)| Coder::WindowedValue {
                value: Box::new(v),
                window: Box::new(w),
            }),
            (inner, arb_window_coder()).prop_map(|(k, w)| Coder::Timer {
                key: Box::new(k),
                window: Box::new(w),
            }),
        ]
    })
}

/// Writes elements in the chunked iterable form, in blocks of the given
/// sizes (the last block takes whatever is left).
fn chunked(elements: Vec<Vec<u8>>, block_sizes: &[usize]) -> Vec<u8> {
    let mut out = vec![0xff, 0xff, 0xff, 0xff];
    let mut rest = elements.as_slice();
    let mut sizes = block_sizes.iter();
    while !rest.is_empty() {
        let size = sizes.next().copied().unwrap_or(rest.len()).min(rest.len());
        let (block, tail) = rest.split_at(size);
        encode_varint_u64(block.len() as u64, &mut out);
        block.iter().for_each(|e| out.extend_from_slice(e));
        rest = tail;
    }
    out.push(0);
    out
}

/// The nested encoding of some value of `coder`, written independently of
/// the walker (iterables in both forms, nullables both ways).
fn arb_encoded(coder: &Coder) -> BoxedStrategy<Vec<u8>> {
    match coder {
        Coder::Bytes | Coder::LengthPrefix => {
            vec(any::<u8>(), 0..12).prop_map(length_prefixed).boxed()
        }
        Coder::StringUtf8 => "\\PC{0,6}"
            .prop_map(|s: String| length_prefixed(s.into_bytes()))
            .boxed(),
        Coder::Varint => any::<i64>()
            .prop_map(|v| {
                let mut out = Vec::new();
                encode_varint_i64(v, &mut out);
                out
            })
            .boxed(),
        Coder::Bool => any::<bool>().prop_map(|b| vec![u8::from(b)]).boxed(),
        Coder::Double => any::<f64>().prop_map(|d| d.to_be_bytes().to_vec()).boxed(),
        Coder::Kv(k, v) => (arb_encoded(k), arb_encoded(v))
            .prop_map(|(k, v)| [k, v].concat())
            .boxed(),
        Coder::Iterable(e) => (vec(arb_encoded(e), 0..4), any::<bool>(), vec(1..3usize, 3))
            .prop_map(|(elements, use_chunks, sizes)| {
                if use_chunks {
                    chunked(elements, &sizes)
                } else {
                    let mut out = (elements.len() as i32).to_be_bytes().to_vec();
                    elements.iter().for_each(|e| out.extend_from_slice(e));
                    out
                }
            })
            .boxed(),
        Coder::Nullable(inner) => proptest::option::of(arb_encoded(inner))
            .prop_map(|v| match v {
                None => vec![0],
                Some(v) => [vec![1], v].concat(),
            })
            .boxed(),
        Coder::GlobalWindow | Coder::IntervalWindow | Coder::CustomWindow => {
            let c = coder.clone();
            arb_window_with(coder.clone())
                .prop_filter_map("window encodes", move |w| {
                    let mut out = Vec::new();
                    c.encode_window(&w, &mut out).ok().map(|()| out)
                })
                .boxed()
        }
        Coder::WindowedValue { value, window } => {
            let window = (**window).clone();
            (arb_header_with(window.clone()), arb_encoded(value))
                .prop_filter_map("windowed value encodes", move |(header, value)| {
                    let mut out = Vec::new();
                    encode_windowed_value(&header, &window, &value, &mut out)
                        .ok()
                        .map(|()| out)
                })
                .boxed()
        }
        Coder::Timer { key, window } => {
            let window = (**window).clone();
            arb_timer(arb_encoded(key), window.clone())
                .prop_filter_map("timer encodes", move |timer| {
                    let mut out = Vec::new();
                    timer.encode(&window, &mut out).ok().map(|()| out)
                })
                .boxed()
        }
        Coder::ShardedKey(k) => (vec(any::<u8>(), 0..4), arb_encoded(k))
            .prop_map(|(shard, key)| [length_prefixed(shard), key].concat())
            .boxed(),
    }
}

// ---------------------------------------------------------------------------
// Vectors from the Python SDK.

#[test]
fn python_varints_and_timestamps() -> Result<(), CoderError> {
    let varints: [(i64, &str); 10] = [
        (0, "00"),
        (1, "01"),
        (127, "7f"),
        (128, "8001"),
        (300, "ac02"),
        (16384, "808001"),
        (-1, "ffffffffffffffffff01"),
        (-2, "feffffffffffffffff01"),
        (i64::MAX, "ffffffffffffffff7f"),
        (i64::MIN, "80808080808080808001"),
    ];
    for (v, h) in varints {
        let mut out = Vec::new();
        encode_varint_i64(v, &mut out);
        assert_eq!(out, hex(h), "{v}");
        assert_eq!(decode_varint_i64(&out)?, (v, out.len()));
        assert_eq!(Coder::Varint.nested_len(&out)?, out.len());
    }
    let timestamps: [(i64, &str); 6] = [
        (0, "8000000000000000"),
        (-1, "7fffffffffffffff"),
        (1_234_567, "800000000012d687"),
        (-1_234_567, "7fffffffffed2979"),
        (crate::time::MIN_TIMESTAMP, "7fdf3b645a1cac09"),
        (MAX_TIMESTAMP, "8020c49ba5e353f7"),
    ];
    for (ts, h) in timestamps {
        let mut out = Vec::new();
        encode_timestamp(ts, &mut out);
        assert_eq!(out, hex(h), "{ts}");
        assert_eq!(decode_timestamp(&out)?, (ts, 8));
    }
    Ok(())
}

#[test]
fn python_panes() -> Result<(), CoderError> {
    use PaneTiming::{Early, Late, OnTime, Unknown};
    let panes = [
        (pane(true, true, Unknown, 0, 0), "0f"),
        (pane(true, true, OnTime, 0, 0), "07"),
        (pane(true, false, Early, 0, -1), "1100"),
        (pane(false, false, Early, 1, -1), "1001"),
        (pane(false, false, OnTime, 2, 0), "240200"),
        (pane(false, true, Late, 3, 2), "2a0302"),
        (pane(false, false, Late, 4, 4), "1804"),
        (pane(false, true, Late, 300, 299), "2aac02ab02"),
    ];
    for (p, h) in panes {
        let mut out = Vec::new();
        p.encode(&mut out);
        assert_eq!(out, hex(h), "{p:?}");
        assert_eq!(PaneInfo::decode(&out)?, (p, out.len()));
    }
    // Python's table for the encoding-type-0 byte, one entry per low nibble.
    let timings = [Early, OnTime, Late, Unknown];
    for byte in 0u8..16 {
        let timing = timings[usize::from(byte >> 2)];
        let first = byte & 1 != 0;
        let expected = pane(
            first,
            byte & 2 != 0,
            timing,
            if first { 0 } else { -1 },
            if timing == Early { -1 } else { 0 },
        );
        assert_eq!(PaneInfo::decode(&[byte])?, (expected, 1), "{byte:#x}");
    }
    Ok(())
}

#[test]
fn python_windowed_values() -> Result<(), CoderError> {
    // WindowedValueCoder(VarIntCoder, GlobalWindowCoder): 5 at ts 0.
    let buf = Bytes::from(hex("8000000000000000 00000001 0f 05"));
    let elements = decode_windowed_values(&buf, &Coder::Varint, &Coder::GlobalWindow)?;
    assert_eq!(elements.len(), 1);
    assert_eq!(elements[0].header.timestamp, 0);
    assert_eq!(
        elements[0].header.windows,
        smallvec::smallvec![Window::Global] as crate::coder::Windows
    );
    assert_eq!(elements[0].header.pane, PaneInfo::NO_FIRING);
    assert_eq!(elements[0].value(), [0x05]);
    assert_eq!(elements[0].encoded, buf);

    // KV<bytes, varint>(b"key", 42) at 7 s in [0, 10 s) and [5 s, 15 s),
    // early pane 1, followed by KV(b"", -1) at -5 ms in [-10 ms, 0), late
    // pane 3 (on-time index 2).
    let first = hex(
        "8000000000001b58 00000002 8000000000002710 904e 8000000000003a98 904e 1001 03 6b6579 2a",
    );
    let second =
        hex("7ffffffffffffffb 00000001 8000000000000000 0a 2a0302 00 ffffffffffffffffff01");
    let buf = Bytes::from([first.clone(), second.clone()].concat());
    let coder = kv(Coder::Bytes, Coder::Varint);
    let elements = decode_windowed_values(&buf, &coder, &Coder::IntervalWindow)?;
    let expected_headers = [
        WindowedValueHeader {
            timestamp: 7_000,
            windows: smallvec::smallvec![
                Window::Interval {
                    start: 0,
                    end: 10_000,
                },
                Window::Interval {
                    start: 5_000,
                    end: 15_000,
                },
            ],
            pane: pane(false, false, PaneTiming::Early, 1, -1),
        },
        WindowedValueHeader {
            timestamp: -5,
            windows: smallvec::smallvec![Window::Interval { start: -10, end: 0 }],
            pane: pane(false, true, PaneTiming::Late, 3, 2),
        },
    ];
    assert_eq!(elements.len(), 2);
    for ((element, header), bytes) in elements
        .iter()
        .zip(&expected_headers)
        .zip([&first, &second])
    {
        assert_eq!(&element.header, header);
        assert_eq!(&element.encoded[..], &bytes[..]);
        let mut again = Vec::new();
        encode_windowed_value(header, &Coder::IntervalWindow, element.value(), &mut again)?;
        assert_eq!(&again, bytes);
    }
    assert_eq!(coder.kv_key_len(elements[0].value())?, 4);
    assert_eq!(&elements[0].value()[..4], b"\x03key");
    assert_eq!(coder.kv_key_len(elements[1].value())?, 1);
    let wv_coder = Coder::WindowedValue {
        value: Box::new(coder),
        window: Box::new(Coder::IntervalWindow),
    };
    assert_eq!(wv_coder.nested_len(&buf)?, first.len());
    Ok(())
}

#[test]
fn python_chunked_iterables() -> Result<(), CoderError> {
    let coder = iterable(Coder::Varint);
    assert_eq!(coder.nested_len(&hex("00000002 01 02"))?, 6);
    // From a generator: [1, 2] and [].
    assert_eq!(coder.nested_len(&hex("ffffffff 02 01 02 00"))?, 8);
    assert_eq!(coder.nested_len(&hex("ffffffff 00"))?, 5);

    // KV<str, Iterable<varint>>: ("a", generator of 1, 300) at 0 in the
    // global window, then ("bc", [7]) at 1000 s on time.
    let buf = Bytes::from(hex(concat!(
        "8000000000000000 00000001 0f 0161 ffffffff 02 01 ac02 00",
        "80000000000f4240 00000001 0f 026263 00000001 07",
    )));
    let value_coder = kv(Coder::StringUtf8, iterable(Coder::Varint));
    let elements = decode_windowed_values(&buf, &value_coder, &Coder::GlobalWindow)?;
    assert_eq!(elements.len(), 2);
    assert_eq!(elements[0].value(), hex("0161 ffffffff 02 01 ac02 00"));
    assert_eq!(elements[1].header.timestamp, 1_000_000);
    assert_eq!(elements[1].value(), hex("026263 00000001 07"));
    assert_eq!(value_coder.kv_key_len(elements[1].value())?, 3);
    Ok(())
}

#[test]
fn python_windows() -> Result<(), CoderError> {
    let windows = [
        (
            Coder::IntervalWindow,
            Window::Interval {
                start: 0,
                end: 10_000,
            },
            hex("8000000000002710 904e"),
        ),
        (
            Coder::IntervalWindow,
            Window::Interval {
                start: -20_000,
                end: -5_000,
            },
            hex("7fffffffffffec78 9875"),
        ),
        // TimestampPrefixingWindowCoder(LengthPrefixCoder(IntervalWindowCoder)):
        // what the SDK writes for a custom window coder after translation.
        (
            Coder::CustomWindow,
            Window::custom(9_999, Bytes::from(hex("0a 8000000000002710 904e"))),
            hex("800000000000270f 0a 8000000000002710 904e"),
        ),
        (Coder::GlobalWindow, Window::Global, Vec::new()),
    ];
    for (coder, window, bytes) in windows {
        assert_eq!(coder.decode_window(&bytes)?, (window.clone(), bytes.len()));
        let mut out = Vec::new();
        coder.encode_window(&window, &mut out)?;
        assert_eq!(out, bytes);
    }
    // A windowed value in that custom window: b"x" at 3 ms.
    let buf = Bytes::from(hex(
        "8000000000000003 00000001 800000000000270f 0a8000000000002710904e 0f 0178",
    ));
    let elements = decode_windowed_values(&buf, &Coder::Bytes, &Coder::CustomWindow)?;
    assert_eq!(elements.len(), 1);
    assert_eq!(elements[0].header.windows[0].max_timestamp(), 9_999);
    assert_eq!(elements[0].value(), [0x01, 0x78]);
    Ok(())
}

#[test]
fn python_timers() -> Result<(), CoderError> {
    // _TimerCoder(LengthPrefixCoder(VarIntCoder), IntervalWindowCoder): key
    // 300, tag "tag1", window [0, 60 s), fire 59.999 s, hold 30 s, first early
    // pane; then key 7 cleared in [60 s, 120 s).
    let buf = Bytes::from(hex(concat!(
        "02ac02 04 74616731 00000001 800000000000ea60 e0d403 00",
        " 800000000000ea5f 8000000000007530 1100",
        "0107 00 00000001 800000000001d4c0 e0d403 01",
    )));
    let timers = decode_timers(&buf, &Coder::LengthPrefix, &Coder::IntervalWindow)?;
    let expected = vec![
        TimerValue {
            user_key: Bytes::from(hex("02ac02")),
            dynamic_tag: "tag1".to_string(),
            windows: smallvec::smallvec![Window::Interval {
                start: 0,
                end: 60_000,
            }],
            clear: false,
            fire_timestamp: 59_999,
            hold_timestamp: 30_000,
            pane: pane(true, false, PaneTiming::Early, 0, -1),
        },
        TimerValue {
            user_key: Bytes::from(hex("0107")),
            dynamic_tag: String::new(),
            windows: smallvec::smallvec![Window::Interval {
                start: 60_000,
                end: 120_000,
            }],
            clear: true,
            fire_timestamp: MAX_TIMESTAMP,
            hold_timestamp: MAX_TIMESTAMP,
            pane: PaneInfo::NO_FIRING,
        },
    ];
    assert_eq!(timers, expected);
    let mut again = Vec::new();
    for timer in &timers {
        timer.encode(&Coder::IntervalWindow, &mut again)?;
    }
    assert_eq!(&again[..], &buf[..]);
    Ok(())
}

#[test]
fn python_other_standard_coders() -> Result<(), CoderError> {
    let cases = [
        (Coder::Nullable(Box::new(Coder::Varint)), "00"),
        (Coder::Nullable(Box::new(Coder::Varint)), "0107"),
        (Coder::Nullable(Box::new(Coder::StringUtf8)), "01026869"),
        (
            Coder::ShardedKey(Box::new(Coder::StringUtf8)),
            "020102036b6579",
        ),
        (Coder::Double, "3ff8000000000000"),
        (Coder::Bool, "01"),
        (Coder::LengthPrefix, "02ac02"),
        (Coder::StringUtf8, "0668c3a96c6c6f"),
    ];
    for (coder, h) in cases {
        let bytes = hex(h);
        let mut padded = bytes.clone();
        padded.extend_from_slice(&[0xde, 0xad]);
        assert_eq!(coder.nested_len(&padded)?, bytes.len(), "{coder:?} {h}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Properties over every coder.

proptest! {
    #[test]
    fn walking_finds_exact_boundaries(
        (coder, a, b) in arb_coder().prop_flat_map(|c| {
            let (a, b) = (arb_encoded(&c), arb_encoded(&c));
            (Just(c), a, b)
        }),
    ) {
        let both = [a.clone(), b].concat();
        prop_assert_eq!(coder.nested_len(&both), Ok(a.len()));
        for cut in 0..a.len() {
            prop_assert!(coder.nested_len(&a[..cut]).is_err(), "prefix {} of {:?} walked", cut, coder);
        }
        if let Coder::Kv(key, _) = &coder {
            let key_len = coder.kv_key_len(&a);
            prop_assert_eq!(key_len, key.nested_len(&a));
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic(
        coder in arb_coder(),
        window_coder in arb_window_coder(),
        buf in vec(any::<u8>(), 0..64),
    ) {
        if let Ok(n) = coder.nested_len(&buf) {
            prop_assert!(n <= buf.len());
        }
        let _ = coder.kv_key_len(&buf);
        let _ = window_coder.decode_window(&buf);
        let _ = WindowedValueHeader::decode(&buf, &window_coder);
        let _ = PaneInfo::decode(&buf);
        let shared = Bytes::from(buf);
        if let Ok(elements) = decode_windowed_values(&shared, &coder, &window_coder) {
            prop_assert_eq!(elements.iter().map(|e| e.encoded.len()).sum::<usize>(), shared.len());
        }
        let _ = decode_timers(&shared, &coder, &window_coder);
    }

    #[test]
    fn garbage_after_a_valid_header_is_an_error_not_a_panic(
        (window_coder, header) in arb_window_coder().prop_flat_map(|c| (Just(c.clone()), arb_header_with(c))),
        coder in arb_coder(),
        tail in vec(any::<u8>(), 0..48),
    ) {
        let mut buf = Vec::new();
        header.encode(&window_coder, &mut buf).map_err(|e| TestCaseError::fail(e.to_string()))?;
        buf.extend_from_slice(&tail);
        let _ = decode_windowed_values(&Bytes::from(buf), &coder, &window_coder);
    }
}
