//! An engine as one shard of a job ([`crate::shards`]): which elements it
//! hands to other shards, what it takes from them, the watermarks it reads
//! and publishes, and parking while the others work. Without a
//! [`ShardLink`] none of this runs: [`Engine::producer_watermark`] is the
//! stage's own output watermark and nothing is partitioned.

use bytes::Bytes;
use rustc_hash::FxHashMap;
use tokio::sync::watch;
use tracing::debug;

use super::scheduling::element_key_group_index;
use super::shard_epochs::EpochState;
use super::stage_state::KindState;
use super::{Engine, EngineError, RunSummary};
use crate::coder::{decode_windowed_values, DecodedElement};
use crate::plan::{PCollectionIdx, PCollectionVec, StageIdx, StageVec};
use crate::shards::exchange::{Delivery, Parked};
use crate::shards::{ShardId, ShardLink};
use crate::time::{Timestamp, MAX_TIMESTAMP, MIN_TIMESTAMP};

/// What an engine keeps as one shard of a job.
pub(super) struct Sharding {
    pub(super) link: ShardLink,
    /// Per PCollection: a keyed stage reads it, so each element goes to
    /// the shard owning its key.
    partitioned: PCollectionVec<bool>,
    /// Per PCollection: a side input reads it, so every shard gets it.
    broadcast: PCollectionVec<bool>,
    /// Per stage, the least output watermark the other shards published.
    others: StageVec<Timestamp>,
    /// Per stage, whether its queue on another shard is over its bound.
    over_elsewhere: StageVec<bool>,
    /// The exchange holds as much of this shard's output for others as
    /// its flow control allows.
    exchange_full: bool,
    /// The board's version at the last take.
    seen: u64,
    /// Per stage, whether the side inputs reading its outputs were told
    /// that it finished on every shard.
    finished_everywhere: StageVec<bool>,
    /// Elements for other shards, gathered per (shard, PCollection, side
    /// input or not) until the next publish.
    outgoing: FxHashMap<(ShardId, PCollectionIdx, bool), Vec<u8>>,
    /// Every shard is quiet and this one may apply its TestStream's next
    /// event.
    turn: bool,
    /// Parked on the board (and to be unparked once it has work).
    parked: bool,
    /// Where this shard is in the job's checkpoint epochs.
    pub(super) epochs: EpochState,
}

impl Engine {
    /// Makes this engine shard `link.id()` of its job: partitions what
    /// keyed stages read, broadcasts what side inputs read, and leaves
    /// sources to [`ShardId::SOURCES`]. Applied by the builder before
    /// anything else runs.
    pub(super) fn enable_shard(&mut self, link: ShardLink) {
        let plan = &self.topology.plan;
        let partitioned = self
            .topology
            .consumers
            .iter()
            .map(|c| c.stages.iter().any(|&s| plan.stages[s].is_keyed()))
            .collect();
        let broadcast = self
            .topology
            .consumers
            .iter()
            .map(|c| !c.side_inputs.is_empty())
            .collect();
        if link.id() != ShardId::SOURCES {
            self.leave_sources_to_shard_zero();
        }
        debug!(shard = %link.id(), shards = link.layout().shards(), "engine runs as a shard");
        let n = self.topology.plan.stages.len();
        self.shard = Some(Sharding {
            link,
            partitioned,
            broadcast,
            others: StageVec::from(vec![MIN_TIMESTAMP; n]),
            over_elsewhere: StageVec::from(vec![false; n]),
            exchange_full: false,
            seen: 0,
            finished_everywhere: StageVec::from(vec![false; n]),
            outgoing: FxHashMap::default(),
            turn: false,
            parked: false,
            epochs: EpochState::default(),
        });
    }

    /// Marks this engine's sources done: on every shard but
    /// [`ShardId::SOURCES`] they are, from the start and after a restore.
    pub(super) fn leave_sources_to_shard_zero(&mut self) {
        for s in &mut self.stages {
            match &mut s.kind {
                KindState::Impulse { emitted } => *emitted = true,
                KindState::TestStream(cursor) => cursor.skip_all(),
                _ => {}
            }
        }
    }

    /// Stage `stage`'s output watermark over the whole job: its own, and
    /// on a shard the least of that and what the other shards published.
    pub(super) fn producer_watermark(&self, stage: StageIdx) -> Timestamp {
        let own = self.stages[stage].progress.output_wm;
        match &self.shard {
            None => own,
            Some(s) => own.min(s.others[stage]),
        }
    }

    /// Whether elements of `pcoll` are processed where they are made: no
    /// shard partitions or broadcasts them (so the fast paths that route
    /// whole chunks may take them).
    pub(super) fn stays_local(&self, pcoll: PCollectionIdx) -> bool {
        self.shard
            .as_ref()
            .is_none_or(|s| !s.partitioned[pcoll] && !s.broadcast[pcoll])
    }

    /// On a shard: gathers `e` for every other shard's side inputs if
    /// `pcoll` is broadcast, and for its key's owner if `pcoll` is
    /// partitioned and the owner is another shard. Returns whether the
    /// owner is another shard (and this one's main-input readers must not
    /// see `e`).
    #[inline(never)]
    pub(super) fn hand_off(
        &mut self,
        pcoll: PCollectionIdx,
        e: &DecodedElement,
    ) -> Result<bool, EngineError> {
        let Some(shard) = self.shard.as_mut() else {
            return Ok(false);
        };
        let me = shard.link.id();
        if shard.broadcast[pcoll] {
            for other in shard.link.layout().ids().filter(|&s| s != me) {
                let out = shard.outgoing.entry((other, pcoll, true)).or_default();
                out.extend_from_slice(&e.encoded);
            }
        }
        if !shard.partitioned[pcoll] {
            return Ok(false);
        }
        let coder = &self.topology.plan.pcollections[pcoll].value_coder;
        let owner = shard.link.layout().owner(element_key_group_index(coder, e));
        if owner == me {
            return Ok(false);
        }
        let out = shard.outgoing.entry((owner, pcoll, false)).or_default();
        out.extend_from_slice(&e.encoded);
        Ok(true)
    }

    /// On a shard: takes what other shards handed this one and their
    /// watermarks. Fails the run if every shard is parked with nothing to
    /// do (the job is stuck), or if the exchange lost a connection.
    pub(super) fn take_from_shards(&mut self) -> Result<(), EngineError> {
        let Some(shard) = self.shard.as_mut() else {
            return Ok(());
        };
        let received = shard.link.take(self.topology.plan.stages.len());
        shard.others = received.watermarks;
        shard.over_elsewhere = received.over;
        shard.exchange_full = received.exchange_full;
        shard.seen = received.version;
        shard.turn |= received.turn;
        if let (Some(now), false) = (
            received.processing_time,
            shard.link.id() == ShardId::SOURCES,
        ) {
            self.clock.follow(now);
        }
        if let Some(why) = received.lost {
            return Err(EngineError::ExchangeLost {
                shard: self.shard_id_or_sources(),
                why,
            });
        }
        if received.stuck {
            return Err(EngineError::Stuck(self.describe_unfinished()));
        }
        self.take_handed(
            received.deliveries,
            received.newest_cut,
            received.others_cut,
            received.stop_after,
        )
    }

    /// Puts what another shard handed this one where it goes: to the
    /// stages reading it here, or to the side inputs.
    pub(super) fn apply_delivery(&mut self, delivery: Delivery) -> Result<(), EngineError> {
        let (pcoll, _, _) = delivery.parts();
        if self.topology.plan.pcollections.get(pcoll).is_none() {
            return Err(EngineError::UnknownDelivery {
                shard: self.shard_id_or_sources(),
                index: pcoll.index(),
            });
        }
        match delivery {
            Delivery::Owned {
                pcollection,
                elements,
            } => {
                for e in self.decode_delivered(pcollection, &elements)? {
                    self.queue_for_consumers(pcollection, e)?;
                }
            }
            Delivery::SideInput {
                pcollection,
                elements,
            } => {
                for e in self.decode_delivered(pcollection, &elements)? {
                    self.add_to_side_inputs(pcollection, &e)?;
                }
            }
        }
        Ok(())
    }

    /// Elements another shard handed over, read with `pcoll`'s coders.
    fn decode_delivered(
        &self,
        pcoll: PCollectionIdx,
        elements: &Bytes,
    ) -> Result<Vec<DecodedElement>, EngineError> {
        let pc = &self.topology.plan.pcollections[pcoll];
        decode_windowed_values(elements, &pc.value_coder, &pc.window_coder).map_err(|source| {
            EngineError::Decode {
                pcollection: pc.id.clone(),
                source,
            }
        })
    }

    /// On a shard: sends what was gathered for other shards, then publishes
    /// this shard's output watermarks (in that order: see
    /// [`crate::shards`]).
    pub(super) fn publish_to_shards(&mut self) {
        self.send_outgoing();
        let Some(shard) = self.shard.as_mut() else {
            return;
        };
        if shard.link.id() == ShardId::SOURCES && self.clock.is_scripted() {
            shard.link.publish_processing_time(self.clock.now());
        }
        let published: Vec<(Timestamp, bool)> = self
            .stages
            .iter_enumerated()
            .map(|(idx, s)| (s.progress.output_wm, self.over_its_bound(idx)))
            .collect();
        if let Some(shard) = &self.shard {
            shard.link.publish(published.into_iter());
        }
    }

    /// On a shard: sends what was gathered for other shards.
    pub(super) fn send_outgoing(&mut self) {
        let Some(shard) = self.shard.as_mut() else {
            return;
        };
        if shard.outgoing.is_empty() {
            return;
        }
        let deliveries = shard
            .outgoing
            .drain()
            .map(|((to, pcollection, side), bytes)| {
                (to, Delivery::new(pcollection, side, Bytes::from(bytes)))
            });
        shard.link.send(deliveries);
    }

    /// Whether stage `stage`'s queue on another shard is over its bound
    /// (never for a single engine).
    pub(super) fn over_elsewhere(&self, stage: StageIdx) -> bool {
        self.shard.as_ref().is_some_and(|s| s.over_elsewhere[stage])
    }

    /// Whether frames this shard sent wait for the exchange's credit (as
    /// of the last take): the credit's return will wake it.
    pub(super) fn exchange_full(&self) -> bool {
        self.shard.as_ref().is_some_and(|s| s.exchange_full)
    }

    /// Whether stage `stage` sends output to other shards while the
    /// exchange holds all its flow control allows: it waits, as for a
    /// full queue (never for a single engine).
    pub(super) fn exchange_holds_back(&self, stage: StageIdx) -> bool {
        self.shard.as_ref().is_some_and(|s| {
            s.exchange_full
                && self.topology.plan.stages[stage]
                    .outputs
                    .iter()
                    .any(|&p| s.partitioned[p] || s.broadcast[p])
        })
    }

    /// Marks ready the side inputs whose producer has finished on every
    /// shard (a single engine does so as the stage finishes): after each
    /// watermark pass, before scheduling.
    pub(super) fn tell_side_inputs_finished_everywhere(&mut self) {
        if self.shard.is_none() {
            return;
        }
        let finished: Vec<StageIdx> = self
            .stages
            .indices()
            .filter(|&idx| {
                self.shard
                    .as_ref()
                    .is_some_and(|s| !s.finished_everywhere[idx])
                    && self.producer_watermark(idx) >= MAX_TIMESTAMP
            })
            .collect();
        for idx in finished {
            if let Some(shard) = self.shard.as_mut() {
                shard.finished_everywhere[idx] = true;
            }
            self.on_stage_finished(idx);
        }
    }

    /// This engine's shard, if it is one.
    pub(super) fn shard_id(&self) -> Option<ShardId> {
        self.shard.as_ref().map(|s| s.link.id())
    }

    /// How many shards the job runs on, if this engine is one of them.
    pub(super) fn shard_count(&self) -> Option<u32> {
        self.shard.as_ref().map(|s| s.link.layout().shards())
    }

    /// Whether stage finishing is told to side inputs as it happens here
    /// (a single engine) rather than once it happened on every shard.
    pub(super) fn finishes_alone(&self) -> bool {
        self.shard.is_none()
    }

    /// On a quiet shard (nothing running, nothing to run now; `waking`:
    /// something due later): parks it (see
    /// [`crate::shards::exchange::ShardLink::park`]); `None` for a single
    /// engine. A turn to apply a TestStream event is kept for
    /// [`Self::may_step_test_streams`].
    pub(super) fn park(&mut self, waking: bool) -> Option<Parked> {
        self.shard.as_ref()?;
        let can_step = self.has_test_stream_events();
        let shard = self.shard.as_mut()?;
        let parked = shard.link.park(shard.seen, can_step, waking);
        shard.parked = parked == Parked::Waiting;
        shard.turn |= parked == Parked::YourTurn;
        Some(parked)
    }

    /// On a shard that parked and has work again: no longer quiet.
    pub(super) fn unpark(&mut self) {
        if let Some(shard) = self.shard.as_mut().filter(|s| s.parked) {
            shard.link.unpark();
            shard.parked = false;
        }
    }

    /// Whether this engine may apply a TestStream event now that it is
    /// idle: a single engine may; a shard only on its turn, when every
    /// shard is quiet (the turn is used up by asking).
    pub(super) fn may_step_test_streams(&mut self) -> bool {
        match self.shard.as_mut() {
            None => true,
            Some(shard) => std::mem::take(&mut shard.turn),
        }
    }

    /// Whether some TestStream of this engine has events left.
    fn has_test_stream_events(&self) -> bool {
        self.stages.iter().any(|s| match &s.kind {
            KindState::TestStream(cursor) => cursor.has_events_left(),
            _ => false,
        })
    }

    /// On a shard: what to wait on for the board to change, and the
    /// version last seen.
    pub(super) fn shard_wake(&self) -> Option<watch::Receiver<u64>> {
        self.shard.as_ref().map(|s| s.link.subscribe())
    }

    /// The board's version this shard last took at (0 for a single engine).
    pub(super) fn shard_seen(&self) -> u64 {
        self.shard.as_ref().map_or(0, |s| s.seen)
    }

    /// On a shard that finished: tells the others.
    pub(super) fn finish_shard(&mut self) {
        if let Some(shard) = &self.shard {
            shard.link.finish();
        }
    }
}

/// Runs the engines of every shard of one job (each made with its
/// [`ShardLink`]) until all finish, one fails, or `cancel` turns true; the
/// first failure stops the others and is the run's. The summaries of the
/// shards add up to the job's.
pub async fn run_shards(
    engines: Vec<Engine>,
    mut cancel: watch::Receiver<bool>,
) -> Result<RunSummary, EngineError> {
    let (stop, stopped) = watch::channel(false);
    let mut runs = tokio::task::JoinSet::new();
    for engine in engines {
        runs.spawn(engine.run(stopped.clone()));
    }
    let mut summary = RunSummary::default();
    let mut failure = None;
    let mut cancel_open = true;
    loop {
        tokio::select! {
            joined = runs.join_next() => {
                let Some(joined) = joined else {
                    break;
                };
                match joined {
                    Ok(Ok(part)) => summary.add(part),
                    Ok(Err(error)) => {
                        // A shard stopping after a savepoint's epoch (or
                        // cancelled with the others) stops none: each
                        // stops once its own cut is out.
                        let cancelled = matches!(error, EngineError::Cancelled);
                        if failure.is_none() || !cancelled {
                            if !cancelled {
                                let _ = stop.send(true);
                            }
                            if failure.as_ref().is_none_or(|f| matches!(f, EngineError::Cancelled))
                            {
                                failure = Some(error);
                            }
                        }
                    }
                    Err(join) => std::panic::resume_unwind(join.into_panic()),
                }
            }
            changed = cancel.changed(), if cancel_open => {
                match changed {
                    Ok(()) if *cancel.borrow() => {
                        let _ = stop.send(true);
                    }
                    Ok(()) => {}
                    Err(_) => cancel_open = false,
                }
            }
        }
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(summary),
    }
}

impl RunSummary {
    /// Adds another shard's summary of the same job to this one.
    fn add(&mut self, other: RunSummary) {
        self.bundles += other.bundles;
        self.dropped_late += other.dropped_late;
        for (stage, n) in other.dropped_late_by_stage {
            match self
                .dropped_late_by_stage
                .iter_mut()
                .find(|(s, _)| *s == stage)
            {
                Some((_, total)) => *total += n,
                None => self.dropped_late_by_stage.push((stage, n)),
            }
        }
        self.peak_pending_bytes = self.peak_pending_bytes.max(other.peak_pending_bytes);
        self.spilled_bytes += other.spilled_bytes;
        self.output_spilled_bytes += other.output_spilled_bytes;
        self.queue_spilled_bytes += other.queue_spilled_bytes;
        self.state_spilled_bytes += other.state_spilled_bytes;
        self.handed_out_keys += other.handed_out_keys;
        self.strict = match (self.strict.take(), other.strict) {
            (Some(mut mine), Some(theirs)) => {
                mine.replayed_bundles += theirs.replayed_bundles;
                mine.smaller_bundles += theirs.smaller_bundles;
                mine.reordered_bundles += theirs.reordered_bundles;
                mine.replays.extend(theirs.replays);
                Some(mine)
            }
            (mine, theirs) => mine.or(theirs),
        };
    }
}
