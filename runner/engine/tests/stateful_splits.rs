//! Keyed processing under splits: a property test of the engine's key-group
//! locks, bundle overlays and timers together.
//!
//! # The model
//!
//! A stateful DoFn sees each key's elements one after another, each against
//! the state the previous one left (Beam: state is per key and window, and
//! the runner never runs one key in two bundles at once). A timer set for a
//! key fires after the element that set it, against the state of every
//! element processed before it fired. So a DoFn that counts a key's
//! elements in a bag and reports the count with each element and each
//! timer must report, per key, every count from 1 to its number of
//! elements exactly once, and timer counts that never go down and end at
//! that number (in batch, where timers wait for all input: one firing, at
//! that number).
//!
//! # What is run
//!
//! Random cases: keys, elements per key, bundle sizes, how many bundles of
//! the stage may run at once, batch (impulse and a source) or streaming (a
//! TestStream releasing the input in several steps). The fake stateful
//! stage reads and writes its bag through the bundle's state (the engine's
//! overlay, committed with the bundle), sets a timer for each key it
//! processes, yields between elements so that bundles interleave, and
//! splits bundles at random points among the ones the engine allows
//! (between key groups). Besides the counts, it checks at every bundle's
//! start that no running bundle holds one of its key groups (those of its
//! elements, or of what it kept once split, and of its timers).
//!
//! Some cases give the stage's bags a memory share of a few bytes, so that
//! every commit moves them to disk: the same counts must come back from
//! there. Some take a checkpoint every millisecond with a durable spill space, so
//! that checkpoints name bags on disk while bundles page through them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{
    elements, global_pcollection, global_timer_family, global_timers_at_10, global_windowed,
    sourced_plan, split_at, stage,
};
use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use proptest::prelude::*;
use refract_engine::coder::{decode_timers, decode_windowed_values, Coder};
use refract_engine::executor::{BundleInput, BundleOutput, ExecError, StageExecutor};
use refract_engine::key_groups::key_group;
use refract_engine::manager::{Engine, EngineConfig};
use refract_engine::plan::{
    PCollectionIdx, Plan, SdkStage, StageIdx, StageKind, TestStreamEvent, TimerFamily,
};
use refract_engine::spill::MemorySpillSpace;
use refract_engine::state::{BundleState, CellId, StateKey};
use tokio::sync::watch;

/// The stateful transform, its bag and its timer family.
const TRANSFORM: &str = "count";
const BAG: &str = "seen";
const FAMILY: &str = "report";

/// One random case.
#[derive(Debug, Clone)]
struct Case {
    keys: u8,
    per_key: u8,
    max_bundle_elements: usize,
    max_bundles_per_stage: usize,
    /// Chance in 100 that a bundle with allowed split points is split.
    split_percent: u64,
    seed: u64,
    streaming: bool,
    /// Arrival order: see [`arrivals`].
    key_by_key: bool,
    /// The bags' share of memory, if they may spill.
    spill_limit: Option<usize>,
    /// Checkpoints every millisecond, with the bags beside them.
    durable_checkpoints: bool,
}

/// What the stateful stage reported: a key's count with an element or
/// with a timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Report {
    Element(u32),
    Timer(u32),
}

/// The fake SDK: the batch source (stage 1, batch only) and the stateful
/// stage, with what the latter reported.
struct Fake {
    case: Case,
    /// The stateful stage's index.
    stateful: StageIdx,
    /// Bundles started (seeds each bundle's choices).
    started: AtomicU64,
    /// Reports per key, in the order they were made.
    reports: Mutex<BTreeMap<Vec<u8>, Vec<Report>>>,
    /// Key groups of each running bundle of the stateful stage.
    running: Mutex<BTreeMap<u64, BTreeSet<u32>>>,
    /// Key groups a bundle started with while another held them.
    overlaps: Mutex<Vec<u32>>,
    /// Bundles split.
    splits: AtomicU64,
}

/// The nested-encoded key of key number `k`.
fn nested_key(k: u8) -> Bytes {
    let key = format!("key-{k}");
    let mut nested = vec![key.len() as u8];
    nested.extend_from_slice(key.as_bytes());
    Bytes::from(nested)
}

/// `KV<key k, [k, round]>` as bare value bytes.
fn kv(k: u8, round: u8) -> Bytes {
    let mut kv = nested_key(k).to_vec();
    kv.extend_from_slice(&[2, k, round]);
    Bytes::from(kv)
}

fn kv_coder() -> Coder {
    Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Bytes))
}

/// The input in arrival order: every key's first element, then every key's
/// second, and so on (so a key's elements spread over bundles), or each
/// key's elements one after another (so a bundle holds a key's elements
/// beside the timers its earlier ones set).
fn arrivals(case: &Case) -> Vec<Bytes> {
    if case.key_by_key {
        (0..case.keys)
            .flat_map(|k| (0..case.per_key).map(move |round| kv(k, round)))
            .collect()
    } else {
        (0..case.per_key)
            .flat_map(|round| (0..case.keys).map(move |k| kv(k, round)))
            .collect()
    }
}

/// An element's key (nested-encoded).
fn key_of(element: &Bytes) -> Bytes {
    let decoded = decode_windowed_values(element, &kv_coder(), &Coder::GlobalWindow)
        .expect("decodes")
        .remove(0);
    let kv = decoded.value_bytes();
    kv.slice(..kv[0] as usize + 1)
}

fn bag(key: &Bytes) -> StateKey {
    StateKey::BagUserState(CellId {
        transform_id: TRANSFORM.into(),
        state_id: BAG.into(),
        window: Bytes::new(),
        key: key.clone(),
    })
}

/// How many values `key`'s bag holds (each append is one 1-byte value).
fn count(state: &dyn BundleState, key: &Bytes) -> u32 {
    let mut values = 0;
    let mut continuation: Option<Bytes> = None;
    loop {
        let page = state
            .get(&bag(key), continuation.as_deref())
            .expect("the bag reads");
        values += page.data.len() / 2;
        match page.continuation {
            Some(next) => continuation = Some(next),
            None => return values as u32,
        }
    }
}

fn timer_family() -> TimerFamily {
    global_timer_family(TRANSFORM, FAMILY)
}

/// A small deterministic generator for a bundle's choices.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn groups(keys: impl IntoIterator<Item = Bytes>) -> BTreeSet<u32> {
    keys.into_iter().map(|k| key_group(&k)).collect()
}

impl Fake {
    async fn stateful_bundle(&self, input: BundleInput) -> BundleOutput {
        let id = self.started.fetch_add(1, Ordering::SeqCst);
        let given = elements(&input);
        let keys: Vec<Bytes> = given.iter().map(key_of).collect();
        let mut fired = Vec::new();
        for t in &input.timers {
            for timer in
                decode_timers(&t.data, &Coder::Bytes, &Coder::GlobalWindow).expect("timers decode")
            {
                fired.push(timer.user_key);
            }
        }
        let held = groups(keys.iter().chain(&fired).cloned());
        {
            let mut running = self.running.lock();
            for other in running.values() {
                self.overlaps.lock().extend(held.intersection(other));
            }
            running.insert(id, held);
        }
        let choice = mix(self.case.seed ^ id);
        let mut done = given.len();
        if !input.split_points.is_empty() && choice % 100 < self.case.split_percent {
            let points = &input.split_points;
            done = points[(choice / 100) as usize % points.len()];
            self.running
                .lock()
                .insert(id, groups(keys[..done].iter().chain(&fired).cloned()));
            input.splits.send(split_at(&given, done));
            self.splits.fetch_add(1, Ordering::SeqCst);
            // Time for what it gave back to start beside it, if the engine
            // lets it (wrongly, if it shares a group with what is kept).
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let state = input.state.as_ref();
        for key in &fired {
            let n = count(state, key);
            self.report(key, Report::Timer(n));
            tokio::task::yield_now().await;
        }
        for key in &keys[..done] {
            let n = count(state, key) + 1;
            state
                .append(&bag(key), Bytes::from_static(&[1, 0]))
                .expect("the bag takes an append");
            self.report(key, Report::Element(n));
            tokio::task::yield_now().await;
        }
        self.running.lock().remove(&id);
        BundleOutput {
            // Due at 10: behind the streaming cases' watermark, so ready as
            // soon as they are set.
            timers: global_timers_at_10(&timer_family(), keys[..done].iter().cloned()),
            ..Default::default()
        }
    }

    fn report(&self, key: &Bytes, report: Report) {
        self.reports
            .lock()
            .entry(key.to_vec())
            .or_default()
            .push(report);
    }
}

struct Executor(Arc<Fake>);

impl StageExecutor for Executor {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let fake = self.0.clone();
        async move {
            if input.stage == fake.stateful {
                return Ok(fake.stateful_bundle(input).await);
            }
            // The batch source: every element in one output.
            let block: Vec<u8> = arrivals(&fake.case)
                .iter()
                .flat_map(|kv| global_windowed(kv, 30))
                .collect();
            Ok(BundleOutput {
                outputs: vec![(PCollectionIdx::new(1), Bytes::from(block))],
                ..Default::default()
            })
        }
        .boxed()
    }
}

/// The stateful stage's kind: a bag and [`timer_family`].
fn stateful_kind() -> StageKind {
    StageKind::Sdk(SdkStage {
        stateful: true,
        timer_families: vec![timer_family()],
        ..SdkStage::default()
    })
}

/// Batch: impulse → source → stateful. Streaming: TestStream (the input in
/// three steps, past the timers' time) → stateful.
fn plan(case: &Case) -> (Plan, StageIdx) {
    if !case.streaming {
        return (
            sourced_plan(kv_coder(), TRANSFORM, stateful_kind()),
            StageIdx::new(2),
        );
    }
    let all = arrivals(case);
    let third = all.len().div_ceil(3).max(1);
    let mut events = vec![TestStreamEvent::Watermark(20)];
    for (step, part) in all.chunks(third).enumerate() {
        events.push(TestStreamEvent::Elements {
            output: PCollectionIdx::new(0),
            elements: part.iter().map(|kv| (kv.clone(), 30)).collect(),
        });
        events.push(TestStreamEvent::Watermark(25 + step as i64));
    }
    let plan = Plan {
        pcollections: vec![global_pcollection("kvs", kv_coder())].into(),
        stages: vec![
            stage("stream", StageKind::TestStream(events), vec![], vec![0]),
            stage(TRANSFORM, stateful_kind(), vec![0], vec![]),
        ]
        .into(),
        names: Default::default(),
    };
    (plan, StageIdx::new(1))
}

fn run_case(case: Case) -> Arc<Fake> {
    let checkpoints = if case.durable_checkpoints {
        Checkpoints::TakenWithDurableState
    } else {
        Checkpoints::None
    };
    run_case_with_summary(case, checkpoints).0
}

/// Whether a run takes periodic checkpoints (every millisecond, taken and
/// dropped), and whether its bags may then spill beside them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checkpoints {
    None,
    Taken,
    TakenWithDurableState,
}

/// [`run_case`], with `checkpoints`; and the bytes of bag state the run
/// spilled.
fn run_case_with_summary(case: Case, checkpoints: Checkpoints) -> (Arc<Fake>, u64) {
    let (plan, stateful) = plan(&case);
    let spill_limit = case.spill_limit;
    let config = EngineConfig {
        max_bundle_elements: case.max_bundle_elements,
        max_bundles_per_stage: case.max_bundles_per_stage,
        streaming: case.streaming,
        ..EngineConfig::default()
    };
    let fake = Arc::new(Fake {
        case,
        stateful,
        started: AtomicU64::new(0),
        reports: Mutex::new(BTreeMap::new()),
        running: Mutex::new(BTreeMap::new()),
        overlaps: Mutex::new(Vec::new()),
        splits: AtomicU64::new(0),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let state_spilled_bytes = runtime.block_on(async {
        let (_cancel, cancelled) = watch::channel(false);
        let mut engine = Engine::builder(
            plan,
            Arc::new(Executor(fake.clone())),
            config,
            "ss",
            Arc::new(|| 0),
        );
        if let Some(limit) = spill_limit {
            engine = engine.spill(MemorySpillSpace::shared(), b"ss", limit);
            // A durable spill space decides where spills go: nothing without them.
            if checkpoints == Checkpoints::TakenWithDurableState {
                engine = engine.durable_state(MemorySpillSpace::shared());
            }
        }
        if checkpoints != Checkpoints::None {
            let (tx, mut rx) = tokio::sync::mpsc::channel(1);
            tokio::spawn(async move { while rx.recv().await.is_some() {} });
            engine = engine.checkpoints(Duration::from_millis(1), tx, None);
        }
        engine
            .build()
            .expect("a valid plan")
            .run(cancelled)
            .await
            .expect("the run succeeds")
            .state_spilled_bytes
    });
    (fake, state_spilled_bytes)
}

prop_compose! {
    fn cases()(
        keys in 1u8..24,
        per_key in 1u8..5,
        max_bundle_elements in prop_oneof![Just(1usize), Just(2), Just(3), Just(7), Just(1000)],
        max_bundles_per_stage in 1usize..5,
        split_percent in prop_oneof![Just(0u64), Just(50), Just(100)],
        seed in any::<u64>(),
        streaming in any::<bool>(),
        key_by_key in any::<bool>(),
        spill_limit in prop_oneof![3 => Just(None), 1 => (1usize..16).prop_map(Some)],
        durable_checkpoints in prop_oneof![3 => Just(false), 1 => Just(true)],
    ) -> Case {
        Case {
            keys,
            per_key,
            max_bundle_elements,
            max_bundles_per_stage,
            split_percent,
            seed,
            streaming,
            key_by_key,
            spill_limit,
            durable_checkpoints,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn each_key_is_processed_serially_and_exactly_once_however_its_bundles_are_split(
        case in cases(),
    ) {
        let fake = run_case(case.clone());
        prop_assert_eq!(fake.overlaps.lock().clone(), Vec::<u32>::new(), "no group in two bundles");
        let reports = fake.reports.lock().clone();
        prop_assert_eq!(reports.len(), case.keys as usize, "every key reported");
        let n = u32::from(case.per_key);
        for (key, reports) in reports {
            let mut counts: Vec<u32> = reports
                .iter()
                .filter_map(|r| match r { Report::Element(c) => Some(*c), _ => None })
                .collect();
            counts.sort_unstable();
            prop_assert_eq!(counts, (1..=n).collect::<Vec<_>>(), "key {:?}: {:?}", key, reports);
            let timers: Vec<u32> = reports
                .iter()
                .filter_map(|r| match r { Report::Timer(c) => Some(*c), _ => None })
                .collect();
            prop_assert!(timers.windows(2).all(|w| w[0] <= w[1]), "key {:?}: {:?}", key, reports);
            prop_assert_eq!(timers.last().copied(), Some(n), "key {:?}: {:?}", key, reports);
            if !case.streaming {
                prop_assert_eq!(timers.len(), 1, "batch: one firing, after all input: {:?}", reports);
            }
        }
    }
}

/// The property's cases do split bundles (a guard against a generator or
/// plan that never lets the engine offer split points).
#[test]
fn the_cases_split_bundles() {
    let fake = run_case(Case {
        keys: 20,
        per_key: 3,
        max_bundle_elements: 1000,
        max_bundles_per_stage: 2,
        split_percent: 100,
        seed: 7,
        streaming: false,
        key_by_key: false,
        spill_limit: None,
        durable_checkpoints: false,
    });
    assert!(fake.splits.load(Ordering::SeqCst) > 0);
    let fake = run_case(Case {
        streaming: true,
        ..fake.case.clone()
    });
    assert!(fake.splits.load(Ordering::SeqCst) > 0);
}

/// Cases with a spill limit do spill their bags, in batch and in streaming
/// (a guard against a limit the bags never pass, or a job kind that keeps
/// them in memory) — but not in a checkpointed streaming job without a
/// durable spill space, whose state could stay on scratch disk for good while no
/// checkpoint may be taken; with one, beside the checkpoints.
#[test]
fn bags_spill_unless_the_job_is_streaming_and_checkpointed_without_a_durable_store() {
    for (streaming, checkpoints, spills) in [
        (false, Checkpoints::None, true),
        (true, Checkpoints::None, true),
        (false, Checkpoints::Taken, true),
        (true, Checkpoints::Taken, false),
        (false, Checkpoints::TakenWithDurableState, true),
        (true, Checkpoints::TakenWithDurableState, true),
    ] {
        let (fake, spilled) = run_case_with_summary(
            Case {
                keys: 8,
                per_key: 3,
                max_bundle_elements: 4,
                max_bundles_per_stage: 2,
                split_percent: 50,
                seed: 11,
                streaming,
                key_by_key: false,
                spill_limit: Some(4),
                durable_checkpoints: false,
            },
            checkpoints,
        );
        assert_eq!(
            spilled > 0,
            spills,
            "streaming {streaming}, {checkpoints:?}: {spilled} bytes spilled"
        );
        assert_eq!(fake.reports.lock().len(), 8, "every key reported");
    }
}
