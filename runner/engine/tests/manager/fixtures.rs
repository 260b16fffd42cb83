//! What the manager tests share: a fake executor playing the SDK stages,
//! small plans, and running an engine to the end.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub(crate) use std::collections::BTreeMap;
pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};
pub(crate) use std::sync::Arc;

pub(crate) use bytes::Bytes;
pub(crate) use futures::future::BoxFuture;
pub(crate) use futures::FutureExt;
pub(crate) use parking_lot::Mutex;
pub(crate) use refract_engine::coder::{
    decode_timers, decode_windowed_values, encode_varint_i64, encode_windowed_value, Coder,
    DecodedElement, PaneInfo, TimerValue, WindowedValueHeader,
};
pub(crate) use refract_engine::executor::{
    BundleInput, BundleOutput, ExecError, StageExecutor, TimerInput,
};
pub(crate) use refract_engine::manager::{
    run_shards, ClockFn, Engine, EngineConfig, EngineError, RunSummary,
};
pub(crate) use refract_engine::plan::{
    PCollection, PCollectionIdx, Plan, SdkStage, SideInput, SideInputAccess, SideInputId, Stage,
    StageIdx, StageKind, TestStreamEvent, TimeDomain, TimerFamily, Trigger, WindowExpiration,
    WindowFn, WindowingStrategy,
};
pub(crate) use refract_engine::shards::{ShardLayout, ShardLink};
pub(crate) use refract_engine::state::{CellId, StateKey};
pub(crate) use refract_engine::window::Window;
pub(crate) use tokio::sync::watch;

pub(crate) fn kv_bytes_varint() -> Coder {
    Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Varint))
}

pub(crate) fn pc(id: &str, value: Coder, window: Coder) -> PCollection {
    PCollection {
        id: id.into(),
        value_coder: value,
        window_coder: window,
        bounded: true,
    }
}

/// An SDK stage reading and writing the PCollections numbered `inputs`
/// and `outputs`.
pub(crate) fn sdk_stage(name: &str, inputs: Vec<usize>, outputs: Vec<usize>) -> Stage {
    Stage {
        name: name.into(),
        kind: StageKind::Sdk(SdkStage::default()),
        inputs: inputs.into_iter().map(PCollectionIdx::new).collect(),
        side_inputs: vec![],
        outputs: outputs.into_iter().map(PCollectionIdx::new).collect(),
    }
}

/// What each fake SDK stage does with a bundle.
pub(crate) type StageFn =
    Arc<dyn Fn(&BundleInput) -> Result<BundleOutput, ExecError> + Send + Sync>;

pub(crate) struct FakeExecutor {
    /// By stage number.
    pub(crate) stages: BTreeMap<usize, StageFn>,
    pub(crate) bundles: AtomicUsize,
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

pub(crate) fn encode_kv(
    key: &str,
    value: i64,
    ts: i64,
    window: &Window,
    wcoder: &Coder,
    out: &mut Vec<u8>,
) {
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
pub(crate) type Records = Arc<Mutex<Vec<(String, Vec<u8>, Window)>>>;

/// The grouped PCollections' coder: `KV<bytes, Iterable<varint>>`.
pub(crate) fn grouped_coder() -> Coder {
    Coder::Kv(
        Box::new(Coder::Bytes),
        Box::new(Coder::Iterable(Box::new(Coder::Varint))),
    )
}

/// Adds the groups of a sink bundle's input (in [`grouped_coder`], in
/// interval windows) to `records`.
pub(crate) fn record_groups(input: &BundleInput, records: &Records) {
    let grouped = grouped_coder();
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
}

/// A stage that emits `values` (varints, at time 0, in the global window)
/// into PCollection `pcoll`.
pub(crate) fn emit_varints(pcoll: usize, values: Vec<i64>) -> StageFn {
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
}

/// What a bundle reads of the global-window iterable side input `s` of
/// transform "consumer".
pub(crate) fn read_side_input(input: &BundleInput) -> Result<Bytes, ExecError> {
    let key = StateKey::IterableSideInput {
        side_input: SideInputId::new("consumer", "s"),
        window: Bytes::new(),
    };
    let page = input
        .state
        .get(&key, None)
        .map_err(|e| ExecError::Sdk(e.to_string()))?;
    Ok(page.data)
}

/// Impulse -> "source" (emits KVs into fixed windows) -> GBK -> "sink" (records groups).
/// `failing_sink_attempts`: how many sink bundles fail before they succeed.
pub(crate) fn gbk_pipeline(records: Records, failing_sink_attempts: usize) -> (Plan, FakeExecutor) {
    let plan = Plan {
        pcollections: vec![
            pc("impulse", Coder::Bytes, Coder::GlobalWindow),
            pc("kvs", kv_bytes_varint(), Coder::IntervalWindow),
            pc("grouped", grouped_coder(), Coder::IntervalWindow),
        ]
        .into(),
        stages: vec![
            impulse_stage(),
            sdk_stage("source", vec![0], vec![1]),
            fixed_window_gbk(1, 2),
            sdk_stage("sink", vec![2], vec![]),
        ]
        .into(),
        names: Default::default(),
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
        record_groups(input, &records);
        Ok(BundleOutput::default())
    });
    let exec = FakeExecutor {
        stages: [(1, source), (3, sink)].into_iter().collect(),
        bundles: AtomicUsize::new(0),
    };
    (plan, exec)
}

pub(crate) fn fast_retries(max_bundle_elements: usize) -> EngineConfig {
    EngineConfig {
        retry_backoff: std::time::Duration::from_millis(1),
        ..config(max_bundle_elements)
    }
}

pub(crate) fn config(max_bundle_elements: usize) -> EngineConfig {
    EngineConfig {
        max_bundle_elements,
        ..EngineConfig::default()
    }
}

pub(crate) async fn run(
    plan: Plan,
    exec: FakeExecutor,
    cfg: EngineConfig,
) -> Result<usize, EngineError> {
    let exec = Arc::new(exec);
    let (_tx, rx) = watch::channel(false);
    let engine = Engine::new(plan, exec.clone(), cfg, "test", Arc::new(|| 0))?;
    engine.run(rx).await?;
    Ok(exec.bundles.load(Ordering::SeqCst))
}

/// Runs `plan` on `shards` engines sharing `exec` and reading `clock`
/// (one shard: a single engine), joined by the in-process board; bundle
/// ids start with `s{shard}`.
pub(crate) async fn run_on_shards(
    plan: Plan,
    exec: Arc<FakeExecutor>,
    cfg: EngineConfig,
    shards: u32,
    clock: ClockFn,
) -> Result<RunSummary, EngineError> {
    run_sharded(plan, exec, cfg, shards, clock, false).await
}

/// [`run_on_shards`], with the shards exchanging through the frame
/// protocol over channels instead.
pub(crate) async fn run_on_frames(
    plan: Plan,
    exec: Arc<FakeExecutor>,
    cfg: EngineConfig,
    shards: u32,
    clock: ClockFn,
) -> Result<RunSummary, EngineError> {
    run_sharded(plan, exec, cfg, shards, clock, true).await
}

async fn run_sharded(
    plan: Plan,
    exec: Arc<FakeExecutor>,
    cfg: EngineConfig,
    shards: u32,
    clock: ClockFn,
    frames: bool,
) -> Result<RunSummary, EngineError> {
    let (_cancel, cancelled) = watch::channel(false);
    if shards == 1 {
        return Engine::new(plan, exec, cfg, "s0", clock)?
            .run(cancelled)
            .await;
    }
    let layout = ShardLayout::new(shards).unwrap();
    let links = if frames {
        ShardLink::over_channels(layout)
    } else {
        ShardLink::in_process(layout)
    };
    let engines = links
        .into_iter()
        .map(|link| {
            let prefix = format!("s{}", link.id().index());
            Engine::builder(
                plan.clone(),
                exec.clone(),
                cfg.clone(),
                prefix,
                clock.clone(),
            )
            .shard(link)
            .build()
        })
        .collect::<Result<Vec<_>, _>>()?;
    run_shards(engines, cancelled).await
}

/// A GroupByKey into 10 ms fixed windows, from PCollection `input` into
/// `output`.
pub(crate) fn fixed_window_gbk(input: usize, output: usize) -> Stage {
    Stage {
        name: "gbk".into(),
        kind: StageKind::GroupByKey(WindowingStrategy {
            window_fn: WindowFn::Fixed {
                size: 10,
                offset: 0,
            },
            ..WindowingStrategy::global_default()
        }),
        inputs: vec![PCollectionIdx::new(input)],
        side_inputs: vec![],
        outputs: vec![PCollectionIdx::new(output)],
    }
}

/// impulse -> source (stage 1) -> keyed stage `keyed` (stage 2: user state,
/// and transform `t`'s event-time timer family `family`) -> GroupByKey
/// into 10 ms windows -> sink (stage 4), over `KV<bytes, varint>`
/// PCollections `kvs` and `fired`, grouped into `grouped`.
pub(crate) fn keyed_timer_plan(keyed: &str, family: &str) -> Plan {
    let family = TimerFamily {
        transform_id: "t".into(),
        family_id: family.into(),
        domain: TimeDomain::EventTime,
        key_coder: Coder::Bytes,
        window_coder: Coder::IntervalWindow,
    };
    Plan {
        pcollections: vec![
            pc("impulse", Coder::Bytes, Coder::GlobalWindow),
            pc("kvs", kv_bytes_varint(), Coder::IntervalWindow),
            pc("fired", kv_bytes_varint(), Coder::IntervalWindow),
            pc("grouped", grouped_coder(), Coder::IntervalWindow),
        ]
        .into(),
        stages: vec![
            impulse_stage(),
            sdk_stage("source", vec![0], vec![1]),
            Stage {
                kind: StageKind::Sdk(SdkStage {
                    stateful: true,
                    timer_families: vec![family],
                    ..SdkStage::default()
                }),
                ..sdk_stage(keyed, vec![1], vec![2])
            },
            fixed_window_gbk(2, 3),
            sdk_stage("sink", vec![3], vec![]),
        ]
        .into(),
        names: Default::default(),
    }
}

/// Appends `KV(key, value)` (the key nested-encoded, as a timer carries
/// it) at time `at` in `windows` to `out`.
pub(crate) fn encode_keyed(key: &[u8], value: i64, at: i64, windows: &[Window], out: &mut Vec<u8>) {
    let mut v = key.to_vec();
    encode_varint_i64(value, &mut v);
    let header = WindowedValueHeader {
        timestamp: at,
        windows: windows.iter().cloned().collect(),
        pane: PaneInfo::NO_FIRING,
    };
    encode_windowed_value(&header, &Coder::IntervalWindow, &v, out).unwrap();
}

/// Appends to `set` an event-time timer of element `e`'s key (of a
/// `KV<bytes, varint>`) at the end of its window; returns the key.
pub(crate) fn timer_at_window_end(e: &DecodedElement, set: &mut Vec<u8>) -> Bytes {
    let key_len = kv_bytes_varint().kv_key_len(e.value()).unwrap();
    let key = e.value_bytes().slice(..key_len);
    let end = e.header.windows[0].max_timestamp();
    TimerValue {
        user_key: key.clone(),
        dynamic_tag: String::new(),
        windows: e.header.windows.clone(),
        clear: false,
        fire_timestamp: end,
        hold_timestamp: end,
        pane: PaneInfo::NO_FIRING,
    }
    .encode(&Coder::IntervalWindow, set)
    .unwrap();
    key
}

/// What the keyed stage of [`keyed_timer_plan`] returns: `out` into its
/// output, and the timers `set` in `family`.
pub(crate) fn keyed_stage_output(out: Vec<u8>, family: &str, set: Vec<u8>) -> BundleOutput {
    BundleOutput {
        outputs: vec![(PCollectionIdx::new(2), Bytes::from(out))],
        timers: vec![TimerInput {
            transform_id: "t".into(),
            family_id: family.into(),
            data: Bytes::from(set),
        }],
        ..Default::default()
    }
}

/// The impulse, into PCollection 0.
pub(crate) fn impulse_stage() -> Stage {
    Stage {
        name: "impulse".into(),
        kind: StageKind::Impulse,
        inputs: vec![],
        side_inputs: vec![],
        outputs: vec![PCollectionIdx::new(0)],
    }
}
