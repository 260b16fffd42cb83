//! A checkpoint of a job on shards restored onto another number of shards:
//! each key's queued elements, user state, timers and GroupByKey buffer
//! move to the shard now owning its key group, and the job finishes with
//! what one engine gives.

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use refract_engine::executor::CommitAction;
use refract_engine::manager::{
    collect_epochs, describe_checkpoint, split_sharded_checkpoint, CheckpointProgress, EpochRequest,
};

use super::fixtures::*;

/// What the sink committed: (engine prefix, bundle number, key, window,
/// count).
type Committed = Arc<Mutex<Vec<(String, u64, String, Window, i64)>>>;

fn fixed_window(ts: i64) -> Window {
    let start = ts - ts.rem_euclid(10);
    Window::Interval {
        start,
        end: start + 10,
    }
}

fn encoded_window(window: &Window) -> Bytes {
    let mut out = Vec::new();
    Coder::IntervalWindow
        .encode_window(window, &mut out)
        .unwrap();
    Bytes::from(out)
}

/// impulse -> source (120 elements over 24 keys, 10 ms fixed windows) ->
/// keyed stage appending each element to its key and window's bag and
/// setting a timer at the window's end, which emits `KV(key, bag size)`
/// -> GroupByKey -> sink, which records what it commits.
fn bag_and_timer_pipeline(committed: Committed) -> (Plan, FakeExecutor) {
    bag_and_timer_pipeline_finalizing(committed, None)
}

/// Bundles of the keyed stage finalized: (engine prefix, bundle number,
/// epochs durable then).
type Finalized = Arc<Mutex<Vec<(String, u64, u64)>>>;

/// [`bag_and_timer_pipeline`], whose keyed stage asks for each bundle to
/// be finalized once durable, recording it in `finalized` with the count
/// of durable epochs `durable` holds then.
fn bag_and_timer_pipeline_finalizing(
    committed: Committed,
    finalizing: Option<(Finalized, Arc<AtomicU64>)>,
) -> (Plan, FakeExecutor) {
    let plan = keyed_timer_plan("bags", "end");
    let source: StageFn = Arc::new(|_| {
        let mut out = Vec::new();
        for i in 0..120i64 {
            let key = format!("k{:02}", i % 24);
            encode_kv(
                &key,
                i,
                i % 40,
                &fixed_window(i % 40),
                &Coder::IntervalWindow,
                &mut out,
            );
        }
        Ok(BundleOutput {
            outputs: vec![(PCollectionIdx::new(1), Bytes::from(out))],
            ..Default::default()
        })
    });
    let bag = |key: Bytes, window: &Window| {
        StateKey::BagUserState(CellId {
            transform_id: "t".into(),
            state_id: "bag".into(),
            window: encoded_window(window),
            key,
        })
    };
    let bags: StageFn = Arc::new(move |input| {
        // Each bundle takes a little while, as an SDK's would: the job
        // lasts long enough for the checkpoints it is cut at.
        std::thread::sleep(Duration::from_millis(1));
        let mut set = Vec::new();
        for chunk in &input.elements {
            for e in
                decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::IntervalWindow).unwrap()
            {
                let key = timer_at_window_end(&e, &mut set);
                input
                    .state
                    .append(&bag(key, &e.header.windows[0]), Bytes::from_static(b"x"))
                    .map_err(|e| ExecError::Runner(e.to_string()))?;
            }
        }
        let mut out = Vec::new();
        for fired in &input.timers {
            for t in decode_timers(&fired.data, &Coder::Bytes, &Coder::IntervalWindow).unwrap() {
                let window = &t.windows[0];
                let size = input
                    .state
                    .get(&bag(t.user_key.clone(), window), None)
                    .map_err(|e| ExecError::Runner(e.to_string()))?
                    .data
                    .len();
                encode_keyed(
                    &t.user_key,
                    size as i64,
                    t.fire_timestamp,
                    &t.windows,
                    &mut out,
                );
            }
        }
        let mut output = keyed_stage_output(out, "end", set);
        if let Some((finalized, durable)) = finalizing.clone() {
            let (prefix, number) = input.bundle_id.rsplit_once("-b").unwrap();
            let (prefix, number) = (prefix.to_string(), number.parse::<u64>().unwrap());
            output.on_durable = Some(CommitAction::new(move || {
                let now = durable.load(AtomicOrdering::SeqCst);
                finalized.lock().push((prefix, number, now));
            }));
        }
        Ok(output)
    });
    let sink: StageFn = Arc::new(move |input| {
        let (prefix, number) = input.bundle_id.rsplit_once("-b").unwrap();
        let (prefix, number) = (prefix.to_string(), number.parse::<u64>().unwrap());
        let records: Records = Arc::default();
        record_groups(input, &records);
        let committed = committed.clone();
        Ok(BundleOutput {
            on_commit: Some(CommitAction::new(move || {
                for (key, values, window) in records.lock().drain(..) {
                    // One size per key and window: an iterable of one
                    // (a 4-byte count, then a one-byte varint).
                    assert_eq!(values[..4], [0, 0, 0, 1], "{values:?}");
                    let size = i64::from(values[4]);
                    committed
                        .lock()
                        .push((prefix.clone(), number, key, window, size));
                }
            })),
            ..Default::default()
        })
    });
    let exec = FakeExecutor {
        stages: [(1, source), (2, bags), (4, sink)].into_iter().collect(),
        bundles: AtomicUsize::new(0),
    };
    (plan, exec)
}

/// The engines of `shards` shards, with checkpoints to `checkpoints` if
/// given, shard 0 taking epoch requests from `requests` if given.
fn engines(
    plan: &Plan,
    exec: &Arc<FakeExecutor>,
    shards: u32,
    mut checkpoints: Option<Vec<refract_engine::manager::ShardCheckpoints>>,
    mut requests: Option<tokio::sync::mpsc::Receiver<EpochRequest>>,
) -> Vec<Engine> {
    ShardLink::in_process(ShardLayout::new(shards).unwrap())
        .into_iter()
        .map(|link| {
            let prefix = format!("s{}", link.id().index());
            let mut builder = Engine::builder(
                plan.clone(),
                exec.clone(),
                config(3),
                prefix,
                Arc::new(|| 0),
            );
            if let Some(ends) = checkpoints.as_mut() {
                let end = ends.remove(0);
                builder = builder.checkpoints(Duration::ZERO, end.tx, Some(end.progress));
            }
            if link.id().index() == 0 {
                if let Some(requests) = requests.take() {
                    builder = builder.epoch_requests(requests);
                }
            }
            builder.shard(link).build().unwrap()
        })
        .collect()
}

/// Finishes the job from the sharded checkpoint `parts` on `to` shards,
/// after dropping what the sink committed that the checkpoint does not
/// count as done (lost with the process that stopped): what the sink
/// committed in all (see [`results`]).
async fn finish_on(
    parts: &[(String, Bytes)],
    to: u32,
    plan: &Plan,
    exec: &Arc<FakeExecutor>,
    committed: &Committed,
) -> Vec<(String, Window, i64)> {
    let shards = split_sharded_checkpoint(parts).unwrap().unwrap();
    let done: Vec<_> = shards
        .iter()
        .map(|p| describe_checkpoint(p).unwrap())
        .collect();
    committed.lock().retain(|(prefix, b, ..)| {
        let info = &done[prefix[1..].parse::<usize>().unwrap()];
        *b < info.next_bundle && !info.rerun_bundles.contains(b)
    });
    let mut moved = engines(plan, exec, to, None, None);
    for engine in &mut moved {
        engine.restore(parts).unwrap();
    }
    let (_cancel, cancelled) = watch::channel(false);
    run_shards(moved, cancelled).await.unwrap();
    results(committed)
}

/// (key, window, count) as the sink committed them, sorted.
fn results(committed: &Committed) -> Vec<(String, Window, i64)> {
    let mut got: Vec<_> = committed
        .lock()
        .iter()
        .map(|(_, _, key, window, size)| (key.clone(), window.clone(), *size))
        .collect();
    got.sort_by(|a, b| (&a.0, a.1.max_timestamp()).cmp(&(&b.0, b.1.max_timestamp())));
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_state_timers_and_buffers_move_to_their_new_shards() {
    let committed: Committed = Arc::default();
    let (plan, exec) = bag_and_timer_pipeline(committed.clone());
    let exec = Arc::new(exec);
    let (_cancel, cancelled) = watch::channel(false);
    run_shards(engines(&plan, &exec, 2, None, None), cancelled)
        .await
        .unwrap();
    let want = results(&committed);
    // 24 keys, each in 4 windows of 10 ms, 5 elements per key and window
    // (120 elements over 40 ms).
    assert_eq!(want.len(), 96, "{want:?}");
    assert!(want.iter().all(|(_, _, n)| *n > 0));

    for (from, to) in [(3, 2), (2, 3), (2, 5)] {
        let mut restored = 0;
        for crash_at in 1..=8 {
            committed.lock().clear();
            let (plan, exec) = bag_and_timer_pipeline(committed.clone());
            let exec = Arc::new(exec);
            let (out, mut written) = tokio::sync::mpsc::channel(1);
            let (ends, collector) = collect_epochs(from, Vec::new(), out, None);
            let collector = tokio::spawn(collector);
            let (cancel, cancelled) = watch::channel(false);
            let run = tokio::spawn(run_shards(
                engines(&plan, &exec, from, Some(ends), None),
                cancelled,
            ));
            let mut cut = None;
            for _ in 0..crash_at {
                match written.recv().await {
                    Some(parts) => cut = Some(parts),
                    None => {
                        cut = None;
                        break;
                    }
                }
            }
            let _ = cancel.send(true);
            let outcome = run.await.unwrap();
            drop(written);
            collector.await.unwrap();
            let Some(parts) = cut else {
                outcome.unwrap();
                continue;
            };
            let got = finish_on(&parts, to, &plan, &exec, &committed).await;
            assert_eq!(got, want, "{from} -> {to} shards at checkpoint {crash_at}");
            restored += 1;
        }
        assert!(restored >= 3, "{from} -> {to}: only {restored} restores");
    }
}

/// A savepoint of a job on shards: an epoch asked for now, after which
/// every shard stops (so nothing happens between the savepoint and the
/// stop); the job then finishes from it on another number of shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_savepoint_epoch_stops_every_shard_and_moves_to_other_shards() {
    let committed: Committed = Arc::default();
    let (plan, exec) = bag_and_timer_pipeline(committed.clone());
    let (_cancel, cancelled) = watch::channel(false);
    run_shards(engines(&plan, &Arc::new(exec), 2, None, None), cancelled)
        .await
        .unwrap();
    let want = results(&committed);

    let mut saved = 0;
    for (from, to, after) in [(3, 2, 1), (3, 2, 3), (2, 3, 2), (2, 4, 4)] {
        committed.lock().clear();
        let (plan, exec) = bag_and_timer_pipeline(committed.clone());
        let exec = Arc::new(exec);
        let (out, mut written) = tokio::sync::mpsc::channel(1);
        let (ends, collector) = collect_epochs(from, Vec::new(), out, None);
        let collector = tokio::spawn(collector);
        let (requests, received) = tokio::sync::mpsc::channel(1);
        let running = engines(&plan, &exec, from, Some(ends), Some(received));
        let (_cancel, cancelled) = watch::channel(false);
        let run = tokio::spawn(run_shards(running, cancelled));
        let mut epochs = Vec::new();
        for _ in 0..after {
            if let Some(parts) = written.recv().await {
                epochs.push(parts);
            }
        }
        let (cut, epoch) = tokio::sync::oneshot::channel();
        let asked = requests
            .send(EpochRequest { stop: true, cut })
            .await
            .is_ok();
        let epoch = match (asked, epoch.await) {
            (true, Ok(epoch)) => epoch,
            // The job ended first.
            _ => continue,
        };
        while (epochs.len() as u64) < epoch.number() {
            epochs.push(written.recv().await.expect("the savepoint's epoch"));
        }
        let parts = epochs.pop().unwrap();
        let outcome = run.await.unwrap();
        assert!(
            matches!(outcome, Err(EngineError::Cancelled)),
            "every shard stopped after the savepoint: {outcome:?}"
        );
        drop(written);
        collector.await.unwrap();
        let got = finish_on(&parts, to, &plan, &exec, &committed).await;
        let after = format!("savepoint after {after} epochs on {from} shards");
        assert_eq!(got, want, "{after}, finished on {to}");
        saved += 1;
    }
    assert!(
        saved >= 2,
        "only {saved} savepoints were taken before the job ended"
    );
}

/// Finalization on shards (a source acknowledging what it read) runs only
/// once an epoch holding the bundle's commit is durable: a bundle that
/// committed after its shard cut an epoch is in the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalization_on_shards_waits_for_an_epoch_holding_the_commit() {
    let finalized: Finalized = Arc::default();
    let durable = Arc::new(AtomicU64::new(0));
    let (plan, exec) = bag_and_timer_pipeline_finalizing(
        Arc::default(),
        Some((finalized.clone(), durable.clone())),
    );
    let exec = Arc::new(exec);
    let (out, mut written) = tokio::sync::mpsc::channel(1);
    let (progress, writer_progress) = watch::channel(CheckpointProgress::default());
    let (ends, collector) = collect_epochs(3, Vec::new(), out, Some(writer_progress));
    let collector = tokio::spawn(collector);
    // The writer: each epoch is durable a moment after it arrives.
    let writer = tokio::spawn({
        let durable = durable.clone();
        async move {
            let mut epochs = Vec::new();
            while let Some(parts) = written.recv().await {
                tokio::time::sleep(Duration::from_millis(2)).await;
                epochs.push(parts);
                let n = epochs.len() as u64;
                durable.store(n, AtomicOrdering::SeqCst);
                progress.send_replace(CheckpointProgress::all_durable(n));
            }
            epochs
        }
    });
    let (_cancel, cancelled) = watch::channel(false);
    run_shards(engines(&plan, &exec, 3, Some(ends), None), cancelled)
        .await
        .unwrap();
    collector.await.unwrap();
    let epochs = writer.await.unwrap();
    let finalized = finalized.lock().clone();
    assert!(!finalized.is_empty());
    // Finalized at the end of the run (nothing left to redo) counts too.
    let mut checked = 0;
    for (prefix, bundle, durable) in finalized {
        let Some(parts) = epochs.get((durable as usize).wrapping_sub(1)) else {
            continue;
        };
        let shards = split_sharded_checkpoint(parts).unwrap().unwrap();
        let shard = prefix[1..].parse::<usize>().unwrap();
        let info = describe_checkpoint(&shards[shard]).unwrap();
        assert!(
            bundle < info.next_bundle && !info.rerun_bundles.contains(&bundle),
            "bundle {bundle} of {prefix} finalized when epoch {durable} was durable, \
             which does not hold it"
        );
        checked += 1;
    }
    assert!(checked > 0, "no finalization ran while the job ran");
}
