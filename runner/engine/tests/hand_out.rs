//! A key too large for memory reaches its consumer behind a token, which
//! the consumer pages through over its bundle's state; once the consumer
//! has committed it, checkpoints (off while the token could still be read)
//! are taken again.
//!
//! Plan: impulse → source (bundles of 10 KiB values: most under one hot
//! key, a few under small keys) → GroupByKey (spilling past 1 MiB, handing
//! out keys past 16 MiB) → sink. The sink reads every group — inline, or
//! page by page through `StateKey::RunnerIterable` — and notes how many
//! checkpoints had been sent when it read the hot key; no checkpoint may
//! hold the token (a restore could not read it).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

mod common;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use refract_engine::coder::{
    decode_varint_u64, decode_windowed_values, encode_varint_u64, encode_windowed_value, Coder,
    PaneInfo, WindowedValueHeader,
};
use refract_engine::executor::{BundleInput, BundleOutput, ExecError, StageExecutor};
use refract_engine::manager::{Engine, EngineConfig};
use refract_engine::plan::PCollectionIdx;
use refract_engine::spill::MemorySpillSpace;
use refract_engine::state::StateKey;
use refract_engine::window::Window;
use tokio::sync::{mpsc, watch};

const BUNDLES: u32 = 6;
/// Values under the hot key per source bundle (10 KiB each): 24 MiB in all.
const HOT_PER_BUNDLE: u32 = 400;
/// Small keys, one value each per bundle.
const SMALL_KEYS: u32 = 10;
const VALUE_BYTES: usize = 10 << 10;

/// What the sink saw: key -> values (sorted at the end), and how many
/// checkpoints had been sent when it read the hot key.
#[derive(Default)]
struct Seen {
    groups: BTreeMap<Vec<u8>, Vec<Vec<u8>>>,
    pages: usize,
    checkpoints_at_hot: Option<usize>,
    token: Option<Bytes>,
}

struct Fake {
    seen: Arc<Mutex<Seen>>,
    /// The engine's checkpoint channel, to count what it was sent.
    checkpoints: mpsc::Sender<Vec<(String, Bytes)>>,
}

fn nested(bytes: &[u8], out: &mut Vec<u8>) {
    encode_varint_u64(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// Value `i` of `key`: 10 KiB, numbered.
fn value(key: &[u8], i: u32) -> Vec<u8> {
    let mut v = format!("{}-{i:08}-", String::from_utf8_lossy(key)).into_bytes();
    v.resize(VALUE_BYTES, b'.');
    v
}

fn records(n: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for i in 0..HOT_PER_BUNDLE {
        out.push((b"hot".to_vec(), value(b"hot", n * HOT_PER_BUNDLE + i)));
    }
    for k in 0..SMALL_KEYS {
        let key = format!("small-{k}").into_bytes();
        out.push((key.clone(), value(&key, n)));
    }
    out
}

/// Back-to-back nested `bytes` values.
fn split_values(mut buf: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let (len, n) = decode_varint_u64(buf).expect("a length");
        let end = n + len as usize;
        out.push(buf[n..end].to_vec());
        buf = &buf[end..];
    }
    out
}

impl Fake {
    /// Reads one group: its values inline, or through the bundle's state.
    fn read_group(&self, value: &[u8], input: &BundleInput) {
        let (klen, n) = decode_varint_u64(value).expect("a key length");
        let key = value[n..n + klen as usize].to_vec();
        let rest = &value[n + klen as usize..];
        let count = i32::from_be_bytes(rest[..4].try_into().expect("4 bytes"));
        let values = if count >= 0 {
            split_values(&rest[4..])
        } else {
            // No values inline: varint(-1), then the token.
            let (marker, m) = decode_varint_u64(&rest[4..]).expect("a marker");
            assert_eq!(marker, u64::MAX, "a state-backed continuation");
            let (tlen, t) = decode_varint_u64(&rest[4 + m..]).expect("a token length");
            let token = Bytes::copy_from_slice(&rest[4 + m + t..4 + m + t + tlen as usize]);
            self.seen.lock().token = Some(token.clone());
            let key = StateKey::RunnerIterable { token };
            let mut data = Vec::new();
            let mut next: Option<Bytes> = None;
            loop {
                let page = input.state.get(&key, next.as_deref()).expect("a page");
                data.extend_from_slice(&page.data);
                self.seen.lock().pages += 1;
                match page.continuation {
                    Some(c) => next = Some(c),
                    None => break,
                }
            }
            let sent = self.checkpoints.max_capacity() - self.checkpoints.capacity();
            self.seen.lock().checkpoints_at_hot = Some(sent);
            split_values(&data)
        };
        let mut seen = self.seen.lock();
        assert!(seen.groups.insert(key, values).is_none(), "a key twice");
    }
}

impl StageExecutor for Fake {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let header = WindowedValueHeader {
            timestamp: 0,
            windows: smallvec::smallvec![Window::Global],
            pane: PaneInfo::NO_FIRING,
        };
        let output = match input.stage.index() {
            // The source: one bundle per step, each deferring the next.
            1 => {
                let n = common::source_step(&input);
                let mut out = Vec::new();
                for (k, v) in records(n) {
                    let mut kv = Vec::new();
                    nested(&k, &mut kv);
                    nested(&v, &mut kv);
                    encode_windowed_value(&header, &Coder::GlobalWindow, &kv, &mut out)
                        .expect("encodes");
                }
                let residuals = common::next_source_step(n, BUNDLES);
                BundleOutput {
                    outputs: vec![(PCollectionIdx::new(1), Bytes::from(out))],
                    residuals,
                    ..BundleOutput::default()
                }
            }
            3 => {
                let grouped = Coder::Kv(
                    Box::new(Coder::Bytes),
                    Box::new(Coder::Iterable(Box::new(Coder::Bytes))),
                );
                for chunk in &input.elements {
                    let decoded = decode_windowed_values(chunk, &grouped, &Coder::GlobalWindow)
                        .expect("the sink's input decodes");
                    for e in decoded {
                        self.read_group(e.value(), &input);
                    }
                }
                BundleOutput::default()
            }
            _ => BundleOutput::default(),
        };
        async move { Ok(output) }.boxed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_larger_than_memory_is_paged_by_its_consumer_and_checkpoints_resume_after_it() {
    let store = MemorySpillSpace::shared();
    let (tx, mut rx) = mpsc::channel(10_000);
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let executor = Arc::new(Fake {
        seen: seen.clone(),
        checkpoints: tx.clone(),
    });
    let config = EngineConfig {
        max_bundle_elements: 50,
        ..EngineConfig::default()
    };
    let (_cancel, cancelled) = watch::channel(false);
    let engine = Engine::builder(common::group_plan(), executor, config, "h", Arc::new(|| 0))
        .state_backed_outputs(&[PCollectionIdx::new(2)])
        .checkpoints(Duration::ZERO, tx, None)
        .spill(store.clone(), b"job", 1 << 20)
        .build()
        .expect("a valid plan");
    let summary = engine.run(cancelled).await.expect("the run succeeds");
    assert_eq!(summary.handed_out_keys, 1);
    let mut parts = Vec::new();
    while let Ok(checkpoint) = rx.try_recv() {
        parts.push(checkpoint);
    }
    let checkpoints = parts.len();

    let seen = seen.lock();
    let mut want: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    for n in 0..BUNDLES {
        for (k, v) in records(n) {
            want.entry(k).or_default().push(v);
        }
    }
    let mut got = seen.groups.clone();
    for values in got.values_mut().chain(want.values_mut()) {
        values.sort();
    }
    assert!(got == want, "every value once, under its key");
    assert!(seen.pages > 3, "the hot key came a page at a time");
    let at_hot = seen.checkpoints_at_hot.expect("the hot key was handed out");
    assert!(
        checkpoints > at_hot,
        "a checkpoint once the consumer was done ({checkpoints} in all, {at_hot} before)"
    );
    assert!(store.is_empty(), "nothing left in the spill space");
    // No checkpoint holds an element that names the key by its token (a
    // restore could not read it): none was taken while one waited or ran.
    let token = seen.token.clone().expect("a token");
    for (name, bytes) in parts.iter().flatten() {
        assert!(
            !bytes.windows(token.len()).any(|w| w == &token[..]),
            "checkpoint part {name} holds the token"
        );
    }
}
