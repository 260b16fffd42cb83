//! A queue's back on a durable spill space, named by checkpoints, across crashes.
//!
//! Each step of the source emits far more than its sink's queue may hold
//! (one commit: backpressure cannot split it), so the sink's queue keeps
//! most of it on disk, and checkpoints — one after every commit — name
//! those segments instead of copying them (on scratch disk they would wait
//! until the queue drains). The run is crashed at each of its first
//! checkpoints (some writes failing first) and finished by a new engine
//! restored from the last checkpoint written, over the same durable spill space:
//! every element must reach the sink exactly once. A segment a checkpoint
//! names must still be there when it is restored (one read back is deleted
//! only once a later checkpoint is durable), and segments written after it
//! must not join the restored queue.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::crashes::{
    after_a_millisecond, crash_matrix, durable_engine, recorded_on_commit, restore_refused,
    run_crashing_at, Checkpoints, Commits, Crash, CrashTally, Writer,
};
use common::{elements, global_windowed, next_source_step, source_step, sourced_plan};
use futures::future::BoxFuture;
use refract_engine::coder::Coder;
use refract_engine::executor::{BundleInput, BundleOutput, ExecError, StageExecutor};
use refract_engine::manager::{Engine, EngineConfig};
use refract_engine::plan::{PCollectionIdx, Plan, SdkStage, StageIdx, StageKind};
use refract_engine::spill::MemorySpillSpace;

const STEPS: u32 = 6;
/// Elements per source step, of about [`VALUE_BYTES`] each: 150 KiB, some
/// 20 times the sink queue's bound.
const PER_STEP: u8 = 150;
const VALUE_BYTES: usize = 1 << 10;
/// The queue's bound (it spills past twice this).
const QUEUE_BYTES: usize = 4 << 10;
/// The sink.
const SINK: StageIdx = StageIdx::new(2);
/// How long writing a checkpoint takes.
const WRITE_TIME: Duration = Duration::from_millis(2);

#[derive(Default)]
struct Sdk {
    /// The elements each committed sink bundle took: (step, index).
    committed: Commits<Vec<(u8, u8)>>,
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
                outputs: vec![(PCollectionIdx::new(1), Bytes::from(block))],
                residuals: next_source_step(step, STEPS),
                ..Default::default()
            }
        } else {
            let ids: Vec<(u8, u8)> = elements(&input)
                .iter()
                .map(|e| (e[e.len() - 2], e[e.len() - 1]))
                .collect();
            recorded_on_commit(&self.committed, &input, ids)
        };
        after_a_millisecond(output)
    }
}

fn plan() -> Plan {
    sourced_plan(Coder::Bytes, "sink", StageKind::Sdk(SdkStage::default()))
}

/// An engine whose queues spill to `durable` past twice [`QUEUE_BYTES`],
/// checkpointing after every commit.
fn engine(sdk: &Arc<Sdk>, durable: &Arc<MemorySpillSpace>, checkpoints: Checkpoints) -> Engine {
    let config = EngineConfig {
        max_bundle_elements: 8,
        max_bundles_per_stage: 2,
        max_pending_bytes: QUEUE_BYTES,
        ..EngineConfig::default()
    };
    durable_engine(
        plan(),
        sdk.clone(),
        config,
        durable,
        QUEUE_BYTES,
        checkpoints,
    )
}

/// Whether `parts` name queue segments on the durable spill space: restoring them
/// over an empty one is refused.
fn names_segments(parts: &[(String, Bytes)]) -> bool {
    let sdk = Arc::new(Sdk::default());
    let empty = MemorySpillSpace::shared();
    restore_refused(|tx, progress| engine(&sdk, &empty, (tx, progress)), parts)
}

/// Runs the job, crashing at `writer`'s checkpoint and finishing from it
/// over the same durable spill space; returns the elements committed in total,
/// and whether the checkpoint it crashed at named segments.
async fn run(sdk: &Arc<Sdk>, writer: Writer) -> (Vec<(u8, u8)>, Option<bool>) {
    let durable = MemorySpillSpace::shared();
    let make = |tx, progress| engine(sdk, &durable, (tx, progress));
    let crash = run_crashing_at(make, &sdk.committed, writer, WRITE_TIME).await;
    let named = match crash {
        Crash::None(summary) => {
            assert!(summary.queue_spilled_bytes > 0, "the queue spilled");
            None
        }
        Crash::At(parts) => Some(names_segments(&parts)),
    };
    (committed_elements(sdk), named)
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
    let describe = |elements: &Vec<(u8, u8)>| {
        format!(
            "every element exactly once ({} of {})",
            elements.len(),
            expected.len()
        )
    };
    let run = |writer| async move { run(&Arc::new(Sdk::default()), writer).await };
    for CrashTally {
        failing,
        crashed,
        named,
    } in crash_matrix(16, &expected, describe, run).await
    {
        // Checkpoints are taken while the queue is on disk, and crashed at.
        assert!(crashed >= 8, "{failing} failing: {crashed} crashes");
        assert!(named >= 4, "{failing} failing: {named} named segments");
    }
}
