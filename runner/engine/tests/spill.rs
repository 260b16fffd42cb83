//! A GroupByKey's output is paced by its consumer's queue bound, whether it
//! fits in memory or not: one far larger than its memory share spills and
//! still emits every key's values exactly once, and one held in memory
//! emits its big firing a step at a time.
//!
//! Plan: impulse → source (several bundles of KV<bytes, bytes>) →
//! GroupByKey (spilling: allowed to hold 256 KiB) → sink (queue bound
//! 128 KiB). The sink parses every group; the tests compare with what the
//! source made, check the spill space is empty afterwards, and that the
//! sink's queue never held much more than its bound although the group
//! output is ~30 times larger. And with the source's output handed over
//! through the spill space, in parts cut inside elements.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

use std::collections::BTreeMap;
use std::sync::Arc;

mod common;

use bytes::Bytes;
use common::{global_pcollection, stage};
use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use refract_engine::coder::{encode_windowed_value, Coder, PaneInfo, WindowedValueHeader};
use refract_engine::executor::{BundleInput, BundleOutput, ExecError, StageExecutor};
use refract_engine::manager::{Engine, EngineConfig};
use refract_engine::plan::{PCollectionIdx, Plan, StageIdx, StageKind};
use refract_engine::spill::{MemorySpillSpace, SpillSpace};
use refract_engine::spilled_output::SpilledOutput;
use refract_engine::window::Window;
use tokio::sync::watch;

const KEYS: u32 = 500;
const PER_BUNDLE: u32 = 20_000;
const BUNDLES: u32 = 10;

/// Groups the sink saw: key -> values, in arrival order.
type Seen = Arc<Mutex<BTreeMap<Vec<u8>, Vec<Vec<u8>>>>>;

struct Fake {
    seen: Seen,
    groups: Arc<Mutex<u64>>,
    /// Where the source puts most of each bundle's output (as an executor
    /// does with output past a bundle's share), if anywhere.
    output_spill: Option<Arc<MemorySpillSpace>>,
    /// The source's output in memory comes in chunks cut anywhere (as an
    /// SDK's data messages may be), not in one.
    chunked: bool,
}

/// Bytes of one part of a spilled output: not a multiple of an element's
/// length, so parts end inside elements.
const PART_BYTES: usize = 1000;

/// Chunk lengths, repeated: the 1- and 3-byte ones end inside an element's
/// header or value, as do most of the others (an element is 30 bytes).
const CHUNK_BYTES: [usize; 5] = [1, 3, 17, 1000, 45];

/// `bytes` as PCollection 1's output: one chunk, or several cut anywhere.
fn in_memory(bytes: &[u8], chunked: bool) -> Vec<(PCollectionIdx, Bytes)> {
    if !chunked {
        return vec![(PCollectionIdx::new(1), Bytes::copy_from_slice(bytes))];
    }
    let mut out = Vec::new();
    let mut at = 0;
    for len in CHUNK_BYTES.iter().cycle() {
        if at == bytes.len() {
            break;
        }
        let end = (at + len).min(bytes.len());
        out.push((
            PCollectionIdx::new(1),
            Bytes::copy_from_slice(&bytes[at..end]),
        ));
        at = end;
    }
    out
}

/// `out` as the source's output: all in memory, or (with a store) all but
/// its last bytes written in parts under a prefix of the bundle's own.
fn source_output(
    out: Vec<u8>,
    bundle: u32,
    store: Option<&Arc<MemorySpillSpace>>,
    chunked: bool,
) -> BundleOutput {
    let Some(store) = store else {
        return BundleOutput {
            outputs: in_memory(&out, chunked),
            ..Default::default()
        };
    };
    let cut = out.len() - 7;
    let prefix = format!("out-{bundle:04}-").into_bytes();
    let parts = out[..cut]
        .chunks(PART_BYTES)
        .enumerate()
        .map(|(i, part)| {
            let mut key = prefix.clone();
            key.extend_from_slice(&(i as u32).to_be_bytes());
            (key, part.to_vec())
        })
        .collect();
    store.put(parts).expect("puts");
    let spilled = SpilledOutput::new(store.clone(), prefix, cut as u64).expect("a prefix");
    BundleOutput {
        outputs: in_memory(&out[cut..], chunked),
        spilled: vec![(PCollectionIdx::new(1), spilled)],
        ..Default::default()
    }
}

fn kv(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut v = vec![key.len() as u8];
    v.extend_from_slice(key);
    v.push(value.len() as u8);
    v.extend_from_slice(value);
    v
}

fn record(i: u32) -> (Vec<u8>, Vec<u8>) {
    let key = format!("key-{:04}", i % KEYS).into_bytes();
    let value = format!("value-{i:012}").into_bytes();
    (key, value)
}

impl StageExecutor for Fake {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let seen = self.seen.clone();
        let groups = self.groups.clone();
        let output_spill = self.output_spill.clone();
        let chunked = self.chunked;
        async move {
            let header = WindowedValueHeader {
                timestamp: 0,
                windows: smallvec::smallvec![Window::Global],
                pane: PaneInfo::NO_FIRING,
            };
            match input.stage.index() {
                // The source: one bundle per restriction, each deferring
                // the next one (a self-checkpointing read).
                1 => {
                    let n = common::source_step(&input);
                    let mut out = Vec::new();
                    for i in n * PER_BUNDLE..(n + 1) * PER_BUNDLE {
                        let (k, v) = record(i);
                        encode_windowed_value(&header, &Coder::GlobalWindow, &kv(&k, &v), &mut out)
                            .expect("encodes");
                    }
                    let residuals = common::next_source_step(n, BUNDLES);
                    Ok(BundleOutput {
                        residuals,
                        ..source_output(out, n, output_spill.as_ref(), chunked)
                    })
                }
                3 => {
                    for chunk in &input.elements {
                        parse_groups(chunk, &seen, &groups);
                    }
                    Ok(BundleOutput::default())
                }
                _ => Ok(BundleOutput::default()),
            }
        }
        .boxed()
    }
}

/// Reads windowed `KV<bytes, iterable<bytes>>` values (global window,
/// short keys and values) into `seen`.
fn parse_groups(chunk: &[u8], seen: &Seen, groups: &Mutex<u64>) {
    let decoded = refract_engine::coder::decode_windowed_values(
        &Bytes::copy_from_slice(chunk),
        &Coder::Kv(
            Box::new(Coder::Bytes),
            Box::new(Coder::Iterable(Box::new(Coder::Bytes))),
        ),
        &Coder::GlobalWindow,
    )
    .expect("the sink's input decodes");
    for e in decoded {
        let v = e.value();
        let klen = v[0] as usize;
        let key = v[1..1 + klen].to_vec();
        let mut at = 1 + klen;
        let count = u32::from_be_bytes(v[at..at + 4].try_into().expect("4 bytes"));
        at += 4;
        let mut values = Vec::new();
        for _ in 0..count {
            let len = v[at] as usize;
            values.push(v[at + 1..at + 1 + len].to_vec());
            at += 1 + len;
        }
        assert_eq!(at, v.len(), "one group is exactly its values");
        let mut seen = seen.lock();
        assert!(seen.insert(key, values).is_none(), "a key emitted twice");
        *groups.lock() += 1;
    }
}

/// The grouped output of [`record`]s, values sorted per key.
fn expected_groups() -> BTreeMap<Vec<u8>, Vec<Vec<u8>>> {
    let mut want: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    for i in 0..PER_BUNDLE * BUNDLES {
        let (k, v) = record(i);
        want.entry(k).or_default().push(v);
    }
    for values in want.values_mut() {
        values.sort();
    }
    want
}

/// Runs [`plan`] with a sink queue bound of 128 KiB (and the spill space,
/// if given, at a 256 KiB share): what the run reported, and the groups
/// the sink saw (values sorted per key).
async fn run(
    spill: Option<Arc<dyn SpillSpace>>,
    output_spill: Option<Arc<MemorySpillSpace>>,
    chunked: bool,
) -> (
    refract_engine::manager::RunSummary,
    BTreeMap<Vec<u8>, Vec<Vec<u8>>>,
) {
    let seen: Seen = Arc::default();
    let executor = Arc::new(Fake {
        seen: seen.clone(),
        groups: Arc::new(Mutex::new(0)),
        output_spill,
        chunked,
    });
    let config = EngineConfig {
        max_pending_bytes: 128 << 10,
        max_bundle_elements: 50,
        ..EngineConfig::default()
    };
    let (_cancel, cancelled) = watch::channel(false);
    let mut engine = Engine::builder(common::group_plan(), executor, config, "s", Arc::new(|| 0));
    if let Some(store) = spill {
        engine = engine.spill(store, b"job", 256 << 10);
    }
    let engine = engine.build().expect("a valid plan");
    let summary = engine.run(cancelled).await.expect("the run succeeds");
    let mut got = seen.lock().clone();
    for values in got.values_mut() {
        values.sort();
    }
    (summary, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groupbykey_larger_than_its_share_spills_and_emits_every_key_once() {
    let store = MemorySpillSpace::shared();
    let (summary, got) = run(Some(store.clone()), None, false).await;
    assert_eq!(got.len(), KEYS as usize);
    assert!(
        got == expected_groups(),
        "every key's values, each exactly once"
    );
    let input_bytes: u64 = (PER_BUNDLE * BUNDLES) as u64 * 28;
    assert!(
        summary.spilled_bytes > input_bytes / 2,
        "most of the input was spilled: {} of ~{input_bytes} bytes",
        summary.spilled_bytes
    );
    assert!(store.is_empty(), "spilled bytes are deleted once emitted");
    // The sink's queue: its bound, plus at most one drain step and one
    // group past it (the grouped output is ~6 MB).
    assert!(
        summary.peak_pending_bytes < (128 << 10) * 3,
        "the sink's queue grew to {} bytes",
        summary.peak_pending_bytes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_held_in_memory_is_emitted_a_step_at_a_time() {
    let (summary, got) = run(None, None, false).await;
    assert_eq!(summary.spilled_bytes, 0);
    assert!(
        got == expected_groups(),
        "every key's values, each exactly once"
    );
    // All 500 keys fire at once (~6 MB), but the sink's queue holds its
    // bound plus at most one step (a step is at most the bound).
    assert!(
        summary.peak_pending_bytes < (128 << 10) * 3,
        "the sink's queue grew to {} bytes",
        summary.peak_pending_bytes
    );
}

/// A bundle's output that waited in the spill space (cut into parts
/// anywhere, the end of it still in memory) is read back whole when the
/// bundle commits, and its parts are deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundles_spilled_output_comes_back_whole_and_is_deleted() {
    let outputs = MemorySpillSpace::shared();
    let (summary, got) = run(None, Some(outputs.clone()), false).await;
    assert!(
        got == expected_groups(),
        "every key's values, each exactly once"
    );
    let input_bytes: u64 = (PER_BUNDLE * BUNDLES) as u64 * 28;
    assert!(
        summary.output_spilled_bytes > input_bytes * 9 / 10,
        "{} of ~{input_bytes} bytes went through the store",
        summary.output_spilled_bytes
    );
    assert!(outputs.is_empty(), "spilled output is deleted once read");
}

/// A bundle's output in chunks cut anywhere — inside elements' headers
/// and values, one byte at a time in places — is routed as the elements it
/// holds, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_in_chunks_cut_inside_elements_arrives_whole() {
    let (_, got) = run(None, None, true).await;
    assert!(
        got == expected_groups(),
        "every key's values, each exactly once"
    );
}

/// The same after a spilled part that ends inside an element: its start
/// joins the first chunk in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_after_a_spilled_part_continue_its_last_element() {
    let outputs = MemorySpillSpace::shared();
    let (summary, got) = run(None, Some(outputs.clone()), true).await;
    assert!(
        got == expected_groups(),
        "every key's values, each exactly once"
    );
    assert!(summary.output_spilled_bytes > 0);
    assert!(outputs.is_empty(), "spilled output is deleted once read");
}

/// The sink of [`reshuffle_plan`]: records the values it is given.
struct Recorder {
    source: Fake,
    received: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl StageExecutor for Recorder {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        if input.stage != StageIdx::new(3) {
            return self.source.execute(input);
        }
        let received = self.received.clone();
        async move {
            let kv = Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Bytes));
            for chunk in &input.elements {
                let decoded =
                    refract_engine::coder::decode_windowed_values(chunk, &kv, &Coder::GlobalWindow)
                        .expect("the sink's input decodes");
                received
                    .lock()
                    .extend(decoded.iter().map(|e| e.value().to_vec()));
            }
            Ok(BundleOutput::default())
        }
        .boxed()
    }
}

/// [`common::group_plan`] with a Flatten (a `Reshuffle`) in place of its
/// GroupByKey: impulse → source → Flatten → sink.
fn reshuffle_plan() -> Plan {
    let mut plan = common::group_plan();
    let (read, grouped) = (PCollectionIdx::new(1), PCollectionIdx::new(2));
    plan.pcollections[grouped] =
        global_pcollection("reshuffled", plan.pcollections[read].value_coder.clone());
    plan.stages[StageIdx::new(2)] = stage("reshuffle", StageKind::Flatten, vec![1], vec![2]);
    plan
}

/// A queue far past its bound — every source bundle's output is ~5 times
/// the sink's bound, and it arrives through a Flatten in one commit —
/// keeps its back in the spill space, and the sink still gets every
/// element once; nothing is left in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_far_past_its_bound_waits_on_disk_and_every_element_arrives() {
    let store = MemorySpillSpace::shared();
    let received = Arc::new(Mutex::new(Vec::new()));
    let executor = Arc::new(Recorder {
        source: Fake {
            seen: Arc::default(),
            groups: Arc::default(),
            output_spill: Some(store.clone()),
            chunked: false,
        },
        received: received.clone(),
    });
    let config = EngineConfig {
        max_pending_bytes: 128 << 10,
        max_bundle_elements: 50,
        ..EngineConfig::default()
    };
    let (_cancel, cancelled) = watch::channel(false);
    let summary = Engine::builder(reshuffle_plan(), executor, config, "s", Arc::new(|| 0))
        .spill(store.clone(), b"job", 128 << 10)
        .build()
        .expect("a valid plan")
        .run(cancelled)
        .await
        .expect("the run succeeds");
    let mut want: Vec<Vec<u8>> = (0..PER_BUNDLE * BUNDLES)
        .map(|i| {
            let (k, v) = record(i);
            kv(&k, &v)
        })
        .collect();
    // Bundles of the sink run side by side: compare in one order.
    let mut got = received.lock().clone();
    assert_eq!(got.len(), want.len());
    got.sort();
    want.sort();
    assert!(got == want, "every element once");
    let input_bytes: u64 = (PER_BUNDLE * BUNDLES) as u64 * 28;
    assert!(
        summary.queue_spilled_bytes > input_bytes / 2,
        "{} of ~{input_bytes} bytes waited in the store",
        summary.queue_spilled_bytes
    );
    assert!(store.is_empty(), "read-back segments are deleted");
}
