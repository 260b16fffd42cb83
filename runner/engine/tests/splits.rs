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
//! gave back: their bundle runs while it still runs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

use bytes::Bytes;
use common::{global_pcollection, stage};
use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use refract_engine::coder::{
    decode_windowed_values, encode_windowed_value, Coder, PaneInfo, WindowedValueHeader,
};
use refract_engine::executor::{
    BundleInput, BundleOutput, BundleSplit, ExecError, Residual, StageExecutor,
};
use refract_engine::manager::{Engine, EngineConfig};
use refract_engine::plan::{Plan, SdkStage, StageKind};
use refract_engine::window::Window;
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

fn windowed(value: &[u8]) -> Bytes {
    let header = WindowedValueHeader {
        timestamp: 0,
        windows: smallvec::smallvec![Window::Global],
        pane: PaneInfo::NO_FIRING,
    };
    let mut out = Vec::new();
    encode_windowed_value(&header, &Coder::GlobalWindow, value, &mut out).expect("encodes");
    Bytes::from(out)
}

fn restriction(from: u8, to: u8) -> Bytes {
    windowed(&[2, from, to])
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
fn numbered(pcollection: usize, numbers: impl IntoIterator<Item = u8>) -> BundleOutput {
    let mut out = Vec::new();
    for n in numbers {
        out.extend_from_slice(&windowed(&[1, n]));
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
            match input.stage {
                1 => Ok(BundleOutput {
                    outputs: vec![(1, restriction(0, 100))],
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
                    Ok(numbered(2, from..to))
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
        ],
        stages: vec![
            stage("impulse", StageKind::Impulse, vec![], vec![0]),
            stage("make", sdk(false), vec![0], vec![1]),
            stage("read", sdk(splittable), vec![1], vec![2]),
            stage("sink", sdk(false), vec![2], vec![]),
        ],
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

/// The input elements of a bundle, one `Bytes` each, by their lengths.
fn elements(input: &BundleInput) -> Vec<Bytes> {
    let all: Vec<u8> = input.elements.iter().flat_map(|c| c.to_vec()).collect();
    let all = Bytes::from(all);
    let mut at = 0;
    input
        .element_lengths
        .iter()
        .map(|&len| {
            let element = all.slice(at..at + len);
            at += len;
            element
        })
        .collect()
}

/// A channel split of a bundle of `elements` that keeps the first `kept`
/// and gives back the rest.
fn split_at(elements: &[Bytes], kept: usize) -> BundleSplit {
    BundleSplit {
        kept_elements: kept,
        primaries: Vec::new(),
        residuals: elements[kept..]
            .iter()
            .map(|e| Residual {
                element: e.clone(),
                delay_ms: 0,
                watermark: None,
            })
            .collect(),
    }
}

struct FanOutFake(Arc<FanOut>);

impl StageExecutor for FanOutFake {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let me = self.0.clone();
        async move {
            match input.stage {
                1 => Ok(numbered(1, 0..ELEMENTS)),
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
                    Ok(numbered(2, done.iter().copied()))
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
    windowed(&kv)
}

/// An element's number and key group.
fn number_and_group(element: &Bytes) -> (u8, u32) {
    let decoded = decode_windowed_values(element, &kv_coder(), &Coder::GlobalWindow)
        .expect("decodes")
        .remove(0);
    let kv = decoded.value_bytes();
    let key_len = kv[0] as usize;
    (
        kv[key_len + 2],
        refract_engine::key_groups::key_group(&kv[..key_len + 1]),
    )
}

struct KeyedFake(Arc<Keyed>);

impl StageExecutor for KeyedFake {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let me = self.0.clone();
        async move {
            match input.stage {
                1 => {
                    let mut block = Vec::new();
                    for n in 0..KEYS {
                        block.extend_from_slice(&keyed_element(n));
                    }
                    Ok(BundleOutput {
                        outputs: vec![(1, Bytes::from(block))],
                        ..Default::default()
                    })
                }
                _ => {
                    let given = elements(&input);
                    let numbered: Vec<(u8, u32)> = given.iter().map(number_and_group).collect();
                    // Grouped by key group, split points between groups.
                    let groups: Vec<u32> = numbered.iter().map(|&(_, g)| g).collect();
                    assert!(groups.windows(2).all(|w| w[0] <= w[1]), "{groups:?}");
                    let boundaries: Vec<usize> = (1..groups.len())
                        .filter(|&i| groups[i] != groups[i - 1])
                        .collect();
                    assert_eq!(input.split_points, boundaries);
                    if me.given_back.lock().iter().any(|n| *n == numbered[0].0) {
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
                    Ok(BundleOutput::default())
                }
            }
        }
        .boxed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateful_bundle_split_between_key_groups_lets_the_groups_it_gave_back_run_beside_it() {
    let keyed = Arc::new(Keyed::default());
    let plan = Plan {
        pcollections: vec![
            global_pcollection("impulse", Coder::Bytes),
            global_pcollection("kvs", kv_coder()),
        ],
        stages: vec![
            stage("impulse", StageKind::Impulse, vec![], vec![0]),
            stage("source", sdk(false), vec![0], vec![1]),
            stage(
                "stateful",
                StageKind::Sdk(SdkStage {
                    stateful: true,
                    ..SdkStage::default()
                }),
                vec![1],
                vec![],
            ),
        ],
    };
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
