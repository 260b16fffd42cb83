//! A split of a running bundle takes effect at once: the work split off
//! runs beside the bundle, and if the bundle then fails, its retry does
//! only what it kept — every position is still emitted exactly once.
//!
//! Plan: impulse → make (one restriction [0, 100)) → read (splittable) →
//! sink. The first attempt of the bundle reading [0, 100) splits at 50,
//! waits until the residual's bundle has started, then fails.
//!
//! A bundle of a stage that is not splittable is split at an element (a
//! channel split): the elements after the split point run as a bundle of
//! their own, each exactly once.
//!
//! A stateful stage's bundle gets its elements grouped by key group, may
//! be split only between groups, and once split lets go of the groups it
//! gave back: their bundle runs while it still runs. The same holds for a
//! stage with timers: every element's timer, set by whichever bundle ran
//! it, fires exactly once.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

use bytes::Bytes;
use common::{
    elements, global_pcollection, global_timer_family, global_timers_at_10, global_windowed,
    sourced_plan, split_at, stage,
};
use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use refract_engine::coder::{decode_timers, decode_windowed_values, Coder};
use refract_engine::executor::{
    BundleInput, BundleOutput, BundleSplit, ExecError, Residual, StageExecutor, TimerInput,
};
use refract_engine::manager::{Engine, EngineConfig};
use refract_engine::plan::{
    PCollectionIdx, Plan, SdkStage, StageKind, TestStreamEvent, TimerFamily,
};
use tokio::sync::{watch, Notify};

#[derive(Default)]
struct Reader {
    /// The residual's bundle started.
    residual_started: Notify,
    failed_once: AtomicBool,
    /// Ranges each attempt of the read stage was given.
    attempts: Mutex<Vec<(u8, u8)>>,
    /// Positions the sink got, with how often.
    seen: Mutex<BTreeMap<u8, usize>>,
}

fn restriction(from: u8, to: u8) -> Bytes {
    global_windowed(&[2, from, to], 0)
}

fn values(chunks: &[Bytes]) -> Vec<Bytes> {
    chunks
        .iter()
        .flat_map(|c| {
            decode_windowed_values(c, &Coder::Bytes, &Coder::GlobalWindow).expect("decodes")
        })
        .map(|e| e.value_bytes())
        .collect()
}

/// A bundle's output: the one-byte numbers `numbers` on `pcollection`.
fn numbered(pcollection: PCollectionIdx, numbers: impl IntoIterator<Item = u8>) -> BundleOutput {
    let mut out = Vec::new();
    for n in numbers {
        out.extend_from_slice(&global_windowed(&[1, n], 0));
    }
    BundleOutput {
        outputs: vec![(pcollection, Bytes::from(out))],
        ..Default::default()
    }
}

/// The sink: counts the numbers it is given.
fn count_into(seen: &Mutex<BTreeMap<u8, usize>>, input: &BundleInput) -> BundleOutput {
    let mut seen = seen.lock();
    for v in values(&input.elements) {
        *seen.entry(v[1]).or_default() += 1;
    }
    BundleOutput::default()
}

struct Fake(Arc<Reader>);

impl StageExecutor for Fake {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let me = self.0.clone();
        async move {
            match input.stage.index() {
                1 => Ok(BundleOutput {
                    outputs: vec![(PCollectionIdx::new(1), restriction(0, 100))],
                    ..Default::default()
                }),
                2 => {
                    let given = values(&input.elements);
                    let (from, to) = (given[0][1], given[0][2]);
                    me.attempts.lock().push((from, to));
                    if (from, to) == (0, 100) && !me.failed_once.swap(true, Ordering::SeqCst) {
                        input.splits.send(BundleSplit {
                            kept_elements: 0,
                            primaries: vec![restriction(0, 50)],
                            residuals: vec![Residual {
                                element: restriction(50, 100),
                                delay_ms: 0,
                                watermark: None,
                            }],
                        });
                        tokio::time::timeout(
                            Duration::from_secs(5),
                            me.residual_started.notified(),
                        )
                        .await
                        .map_err(|_| ExecError::Sdk("the residual never started".into()))?;
                        return Err(ExecError::Sdk("failing after the split".into()));
                    }
                    if from == 50 {
                        me.residual_started.notify_one();
                    }
                    Ok(numbered(PCollectionIdx::new(2), from..to))
                }
                _ => Ok(count_into(&me.seen, &input)),
            }
        }
        .boxed()
    }
}

fn sdk(splittable: bool) -> StageKind {
    StageKind::Sdk(SdkStage {
        splittable,
        ..SdkStage::default()
    })
}

/// impulse → make → read (splittable or not) → sink.
fn plan(splittable: bool) -> Plan {
    Plan {
        pcollections: vec![
            global_pcollection("impulse", Coder::Bytes),
            global_pcollection("inputs", Coder::Bytes),
            global_pcollection("outputs", Coder::Bytes),
        ]
        .into(),
        stages: vec![
            stage("impulse", StageKind::Impulse, vec![], vec![0]),
            stage("make", sdk(false), vec![0], vec![1]),
            stage("read", sdk(splittable), vec![1], vec![2]),
            stage("sink", sdk(false), vec![2], vec![]),
        ]
        .into(),
        names: Default::default(),
    }
}

/// Runs `plan` on `executor` to the end.
async fn run(plan: Plan, executor: Arc<dyn StageExecutor>, config: EngineConfig) {
    let (_cancel, cancelled) = watch::channel(false);
    Engine::new(plan, executor, config, "sp", Arc::new(|| 0))
        .expect("a valid plan")
        .run(cancelled)
        .await
        .expect("the run succeeds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_runs_its_residual_at_once_and_a_retry_redoes_only_the_primary() {
    let reader = Arc::new(Reader::default());
    let config = EngineConfig {
        retry_backoff: Duration::from_millis(1),
        ..EngineConfig::default()
    };
    run(plan(true), Arc::new(Fake(reader.clone())), config).await;
    let attempts = reader.attempts.lock().clone();
    assert_eq!(
        attempts,
        vec![(0, 100), (50, 100), (0, 50)],
        "the residual ran beside the first attempt; the retry had only the primary"
    );
    let seen = reader.seen.lock().clone();
    let want: BTreeMap<u8, usize> = (0..100).map(|n| (n, 1)).collect();
    assert_eq!(seen, want, "every position exactly once");
}

/// Elements the channel-split test's source emits, in one block.
const ELEMENTS: u8 = 10;

/// Where the channel-split test's fan-out bundle is split.
const KEPT: usize = 3;

#[derive(Default)]
struct FanOut {
    /// The elements each attempt of the fan-out stage was given.
    attempts: Mutex<Vec<Vec<u8>>>,
    /// Elements the sink got, with how often.
    seen: Mutex<BTreeMap<u8, usize>>,
}

struct FanOutFake(Arc<FanOut>);

impl StageExecutor for FanOutFake {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let me = self.0.clone();
        async move {
            match input.stage.index() {
                1 => Ok(numbered(PCollectionIdx::new(1), 0..ELEMENTS)),
                2 => {
                    let given = elements(&input);
                    let numbers: Vec<u8> = values(&given).iter().map(|v| v[1]).collect();
                    let first = me.attempts.lock().is_empty();
                    me.attempts.lock().push(numbers.clone());
                    let mut done = numbers.as_slice();
                    if first {
                        // The SDK stops after the first KEPT elements and
                        // hands back the rest.
                        input.splits.send(split_at(&given, KEPT));
                        done = &numbers[..KEPT];
                    }
                    Ok(numbered(PCollectionIdx::new(2), done.iter().copied()))
                }
                _ => Ok(count_into(&me.seen, &input)),
            }
        }
        .boxed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_split_at_an_element_runs_the_elements_after_it_once() {
    let fan_out = Arc::new(FanOut::default());
    run(
        plan(false),
        Arc::new(FanOutFake(fan_out.clone())),
        EngineConfig::default(),
    )
    .await;
    let attempts = fan_out.attempts.lock().clone();
    assert_eq!(
        attempts,
        vec![
            (0..ELEMENTS).collect::<Vec<_>>(),
            (KEPT as u8..ELEMENTS).collect()
        ],
        "one bundle of every element, then one of those after the split"
    );
    let seen = fan_out.seen.lock().clone();
    let want: BTreeMap<u8, usize> = (0..ELEMENTS).map(|n| (n, 1)).collect();
    assert_eq!(seen, want, "every element's output exactly once");
}

/// Keys of the stateful split test (one element each).
const KEYS: u8 = 60;

#[derive(Default)]
struct Keyed {
    /// The first bundle of the stateful stage that had more than one key
    /// group has been seen.
    split_one: AtomicBool,
    /// The elements it gave back (their first bytes).
    given_back: Mutex<Vec<u8>>,
    /// A bundle holding some of them started.
    given_back_started: Notify,
    /// ... while the bundle that gave them back still ran.
    ran_beside: AtomicBool,
    /// Elements the stateful stage processed, with how often.
    seen: Mutex<BTreeMap<u8, usize>>,
    /// Whether each element sets a timer for its key (the stage declares
    /// [`timer_family`]).
    with_timers: bool,
    /// Timers that fired, by key, with how often.
    fired: Mutex<BTreeMap<Vec<u8>, usize>>,
}

/// The stateful stage's one event-time timer family.
fn timer_family() -> TimerFamily {
    global_timer_family("stateful", "done")
}

/// A timer of [`timer_family`] for each of `keys` (nested-encoded).
fn timers_for(keys: impl IntoIterator<Item = Bytes>) -> Vec<TimerInput> {
    global_timers_at_10(&timer_family(), keys)
}

fn kv_coder() -> Coder {
    Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Bytes))
}

/// Element `n`: key `key-n`, value `[n]`.
fn keyed_element(n: u8) -> Bytes {
    let key = format!("key-{n}");
    let mut kv = vec![key.len() as u8];
    kv.extend_from_slice(key.as_bytes());
    kv.extend_from_slice(&[1, n]);
    global_windowed(&kv, 0)
}

/// An element's number and key group.
fn number_and_group(element: &Bytes) -> (u8, u32) {
    let (n, key) = number_and_key(element);
    (n, refract_engine::key_groups::key_group(&key))
}

/// An element's number and key (nested-encoded).
fn number_and_key(element: &Bytes) -> (u8, Bytes) {
    let decoded = decode_windowed_values(element, &kv_coder(), &Coder::GlobalWindow)
        .expect("decodes")
        .remove(0);
    let kv = decoded.value_bytes();
    let key_len = kv[0] as usize;
    (kv[key_len + 2], kv.slice(..key_len + 1))
}

struct KeyedFake(Arc<Keyed>);

impl StageExecutor for KeyedFake {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let me = self.0.clone();
        async move {
            match input.stage.index() {
                1 => {
                    let mut block = Vec::new();
                    for n in 0..KEYS {
                        block.extend_from_slice(&keyed_element(n));
                    }
                    Ok(BundleOutput {
                        outputs: vec![(PCollectionIdx::new(1), Bytes::from(block))],
                        ..Default::default()
                    })
                }
                _ => {
                    for t in &input.timers {
                        let fired = decode_timers(&t.data, &Coder::Bytes, &Coder::GlobalWindow)
                            .expect("timers decode");
                        let mut seen = me.fired.lock();
                        for timer in fired {
                            *seen.entry(timer.user_key.to_vec()).or_default() += 1;
                        }
                    }
                    let given = elements(&input);
                    let numbered: Vec<(u8, u32)> = given.iter().map(number_and_group).collect();
                    // Grouped by key group, split points between groups.
                    let groups: Vec<u32> = numbered.iter().map(|&(_, g)| g).collect();
                    assert!(groups.windows(2).all(|w| w[0] <= w[1]), "{groups:?}");
                    let boundaries: Vec<usize> = (1..groups.len())
                        .filter(|&i| groups[i] != groups[i - 1])
                        .collect();
                    assert_eq!(input.split_points, boundaries);
                    // (A bundle of timers alone has no elements.)
                    let first = numbered.first().map(|&(n, _)| n);
                    if me.given_back.lock().iter().any(|n| Some(*n) == first) {
                        me.given_back_started.notify_one();
                    }
                    let mut done = numbered.len();
                    if !boundaries.is_empty() && !me.split_one.swap(true, Ordering::SeqCst) {
                        // Split at the middle group boundary, then keep
                        // running until the elements given back start.
                        done = boundaries[boundaries.len() / 2];
                        me.given_back
                            .lock()
                            .extend(numbered[done..].iter().map(|&(n, _)| n));
                        input.splits.send(split_at(&given, done));
                        let started = tokio::time::timeout(
                            Duration::from_secs(5),
                            me.given_back_started.notified(),
                        )
                        .await;
                        me.ran_beside.store(started.is_ok(), Ordering::SeqCst);
                    }
                    let mut seen = me.seen.lock();
                    for &(n, _) in &numbered[..done] {
                        *seen.entry(n).or_default() += 1;
                    }
                    let timers = if me.with_timers {
                        timers_for(given[..done].iter().map(|e| number_and_key(e).1))
                    } else {
                        Vec::new()
                    };
                    Ok(BundleOutput {
                        timers,
                        ..Default::default()
                    })
                }
            }
        }
        .boxed()
    }
}

/// Runs the stateful plan (with [`timer_family`] if `keyed.with_timers`)
/// with two bundles per stage and checks that a bundle was split, that what
/// it gave back ran beside it, and that each element ran once.
async fn run_keyed(keyed: Arc<Keyed>) {
    let timer_families = if keyed.with_timers {
        vec![timer_family()]
    } else {
        Vec::new()
    };
    let plan = sourced_plan(
        kv_coder(),
        "stateful",
        StageKind::Sdk(SdkStage {
            stateful: true,
            timer_families,
            ..SdkStage::default()
        }),
    );
    let config = EngineConfig {
        max_bundles_per_stage: 2,
        ..EngineConfig::default()
    };
    run(plan, Arc::new(KeyedFake(keyed.clone())), config).await;
    assert!(keyed.split_one.load(Ordering::SeqCst), "a bundle was split");
    assert!(
        keyed.ran_beside.load(Ordering::SeqCst),
        "what it gave back ran while it still ran"
    );
    let seen = keyed.seen.lock().clone();
    let want: BTreeMap<u8, usize> = (0..KEYS).map(|n| (n, 1)).collect();
    assert_eq!(seen, want, "every element exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateful_bundle_split_between_key_groups_lets_the_groups_it_gave_back_run_beside_it() {
    run_keyed(Arc::new(Keyed::default())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_of_a_stage_with_timers_is_split_too_and_every_timer_fires_once() {
    let keyed = Arc::new(Keyed {
        with_timers: true,
        ..Keyed::default()
    });
    run_keyed(keyed.clone()).await;
    let fired = keyed.fired.lock().clone();
    let want: BTreeMap<Vec<u8>, usize> = (0..KEYS)
        .map(|n| (number_and_key(&keyed_element(n)).1.to_vec(), 1))
        .collect();
    assert_eq!(fired, want, "each key's timer fired once");
}

/// What the streaming stateful stage saw, and what its bundles held.
#[derive(Default)]
struct Streamed {
    /// Key groups of each bundle running now: those of its elements (what
    /// it kept, once split) and of its timers.
    running: Mutex<BTreeMap<usize, BTreeSet<u32>>>,
    /// Bundles started so far (their ids).
    started: AtomicUsize,
    /// Key groups a bundle started with while another running bundle held
    /// them.
    overlaps: Mutex<Vec<u32>>,
    /// A bundle with both timers and elements of several key groups was
    /// split.
    split_one: AtomicBool,
    /// Elements processed (their numbers), with how often.
    seen: Mutex<BTreeMap<u8, usize>>,
    /// Timers that fired, by key, with how often.
    fired: Mutex<BTreeMap<Vec<u8>, usize>>,
}

/// Element `value` of key `key-{n}`, as the TestStream emits it (a bare
/// `KV`).
fn bare_kv(n: u8, value: u8) -> Bytes {
    let key = format!("key-{n}");
    let mut kv = vec![key.len() as u8];
    kv.extend_from_slice(key.as_bytes());
    kv.extend_from_slice(&[1, value]);
    Bytes::from(kv)
}

struct StreamedFake(Arc<Streamed>);

impl StageExecutor for StreamedFake {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let me = self.0.clone();
        async move {
            let id = me.started.fetch_add(1, Ordering::SeqCst);
            let given = elements(&input);
            let numbered: Vec<(u8, Bytes)> = given.iter().map(number_and_key).collect();
            let mut timer_keys = Vec::new();
            for t in &input.timers {
                for timer in decode_timers(&t.data, &Coder::Bytes, &Coder::GlobalWindow)
                    .expect("timers decode")
                {
                    timer_keys.push(timer.user_key);
                }
            }
            let groups_of = |keys: &mut dyn Iterator<Item = &Bytes>| -> BTreeSet<u32> {
                keys.map(|k| refract_engine::key_groups::key_group(k))
                    .collect()
            };
            let held = groups_of(&mut numbered.iter().map(|(_, k)| k).chain(&timer_keys));
            {
                let mut running = me.running.lock();
                for other in running.values() {
                    me.overlaps.lock().extend(held.intersection(other));
                }
                running.insert(id, held);
            }
            let mut done = numbered.len();
            if !timer_keys.is_empty()
                && !input.split_points.is_empty()
                && !me.split_one.swap(true, Ordering::SeqCst)
            {
                // Give back the groups after the middle boundary, then keep
                // running a while: a group freed too early would start a
                // bundle beside this one.
                done = input.split_points[input.split_points.len() / 2];
                let kept =
                    groups_of(&mut numbered[..done].iter().map(|(_, k)| k).chain(&timer_keys));
                me.running.lock().insert(id, kept);
                input.splits.send(split_at(&given, done));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            {
                let mut seen = me.seen.lock();
                for (n, _) in &numbered[..done] {
                    *seen.entry(*n).or_default() += 1;
                }
                let mut fired = me.fired.lock();
                for key in &timer_keys {
                    *fired.entry(key.to_vec()).or_default() += 1;
                }
            }
            me.running.lock().remove(&id);
            // Each element sets its key's timer, due at once (behind the
            // watermark), so the next bundle of its slice fires it beside
            // the elements still waiting.
            Ok(BundleOutput {
                timers: timers_for(numbered[..done].iter().map(|(_, k)| k.clone())),
                ..Default::default()
            })
        }
        .boxed()
    }
}

// Paused time: the executor's wait after handing back a split ends only
// once every task is idle, so a key group freed too early has had every
// chance to start a bundle beside the running one, and no wall time passes.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_streaming_bundle_split_with_timers_keeps_the_key_groups_of_its_timers() {
    // Two elements per key, all keys' first ones first, in one TestStream
    // event past the timers' time: bundles of ten elements each set their
    // keys' timers, which fire in later bundles of the same slice together
    // with waiting elements.
    let mut elements: Vec<(Bytes, i64)> = (0..KEYS).map(|n| (bare_kv(n, n), 30)).collect();
    elements.extend((0..KEYS).map(|n| (bare_kv(n, n + 100), 30)));
    let plan = Plan {
        pcollections: vec![global_pcollection("kvs", kv_coder())].into(),
        stages: vec![
            stage(
                "stream",
                StageKind::TestStream(vec![
                    TestStreamEvent::Watermark(20),
                    TestStreamEvent::Elements {
                        output: PCollectionIdx::new(0),
                        elements,
                    },
                ]),
                vec![],
                vec![0],
            ),
            stage(
                "stateful",
                StageKind::Sdk(SdkStage {
                    stateful: true,
                    timer_families: vec![timer_family()],
                    ..SdkStage::default()
                }),
                vec![0],
                vec![],
            ),
        ]
        .into(),
        names: Default::default(),
    };
    let config = EngineConfig {
        max_bundles_per_stage: 2,
        max_bundle_elements: 10,
        streaming: true,
        ..EngineConfig::default()
    };
    let streamed = Arc::new(Streamed::default());
    run(plan, Arc::new(StreamedFake(streamed.clone())), config).await;
    assert!(
        streamed.split_one.load(Ordering::SeqCst),
        "a bundle with timers was split"
    );
    assert_eq!(
        *streamed.overlaps.lock(),
        Vec::<u32>::new(),
        "no key group in two running bundles"
    );
    let want: BTreeMap<u8, usize> = (0..KEYS).flat_map(|n| [(n, 1), (n + 100, 1)]).collect();
    assert_eq!(*streamed.seen.lock(), want, "every element exactly once");
    let fired = streamed.fired.lock();
    assert!(
        fired.values().all(|&n| (1..=2).contains(&n)) && fired.len() == KEYS as usize,
        "each key's timer fired once or twice (set again after it fired): {fired:?}"
    );
}
