//! Building an engine. Its optional parts — draining, stage snapshots,
//! running as one shard of a job, spilling, a durable spill space beside
//! the checkpoints, state-backed GroupByKey outputs, checkpoints,
//! savepoints, extra checkpoint parts — depend on each other: the durable spill space decides where spilling goes, and handing out
//! large keys needs spilling on. The builder's setters only record, in any
//! order; [`EngineBuilder::build`] checks that the parts fit together and
//! applies them in the one order that works.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use super::ClockFn;
use super::{
    CheckpointProgress, Engine, EngineConfig, EngineError, EpochRequest, ExtraPart,
    SavepointRequest, StageStats,
};
use crate::executor::StageExecutor;
use crate::plan::{PCollectionIdx, Plan};
use crate::shards::ShardLink;
use crate::spill::SpillSpace;

/// Where and how far the engine may spill (see [`EngineBuilder::spill`]).
struct SpillSetting {
    store: Arc<dyn SpillSpace>,
    prefix: Vec<u8>,
    limit_bytes: usize,
}

/// Periodic checkpoints (see [`EngineBuilder::checkpoints`]).
struct CheckpointSetting {
    every: Duration,
    tx: mpsc::Sender<Vec<(String, Bytes)>>,
    progress: Option<watch::Receiver<CheckpointProgress>>,
}

/// An [`Engine`] being put together: made by [`Engine::builder`], its
/// setters record, [`Self::build`] validates and applies.
pub struct EngineBuilder {
    plan: Plan,
    executor: Arc<dyn StageExecutor>,
    config: EngineConfig,
    bundle_prefix: String,
    clock: ClockFn,
    drain: Option<watch::Receiver<bool>>,
    stats: Option<watch::Sender<Vec<StageStats>>>,
    durable_state: Option<Arc<dyn SpillSpace>>,
    spill: Option<SpillSetting>,
    state_backed_outputs: Vec<PCollectionIdx>,
    extra_parts: Vec<(String, ExtraPart)>,
    checkpoints: Option<CheckpointSetting>,
    tolerable_checkpoint_failures: Option<u32>,
    savepoints: Option<mpsc::Receiver<SavepointRequest>>,
    epoch_requests: Option<mpsc::Receiver<EpochRequest>>,
    shard: Option<ShardLink>,
}

impl EngineBuilder {
    pub(super) fn new(
        plan: Plan,
        executor: Arc<dyn StageExecutor>,
        config: EngineConfig,
        bundle_prefix: String,
        clock: ClockFn,
    ) -> Self {
        EngineBuilder {
            plan,
            executor,
            config,
            bundle_prefix,
            clock,
            drain: None,
            stats: None,
            durable_state: None,
            spill: None,
            state_backed_outputs: Vec::new(),
            extra_parts: Vec::new(),
            checkpoints: None,
            tolerable_checkpoint_failures: None,
            savepoints: None,
            epoch_requests: None,
            shard: None,
        }
    }

    /// Drain the job when `drain` turns true: sources stop (splittable
    /// restrictions are truncated), delayed work runs at once, windows
    /// flush as the watermarks reach +∞, and the run ends normally.
    pub fn drain(mut self, drain: watch::Receiver<bool>) -> Self {
        self.drain = Some(drain);
        self
    }

    /// Publish stage snapshots to `stats` while the job runs (and once at
    /// its end).
    pub fn stats(mut self, stats: watch::Sender<Vec<StageStats>>) -> Self {
        self.stats = Some(stats);
        self
    }

    /// Let GroupByKey buffers spill to `store` once one holds more than
    /// `limit_bytes`, SDK stages' queues once one holds more than twice
    /// that, and stateful stages' bags past `limit_bytes`, under keys that
    /// start with `prefix` (unique to the job) and the stage. While
    /// something is on this store, periodic checkpoints wait: a checkpoint
    /// would have to copy the spilled bytes back into memory.
    pub fn spill(mut self, store: Arc<dyn SpillSpace>, prefix: &[u8], limit_bytes: usize) -> Self {
        self.spill = Some(SpillSetting {
            store,
            prefix: prefix.to_vec(),
            limit_bytes,
        });
        self
    }

    /// With [`Self::spill`]: stateful stages' bags, SDK stages' queues and
    /// streaming GroupByKeys spill to `store` instead, a store whose writes
    /// last as long as the job's checkpoints (the runner's state database),
    /// so a periodic checkpoint names what is there instead of copying it,
    /// and a checkpointed streaming job's state may outgrow memory.
    pub fn durable_state(mut self, store: Arc<dyn SpillSpace>) -> Self {
        self.durable_state = Some(store);
        self
    }

    /// With [`Self::spill`]: every spilling GroupByKey whose output is one
    /// of `outputs` may hand a key too large for memory to its consumers
    /// as a state-backed iterable; the caller promises that every consumer
    /// of those PCollections reads them through
    /// `beam:coder:state_backed_iterable:v1`.
    pub fn state_backed_outputs(mut self, outputs: &[PCollectionIdx]) -> Self {
        self.state_backed_outputs = outputs.to_vec();
        self
    }

    /// Add part `name`, read by `read`, to every checkpoint and savepoint.
    /// Its owner restores it; [`Engine::restore`] ignores it.
    pub fn extra_part(mut self, name: impl Into<String>, read: ExtraPart) -> Self {
        self.extra_parts.push((name.into(), read));
        self
    }

    /// Send a checkpoint on `tx` every `every` (with zero, after every
    /// commit, as often as the writer keeps up); one due while the writer
    /// is busy waits for it, so checkpointing never holds the job up.
    /// Stable-input stages then see only elements a checkpoint holds: with
    /// `progress` once the checkpoint is durable, else once it is sent.
    pub fn checkpoints(
        mut self,
        every: Duration,
        tx: mpsc::Sender<Vec<(String, Bytes)>>,
        progress: Option<watch::Receiver<CheckpointProgress>>,
    ) -> Self {
        self.checkpoints = Some(CheckpointSetting {
            every,
            tx,
            progress,
        });
        self
    }

    /// Stop the run with [`EngineError::CheckpointsFailing`] once more than
    /// `n` checkpoint writes in a row failed (Flink's tolerable failed
    /// checkpoints): a job whose checkpoints keep failing has an ever older
    /// point to resume from, and should say so by failing, not run on
    /// quietly. Without it, failed writes are retried for as long as the
    /// job runs. Needs [`Self::checkpoints`] with progress reports.
    pub fn tolerable_checkpoint_failures(mut self, n: u32) -> Self {
        self.tolerable_checkpoint_failures = Some(n);
        self
    }

    /// Answer each request on `requests` with a checkpoint of the engine as
    /// it is when the request is seen (between two commits), for
    /// savepoints.
    pub fn savepoints(mut self, requests: mpsc::Receiver<SavepointRequest>) -> Self {
        self.savepoints = Some(requests);
        self
    }

    /// On a shard with checkpoints: answer each request on `requests` with
    /// the epoch that holds the job as of then (see [`EpochRequest`]): a
    /// savepoint of a job on shards.
    pub fn epoch_requests(mut self, requests: mpsc::Receiver<EpochRequest>) -> Self {
        self.epoch_requests = Some(requests);
        self
    }

    /// Run as one shard of a job ([`crate::shards`]): the engine owns the
    /// key groups `link`'s layout gives it, hands other elements to their
    /// shards, and reads watermarks over every shard. Run every shard's
    /// engine together with [`super::run_shards`]. Checkpoints go to the
    /// shard's end of [`super::collect_epochs`]. Not yet with savepoints,
    /// durable state or state-backed outputs.
    pub fn shard(mut self, link: ShardLink) -> Self {
        self.shard = Some(link);
        self
    }

    /// The engine, with every recorded part applied: the durable spill space
    /// before spilling (it decides where spills go), spilling before the
    /// state-backed outputs (which hand out only what spilled). Parts that
    /// need another part that is missing are refused, naming both.
    pub fn build(self) -> Result<Engine, EngineError> {
        if self.spill.is_none() {
            if self.durable_state.is_some() {
                return Err(EngineError::Misconfigured(
                    "a durable spill space takes effect only with a spill space".to_string(),
                ));
            }
            if !self.state_backed_outputs.is_empty() {
                return Err(EngineError::Misconfigured(
                    "state-backed GroupByKey outputs need a spill space".to_string(),
                ));
            }
        }
        if self.shard.is_some() {
            self.refuse_unsharded_parts()?;
        } else if self.epoch_requests.is_some() {
            return Err(EngineError::Misconfigured(
                "epoch requests are for the shards of a job".to_string(),
            ));
        }
        if self.epoch_requests.is_some() && self.checkpoints.is_none() {
            return Err(EngineError::Misconfigured(
                "epoch requests need checkpoints, which the epochs go to".to_string(),
            ));
        }
        let mut engine = Engine::new(
            self.plan,
            self.executor,
            self.config,
            self.bundle_prefix,
            self.clock,
        )?;
        engine.drain = self.drain;
        engine.stats = self.stats;
        engine.durability.durable_state = self.durable_state;
        let shard = self.shard.as_ref().map(ShardLink::id);
        if let Some(link) = self.shard {
            engine.enable_shard(link);
        }
        if let Some(spill) = self.spill {
            let prefix = match shard {
                Some(id) => id.spill_prefix(&spill.prefix),
                None => spill.prefix,
            };
            engine.enable_spill(spill.store, &prefix, spill.limit_bytes);
            engine.enable_state_backed_outputs(&self.state_backed_outputs);
        }
        engine.durability.extra_parts = self.extra_parts;
        if let Some(c) = self.checkpoints {
            engine.enable_checkpoints(c.every, c.tx, c.progress);
            if let Some(sink) = &mut engine.durability.checkpoints {
                sink.tolerable_failures = self.tolerable_checkpoint_failures;
            }
        }
        engine.durability.savepoints = self.savepoints;
        engine.durability.epoch_requests = self.epoch_requests;
        Ok(engine)
    }

    /// A shard's engine takes none of the parts not built for shards yet;
    /// the error names the first one asked for.
    fn refuse_unsharded_parts(&self) -> Result<(), EngineError> {
        let refused = [
            (
                self.checkpoints
                    .as_ref()
                    .is_some_and(|c| c.progress.is_none()),
                "checkpoints without their writer's progress (see collect_epochs)",
            ),
            (self.savepoints.is_some(), "savepoints"),
            (self.durable_state.is_some(), "a durable spill space"),
            (
                !self.state_backed_outputs.is_empty(),
                "state-backed GroupByKey outputs",
            ),
        ];
        match refused.iter().find(|(asked, _)| *asked) {
            Some((_, part)) => Err(EngineError::Misconfigured(format!(
                "a job on several shards cannot have {part} yet"
            ))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::future::BoxFuture;
    use futures::FutureExt;

    use super::*;
    use crate::executor::{BundleInput, BundleOutput, ExecError};
    use crate::spill::MemorySpillSpace;

    /// An executor no test here reaches: the plans have no SDK stage.
    struct NoSdk;

    impl StageExecutor for NoSdk {
        fn execute(&self, _: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
            async { Err(ExecError::Harness("no SDK here".into())) }.boxed()
        }
    }

    fn builder() -> EngineBuilder {
        Engine::builder(
            Plan::default(),
            Arc::new(NoSdk),
            EngineConfig::default(),
            "b",
            Arc::new(|| 0),
        )
    }

    #[test]
    fn parts_that_need_a_spill_store_are_refused_without_one() {
        for (builder, needs) in [
            (
                builder().durable_state(MemorySpillSpace::shared()),
                "a durable spill space",
            ),
            (
                builder().state_backed_outputs(&[PCollectionIdx::new(0)]),
                "state-backed GroupByKey outputs",
            ),
        ] {
            let Err(error) = builder.build() else {
                panic!("{needs} without a spill space was accepted");
            };
            assert!(matches!(error, EngineError::Misconfigured(_)), "{error}");
            assert!(error.to_string().contains(needs), "{error}");
        }
    }

    #[test]
    fn setters_record_in_any_order() {
        let (tx, _rx) = mpsc::channel(1);
        let durable = MemorySpillSpace::shared();
        let engine = builder()
            .durable_state(durable.clone())
            .checkpoints(Duration::ZERO, tx, None)
            .spill(MemorySpillSpace::shared(), b"b", 1 << 20)
            .build()
            .expect("spill after the durable spill space is fine");
        assert!(
            engine.durability.durable_state.is_some() && engine.durability.spill_space.is_some()
        );
        assert!(engine.durability.checkpoints.is_some());
    }
}
