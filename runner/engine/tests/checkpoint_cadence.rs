//! When periodic checkpoints are taken, in paused time (the engine's clock
//! is tokio's, so the test controls it and nothing here depends on how
//! fast the machine is).
//!
//! A checkpoint that falls due while the writer is still writing the
//! previous one is taken as soon as that write ends — not an interval
//! later, and not queued behind it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{global_windowed, next_source_step, source_step, sourced_plan};
use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use refract_engine::coder::Coder;
use refract_engine::executor::{BundleInput, BundleOutput, ExecError, StageExecutor};
use refract_engine::manager::{CheckpointProgress, Engine, EngineConfig};
use refract_engine::plan::{PCollectionIdx, SdkStage, StageIdx, StageKind};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Source steps, one element each, each taking [`STEP`].
const STEPS: u32 = 200;
const STEP: Duration = Duration::from_millis(5);
/// The checkpoint interval, and how long a write takes: longer, so that
/// every checkpoint falls due during the previous write.
const EVERY: Duration = Duration::from_millis(100);
const WRITE: Duration = Duration::from_millis(150);

/// A stepped source feeding a sink that takes its elements.
struct Sdk;

impl StageExecutor for Sdk {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let output = if input.stage == StageIdx::new(1) {
            let step = source_step(&input);
            BundleOutput {
                outputs: vec![(PCollectionIdx::new(1), global_windowed(&[1, step as u8], 0))],
                residuals: next_source_step(step, STEPS),
                ..Default::default()
            }
        } else {
            BundleOutput::default()
        };
        async move {
            tokio::time::sleep(STEP).await;
            Ok(output)
        }
        .boxed()
    }
}

/// Writes each checkpoint in [`WRITE`], noting when each arrived and when
/// each write ended.
async fn write(
    mut checkpoints: mpsc::Receiver<Vec<(String, Bytes)>>,
    progress: watch::Sender<CheckpointProgress>,
    log: Arc<Mutex<Vec<(Instant, Instant)>>>,
) {
    let mut received = 0;
    while checkpoints.recv().await.is_some() {
        received += 1;
        let arrived = Instant::now();
        tokio::time::sleep(WRITE).await;
        log.lock().push((arrived, Instant::now()));
        progress.send_replace(CheckpointProgress::all_durable(received));
    }
}

/// Runs the stepped source into its sink, checkpointing every `every`
/// (zero: after every commit) to the writer `writer` makes of the
/// checkpoint channel and the progress it reports; the job must succeed,
/// whatever the writes do. Returns once the writer has ended.
async fn run_checkpointing<W>(
    every: Duration,
    writer: impl FnOnce(mpsc::Receiver<Vec<(String, Bytes)>>, watch::Sender<CheckpointProgress>) -> W,
) where
    W: std::future::Future<Output = ()> + Send + 'static,
{
    let plan = sourced_plan(Coder::Bytes, "sink", StageKind::Sdk(SdkStage::default()));
    let (tx, rx) = mpsc::channel(1);
    let (report, progress) = watch::channel(CheckpointProgress::default());
    let writer = tokio::spawn(writer(rx, report));
    let (_cancel, cancelled) = watch::channel(false);
    Engine::builder(
        plan,
        Arc::new(Sdk),
        EngineConfig::default(),
        "c",
        Arc::new(|| 0),
    )
    .checkpoints(every, tx, Some(progress))
    .build()
    .expect("a valid plan")
    .run(cancelled)
    .await
    .expect("the job succeeds, whatever the checkpoint writes do");
    writer.await.expect("the writer ends");
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_due_during_a_write_is_taken_when_the_write_ends() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let logged = log.clone();
    run_checkpointing(EVERY, move |rx, report| write(rx, report, logged)).await;
    let log = log.lock().clone();
    // About a second of steps: several checkpoints back to back.
    assert!(log.len() >= 5, "{} checkpoints", log.len());
    for pair in log.windows(2) {
        let ((_, ended), (next, _)) = (pair[0], pair[1]);
        assert!(
            next.duration_since(ended) < STEP * 2,
            "a checkpoint due {:?} before the write ended was taken {:?} after it",
            WRITE.saturating_sub(EVERY),
            next.duration_since(ended)
        );
    }
}

/// Fails every write (a full disk), instantly, noting when each arrived.
async fn fail_every_write(
    mut checkpoints: mpsc::Receiver<Vec<(String, Bytes)>>,
    progress: watch::Sender<CheckpointProgress>,
    log: Arc<Mutex<Vec<Instant>>>,
) {
    let mut received = 0;
    while checkpoints.recv().await.is_some() {
        received += 1;
        log.lock().push(Instant::now());
        progress.send_modify(|p| p.finished = received);
    }
}

#[tokio::test(start_paused = true)]
async fn failed_writes_make_the_next_attempt_wait_longer() {
    // A checkpoint after every commit: without a backoff, each failure
    // would be followed by another attempt at the next commit, 5 ms later
    // (400 attempts in all).
    let log = Arc::new(Mutex::new(Vec::new()));
    let logged = log.clone();
    run_checkpointing(Duration::ZERO, move |rx, report| {
        fail_every_write(rx, report, logged)
    })
    .await;
    let log = log.lock().clone();
    // About a second of steps, a commit every 5 ms: after the second
    // failure the waits double from 1 ms (1, 2, ..., 512 ms fit).
    assert!(
        (4..=16).contains(&log.len()),
        "{} attempts in {:?}",
        log.len(),
        log.last().map(|t| t.duration_since(log[0]))
    );
    for (n, pair) in log.windows(2).enumerate().skip(1) {
        let wait = pair[1].duration_since(pair[0]);
        let backoff = Duration::from_millis(1) * (1 << (n - 1));
        assert!(
            wait >= backoff,
            "attempt {} came {wait:?} after {} failures, before the {backoff:?} backoff",
            n + 2,
            n + 1
        );
    }
}

/// Runs the stepped source, checkpointing after every commit to a writer
/// that fails every write, tolerating `tolerable` failures in a row.
async fn run_with_failing_writes(tolerable: u32) -> (Result<(), String>, usize) {
    let plan = sourced_plan(Coder::Bytes, "sink", StageKind::Sdk(SdkStage::default()));
    let (tx, rx) = mpsc::channel(1);
    let (report, progress) = watch::channel(CheckpointProgress::default());
    let log = Arc::new(Mutex::new(Vec::new()));
    let writer = tokio::spawn(fail_every_write(rx, report, log.clone()));
    let (_cancel, cancelled) = watch::channel(false);
    let result = Engine::builder(
        plan,
        Arc::new(Sdk),
        EngineConfig::default(),
        "c",
        Arc::new(|| 0),
    )
    .tolerable_checkpoint_failures(tolerable)
    .checkpoints(Duration::ZERO, tx, Some(progress))
    .build()
    .expect("a valid plan")
    .run(cancelled)
    .await;
    writer.await.expect("the writer ends");
    let attempts = log.lock().len();
    (result.map(|_| ()).map_err(|e| e.to_string()), attempts)
}

#[tokio::test(start_paused = true)]
async fn checkpoint_failures_past_the_tolerated_count_stop_the_job() {
    for tolerable in [0, 2] {
        let (result, attempts) = run_with_failing_writes(tolerable).await;
        let error = result.expect_err("checkpoints keep failing");
        assert!(
            error.contains(&format!(
                "{} checkpoints in a row could not be written, more than the {tolerable} \
                 tolerated",
                tolerable + 1
            )),
            "{error}"
        );
        assert_eq!(attempts, tolerable as usize + 1);
    }
}

/// An engine restored from a cut only its caller holds (an update's, in
/// memory) checkpoints at once, not an interval later: from then on a
/// crash resumes from its own checkpoint.
#[tokio::test(start_paused = true)]
async fn a_restored_engine_asked_to_checkpoint_does_so_at_once() {
    let plan = sourced_plan(Coder::Bytes, "sink", StageKind::Sdk(SdkStage::default()));
    let cut = Engine::new(
        plan.clone(),
        Arc::new(Sdk),
        EngineConfig::default(),
        "c",
        Arc::new(|| 0),
    )
    .expect("a valid plan")
    .checkpoint_parts()
    .expect("a cut");
    let (tx, mut rx) = mpsc::channel(1);
    let (_cancel, cancelled) = watch::channel(false);
    let mut engine = Engine::builder(
        plan,
        Arc::new(Sdk),
        EngineConfig::default(),
        "c",
        Arc::new(|| 0),
    )
    .checkpoints(Duration::from_secs(3600), tx, None)
    .build()
    .expect("a valid plan");
    engine.restore(&cut).expect("the cut restores");
    engine.checkpoint_at_once();
    let started = Instant::now();
    let run = tokio::spawn(engine.run(cancelled));
    rx.recv().await.expect("a checkpoint");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    run.abort();
}
