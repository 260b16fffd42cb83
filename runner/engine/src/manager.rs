//! The element manager: runs a [`Plan`] to completion.
//!
//! It keeps, per stage, the elements waiting to be processed, the bundles in
//! flight, grouping buffers and timers, and from those the stage's input and
//! output watermarks. One task owns all of that state; bundles run
//! concurrently on the executor and report back over a channel, and each
//! report is committed — outputs routed to consumers, state written, timers
//! stored, holds released — in one step, or, for a failed bundle, dropped.
//!
//! A job is done when every stage's output watermark has reached +∞. If no
//! bundle is in flight, nothing is scheduled or delayed, and yet some stage
//! has not finished, the job cannot make progress: it fails with the names
//! of the stages holding it, rather than hanging.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use thiserror::Error;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::coder::CoderError;
use crate::executor::{BundleOutput, BundleSplit, ExecError, StageExecutor};
use crate::grouping::{GroupingBuffer, GroupingError};
use crate::plan::{PCollectionIdx, Plan, StageIdx, StageKind, StageVec, TimeDomain};
use crate::shards::exchange::Parked;
use crate::spill::SpillArea;
use crate::state::{BundleOverlay, SideInputTable, UserStateTable};
use crate::time::{earliest, Timestamp, MAX_TIMESTAMP};
use crate::timers::{FiredTimer, TimerStore};

mod builder;
mod checkpointing;
mod clock;
mod commit;
mod delivery;
mod durability;
mod grouping_stage;
mod part_name;
mod pending;
mod reshard;
mod scheduling;
mod shard_epochs;
mod sharded_checkpoint;
mod sharding;
mod side_inputs;
mod slot_groups;
mod snapshot;
mod splits;
mod stage_map;
mod stage_state;
mod state_gc;
mod stats;
mod step;
mod strict;
mod test_stream;
mod topology;
mod watermarks;
mod window_merging;

use crate::key_groups::KeyGroupSet;
pub use builder::EngineBuilder;
pub use checkpointing::CheckpointProgress;
pub use clock::ClockFn;
use clock::ProcessingClock;
use durability::Durability;
use grouping_stage::GroupingState;
use pending::{Overflow, Queued};
pub use shard_epochs::EpochRequest;
pub use sharded_checkpoint::{
    collect_epochs, split_sharded_checkpoint, EngineParts, ShardCheckpoints, SHARDED_FORMAT,
};
pub use sharding::run_shards;
use slot_groups::SlotGroups;
pub use snapshot::{
    describe_checkpoint, CheckpointInfo, SnapshotError, OLDEST_SNAPSHOT_VERSION, SNAPSHOT_VERSION,
};
pub use stage_map::{check_update, renamed_name, NameMapping};
use stage_state::{KindState, StageState};
pub use stats::{stage_kind_named, StageStats, STAGE_KINDS};
pub use strict::{Replay, StrictReport, Strictness};
use topology::Topology;

/// Why a job stopped without finishing.
#[derive(Debug, Error)]
pub enum EngineError {
    /// A bundle failed; the error carries the SDK's own text.
    #[error("{error}")]
    BundleFailed {
        /// The stage's name (for logs; not part of the message).
        stage: String,
        /// What went wrong.
        error: ExecError,
    },
    /// Bytes of a PCollection could not be read with its coder.
    #[error("cannot decode elements of PCollection '{pcollection}': {source}")]
    Decode {
        /// The PCollection's id.
        pcollection: String,
        /// The coder error.
        source: CoderError,
    },
    /// No work can run but the pipeline is not finished.
    #[error("the pipeline cannot make progress: {0}")]
    Stuck(String),
    /// A GroupByKey or a stage's queue could not spill to, or read back
    /// from, the spill space.
    #[error("stage '{stage}': {source}")]
    Spill {
        /// The stage's name.
        stage: String,
        /// What the store said.
        source: crate::spill::SpillError,
    },
    /// A bundle's output that went to the spill space could not be read
    /// back.
    #[error("reading back the spilled output of PCollection '{pcollection}': {source}")]
    OutputSpill {
        /// The PCollection's id.
        pcollection: String,
        /// What the store said.
        source: crate::spill::SpillError,
    },
    /// The engine's optional parts do not fit together (see
    /// [`EngineBuilder::build`]).
    #[error("the engine cannot be built: {0}")]
    Misconfigured(String),
    /// The plan is not executable (e.g. a cycle).
    #[error("invalid plan: {0}")]
    InvalidPlan(String),
    /// More checkpoint writes failed in a row than tolerated (see
    /// [`EngineBuilder::tolerable_checkpoint_failures`]); the latest
    /// written checkpoint is the one to resume from.
    #[error(
        "{failures} checkpoints in a row could not be written, more than the {tolerable} \
         tolerated (--tolerable_checkpoint_failures); the job's messages say why"
    )]
    CheckpointsFailing {
        /// Failed writes in a row.
        failures: u32,
        /// How many were tolerated.
        tolerable: u32,
    },
    /// A shard could not cut a checkpoint epoch the others cut: the
    /// epoch could never complete, so the run stops (and is retried from
    /// the last complete one).
    #[error("cutting checkpoint {epoch} on {shard}: {source}")]
    ShardCut {
        /// The shard.
        shard: crate::shards::ShardId,
        /// The epoch.
        epoch: crate::shards::Epoch,
        /// Why the cut failed.
        source: SnapshotError,
    },
    /// Another shard handed this one elements of a PCollection the plan
    /// does not have: the shards do not run the same plan.
    #[error("{shard} was handed elements of PCollection #{index}, which its plan does not have")]
    UnknownDelivery {
        /// The shard.
        shard: crate::shards::ShardId,
        /// The index it was handed.
        index: usize,
    },
    /// The exchange between the job's shards lost a connection: the
    /// run stops (and is retried from its last checkpoint).
    #[error("{shard} lost its exchange with the other shards: {why}")]
    ExchangeLost {
        /// The shard.
        shard: crate::shards::ShardId,
        /// What the transport said.
        why: String,
    },
    /// The job was cancelled.
    #[error("cancelled")]
    Cancelled,
}

/// Tunables of one run.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Most elements in one bundle.
    pub max_bundle_elements: usize,
    /// Most bytes of elements in one data chunk sent to the executor.
    pub chunk_bytes: usize,
    /// Most bundles of one stateless stage in flight at once.
    pub max_bundles_per_stage: usize,
    /// Streaming semantics: triggers are evaluated after every element
    /// instead of after every batch of input a grouping stage receives.
    pub streaming: bool,
    /// How many times in a row a stage's bundles may fail before the job
    /// fails with the last error. A failed bundle leaves nothing behind, so
    /// its input is simply processed again.
    pub max_attempts: u32,
    /// Wait before the first retry of a failed bundle's input; it doubles
    /// with every further failure, up to ten seconds. For a harness that
    /// failed (a worker died): time for its replacement to be found.
    pub retry_backoff: Duration,
    /// The same for an error the SDK reported from a live worker (a DoFn
    /// raised): shorter, since no worker needs replacing, and a job whose
    /// code fails every time should fail without waiting long.
    pub sdk_error_backoff: Duration,
    /// Backpressure: a stage whose consumer has more than this many bytes
    /// of elements waiting (and is working through them) gets no new
    /// bundles, so memory stays bounded however fast its input is.
    pub max_pending_bytes: usize,
    /// Strict mode (see [`Strictness`]): bundles run twice,
    /// cut small and reordered, as any runner may, so that tests catch code
    /// that relies on one runner's habits. Off by default.
    pub strict: Option<Strictness>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_bundle_elements: 100_000,
            chunk_bytes: 1 << 20,
            max_bundles_per_stage: 4,
            streaming: false,
            max_attempts: 4,
            retry_backoff: Duration::from_millis(100),
            sdk_error_backoff: Duration::from_millis(10),
            max_pending_bytes: 64 << 20,
            strict: None,
        }
    }
}

/// What the run did, for logs and tests.
#[derive(Debug, Default, Clone)]
pub struct RunSummary {
    /// Bundles committed.
    pub bundles: u64,
    /// Late elements dropped by grouping.
    pub dropped_late: u64,
    /// Late elements dropped, per grouping stage (by stage name), for the
    /// job's metrics.
    pub dropped_late_by_stage: Vec<(String, u64)>,
    /// The most bytes of elements that waited for any one stage.
    pub peak_pending_bytes: usize,
    /// Bytes GroupByKey buffers spilled to the spill space.
    pub spilled_bytes: u64,
    /// Bytes of bundle output that waited in the spill space for their
    /// bundle to end.
    pub output_spilled_bytes: u64,
    /// Bytes of elements that waited in the spill space for a stage whose
    /// queue was far past its bound.
    pub queue_spilled_bytes: u64,
    /// Bytes of bag user state written to the spill space.
    pub state_spilled_bytes: u64,
    /// What strict mode did, when it was on.
    pub strict: Option<StrictReport>,
    /// Keys GroupByKeys handed to their consumers as state-backed
    /// iterables (too large for memory).
    pub handed_out_keys: u64,
}

/// How a spill space error of stage `stage` reaches the job: naming the
/// stage (its GroupByKey buffer, its queue or its user state spilled).
fn spill_failed(
    plan: &Plan,
    stage: StageIdx,
) -> impl Fn(crate::spill::SpillError) -> EngineError + '_ {
    move |source| EngineError::Spill {
        stage: plan.stages[stage].name.clone(),
        source,
    }
}

/// A bundle in flight, remembered until it reports back.
struct InFlight {
    stage: StageIdx,
    /// Timestamps its input and fired timers hold, each with how many.
    holds: Vec<(Timestamp, usize)>,
    overlay: Arc<BundleOverlay>,
    fired_timers: Vec<(TimeDomain, FiredTimer)>,
    /// The bundle's input, put back for a retry if the bundle fails.
    elements: Vec<Queued>,
    /// The key groups the bundle locks (keyed stages only).
    key_groups: KeyGroupSet,
    /// Encoded bytes of the input it was given (counted against its
    /// stage's queue bound until it reports back).
    input_bytes: usize,
}

enum Report {
    /// The SDK split a running bundle.
    Split { bundle: u64, split: BundleSplit },
    /// An SDK stage's bundle finished.
    Bundle {
        bundle: u64,
        result: Result<BundleOutput, ExecError>,
    },
    /// The SDK answered a window-merge request of a grouping stage.
    Merge {
        stage: StageIdx,
        keys: Vec<Bytes>,
        result: Result<Bytes, ExecError>,
    },
}

/// Runs one plan.
pub struct Engine {
    /// The plan and its graph.
    topology: Topology,
    executor: Arc<dyn StageExecutor>,
    config: EngineConfig,
    /// Each stage's run-time state.
    stages: StageVec<StageState>,
    side_inputs: Arc<Mutex<SideInputTable>>,
    user_state: StageVec<Arc<Mutex<UserStateTable>>>,
    in_flight: HashMap<u64, InFlight>,
    /// Bundles the SDK workers behind groups of stages run at once.
    slot_groups: SlotGroups,
    merges_in_flight: usize,
    next_bundle: u64,
    bundle_prefix: String,
    summary: RunSummary,
    /// Processing time.
    clock: ProcessingClock,
    /// Turns true when the job should drain.
    drain: Option<watch::Receiver<bool>>,
    /// The job is draining: delayed work runs at once, and splittable
    /// stages truncate their restrictions.
    draining: bool,
    /// Where stage snapshots go, if anyone watches.
    stats: Option<watch::Sender<Vec<StageStats>>>,
    /// When the last snapshot went out.
    last_published: Option<Instant>,
    /// Checkpoints, savepoints and the stores state may move to.
    durability: Durability,
    /// Strict mode's choices and record, when it is on.
    strict: Option<strict::Strict>,
    /// What the engine keeps as one shard of a job, when it is one.
    shard: Option<sharding::Sharding>,
}

/// Resolves once the shards' board (`wake`) has a version other than
/// `seen`; never for a single engine, or once the board is gone.
async fn board_changed(wake: Option<&mut watch::Receiver<u64>>, seen: u64) {
    match wake {
        Some(wake) => {
            if wake.wait_for(|&v| v != seen).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// A request for a checkpoint of the running engine, answered with its
/// parts (see [`EngineBuilder::savepoints`]).
#[derive(Debug)]
pub struct SavepointRequest {
    /// End the run (as cancelled) right after the checkpoint, so that
    /// nothing happens between the savepoint and the stop.
    pub stop: bool,
    /// Where the parts go.
    pub reply: tokio::sync::oneshot::Sender<Result<Vec<(String, Bytes)>, SnapshotError>>,
}

/// Extra state a checkpoint carries for the engine's owner (the job's
/// metrics), read between two commits like the engine's own parts.
pub type ExtraPart = Arc<dyn Fn() -> Bytes + Send + Sync>;

impl Engine {
    /// An engine of `plan` with optional parts (drain, spilling, durable
    /// state, checkpoints, ...) set in any order; see [`EngineBuilder`].
    pub fn builder(
        plan: Plan,
        executor: Arc<dyn StageExecutor>,
        config: EngineConfig,
        bundle_prefix: impl Into<String>,
        clock: ClockFn,
    ) -> EngineBuilder {
        EngineBuilder::new(plan, executor, config, bundle_prefix.into(), clock)
    }

    /// Prepare a run of `plan` with none of the optional parts
    /// ([`Self::builder`] adds them). `bundle_prefix` makes bundle ids
    /// unique across jobs sharing workers; `clock` is processing time in
    /// ms.
    pub fn new(
        plan: Plan,
        executor: Arc<dyn StageExecutor>,
        config: EngineConfig,
        bundle_prefix: impl Into<String>,
        clock: ClockFn,
    ) -> Result<Self, EngineError> {
        let topology = Topology::new(plan)?;
        let plan = &topology.plan;
        let n = plan.stages.len();
        let scripted = plan
            .stages
            .iter()
            .any(|s| matches!(s.kind, StageKind::TestStream(_)));
        // A batch pipeline has no late data; one whose watermark a
        // TestStream scripts means the lateness it makes.
        let keeps_late_data = !config.streaming && !scripted;
        let mut stages = StageVec::from(Vec::with_capacity(n));
        for stage in &plan.stages {
            let kind = KindState::of(&stage.kind, config.streaming, |strategy| {
                let input = stage.inputs.first().ok_or_else(|| {
                    EngineError::InvalidPlan(format!("GroupByKey '{}' has no input", stage.name))
                })?;
                let pc = &plan.pcollections[*input];
                let buffer = GroupingBuffer::new(
                    strategy.clone(),
                    pc.value_coder.clone(),
                    pc.window_coder.clone(),
                );
                Ok(if keeps_late_data {
                    buffer.keeping_late_data()
                } else {
                    buffer
                })
            })?;
            stages.push(StageState::new(kind));
        }
        let user_state = (0..n).map(|_| Arc::default()).collect();
        let slot_groups = SlotGroups::new(plan, executor.as_ref());
        let strict = config.strict.map(|s| strict::Strict::new(s, n));
        Ok(Engine {
            topology,
            executor,
            config,
            stages,
            side_inputs: Arc::default(),
            user_state,
            in_flight: HashMap::new(),
            slot_groups,
            merges_in_flight: 0,
            next_bundle: 0,
            bundle_prefix: bundle_prefix.into(),
            summary: RunSummary::default(),
            clock: ProcessingClock::new(clock, scripted),
            drain: None,
            draining: false,
            stats: None,
            last_published: None,
            durability: Durability::default(),
            strict,
            shard: None,
        })
    }

    /// Lets every GroupByKey buffer that can ([`GroupingBuffer::enable_spill`])
    /// spill to `store` once it holds more than `limit_bytes`, every SDK
    /// stage's queue once it holds more than twice that, and every stateful
    /// stage's bags once they hold more than `limit_bytes` (to the durable
    /// store if there is one; else in batch, or in streaming without
    /// checkpoints), under
    /// keys that start with `prefix` (unique to the job) and the stage.
    ///
    /// While some buffer, queue or bag has data on the spill space,
    /// periodic checkpoints are not taken (a checkpoint would have to copy
    /// the spilled bytes back into memory); only a savepoint, or a
    /// stable-input stage waiting for one, takes a checkpoint then. (Bags
    /// and queues on a durable spill space do not hold them back.) Applied by
    /// [`EngineBuilder::build`], after the durable spill space is set and before
    /// any [`Self::restore`].
    pub(super) fn enable_spill(
        &mut self,
        store: Arc<dyn crate::spill::SpillSpace>,
        prefix: &[u8],
        limit_bytes: usize,
    ) {
        self.durability.spill_space =
            Some((store.clone(), Bytes::from(crate::spill::job_space(prefix))));
        let bags_may_spill = self.durability.bags_may_spill(self.config.streaming);
        for (idx, s) in self.stages.iter_enumerated_mut() {
            let key = SpillArea::Stage(idx).prefix(prefix);
            if let Some(g) = s.grouping_mut() {
                // Beside the checkpoints in streaming, where a window may
                // stay spilled for hours; in batch, windows are emitted once
                // the input ends, and scratch writes cost less.
                let durable = match &self.durability.durable_state {
                    Some(durable) if self.config.streaming => {
                        let durable_key = SpillArea::DurableGrouping(idx).prefix(prefix);
                        g.enable_durable_spill(durable.clone(), durable_key, limit_bytes)
                    }
                    _ => false,
                };
                if durable || g.enable_spill(store.clone(), key, limit_bytes) {
                    debug!(stage = %self.topology.plan.stages[idx].name, limit_bytes, durable,
                           "GroupByKey may spill");
                }
                continue;
            }
            // An SDK stage's queue, past twice its bound (one bundle's
            // output can be any size). Not one whose input is taken in
            // time order: it must see every waiting element to pick.
            let stage = &self.topology.plan.stages[idx];
            let StageKind::Sdk(sdk) = &stage.kind else {
                continue;
            };
            // A stateful stage's bags, past its share (under a space of
            // their own: the queue's is the stage's). While state is on
            // disk no periodic checkpoint is taken, which a batch job
            // (whose state goes when its input ends) can afford and a
            // checkpointed streaming one, whose state may stay there for
            // good, cannot: see `bags_may_spill`.
            if sdk.stateful && bags_may_spill {
                let state_key = SpillArea::UserState(idx).prefix(prefix);
                let mut user_state = self.user_state[idx].lock();
                match &self.durability.durable_state {
                    Some(durable) => {
                        user_state.enable_durable_bag_spill(durable.clone(), state_key, limit_bytes)
                    }
                    None => user_state.enable_bag_spill(store.clone(), state_key, limit_bytes),
                }
            }
            let Some(&input) = stage.inputs.first() else {
                continue;
            };
            if !sdk.time_sorted_input {
                let window_coder = self.topology.plan.pcollections[input].window_coder.clone();
                let overflow = match &self.durability.durable_state {
                    // Beside the checkpoints, which name its segments.
                    Some(durable) => {
                        let key = SpillArea::DurableQueue(idx).prefix(prefix);
                        Overflow::durable(durable.clone(), key, window_coder, limit_bytes)
                    }
                    None => Overflow::new(store.clone(), key, window_coder, limit_bytes),
                };
                s.queue.pending.enable_overflow(overflow);
            }
        }
    }

    /// Lets every spilling GroupByKey whose output is one of `outputs`
    /// hand a key too large for memory to its consumers as a state-backed
    /// iterable ([`GroupingBuffer::hand_out_large_keys`]): the caller
    /// promises that every consumer of those PCollections reads them
    /// through `beam:coder:state_backed_iterable:v1`. Not in a job with a
    /// stable-input stage: such a job must be able to take a checkpoint,
    /// which a handed-out key rules out. Needs [`Self::enable_spill`] first.
    pub(super) fn enable_state_backed_outputs(&mut self, outputs: &[PCollectionIdx]) {
        let stable_input = self
            .topology
            .plan
            .stages
            .iter()
            .any(|s| matches!(&s.kind, StageKind::Sdk(sdk) if sdk.stable_input));
        if stable_input {
            return;
        }
        for (idx, s) in self.stages.iter_enumerated_mut() {
            let stage = &self.topology.plan.stages[idx];
            let Some(g) = s.grouping_mut() else {
                continue;
            };
            if stage.outputs.iter().all(|o| outputs.contains(o)) && g.hand_out_large_keys() {
                debug!(stage = %stage.name, "GroupByKey may hand out keys too large for memory");
            }
        }
    }

    /// Forgets the keys each GroupByKey handed out once every consumer of
    /// its output has nothing waiting and nothing running: every element
    /// that carried one was then processed and committed, so none is in a
    /// checkpoint to come and no retry reads one again.
    fn release_consumed_hand_outs(&mut self) -> Result<(), GroupingError> {
        for idx in self.stages.indices() {
            if !self.stages[idx]
                .grouping()
                .is_some_and(GroupingBuffer::has_live_hand_outs)
            {
                continue;
            }
            let consumed = self.topology.plan.stages[idx].outputs.iter().all(|&out| {
                self.topology.consumers[out]
                    .stages
                    .iter()
                    .all(|&c| self.stages[c].queue.is_quiet())
            });
            if let Some(g) = self.stages[idx].grouping_mut().filter(|_| consumed) {
                g.release_hand_outs()?;
                debug!(stage = %self.topology.plan.stages[idx].name, "handed-out keys consumed");
            }
        }
        Ok(())
    }

    /// [`Self::release_consumed_hand_outs`] before a checkpoint; a store
    /// that cannot delete leaves the keys held (and the checkpoint off).
    fn release_hand_outs_or_warn(&mut self) {
        if let Err(error) = self.release_consumed_hand_outs() {
            warn!(%error, "cannot forget the keys a GroupByKey handed out");
        }
    }

    /// The first stage whose GroupByKey buffer, queue or user state has
    /// data in the spill space (or whose GroupByKey handed out a key that
    /// only the store holds), and which of them: what a periodic
    /// checkpoint waits for. (Not data on a durable spill space, which
    /// checkpoints name.)
    fn spilled(&self) -> Option<(StageIdx, &'static str)> {
        self.stages.iter_enumerated().find_map(|(idx, s)| {
            let grouping = s.grouping();
            let what = if s.queue.pending.holds_scratch_spill() {
                "its queue"
            } else if grouping.is_some_and(GroupingBuffer::holds_scratch_spill) {
                "its GroupByKey buffer"
            } else if grouping.is_some_and(GroupingBuffer::has_live_hand_outs) {
                "a key its GroupByKey handed out"
            } else if self.user_state[idx].lock().holds_scratch_spill() {
                "its user state"
            } else {
                return None;
            };
            Some((idx, what))
        })
    }

    /// Run until every stage is done, a bundle fails, or `cancel` turns true.
    pub async fn run(
        mut self,
        mut cancel: watch::Receiver<bool>,
    ) -> Result<RunSummary, EngineError> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Report>();
        let mut drain = self.drain.take();
        let mut savepoints = self.durability.savepoints.take();
        let mut epoch_requests = self.durability.epoch_requests.take();
        let mut progress = self
            .durability
            .checkpoints
            .as_mut()
            .and_then(|sink| sink.progress.take());
        let mut shard_wake = self.shard_wake();
        loop {
            if *cancel.borrow() {
                return Err(EngineError::Cancelled);
            }
            self.take_from_shards()?;
            if self.stopped_after_epoch() {
                info!("stopped after the epoch a savepoint asked for");
                return Err(EngineError::Cancelled);
            }
            if self.frozen_for_stop() {
                // Only the exchange (or a cancel) can move it on.
                let seen = self.shard_seen();
                let woken = board_changed(shard_wake.as_mut(), seen);
                tokio::select! {
                    _ = woken => continue,
                    changed = cancel.changed() => {
                        if changed.is_err() || *cancel.borrow() {
                            return Err(EngineError::Cancelled);
                        }
                        continue;
                    }
                }
            }
            if !self.draining && drain.as_ref().is_some_and(|d| *d.borrow()) {
                info!("draining");
                self.draining = true;
                drain = None;
                let now = Instant::now();
                for s in &mut self.stages {
                    s.queue.hurry_delayed(now);
                }
                self.release_delayed()?;
            }
            self.advance()?;
            self.schedule(&tx)?;
            self.publish_to_shards();
            self.publish_stats(false);
            self.maybe_checkpoint();
            if self.idle() && self.may_step_test_streams() && self.step_test_streams()? {
                continue;
            }
            if self.idle() && self.all_done() {
                self.summary.dropped_late_by_stage = self
                    .stages
                    .iter_enumerated()
                    .filter_map(|(i, s)| {
                        let dropped = s.grouping()?.dropped_late();
                        (dropped > 0).then(|| (self.topology.plan.stages[i].name.clone(), dropped))
                    })
                    .collect();
                self.summary.dropped_late = self
                    .summary
                    .dropped_late_by_stage
                    .iter()
                    .map(|(_, n)| n)
                    .sum();
                if self.shard.is_none() {
                    self.run_every_after_durable();
                }
                self.summary.spilled_bytes = self
                    .stages
                    .iter()
                    .filter_map(StageState::grouping)
                    .map(GroupingBuffer::spilled_bytes)
                    .sum();
                self.summary.handed_out_keys = self
                    .stages
                    .iter()
                    .filter_map(StageState::grouping)
                    .map(GroupingBuffer::handed_out)
                    .sum();
                self.summary.queue_spilled_bytes = self
                    .stages
                    .iter()
                    .map(|s| s.queue.pending.spilled_bytes())
                    .sum();
                self.summary.state_spilled_bytes = self
                    .user_state
                    .iter()
                    .map(|u| u.lock().spilled_bytes())
                    .sum();
                info!(
                    bundles = self.summary.bundles,
                    spilled_bytes = self.summary.spilled_bytes,
                    "pipeline finished"
                );
                self.summary.strict = self.strict.as_ref().map(|s| s.report().clone());
                self.publish_stats(true);
                self.send_last_cut()?;
                self.finish_shard();
                self.finalize_after_last_cut(progress, &mut cancel).await?;
                return Ok(self.summary);
            }
            let next_wakeup = self.next_wakeup();
            // A stable-input stage waits for a checkpoint the writer had no
            // room for: try again shortly.
            let checkpoint_retry = self.durability.checkpoints.is_some()
                && !self.awaiting_checkpoint()
                && self
                    .stages
                    .iter()
                    .any(|s| s.queue.pending.awaits_checkpoint());
            let next_wakeup = if checkpoint_retry {
                let soon = self.checkpoint_retry_at();
                Some(next_wakeup.map_or(soon, |at| at.min(soon)))
            } else {
                next_wakeup
            };
            let due_now = next_wakeup.is_some_and(|at| at <= Instant::now());
            if self.idle() && !due_now && !self.awaiting_checkpoint() {
                // A quiet shard parks and waits for the others; a single
                // engine with nothing due, or every shard parked with
                // nothing due, is stuck.
                // Output waiting for the exchange's credit is woken by
                // that credit, which no frame count shows the detector.
                let waking = next_wakeup.is_some() || self.exchange_full();
                match self.park(waking) {
                    Some(Parked::Changed | Parked::YourTurn) => continue,
                    Some(Parked::Waiting) => {}
                    None if next_wakeup.is_some() => {}
                    None | Some(Parked::AllParked) => {
                        return Err(EngineError::Stuck(self.describe_unfinished()))
                    }
                }
            } else {
                self.unpark();
            }
            let seen = self.shard_seen();
            let mut sleep_until =
                next_wakeup.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            if let Some(deadline) = self.checkpoint_deadline() {
                sleep_until = sleep_until.min(deadline);
            }
            tokio::select! {
                report = rx.recv() => {
                    if let Some(report) = report {
                        self.take_report(report)?;
                    }
                }
                _ = tokio::time::sleep_until(sleep_until) => {
                    self.release_delayed()?;
                }
                reported = async {
                    match progress.as_mut() {
                        Some(p) => p.changed().await.map(|()| *p.borrow_and_update()).ok(),
                        None => std::future::pending().await,
                    }
                } => {
                    if reported.is_none() {
                        progress = None;
                    }
                    self.checkpoint_progress(reported)?;
                }
                _ = board_changed(shard_wake.as_mut(), seen) => {}
                changed = cancel.changed() => {
                    if changed.is_err() || *cancel.borrow() {
                        return Err(EngineError::Cancelled);
                    }
                }
                request = async {
                    match savepoints.as_mut() {
                        Some(requests) => requests.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    match request {
                        Some(SavepointRequest { stop, reply }) => {
                            self.release_hand_outs_or_warn();
                            let taken = self.checkpoint_parts();
                            let stopping = stop && taken.is_ok();
                            let _ = reply.send(taken);
                            if stopping {
                                info!("stopped after a savepoint");
                                return Err(EngineError::Cancelled);
                            }
                        }
                        None => savepoints = None,
                    }
                }
                request = async {
                    match epoch_requests.as_mut() {
                        Some(requests) => requests.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    match request {
                        Some(request) => self.request_epoch(request),
                        None => epoch_requests = None,
                    }
                }
                _ = async {
                    match drain.as_mut() {
                        Some(d) => {
                            if d.changed().await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        }
                        None => std::future::pending::<()>().await,
                    }
                } => {}
            }
        }
    }

    /// What the executor reported: a bundle's end is committed, a split
    /// applied, a window merge's answer taken. Every report starts a new
    /// step of GroupByKey output ([`Self::refill_fire_budgets`]).
    fn take_report(&mut self, report: Report) -> Result<(), EngineError> {
        self.refill_fire_budgets();
        match report {
            Report::Bundle { bundle, result } => self.commit(bundle, result),
            Report::Split { bundle, split } => self.apply_split(bundle, split),
            Report::Merge {
                stage,
                keys,
                result,
            } => self.commit_merge(stage, keys, result),
        }
    }

    /// When something time-driven is due next: a delayed residual, a retry
    /// after backoff, a processing-time trigger or a processing-time timer.
    fn next_wakeup(&self) -> Option<Instant> {
        let delayed = self.stages.iter().filter_map(StageState::next_wakeup).min();
        let processing = self
            .stages
            .iter()
            .filter_map(StageState::next_processing_deadline)
            .min()
            .map(|deadline| {
                let wait = deadline.saturating_sub(self.now()).max(0);
                Instant::now() + Duration::from_millis(wait as u64)
            });
        if self.more_to_fire() {
            return Some(Instant::now());
        }
        earliest(delayed, processing)
    }

    /// Whether a GroupByKey stopped at its step's byte budget with panes
    /// still to emit (and may go on now): the engine comes straight back
    /// to it after scheduling what it emitted.
    fn more_to_fire(&self) -> bool {
        self.stages.iter_enumerated().any(|(idx, s)| {
            s.grouping_state()
                .is_some_and(GroupingState::has_more_to_fire)
                && !self.backpressured(idx)
        })
    }

    /// Nothing is running on the executor: no bundle and no merge request.
    fn idle(&self) -> bool {
        self.in_flight.is_empty() && self.merges_in_flight == 0
    }

    /// Processing time, in ms: the clock (frozen at the start for a
    /// pipeline with a TestStream) plus what TestStreams advanced it by.
    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn all_done(&self) -> bool {
        self.stages
            .iter()
            .all(|s| s.progress.output_wm >= MAX_TIMESTAMP)
    }

    pub(super) fn describe_unfinished(&self) -> String {
        let names: Vec<String> = self
            .topology.order
            .iter()
            .filter(|&&i| self.stages[i].progress.output_wm < MAX_TIMESTAMP)
            .map(|&i| {
                let s = &self.stages[i];
                let held = if self.exchange_holds_back(i) {
                    ", held back by the exchange".to_string()
                } else if self.backpressured(i) {
                    format!(", held back by {}", self.holding_back(i))
                } else {
                    String::new()
                };
                format!(
                    "stage '{}' (input watermark {}, output watermark {}, {} pending elements, {} timers{held})",
                    self.topology.plan.stages[i].name,
                    s.progress.input_wm,
                    s.progress.output_wm,
                    s.queue.pending.len(),
                    if s.timers().is_none_or(TimerStore::is_empty) { "no" } else { "pending" }
                )
            })
            .take(3)
            .collect();
        format!(
            "nothing can run, yet these stages are unfinished: {}",
            names.join("; ")
        )
    }

    fn release_delayed(&mut self) -> Result<(), EngineError> {
        let now = Instant::now();
        for (idx, s) in self.stages.iter_enumerated_mut() {
            s.queue
                .release_delayed(now)
                .map_err(spill_failed(&self.topology.plan, idx))?;
        }
        Ok(())
    }
}
