//! A streaming GroupByKey's spilled windows on a durable spill space, named by
//! checkpoints, across crashes.
//!
//! A self-checkpointing source feeds a GroupByKey in the global window
//! step by step; the buffer's share of memory is a few KiB, so every step
//! spills, and the window stays open — spilled — until the source ends.
//! Checkpoints (one after every commit) name the spilled runs instead of
//! waiting for the window to be emitted. The run is crashed at each of its
//! first checkpoints (some writes failing first) and finished by a new
//! engine restored from the last checkpoint written, over the same durable
//! store: every key's group must reach the sink exactly once, with every
//! value. Runs a checkpoint names must still be there when it is restored,
//! and runs written after it must not join the restored window.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::crashes::{
    after_a_millisecond, crash_matrix, durable_engine, recorded_on_commit, restore_refused,
    run_crashing_at, Checkpoints, Commits, Crash, CrashTally, Writer,
};
use common::{elements, global_windowed, group_plan, next_source_step, source_step};
use futures::future::BoxFuture;
use refract_engine::coder::{decode_windowed_values, Coder};
use refract_engine::executor::{BundleInput, BundleOutput, ExecError, StageExecutor};
use refract_engine::manager::{Engine, EngineConfig};
use refract_engine::plan::{PCollectionIdx, StageIdx};
use refract_engine::spill::MemorySpillSpace;

const STEPS: u32 = 20;
const KEYS: u8 = 20;
/// Elements per source step.
const PER_STEP: u8 = 200;
/// The GroupByKey's share of memory: less than a step's output.
const GROUP_BYTES: usize = 4 << 10;
/// The sink.
const SINK: StageIdx = StageIdx::new(3);
/// How long writing a checkpoint takes.
const WRITE_TIME: Duration = Duration::from_millis(2);

/// A group as the sink saw it: key, values sorted.
type Group = (u8, Vec<[u8; 2]>);

#[derive(Default)]
struct Sdk {
    /// The groups each committed sink bundle took.
    committed: Commits<Vec<Group>>,
}

/// `KV<[key], [step, i]>` (both nested bytes).
fn kv(key: u8, step: u8, i: u8) -> Vec<u8> {
    vec![1, key, 2, step, i]
}

impl StageExecutor for Sdk {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let output = if input.stage != SINK {
            let step = source_step(&input);
            let block: Vec<u8> = (0..PER_STEP)
                .flat_map(|i| global_windowed(&kv(i % KEYS, step as u8, i), 0))
                .collect();
            BundleOutput {
                outputs: vec![(PCollectionIdx::new(1), Bytes::from(block))],
                residuals: next_source_step(step, STEPS),
                ..Default::default()
            }
        } else {
            let grouped = Coder::Kv(
                Box::new(Coder::Bytes),
                Box::new(Coder::Iterable(Box::new(Coder::Bytes))),
            );
            let mut groups = Vec::new();
            for element in elements(&input) {
                let decoded = decode_windowed_values(&element, &grouped, &Coder::GlobalWindow)
                    .expect("decodes")
                    .remove(0);
                // [1, key], count (i32), then [2, step, i] each.
                let v = decoded.value();
                let count = u32::from_be_bytes(v[2..6].try_into().expect("a count")) as usize;
                let mut values: Vec<[u8; 2]> =
                    v[6..].chunks(3).map(|value| [value[1], value[2]]).collect();
                assert_eq!(values.len(), count);
                values.sort_unstable();
                groups.push((v[1], values));
            }
            recorded_on_commit(&self.committed, &input, groups)
        };
        after_a_millisecond(output)
    }
}

/// A streaming engine whose GroupByKey spills to `durable` past
/// [`GROUP_BYTES`], checkpointing after every commit.
fn engine(sdk: &Arc<Sdk>, durable: &Arc<MemorySpillSpace>, checkpoints: Checkpoints) -> Engine {
    let config = EngineConfig {
        max_bundles_per_stage: 2,
        streaming: true,
        ..EngineConfig::default()
    };
    durable_engine(
        group_plan(),
        sdk.clone(),
        config,
        durable,
        GROUP_BYTES,
        checkpoints,
    )
}

/// Whether `parts` name spilled runs on the durable spill space: restoring them
/// over an empty one is refused.
fn names_runs(parts: &[(String, Bytes)]) -> bool {
    let sdk = Arc::new(Sdk::default());
    let empty = MemorySpillSpace::shared();
    restore_refused(|tx, progress| engine(&sdk, &empty, (tx, progress)), parts)
}

/// Runs the job, crashing at `writer`'s checkpoint and finishing from it
/// over the same durable spill space; returns the groups committed in total,
/// and, if it crashed, whether its checkpoint named spilled runs.
async fn run(sdk: &Arc<Sdk>, writer: Writer) -> (Vec<Group>, Option<bool>) {
    let durable = MemorySpillSpace::shared();
    let make = |tx, progress| engine(sdk, &durable, (tx, progress));
    let crash = run_crashing_at(make, &sdk.committed, writer, WRITE_TIME).await;
    let named = match crash {
        Crash::None(summary) => {
            assert!(summary.spilled_bytes > 0, "the GroupByKey spilled");
            None
        }
        Crash::At(parts) => Some(names_runs(&parts)),
    };
    let mut groups: Vec<Group> = sdk
        .committed
        .lock()
        .iter()
        .flat_map(|(_, groups)| groups.iter().cloned())
        .collect();
    groups.sort();
    (groups, named)
}

#[tokio::test]
async fn windows_named_by_checkpoints_come_back_after_a_crash() {
    let expected: Vec<Group> = (0..KEYS)
        .map(|key| {
            let mut values: Vec<[u8; 2]> = (0..STEPS as u8)
                .flat_map(|step| {
                    (0..PER_STEP)
                        .filter(move |i| i % KEYS == key)
                        .map(move |i| [step, i])
                })
                .collect();
            values.sort_unstable();
            (key, values)
        })
        .collect();
    let describe = |groups: &Vec<Group>| {
        format!(
            "every group exactly once, whole ({} groups, {} values)",
            groups.len(),
            groups.iter().map(|(_, v)| v.len()).sum::<usize>()
        )
    };
    let run = |writer| async move { run(&Arc::new(Sdk::default()), writer).await };
    for CrashTally {
        failing,
        crashed,
        named,
    } in crash_matrix(16, &expected, describe, run).await
    {
        assert!(crashed >= 8, "{failing} failing: {crashed} crashes");
        assert!(
            named >= 4,
            "{failing} failing: {named} checkpoints named runs"
        );
    }
}
