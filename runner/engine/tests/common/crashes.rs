//! Checkpoint writers that crash: shared by the tests that run a job, keep
//! the checkpoint a crash would leave, and finish the job from it.

use std::time::Duration;

use bytes::Bytes;
use refract_engine::executor::BundleInput;
use refract_engine::manager::CheckpointProgress;
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
