//! Bundle finalization waits for durability: a bundle's `on_durable`
//! action (a source acknowledging what it read) runs only once a checkpoint
//! holding the bundle's commit is written — never before, or a crash would
//! redo work whose input was already acknowledged away.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

use bytes::Bytes;
use common::{global_pcollection, stage};
use futures::future::BoxFuture;
use futures::FutureExt;
use refract_engine::coder::{encode_windowed_value, Coder, PaneInfo, WindowedValueHeader};
use refract_engine::executor::{BundleInput, BundleOutput, CommitAction, ExecError, StageExecutor};
use refract_engine::manager::{CheckpointProgress, Engine, EngineBuilder, EngineConfig};
use refract_engine::plan::{PCollectionIdx, Plan, SdkStage, StageIdx, StageKind};
use refract_engine::window::Window;
use tokio::sync::{mpsc, watch};

/// Stage 1 reads (one element out) and asks to be finalized; stage 2
/// holds the job open until `release` turns true.
struct Finalizing {
    finalized: Arc<AtomicBool>,
    release: watch::Receiver<bool>,
}

impl StageExecutor for Finalizing {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let finalized = self.finalized.clone();
        let mut release = self.release.clone();
        async move {
            if input.stage == StageIdx::new(2) {
                let _ = release.wait_for(|r| *r).await;
                return Ok(BundleOutput::default());
            }
            let mut element = Vec::new();
            let header = WindowedValueHeader {
                timestamp: 0,
                windows: smallvec::smallvec![Window::Global],
                pane: PaneInfo::NO_FIRING,
            };
            encode_windowed_value(&header, &Coder::GlobalWindow, &[0], &mut element)
                .expect("encodes");
            Ok(BundleOutput {
                outputs: vec![(PCollectionIdx::new(1), Bytes::from(element))],
                on_durable: Some(CommitAction::new(move || {
                    finalized.store(true, Ordering::SeqCst)
                })),
                ..Default::default()
            })
        }
        .boxed()
    }
}

/// The executor, and the flag its finalization sets.
fn finalizing(release: watch::Receiver<bool>) -> (Arc<AtomicBool>, Arc<Finalizing>) {
    let finalized = Arc::new(AtomicBool::new(false));
    let executor = Arc::new(Finalizing {
        finalized: finalized.clone(),
        release,
    });
    (finalized, executor)
}

fn engine(executor: Arc<Finalizing>) -> EngineBuilder {
    Engine::builder(
        plan(),
        executor,
        EngineConfig::default(),
        "f",
        Arc::new(|| 0),
    )
}

fn plan() -> Plan {
    let sdk = || StageKind::Sdk(SdkStage::default());
    Plan {
        pcollections: vec![
            global_pcollection("impulse", Coder::Bytes),
            global_pcollection("read", Coder::Bytes),
        ]
        .into(),
        stages: vec![
            stage("impulse", StageKind::Impulse, vec![], vec![0]),
            stage("read", sdk(), vec![0], vec![1]),
            stage("slow sink", sdk(), vec![1], vec![]),
        ]
        .into(),
        names: Default::default(),
    }
}

#[tokio::test]
async fn finalization_runs_once_the_checkpoint_holding_the_commit_is_written() {
    let (release_tx, release) = watch::channel(false);
    let (finalized, executor) = finalizing(release);
    let (tx, mut checkpoints) = mpsc::channel(1);
    let (acks, written) = watch::channel(CheckpointProgress::default());
    let (_cancel, cancelled) = watch::channel(false);
    let engine = engine(executor)
        // A checkpoint after every commit.
        .checkpoints(Duration::ZERO, tx, Some(written))
        .build()
        .expect("a valid plan");
    let run = tokio::spawn(engine.run(cancelled));
    // The checkpoint taken after the bundle committed arrives; until it is
    // written, nothing is finalized.
    let first = checkpoints.recv().await.expect("a checkpoint");
    assert!(!first.is_empty());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !finalized.load(Ordering::SeqCst),
        "finalized before its checkpoint was written"
    );
    acks.send_replace(CheckpointProgress::all_durable(1));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !finalized.load(Ordering::SeqCst) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not finalized after the checkpoint was written"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Let the run end: later checkpoints are written too.
    let _ = release_tx.send(true);
    let writer = tokio::spawn(async move {
        let mut n = 1;
        while checkpoints.recv().await.is_some() {
            n += 1;
            acks.send_replace(CheckpointProgress::all_durable(n));
        }
    });
    run.await.expect("no panic").expect("the run succeeds");
    let _ = writer.await;
}

#[tokio::test]
async fn without_checkpoints_finalization_follows_the_commit() {
    let (_release, release) = watch::channel(true);
    let (finalized, executor) = finalizing(release);
    let (_cancel, cancelled) = watch::channel(false);
    engine(executor)
        .build()
        .expect("a valid plan")
        .run(cancelled)
        .await
        .expect("the run succeeds");
    assert!(finalized.load(Ordering::SeqCst));
}
