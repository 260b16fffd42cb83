//! A job on several engine shards in this process
//! (`--experiments=refract_shards=N`, see [`super::SHARDS_EXPERIMENT`]):
//! one engine per shard over the same plan and the same SDK workers,
//! joined by the in-process board or by the frame protocol over gRPC on
//! the loopback interface ([`super::SHARD_EXCHANGE_EXPERIMENT`]), their
//! stage snapshots added up into the job's, their cuts of each checkpoint
//! epoch put together into the job's checkpoints. The step before shards
//! on other hosts: the same engines, the same partitioning, watermarks and
//! epochs, and with gRPC the same transport.

use std::sync::Arc;

use refract_engine::executor::StageExecutor;
use refract_engine::manager::{
    collect_epochs, run_shards, Engine, EngineConfig, NameMapping, RunSummary, SavepointRequest,
    StageStats,
};
use refract_engine::plan::Plan;
use refract_engine::shards::{ShardLayout, ShardLink};
use refract_engine::spill::SpillSpace;
use refract_engine::time::wall_clock_ms;
use refract_exchange::{LoopbackExchange, DEFAULT_WINDOW_BYTES};
use refract_jobservice::Job;
use refract_observability::insights::JobView;
use refract_proto::job_api::job_message::MessageImportance;
use refract_store::Checkpoint;
use tokio::sync::{mpsc, watch};

use super::job_options::ShardExchange;
use super::resume::resume;
use super::shard_savepoints::{answer_savepoints, pass_epochs, refuse_savepoints, StopAnswer};
use super::JobError;
use crate::durability::{CheckpointWriter, METRICS_PART};
use crate::shard_metrics::ShardMetrics;

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
    /// Savepoint requests, each answered with an epoch cut for it (a
    /// refusal if the job is not checkpointed).
    pub(super) savepoints: mpsc::Receiver<SavepointRequest>,
    /// How the job's checkpoints are written, if it is checkpointed.
    pub(super) checkpoints: Option<ShardedCheckpoints>,
    /// The checkpoint to start from, if any (see [`resume`]).
    pub(super) resume_from: Option<&'a Checkpoint>,
    /// How a savepoint's transforms are renamed.
    pub(super) mapping: &'a NameMapping,
    /// The job's view, which counts restores.
    pub(super) view: &'a JobView,
    /// Each shard's committed metrics, which its cuts hold.
    pub(super) metrics: Arc<ShardMetrics>,
    /// How the shards exchange.
    pub(super) exchange: ShardExchange,
}

/// How a sharded job's checkpoints are written: each epoch, put together
/// from every shard's cut (with that shard's committed metrics), goes to
/// `writer`.
pub(super) struct ShardedCheckpoints {
    pub(super) writer: CheckpointWriter,
    pub(super) every: std::time::Duration,
    pub(super) tolerable_failures: u32,
}

/// Runs `sharded` to its end: the shards' summaries added up, or the
/// first shard's failure.
pub(super) async fn run_on_shards(sharded: ShardedJob<'_>) -> Result<RunSummary, JobError> {
    let ShardedJob {
        layout,
        plan,
        executor,
        config,
        job,
        stats,
        spill,
        savepoints,
        checkpoints,
        resume_from,
        mapping,
        view,
        metrics,
        exchange,
    } = sharded;
    let durable = if checkpoints.is_some() {
        "each checkpoint an epoch every shard cuts"
    } else {
        "its state is not checkpointed"
    };
    let joined = match exchange {
        ShardExchange::Board => "joined in memory",
        ShardExchange::Grpc => "exchanging over gRPC on the loopback interface",
    };
    job.message(
        MessageImportance::JobMessageBasic,
        format!(
            "running on {} engine shards in this process, {joined}; {durable}",
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
    // Savepoints are epochs shard 0 cuts on request, taken on their way
    // to the writer; without checkpoints there are none.
    let (epoch_requests, epoch_requests_rx) = mpsc::channel(4);
    let epoch_requests_rx = Some(epoch_requests_rx);
    let (ends, collector, writing, savepointing) = match checkpoints {
        Some(ShardedCheckpoints {
            writer,
            every,
            tolerable_failures,
        }) => {
            let (to_writer, assembled, passing) = pass_epochs(writer.tx);
            let (ends, collector) = collect_epochs(
                layout.shards(),
                Vec::new(),
                to_writer,
                Some(writer.progress),
            );
            let ends: Vec<_> = ends
                .into_iter()
                .map(|end| Some((end, every, tolerable_failures)))
                .collect();
            let savepointing = tokio::spawn(answer_savepoints(
                savepoints,
                epoch_requests,
                assembled,
                StopAnswer::default(),
            ));
            (
                ends,
                Some(tokio::spawn(collector)),
                Some((passing, writer.task)),
                savepointing,
            )
        }
        None => (
            (0..shards).map(|_| None).collect(),
            None,
            None,
            tokio::spawn(refuse_savepoints(savepoints)),
        ),
    };
    let parts = ShardParts {
        plan: &plan,
        executor: &executor,
        config: &config,
        job,
        spill: spill.as_ref(),
        metrics: &metrics,
    };
    let (links, loopback) = join_shards(layout, exchange, config.max_pending_bytes).await?;
    let (mut engines, snapshots) = parts.engines(links, ends, epoch_requests_rx)?;
    if let Some(checkpoint) = resume_from {
        resume(&mut engines, checkpoint, mapping, job, view, Some(&metrics))?;
    }
    let adding = tokio::spawn(add_up_snapshots(snapshots, stats));
    let summary = run_shards(engines, job.cancel_requested()).await;
    // Every shard's engine is gone: the last snapshots are in, and the
    // collector hands the writer what it has and ends, then the writer.
    let _ = adding.await;
    if let Some(collector) = collector {
        let _ = collector.await;
    }
    if let Some((passing, writing)) = writing {
        let _ = passing.await;
        let _ = writing.await;
    }
    savepointing.abort();
    if let Some(loopback) = loopback {
        stop_exchange(loopback).await;
    }
    Ok(summary?)
}

/// The links of `layout`'s shards over `exchange`, and the loopback
/// exchange carrying them, if any, to stop once the shards are done.
/// What may be in flight from one shard to all the others is one queue's
/// bound (`queue_bound`), shared by its streams.
async fn join_shards(
    layout: ShardLayout,
    exchange: ShardExchange,
    queue_bound: usize,
) -> Result<(Vec<ShardLink>, Option<LoopbackExchange>), JobError> {
    Ok(match exchange {
        ShardExchange::Board => (ShardLink::in_process(layout), None),
        ShardExchange::Grpc => {
            let window = exchange_window(layout, queue_bound);
            let (loopback, links) = LoopbackExchange::start(layout, window).await?;
            (links, Some(loopback))
        }
    })
}

/// The credit of each of a shard's outbound streams when what may be in
/// flight from it to all the others is one queue's bound (`queue_bound`),
/// shared by its streams.
pub(super) fn exchange_window(layout: ShardLayout, queue_bound: usize) -> usize {
    let others = (layout.shards() as usize).saturating_sub(1).max(1);
    (queue_bound / others).clamp(64 << 10, DEFAULT_WINDOW_BYTES)
}

/// Stops `loopback`, whose streams ended with the shards' engines.
async fn stop_exchange(loopback: LoopbackExchange) {
    if tokio::time::timeout(EXCHANGE_STOP, loopback.stop())
        .await
        .is_err()
    {
        tracing::warn!("the shards' exchange server did not stop within 10 s");
    }
}

/// How long the end of a run waits for its exchange's server to stop.
const EXCHANGE_STOP: std::time::Duration = std::time::Duration::from_secs(10);

/// What every shard's engine of one job is built from.
pub(super) struct ShardParts<'a> {
    pub(super) plan: &'a Plan,
    pub(super) executor: &'a Arc<dyn StageExecutor>,
    pub(super) config: &'a EngineConfig,
    pub(super) job: &'a Job,
    pub(super) spill: Option<&'a (Arc<dyn SpillSpace>, usize)>,
    pub(super) metrics: &'a Arc<ShardMetrics>,
}

/// Where one shard publishes its stage snapshots.
pub(super) type StageSnapshots = watch::Receiver<Vec<StageStats>>;

/// A shard's checkpointing: its end of the collector, the interval and
/// the failed writes tolerated.
pub(super) type ShardCheckpointing = (
    refract_engine::manager::ShardCheckpoints,
    std::time::Duration,
    u32,
);

impl ShardParts<'_> {
    /// The engine of every shard on `links` (each with its end of the
    /// collector in `ends`, if checkpointed; shard 0 taking epoch
    /// requests), and where each publishes its stage snapshots.
    pub(super) fn engines(
        &self,
        links: Vec<ShardLink>,
        ends: Vec<Option<ShardCheckpointing>>,
        mut epoch_requests: Option<mpsc::Receiver<refract_engine::manager::EpochRequest>>,
    ) -> Result<(Vec<Engine>, Vec<StageSnapshots>), JobError> {
        let mut engines = Vec::new();
        let mut snapshots = Vec::new();
        for (link, checkpointing) in links.into_iter().zip(ends) {
            let link_id = link.id();
            let (tx, rx) = watch::channel(Vec::new());
            // Bundle ids are unique across the shards sharing the workers.
            let prefix = format!("{}-s{}", self.job.id(), link_id.index());
            let mut builder = Engine::builder(
                self.plan.clone(),
                self.executor.clone(),
                self.config.clone(),
                prefix,
                Arc::new(wall_clock_ms),
            )
            .drain(self.job.drain_requested())
            .stats(tx)
            .shard(link);
            if let Some((store, limit_bytes)) = self.spill {
                builder = builder.spill(store.clone(), self.job.id().as_bytes(), *limit_bytes);
            }
            if let Some((end, every, tolerable_failures)) = checkpointing {
                builder = builder
                    .checkpoints(every, end.tx, Some(end.progress))
                    .tolerable_checkpoint_failures(tolerable_failures)
                    .extra_part(METRICS_PART, self.metrics.part(link_id));
                if link_id.index() == 0 {
                    if let Some(requests) = epoch_requests.take() {
                        builder = builder.epoch_requests(requests);
                    }
                }
            }
            engines.push(builder.build()?);
            snapshots.push(rx);
        }
        Ok((engines, snapshots))
    }
}

/// One shard's part of a bound of `bytes` shared by `shards` shards (at
/// least a byte).
pub(super) fn shard_share(bytes: usize, shards: usize) -> usize {
    (bytes / shards.max(1)).max(1)
}

/// Publishes the job's stage snapshots, added up from its shards', each
/// time a shard publishes, until every shard's engine is gone.
pub(super) async fn add_up_snapshots(
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
