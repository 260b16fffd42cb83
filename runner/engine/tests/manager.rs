//! Engine tests with no SDK: a fake executor plays the SDK stages, so that
//! scheduling, watermarks, grouping, side inputs, timers and bundle
//! transactions are checked on their own, under several bundle shapes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use refract_engine::coder::{
    decode_timers, decode_windowed_values, encode_varint_i64, encode_windowed_value, Coder,
    PaneInfo, TimerValue, WindowedValueHeader,
};
use refract_engine::executor::{BundleInput, BundleOutput, ExecError, StageExecutor, TimerInput};
use refract_engine::manager::{Engine, EngineConfig, EngineError};
use refract_engine::plan::{
    PCollection, PCollectionIdx, Plan, SdkStage, SideInput, SideInputAccess, SideInputId, Stage,
    StageIdx, StageKind, TestStreamEvent, TimeDomain, TimerFamily, Trigger, WindowExpiration,
    WindowFn, WindowingStrategy,
};
use refract_engine::state::{CellId, StateKey};
use refract_engine::window::Window;
use tokio::sync::watch;

fn kv_bytes_varint() -> Coder {
    Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Varint))
}

fn pc(id: &str, value: Coder, window: Coder) -> PCollection {
    PCollection {
        id: id.into(),
        value_coder: value,
        window_coder: window,
        bounded: true,
    }
}

/// An SDK stage reading and writing the PCollections numbered `inputs`
/// and `outputs`.
fn sdk_stage(name: &str, inputs: Vec<usize>, outputs: Vec<usize>) -> Stage {
    Stage {
        name: name.into(),
        kind: StageKind::Sdk(SdkStage::default()),
        inputs: inputs.into_iter().map(PCollectionIdx::new).collect(),
        side_inputs: vec![],
        outputs: outputs.into_iter().map(PCollectionIdx::new).collect(),
    }
}

/// What each fake SDK stage does with a bundle.
type StageFn = Arc<dyn Fn(&BundleInput) -> Result<BundleOutput, ExecError> + Send + Sync>;

struct FakeExecutor {
    /// By stage number.
    stages: BTreeMap<usize, StageFn>,
    bundles: AtomicUsize,
}

impl StageExecutor for FakeExecutor {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        self.bundles.fetch_add(1, Ordering::SeqCst);
        let f = self.stages.get(&input.stage.index()).cloned();
        async move {
            match f {
                Some(f) => f(&input),
                None => Err(ExecError::Runner("no such stage".into())),
            }
        }
        .boxed()
    }
}

fn encode_kv(key: &str, value: i64, ts: i64, window: &Window, wcoder: &Coder, out: &mut Vec<u8>) {
    let mut v = Vec::new();
    v.push(key.len() as u8);
    v.extend_from_slice(key.as_bytes());
    encode_varint_i64(value, &mut v);
    let header = WindowedValueHeader {
        timestamp: ts,
        windows: smallvec::smallvec![window.clone()],
        pane: PaneInfo::NO_FIRING,
    };
    encode_windowed_value(&header, wcoder, &v, out).unwrap();
}

/// Groups seen by the fake sink: (key, encoded iterable of values, window).
type Records = Arc<Mutex<Vec<(String, Vec<u8>, Window)>>>;

/// Impulse -> "source" (emits KVs into fixed windows) -> GBK -> "sink" (records groups).
/// `failing_sink_attempts`: how many sink bundles fail before they succeed.
fn gbk_pipeline(records: Records, failing_sink_attempts: usize) -> (Plan, FakeExecutor) {
    let grouped = Coder::Kv(
        Box::new(Coder::Bytes),
        Box::new(Coder::Iterable(Box::new(Coder::Varint))),
    );
    let plan = Plan {
        pcollections: vec![
            pc("impulse", Coder::Bytes, Coder::GlobalWindow),
            pc("kvs", kv_bytes_varint(), Coder::IntervalWindow),
            pc("grouped", grouped.clone(), Coder::IntervalWindow),
        ]
        .into(),
        stages: vec![
            impulse_stage(),
            sdk_stage("source", vec![0], vec![1]),
            Stage {
                name: "gbk".into(),
                kind: StageKind::GroupByKey(WindowingStrategy {
                    window_fn: WindowFn::Fixed {
                        size: 10,
                        offset: 0,
                    },
                    ..WindowingStrategy::global_default()
                }),
                inputs: vec![PCollectionIdx::new(1)],
                side_inputs: vec![],
                outputs: vec![PCollectionIdx::new(2)],
            },
            sdk_stage("sink", vec![2], vec![]),
        ]
        .into(),
    };
    let source: StageFn = Arc::new(|_input| {
        let mut out = Vec::new();
        for (i, key) in ["a", "b", "a", "c", "a", "b"].iter().enumerate() {
            let ts = (i as i64) * 4;
            let start = ts - ts % 10;
            let w = Window::Interval {
                start,
                end: start + 10,
            };
            encode_kv(key, i as i64, ts, &w, &Coder::IntervalWindow, &mut out);
        }
        Ok(BundleOutput {
            outputs: vec![(PCollectionIdx::new(1), Bytes::from(out))],
            ..Default::default()
        })
    });
    let failed = Arc::new(AtomicUsize::new(0));
    let sink: StageFn = Arc::new(move |input| {
        if failed.fetch_add(1, Ordering::SeqCst) < failing_sink_attempts {
            return Err(ExecError::Sdk(
                "Traceback: boom [while running 'sink']".into(),
            ));
        }
        for chunk in &input.elements {
            for e in decode_windowed_values(chunk, &grouped, &Coder::IntervalWindow).unwrap() {
                let key_len = grouped.kv_key_len(e.value()).unwrap();
                let key = String::from_utf8(e.value()[1..key_len].to_vec()).unwrap();
                records.lock().push((
                    key,
                    e.value()[key_len..].to_vec(),
                    e.header.windows[0].clone(),
                ));
            }
        }
        Ok(BundleOutput::default())
    });
    let exec = FakeExecutor {
        stages: [(1, source), (3, sink)].into_iter().collect(),
        bundles: AtomicUsize::new(0),
    };
    (plan, exec)
}

fn fast_retries(max_bundle_elements: usize) -> EngineConfig {
    EngineConfig {
        retry_backoff: std::time::Duration::from_millis(1),
        ..config(max_bundle_elements)
    }
}

fn config(max_bundle_elements: usize) -> EngineConfig {
    EngineConfig {
        max_bundle_elements,
        ..EngineConfig::default()
    }
}

async fn run(plan: Plan, exec: FakeExecutor, cfg: EngineConfig) -> Result<usize, EngineError> {
    let exec = Arc::new(exec);
    let (_tx, rx) = watch::channel(false);
    let engine = Engine::new(plan, exec.clone(), cfg, "test", Arc::new(|| 0))?;
    engine.run(rx).await?;
    Ok(exec.bundles.load(Ordering::SeqCst))
}

#[tokio::test]
async fn groups_by_key_and_window_under_every_bundle_shape() {
    let mut results = Vec::new();
    for shape in [1, 2, 100_000] {
        let records = Arc::new(Mutex::new(Vec::new()));
        let (plan, exec) = gbk_pipeline(records.clone(), 0);
        run(plan, exec, config(shape)).await.unwrap();
        let mut r = records.lock().clone();
        r.sort();
        results.push(r);
    }
    let w = |s| Window::Interval {
        start: s,
        end: s + 10,
    };
    // a@0,a@8 in [0,10); b@4 in [0,10); c@12 in [10,20); a@16 in [10,20); b@20 in [20,30).
    assert_eq!(
        results[0],
        vec![
            ("a".to_string(), vec![0, 0, 0, 1, 4], w(10)),
            ("a".to_string(), vec![0, 0, 0, 2, 0, 2], w(0)),
            ("b".to_string(), vec![0, 0, 0, 1, 1], w(0)),
            ("b".to_string(), vec![0, 0, 0, 1, 5], w(20)),
            ("c".to_string(), vec![0, 0, 0, 1, 3], w(10)),
        ]
    );
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0], results[2]);
}

/// A GroupByKey whose output only another GroupByKey reads: the firing is
/// handed over as bytes (no elements made), and every group arrives,
/// grouped again, under every bundle shape.
#[tokio::test]
async fn a_groupbykey_feeding_only_a_groupbykey_hands_over_every_group() {
    let regrouped = Coder::Kv(
        Box::new(Coder::Bytes),
        Box::new(Coder::Iterable(Box::new(Coder::Iterable(Box::new(
            Coder::Varint,
        ))))),
    );
    for shape in [1, 100_000] {
        let (mut plan, mut exec) = gbk_pipeline(Arc::new(Mutex::new(Vec::new())), 0);
        let gbk = plan.stages[StageIdx::new(2)].clone();
        plan.pcollections
            .push(pc("regrouped", regrouped.clone(), Coder::IntervalWindow));
        plan.stages[StageIdx::new(3)] = Stage {
            name: "regroup".into(),
            inputs: vec![PCollectionIdx::new(2)],
            outputs: vec![PCollectionIdx::new(3)],
            ..gbk
        };
        plan.stages.push(sdk_stage("sink", vec![3], vec![]));
        let records: Records = Arc::new(Mutex::new(Vec::new()));
        let (seen, coder) = (records.clone(), regrouped.clone());
        let sink: StageFn = Arc::new(move |input| {
            for chunk in &input.elements {
                for e in decode_windowed_values(chunk, &coder, &Coder::IntervalWindow).unwrap() {
                    let key_len = coder.kv_key_len(e.value()).unwrap();
                    let key = String::from_utf8(e.value()[1..key_len].to_vec()).unwrap();
                    let window = e.header.windows[0].clone();
                    seen.lock()
                        .push((key, e.value()[key_len..].to_vec(), window));
                }
            }
            Ok(BundleOutput::default())
        });
        exec.stages.remove(&3);
        exec.stages.insert(4, sink);
        run(plan, exec, config(shape)).await.unwrap();
        let mut got = records.lock().clone();
        got.sort();
        let w = |s| Window::Interval {
            start: s,
            end: s + 10,
        };
        let group_of_one = |inner: &[u8]| [&[0, 0, 0, 1][..], inner].concat();
        assert_eq!(
            got,
            vec![
                ("a".to_string(), group_of_one(&[0, 0, 0, 1, 4]), w(10)),
                ("a".to_string(), group_of_one(&[0, 0, 0, 2, 0, 2]), w(0)),
                ("b".to_string(), group_of_one(&[0, 0, 0, 1, 1]), w(0)),
                ("b".to_string(), group_of_one(&[0, 0, 0, 1, 5]), w(20)),
                ("c".to_string(), group_of_one(&[0, 0, 0, 1, 3]), w(10)),
            ],
            "bundle shape {shape}"
        );
    }
}

#[tokio::test]
async fn stage_snapshots_show_the_finished_graph() {
    let records = Arc::new(Mutex::new(Vec::new()));
    let (plan, exec) = gbk_pipeline(records, 0);
    let names: Vec<String> = plan.stages.iter().map(|s| s.name.clone()).collect();
    let (tx, rx) = watch::channel(Vec::new());
    let (_cancel_tx, cancel) = watch::channel(false);
    Engine::builder(plan, Arc::new(exec), config(2), "test", Arc::new(|| 0))
        .stats(tx)
        .build()
        .unwrap()
        .run(cancel)
        .await
        .unwrap();
    let stats = rx.borrow().clone();
    assert_eq!(
        stats.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
        names
    );
    for (i, s) in stats.iter().enumerate() {
        assert_eq!(
            s.output_watermark,
            refract_engine::time::MAX_TIMESTAMP,
            "{s:?}"
        );
        assert_eq!((s.pending_elements, s.bundles_in_flight), (0, 0), "{s:?}");
        // Every stage but the first reads the one before it.
        let previous = if i == 0 {
            vec![]
        } else {
            vec![StageIdx::new(i - 1)]
        };
        assert_eq!(s.inputs, previous, "{s:?}");
    }
    let sdk: Vec<_> = stats.iter().filter(|s| s.kind == "sdk").collect();
    assert!(sdk.iter().all(|s| s.bundles_committed > 0), "{sdk:?}");
    // The source gets the impulse's one element; bundles of at most two.
    assert_eq!(sdk[0].elements_processed, 1, "{sdk:?}");
}

#[tokio::test]
async fn a_bundle_that_keeps_failing_fails_the_run_with_the_sdk_text() {
    let records = Arc::new(Mutex::new(Vec::new()));
    let (plan, exec) = gbk_pipeline(records.clone(), usize::MAX);
    let err = run(plan, exec, fast_retries(100_000)).await.unwrap_err();
    assert_eq!(err.to_string(), "Traceback: boom [while running 'sink']");
}

/// A bundle whose execution panics (a runner bug, not the SDK's error)
/// fails the job with the panic's message, at once: its task used to die
/// without reporting, and the engine waited for it forever.
#[tokio::test]
async fn a_bundle_that_panics_fails_the_run_instead_of_hanging_it() {
    let records = Arc::new(Mutex::new(Vec::new()));
    let (plan, mut exec) = gbk_pipeline(records.clone(), 0);
    let panicking: StageFn = Arc::new(|_input| panic!("the sink fell over"));
    exec.stages.insert(3, panicking);
    let run = run(plan, exec, fast_retries(100_000));
    let err = tokio::time::timeout(std::time::Duration::from_secs(60), run)
        .await
        .expect("the run ends")
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "runner error: bundle execution panicked: the sink fell over"
    );
    assert!(records.lock().is_empty());
}

#[tokio::test]
async fn a_bundle_failing_twice_then_succeeding_leaves_one_copy_of_its_output() {
    let records = Arc::new(Mutex::new(Vec::new()));
    // The sink's first two attempts fail after the executor saw the input;
    // the third succeeds. Only successful attempts record anything, as only
    // they are committed.
    let (plan, exec) = gbk_pipeline(records.clone(), 2);
    run(plan, exec, fast_retries(100_000)).await.unwrap();
    let mut r = records.lock().clone();
    r.sort();
    assert_eq!(r.len(), 5, "{r:?}");
    let mut keys: Vec<_> = r.iter().map(|(k, _, w)| (k.clone(), w.clone())).collect();
    keys.dedup();
    assert_eq!(keys.len(), 5, "no group twice: {r:?}");
}

#[tokio::test]
async fn side_input_is_complete_before_its_consumer_runs() {
    // impulse -> main (emits 1 element) ; impulse -> side (emits 3 values) ; consumer reads side.
    let plan = Plan {
        pcollections: vec![
            pc("impulse", Coder::Bytes, Coder::GlobalWindow),
            pc("main", Coder::Varint, Coder::GlobalWindow),
            pc("side", Coder::Varint, Coder::GlobalWindow),
        ]
        .into(),
        stages: vec![
            impulse_stage(),
            sdk_stage("main", vec![0], vec![1]),
            sdk_stage("side", vec![0], vec![2]),
            Stage {
                side_inputs: vec![SideInput {
                    id: SideInputId::new("consumer", "s"),
                    pcollection: PCollectionIdx::new(2),
                    access: SideInputAccess::Iterable,
                    fires_early: false,
                }],
                ..sdk_stage("consumer", vec![1], vec![])
            },
        ]
        .into(),
    };
    let emit = |pcoll: usize, values: Vec<i64>| -> StageFn {
        Arc::new(move |_| {
            let mut out = Vec::new();
            for v in &values {
                let mut b = Vec::new();
                encode_varint_i64(*v, &mut b);
                let header = WindowedValueHeader {
                    timestamp: 0,
                    windows: smallvec::smallvec![Window::Global],
                    pane: PaneInfo::NO_FIRING,
                };
                encode_windowed_value(&header, &Coder::GlobalWindow, &b, &mut out).unwrap();
            }
            Ok(BundleOutput {
                outputs: vec![(PCollectionIdx::new(pcoll), Bytes::from(out))],
                ..Default::default()
            })
        })
    };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let consumer: StageFn = Arc::new(move |input| {
        let key = StateKey::IterableSideInput {
            side_input: SideInputId::new("consumer", "s"),
            window: Bytes::new(),
        };
        let page = input
            .state
            .get(&key, None)
            .map_err(|e| ExecError::Sdk(e.to_string()))?;
        seen2.lock().push(page.data.to_vec());
        Ok(BundleOutput::default())
    });
    let exec = FakeExecutor {
        stages: [
            (1, emit(1, vec![7])),
            (2, emit(2, vec![1, 2, 3])),
            (3, consumer),
        ]
        .into_iter()
        .collect(),
        bundles: AtomicUsize::new(0),
    };
    run(plan, exec, config(10)).await.unwrap();
    assert_eq!(*seen.lock(), vec![vec![1, 2, 3]]);
}

#[tokio::test]
async fn flatten_of_the_same_pcollection_twice_duplicates_elements() {
    let plan = Plan {
        pcollections: vec![
            pc("impulse", Coder::Bytes, Coder::GlobalWindow),
            pc("flat", Coder::Bytes, Coder::GlobalWindow),
        ]
        .into(),
        stages: vec![
            impulse_stage(),
            Stage {
                name: "flatten".into(),
                kind: StageKind::Flatten,
                inputs: vec![PCollectionIdx::new(0), PCollectionIdx::new(0)],
                side_inputs: vec![],
                outputs: vec![PCollectionIdx::new(1)],
            },
            sdk_stage("count", vec![1], vec![]),
        ]
        .into(),
    };
    let count = Arc::new(AtomicUsize::new(0));
    let c2 = count.clone();
    let counter: StageFn = Arc::new(move |input| {
        for chunk in &input.elements {
            let n = decode_windowed_values(chunk, &Coder::Bytes, &Coder::GlobalWindow)
                .unwrap()
                .len();
            c2.fetch_add(n, Ordering::SeqCst);
        }
        Ok(BundleOutput::default())
    });
    let exec = FakeExecutor {
        stages: [(2, counter)].into_iter().collect(),
        bundles: AtomicUsize::new(0),
    };
    run(plan, exec, config(10)).await.unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn user_state_of_an_expired_window_is_collected() {
    // TestStream -> stateful stage. The stage appends to the bag of each
    // element's window; the second element, in a later window, reads the
    // first window's bag after the watermark passed that window's end.
    let w0 = Window::Interval { start: 0, end: 10 };
    let mut w0_bytes = Vec::new();
    Coder::IntervalWindow
        .encode_window(&w0, &mut w0_bytes)
        .unwrap();
    let w0_bytes = Bytes::from(w0_bytes);
    let plan = stateful_plan(
        vec![
            TestStreamEvent::Elements {
                output: PCollectionIdx::new(0),
                elements: vec![keyed_at("k", 5)],
            },
            TestStreamEvent::Watermark(50),
            TestStreamEvent::Elements {
                output: PCollectionIdx::new(0),
                elements: vec![keyed_at("k", 105)],
            },
        ],
        SdkStage {
            stateful: true,
            ..SdkStage::default()
        },
    );
    let window = window_by_hundreds();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let stateful: StageFn = Arc::new(move |input| {
        let bag = |window: Bytes| {
            StateKey::BagUserState(CellId {
                transform_id: "t".into(),
                state_id: "s".into(),
                window,
                key: Bytes::from_static(b"\x01k"),
            })
        };
        for chunk in &input.elements {
            for e in
                decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::IntervalWindow).unwrap()
            {
                let mut w = Vec::new();
                Coder::IntervalWindow
                    .encode_window(&e.header.windows[0], &mut w)
                    .unwrap();
                let own = input.state.get(&bag(Bytes::from(w.clone())), None).unwrap();
                let first = input.state.get(&bag(w0_bytes.clone()), None).unwrap();
                seen2.lock().push((own.data.len(), first.data.len()));
                input
                    .state
                    .append(&bag(Bytes::from(w)), Bytes::from_static(b"\x01x"))
                    .unwrap();
            }
        }
        Ok(BundleOutput::default())
    });
    let exec = FakeExecutor {
        stages: [(1, window), (2, stateful)].into_iter().collect(),
        bundles: AtomicUsize::new(0),
    };
    run(plan, exec, config(10)).await.unwrap();
    // First element: nothing yet. Second element: its own bag is empty and
    // the first window's bag was collected when the watermark passed 10.
    assert_eq!(*seen.lock(), vec![(0, 0), (0, 0)]);
}

/// A stage assigning `[t - t % 100, + 10)` windows to `KV<bytes, varint>`
/// elements, as an SDK's WindowInto would.
fn window_by_hundreds() -> StageFn {
    Arc::new(|input| {
        let mut out = Vec::new();
        for chunk in &input.elements {
            for e in
                decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::GlobalWindow).unwrap()
            {
                let ts = e.header.timestamp;
                let start = ts - ts % 100;
                let header = WindowedValueHeader {
                    timestamp: ts,
                    windows: smallvec::smallvec![Window::Interval {
                        start,
                        end: start + 10,
                    }],
                    pane: PaneInfo::NO_FIRING,
                };
                encode_windowed_value(&header, &Coder::IntervalWindow, e.value(), &mut out)
                    .unwrap();
            }
        }
        Ok(BundleOutput {
            outputs: vec![(PCollectionIdx::new(1), Bytes::from(out))],
            ..Default::default()
        })
    })
}

/// `KV<key, ts>` at event time `ts`, as a TestStream element.
fn keyed_at(key: &str, ts: i64) -> (Bytes, i64) {
    let mut v = vec![key.len() as u8];
    v.extend_from_slice(key.as_bytes());
    encode_varint_i64(ts, &mut v);
    (Bytes::from(v), ts)
}

/// TestStream (`events`) -> windowing by hundreds -> `stateful`.
fn stateful_plan(events: Vec<TestStreamEvent>, stateful: SdkStage) -> Plan {
    let kv = kv_bytes_varint();
    Plan {
        pcollections: vec![
            pc("raw", kv.clone(), Coder::GlobalWindow),
            pc("in", kv, Coder::IntervalWindow),
        ]
        .into(),
        stages: vec![
            Stage {
                name: "stream".into(),
                kind: StageKind::TestStream(events),
                inputs: vec![],
                side_inputs: vec![],
                outputs: vec![PCollectionIdx::new(0)],
            },
            sdk_stage("window", vec![0], vec![1]),
            Stage {
                kind: StageKind::Sdk(stateful),
                ..sdk_stage("stateful", vec![1], vec![])
            },
        ]
        .into(),
    }
}

fn event_time_family(family_id: &str) -> TimerFamily {
    TimerFamily {
        transform_id: "t".into(),
        family_id: family_id.into(),
        domain: TimeDomain::EventTime,
        key_coder: Coder::Bytes,
        window_coder: Coder::IntervalWindow,
    }
}

/// What the stateful stage saw: an element (key, timestamp) or a timer
/// (family, key, window, firing time).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Element(Vec<u8>, i64),
    Timer(String, Vec<u8>, Window, i64),
}

/// What a fake stateful stage returns when each element of its bundle (a
/// one-letter key) sets a "user" timer in its window at `fire_at` of its
/// timestamp.
fn user_timer_per_element(input: &BundleInput, fire_at: impl Fn(i64) -> i64) -> BundleOutput {
    let mut set = Vec::new();
    for chunk in &input.elements {
        for e in decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::IntervalWindow).unwrap()
        {
            let at = fire_at(e.header.timestamp);
            TimerValue {
                user_key: e.value_bytes().slice(..2),
                dynamic_tag: String::new(),
                windows: e.header.windows.clone(),
                clear: false,
                fire_timestamp: at,
                hold_timestamp: at,
                pane: PaneInfo::NO_FIRING,
            }
            .encode(&Coder::IntervalWindow, &mut set)
            .unwrap();
        }
    }
    BundleOutput {
        timers: vec![TimerInput {
            transform_id: "t".into(),
            family_id: "user".into(),
            data: Bytes::from(set),
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn window_expiration_fires_once_per_key_and_window_after_its_user_timers() {
    let events = vec![
        TestStreamEvent::Elements {
            output: PCollectionIdx::new(0),
            elements: vec![keyed_at("a", 1), keyed_at("a", 3), keyed_at("b", 5)],
        },
        TestStreamEvent::Watermark(50),
        TestStreamEvent::Elements {
            output: PCollectionIdx::new(0),
            elements: vec![keyed_at("a", 105)],
        },
    ];
    let plan = stateful_plan(
        events,
        SdkStage {
            stateful: true,
            timer_families: vec![event_time_family("user"), event_time_family("expiry")],
            window_expiration: Some(WindowExpiration {
                transform_id: "t".into(),
                family_id: "expiry".into(),
            }),
            ..SdkStage::default()
        },
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    // Every element sets a "user" timer at its timestamp + 1 in its window.
    let stateful: StageFn = Arc::new(move |input| {
        let mut log = seen2.lock();
        for t in &input.timers {
            for timer in decode_timers(&t.data, &Coder::Bytes, &Coder::IntervalWindow).unwrap() {
                log.push(Seen::Timer(
                    t.family_id.clone(),
                    timer.user_key.to_vec(),
                    timer.windows[0].clone(),
                    timer.fire_timestamp,
                ));
            }
        }
        for chunk in &input.elements {
            for e in
                decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::IntervalWindow).unwrap()
            {
                log.push(Seen::Element(e.value()[..2].to_vec(), e.header.timestamp));
            }
        }
        Ok(user_timer_per_element(input, |ts| ts + 1))
    });
    let exec = FakeExecutor {
        stages: [(1, window_by_hundreds()), (2, stateful)]
            .into_iter()
            .collect(),
        bundles: AtomicUsize::new(0),
    };
    run(plan, exec, config(10)).await.unwrap();

    let seen = seen.lock().clone();
    let first = Window::Interval { start: 0, end: 10 };
    let later = Window::Interval {
        start: 100,
        end: 110,
    };
    let expiries: Vec<(Vec<u8>, Window, i64)> = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Timer(f, k, w, t) if f == "expiry" => Some((k.clone(), w.clone(), *t)),
            _ => None,
        })
        .collect();
    // Once per key and window, firing at the window's end (no lateness).
    assert_eq!(
        expiries,
        vec![
            (b"\x01a".to_vec(), first.clone(), 9),
            (b"\x01b".to_vec(), first.clone(), 9),
            (b"\x01a".to_vec(), later.clone(), 109),
        ],
        "{seen:?}"
    );
    // Each after every user timer and element of its window.
    for (key, window, _) in &expiries {
        let at = seen
            .iter()
            .position(|s| matches!(s, Seen::Timer(f, k, w, _) if f == "expiry" && k == key && w == window))
            .unwrap();
        let user_timer_after = seen[at..].iter().any(
            |s| matches!(s, Seen::Timer(f, k, w, _) if f == "user" && k == key && w == window),
        );
        assert!(!user_timer_after, "{seen:?}");
    }
    assert!(seen.contains(&Seen::Timer("user".into(), b"\x01a".to_vec(), first, 4)));
}

/// Timers that come due together (a window closing over many keys) are
/// spread over bundles no bigger than the element bound, and each fires
/// once.
#[tokio::test]
async fn timers_due_together_fire_in_bundles_of_the_element_bound() {
    let keys = ["a", "b", "c", "d", "e", "f", "g"];
    let events = vec![TestStreamEvent::Elements {
        output: PCollectionIdx::new(0),
        elements: keys.iter().map(|k| keyed_at(k, 1)).collect(),
    }];
    let plan = stateful_plan(
        events,
        SdkStage {
            stateful: true,
            timer_families: vec![event_time_family("user")],
            ..SdkStage::default()
        },
    );
    let per_bundle = Arc::new(Mutex::new(Vec::new()));
    let per_bundle2 = per_bundle.clone();
    // Every element sets a timer at 50, in its window [0, 100).
    let stateful: StageFn = Arc::new(move |input| {
        let mut fired = Vec::new();
        for t in &input.timers {
            for timer in decode_timers(&t.data, &Coder::Bytes, &Coder::IntervalWindow).unwrap() {
                fired.push(timer.user_key.to_vec());
            }
        }
        per_bundle2.lock().push(fired);
        Ok(user_timer_per_element(input, |_| 50))
    });
    let exec = FakeExecutor {
        stages: [(1, window_by_hundreds()), (2, stateful)]
            .into_iter()
            .collect(),
        bundles: AtomicUsize::new(0),
    };
    run(plan, exec, config(2)).await.unwrap();
    let per_bundle = per_bundle.lock().clone();
    assert!(per_bundle.iter().all(|t| t.len() <= 2), "{per_bundle:?}");
    let mut fired: Vec<Vec<u8>> = per_bundle.into_iter().flatten().collect();
    fired.sort();
    let want: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| [&[1u8][..], k.as_bytes()].concat())
        .collect();
    assert_eq!(fired, want);
}

#[tokio::test]
async fn a_test_stream_pipeline_moves_processing_time_only_by_its_events() {
    use std::sync::atomic::AtomicI64;
    // A wall clock that runs fast: a second per reading.
    let wall = Arc::new(AtomicI64::new(1_000_000));
    let read_wall = {
        let wall = wall.clone();
        move || wall.fetch_add(1_000, Ordering::SeqCst)
    };
    let events = vec![
        TestStreamEvent::Elements {
            output: PCollectionIdx::new(0),
            elements: vec![keyed_at("k", 1)],
        },
        TestStreamEvent::ProcessingTime(5_000),
        TestStreamEvent::Elements {
            output: PCollectionIdx::new(0),
            elements: vec![keyed_at("k", 2)],
        },
        TestStreamEvent::ProcessingTime(10_000),
    ];
    let mut family = event_time_family("later");
    family.domain = TimeDomain::ProcessingTime;
    let plan = stateful_plan(
        events,
        SdkStage {
            stateful: true,
            timer_families: vec![family],
            ..SdkStage::default()
        },
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    // The first element sets a processing-time timer 10 s ahead of the
    // time the run started at (as an SDK would, from its own clock).
    let stateful: StageFn = Arc::new(move |input| {
        let mut log = seen2.lock();
        if input.timers.iter().any(|t| !t.data.is_empty()) {
            log.push("timer".to_string());
        }
        let mut set = Vec::new();
        for chunk in &input.elements {
            for e in
                decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::IntervalWindow).unwrap()
            {
                log.push(format!("element@{}", e.header.timestamp));
                if e.header.timestamp == 1 {
                    TimerValue {
                        user_key: e.value_bytes().slice(..2),
                        dynamic_tag: String::new(),
                        windows: e.header.windows.clone(),
                        clear: false,
                        fire_timestamp: 1_000_000 + 10_000,
                        hold_timestamp: 1,
                        pane: PaneInfo::NO_FIRING,
                    }
                    .encode(&Coder::IntervalWindow, &mut set)
                    .unwrap();
                }
            }
        }
        Ok(BundleOutput {
            timers: vec![TimerInput {
                transform_id: "t".into(),
                family_id: "later".into(),
                data: Bytes::from(set),
            }],
            ..Default::default()
        })
    });
    let exec = Arc::new(FakeExecutor {
        stages: [(1, window_by_hundreds()), (2, stateful)]
            .into_iter()
            .collect(),
        bundles: AtomicUsize::new(0),
    });
    let (_tx, cancel) = watch::channel(false);
    Engine::new(plan, exec, config(10), "test", Arc::new(read_wall))
        .unwrap()
        .run(cancel)
        .await
        .unwrap();
    // 5 s of stream time is not enough, whatever the wall clock did; the
    // second advance is.
    assert_eq!(
        *seen.lock(),
        vec!["element@1", "element@2", "timer"],
        "wall clock read {} times",
        (wall.load(Ordering::SeqCst) - 1_000_000) / 1_000
    );
}

#[tokio::test]
async fn time_sorted_input_waits_for_the_watermark_and_arrives_in_order() {
    let events = vec![
        TestStreamEvent::Elements {
            output: PCollectionIdx::new(0),
            elements: vec![keyed_at("k", 30), keyed_at("k", 10), keyed_at("k", 20)],
        },
        TestStreamEvent::Watermark(25),
        TestStreamEvent::Elements {
            output: PCollectionIdx::new(0),
            elements: vec![keyed_at("k", 40), keyed_at("k", 5)],
        },
    ];
    let plan = stateful_plan(
        events,
        SdkStage {
            stateful: true,
            time_sorted_input: true,
            ..SdkStage::default()
        },
    );
    let bundles = Arc::new(Mutex::new(Vec::new()));
    let bundles2 = bundles.clone();
    let stateful: StageFn = Arc::new(move |input| {
        let mut times = Vec::new();
        for chunk in &input.elements {
            for e in
                decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::IntervalWindow).unwrap()
            {
                times.push(e.header.timestamp);
            }
        }
        bundles2.lock().push(times);
        Ok(BundleOutput::default())
    });
    let exec = FakeExecutor {
        stages: [(1, window_by_hundreds()), (2, stateful)]
            .into_iter()
            .collect(),
        bundles: AtomicUsize::new(0),
    };
    run(plan, exec, config(10)).await.unwrap();
    // 30 waits for the watermark to pass it; 5 is behind the watermark
    // when it arrives and goes first; the rest when the input ends.
    let bundles = bundles.lock().clone();
    assert_eq!(bundles[0], vec![10, 20], "{bundles:?}");
    assert_eq!(bundles.concat(), vec![10, 20, 5, 30, 40], "{bundles:?}");
}

/// The impulse, into PCollection 0.
fn impulse_stage() -> Stage {
    Stage {
        name: "impulse".into(),
        kind: StageKind::Impulse,
        inputs: vec![],
        side_inputs: vec![],
        outputs: vec![PCollectionIdx::new(0)],
    }
}

/// A splittable source reading the impulse (PCollection 0) into
/// PCollection 1.
fn splittable_source_stage() -> Stage {
    Stage {
        kind: StageKind::Sdk(SdkStage {
            splittable: true,
            ..SdkStage::default()
        }),
        ..sdk_stage("source", vec![0], vec![1])
    }
}

/// What a self-checkpointing source's bundle number `round` (from 0)
/// leaves: its own input again, until `rounds` rounds are done.
fn checkpoint_until(
    input: &BundleInput,
    round: usize,
    rounds: usize,
) -> Vec<refract_engine::executor::Residual> {
    if round >= rounds {
        return vec![];
    }
    vec![refract_engine::executor::Residual {
        element: input.elements[0].clone(),
        delay_ms: 0,
        watermark: Some(0),
    }]
}

/// A source that emits `per_round` elements per bundle and checkpoints
/// itself `rounds` times, feeding a consumer that handles 100 elements per
/// bundle, slowly. Returns the run's peak pending bytes.
async fn fast_source_slow_sink(max_pending_bytes: usize) -> usize {
    let plan = Plan {
        pcollections: vec![
            pc("impulse", Coder::Bytes, Coder::GlobalWindow),
            pc("numbers", Coder::Bytes, Coder::GlobalWindow),
        ]
        .into(),
        stages: vec![
            impulse_stage(),
            splittable_source_stage(),
            sdk_stage("sink", vec![1], vec![]),
        ]
        .into(),
    };
    let rounds = Arc::new(AtomicUsize::new(0));
    let source: StageFn = Arc::new(move |input| {
        let mut out = Vec::new();
        let header = WindowedValueHeader {
            timestamp: 0,
            windows: smallvec::smallvec![Window::Global],
            pane: PaneInfo::NO_FIRING,
        };
        for _ in 0..1000 {
            let mut v = vec![99u8];
            v.extend_from_slice(&[7u8; 99]);
            encode_windowed_value(&header, &Coder::GlobalWindow, &v, &mut out).unwrap();
        }
        let residuals = checkpoint_until(input, rounds.fetch_add(1, Ordering::SeqCst), 30);
        Ok(BundleOutput {
            outputs: vec![(PCollectionIdx::new(1), Bytes::from(out))],
            residuals,
            ..Default::default()
        })
    });
    let sink: StageFn = Arc::new(|_| {
        std::thread::sleep(std::time::Duration::from_millis(2));
        Ok(BundleOutput::default())
    });
    run_slowly(plan, vec![(1, source), (2, sink)], false, max_pending_bytes)
        .await
        .peak_pending_bytes
}

/// Runs a backpressure pipeline: bundles of at most 100 elements, one at a
/// time per stage, at most `max_pending_bytes` waiting for a stage.
async fn run_slowly(
    plan: Plan,
    stages: Vec<(usize, StageFn)>,
    streaming: bool,
    max_pending_bytes: usize,
) -> refract_engine::manager::RunSummary {
    let exec = Arc::new(FakeExecutor {
        stages: stages.into_iter().collect(),
        bundles: AtomicUsize::new(0),
    });
    let cfg = EngineConfig {
        streaming,
        max_bundle_elements: 100,
        max_bundles_per_stage: 1,
        max_pending_bytes,
        ..EngineConfig::default()
    };
    let (_tx, rx) = watch::channel(false);
    let engine = Engine::new(plan, exec, cfg, "bp", Arc::new(|| 0)).unwrap();
    engine.run(rx).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_bounds_what_waits_for_a_slow_stage() {
    // 31 rounds of 1000 elements of ~113 bytes: about 3.5 MB in all.
    let unbounded = fast_source_slow_sink(usize::MAX).await;
    let bounded = fast_source_slow_sink(200_000).await;
    // Bounded: the limit plus at most one source bundle's output.
    assert!(bounded <= 200_000 + 120_000, "peak {bounded}");
    assert!(
        unbounded > 2 * bounded,
        "unbounded {unbounded}, bounded {bounded}"
    );
}

/// How the records of `fast_source_reshuffle_slow_sink` reach the sink.
#[derive(Clone, Copy)]
enum Reshuffled {
    /// A streaming GroupByKey that fires for every element, as Beam's
    /// `Reshuffle` expands to.
    ByGroupByKey,
    /// A runner pass-through stage, as Refract runs a `Reshuffle` it
    /// recognises (no queue of its own to fill).
    ByPassThrough,
}

/// A splittable source (31 rounds of 1000 distinct-key records of ~110
/// bytes) feeding a reshuffle (`how`), then a slow sink. Returns the most
/// records the source was ahead of the sink by when one of its bundles
/// started: what waited in the runner (the sink's queue and the
/// GroupByKey's buffer).
async fn fast_source_reshuffle_slow_sink(max_pending_bytes: usize, how: Reshuffled) -> usize {
    let kv = Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Bytes));
    let grouped = Coder::Kv(
        Box::new(Coder::Bytes),
        Box::new(Coder::Iterable(Box::new(Coder::Bytes))),
    );
    let reshuffle = WindowingStrategy {
        trigger: Trigger::Repeat(Box::new(Trigger::ElementCount(1))),
        ..WindowingStrategy::global_default()
    };
    let (kind, sink_coder) = match how {
        Reshuffled::ByGroupByKey => (StageKind::GroupByKey(reshuffle), grouped),
        Reshuffled::ByPassThrough => (StageKind::Flatten, kv.clone()),
    };
    let plan = Plan {
        pcollections: vec![
            pc("impulse", Coder::Bytes, Coder::GlobalWindow),
            pc("records", kv, Coder::GlobalWindow),
            pc("reshuffled", sink_coder.clone(), Coder::GlobalWindow),
        ]
        .into(),
        stages: vec![
            impulse_stage(),
            splittable_source_stage(),
            Stage {
                name: "reshuffle".into(),
                kind,
                inputs: vec![PCollectionIdx::new(1)],
                side_inputs: vec![],
                outputs: vec![PCollectionIdx::new(2)],
            },
            sdk_stage("sink", vec![2], vec![]),
        ]
        .into(),
    };
    let produced = Arc::new(AtomicUsize::new(0));
    let consumed = Arc::new(AtomicUsize::new(0));
    let ahead = Arc::new(AtomicUsize::new(0));
    let source: StageFn = {
        let (produced, consumed, ahead) = (produced.clone(), consumed.clone(), ahead.clone());
        Arc::new(move |input| {
            let before = produced.load(Ordering::SeqCst);
            ahead.fetch_max(before - consumed.load(Ordering::SeqCst), Ordering::SeqCst);
            let header = WindowedValueHeader {
                timestamp: 0,
                windows: smallvec::smallvec![Window::Global],
                pane: PaneInfo::NO_FIRING,
            };
            let mut out = Vec::new();
            for i in before..before + 1000 {
                let mut v = vec![8u8];
                v.extend_from_slice(&(i as u64).to_be_bytes());
                v.push(99);
                v.extend_from_slice(&[7u8; 99]);
                encode_windowed_value(&header, &Coder::GlobalWindow, &v, &mut out).unwrap();
            }
            let round = produced.fetch_add(1000, Ordering::SeqCst) / 1000;
            let residuals = checkpoint_until(input, round, 30);
            Ok(BundleOutput {
                outputs: vec![(PCollectionIdx::new(1), Bytes::from(out))],
                residuals,
                ..Default::default()
            })
        })
    };
    let sink: StageFn = {
        let consumed = consumed.clone();
        Arc::new(move |input| {
            std::thread::sleep(std::time::Duration::from_millis(2));
            for chunk in &input.elements {
                let n = decode_windowed_values(chunk, &sink_coder, &Coder::GlobalWindow)
                    .unwrap()
                    .len();
                consumed.fetch_add(n, Ordering::SeqCst);
            }
            Ok(BundleOutput::default())
        })
    };
    run_slowly(plan, vec![(1, source), (3, sink)], true, max_pending_bytes).await;
    assert_eq!(
        consumed.load(Ordering::SeqCst),
        31_000,
        "every record, once"
    );
    ahead.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_reaches_past_a_groupbykey_that_cannot_fire() {
    // A streaming GroupByKey has no queue: records wait in its buffer when
    // its consumer is over its bound. That backlog must hold its producer
    // back as a queue would, or a source outrunning a slow sink fills
    // memory through it (~3.4 MB of records in all here).
    let how = Reshuffled::ByGroupByKey;
    let unbounded = fast_source_reshuffle_slow_sink(usize::MAX, how).await;
    let bounded = fast_source_reshuffle_slow_sink(200_000, how).await;
    // Bounded: the sink's queue and the buffer, each at most about the
    // bound (~1 700 records of ~115 bytes), plus a source bundle's output
    // and the sink bundle in flight.
    assert!(bounded <= 5_000, "the source ran {bounded} records ahead");
    assert!(
        unbounded > 3 * bounded,
        "unbounded {unbounded}, bounded {bounded}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_reaches_past_a_pass_through_stage() {
    // A runner Flatten (how a recognised Reshuffle runs) hands what it
    // takes in straight to its consumer, so its own queue stays empty: a
    // producer must look through it to the sink's queue, or it is never
    // held back (the source ran the whole input ahead of the sink).
    let how = Reshuffled::ByPassThrough;
    let unbounded = fast_source_reshuffle_slow_sink(usize::MAX, how).await;
    let bounded = fast_source_reshuffle_slow_sink(200_000, how).await;
    // Bounded: the sink's queue (~1 700 records of ~115 bytes), a source
    // bundle's output and the sink bundle in flight.
    assert!(bounded <= 4_000, "the source ran {bounded} records ahead");
    assert!(
        unbounded > 3 * bounded,
        "unbounded {unbounded}, bounded {bounded}"
    );
}
