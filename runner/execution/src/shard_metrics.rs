//! The committed metrics of a job on shards, kept per shard as well as for
//! the job.
//!
//! A checkpoint holds the metrics committed by the bundles it counts as
//! done, so that a resumed job counts each bundle once. One engine reads
//! the job's totals as it cuts; shards cut at different moments, so each
//! shard's cut holds the totals of the bundles *its* engine committed, and
//! a resume adds the shards' totals up into the job's.

use std::sync::Arc;

use bytes::Bytes;
use prost::Message;
use refract_engine::manager::{ExtraPart, NameMapping};
use refract_engine::shards::{ShardId, ShardLayout};
use refract_jobservice::{Job, JobMetrics};
use refract_proto::job_api::MetricResults;
use refract_proto::pipeline::MonitoringInfo;

use crate::durability::{checkpointed_metrics, DurabilityError};

/// Per shard, the metrics its engine's bundles committed.
#[derive(Debug)]
pub struct ShardMetrics {
    shards: Vec<JobMetrics>,
}

impl ShardMetrics {
    /// Empty totals for every shard of `layout`.
    pub fn new(layout: ShardLayout) -> Self {
        Self {
            shards: layout.ids().map(|_| JobMetrics::default()).collect(),
        }
    }

    /// Adds a committed bundle's metrics to `shard`'s totals.
    pub fn commit(&self, shard: ShardId, infos: &[MonitoringInfo]) {
        if let Some(totals) = self.shards.get(shard.index()) {
            totals.commit(infos);
        }
    }

    /// The totals of `shards` together: what a process hosting only
    /// those shards of a job counts as its part of the job's metrics.
    pub fn totals_of(&self, shards: &[ShardId]) -> Vec<MonitoringInfo> {
        shards
            .iter()
            .filter_map(|shard| self.shards.get(shard.index()))
            .flat_map(JobMetrics::committed_infos)
            .collect()
    }

    /// The checkpoint part of `shard`'s totals, read as its engine cuts.
    pub fn part(self: &Arc<Self>, shard: ShardId) -> ExtraPart {
        let metrics = self.clone();
        Arc::new(move || {
            let committed = metrics
                .shards
                .get(shard.index())
                .map(JobMetrics::committed_infos)
                .unwrap_or_default();
            let results = MetricResults {
                committed,
                attempted: Vec::new(),
            };
            Bytes::from(results.encode_to_vec())
        })
    }

    /// Puts each shard's totals back from its parts of a sharded checkpoint
    /// (`shards`, in shard order; moved to this pipeline's transform ids,
    /// with `renamed`, as one engine's are), and their sum into `job`'s
    /// metrics. A shard without a metrics part starts from zero.
    pub fn restore(
        &self,
        job: &Job,
        shards: &[Vec<(String, Bytes)>],
        renamed: &NameMapping,
    ) -> Result<(), DurabilityError> {
        let mut per_shard = Vec::with_capacity(shards.len());
        for parts in shards {
            per_shard.push(checkpointed_metrics(job, parts, renamed)?.unwrap_or_default());
        }
        job.metrics().restore(&self.restore_shards(per_shard));
        Ok(())
    }

    /// Puts each shard's totals back from the old shards' (in shard
    /// order); returns them all, for the job's. A checkpoint of another
    /// number of shards gives old shard `k`'s totals to shard `k % n`, as
    /// it gives its unkeyed state: the job's sum is the same.
    fn restore_shards(&self, per_shard: Vec<Vec<MonitoringInfo>>) -> Vec<MonitoringInfo> {
        for totals in &self.shards {
            totals.restore(&[]);
        }
        let mut all = Vec::new();
        for (k, infos) in per_shard.into_iter().enumerate() {
            if let Some(totals) = self.shards.get(k % self.shards.len().max(1)) {
                totals.commit(&infos);
            }
            all.extend(infos);
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_engine::coder::encode_varint_u64;

    fn counter(n: u64) -> MonitoringInfo {
        let mut payload = Vec::new();
        encode_varint_u64(n, &mut payload);
        MonitoringInfo {
            urn: "beam:metric:user:sum_int64:v1".into(),
            r#type: "beam:metrics:sum_int64:v1".into(),
            payload,
            labels: [
                ("PTRANSFORM".to_string(), "t".to_string()),
                ("NAMESPACE".to_string(), "n".to_string()),
                ("NAME".to_string(), "c".to_string()),
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn each_shards_part_holds_its_own_commits_and_a_restore_adds_them_up() {
        let layout = ShardLayout::new(2).expect("a layout");
        let metrics = Arc::new(ShardMetrics::new(layout));
        let ids: Vec<ShardId> = layout.ids().collect();
        metrics.commit(ids[0], &[counter(3)]);
        metrics.commit(ids[1], &[counter(4)]);
        metrics.commit(ids[1], &[counter(1)]);
        let decoded = |id: ShardId| {
            MetricResults::decode((metrics.part(id))().as_ref())
                .expect("a metrics part")
                .committed
        };
        let per_shard: Vec<Vec<MonitoringInfo>> = ids.iter().map(|&id| decoded(id)).collect();
        let restored = ShardMetrics::new(layout);
        let all = restored.restore_shards(per_shard.clone());
        // Onto one shard fewer: shard 1's totals go to shard 0 as well.
        let fewer = ShardMetrics::new(ShardLayout::new(1).expect("a layout"));
        let summed = fewer.restore_shards(per_shard);
        assert_eq!(summed.len(), 2, "both shards' infos are there to add up");
        let one = JobMetrics::default();
        one.commit(&[counter(8)]);
        assert_eq!(fewer.shards[0].committed_infos(), one.committed_infos());
        let (job, total) = (JobMetrics::default(), JobMetrics::default());
        job.restore(&all);
        total.commit(&[counter(8)]);
        assert_eq!(job.committed_infos(), total.committed_infos());
        let shard1 = JobMetrics::default();
        shard1.commit(&[counter(5)]);
        assert_eq!(
            restored.shards[1].committed_infos(),
            shard1.committed_infos()
        );
    }
}
