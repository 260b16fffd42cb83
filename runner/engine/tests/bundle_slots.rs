//! Stages whose workers run one bundle at a time never get two at once.
//!
//! Plan: impulse → source (2 000 elements over 40 keys) → a stateful
//! counter and, beside it, a plain step, all three SDK stages sharing the
//! executor's slots. The fake SDK counts bundles running across all stages
//! and sleeps in each so that overlaps would show. With one slot: never
//! two bundles at once, the stateful stage takes all its keys in one
//! bundle (rather than one per key slice), the step that waited for the
//! slot was seen waiting while the other ran, and every element arrives.
//! Without slots (the control), the same plan does run bundles at once.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use refract_engine::bundle_slots::BundleSlots;
use refract_engine::coder::{decode_windowed_values, Coder};
use refract_engine::executor::{BundleInput, BundleOutput, BundleSplit, ExecError, StageExecutor};
use refract_engine::manager::{Engine, EngineConfig};
use refract_engine::plan::{PCollectionIdx, SdkStage, StageIdx, StageKind};
use tokio::sync::watch;

const KEYS: usize = 40;
const ELEMENTS: usize = 2_000;
const SOURCE: StageIdx = StageIdx::new(1);
const COUNTER: StageIdx = StageIdx::new(2);
const STEP: StageIdx = StageIdx::new(3);

/// The fake SDK: what ran, and how much at once.
struct Sdk {
    slots: Option<Arc<BundleSlots>>,
    running: AtomicUsize,
    most_running: AtomicUsize,
    /// Stage → bundles run and elements seen.
    bundles: Mutex<HashMap<StageIdx, (usize, usize)>>,
    /// A bundle of the counter saw another stage (the step) wait.
    saw_wanted: AtomicBool,
}

impl Sdk {
    fn new(slots: Option<Arc<BundleSlots>>) -> Arc<Self> {
        Arc::new(Sdk {
            slots,
            running: AtomicUsize::new(0),
            most_running: AtomicUsize::new(0),
            bundles: Mutex::default(),
            saw_wanted: AtomicBool::new(false),
        })
    }
}

struct Executor(Arc<Sdk>);

impl StageExecutor for Executor {
    fn bundle_slots(&self, _stage: StageIdx) -> Option<Arc<BundleSlots>> {
        self.0.slots.clone()
    }

    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let sdk = self.0.clone();
        async move {
            let now = sdk.running.fetch_add(1, Ordering::SeqCst) + 1;
            sdk.most_running.fetch_max(now, Ordering::SeqCst);
            let mut outputs = Vec::new();
            let mut seen = 0;
            if input.stage == SOURCE {
                outputs.push((
                    PCollectionIdx::new(1),
                    common::keyed_elements(ELEMENTS, KEYS),
                ));
            } else {
                for chunk in &input.elements {
                    seen += decode_windowed_values(
                        chunk,
                        &common::kv_bytes_coder(),
                        &Coder::GlobalWindow,
                    )
                    .expect("decodes")
                    .len();
                }
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
            if input.stage == COUNTER
                && sdk
                    .slots
                    .as_ref()
                    .is_some_and(|s| s.wanted_by_other_than(COUNTER))
            {
                sdk.saw_wanted.store(true, Ordering::SeqCst);
            }
            {
                let mut bundles = sdk.bundles.lock();
                let entry = bundles.entry(input.stage).or_default();
                entry.0 += 1;
                entry.1 += seen;
            }
            sdk.running.fetch_sub(1, Ordering::SeqCst);
            Ok(BundleOutput {
                outputs,
                ..Default::default()
            })
        }
        .boxed()
    }
}

async fn run(sdk: Arc<Sdk>) {
    let config = EngineConfig {
        max_bundle_elements: 1_000,
        max_bundles_per_stage: 4,
        ..EngineConfig::default()
    };
    let engine = Engine::new(
        common::keyed_source_plan(&[("count", true), ("step", false)]),
        Arc::new(Executor(sdk)),
        config,
        "slots",
        Arc::new(|| 0),
    )
    .expect("a valid plan");
    let (_cancel, cancelled) = watch::channel(false);
    engine.run(cancelled).await.expect("the run succeeds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slot_runs_one_bundle_at_a_time_across_stages() {
    let sdk = Sdk::new(Some(Arc::new(BundleSlots::new(1))));
    run(sdk.clone()).await;

    assert_eq!(sdk.most_running.load(Ordering::SeqCst), 1);
    let bundles = sdk.bundles.lock().clone();
    assert_eq!(bundles.get(&COUNTER).map(|b| b.1), Some(ELEMENTS));
    assert_eq!(bundles.get(&STEP).map(|b| b.1), Some(ELEMENTS));
    // Bundles of at most 1 000 elements: two, however many key slices the
    // stage would have with more slots.
    assert_eq!(bundles.get(&COUNTER).map(|b| b.0), Some(2));
    assert!(
        sdk.saw_wanted.load(Ordering::SeqCst),
        "the step never showed as waiting for a slot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_slots_bundles_of_several_stages_overlap() {
    let sdk = Sdk::new(None);
    run(sdk.clone()).await;

    assert!(sdk.most_running.load(Ordering::SeqCst) >= 2);
    let bundles = sdk.bundles.lock().clone();
    assert_eq!(bundles.get(&COUNTER).map(|b| b.1), Some(ELEMENTS));
    assert_eq!(bundles.get(&STEP).map(|b| b.1), Some(ELEMENTS));
    // Four key slices: more bundles than one slot needs.
    assert!(bundles.get(&COUNTER).is_some_and(|b| b.0 > 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_slots_run_at_most_three_bundles() {
    let sdk = Sdk::new(Some(Arc::new(BundleSlots::new(3))));
    run(sdk.clone()).await;

    let most = sdk.most_running.load(Ordering::SeqCst);
    assert!((2..=3).contains(&most), "{most} bundles at once");
    let bundles = sdk.bundles.lock().clone();
    assert_eq!(bundles.get(&COUNTER).map(|b| b.1), Some(ELEMENTS));
    assert_eq!(bundles.get(&STEP).map(|b| b.1), Some(ELEMENTS));
}

/// A source that defers itself step after step, and its consumer, on one
/// slot: what ran, in order (`(stage, source step)`, step 0 for the sink).
struct Alternating {
    slots: Arc<BundleSlots>,
    ran: Mutex<Vec<(StageIdx, u32)>>,
}

const STEPS: u32 = 6;

/// The executor over the shared record.
struct AlternatingExecutor(Arc<Alternating>);

impl StageExecutor for AlternatingExecutor {
    fn bundle_slots(&self, _stage: StageIdx) -> Option<Arc<BundleSlots>> {
        Some(self.0.slots.clone())
    }

    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let me = self.0.clone();
        async move {
            if input.stage == SOURCE {
                // The next step is given back by a split while this one
                // runs, as a source split for time does: it waits in the
                // queue when this bundle ends, beside the sink's input.
                let step = common::source_step(&input);
                me.ran.lock().push((SOURCE, step));
                input.splits.send(BundleSplit {
                    kept_elements: 1,
                    primaries: Vec::new(),
                    residuals: common::next_source_step(step, STEPS),
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
                return Ok(BundleOutput {
                    outputs: vec![(
                        PCollectionIdx::new(1),
                        common::global_windowed(&[1, b'x'], 0),
                    )],
                    ..Default::default()
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            me.ran.lock().push((input.stage, 0));
            Ok(BundleOutput::default())
        }
        .boxed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_that_waited_for_the_slot_gets_it_before_the_one_that_just_ran() {
    let sdk = Arc::new(Alternating {
        slots: Arc::new(BundleSlots::new(1)),
        ran: Mutex::default(),
    });
    let plan = common::sourced_plan(Coder::Bytes, "sink", StageKind::Sdk(SdkStage::default()));
    let engine = Engine::new(
        plan,
        Arc::new(AlternatingExecutor(sdk.clone())),
        EngineConfig::default(),
        "fair",
        Arc::new(|| 0),
    )
    .expect("a valid plan");
    let (_cancel, cancelled) = watch::channel(false);
    engine.run(cancelled).await.expect("the run succeeds");

    let ran = sdk.ran.lock().clone();
    let steps: Vec<u32> = ran
        .iter()
        .filter(|(stage, _)| *stage == SOURCE)
        .map(|(_, step)| *step)
        .collect();
    assert_eq!(steps, (0..STEPS).collect::<Vec<_>>(), "{ran:?}");
    // The sink, upstream's consumer, runs between the source's steps
    // instead of after all of them.
    let first_sink = ran.iter().position(|(stage, _)| *stage == StageIdx::new(2));
    assert!(first_sink.is_some_and(|at| at <= 2), "{ran:?}");
    assert!(
        ran.iter()
            .filter(|(stage, _)| *stage == StageIdx::new(2))
            .count()
            >= 3,
        "{ran:?}"
    );
}
