//! A job on several engine shards in this process
//! (`--experiments=refract_shards=N`, see [`super::SHARDS_EXPERIMENT`]):
//! one engine per shard over the same plan and the same SDK workers,
//! joined by the in-process exchange, their stage snapshots added up into
//! the job's. The step before shards on other hosts: the same engines, the
//! same partitioning and watermarks, with the exchange in between.

use std::sync::Arc;

use refract_engine::executor::StageExecutor;
use refract_engine::manager::{
    run_shards, Engine, EngineConfig, EngineError, RunSummary, SavepointRequest, SnapshotError,
    StageStats,
};
use refract_engine::plan::Plan;
use refract_engine::shards::{ShardLayout, ShardLink};
use refract_engine::spill::SpillSpace;
use refract_engine::time::wall_clock_ms;
use refract_jobservice::Job;
use refract_proto::job_api::job_message::MessageImportance;
use tokio::sync::{mpsc, watch};

use super::SHARDS_EXPERIMENT;

/// What a sharded run of one job needs.
pub(super) struct ShardedJob<'a> {
    pub(super) layout: ShardLayout,
    pub(super) plan: Plan,
    pub(super) executor: Arc<dyn StageExecutor>,
    pub(super) config: EngineConfig,
    pub(super) job: &'a Job,
    /// Where the job's stage snapshots go.
    pub(super) stats: watch::Sender<Vec<StageStats>>,
    /// The spill space and each stage's share of memory, if the job may
    /// spill.
    pub(super) spill: Option<(Arc<dyn SpillSpace>, usize)>,
    /// Savepoint requests, each answered with a refusal: shards take no
    /// checkpoints yet.
    pub(super) savepoints: mpsc::Receiver<SavepointRequest>,
    /// The job writes checkpoints or starts from one, which shards do not
    /// do yet (submission refuses such jobs; this is the last guard).
    pub(super) checkpointed: bool,
}

/// Runs `sharded` to its end: the shards' summaries added up, or the
/// first shard's failure.
pub(super) async fn run_on_shards(sharded: ShardedJob<'_>) -> Result<RunSummary, EngineError> {
    let ShardedJob {
        layout,
        plan,
        executor,
        config,
        job,
        stats,
        spill,
        savepoints,
        checkpointed,
    } = sharded;
    if checkpointed {
        return Err(EngineError::Misconfigured(format!(
            "--experiments={SHARDS_EXPERIMENT}=N cannot start from or write checkpoints yet"
        )));
    }
    job.message(
        MessageImportance::JobMessageBasic,
        format!(
            "running on {} engine shards in this process; its state is not checkpointed",
            layout.shards()
        ),
    );
    // The job's memory grant is shared by its shards: each holds its
    // share of every bound, so N shards hold what one engine would.
    let shards = layout.shards() as usize;
    let config = EngineConfig {
        max_pending_bytes: shard_share(config.max_pending_bytes, shards),
        ..config
    };
    let spill = spill.map(|(store, limit_bytes)| (store, shard_share(limit_bytes, shards)));
    let mut engines = Vec::new();
    let mut snapshots = Vec::new();
    for link in ShardLink::in_process(layout) {
        let (tx, rx) = watch::channel(Vec::new());
        // Bundle ids are unique across the shards sharing the workers.
        let prefix = format!("{}-s{}", job.id(), link.id().index());
        let mut builder = Engine::builder(
            plan.clone(),
            executor.clone(),
            config.clone(),
            prefix,
            Arc::new(wall_clock_ms),
        )
        .drain(job.drain_requested())
        .stats(tx)
        .shard(link);
        if let Some((store, limit_bytes)) = &spill {
            builder = builder.spill(store.clone(), job.id().as_bytes(), *limit_bytes);
        }
        engines.push(builder.build()?);
        snapshots.push(rx);
    }
    let adding = tokio::spawn(add_up_snapshots(snapshots, stats));
    let refusing = tokio::spawn(refuse_savepoints(savepoints));
    let summary = run_shards(engines, job.cancel_requested()).await;
    // Every shard's engine is gone: the last snapshots are in.
    let _ = adding.await;
    refusing.abort();
    summary
}

/// One shard's part of a bound of `bytes` shared by `shards` shards (at
/// least a byte).
fn shard_share(bytes: usize, shards: usize) -> usize {
    (bytes / shards.max(1)).max(1)
}

/// Publishes the job's stage snapshots, added up from its shards', each
/// time a shard publishes, until every shard's engine is gone.
async fn add_up_snapshots(
    shards: Vec<watch::Receiver<Vec<StageStats>>>,
    job: watch::Sender<Vec<StageStats>>,
) {
    let (changed_tx, mut changed) = mpsc::channel::<()>(1);
    for mut shard in shards.iter().cloned() {
        let changed_tx = changed_tx.clone();
        tokio::spawn(async move {
            while shard.changed().await.is_ok() {
                // Full: an add-up is due already and will see this one.
                let _ = changed_tx.try_send(());
            }
        });
    }
    drop(changed_tx);
    while changed.recv().await.is_some() {
        let parts: Vec<Vec<StageStats>> = shards.iter().map(|s| s.borrow().clone()).collect();
        job.send_replace(StageStats::across_shards(&parts));
    }
}

/// Answers every savepoint request with [`SnapshotError::OnShards`].
async fn refuse_savepoints(mut requests: mpsc::Receiver<SavepointRequest>) {
    while let Some(request) = requests.recv().await {
        let _ = request.reply.send(Err(SnapshotError::OnShards));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_a_bound_between_them() {
        assert_eq!(shard_share(64 << 20, 4), 16 << 20);
        assert_eq!(shard_share(usize::MAX, 128), usize::MAX / 128);
        assert_eq!(shard_share(2, 3), 1, "never zero");
    }
}
