//! Checkpoint writers that crash: shared by the tests that run a job, keep
//! the checkpoint a crash would leave, and finish the job from it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use refract_engine::executor::{BundleInput, BundleOutput, CommitAction, ExecError, StageExecutor};
use refract_engine::manager::{
    describe_checkpoint, CheckpointProgress, Engine, EngineConfig, RunSummary,
};
use refract_engine::plan::Plan;
use refract_engine::spill::MemorySpillSpace;
use tokio::sync::{mpsc, watch};

/// How a test's checkpoint writer behaves.
#[derive(Debug, Clone, Copy, Default)]
pub struct Writer {
    /// Keep the `n`th checkpoint and stop writing (a crash).
    pub crash_at: Option<u64>,
    /// The first `n` writes fail.
    pub failing: u64,
}

/// Writes checkpoints as `writer` says, each taking `write_time` (as on a
/// disk, so bundles run meanwhile); returns how many it received, and the
/// one it crashed at. The engine must not send the next checkpoint before
/// this one's write has ended (durable or failed).
pub async fn write_until(
    mut checkpoints: mpsc::Receiver<Vec<(String, Bytes)>>,
    progress: watch::Sender<CheckpointProgress>,
    writer: Writer,
    write_time: Duration,
) -> (u64, Option<Vec<(String, Bytes)>>) {
    let mut received = 0;
    while let Some(parts) = checkpoints.recv().await {
        received += 1;
        tokio::time::sleep(write_time).await;
        assert!(
            checkpoints.is_empty(),
            "checkpoint {} was taken while checkpoint {received} was still being written",
            received + 1
        );
        if received <= writer.failing {
            progress.send_modify(|p| p.finished = received);
            continue;
        }
        progress.send_replace(CheckpointProgress::all_durable(received));
        if Some(received) == writer.crash_at {
            return (received, Some(parts));
        }
    }
    (received, None)
}

/// The number of `input`'s bundle (what a checkpoint's `next_bundle` and
/// `rerun_bundles` count in).
pub fn bundle_number(input: &BundleInput) -> u64 {
    input
        .bundle_id
        .rsplit_once("-b")
        .and_then(|(_, n)| n.parse().ok())
        .expect("bundle ids end in -b<number>")
}

/// Where an engine sends its checkpoints, and where their progress comes
/// back.
pub type Checkpoints = (
    mpsc::Sender<Vec<(String, Bytes)>>,
    watch::Receiver<CheckpointProgress>,
);

/// What a test's stage committed: (bundle number, what it recorded).
pub type Commits<T> = Arc<Mutex<Vec<(u64, T)>>>;

/// A bundle's output that records `what` in `committed` under `input`'s
/// bundle number when (and only if) the bundle commits.
pub fn recorded_on_commit<T: Send + 'static>(
    committed: &Commits<T>,
    input: &BundleInput,
    what: T,
) -> BundleOutput {
    let bundle = bundle_number(input);
    let committed = committed.clone();
    BundleOutput {
        on_commit: Some(CommitAction::new(move || {
            committed.lock().push((bundle, what))
        })),
        ..Default::default()
    }
}

/// `output`, a millisecond later (the engine's loop turns between
/// bundles, so checkpoints fall between them).
pub fn after_a_millisecond(
    output: BundleOutput,
) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
    async move {
        tokio::time::sleep(Duration::from_millis(1)).await;
        Ok(output)
    }
    .boxed()
}

/// How a run of [`run_crashing_at`] went.
pub enum Crash {
    /// The writer never reached its crash: the run ended by itself.
    None(RunSummary),
    /// It crashed at this checkpoint, and a restored engine finished.
    At(Vec<(String, Bytes)>),
}

/// Runs an engine that `engine` makes (given where to send checkpoints
/// and where their progress comes back) against `writer`. If the writer
/// crashes, the commits its checkpoint does not count as done are dropped
/// from `committed` (a crash loses them) and a second engine from
/// `engine`, restored from that checkpoint, finishes the job.
pub async fn run_crashing_at<T>(
    engine: impl Fn(mpsc::Sender<Vec<(String, Bytes)>>, watch::Receiver<CheckpointProgress>) -> Engine,
    committed: &Commits<T>,
    writer: Writer,
    write_time: Duration,
) -> Crash {
    let (cancel, cancelled) = watch::channel(false);
    let (tx, rx) = mpsc::channel(1);
    let (report, progress) = watch::channel(CheckpointProgress::default());
    let first = tokio::spawn(engine(tx, progress).run(cancelled));
    let (_, kept) = write_until(rx, report, writer, write_time).await;
    let _ = cancel.send(true);
    let finished_first = first.await.expect("no panic");
    let Some(parts) = kept else {
        return Crash::None(finished_first.expect("the run without a crash succeeds"));
    };
    let info = describe_checkpoint(&parts).expect("readable");
    committed
        .lock()
        .retain(|(b, _)| *b < info.next_bundle && !info.rerun_bundles.contains(b));
    let (tx, rx) = mpsc::channel(1);
    let (report, progress) = watch::channel(CheckpointProgress::default());
    let mut restored = engine(tx, progress);
    restored.restore(&parts).expect("restores");
    let writer = tokio::spawn(write_until(rx, report, Writer::default(), write_time));
    let (_cancel, cancelled) = watch::channel(false);
    restored
        .run(cancelled)
        .await
        .expect("the restored run succeeds");
    writer
        .await
        .expect("the writer saw one checkpoint at a time");
    Crash::At(parts)
}

/// What [`crash_matrix`] saw for one number of failing writes.
pub struct CrashTally {
    /// How many checkpoint writes failed before the others.
    pub failing: u64,
    /// Runs that crashed (the others ended before their crash point).
    pub crashed: u32,
    /// Crashed runs whose checkpoint named data on the durable spill space.
    pub named: u32,
}

/// Runs a job (`run`, given how its checkpoint writer behaves) with 0 and
/// then 2 failing writes first: once without a crash, and once crashing
/// at each of the `crashes` checkpoints after the failed ones. Every run
/// must end within 30 s with `expected` (`describe` says what it had
/// instead); `run` also says whether it crashed (`Some`) and whether its
/// checkpoint named data on the durable spill space. One tally per number of
/// failing writes.
pub async fn crash_matrix<T: PartialEq, F: Future<Output = (T, Option<bool>)>>(
    crashes: u64,
    expected: &T,
    describe: impl Fn(&T) -> String,
    run: impl Fn(Writer) -> F,
) -> Vec<CrashTally> {
    let mut tallies = Vec::new();
    for failing in [0, 2] {
        let mut tally = CrashTally {
            failing,
            crashed: 0,
            named: 0,
        };
        let crash_points = (failing + 1..=failing + crashes).map(Some);
        for crash_at in std::iter::once(None).chain(crash_points) {
            let writer = Writer { crash_at, failing };
            let (got, crash) = tokio::time::timeout(Duration::from_secs(30), run(writer))
                .await
                .unwrap_or_else(|_| panic!("{writer:?}: the run did not end"));
            assert!(got == *expected, "{writer:?}: {}", describe(&got));
            tally.crashed += u32::from(crash.is_some());
            tally.named += u32::from(crash == Some(true));
        }
        tallies.push(tally);
    }
    tallies
}

/// Whether restoring `parts` into an engine that `engine` makes is
/// refused: given one over an empty durable spill space, whether the checkpoint
/// names data it expects to find there.
pub fn restore_refused(
    engine: impl FnOnce(
        mpsc::Sender<Vec<(String, Bytes)>>,
        watch::Receiver<CheckpointProgress>,
    ) -> Engine,
    parts: &[(String, Bytes)],
) -> bool {
    let (tx, _rx) = mpsc::channel(1);
    let (_report, progress) = watch::channel(CheckpointProgress::default());
    engine(tx, progress).restore(parts).is_err()
}

/// An engine running `plan` on `executor` with `config`, spilling past
/// `limit` bytes (bags, queues and streaming GroupByKeys to `durable`,
/// beside the checkpoints), checkpointing after every commit to `tx`.
pub fn durable_engine(
    plan: Plan,
    executor: Arc<dyn StageExecutor>,
    config: EngineConfig,
    durable: &Arc<MemorySpillSpace>,
    limit: usize,
    (tx, progress): Checkpoints,
) -> Engine {
    Engine::builder(plan, executor, config, "d", Arc::new(|| 0))
        .checkpoints(Duration::ZERO, tx, Some(progress))
        .spill(MemorySpillSpace::shared(), b"d", limit)
        .durable_state(durable.clone())
        .build()
        .expect("a valid plan")
}
