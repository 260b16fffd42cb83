//! Delivering produced elements to their consumers: pending queues,
//! grouping stages and side-input stores. What a stage emits — in a step
//! of the watermark pass, or, a streaming GroupByKey, as an element
//! arrives ([`Stepped`]) — is delivered here too, like a bundle's output;
//! delivery never fires a stage itself.

use bytes::Bytes;
use smallvec::SmallVec;

use super::grouping_stage::GroupingState;
use super::pending::Queued;
use super::stage_state::{KindState, StageState};
use super::step::Stepped;
use super::{spill_failed, Engine, EngineError};
use crate::coder::{
    decode_whole_windowed_values, decode_windowed_values, BorrowedWindowedValues, CoderError,
    DecodedElement, ElementRun, PaneInfo, TimerValue,
};
use crate::grouping::{Fired, GroupingError};
use crate::plan::{PCollectionIdx, SdkStage, SideInputAccess, StageIdx, StageKind};
use crate::window::Window;

/// Most bytes of a GroupByKey's output emitted in one step of the engine
/// (less if the consumer's queue bound is smaller): a window closing over
/// many keys, or a spilled one, is emitted a step at a time, with bundles
/// scheduled between steps.
const FIRE_STEP_BYTES: usize = 4 << 20;

/// Fewest elements of a firing queued as one run: fewer (a streaming
/// trigger's firing of one key, say) are queued one by one, which costs
/// less than a run's shared record.
const RUN_AT_LEAST: usize = 64;

/// Elements of a chunk routed to GroupByKeys before the rest of the chunk
/// is announced to them ([`GroupingBuffer::expect_elements`]): enough to
/// judge the elements' size.
const EXPECT_AFTER_ELEMENTS: usize = 1024;

impl Engine {
    /// Deliver encoded windowed values produced into PCollection `pcoll`.
    pub(super) fn route(&mut self, pcoll: PCollectionIdx, bytes: Bytes) -> Result<(), EngineError> {
        self.route_elements(pcoll, bytes, false).map(|_| ())
    }

    /// [`Self::route`] for one chunk of a stream cut anywhere: routes the
    /// whole elements at its start and returns how many bytes they take
    /// (the rest is the start of an element the next chunk continues).
    pub(super) fn route_whole(
        &mut self,
        pcoll: PCollectionIdx,
        bytes: Bytes,
    ) -> Result<usize, EngineError> {
        self.route_elements(pcoll, bytes, true)
    }

    /// [`Self::route`] and, with `cut`, [`Self::route_whole`]: the bytes
    /// routed.
    fn route_elements(
        &mut self,
        pcoll: PCollectionIdx,
        bytes: Bytes,
        cut: bool,
    ) -> Result<usize, EngineError> {
        if bytes.is_empty() {
            return Ok(0);
        }
        if self.only_groupings_consume(pcoll) && self.stays_local(pcoll) {
            return self.route_to_grouping(pcoll, &bytes, cut);
        }
        let pc = &self.topology.plan.pcollections[pcoll];
        let decoded = if cut {
            decode_whole_windowed_values(&bytes, &pc.value_coder, &pc.window_coder)
        } else {
            decode_windowed_values(&bytes, &pc.value_coder, &pc.window_coder)
                .map(|elements| (elements, bytes.len()))
        };
        let (elements, routed) = decoded.map_err(|source| EngineError::Decode {
            pcollection: pc.id.clone(),
            source,
        })?;
        for e in elements {
            self.route_element(pcoll, e)?;
        }
        Ok(routed)
    }

    /// [`Self::route`] for a run of elements (what a GroupByKey's firing
    /// emitted, with its record of each element): one queue entry for each
    /// consumer that takes runs, element by element where any consumer
    /// needs more than a queue entry (a GroupByKey's buffer, a side input,
    /// a stateful stage's expiry timers).
    pub(super) fn route_run(
        &mut self,
        pcoll: PCollectionIdx,
        run: ElementRun,
    ) -> Result<(), EngineError> {
        if !self.only_queues_consume(pcoll) || !self.stays_local(pcoll) {
            return run
                .elements()
                .try_for_each(|e| self.route_element(pcoll, e));
        }
        if let Some(producer) = self.topology.producers[pcoll] {
            let counters = &mut self.stages[producer].progress.counters;
            counters.elements_out += run.len() as u64;
            counters.bytes_out += run.encoded_len() as u64;
        }
        let n = self.topology.consumers[pcoll].stages.len();
        let mut run = Some(run);
        for i in 0..n {
            let stage = self.topology.consumers[pcoll].stages[i];
            let queued = if i + 1 == n { run.take() } else { run.clone() };
            let Some(queued) = queued else {
                break;
            };
            let pending = &mut self.stages[stage].queue.pending;
            pending
                .push_run(queued)
                .map_err(spill_failed(&self.topology.plan, stage))?;
            self.summary.peak_pending_bytes = self.summary.peak_pending_bytes.max(pending.bytes());
        }
        Ok(())
    }

    /// [`Self::route_element`] or [`Self::route_run`], as the entry is.
    pub(super) fn route_entry(
        &mut self,
        pcoll: PCollectionIdx,
        entry: Queued,
    ) -> Result<(), EngineError> {
        match entry {
            Queued::One(e) => self.route_element(pcoll, e),
            Queued::Run(run) => self.route_run(pcoll, run),
        }
    }

    /// Whether every consumer of `pcoll` only queues what it is given
    /// (an SDK stage that sets no expiry timers as elements arrive, or a
    /// Flatten) and none reads it as a side input: a run of its elements
    /// then goes to each queue as it is.
    fn only_queues_consume(&self, pcoll: PCollectionIdx) -> bool {
        let consumers = &self.topology.consumers[pcoll];
        consumers.side_inputs.is_empty()
            && consumers.stages.iter().all(|&c| {
                matches!(
                    (&self.topology.plan.stages[c].kind, &self.stages[c].kind),
                    (
                        StageKind::Sdk(SdkStage {
                            window_expiration: None,
                            ..
                        }),
                        KindState::Sdk(_)
                    ) | (StageKind::Flatten, KindState::Flatten)
                )
            })
    }

    /// Whether every consumer of `pcoll` is a GroupByKey (and none reads it
    /// as a side input): its elements then go straight into their buffers.
    fn only_groupings_consume(&self, pcoll: PCollectionIdx) -> bool {
        let consumers = &self.topology.consumers[pcoll];
        consumers.side_inputs.is_empty()
            && !consumers.stages.is_empty()
            && consumers
                .stages
                .iter()
                .all(|&c| self.stages[c].grouping().is_some())
    }

    /// [`Self::route`] when every consumer is a GroupByKey: elements are
    /// read in place and each buffer copies the bytes it keeps, so no
    /// element is materialized. With `cut`, `bytes` may end inside an
    /// element, which is left unrouted: the bytes routed are returned.
    fn route_to_grouping(
        &mut self,
        pcoll: PCollectionIdx,
        bytes: &[u8],
        cut: bool,
    ) -> Result<usize, EngineError> {
        let pc = &self.topology.plan.pcollections[pcoll];
        let (value_coder, window_coder) = (pc.value_coder.clone(), pc.window_coder.clone());
        let decode_error = |engine: &Engine, source| EngineError::Decode {
            pcollection: engine.topology.plan.pcollections[pcoll].id.clone(),
            source,
        };
        // Every eighth of a big chunk, the GroupByKeys hear how many
        // elements are left (by the size of those so far).
        let (mut routed, mut routed_bytes) = (0usize, 0usize);
        let eighth = bytes.len() / 8;
        let mut next_mark = eighth;
        // Processing time is read once per chunk: a clock read per element
        // was ~3% of a GroupByKey's routing, and a chunk is routed within
        // milliseconds, finer than any processing-time trigger.
        let now = self.now();
        // Only a streaming GroupByKey fires as elements arrive: batch skips
        // the per-element checks that firing needs.
        let streaming = self.config.streaming;
        for item in BorrowedWindowedValues::new(bytes, &value_coder, &window_coder) {
            let (header, kv, len) = match item {
                Ok(element) => element,
                Err(CoderError::Truncated(_)) if cut => return Ok(routed_bytes),
                Err(source) => return Err(decode_error(self, source)),
            };
            routed += 1;
            routed_bytes += len;
            if routed_bytes >= next_mark && routed >= EXPECT_AFTER_ELEMENTS {
                next_mark = routed_bytes + eighth;
                let per_element = routed_bytes.div_ceil(routed).max(1);
                let left = bytes.len().saturating_sub(routed_bytes) / per_element;
                self.expect_grouped(pcoll, left);
            }
            if let Some(producer) = self.topology.producers[pcoll] {
                let counters = &mut self.stages[producer].progress.counters;
                counters.elements_out += 1;
                counters.bytes_out += len as u64;
            }
            for i in 0..self.topology.consumers[pcoll].stages.len() {
                let stage = self.topology.consumers[pcoll].stages[i];
                let blocked = streaming && self.blocks_firing_on_arrival(stage);
                let s = &mut self.stages[stage];
                let input_wm = s.progress.input_wm;
                s.progress.counters.elements_processed += 1;
                s.progress.counters.bytes_processed += len as u64;
                let Some(g) = s.grouping_state_mut() else {
                    continue;
                };
                let added = g.add_value(&header, kv, input_wm, now, blocked);
                added.map_err(|e| {
                    let pcollection = self.topology.plan.pcollections[pcoll].id.clone();
                    self.grouping_error(stage, pcollection, e)
                })?;
                if streaming {
                    self.deliver_fired_on_arrival(stage)?;
                }
            }
        }
        Ok(routed_bytes)
    }

    /// Tells the GroupByKeys reading `pcoll` that about `elements` more of
    /// its elements are coming.
    fn expect_grouped(&mut self, pcoll: PCollectionIdx, elements: usize) {
        for &stage in &self.topology.consumers[pcoll].stages {
            if let Some(g) = self.stages[stage].grouping_mut() {
                g.expect_elements(elements);
            }
        }
    }

    /// Delivers what stage `idx` emitted in a step of the watermark pass.
    pub(super) fn deliver(&mut self, idx: StageIdx, stepped: Stepped) -> Result<(), EngineError> {
        match stepped {
            Stepped::Idle => Ok(()),
            Stepped::Emitted(elements) => elements
                .into_iter()
                .try_for_each(|(pcoll, bytes)| self.route(pcoll, bytes)),
            Stepped::Forwarded(entries) => {
                let outputs = self.topology.plan.stages[idx].outputs.clone();
                let Some((&last, others)) = outputs.split_last() else {
                    return Ok(());
                };
                for &out in others {
                    for q in &entries {
                        self.route_entry(out, q.clone())?;
                    }
                }
                entries
                    .into_iter()
                    .try_for_each(|q| self.route_entry(last, q))
            }
            Stepped::Fired(fired) => self.deliver_fired(idx, fired),
        }
    }

    /// Delivers one firing of GroupByKey `stage` to every output: the
    /// GroupByKeys among the consumers read its bytes in place; queues take
    /// the elements as the firing recorded them while encoding them (not
    /// decoded again), as a run if there are enough of them to be worth one.
    fn deliver_fired(&mut self, stage: StageIdx, out: Fired) -> Result<(), EngineError> {
        let mut queued: SmallVec<[PCollectionIdx; 2]> = SmallVec::new();
        for i in 0..self.topology.plan.stages[stage].outputs.len() {
            let pcoll = self.topology.plan.stages[stage].outputs[i];
            if self.only_groupings_consume(pcoll) && self.stays_local(pcoll) {
                self.route_to_grouping(pcoll, &out.bytes, false)?;
            } else {
                queued.push(pcoll);
            }
        }
        let Some((&last, others)) = queued.split_last() else {
            return Ok(());
        };
        if out.element_count() < RUN_AT_LEAST {
            let elements = out.into_elements();
            for &pcoll in others {
                for e in &elements {
                    self.route_element(pcoll, e.clone())?;
                }
            }
            for e in elements {
                self.route_element(last, e)?;
            }
        } else if let Some(run) = out.into_run() {
            for &pcoll in others {
                self.route_run(pcoll, run.clone())?;
            }
            self.route_run(last, run)?;
        }
        Ok(())
    }

    /// Delivers what GroupByKey `stage` fired as the element just given to
    /// it arrived (streaming), if anything. Out of line, so that batch
    /// routing, which never calls it, keeps a tight loop.
    #[inline(never)]
    fn deliver_fired_on_arrival(&mut self, stage: StageIdx) -> Result<(), EngineError> {
        let fired = self.stages[stage]
            .grouping_state_mut()
            .and_then(GroupingState::take_fired_on_arrival);
        match fired {
            Some(fired) => self.deliver_fired(stage, fired),
            None => Ok(()),
        }
    }

    /// Whether GroupByKey `stage`, firing as elements arrive (streaming),
    /// must hold its panes back: its consumers are over their bound.
    fn blocks_firing_on_arrival(&self, stage: StageIdx) -> bool {
        self.stages[stage]
            .grouping_state()
            .is_some_and(GroupingState::may_fire_on_arrival)
            && self.backpressured(stage)
    }

    /// Gives every GroupByKey a step's worth of output ([`FIRE_STEP_BYTES`]).
    pub(super) fn refill_fire_budgets(&mut self) {
        let step = self.config.max_pending_bytes.clamp(1, FIRE_STEP_BYTES);
        for g in (&mut self.stages)
            .into_iter()
            .filter_map(StageState::grouping_state_mut)
        {
            g.refill_budget(step);
        }
    }

    /// The engine's error for a grouping stage's failure: bytes of
    /// `pcollection` (its input, or what it emits) that do not decode, or
    /// its spill space failing.
    pub(super) fn grouping_error(
        &self,
        stage: StageIdx,
        pcollection: String,
        e: GroupingError,
    ) -> EngineError {
        match e {
            GroupingError::Coder(source) => EngineError::Decode {
                pcollection,
                source,
            },
            GroupingError::Spill(source) => spill_failed(&self.topology.plan, stage)(source),
        }
    }

    /// Delivers one element produced into `pcoll`: to the side inputs
    /// reading it, and to the stages reading it here, or handed to the
    /// shard that owns its key ([`Engine::hand_off`]).
    pub(super) fn route_element(
        &mut self,
        pcoll: PCollectionIdx,
        e: DecodedElement,
    ) -> Result<(), EngineError> {
        if let Some(producer) = self.topology.producers[pcoll] {
            let counters = &mut self.stages[producer].progress.counters;
            counters.elements_out += 1;
            counters.bytes_out += e.encoded.len() as u64;
        }
        // The checks inline and the rare work out of line: this runs for
        // every element crossing a stage boundary.
        if !self.topology.consumers[pcoll].side_inputs.is_empty() {
            self.add_to_side_inputs(pcoll, &e)?;
        }
        if self.shard.is_some() {
            return self.queue_here_or_hand_off(pcoll, e);
        }
        self.queue_for_consumers(pcoll, e)
    }

    /// On a shard: queues `e` here, or hands it to the shard owning its key.
    #[inline(never)]
    fn queue_here_or_hand_off(
        &mut self,
        pcoll: PCollectionIdx,
        e: DecodedElement,
    ) -> Result<(), EngineError> {
        if self.hand_off(pcoll, &e)? {
            return Ok(());
        }
        self.queue_for_consumers(pcoll, e)
    }

    /// Adds element `e` of `pcoll` to every side input reading `pcoll`.
    pub(super) fn add_to_side_inputs(
        &mut self,
        pcoll: PCollectionIdx,
        e: &DecodedElement,
    ) -> Result<(), EngineError> {
        let consumers = &self.topology.consumers[pcoll];
        if !consumers.side_inputs.is_empty() {
            let pc = &self.topology.plan.pcollections[pcoll];
            let mut store = self.side_inputs.lock();
            for window in &e.header.windows {
                let mut wbytes = Vec::new();
                pc.window_coder
                    .encode_window(window, &mut wbytes)
                    .map_err(|source| EngineError::Decode {
                        pcollection: pc.id.clone(),
                        source,
                    })?;
                let wbytes = Bytes::from(wbytes);
                for (side_input, access) in &consumers.side_inputs {
                    match access {
                        SideInputAccess::Iterable => {
                            store.add_iterable(side_input, wbytes.clone(), e.value_bytes())
                        }
                        SideInputAccess::Multimap => {
                            let value = e.value_bytes();
                            let n = pc.value_coder.kv_key_len(&value).map_err(|source| {
                                EngineError::Decode {
                                    pcollection: pc.id.clone(),
                                    source,
                                }
                            })?;
                            store.add_multimap(
                                side_input,
                                wbytes.clone(),
                                value.slice(..n),
                                value.slice(n..),
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Gives element `e` of `pcoll` to every stage reading it as its main
    /// input: a GroupByKey's buffer, or a stage's queue.
    // Always inlined into `route_element`: a call passing the element by
    // value cost ~150 instructions per element (engine_instructions.sh).
    #[inline(always)]
    pub(super) fn queue_for_consumers(
        &mut self,
        pcoll: PCollectionIdx,
        e: DecodedElement,
    ) -> Result<(), EngineError> {
        // By index: the consumer list is read per element and must not be
        // cloned for each one. The last consumer queueing it takes `e`.
        let n = self.topology.consumers[pcoll].stages.len();
        let mut e = Some(e);
        for i in 0..n {
            let stage = self.topology.consumers[pcoll].stages[i];
            let Some(element) = e.as_ref() else {
                break;
            };
            let now = self.now();
            let blocked = self.config.streaming && self.blocks_firing_on_arrival(stage);
            let StageState {
                queue,
                progress,
                kind,
            } = &mut self.stages[stage];
            let input_wm = progress.input_wm;
            match kind {
                KindState::Grouping(g) => {
                    // A grouping stage runs no bundles: its progress is
                    // the elements it took in.
                    progress.counters.elements_processed += 1;
                    progress.counters.bytes_processed += element.encoded.len() as u64;
                    if let Err(e) = g.add(element, input_wm, now, blocked) {
                        let pcollection = self.topology.plan.pcollections[pcoll].id.clone();
                        return Err(self.grouping_error(stage, pcollection, e));
                    }
                    if self.config.streaming {
                        self.deliver_fired_on_arrival(stage)?;
                    }
                }
                kind => {
                    if let (
                        StageKind::Sdk(SdkStage {
                            window_expiration: Some(expiration),
                            allowed_lateness,
                            ..
                        }),
                        KindState::Sdk(state),
                    ) = (&self.topology.plan.stages[stage].kind, kind)
                    {
                        let pc = &self.topology.plan.pcollections[pcoll];
                        let key_len =
                            pc.value_coder
                                .kv_key_len(element.value())
                                .map_err(|source| EngineError::Decode {
                                    pcollection: pc.id.clone(),
                                    source,
                                })?;
                        let key = element.value_bytes().slice(..key_len);
                        for window in &element.header.windows {
                            state.timers.set_if_absent(
                                &expiration.transform_id,
                                &expiration.family_id,
                                expiration_timer(key.clone(), window, *allowed_lateness),
                            );
                        }
                    }
                    let queued = if i + 1 == n { e.take() } else { e.clone() };
                    if let Some(queued) = queued {
                        queue
                            .pending
                            .push_back(queued)
                            .map_err(spill_failed(&self.topology.plan, stage))?;
                    }
                    self.summary.peak_pending_bytes =
                        self.summary.peak_pending_bytes.max(queue.pending.bytes());
                }
            }
        }
        Ok(())
    }
}

/// The timer that calls a stateful transform back as `window` expires for
/// `key`: it fires once the input watermark passed the window's
/// garbage-collection time (so all the window's input, late data included,
/// was processed) and holds output at the window's end, where its output
/// belongs.
fn expiration_timer(key: Bytes, window: &Window, allowed_lateness: i64) -> TimerValue {
    TimerValue {
        user_key: key,
        dynamic_tag: String::new(),
        windows: smallvec::smallvec![window.clone()],
        clear: false,
        fire_timestamp: window.garbage_collection_time(allowed_lateness),
        hold_timestamp: window.max_timestamp(),
        pane: PaneInfo::NO_FIRING,
    }
}
