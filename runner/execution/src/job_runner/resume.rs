//! Starting a job's engines from a checkpoint: its own latest one (a
//! recovered job), a savepoint, or the cut of the job it updates. The same
//! for one engine and for a job's shards, which each restore their own
//! part of a sharded checkpoint.

use refract_engine::manager::{split_sharded_checkpoint, Engine, NameMapping};
use refract_engine::shards::ShardLayout;
use refract_jobservice::Job;
use refract_observability::insights::JobView;
use refract_proto::job_api::job_message::MessageImportance;
use refract_store::Checkpoint;
use tracing::info;

use super::JobError;
use crate::shard_metrics::ShardMetrics;

/// Restores `engines` (one engine, or every shard of the job, whose
/// committed metrics `shard_metrics` keeps) and the job's metrics from
/// `checkpoint`. A savepoint or a handed-over cut (id 0)
/// may be of an earlier version of the pipeline, named otherwise:
/// `mapping` renames its transforms; the job's own checkpoints are of this
/// version and keep their names.
pub(super) fn resume(
    engines: &mut [Engine],
    checkpoint: &Checkpoint,
    mapping: &NameMapping,
    job: &Job,
    view: &JobView,
    shard_metrics: Option<&ShardMetrics>,
) -> Result<(), JobError> {
    let no_renames = NameMapping::new();
    let renamed = match checkpoint.id {
        0 => mapping,
        _ => &no_renames,
    };
    for engine in engines.iter_mut() {
        engine.restore_renamed(&checkpoint.parts, renamed)?;
        if checkpoint.id == 0 {
            // Durable from the cut on, in this pipeline's names.
            engine.checkpoint_at_once();
        }
    }
    // Metrics move with the state: a one-engine checkpoint's are one old
    // shard's, and one engine adds up every old shard's.
    match (split_sharded_checkpoint(&checkpoint.parts)?, shard_metrics) {
        (Some(shards), Some(metrics)) => metrics.restore(job, &shards, renamed)?,
        (Some(shards), None) => {
            ShardMetrics::new(ShardLayout::ONE).restore(job, &shards, renamed)?
        }
        (None, Some(metrics)) => {
            metrics.restore(job, std::slice::from_ref(&checkpoint.parts), renamed)?
        }
        (None, None) => crate::durability::restore_metrics(job, &checkpoint.parts, renamed)?,
    }
    if checkpoint.id > 0 {
        view.observe_restore(checkpoint.id);
        info!(
            checkpoint = checkpoint.id,
            "resuming from the job's checkpoint"
        );
        job.message(
            MessageImportance::JobMessageBasic,
            format!("resumed from checkpoint {}", checkpoint.id),
        );
    }
    Ok(())
}
