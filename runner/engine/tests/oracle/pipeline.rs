//! Whole engine runs with a fake SDK: source → window → GBK → sink.
//!
//! * The source is either
//!   - batch: impulse → `create` (SDK stage) which turns the impulse into
//!     the test's elements, in the global window at their own timestamps,
//!     written as `create_chunks` separate outputs; or
//!   - streaming: a runner-replayed TestStream of element batches and
//!     watermark advances, each applied once the pipeline is idle.
//! * `window` (SDK stage) plays `WindowInto`: it re-emits every element in
//!   the windows [`assign_windows`] gives it. `max_bundle_elements` decides
//!   how the elements are spread over its bundles, and so how many batches
//!   the GroupByKey sees and at which input watermarks (in batch, each
//!   pending element holds `window`'s output watermark at its timestamp).
//! * the runner's GroupByKey groups them.
//! * `sink` (SDK stage) records every pane it receives.
//!
//! Bundles of the fake SDK finish after a pseudo-random number of scheduler
//! yields, so concurrent bundles of a stage commit out of order.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use refract_engine::coder::{decode_windowed_values, Coder};
use refract_engine::executor::{BundleInput, BundleOutput, CommitAction, ExecError, StageExecutor};
use refract_engine::manager::{
    collect_epochs, describe_checkpoint, run_shards, split_sharded_checkpoint, CheckpointInfo,
    Engine, EngineConfig, EngineError, RunSummary, Strictness,
};
use refract_engine::plan::{
    PCollection, PCollectionIdx, PCollectionVec, Plan, SdkStage, Stage, StageIdx, StageKind,
    StageVec, TestStreamEvent, WindowFn, WindowingStrategy,
};
use refract_engine::shards::{ShardLayout, ShardLink};
use refract_engine::time::Timestamp;
use refract_engine::window::Window;
use tokio::sync::watch;

use super::model::{assign_windows, Input, Pane};
use super::wire::{
    decode_panes, encode_input, grouped_coder, kv_coder, kv_value, read_input, window_coder_for,
};
use crate::common::stage;

/// How the run is cut into bundles and batches.
#[derive(Debug, Clone)]
pub struct Shape {
    /// `EngineConfig::max_bundle_elements`.
    pub max_bundle_elements: usize,
    /// Into how many outputs `create` splits its elements (batch only).
    pub create_chunks: usize,
    /// `EngineConfig::chunk_bytes` (small values split bundles into many chunks).
    pub chunk_bytes: usize,
    /// `EngineConfig::max_bundles_per_stage`.
    pub max_bundles_per_stage: usize,
    /// `EngineConfig::streaming` (evaluate triggers after every element).
    pub streaming: bool,
    /// Seed of the bundles' completion delays.
    pub jitter: u64,
    /// Crash and recover: checkpoint continuously, stop the run at its
    /// `n`th checkpoint as if the process died, and finish it with a new
    /// engine restored from that checkpoint.
    pub crash_at: Option<usize>,
    /// `EngineConfig::strict`, with this seed.
    pub strict: Option<u64>,
    /// How many shards the job runs on (one engine each, in this process).
    pub shards: u32,
    /// Threads a sharded run runs on (1: one thread, as unsharded runs).
    pub threads: usize,
    /// With `crash_at`: the restored engine's plan numbers its stages in
    /// reverse, as another fusion of the pipeline would number them.
    pub renumber_on_restore: bool,
    /// With `crash_at`: how many shards finish the run from the checkpoint
    /// (one engine for 1); `None`: as many as ran it.
    pub restore_on: Option<u32>,
    /// Shards exchange through the frame protocol, carried by channels
    /// and tasks (as a network carries it), instead of the in-process
    /// board.
    pub frames: bool,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            max_bundle_elements: 100_000,
            create_chunks: 1,
            chunk_bytes: 1 << 20,
            max_bundles_per_stage: 4,
            streaming: false,
            jitter: 0,
            crash_at: None,
            strict: None,
            shards: 1,
            threads: 1,
            renumber_on_restore: false,
            restore_on: None,
            frames: false,
        }
    }
}

/// One step of a TestStream script, in the tests' terms.
#[derive(Debug, Clone)]
pub enum StreamEvent {
    /// These elements arrive, in this order.
    Elements(Vec<Input>),
    /// The source's watermark advances to this time.
    Watermark(Timestamp),
}

/// What an SDK stage of the fake does.
#[derive(Debug, Clone, Copy)]
enum Role {
    /// Impulse → the test's elements, into this PCollection.
    Create(PCollectionIdx),
    /// `WindowInto`, into this PCollection.
    Window(PCollectionIdx),
    /// Records panes.
    Sink,
}

/// The fake SDK.
struct FakeSdk {
    roles: HashMap<StageIdx, Role>,
    inputs: Vec<Input>,
    window_fn: WindowFn,
    window_coder: Coder,
    create_chunks: usize,
    jitter: u64,
    /// Panes received, with the number of the bundle that received them:
    /// written when the engine commits the bundle, as a transactional sink
    /// does (a bundle strict mode runs twice counts once).
    sink: Arc<Mutex<Vec<(SinkBundle, Pane)>>>,
    /// The bundle-id prefixes of the sink's bundles: on a sharded run, the
    /// shards that fired panes.
    sink_prefixes: Arc<Mutex<std::collections::BTreeSet<String>>>,
}

impl FakeSdk {
    fn create(&self, output: PCollectionIdx) -> BundleOutput {
        let n = self.inputs.len();
        let chunks = self.create_chunks.max(1);
        let outputs = (0..chunks)
            .map(|c| {
                let mut out = Vec::new();
                for input in &self.inputs[c * n / chunks..(c + 1) * n / chunks] {
                    encode_input(input, vec![Window::Global], &Coder::GlobalWindow, &mut out);
                }
                (output, Bytes::from(out))
            })
            .collect();
        BundleOutput {
            outputs,
            ..BundleOutput::default()
        }
    }

    fn window(&self, input: &BundleInput, output: PCollectionIdx) -> BundleOutput {
        let mut out = Vec::new();
        for chunk in &input.elements {
            for e in decode_windowed_values(chunk, &kv_coder(), &Coder::GlobalWindow)
                .expect("source elements decode")
            {
                let element = read_input(&e);
                let windows = assign_windows(&self.window_fn, element.ts);
                if !windows.is_empty() {
                    encode_input(&element, windows, &self.window_coder, &mut out);
                }
            }
        }
        BundleOutput {
            outputs: vec![(output, Bytes::from(out))],
            ..BundleOutput::default()
        }
    }

    fn sink(&self, input: &BundleInput) -> BundleOutput {
        let bundle = sink_bundle(&input.bundle_id);
        self.sink_prefixes.lock().insert(bundle.0.clone());
        let mut panes = Vec::new();
        for chunk in &input.elements {
            panes.extend(
                decode_panes(chunk, &self.window_coder)
                    .into_iter()
                    .map(|p| (bundle.clone(), p)),
            );
        }
        let sink = self.sink.clone();
        BundleOutput {
            on_commit: Some(CommitAction::new(move || sink.lock().extend(panes))),
            ..BundleOutput::default()
        }
    }
}

impl StageExecutor for FakeSdk {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let result = match self.roles.get(&input.stage) {
            Some(Role::Create(output)) => Ok(self.create(*output)),
            Some(Role::Window(output)) => Ok(self.window(&input, *output)),
            Some(Role::Sink) => Ok(self.sink(&input)),
            None => Err(ExecError::Runner(format!("no SDK stage {}", input.stage))),
        };
        let mut h = DefaultHasher::new();
        (self.jitter, &input.bundle_id).hash(&mut h);
        let yields = h.finish() % 4;
        async move {
            for _ in 0..yields {
                tokio::task::yield_now().await;
            }
            result
        }
        .boxed()
    }
}

/// A sink bundle: its engine's bundle-id prefix (one per shard) and its
/// number there.
type SinkBundle = (String, u64);

/// The prefix and number of a bundle id `{prefix}-b{n}`.
fn sink_bundle(bundle_id: &str) -> SinkBundle {
    bundle_id
        .rsplit_once("-b")
        .and_then(|(prefix, n)| Some((prefix.to_string(), n.parse().ok()?)))
        .expect("bundle ids end in -b<number>")
}

/// The bundle-id prefix of shard `k`'s engine.
fn shard_prefix(k: usize) -> String {
    format!("oracle-s{k}")
}

/// The clock of every engine here: processing time stands still, so a run
/// is the same every time.
fn fixed_clock() -> Arc<dyn Fn() -> Timestamp + Send + Sync> {
    Arc::new(|| 0)
}

/// Where a run stopped at a checkpoint got to.
enum Cut {
    /// Its `n`th checkpoint, after which it was stopped as a crashed
    /// process would be.
    At(Vec<(String, Bytes)>),
    /// It ended before that many checkpoints.
    Finished(Result<RunSummary, EngineError>),
}

/// Runs a new engine of `plan`, checkpointing continuously, until its
/// `n`th checkpoint.
async fn run_to_checkpoint(
    plan: Plan,
    executor: Arc<dyn StageExecutor>,
    config: EngineConfig,
    n: usize,
) -> Result<Cut, EngineError> {
    let (checkpoints, mut received) = tokio::sync::mpsc::channel(1);
    // The sender must outlive the run: dropping it cancels the job.
    let (cancel, cancelled) = watch::channel(false);
    let engine = Engine::builder(plan, executor, config, "oracle", fixed_clock())
        .checkpoints(Duration::ZERO, checkpoints, None)
        .build()?;
    let run = tokio::spawn(engine.run(cancelled));
    let chosen = stop_at(&mut received, n, &cancel).await;
    let outcome = run.await.expect("the run does not panic");
    Ok(match chosen {
        Some(parts) => Cut::At(parts),
        None => Cut::Finished(outcome),
    })
}

/// The `n`th checkpoint written to `received`, cancelling the run as it
/// comes (as a process dying right after writing it); `None` if the run
/// ended before.
async fn stop_at(
    received: &mut tokio::sync::mpsc::Receiver<Vec<(String, Bytes)>>,
    n: usize,
    cancel: &watch::Sender<bool>,
) -> Option<Vec<(String, Bytes)>> {
    let mut seen = 0;
    while let Some(parts) = received.recv().await {
        seen += 1;
        if seen == n {
            let _ = cancel.send(true);
            return Some(parts);
        }
    }
    None
}

/// Keeps the panes of the sink bundles that checkpoint `parts` counts as
/// done, dropping the others, as a crashed process would have lost their
/// effects (on shards, each shard's by its own cut).
fn keep_committed(sdk: &FakeSdk, parts: &[(String, Bytes)]) {
    let cuts: Vec<(String, Vec<(String, Bytes)>)> =
        match split_sharded_checkpoint(parts).expect("a readable checkpoint") {
            Some(shards) => shards
                .into_iter()
                .enumerate()
                .map(|(k, parts)| (shard_prefix(k), parts))
                .collect(),
            None => vec![("oracle".to_string(), parts.to_vec())],
        };
    let done: HashMap<String, CheckpointInfo> = cuts
        .into_iter()
        .map(|(prefix, parts)| {
            let info = describe_checkpoint(&parts).expect("a readable cut");
            (prefix, info)
        })
        .collect();
    sdk.sink.lock().retain(|((prefix, b), _)| {
        let info = &done[prefix];
        *b < info.next_bundle && !info.rerun_bundles.contains(b)
    });
}

/// A new engine of `plan` restored from `parts`, or why it does not
/// restore.
fn restored_engine(
    plan: Plan,
    executor: Arc<dyn StageExecutor>,
    config: EngineConfig,
    parts: &[(String, Bytes)],
) -> Result<Engine, String> {
    let mut engine =
        Engine::new(plan, executor, config, "oracle", fixed_clock()).map_err(|e| e.to_string())?;
    engine.restore(parts).map_err(|e| e.to_string())?;
    Ok(engine)
}

/// The sink's panes, sorted.
fn sink_panes(sdk: &FakeSdk) -> Vec<Pane> {
    let mut panes: Vec<Pane> = sdk.sink.lock().iter().map(|(_, p)| p.clone()).collect();
    panes.sort();
    panes
}

/// Runs `plan` to the end, or — with `crash_at` — to its `n`th checkpoint,
/// then from that checkpoint to the end in a new engine, dropping the
/// panes of sink bundles that the checkpoint does not count as done (as a
/// crashed process would have lost their effects).
async fn run_engine(
    plan: Plan,
    sdk: Arc<FakeSdk>,
    config: EngineConfig,
    crash_at: Option<usize>,
    (shards, restore_on): (u32, u32),
    renumber: bool,
    frames: bool,
) -> Result<(RunSummary, bool, bool), EngineError> {
    let executor: Arc<dyn StageExecutor> = sdk.clone();
    let Some(crash_at) = crash_at else {
        let (_cancel, cancelled) = watch::channel(false);
        if shards > 1 {
            let engines = sharded_engines(plan, executor, config, shards, frames, None)?;
            return Ok((run_shards(engines, cancelled).await?, false, false));
        }
        let engine = Engine::new(plan, executor, config, "oracle", fixed_clock())?;
        return Ok((engine.run(cancelled).await?, false, false));
    };
    let cut = if shards > 1 {
        run_sharded_to_checkpoint(
            plan.clone(),
            executor.clone(),
            config.clone(),
            shards,
            frames,
            crash_at,
        )
        .await?
    } else {
        run_to_checkpoint(plan.clone(), executor.clone(), config.clone(), crash_at).await?
    };
    let parts = match cut {
        Cut::At(parts) => parts,
        // Nothing to recover.
        Cut::Finished(outcome) => return Ok((outcome?, false, false)),
    };
    let in_transit = parts.iter().any(|(name, _)| name.ends_with("/shard_inbox"));
    keep_committed(&sdk, &parts);
    let (plan, executor) = if renumber {
        let (plan, sdk) = renumbered(plan, &sdk);
        (plan, sdk as Arc<dyn StageExecutor>)
    } else {
        (plan, executor)
    };
    let (_cancel, cancelled) = watch::channel(false);
    if restore_on > 1 {
        let engines = sharded_engines(plan, executor, config, restore_on, frames, Some(&parts))
            .map_err(|e| EngineError::InvalidPlan(e.to_string()))?;
        return Ok((run_shards(engines, cancelled).await?, true, in_transit));
    }
    let engine = restored_engine(plan, executor, config, &parts).expect("the checkpoint restores");
    Ok((engine.run(cancelled).await?, true, false))
}

/// Runs `plan` on `shards` engines, checkpointing continuously (one
/// epoch after another), until the job's `n`th checkpoint.
async fn run_sharded_to_checkpoint(
    plan: Plan,
    executor: Arc<dyn StageExecutor>,
    config: EngineConfig,
    shards: u32,
    frames: bool,
    n: usize,
) -> Result<Cut, EngineError> {
    let (checkpoints, mut received) = tokio::sync::mpsc::channel(1);
    let (ends, collector) = collect_epochs(shards, Vec::new(), checkpoints, None);
    let collector = tokio::spawn(collector);
    let engines = links(shards, frames)
        .into_iter()
        .zip(ends)
        .map(|(link, end)| {
            let prefix = shard_prefix(link.id().index());
            Engine::builder(
                plan.clone(),
                executor.clone(),
                config.clone(),
                prefix,
                fixed_clock(),
            )
            .checkpoints(Duration::ZERO, end.tx, Some(end.progress))
            .shard(link)
            .build()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (cancel, cancelled) = watch::channel(false);
    let run = tokio::spawn(run_shards(engines, cancelled));
    let chosen = stop_at(&mut received, n, &cancel).await;
    let outcome = run.await.expect("the run does not panic");
    drop(received);
    collector.await.expect("the collector does not panic");
    Ok(match chosen {
        Some(parts) => Cut::At(parts),
        None => Cut::Finished(outcome),
    })
}

/// The links of `shards` shards: over the frame protocol if `frames`,
/// else the in-process board. (In a Tokio runtime.)
fn links(shards: u32, frames: bool) -> Vec<ShardLink> {
    let layout = ShardLayout::new(shards).expect("a layout");
    if frames {
        ShardLink::over_channels(layout)
    } else {
        ShardLink::in_process(layout)
    }
}

/// `plan` with its stages in reverse order, and an SDK that runs them and
/// shares `sdk`'s sink.
fn renumbered(plan: Plan, sdk: &FakeSdk) -> (Plan, Arc<FakeSdk>) {
    let last = plan.stages.len() - 1;
    let flip = |idx: StageIdx| StageIdx::new(last - idx.index());
    let mut stages: Vec<Stage> = plan.stages.into_iter().collect();
    stages.reverse();
    let plan = Plan {
        pcollections: plan.pcollections,
        stages: StageVec::from(stages),
        names: Default::default(),
    };
    let sdk = FakeSdk {
        roles: sdk
            .roles
            .iter()
            .map(|(idx, role)| (flip(*idx), *role))
            .collect(),
        inputs: sdk.inputs.clone(),
        window_fn: sdk.window_fn.clone(),
        window_coder: sdk.window_coder.clone(),
        create_chunks: sdk.create_chunks,
        jitter: sdk.jitter,
        sink: sdk.sink.clone(),
        sink_prefixes: sdk.sink_prefixes.clone(),
    };
    (plan, Arc::new(sdk))
}

/// The engines of `plan` on `shards` shards joined in this process, all
/// with one executor (as shards sharing one pool of workers would be),
/// restored from `parts` if given.
fn sharded_engines(
    plan: Plan,
    executor: Arc<dyn StageExecutor>,
    config: EngineConfig,
    shards: u32,
    frames: bool,
    parts: Option<&[(String, Bytes)]>,
) -> Result<Vec<Engine>, EngineError> {
    links(shards, frames)
        .into_iter()
        .map(|link| {
            let prefix = shard_prefix(link.id().index());
            let mut engine = Engine::builder(
                plan.clone(),
                executor.clone(),
                config.clone(),
                prefix,
                fixed_clock(),
            )
            .shard(link)
            .build()?;
            if let Some(parts) = parts {
                engine
                    .restore(parts)
                    .map_err(|e| EngineError::InvalidPlan(format!("restoring a shard: {e}")))?;
            }
            Ok(engine)
        })
        .collect()
}

fn pcollection(id: &str, value_coder: Coder, window_coder: Coder) -> PCollection {
    PCollection {
        id: id.into(),
        value_coder,
        window_coder,
        bounded: true,
    }
}

fn sdk() -> StageKind {
    StageKind::Sdk(SdkStage::default())
}

/// What a run produced.
#[derive(Debug)]
pub struct Run {
    /// Every pane the sink received, sorted.
    pub panes: Vec<Pane>,
    /// (element, window) pairs the GroupByKey dropped as too late.
    pub dropped_late: u64,
    /// The run crashed and was finished by a restored engine.
    pub restored: bool,
    /// The checkpoint it was restored from held elements in transit
    /// between shards (a shard's `shard_inbox` part).
    pub restored_in_transit: bool,
    /// What strict mode did, if it was on.
    pub strict: Option<refract_engine::manager::StrictReport>,
    /// How many engines (shards) ran sink bundles.
    pub sink_engines: usize,
}

/// Builds source → window → gbk → sink after the given source stages
/// (which produce PCollection 0, in the global window): the plan, the fake
/// SDK that runs its SDK stages, and the engine's configuration.
fn harness(
    source_stages: Vec<Stage>,
    mut roles: HashMap<StageIdx, Role>,
    inputs: &[Input],
    strategy: &WindowingStrategy,
    shape: &Shape,
) -> (Plan, Arc<FakeSdk>, EngineConfig) {
    let window_coder = window_coder_for(strategy.window_fn == WindowFn::Global);
    let mut stages = StageVec::from(source_stages);
    // PCollections: 0 source output, 1 windowed, 2 grouped.
    let window = stages.push(stage("window", sdk(), vec![0], vec![1]));
    stages.push(stage(
        "gbk",
        StageKind::GroupByKey(strategy.clone()),
        vec![1],
        vec![2],
    ));
    let sink = stages.push(stage("sink", sdk(), vec![2], vec![]));
    roles.insert(window, Role::Window(PCollectionIdx::new(1)));
    roles.insert(sink, Role::Sink);
    // The impulse, if any, writes a PCollection after the three above.
    let mut pcollections = PCollectionVec::from(vec![
        pcollection("source", kv_coder(), Coder::GlobalWindow),
        pcollection("windowed", kv_coder(), window_coder.clone()),
        pcollection("grouped", grouped_coder(), window_coder.clone()),
    ]);
    if stages.iter().any(|s| matches!(s.kind, StageKind::Impulse)) {
        pcollections.push(pcollection("impulse", Coder::Bytes, Coder::GlobalWindow));
    }
    let plan = Plan {
        pcollections,
        stages,
        names: Default::default(),
    };
    let sdk = Arc::new(FakeSdk {
        roles,
        inputs: inputs.to_vec(),
        window_fn: strategy.window_fn.clone(),
        window_coder,
        create_chunks: shape.create_chunks,
        jitter: shape.jitter,
        sink: Arc::default(),
        sink_prefixes: Arc::default(),
    });
    let config = EngineConfig {
        max_bundle_elements: shape.max_bundle_elements,
        chunk_bytes: shape.chunk_bytes,
        max_bundles_per_stage: shape.max_bundles_per_stage,
        streaming: shape.streaming,
        strict: shape.strict.map(|seed| Strictness {
            seed,
            coders: false,
        }),
        ..EngineConfig::default()
    };
    (plan, sdk, config)
}

/// A runtime as the runs here use: one thread, so that a run is the same
/// every time.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a tokio runtime")
}

/// The runtime a run of `shape` runs on: shards on threads of their own
/// when asked (so that one shard's work really overlaps another's cut),
/// else one thread.
fn runtime_for(shape: &Shape) -> tokio::runtime::Runtime {
    if shape.shards > 1 && shape.threads > 1 {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(shape.threads)
            .enable_time()
            .build()
            .expect("a tokio runtime")
    } else {
        runtime()
    }
}

/// Builds source → window → gbk → sink after the given source stages
/// (which produce PCollection 0, in the global window) and runs it.
fn run(
    source_stages: Vec<Stage>,
    roles: HashMap<StageIdx, Role>,
    inputs: &[Input],
    strategy: &WindowingStrategy,
    shape: &Shape,
) -> Result<Run, EngineError> {
    let (plan, sdk, config) = harness(source_stages, roles, inputs, strategy, shape);
    let runtime = runtime_for(shape);
    let run = run_engine(
        plan,
        sdk.clone(),
        config,
        shape.crash_at,
        (shape.shards, shape.restore_on.unwrap_or(shape.shards)),
        shape.renumber_on_restore,
        shape.frames,
    );
    let (summary, restored, restored_in_transit) = runtime.block_on(async move {
        tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .map_err(|_| EngineError::Stuck("the run did not finish within 60 s".into()))?
    })?;
    let sink_engines = sdk.sink_prefixes.lock().len();
    Ok(Run {
        panes: sink_panes(&sdk),
        dropped_late: summary.dropped_late,
        restored,
        restored_in_transit,
        strict: summary.strict,
        sink_engines,
    })
}

/// The bounded source: stage 0 impulse writes PCollection 3; stage 1
/// `create` reads it and writes the elements.
fn batch_sources() -> (Vec<Stage>, HashMap<StageIdx, Role>) {
    let sources = vec![
        stage("impulse", StageKind::Impulse, vec![], vec![3]),
        stage("create", sdk(), vec![3], vec![0]),
    ];
    let roles = HashMap::from([(StageIdx::new(1), Role::Create(PCollectionIdx::new(0)))]);
    (sources, roles)
}

/// Runs `inputs` (bounded: impulse → create) through a GroupByKey with
/// `strategy`, cut into bundles as `shape` says.
pub fn run_batch(
    inputs: &[Input],
    strategy: &WindowingStrategy,
    shape: &Shape,
) -> Result<Run, EngineError> {
    let (sources, roles) = batch_sources();
    run(sources, roles, inputs, strategy, shape)
}

/// 60 elements over three keys and 50 ms, in 10 ms fixed windows.
pub fn sixty_inputs_in_fixed_windows() -> (Vec<Input>, WindowingStrategy) {
    let inputs = (0..60)
        .map(|i| Input {
            key: b'a' + (i % 3) as u8,
            id: i as i64,
            ts: (i * 7 % 50) as i64,
        })
        .collect();
    let strategy = WindowingStrategy {
        window_fn: WindowFn::Fixed {
            size: 10,
            offset: 0,
        },
        ..WindowingStrategy::global_default()
    };
    (inputs, strategy)
}

/// Bundles of at most four elements, three of a stage at once, finishing
/// out of order: a checkpoint catches some in flight.
pub fn small_bundles_out_of_order() -> Shape {
    Shape {
        max_bundle_elements: 4,
        create_chunks: 6,
        max_bundles_per_stage: 3,
        jitter: 11,
        ..Shape::default()
    }
}

/// A checkpoint's named parts.
#[allow(dead_code)] // for checkpoint_fixtures.rs, not oracle.rs
pub type Parts = Vec<(String, Bytes)>;

/// A batch run (as [`run_batch`]) stopped at its `crash_at`th checkpoint,
/// as a process that died there: the checkpoint's parts, and the panes its
/// sink had committed by then. `None` if it ended before that checkpoint.
#[allow(dead_code)] // for checkpoint_fixtures.rs, not oracle.rs
pub fn batch_checkpoint(
    inputs: &[Input],
    strategy: &WindowingStrategy,
    shape: &Shape,
    crash_at: usize,
) -> Option<(Parts, Vec<Pane>)> {
    let (sources, roles) = batch_sources();
    let (plan, sdk, config) = harness(sources, roles, inputs, strategy, shape);
    let cut = runtime()
        .block_on(run_to_checkpoint(plan, sdk.clone(), config, crash_at))
        .expect("an engine");
    let Cut::At(parts) = cut else {
        return None;
    };
    keep_committed(&sdk, &parts);
    Some((parts, sink_panes(&sdk)))
}

/// A batch run on `from` shards (one engine for 1) cut at its `crash_at`th
/// checkpoint (as a process dying there), then finished from that
/// checkpoint by the engines of `shape` (on its own number of shards, one
/// engine for 1): the sink's panes, sorted, and
/// whether it was restored (not if it ended before that checkpoint), or
/// why the checkpoint does not restore there.
pub fn finish_on_other_shards(
    inputs: &[Input],
    strategy: &WindowingStrategy,
    shape: &Shape,
    from: u32,
    crash_at: usize,
) -> Result<(Vec<Pane>, bool), String> {
    let (sources, roles) = batch_sources();
    let (plan, sdk, config) = harness(sources, roles, inputs, strategy, shape);
    let executor: Arc<dyn StageExecutor> = sdk.clone();
    let runtime = runtime_for(shape);
    // One shard is one engine, without a link.
    let cut = runtime
        .block_on(async {
            if from > 1 {
                run_sharded_to_checkpoint(
                    plan.clone(),
                    executor.clone(),
                    config.clone(),
                    from,
                    shape.frames,
                    crash_at,
                )
                .await
            } else {
                run_to_checkpoint(plan.clone(), executor.clone(), config.clone(), crash_at).await
            }
        })
        .expect("an engine");
    let parts = match cut {
        Cut::At(parts) => parts,
        Cut::Finished(outcome) => {
            outcome.map_err(|e| e.to_string())?;
            return Ok((sink_panes(&sdk), false));
        }
    };
    keep_committed(&sdk, &parts);
    let (_cancel, cancelled) = watch::channel(false);
    let finished = if shape.shards > 1 {
        let _runtime = runtime.enter();
        let engines = sharded_engines(
            plan,
            executor,
            config,
            shape.shards,
            shape.frames,
            Some(&parts),
        )
        .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), run_shards(engines, cancelled)).await
        })
    } else {
        let engine = restored_engine(plan, executor, config, &parts)?;
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), engine.run(cancelled)).await
        })
    };
    finished
        .map_err(|_| "the restored run did not finish within 60 s".to_string())?
        .map_err(|e| e.to_string())?;
    Ok((sink_panes(&sdk), true))
}

/// A batch run (as [`run_batch`]) finished in a new engine from the
/// checkpoint `parts` (perhaps another build's): the panes its sink
/// receives from there, sorted, or why the checkpoint does not restore.
#[allow(dead_code)] // for checkpoint_fixtures.rs, not oracle.rs
pub fn finish_batch(
    parts: &[(String, Bytes)],
    inputs: &[Input],
    strategy: &WindowingStrategy,
    shape: &Shape,
) -> Result<Vec<Pane>, String> {
    let (sources, roles) = batch_sources();
    let (plan, sdk, config) = harness(sources, roles, inputs, strategy, shape);
    let engine = restored_engine(plan, sdk.clone(), config, parts)?;
    let (_cancel, cancelled) = watch::channel(false);
    runtime()
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(60), engine.run(cancelled)).await
        })
        .map_err(|_| "the restored run did not finish within 60 s".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(sink_panes(&sdk))
}

/// Replays `events` from a TestStream through a GroupByKey with `strategy`.
pub fn run_stream(
    events: &[StreamEvent],
    strategy: &WindowingStrategy,
    shape: &Shape,
) -> Result<Run, EngineError> {
    let script = events
        .iter()
        .map(|e| match e {
            StreamEvent::Elements(inputs) => TestStreamEvent::Elements {
                output: PCollectionIdx::new(0),
                elements: inputs
                    .iter()
                    .map(|i| (Bytes::from(kv_value(i)), i.ts))
                    .collect(),
            },
            StreamEvent::Watermark(t) => TestStreamEvent::Watermark(*t),
        })
        .collect();
    let sources = vec![stage(
        "test_stream",
        StageKind::TestStream(script),
        vec![],
        vec![0],
    )];
    run(sources, HashMap::new(), &[], strategy, shape)
}
