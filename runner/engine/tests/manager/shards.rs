//! A job on several shards (engines joined in this process) gives what one
//! engine gives: keyed timers fire on the shard owning their key, side
//! inputs reach every shard whole, and a failure on one shard fails the job.

use std::collections::BTreeSet;

use super::backpressure::fast_source_slow_sink;
use super::fixtures::*;
use super::state_and_timers::processing_time_moves_only_by_test_stream_events;

/// The shard a bundle ran on, from its id.
fn shard_of(input: &BundleInput) -> String {
    input.bundle_id.split('-').next().unwrap().to_string()
}

fn fixed_window(ts: i64) -> Window {
    let start = ts - ts.rem_euclid(10);
    Window::Interval {
        start,
        end: start + 10,
    }
}

/// impulse -> source (96 elements over 24 keys, 10 ms fixed windows) ->
/// keyed stage setting one event-time timer per key and window, which
/// emits `KV(key, firing time)` when it fires -> GroupByKey -> sink.
fn timers_pipeline(
    records: Records,
    shards_seen: Arc<Mutex<BTreeSet<String>>>,
) -> (Plan, FakeExecutor) {
    let plan = keyed_timer_plan("timers", "user");
    let source: StageFn = Arc::new(|_| {
        let mut out = Vec::new();
        for i in 0..96i64 {
            let key = format!("k{:02}", i % 24);
            encode_kv(
                &key,
                i,
                i,
                &fixed_window(i),
                &Coder::IntervalWindow,
                &mut out,
            );
        }
        Ok(BundleOutput {
            outputs: vec![(PCollectionIdx::new(1), Bytes::from(out))],
            ..Default::default()
        })
    });
    let timers: StageFn = Arc::new(move |input| {
        shards_seen.lock().insert(shard_of(input));
        let mut set = Vec::new();
        for chunk in &input.elements {
            for e in
                decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::IntervalWindow).unwrap()
            {
                timer_at_window_end(&e, &mut set);
            }
        }
        let mut out = Vec::new();
        for fired in &input.timers {
            for t in decode_timers(&fired.data, &Coder::Bytes, &Coder::IntervalWindow).unwrap() {
                encode_keyed(
                    &t.user_key,
                    t.fire_timestamp,
                    t.fire_timestamp,
                    &t.windows,
                    &mut out,
                );
            }
        }
        Ok(keyed_stage_output(out, "user", set))
    });
    let sink: StageFn = Arc::new(move |input| {
        record_groups(input, &records);
        Ok(BundleOutput::default())
    });
    let exec = FakeExecutor {
        stages: [(1, source), (2, timers), (4, sink)].into_iter().collect(),
        bundles: AtomicUsize::new(0),
    };
    (plan, exec)
}

#[tokio::test]
async fn keyed_timers_fire_on_their_shard_and_group_as_on_one_engine() {
    let mut results = Vec::new();
    for shards in [1, 2, 3] {
        let records: Records = Arc::default();
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let (plan, exec) = timers_pipeline(records.clone(), seen.clone());
        let summary = run_on_shards(plan, Arc::new(exec), config(7), shards, Arc::new(|| 0))
            .await
            .unwrap();
        assert!(summary.bundles > 0);
        assert_eq!(seen.lock().len(), shards as usize, "every shard ran timers");
        let mut got = records.lock().clone();
        got.sort_by(|a, b| (&a.0, &a.2.max_timestamp()).cmp(&(&b.0, &b.2.max_timestamp())));
        results.push(got);
    }
    // One timer per key and window: 24 keys, four windows each, each
    // firing once at its window's end.
    assert_eq!(results[0].len(), 96);
    for (key, values, window) in &results[0] {
        // An iterable of one: its length (four bytes), then the value.
        let mut want = vec![0, 0, 0, 1];
        encode_varint_i64(window.max_timestamp(), &mut want);
        assert_eq!(values, &want, "{key} in {window:?}");
    }
    assert_eq!(results[1], results[0], "two shards");
    assert_eq!(results[2], results[0], "three shards");
    // The same over frames.
    let records: Records = Arc::default();
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let (plan, exec) = timers_pipeline(records.clone(), seen.clone());
    run_on_frames(plan, Arc::new(exec), config(7), 3, Arc::new(|| 0))
        .await
        .unwrap();
    assert_eq!(seen.lock().len(), 3, "every shard ran timers");
    let mut got = records.lock().clone();
    got.sort_by(|a, b| (&a.0, &a.2.max_timestamp()).cmp(&(&b.0, &b.2.max_timestamp())));
    assert_eq!(got, results[0], "three shards over frames");
}

/// What the consumer saw: (shard, key, what the side input read).
type SideReads = Arc<Mutex<Vec<(String, Vec<u8>, Vec<u8>)>>>;

#[tokio::test]
async fn side_inputs_reach_every_shard_whole() {
    side_inputs_reach_every_shard(false).await;
}

#[tokio::test]
async fn side_inputs_reach_every_shard_whole_over_frames() {
    side_inputs_reach_every_shard(true).await;
}

async fn side_inputs_reach_every_shard(frames: bool) {
    // impulse -> source (24 keys) -> keyed consumer reading side input "s";
    // impulse -> start -> side (1, 2, 3). The side input is made a stage
    // later than the main input, on shard 0: the other shards must wait
    // until it finished there, not until their own (empty) copy of it did.
    let plan = Plan {
        pcollections: vec![
            pc("impulse", Coder::Bytes, Coder::GlobalWindow),
            pc("kvs", kv_bytes_varint(), Coder::GlobalWindow),
            pc("side", Coder::Varint, Coder::GlobalWindow),
            pc("started", Coder::Bytes, Coder::GlobalWindow),
        ]
        .into(),
        stages: vec![
            impulse_stage(),
            sdk_stage("source", vec![0], vec![1]),
            sdk_stage("side", vec![3], vec![2]),
            Stage {
                kind: StageKind::Sdk(SdkStage {
                    stateful: true,
                    ..SdkStage::default()
                }),
                side_inputs: vec![SideInput {
                    id: SideInputId::new("consumer", "s"),
                    pcollection: PCollectionIdx::new(2),
                    access: SideInputAccess::Iterable,
                    fires_early: false,
                }],
                ..sdk_stage("consumer", vec![1], vec![])
            },
            sdk_stage("start", vec![0], vec![3]),
        ]
        .into(),
        names: Default::default(),
    };
    let start: StageFn = Arc::new(|input| {
        Ok(BundleOutput {
            outputs: vec![(PCollectionIdx::new(3), input.elements[0].clone())],
            ..Default::default()
        })
    });
    let source: StageFn = Arc::new(|_| {
        let mut out = Vec::new();
        for i in 0..24 {
            encode_kv(
                &format!("k{i:02}"),
                i,
                0,
                &Window::Global,
                &Coder::GlobalWindow,
                &mut out,
            );
        }
        Ok(BundleOutput {
            outputs: vec![(PCollectionIdx::new(1), Bytes::from(out))],
            ..Default::default()
        })
    });
    let seen: SideReads = Arc::default();
    let seen_by_consumer = seen.clone();
    let consumer: StageFn = Arc::new(move |input| {
        let side = read_side_input(input)?;
        for chunk in &input.elements {
            for e in
                decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::GlobalWindow).unwrap()
            {
                let key_len = kv_bytes_varint().kv_key_len(e.value()).unwrap();
                seen_by_consumer.lock().push((
                    shard_of(input),
                    e.value()[..key_len].to_vec(),
                    side.to_vec(),
                ));
            }
        }
        Ok(BundleOutput::default())
    });
    let exec = FakeExecutor {
        stages: [
            (1, source),
            (2, emit_varints(2, vec![1, 2, 3])),
            (3, consumer),
            (4, start),
        ]
        .into_iter()
        .collect(),
        bundles: AtomicUsize::new(0),
    };
    if frames {
        run_on_frames(plan, Arc::new(exec), config(4), 3, Arc::new(|| 0)).await
    } else {
        run_on_shards(plan, Arc::new(exec), config(4), 3, Arc::new(|| 0)).await
    }
    .unwrap();
    let seen = seen.lock();
    assert_eq!(seen.len(), 24, "each key once: {seen:?}");
    assert!(
        seen.iter().all(|(_, _, side)| side == &[1, 2, 3]),
        "{seen:?}"
    );
    let keys: BTreeSet<&Vec<u8>> = seen.iter().map(|(_, k, _)| k).collect();
    assert_eq!(keys.len(), 24);
    let shards: BTreeSet<&String> = seen.iter().map(|(s, _, _)| s).collect();
    assert_eq!(
        shards.len(),
        3,
        "every shard read the side input: {shards:?}"
    );
}

#[tokio::test]
async fn a_bundle_failing_on_one_shard_fails_the_job_with_its_error() {
    for frames in [false, true] {
        let (plan, exec) = gbk_pipeline(Arc::default(), usize::MAX);
        let exec = Arc::new(exec);
        let error = if frames {
            run_on_frames(plan, exec, fast_retries(100), 2, Arc::new(|| 0)).await
        } else {
            run_on_shards(plan, exec, fast_retries(100), 2, Arc::new(|| 0)).await
        }
        .unwrap_err();
        assert!(matches!(error, EngineError::BundleFailed { .. }), "{error}");
        assert!(error.to_string().contains("boom"), "{error}");
    }
}

#[tokio::test]
async fn shards_refuse_what_they_cannot_do_yet() {
    let (plan, exec) = gbk_pipeline(Arc::default(), 0);
    let exec: Arc<dyn StageExecutor> = Arc::new(exec);
    let link = || ShardLink::in_process(ShardLayout::new(2).unwrap()).remove(0);
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let error = Engine::builder(plan.clone(), exec.clone(), config(10), "s0", Arc::new(|| 0))
        .checkpoints(std::time::Duration::ZERO, tx, None)
        .shard(link())
        .build()
        .err()
        .expect("checkpoints without progress on shards are refused");
    assert!(error.to_string().contains("progress"), "{error}");
    let (_requests, savepoints) = tokio::sync::mpsc::channel(1);
    let error = Engine::builder(plan.clone(), exec.clone(), config(10), "s0", Arc::new(|| 0))
        .savepoints(savepoints)
        .shard(link())
        .build()
        .err()
        .expect("savepoints on shards are refused");
    assert!(error.to_string().contains("savepoints"), "{error}");
    // Epochs on request go to checkpoints, and are a shard's.
    let (_requests, epochs) = tokio::sync::mpsc::channel(1);
    let error = Engine::builder(plan.clone(), exec.clone(), config(10), "s0", Arc::new(|| 0))
        .epoch_requests(epochs)
        .shard(link())
        .build()
        .err()
        .expect("epoch requests without checkpoints are refused");
    assert!(error.to_string().contains("need checkpoints"), "{error}");
    let (_requests, epochs) = tokio::sync::mpsc::channel(1);
    let error = Engine::builder(plan, exec, config(10), "s0", Arc::new(|| 0))
        .epoch_requests(epochs)
        .build()
        .err()
        .expect("epoch requests off shards are refused");
    assert!(error.to_string().contains("shards of a job"), "{error}");
}

/// A one-letter key that the second of two shards owns.
fn key_of_shard_one() -> String {
    let layout = ShardLayout::new(2).unwrap();
    (b'a'..=b'z')
        .find(|&c| {
            layout
                .owner(refract_engine::key_groups::key_group(&[1, c]))
                .index()
                == 1
        })
        .map(|c| (c as char).to_string())
        .expect("some letter is shard 1's")
}

#[tokio::test]
async fn processing_time_timers_on_another_shard_follow_the_test_stream() {
    processing_time_moves_only_by_test_stream_events(2, &key_of_shard_one(), false).await;
    processing_time_moves_only_by_test_stream_events(2, &key_of_shard_one(), true).await;
}

// Four threads: the fake sink sleeps on its thread, on each shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backpressure_holds_across_shards() {
    // The source runs on shard 0, and the keyed sink's elements go to
    // both shards: a sink over its bound on either shard holds the source.
    let unbounded = fast_source_slow_sink(usize::MAX, 2).await;
    let bounded = fast_source_slow_sink(200_000, 2).await;
    assert!(bounded <= 200_000 + 120_000, "peak {bounded}");
    assert!(
        unbounded > 2 * bounded,
        "unbounded peak {unbounded}, bounded {bounded}"
    );
}
