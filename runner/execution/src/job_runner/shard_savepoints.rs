//! Savepoints of a job on shards: a savepoint is the epoch shard 0 cuts
//! when asked (`EpochRequest`), once every shard's cut of it is in. The
//! epochs on their way from the collector to the checkpoint writer pass
//! by here, and the one asked for is kept for the requester (the job's
//! savepoint channel: `refract savepoint`, the UI, an update taking over).

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use refract_engine::manager::{EngineParts, EpochRequest, SavepointRequest, SnapshotError};
use tokio::sync::{mpsc, oneshot, watch};

/// Assembled epochs remembered for a requester that looks late: one is
/// cut, assembled and written well within the time two more take.
const EPOCHS_KEPT: usize = 4;

/// The latest epochs the collector put together, by number.
pub(super) struct AssembledEpochs {
    latest: Mutex<VecDeque<(u64, EngineParts)>>,
    count: watch::Sender<u64>,
}

impl AssembledEpochs {
    fn record(&self, parts: &[(String, Bytes)]) {
        let number = *self.count.borrow() + 1;
        let mut latest = self.latest.lock();
        latest.push_back((number, parts.to_vec()));
        while latest.len() > EPOCHS_KEPT {
            latest.pop_front();
        }
        drop(latest);
        self.count.send_replace(number);
    }

    /// Epoch `number`, once assembled; `None` if the collector ended
    /// first or it is no longer kept.
    async fn wait_for(&self, number: u64) -> Option<Vec<(String, Bytes)>> {
        let mut count = self.count.subscribe();
        count.wait_for(|n| *n >= number).await.ok()?;
        let latest = self.latest.lock();
        latest
            .iter()
            .find(|(n, _)| *n == number)
            .map(|(_, parts)| parts.clone())
    }
}

/// What [`pass_epochs`] returns: the sender for the collector, the epochs
/// remembered, and the task passing them on.
pub(super) type PassingEpochs = (
    mpsc::Sender<EngineParts>,
    Arc<AssembledEpochs>,
    tokio::task::JoinHandle<()>,
);

/// Passes every epoch from the collector on to `writer`, remembering the
/// latest: the sender to give the collector, what it remembers, and the
/// task (ending once the collector is gone and `writer` took the rest).
pub(super) fn pass_epochs(writer: mpsc::Sender<EngineParts>) -> PassingEpochs {
    let (tx, mut rx) = mpsc::channel::<Vec<(String, Bytes)>>(1);
    let assembled = Arc::new(AssembledEpochs {
        latest: Mutex::new(VecDeque::new()),
        count: watch::channel(0).0,
    });
    let recording = assembled.clone();
    let task = tokio::spawn(async move {
        while let Some(parts) = rx.recv().await {
            recording.record(&parts);
            if writer.send(parts).await.is_err() {
                break;
            }
        }
    });
    (tx, assembled, task)
}

/// Answers each savepoint request with the epoch shard 0 cuts for it
/// (through `epochs`), once assembled.
///
/// A request that stops the run ends the task once answered, so that the
/// run's end can wait for that answer (see [`StopAnswer`]).
pub(super) async fn answer_savepoints(
    mut requests: mpsc::Receiver<SavepointRequest>,
    epochs: mpsc::Sender<EpochRequest>,
    assembled: Arc<AssembledEpochs>,
    stopping: StopAnswer,
) {
    while let Some(SavepointRequest { stop, reply }) = requests.recv().await {
        if stop {
            stopping.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let (cut, epoch) = oneshot::channel();
        let gone = || SnapshotError::NotTaken("the job's engines ended before it".to_string());
        if epochs.send(EpochRequest { stop, cut }).await.is_err() {
            let _ = reply.send(Err(gone()));
            continue;
        }
        let parts = match epoch.await {
            Ok(epoch) => assembled.wait_for(epoch.number()).await,
            Err(_) => None,
        };
        let _ = reply.send(parts.ok_or_else(gone));
        if stop {
            return;
        }
    }
}

/// Whether a savepoint that stops the run was asked for: its answer comes
/// as the run ends, which must then wait for it rather than drop it.
#[derive(Debug, Clone, Default)]
pub(super) struct StopAnswer(Arc<std::sync::atomic::AtomicBool>);

impl StopAnswer {
    /// Whether a stopping savepoint is being answered.
    pub(super) fn asked(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Answers every savepoint request of a job on shards that is not
/// checkpointed with a refusal saying so.
pub(super) async fn refuse_savepoints(mut requests: mpsc::Receiver<SavepointRequest>) {
    while let Some(request) = requests.recv().await {
        let _ = request.reply.send(Err(SnapshotError::NotTaken(
            "a job on several shards (refract_shards) takes savepoints only when it is \
             checkpointed: on a server with --state_dir"
                .to_string(),
        )));
    }
}
