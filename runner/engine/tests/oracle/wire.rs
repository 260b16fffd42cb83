//! Bytes in and out: how the tests' elements look on the data plane.
//!
//! Inputs are `KV<bytes, varint>` windowed values (key = one byte, value =
//! the element's id); grouped outputs are `KV<bytes, Iterable<varint>>`,
//! decoded back into [`Pane`]s so they can be compared with a reference.

use bytes::Bytes;
use refract_engine::coder::{
    decode_varint_i64, decode_windowed_values, encode_varint_i64, encode_windowed_value, Coder,
    DecodedElement, PaneInfo, PaneTiming, WindowedValueHeader,
};
use refract_engine::window::Window;

use super::model::{Input, Key, Pane, Timing};

/// The coder of the grouping input: `KV<bytes, varint>`.
pub fn kv_coder() -> Coder {
    Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Varint))
}

/// The coder of the grouping output: `KV<bytes, Iterable<varint>>`.
pub fn grouped_coder() -> Coder {
    Coder::Kv(
        Box::new(Coder::Bytes),
        Box::new(Coder::Iterable(Box::new(Coder::Varint))),
    )
}

/// The nested `KV<bytes, varint>` encoding of an input's value.
pub fn kv_value(input: &Input) -> Vec<u8> {
    let mut v = vec![1, input.key];
    encode_varint_i64(input.id, &mut v);
    v
}

/// Appends `input` as a windowed value in `windows` (not yet grouped).
pub fn encode_input(input: &Input, windows: Vec<Window>, window_coder: &Coder, out: &mut Vec<u8>) {
    let header = WindowedValueHeader {
        timestamp: input.ts,
        windows: windows.into(),
        pane: PaneInfo::NO_FIRING,
    };
    encode_windowed_value(&header, window_coder, &kv_value(input), out)
        .expect("test inputs are encodable");
}

/// `input` in `windows` as the engine holds it after reading it off the wire.
pub fn decoded_input(input: &Input, windows: Vec<Window>, window_coder: &Coder) -> DecodedElement {
    let mut bytes = Vec::new();
    encode_input(input, windows, window_coder, &mut bytes);
    let mut elements =
        decode_windowed_values(&Bytes::from(bytes), &kv_coder(), window_coder).expect("decodable");
    assert_eq!(elements.len(), 1);
    elements.remove(0)
}

/// Reads an input element back: its key, id and timestamp.
pub fn read_input(element: &DecodedElement) -> Input {
    let value = element.value();
    assert_eq!(value[0], 1, "keys are one byte long");
    let (id, _) = decode_varint_i64(&value[2..]).expect("varint value");
    Input {
        key: value[1],
        id,
        ts: element.header.timestamp,
    }
}

fn timing(t: PaneTiming) -> Timing {
    match t {
        PaneTiming::Early => Timing::Early,
        PaneTiming::OnTime => Timing::OnTime,
        PaneTiming::Late => Timing::Late,
        PaneTiming::Unknown => Timing::Unknown,
    }
}

/// Decodes concatenated grouped outputs into panes, in emission order.
/// Panics on anything that is not a well-formed single-window group.
pub fn decode_panes(bytes: &[u8], window_coder: &Coder) -> Vec<Pane> {
    let coder = grouped_coder();
    decode_windowed_values(&Bytes::copy_from_slice(bytes), &coder, window_coder)
        .expect("grouped output decodes")
        .into_iter()
        .map(|e| {
            let [window] = &e.header.windows[..] else {
                panic!("a group is in exactly one window: {:?}", e.header);
            };
            let key_len = coder.kv_key_len(e.value()).expect("kv");
            assert_eq!(key_len, 2, "keys are one byte long");
            let key: Key = e.value()[1];
            let rest = &e.value()[key_len..];
            let count = i32::from_be_bytes(rest[..4].try_into().expect("iterable length"));
            let mut pos = 4;
            let mut values = Vec::new();
            for _ in 0..count {
                let (v, n) = decode_varint_i64(&rest[pos..]).expect("varint value");
                values.push(v);
                pos += n;
            }
            assert_eq!(pos, rest.len(), "the iterable is the whole value");
            values.sort_unstable();
            let pane = e.header.pane;
            Pane {
                key,
                window: window.clone(),
                index: pane.index,
                timing: timing(pane.timing),
                nonspeculative_index: pane.nonspeculative_index,
                is_first: pane.is_first,
                is_last: pane.is_last,
                timestamp: e.header.timestamp,
                values,
            }
        })
        .collect()
}

/// The window coder for a set of windows' kind.
pub fn window_coder_for(global: bool) -> Coder {
    if global {
        Coder::GlobalWindow
    } else {
        Coder::IntervalWindow
    }
}
