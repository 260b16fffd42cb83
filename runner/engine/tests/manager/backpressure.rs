//! Backpressure: what waits for a slow stage stays bounded, past a
//! GroupByKey and past a pass-through stage.

use super::fixtures::*;

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

/// A source that emits 1000 `KV`s over 50 keys per bundle and
/// checkpoints itself 30 times, feeding a consumer that handles 100
/// elements per bundle, slowly, on `shards` shards (on several, the
/// consumer is keyed, so that most elements cross to another shard).
/// Returns the run's peak pending bytes.
pub(super) async fn fast_source_slow_sink(max_pending_bytes: usize, shards: u32) -> usize {
    let kv = Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Bytes));
    let sink_stage = Stage {
        kind: StageKind::Sdk(SdkStage {
            stateful: shards > 1,
            ..SdkStage::default()
        }),
        ..sdk_stage("sink", vec![1], vec![])
    };
    let plan = Plan {
        pcollections: vec![
            pc("impulse", Coder::Bytes, Coder::GlobalWindow),
            pc("numbers", kv, Coder::GlobalWindow),
        ]
        .into(),
        stages: vec![impulse_stage(), splittable_source_stage(), sink_stage].into(),
        names: Default::default(),
    };
    let rounds = Arc::new(AtomicUsize::new(0));
    let source: StageFn = Arc::new(move |input| {
        let mut out = Vec::new();
        let header = WindowedValueHeader {
            timestamp: 0,
            windows: smallvec::smallvec![Window::Global],
            pane: PaneInfo::NO_FIRING,
        };
        for i in 0..1000 {
            let mut v = format!("\u{3}k{:02}", i % 50).into_bytes();
            v.push(94);
            v.extend_from_slice(&[7u8; 94]);
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
    run_slowly(
        plan,
        vec![(1, source), (2, sink)],
        false,
        max_pending_bytes,
        shards,
    )
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
    shards: u32,
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
    run_on_shards(plan, exec, cfg, shards, Arc::new(|| 0))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_bounds_what_waits_for_a_slow_stage() {
    // 31 rounds of 1000 elements of ~113 bytes: about 3.5 MB in all.
    let unbounded = fast_source_slow_sink(usize::MAX, 1).await;
    let bounded = fast_source_slow_sink(200_000, 1).await;
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
        names: Default::default(),
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
    run_slowly(
        plan,
        vec![(1, source), (3, sink)],
        true,
        max_pending_bytes,
        1,
    )
    .await;
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
