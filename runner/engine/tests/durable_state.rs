//! Bags on a durable spill space, named by checkpoints, across crashes.
//!
//! A stateful stage batches each key's values in a bag: it appends each
//! value, and when a key has all of its values it emits them (on commit)
//! and clears the bag. The bags' memory share is a few bytes, so nearly
//! every commit moves them to the durable spill space, and checkpoints — one
//! after every commit — name the parts there instead of copying them. The
//! run is crashed at each of its first checkpoints (some writes failing
//! first) and finished by a new engine restored from the last checkpoint
//! written, over the same durable spill space: every key's batch must be emitted
//! exactly once, whole and in order. A part a checkpoint names must still
//! be there when it is restored (a cleared bag's parts are deleted only
//! once a later checkpoint is durable), and parts written after it must
//! not join the restored bags.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::crashes::{
    after_a_millisecond, durable_engine, recorded_on_commit, run_crashing_at, Checkpoints, Commits,
    Crash, Writer,
};
use common::{elements, global_windowed, next_source_step, source_step, sourced_plan};
use futures::future::BoxFuture;
use refract_engine::coder::{decode_windowed_values, Coder};
use refract_engine::executor::{BundleInput, BundleOutput, ExecError, StageExecutor};
use refract_engine::manager::{Engine, EngineConfig};
use refract_engine::plan::{PCollectionIdx, Plan, SdkStage, StageIdx, StageKind};
use refract_engine::spill::MemorySpillSpace;
use refract_engine::state::{BundleState, CellId, StateKey};

const KEYS: u8 = 6;
const PER_KEY: u8 = 8;
/// Bytes of each value in a bag (its round, then padding).
const VALUE_BYTES: usize = 50;
/// The bags' share of memory: a few values (and the queue's, twice that,
/// holds a source step, so that it does not spill and hold checkpoints
/// back).
const BAG_BYTES: usize = 120;
/// The stateful stage.
const STATEFUL: StageIdx = StageIdx::new(2);
/// How long writing a checkpoint takes.
const WRITE_TIME: Duration = Duration::from_millis(2);

#[derive(Default)]
struct Sdk {
    /// The batches each committed bundle emitted: key, values in order.
    committed: Commits<Vec<(u8, Vec<u8>)>>,
}

fn kv_coder() -> Coder {
    Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Bytes))
}

/// `KV<[k], [round]>` as bare value bytes (both nested).
fn kv(k: u8, round: u8) -> Bytes {
    Bytes::from(vec![1, k, 1, round])
}

fn bag(key: &Bytes) -> StateKey {
    StateKey::BagUserState(CellId {
        transform_id: "batch".into(),
        state_id: "values".into(),
        window: Bytes::new(),
        key: key.clone(),
    })
}

/// Everything `key`'s bag holds, paged.
fn read_bag(state: &dyn BundleState, key: &Bytes) -> Vec<u8> {
    let mut values = Vec::new();
    let mut continuation: Option<Bytes> = None;
    loop {
        let page = state
            .get(&bag(key), continuation.as_deref())
            .expect("the bag reads");
        values.extend_from_slice(&page.data);
        match page.continuation {
            Some(next) => continuation = Some(next),
            None => return values,
        }
    }
}

impl StageExecutor for Sdk {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let output = if input.stage != STATEFUL {
            // The source, a step per round: every key's value of the round,
            // deferring the next round (a self-checkpointing read).
            let round = source_step(&input);
            let block: Vec<u8> = (0..KEYS)
                .flat_map(|k| global_windowed(&kv(k, round as u8), 30))
                .collect();
            BundleOutput {
                outputs: vec![(PCollectionIdx::new(1), Bytes::from(block))],
                residuals: next_source_step(round, u32::from(PER_KEY)),
                ..Default::default()
            }
        } else {
            let state = input.state.as_ref();
            let mut batches = Vec::new();
            for element in elements(&input) {
                let decoded = decode_windowed_values(&element, &kv_coder(), &Coder::GlobalWindow)
                    .expect("decodes")
                    .remove(0);
                let kv = decoded.value_bytes();
                let (key, round) = (kv.slice(..2), kv[3]);
                let mut values: Vec<u8> = read_bag(state, &key)
                    .chunks(VALUE_BYTES)
                    .map(|value| value[0])
                    .collect();
                values.push(round);
                if values.len() == PER_KEY as usize {
                    state.clear(&bag(&key)).expect("the bag clears");
                    batches.push((key[1], values));
                } else {
                    let mut value = vec![0; VALUE_BYTES];
                    value[0] = round;
                    state
                        .append(&bag(&key), Bytes::from(value))
                        .expect("the bag takes an append");
                }
            }
            recorded_on_commit(&self.committed, &input, batches)
        };
        after_a_millisecond(output)
    }
}

fn plan() -> Plan {
    sourced_plan(
        kv_coder(),
        "batch",
        StageKind::Sdk(SdkStage {
            stateful: true,
            ..SdkStage::default()
        }),
    )
}

fn config() -> EngineConfig {
    EngineConfig {
        max_bundle_elements: 3,
        max_bundles_per_stage: 2,
        streaming: true,
        ..EngineConfig::default()
    }
}

/// An engine over `durable`, spilling bags there past [`BAG_BYTES`],
/// checkpointing after every commit.
fn engine(sdk: &Arc<Sdk>, durable: &Arc<MemorySpillSpace>, checkpoints: Checkpoints) -> Engine {
    durable_engine(
        plan(),
        sdk.clone(),
        config(),
        durable,
        BAG_BYTES,
        checkpoints,
    )
}

/// Runs the job, crashing at `writer`'s checkpoint and finishing from it
/// over the same durable spill space; returns the batches committed in total,
/// and whether it crashed.
async fn run(sdk: &Arc<Sdk>, writer: Writer) -> (Vec<(u8, Vec<u8>)>, bool) {
    let durable = MemorySpillSpace::shared();
    let make = |tx, progress| engine(sdk, &durable, (tx, progress));
    let crashed = match run_crashing_at(make, &sdk.committed, writer, WRITE_TIME).await {
        // (A run may take fewer checkpoints than the crash waits for.)
        Crash::None(summary) => {
            assert!(summary.state_spilled_bytes > 0, "the bags spilled");
            false
        }
        Crash::At(parts) => {
            assert!(
                parts.iter().any(|(name, _)| name == "user_state_spill/2"),
                "the checkpoint names the stage's bags on the durable spill space"
            );
            true
        }
    };
    (committed_batches(sdk), crashed)
}

fn committed_batches(sdk: &Sdk) -> Vec<(u8, Vec<u8>)> {
    let mut batches: Vec<(u8, Vec<u8>)> = sdk
        .committed
        .lock()
        .iter()
        .flat_map(|(_, b)| b.iter().cloned())
        .collect();
    batches.sort();
    batches
}

#[tokio::test]
async fn bags_named_by_checkpoints_come_back_whole_after_a_crash() {
    let expected: Vec<(u8, Vec<u8>)> = (0..KEYS).map(|k| (k, (0..PER_KEY).collect())).collect();
    for failing in [0, 2] {
        let mut crashed = 0;
        let crashes = (failing + 1..=failing + 12).map(Some);
        for crash_at in std::iter::once(None).chain(crashes) {
            let writer = Writer { crash_at, failing };
            let sdk = Arc::new(Sdk::default());
            let (batches, crash) = tokio::time::timeout(Duration::from_secs(30), run(&sdk, writer))
                .await
                .unwrap_or_else(|_| panic!("{writer:?}: the run did not end"));
            assert_eq!(batches, expected, "{writer:?}: every batch exactly once");
            crashed += u32::from(crash);
        }
        // Checkpoints are taken while the bags are on disk, and crashed at.
        assert!(crashed >= 4, "{failing} failing: {crashed} crashes");
    }
}
