//! A checkpoint restored onto another number of shards: each new shard's
//! cut made from the old shards' cuts, by key group.
//!
//! What a shard holds is of two kinds. *Keyed* state — a keyed stage's
//! queued elements, its GroupByKey panes, timers and user state, and
//! elements in transit to it — belongs to a key, so to a key group, and
//! goes to the new shard owning that group, from whichever old shard held
//! it. Everything else goes whole from old shard `k` to new shard
//! `k % M` (its *home*): a stateless stage's queue, and delayed residuals.
//! What every shard holds alike (side inputs, which are broadcast; the
//! plan's names) comes from one old shard, sources' progress from shard
//! 0's (the shard that runs them), and watermarks are the least over
//! every old shard, as each shard saw them while the job ran.
//!
//! One engine is the one shard of a layout of one: its checkpoint is read
//! as one old shard's cut, and a single engine restoring a sharded
//! checkpoint makes the cut of the shard owning every key group. So a job
//! moves between one engine and shards, both ways.
//!
//! Only a checkpoint of this pipeline, fused as this plan is, moves so:
//! the stages are matched by number.

use std::borrow::Cow;

use bytes::Bytes;

use super::part_name::PartName;
use super::scheduling::element_key_group_index;
use super::sharded_checkpoint::EngineParts;
use super::snapshot::{
    decode_engine, encode, required, ElementRecord, EngineNames, EngineRecord, OldStage,
    StageRecord,
};
use super::{Engine, SnapshotError, SNAPSHOT_VERSION};
use crate::grouping::GroupingSnapshot;
use crate::key_groups::key_group;
use crate::plan::StageIdx;
use crate::shards::{ShardId, ShardLayout};
use crate::state::UserStateSnapshot;
use crate::time::{Timestamp, MIN_TIMESTAMP};
use crate::timers::TimerStore;

/// Where a new shard's cut comes from.
struct Sources<'a> {
    old: &'a [EngineParts],
    layout: ShardLayout,
    me: ShardId,
}

impl Sources<'_> {
    /// Whether new shard `me` owns key group `group`.
    fn owns(&self, group: u32) -> bool {
        self.layout.owner(group) == self.me
    }

    /// Whether `key` (nested-encoded) is this shard's.
    fn owns_key(&self, key: &[u8]) -> bool {
        self.owns(key_group(key))
    }

    /// Whether old shard `k`'s unkeyed state comes here.
    fn is_home(&self, k: usize) -> bool {
        k % self.layout.shards() as usize == self.me.index()
    }

    /// The old shard whose copy of what every shard holds alike is taken:
    /// this shard's number if the old job had it, else shard 1 (like any
    /// shard but 0, it runs no sources).
    fn primary(&self) -> usize {
        if self.me.index() < self.old.len() {
            self.me.index()
        } else {
            1.min(self.old.len() - 1)
        }
    }

    /// The old shard whose sources' progress is taken: shard 0 for shard
    /// 0, else one that runs no sources.
    fn sources_from(&self) -> usize {
        if self.me == ShardId::SOURCES {
            0
        } else {
            1.min(self.old.len() - 1)
        }
    }
}

impl Engine {
    /// This shard's cut, made from `old`, the cuts of a checkpoint written
    /// by another number of shards (see the module docs): engine parts
    /// [`Engine::restore_engine_parts`] restores, with the elements in
    /// transit to this shard.
    pub(super) fn reshard_cut(&self, old: &[EngineParts]) -> Result<EngineParts, SnapshotError> {
        // One engine is the one shard of a layout of one.
        let (layout, me) = match self.shard.as_ref() {
            Some(shard) => (shard.link.layout(), shard.link.id()),
            None => (ShardLayout::ONE, ShardId::SOURCES),
        };
        if old.is_empty() {
            return Err(SnapshotError::Mismatch(
                "a sharded checkpoint of no shards".into(),
            ));
        }
        let from = Sources { old, layout, me };
        let mut parts = vec![self.reshard_engine_part(&from)?];
        for idx in self.stages.indices() {
            self.reshard_stage(&from, idx, &mut parts)?;
        }
        parts.push((
            PartName::SideInputs.to_string(),
            required(&old[from.primary()], PartName::SideInputs)?.clone(),
        ));
        if let Some(inbox) = self.reshard_inbox(old, from.primary(), |group| from.owns(group))? {
            parts.push(inbox);
        }
        Ok(parts)
    }

    /// The `engine` part: the plan's names, the bundle numbering past every
    /// old shard's, shard 0's clock.
    fn reshard_engine_part(&self, from: &Sources<'_>) -> Result<(String, Bytes), SnapshotError> {
        let mut engines = Vec::with_capacity(from.old.len());
        for cut in from.old {
            engines.push(decode_engine(required(cut, PartName::Engine)?)?);
        }
        let stage_names: Vec<String> = self
            .topology
            .plan
            .stages
            .iter()
            .map(|s| s.name.clone())
            .collect();
        for (record, _) in &engines {
            if record.version != SNAPSHOT_VERSION || record.stage_names != stage_names {
                return Err(SnapshotError::Mismatch(format!(
                    "it moves to another number of shards only onto the same pipeline, fused the \
                     same way, in checkpoint format {SNAPSHOT_VERSION} (a shard of it is in \
                     format {}, of {} stages)",
                    record.version,
                    record.stage_names.len()
                )));
            }
        }
        let (primary, names) = &engines[from.primary()];
        let (clock, _) = &engines[0];
        let record = EngineRecord {
            version: SNAPSHOT_VERSION,
            stage_names: primary.stage_names.clone(),
            next_bundle: engines
                .iter()
                .map(|(r, _)| r.next_bundle)
                .max()
                .unwrap_or(0),
            clock_offset: clock.clock_offset,
            frozen_clock: clock.frozen_clock,
            bundles: engines
                .iter()
                .enumerate()
                .filter(|(k, _)| from.is_home(*k))
                .map(|(_, (r, _))| r.bundles)
                .sum(),
            peak_pending_bytes: engines
                .iter()
                .map(|(r, _)| r.peak_pending_bytes)
                .max()
                .unwrap_or(0),
            // Their input is in the queues already, to be run again.
            rerun_bundles: Vec::new(),
        };
        let names = EngineNames {
            stage_heads: names.stage_heads.clone(),
            transforms: names.transforms.clone(),
        };
        encode(PartName::Engine, &(record, names))
    }

    /// Stage `idx`'s record and user state, from every old shard's.
    fn reshard_stage(
        &self,
        from: &Sources<'_>,
        idx: StageIdx,
        parts: &mut EngineParts,
    ) -> Result<(), SnapshotError> {
        let mut stages = Vec::with_capacity(from.old.len());
        for cut in from.old {
            let stage = OldStage::decode(cut, idx.index())?;
            if stage.names_spilled_data() {
                return Err(SnapshotError::Mismatch(format!(
                    "stage '{}' names data on a durable spill space, which does not move \
                     between shards",
                    self.topology.plan.stages[idx].name
                )));
            }
            stages.push(stage);
        }
        let stage = &self.topology.plan.stages[idx];
        let coder = stage
            .inputs
            .first()
            .map(|&pc| &self.topology.plan.pcollections[pc].value_coder)
            .filter(|_| stage.is_keyed());
        let here = |k: usize, e: &ElementRecord| match coder {
            Some(coder) => from.owns(element_key_group_index(coder, &e.clone().into_element())),
            None => from.is_home(k),
        };
        let mut pending = Vec::new();
        let mut delayed = Vec::new();
        let mut groupings = Vec::new();
        let mut timers = TimerStore::default();
        let mut user_state = UserStateSnapshot::default();
        for (k, old) in stages.iter_mut().enumerate() {
            let record = &mut old.record;
            pending.extend(
                std::mem::take(&mut record.pending)
                    .into_iter()
                    .filter(|e| here(k, e)),
            );
            delayed.extend(
                std::mem::take(&mut record.delayed)
                    .into_iter()
                    .filter(|(_, e, _)| here(k, e)),
            );
            if let Some(grouping) = record.grouping.take() {
                groupings.push((grouping, from.is_home(k)));
            }
            timers.absorb_where(&record.timers, |key| from.owns_key(key));
            user_state.absorb_where(std::mem::take(&mut old.user_state), |cell| {
                from.owns_key(&cell.key)
            });
        }
        let least = |wm: fn(&StageRecord<'_>) -> Timestamp| {
            stages
                .iter()
                .map(|s| wm(&s.record))
                .min()
                .unwrap_or(MIN_TIMESTAMP)
        };
        let sources = &stages[from.sources_from()].record;
        let record = StageRecord {
            pending,
            delayed,
            grouping: GroupingSnapshot::merged_where(groupings, |key| from.owns_key(key)),
            timers: Cow::Owned(timers),
            input_wm: least(|r| r.input_wm),
            output_wm: least(|r| r.output_wm),
            impulse_done: sources.impulse_done,
            stream_cursor: sources.stream_cursor,
            stream_wm: sources.stream_wm,
            state_gc_wm: least(|r| r.state_gc_wm),
            counters: stages[from.primary()].record.counters,
        };
        parts.push(encode(PartName::Stage(idx), &record)?);
        parts.push(encode(PartName::UserState(idx), &user_state)?);
        Ok(())
    }
}
