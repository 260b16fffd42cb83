//! A queue's back on a durable store, named by checkpoints, across crashes.
//!
//! Each step of the source emits far more than its sink's queue may hold
//! (one commit: backpressure cannot split it), so the sink's queue keeps
//! most of it on disk, and checkpoints — one after every commit — name
//! those segments instead of copying them (on scratch disk they would wait
//! until the queue drains). The run is crashed at each of its first
//! checkpoints (some writes failing first) and finished by a new engine
//! restored from the last checkpoint written, over the same durable store:
//! every element must reach the sink exactly once. A segment a checkpoint
//! names must still be there when it is restored (one read back is deleted
//! only once a later checkpoint is durable), and segments written after it
//! must not join the restored queue.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::crashes::{bundle_number, write_until, Writer};
use common::{elements, global_windowed, next_source_step, source_step, sourced_plan};
use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use refract_engine::coder::Coder;
use refract_engine::executor::{BundleInput, BundleOutput, CommitAction, ExecError, StageExecutor};
use refract_engine::manager::{describe_checkpoint, CheckpointProgress, Engine, EngineConfig};
use refract_engine::plan::{Plan, SdkStage, StageKind};
use refract_engine::spill::MemorySpillStore;
use tokio::sync::{mpsc, watch};

const STEPS: u32 = 6;
/// Elements per source step, of about [`VALUE_BYTES`] each: 150 KiB, some
/// 20 times the sink queue's bound.
const PER_STEP: u8 = 150;
const VALUE_BYTES: usize = 1 << 10;
/// The queue's bound (it spills past twice this).
const QUEUE_BYTES: usize = 4 << 10;
/// The sink.
const SINK: usize = 2;
/// How long writing a checkpoint takes.
const WRITE_TIME: Duration = Duration::from_millis(2);

/// (bundle number, the elements it took: step, index).
type Commits = Arc<Mutex<Vec<(u64, Vec<(u8, u8)>)>>>;

#[derive(Default)]
struct Sdk {
    committed: Commits,
}

/// Bytes as `Coder::Bytes` nests them: a varint length, then the bytes.
fn nested(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 2);
    let mut n = payload.len();
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out.extend_from_slice(payload);
    out
}

impl StageExecutor for Sdk {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let output = if input.stage != SINK {
            let step = source_step(&input);
            let mut block = Vec::new();
            for i in 0..PER_STEP {
                // Padding, then the element's id: the last bytes of its
                // encoding.
                let mut payload = vec![0; VALUE_BYTES - 2];
                payload.extend_from_slice(&[step as u8, i]);
                block.extend_from_slice(&global_windowed(&nested(&payload), 0));
            }
            BundleOutput {
                outputs: vec![(1, Bytes::from(block))],
                residuals: next_source_step(step, STEPS),
                ..Default::default()
            }
        } else {
            let ids: Vec<(u8, u8)> = elements(&input)
                .iter()
                .map(|e| (e[e.len() - 2], e[e.len() - 1]))
                .collect();
            let bundle = bundle_number(&input);
            let committed = self.committed.clone();
            BundleOutput {
                on_commit: Some(CommitAction::new(move || {
                    committed.lock().push((bundle, ids))
                })),
                ..Default::default()
            }
        };
        async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok(output)
        }
        .boxed()
    }
}

fn plan() -> Plan {
    sourced_plan(Coder::Bytes, "sink", StageKind::Sdk(SdkStage::default()))
}

/// An engine whose queues spill to `durable` past twice [`QUEUE_BYTES`],
/// checkpointing after every commit to `tx`.
fn engine(
    sdk: &Arc<Sdk>,
    durable: &Arc<MemorySpillStore>,
    tx: mpsc::Sender<Vec<(String, Bytes)>>,
    progress: watch::Receiver<CheckpointProgress>,
) -> Engine {
    let executor: Arc<dyn StageExecutor> = sdk.clone();
    let config = EngineConfig {
        max_bundle_elements: 8,
        max_bundles_per_stage: 2,
        max_pending_bytes: QUEUE_BYTES,
        ..EngineConfig::default()
    };
    Engine::new(plan(), executor, config, "q", Arc::new(|| 0))
        .expect("a valid plan")
        .with_durable_state(durable.clone())
        .with_spill(MemorySpillStore::shared(), b"q", QUEUE_BYTES)
        .with_checkpoints(Duration::ZERO, tx, Some(progress))
}

/// Whether `parts` name queue segments on the durable store: restoring
/// them over an empty one fails.
fn names_segments(parts: &[(String, Bytes)]) -> bool {
    let (tx, _rx) = mpsc::channel(1);
    let (_report, progress) = watch::channel(CheckpointProgress::default());
    let sdk = Arc::new(Sdk::default());
    let mut fresh = engine(&sdk, &MemorySpillStore::shared(), tx, progress);
    fresh.restore(parts).is_err()
}

/// How a run went: the elements committed in total, whether it crashed,
/// and whether the checkpoint it crashed at named segments.
struct Outcome {
    elements: Vec<(u8, u8)>,
    crashed: bool,
    named: bool,
}

/// Runs the job, crashing at `writer`'s checkpoint and finishing from it
/// over the same durable store.
async fn run_crashing_at(sdk: &Arc<Sdk>, writer: Writer) -> Outcome {
    let durable = MemorySpillStore::shared();
    let (cancel, cancelled) = watch::channel(false);
    let (tx, rx) = mpsc::channel(1);
    let (report, progress) = watch::channel(CheckpointProgress::default());
    let first = tokio::spawn(engine(sdk, &durable, tx, progress).run(cancelled));
    let (_, kept) = write_until(rx, report, writer, WRITE_TIME).await;
    let _ = cancel.send(true);
    let finished_first = first.await.expect("no panic");
    let Some(parts) = kept else {
        let summary = finished_first.expect("the run without a crash succeeds");
        assert!(summary.queue_spilled_bytes > 0, "the queue spilled");
        return Outcome {
            elements: committed_elements(sdk),
            crashed: false,
            named: false,
        };
    };
    let named = names_segments(&parts);
    // A crash loses what the checkpoint does not count as done.
    let info = describe_checkpoint(&parts).expect("readable");
    sdk.committed
        .lock()
        .retain(|(b, _)| *b < info.next_bundle && !info.rerun_bundles.contains(b));
    let (tx, rx) = mpsc::channel(1);
    let (report, progress) = watch::channel(CheckpointProgress::default());
    let mut engine = engine(sdk, &durable, tx, progress);
    engine.restore(&parts).expect("restores");
    let writer = tokio::spawn(write_until(rx, report, Writer::default(), WRITE_TIME));
    let (_cancel, cancelled) = watch::channel(false);
    engine
        .run(cancelled)
        .await
        .expect("the restored run succeeds");
    writer.await.expect("the writer ends");
    Outcome {
        elements: committed_elements(sdk),
        crashed: true,
        named,
    }
}

fn committed_elements(sdk: &Sdk) -> Vec<(u8, u8)> {
    let mut all: Vec<(u8, u8)> = sdk
        .committed
        .lock()
        .iter()
        .flat_map(|(_, ids)| ids.iter().copied())
        .collect();
    all.sort_unstable();
    all
}

#[tokio::test]
async fn queue_segments_named_by_checkpoints_come_back_after_a_crash() {
    let expected: Vec<(u8, u8)> = (0..STEPS as u8)
        .flat_map(|step| (0..PER_STEP).map(move |i| (step, i)))
        .collect();
    for failing in [0, 2] {
        let (mut crashed, mut named) = (0, 0);
        let crashes = (failing + 1..=failing + 16).map(Some);
        for crash_at in std::iter::once(None).chain(crashes) {
            let writer = Writer { crash_at, failing };
            let sdk = Arc::new(Sdk::default());
            let outcome =
                tokio::time::timeout(Duration::from_secs(30), run_crashing_at(&sdk, writer))
                    .await
                    .unwrap_or_else(|_| panic!("{writer:?}: the run did not end"));
            assert!(
                outcome.elements == expected,
                "{writer:?}: every element exactly once ({} of {})",
                outcome.elements.len(),
                expected.len()
            );
            crashed += u32::from(outcome.crashed);
            named += u32::from(outcome.named);
        }
        // Checkpoints are taken while the queue is on disk, and crashed at.
        assert!(crashed >= 8, "{failing} failing: {crashed} crashes");
        assert!(named >= 4, "{failing} failing: {named} named segments");
    }
}
