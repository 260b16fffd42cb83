//! A key too large for memory: written out of line, and either read back
//! whole or handed out behind a token that pages through every value.

use bytes::Bytes;

use super::super::{Fired, GroupingBuffer};
use super::read_iterable_page;
use crate::coder::{
    decode_varint_u64, decode_windowed_values, encode_varint_u64, Coder, DecodedElement,
};
use crate::coder::{PaneInfo, WindowedValueHeader};
use crate::plan::WindowingStrategy;
use crate::spill::{job_space, MemorySpillSpace};
use crate::time::MAX_TIMESTAMP;
use crate::window::Window;

/// Values under the hot key (17 MiB).
const HOT: u32 = 1700;
/// Values under a key written out of line but small enough to come back
/// whole (3 MiB).
const WARM: u32 = 300;

/// `KV<bytes, bytes>`: values of any size.
fn coder() -> Coder {
    Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Bytes))
}

/// A value's nested encoding: a varint length, then `len` bytes, all
/// `fill` but the first, which numbers it.
fn value(n: u32, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 5);
    encode_varint_u64(len as u64, &mut v);
    let mut body = vec![(n % 251) as u8; len];
    body[..4].copy_from_slice(&n.to_be_bytes());
    v.extend_from_slice(&body);
    v
}

fn element(key: &[u8], value: &[u8]) -> DecodedElement {
    let mut v = Vec::new();
    encode_varint_u64(key.len() as u64, &mut v);
    v.extend_from_slice(key);
    v.extend_from_slice(value);
    let header = WindowedValueHeader {
        timestamp: 0,
        windows: smallvec::smallvec![Window::Global],
        pane: PaneInfo::NO_FIRING,
    };
    DecodedElement::new(header, Bytes::from(v), 0)
}

/// Splits back-to-back nested `bytes` values.
fn split_values(mut buf: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let (len, n) = decode_varint_u64(buf).unwrap();
        let end = n + len as usize;
        out.push(buf[..end].to_vec());
        buf = &buf[end..];
    }
    out
}

/// What an emitted `KV<bytes, Iterable<bytes>>` holds: its key, its
/// values inline, and the token of the rest if it is state-backed.
fn parse(e: &DecodedElement) -> (Vec<u8>, Vec<Vec<u8>>, Option<Vec<u8>>) {
    let v = e.value();
    let (klen, n) = decode_varint_u64(v).unwrap();
    let key = v[n..n + klen as usize].to_vec();
    let rest = &v[n + klen as usize..];
    let count = i32::from_be_bytes(rest[..4].try_into().unwrap());
    if count >= 0 {
        return (key, split_values(&rest[4..]), None);
    }
    // No block inline: varint(-1) (ten bytes), then the token.
    let (marker, m) = decode_varint_u64(&rest[4..]).unwrap();
    assert_eq!(marker, u64::MAX);
    let (tlen, t) = decode_varint_u64(&rest[4 + m..]).unwrap();
    let token = rest[4 + m + t..4 + m + t + tlen as usize].to_vec();
    assert_eq!(4 + m + t + tlen as usize, rest.len());
    (key, Vec::new(), Some(token))
}

/// Every value behind `token`, a page at a time.
fn read_token(store: &MemorySpillSpace, job: &[u8], token: &[u8]) -> Vec<Vec<u8>> {
    let mut data = Vec::new();
    let mut next: Option<Bytes> = None;
    let mut pages = 0;
    loop {
        let page = read_iterable_page(store, job, token, next.as_deref()).unwrap();
        data.extend_from_slice(&page.data);
        pages += 1;
        match page.continuation {
            Some(c) => next = Some(c),
            None => break,
        }
    }
    assert!(pages > 2, "paged, not read at once");
    split_values(&data)
}

/// A buffer of 2 MiB fed a hot key of 17 MiB (10 KiB values, so every
/// spill writes its part out of line; past the 16 MiB a buffer reads back
/// at most), a warm one of 3 MiB, and ten small keys.
fn fed(store: &std::sync::Arc<MemorySpillSpace>, job: &[u8], hand_out: bool) -> GroupingBuffer {
    let mut g = GroupingBuffer::new(
        WindowingStrategy::global_default(),
        coder(),
        Coder::GlobalWindow,
    );
    let mut prefix = job.to_vec();
    prefix.extend_from_slice(&7u32.to_be_bytes());
    assert!(g.enable_spill(store.clone(), prefix, 2 << 20));
    if hand_out {
        assert!(g.hand_out_large_keys());
    }
    for n in 0..HOT {
        g.add(&element(b"hot", &value(n, 10 << 10)), 0, 0).unwrap();
        if n < WARM {
            g.add(&element(b"warm", &value(n, 10 << 10)), 0, 0).unwrap();
        }
        if n % 10 == 0 && n < 600 {
            g.add(&element(&[b'k', (n % 100) as u8], &value(n, 8)), 0, 0)
                .unwrap();
        }
    }
    assert!(g.has_spilled());
    g
}

fn drain(g: &mut GroupingBuffer) -> Vec<DecodedElement> {
    let mut out = Fired::default();
    g.evaluate(MAX_TIMESTAMP, 0, &mut out, usize::MAX).unwrap();
    while g.is_draining() {
        let step = out.bytes.len() + (1 << 20);
        g.drain_spilled(MAX_TIMESTAMP, 0, &mut out, step).unwrap();
    }
    let bytes = bytes::Bytes::from(out.bytes.clone());
    let got = out.into_elements();
    // What the firing recorded is what its bytes hold, state-backed form
    // included.
    let out_coder = Coder::Kv(
        Box::new(Coder::Bytes),
        Box::new(Coder::Iterable(Box::new(Coder::Bytes))),
    );
    let want = decode_windowed_values(&bytes, &out_coder, &Coder::GlobalWindow).unwrap();
    assert_eq!(got, want);
    got
}

/// The first `n` 10 KiB values, sorted.
fn values_of(n: u32) -> Vec<Vec<u8>> {
    let mut want: Vec<Vec<u8>> = (0..n).map(|n| value(n, 10 << 10)).collect();
    want.sort();
    want
}

#[test]
fn a_key_too_large_for_memory_is_handed_out_behind_a_token_that_reads_every_value() {
    let store = MemorySpillSpace::shared();
    let job = job_space(b"job");
    let mut g = fed(&store, &job, true);
    let got = drain(&mut g);
    assert_eq!(got.len(), 12);
    let mut handed = 0;
    for e in &got {
        assert!(e.header.pane.is_first && e.header.pane.is_last);
        let (key, inline, token) = parse(e);
        match token {
            Some(token) => {
                assert_eq!(key, b"hot");
                assert!(inline.is_empty());
                let mut values = read_token(&store, &job, &token);
                values.sort();
                assert_eq!(values, values_of(HOT));
                // Another job's space does not read it.
                assert!(
                    read_iterable_page(store.as_ref(), &job_space(b"jab"), &token, None).is_err()
                );
                handed += 1;
            }
            None if key == b"warm" => assert_eq!(inline, values_of(WARM), "comes whole"),
            None => assert_eq!(inline.len(), 6, "a small key comes whole"),
        }
    }
    assert_eq!((handed, g.handed_out()), (1, 1));
    // Its values are in the store only: no checkpoint may pretend to hold them.
    let refused = g.snapshot().unwrap_err().to_string();
    assert!(refused.contains("state-backed"), "{refused}");
    assert!(
        !store.is_empty(),
        "the handed-out key's values stay for its consumers"
    );
    // Once its consumers are done with it, they go, and checkpoints may
    // be taken again.
    g.release_hand_outs().unwrap();
    assert!(store.is_empty());
    assert!(g.snapshot().is_ok() && !g.has_live_hand_outs());
    assert_eq!(g.handed_out(), 1, "still counted");
}

#[test]
fn without_hand_outs_a_large_key_written_out_of_line_comes_back_whole() {
    let store = MemorySpillSpace::shared();
    let job = job_space(b"job");
    let mut g = fed(&store, &job, false);
    // A checkpoint before the drain reads the out-of-line parts back too.
    let snapshot = g.snapshot().unwrap();
    let hot = snapshot
        .panes
        .iter()
        .find(|(key, _)| &key[..] == b"\x03hot")
        .map(|(_, windows)| windows[0].1.count());
    assert_eq!(hot, Some(HOT));
    let got = drain(&mut g);
    let hot: Vec<_> = got
        .iter()
        .map(parse)
        .filter(|(k, _, _)| k == b"hot")
        .collect();
    assert_eq!(hot.len(), 1);
    let (_, mut values, token) = hot.into_iter().next().unwrap();
    assert!(token.is_none());
    values.sort();
    assert_eq!(values, values_of(HOT));
    assert_eq!(g.handed_out(), 0);
    assert!(
        store.is_empty(),
        "the drained window's out-of-line parts are deleted"
    );
}
