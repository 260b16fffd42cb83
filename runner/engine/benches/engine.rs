//! Runner overhead without Python in the way: the engine runs a plan whose
//! SDK stages are played by an in-process fake executor that does (almost)
//! nothing, so what is measured is the engine's own cost of moving elements
//! between stages — decoding windowed values, queueing, bundling, grouping
//! and re-encoding.
//!
//! Each benchmark reports throughput in elements; ns per element is
//! 1e9 / (elements per second). Per-shuffle / per-hop figures: the GBK
//! pipelines have one shuffle, the flatten and SDK-chain pipelines have the
//! number of hops in their name. `gbk_streaming` is a streaming job's
//! GroupByKey whose trigger fires after every element (Reshuffle's), so it
//! measures a firing per element rather than one at the end.
//! `stateful_timers` is a streaming stateful DoFn that sets one event-time
//! timer per key in bundles of 1 000 elements, all of which fire at the end:
//! what keeping, holding and firing many pending timers costs per element.
//!
//!   cargo bench -p refract-engine --bench engine
//!   REFRACT_BENCH_ELEMENTS=1000000 cargo bench -p refract-engine --bench engine
//!
//! See docs/benchmarks.md.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns
#![allow(missing_docs)] // criterion_group! makes an undocumented pub fn

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::future::BoxFuture;
use futures::FutureExt;
use refract_engine::coder::{
    decode_timers, decode_windowed_values, encode_windowed_value, Coder, PaneInfo, TimerValue,
    WindowedValueHeader,
};
use refract_engine::executor::{BundleInput, BundleOutput, ExecError, StageExecutor};
use refract_engine::manager::{Engine, EngineConfig};
use refract_engine::plan::{
    PCollection, PCollectionIdx, PCollectionVec, Plan, SdkStage, Stage, StageIdx, StageKind,
    StageVec, TimeDomain, TimerFamily, Trigger, WindowingStrategy,
};
use refract_engine::window::Window;
use tokio::sync::watch;

/// What a fake SDK stage does with one bundle.
type StageFn = Arc<dyn Fn(&BundleInput) -> BundleOutput + Send + Sync>;

/// Plays the SDK: each stage is a closure run inline (no harness, no gRPC).
struct FakeExecutor {
    stages: BTreeMap<StageIdx, StageFn>,
    /// What the last stage counted (bytes the sink saw, or timers fired),
    /// so the work is not elided.
    sink_bytes: Arc<AtomicUsize>,
}

impl StageExecutor for FakeExecutor {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let out = match self.stages.get(&input.stage) {
            Some(f) => Ok(f(&input)),
            None => Err(ExecError::Runner(format!("no stage {}", input.stage))),
        };
        async move { out }.boxed()
    }
}

fn pc(id: &str, value: Coder) -> PCollection {
    PCollection {
        id: id.into(),
        value_coder: value,
        window_coder: Coder::GlobalWindow,
        bounded: true,
    }
}

/// A stage reading and writing the PCollections numbered `inputs` and
/// `outputs`.
fn stage(name: &str, kind: StageKind, inputs: Vec<usize>, outputs: Vec<usize>) -> Stage {
    Stage {
        name: name.into(),
        kind,
        inputs: inputs.into_iter().map(PCollectionIdx::new).collect(),
        side_inputs: vec![],
        outputs: outputs.into_iter().map(PCollectionIdx::new).collect(),
    }
}

fn sdk() -> StageKind {
    StageKind::Sdk(SdkStage::default())
}

fn kv_coder() -> Coder {
    Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Bytes))
}

/// `n` KV<bytes, bytes> elements in the global window, as one encoded block:
/// keys `k00000`.. cycling over `keys` distinct keys, 10-byte values (the
/// issue's "10-byte records").
fn source_block(n: usize, keys: usize) -> Bytes {
    let header = WindowedValueHeader {
        timestamp: 0,
        windows: smallvec::smallvec![Window::Global],
        pane: PaneInfo::NO_FIRING,
    };
    let mut out = Vec::with_capacity(n * 32);
    let mut v = Vec::with_capacity(24);
    for i in 0..n {
        v.clear();
        let key = format!("k{:05}", i % keys.max(1));
        v.push(key.len() as u8);
        v.extend_from_slice(key.as_bytes());
        v.push(10);
        v.extend_from_slice(format!("{:010}", i % 10_000_000_000).as_bytes());
        encode_windowed_value(&header, &Coder::GlobalWindow, &v, &mut out).unwrap();
    }
    Bytes::from(out)
}

/// The source stage: emits the pre-encoded block on `pcoll` (a refcount
/// bump; no per-element work on the fake SDK's side).
fn emit(pcoll: PCollectionIdx, block: Bytes) -> StageFn {
    Arc::new(move |_| BundleOutput {
        outputs: vec![(pcoll, block.clone())],
        ..Default::default()
    })
}

/// A fake DoFn that forwards its input unchanged (identity ParDo).
fn identity(pcoll: PCollectionIdx) -> StageFn {
    Arc::new(move |input| BundleOutput {
        outputs: input.elements.iter().map(|c| (pcoll, c.clone())).collect(),
        ..Default::default()
    })
}

/// The sink: touches nothing but the chunk lengths.
fn sink(seen: Arc<AtomicUsize>) -> StageFn {
    Arc::new(move |input| {
        let n: usize = input.elements.iter().map(|c| c.len()).sum();
        seen.fetch_add(n, Ordering::Relaxed);
        BundleOutput::default()
    })
}

/// Impulse -> source (N KVs) -> GroupByKey (`strategy`) -> sink.
fn gbk_plan(block: Bytes, strategy: WindowingStrategy) -> (Plan, FakeExecutor) {
    let grouped = Coder::Kv(
        Box::new(Coder::Bytes),
        Box::new(Coder::Iterable(Box::new(Coder::Bytes))),
    );
    let plan = Plan {
        pcollections: vec![
            pc("impulse", Coder::Bytes),
            pc("kvs", kv_coder()),
            pc("grouped", grouped),
        ]
        .into(),
        stages: vec![
            stage("impulse", StageKind::Impulse, vec![], vec![0]),
            stage("source", sdk(), vec![0], vec![1]),
            stage("gbk", StageKind::GroupByKey(strategy), vec![1], vec![2]),
            stage("sink", sdk(), vec![2], vec![]),
        ]
        .into(),
        names: Default::default(),
    };
    let seen = Arc::new(AtomicUsize::new(0));
    let exec = FakeExecutor {
        stages: BTreeMap::from([
            (StageIdx::new(1), emit(PCollectionIdx::new(1), block)),
            (StageIdx::new(3), sink(seen.clone())),
        ]),
        sink_bytes: seen,
    };
    (plan, exec)
}

/// Impulse -> source -> `hops` stages in a row -> sink, where each hop is a
/// runner-executed Flatten (`sdk_hops == false`) or a fake identity SDK
/// stage (`sdk_hops == true`; a ParDo chain that the SDK did not fuse).
fn chain_plan(block: Bytes, hops: usize, sdk_hops: bool) -> (Plan, FakeExecutor) {
    let mut pcollections =
        PCollectionVec::from(vec![pc("impulse", Coder::Bytes), pc("p0", kv_coder())]);
    let mut stages = StageVec::from(vec![stage("impulse", StageKind::Impulse, vec![], vec![0])]);
    let source = stages.push(stage("source", sdk(), vec![0], vec![1]));
    let mut fns: Vec<(StageIdx, StageFn)> = vec![(source, emit(PCollectionIdx::new(1), block))];
    for h in 0..hops {
        let input = pcollections.len() - 1;
        let output = pcollections.push(pc(&format!("p{}", h + 1), kv_coder()));
        let kind = if sdk_hops { sdk() } else { StageKind::Flatten };
        let hop = stages.push(stage(
            &format!("hop{h}"),
            kind,
            vec![input],
            vec![output.index()],
        ));
        if sdk_hops {
            fns.push((hop, identity(output)));
        }
    }
    let seen = Arc::new(AtomicUsize::new(0));
    let last = stages.push(stage("sink", sdk(), vec![pcollections.len() - 1], vec![]));
    fns.push((last, sink(seen.clone())));
    let exec = FakeExecutor {
        stages: fns.into_iter().collect(),
        sink_bytes: seen,
    };
    (
        Plan {
            pcollections,
            stages,
            names: Default::default(),
        },
        exec,
    )
}

/// Impulse -> source (N KVs) -> a stateful stage that sets an event-time
/// timer at 1 for each element's key and counts the timers it is handed.
fn stateful_timers_plan(block: Bytes) -> (Plan, FakeExecutor) {
    let family = TimerFamily {
        transform_id: "t".into(),
        family_id: "user".into(),
        domain: TimeDomain::EventTime,
        key_coder: Coder::Bytes,
        window_coder: Coder::GlobalWindow,
    };
    let stateful = SdkStage {
        stateful: true,
        timer_families: vec![family],
        ..SdkStage::default()
    };
    let plan = Plan {
        pcollections: vec![pc("impulse", Coder::Bytes), pc("kvs", kv_coder())].into(),
        stages: vec![
            stage("impulse", StageKind::Impulse, vec![], vec![0]),
            stage("source", sdk(), vec![0], vec![1]),
            stage("stateful", StageKind::Sdk(stateful), vec![1], vec![]),
        ]
        .into(),
        names: Default::default(),
    };
    let fired = Arc::new(AtomicUsize::new(0));
    let counted = fired.clone();
    let stateful: StageFn = Arc::new(move |input| {
        for t in &input.timers {
            let timers = decode_timers(&t.data, &Coder::Bytes, &Coder::GlobalWindow)
                .expect("the engine's timers decode");
            counted.fetch_add(timers.len(), Ordering::Relaxed);
        }
        let mut set = Vec::new();
        for chunk in &input.elements {
            let elements = decode_windowed_values(chunk, &kv_coder(), &Coder::GlobalWindow)
                .expect("the engine's elements decode");
            for e in elements {
                let value = e.value_bytes();
                let key_len = 1 + usize::from(value[0]);
                TimerValue {
                    user_key: value.slice(..key_len),
                    dynamic_tag: String::new(),
                    windows: e.header.windows.clone(),
                    clear: false,
                    fire_timestamp: 1,
                    hold_timestamp: 1,
                    pane: PaneInfo::NO_FIRING,
                }
                .encode(&Coder::GlobalWindow, &mut set)
                .expect("a timer encodes");
            }
        }
        BundleOutput {
            timers: vec![refract_engine::executor::TimerInput {
                transform_id: "t".into(),
                family_id: "user".into(),
                data: Bytes::from(set),
            }],
            ..Default::default()
        }
    });
    let exec = FakeExecutor {
        stages: BTreeMap::from([
            (StageIdx::new(1), emit(PCollectionIdx::new(1), block)),
            (StageIdx::new(2), stateful),
        ]),
        sink_bytes: fired,
    };
    (plan, exec)
}

fn run_once(rt: &tokio::runtime::Runtime, plan: Plan, exec: FakeExecutor) -> usize {
    run_with(rt, plan, exec, EngineConfig::default())
}

fn run_with(
    rt: &tokio::runtime::Runtime,
    plan: Plan,
    exec: FakeExecutor,
    config: EngineConfig,
) -> usize {
    let seen = exec.sink_bytes.clone();
    let exec = Arc::new(exec);
    rt.block_on(async move {
        let (_tx, rx) = watch::channel(false);
        let engine = Engine::new(plan, exec, config, "bench", Arc::new(|| 0)).expect("valid plan");
        engine.run(rx).await.expect("the run succeeds");
    });
    let n = seen.load(Ordering::Relaxed);
    assert!(n > 0, "the sink saw nothing");
    n
}

fn elements() -> usize {
    std::env::var("REFRACT_BENCH_ELEMENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000)
}

fn runtime() -> tokio::runtime::Runtime {
    // The same kind of runtime as the `refract` binary (multi-threaded),
    // sized for the 2-core machines the targets are stated for.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn bench_gbk(c: &mut Criterion) {
    let rt = runtime();
    let n = elements();
    let mut g = c.benchmark_group("shuffle");
    g.throughput(Throughput::Elements(n as u64));
    // Few keys (big groups, like the load tests' GBK) and one key per
    // element (the worst case for per-key bookkeeping).
    for keys in [1_000, n] {
        let block = source_block(n, keys);
        g.bench_with_input(
            BenchmarkId::new(format!("gbk_{n}_elements"), format!("{keys}_keys")),
            &block,
            |b, block| {
                b.iter(|| {
                    let (plan, exec) = gbk_plan(block.clone(), WindowingStrategy::global_default());
                    black_box(run_once(&rt, plan, exec))
                })
            },
        );
    }
    // A streaming GroupByKey firing after every element, over 1 000 keys.
    let block = source_block(n, 1_000);
    let per_element = WindowingStrategy {
        trigger: Trigger::Repeat(Box::new(Trigger::ElementCount(1))),
        ..WindowingStrategy::global_default()
    };
    g.bench_with_input(
        BenchmarkId::new(format!("gbk_streaming_{n}_elements"), "1000_keys"),
        &block,
        |b, block| {
            b.iter(|| {
                let (plan, exec) = gbk_plan(block.clone(), per_element.clone());
                let config = EngineConfig {
                    streaming: true,
                    ..EngineConfig::default()
                };
                black_box(run_with(&rt, plan, exec, config))
            })
        },
    );
    g.finish();
}

fn bench_stateful(c: &mut Criterion) {
    let rt = runtime();
    let n = elements();
    let mut g = c.benchmark_group("stateful");
    g.throughput(Throughput::Elements(n as u64));
    let block = source_block(n, n);
    g.bench_with_input(
        BenchmarkId::new(format!("timers_{n}_elements"), format!("{n}_keys")),
        &block,
        |b, block| {
            b.iter(|| {
                let (plan, exec) = stateful_timers_plan(block.clone());
                let config = EngineConfig {
                    streaming: true,
                    max_bundle_elements: 1_000,
                    ..EngineConfig::default()
                };
                let fired = run_with(&rt, plan, exec, config);
                assert_eq!(fired, n, "one timer per key fired");
                black_box(fired)
            })
        },
    );
    g.finish();
}

fn bench_chains(c: &mut Criterion) {
    let rt = runtime();
    let n = elements();
    let block = source_block(n, 1_000);
    let mut g = c.benchmark_group("chain");
    g.throughput(Throughput::Elements(n as u64));
    for (label, sdk_hops) in [("flatten", false), ("sdk_identity", true)] {
        let hops = 3;
        g.bench_with_input(
            BenchmarkId::new(format!("{label}_x{hops}_{n}_elements"), hops),
            &block,
            |b, block| {
                b.iter(|| {
                    let (plan, exec) = chain_plan(block.clone(), hops, sdk_hops);
                    black_box(run_once(&rt, plan, exec))
                })
            },
        );
    }
    g.finish();
}

fn config() -> Criterion {
    // As the `refract` binary does: otherwise which of glibc's two trim
    // modes a run lands in decides the figures (see the module's docs).
    refract_engine::allocator::tune_system_allocator();
    // Short by default (a few seconds per benchmark); criterion's own flags
    // (--measurement-time, --sample-size) override these.
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args()
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_gbk, bench_chains, bench_stateful
}
criterion_main!(benches);
