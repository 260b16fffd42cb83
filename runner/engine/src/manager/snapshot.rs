//! Checkpoints of a running engine: a consistent cut of everything it
//! must not lose, as named parts for an incremental store, and the way
//! back from them.
//!
//! The cut is taken between two commits, as if every bundle in flight had
//! failed: a bundle's input goes back to the front of its stage's queue
//! and the timers it was given back to the timer store, and nothing it
//! wrote is included (its writes live in its overlay until it commits).
//! A restored engine therefore runs those bundles again, and every state
//! write, timer and output is applied exactly once. Side effects a DoFn
//! has on the outside world (a file it wrote) may happen twice, as in any
//! runner that retries.
//!
//! Parts: `engine` (counters, clocks and the stage names the checkpoint
//! belongs to), `stage/{i}` (queue, delayed residuals, grouping buffer,
//! timers, watermarks), `user_state/{i}`, `user_state_spill/{i}` (where a
//! stage's bags on the durable spill space are: a periodic checkpoint names
//! them rather than copying them, see [`EngineBuilder::durable_state`](super::EngineBuilder::durable_state)),
//! `queue_spill/{i}` and `grouping_spill/{i}` (likewise, the spilled back
//! of a stage's queue and the spilled windows of its GroupByKey),
//! `side_inputs`, and the parts the engine's owner added
//! ([`EngineBuilder::extra_part`](super::EngineBuilder::extra_part)). A savepoint copies everything: it must
//! stand on its own. Each part's
//! bytes are deterministic — maps are written sorted — so a stage that did
//! nothing since the last checkpoint yields the same bytes and the store
//! skips it.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::time::Instant;

use super::grouping_stage::GroupingState;
use super::part_name::PartName;
use super::pending::SpilledQueue;
use super::sharded_checkpoint::shards_of;
use super::stage_map::{NameMapping, RecordedNames, StageMap};
use super::stage_state::{Delayed, KindRecord};
use super::stats::{CounterRecord, StageCounters};
use super::{Engine, InFlight};
use crate::coder::{DecodedElement, WindowedValueHeader};
use crate::grouping::{GroupingSnapshot, SpilledWindows};
use crate::plan::{StageIdx, StageKind, TransformId};
use crate::state::{SideInputSnapshot, SpilledBags, UserStateSnapshot};
use crate::time::{Timestamp, MAX_TIMESTAMP, MIN_TIMESTAMP};
use crate::timers::TimerStore;

/// Why a checkpoint could not be taken or restored.
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// A part could not be encoded or decoded.
    #[error("checkpoint part '{part}': {reason}")]
    Codec {
        /// The part's name.
        part: String,
        /// What went wrong.
        reason: String,
    },
    /// No savepoint could be taken (why is in the text).
    #[error("no savepoint: {0}")]
    NotTaken(String),
    /// The checkpoint was taken of a different pipeline.
    #[error("the checkpoint does not belong to this pipeline: {0}")]
    Mismatch(String),
    /// A spilled GroupByKey buffer could not be read back (taking) or
    /// spilled again (restoring).
    #[error("checkpoint of a GroupByKey buffer: {0}")]
    Grouping(String),
    /// A stage's spilled user state could not be read back (taking) or
    /// spilled again (restoring).
    #[error("checkpoint of the user state of stage '{stage}': {source}")]
    UserState {
        /// The stage's name.
        stage: String,
        /// What the spill space said.
        source: crate::spill::SpillError,
    },
    /// A stage's spilled queue could not be read back (taking) or spilled
    /// again (restoring).
    #[error("checkpoint of the queue of stage '{stage}': {source}")]
    Queue {
        /// The stage's name.
        stage: String,
        /// What the spill space said.
        source: crate::spill::SpillError,
    },
}

/// Version of the encoding; a checkpoint of another version is refused.
/// Version 3 added the `user_state_spill/{i}` parts (bags a checkpoint
/// names on the durable spill space instead of holding them), and version 4 the
/// `queue_spill/{i}` and `grouping_spill/{i}` parts (queue segments and a
/// GroupByKey's spilled windows likewise), which an older
/// reader would silently go without; an older checkpoint has none and
/// reads as it did. Bump it with any change to what a checkpoint holds
/// or how it is encoded: `tests/checkpoint_fixtures.rs` keeps a checkpoint
/// of every version since [`OLDEST_SNAPSHOT_VERSION`] and restores each.
/// Version 5 records the pipeline's names of its stages and transforms
/// ([`crate::plan::PipelineNames`]), so that it restores onto another fusion;
/// an older checkpoint restores only onto the same stage names.
pub const SNAPSHOT_VERSION: u32 = 5;

/// The oldest version still read.
pub const OLDEST_SNAPSHOT_VERSION: u32 = 2;

/// An element as a checkpoint keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ElementRecord {
    header: WindowedValueHeader,
    /// Where the value starts in `encoded` (it runs to the end).
    value_offset: u32,
    encoded: Bytes,
}

impl ElementRecord {
    fn of(e: &DecodedElement) -> Self {
        ElementRecord {
            header: e.header.clone(),
            value_offset: e.value_start() as u32,
            encoded: e.encoded.clone(),
        }
    }

    pub(super) fn into_element(self) -> DecodedElement {
        DecodedElement::new(self.header, self.encoded, self.value_offset as usize)
    }
}

/// Engine-wide values, as every version since [`OLDEST_SNAPSHOT_VERSION`]
/// starts them.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct EngineRecord {
    pub(super) version: u32,
    pub(super) stage_names: Vec<String>,
    pub(super) next_bundle: u64,
    pub(super) clock_offset: i64,
    pub(super) frozen_clock: Option<Timestamp>,
    pub(super) bundles: u64,
    pub(super) peak_pending_bytes: u64,
    /// Bundles in flight at the cut, which a restored engine runs again.
    pub(super) rerun_bundles: Vec<u64>,
}

/// What version 5 added after the [`EngineRecord`]: the pipeline's names
/// of its stages and transforms (see [`RecordedNames`]).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct EngineNames {
    pub(super) stage_heads: Vec<Vec<String>>,
    pub(super) transforms: Vec<(String, String)>,
}

/// Reads the `engine` part of any version read: its record, and the names
/// it recorded (none before version 5: stages are matched by name).
pub(super) fn decode_engine(bytes: &[u8]) -> Result<(EngineRecord, RecordedNames), SnapshotError> {
    let codec = |e: postcard::Error| SnapshotError::Codec {
        part: PartName::Engine.to_string(),
        reason: e.to_string(),
    };
    let (record, rest): (EngineRecord, &[u8]) = postcard::take_from_bytes(bytes).map_err(codec)?;
    let mut names = RecordedNames {
        stage_names: record.stage_names.clone(),
        ..RecordedNames::default()
    };
    if record.version >= 5 {
        let (added, _): (EngineNames, _) = postcard::take_from_bytes(rest).map_err(codec)?;
        names.stage_heads = added.stage_heads;
        names.transforms = added.transforms;
    }
    Ok((record, names))
}

/// What a checkpoint says about the run it was taken of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// The version of its encoding ([`SNAPSHOT_VERSION`] when this build
    /// wrote it).
    pub version: u32,
    /// Bundle numbers below this had been started before the cut.
    pub next_bundle: u64,
    /// Of those, the ones still in flight at the cut: their effects are
    /// not in the checkpoint, and a restored engine runs their input again.
    pub rerun_bundles: Vec<u64>,
    /// The unique name of each SDK transform by the id it had in the
    /// pipeline checkpointed (empty before version 5): what the job's
    /// other records keyed by transform id (metrics) are moved by.
    pub transforms: Vec<(String, String)>,
}

/// Reads what a checkpoint says about its run, for logs and for tests
/// that must tell committed work from work that will be redone.
pub fn describe_checkpoint(parts: &[(String, Bytes)]) -> Result<CheckpointInfo, SnapshotError> {
    let bytes = find_part(parts, PartName::Engine)
        .ok_or_else(|| SnapshotError::Mismatch("it has no part 'engine'".into()))?;
    let (engine, names) = decode_engine(bytes)?;
    Ok(CheckpointInfo {
        version: engine.version,
        next_bundle: engine.next_bundle,
        rerun_bundles: engine.rerun_bundles,
        transforms: names.transforms,
    })
}

/// One stage's queue, timers and progress.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StageRecord<'a> {
    pub(super) pending: Vec<ElementRecord>,
    /// Residuals waiting to resume: (ms still to wait, element, hold).
    pub(super) delayed: Vec<(u64, ElementRecord, Timestamp)>,
    pub(super) grouping: Option<GroupingSnapshot>,
    /// Borrowed from the stage unless bundles in flight gave timers back.
    pub(super) timers: Cow<'a, TimerStore>,
    pub(super) input_wm: Timestamp,
    pub(super) output_wm: Timestamp,
    pub(super) impulse_done: bool,
    pub(super) stream_cursor: u64,
    pub(super) stream_wm: Timestamp,
    pub(super) state_gc_wm: Timestamp,
    pub(super) counters: CounterRecord,
}

/// The spilled back of a stage's queue as a periodic checkpoint keeps it
/// on a durable spill space: its segments by name, then the elements after them
/// (not written yet).
#[derive(Debug, Serialize, Deserialize)]
struct QueueSpillRecord {
    spilled: SpilledQueue,
    tail: Vec<ElementRecord>,
}

/// Encodes `value` into a buffer of exactly its size: a part can be as
/// large as a stage's user state, and a growing buffer would hold up to
/// half as much again while it doubles.
pub(super) fn encode<T: Serialize>(
    part: PartName,
    value: &T,
) -> Result<(String, Bytes), SnapshotError> {
    let part = part.to_string();
    let codec = |e: postcard::Error, part: String| SnapshotError::Codec {
        part,
        reason: e.to_string(),
    };
    let size = match postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default())
    {
        Ok(size) => size,
        Err(e) => return Err(codec(e, part)),
    };
    match postcard::to_extend(value, Vec::with_capacity(size)) {
        Ok(bytes) => Ok((part, Bytes::from(bytes))),
        Err(e) => Err(codec(e, part)),
    }
}

/// How many engines ran a job, in words: `Some(n)` shards, or one engine.
fn engines_text(shards: Option<u32>) -> String {
    match shards {
        Some(n) => format!("{n} engine shards"),
        None => "one engine".to_string(),
    }
}

/// The bytes of part `name`, if the checkpoint has it.
fn find_part(parts: &[(String, Bytes)], name: PartName) -> Option<&Bytes> {
    let name = name.to_string();
    parts.iter().find(|(n, _)| *n == name).map(|(_, b)| b)
}

fn decode<'a, T: Deserialize<'a>>(part: PartName, bytes: &'a [u8]) -> Result<T, SnapshotError> {
    postcard::from_bytes(bytes).map_err(|e| SnapshotError::Codec {
        part: part.to_string(),
        reason: e.to_string(),
    })
}

impl Engine {
    /// A consistent cut of the engine, as named parts that hold all of it
    /// (a savepoint; see the module docs). Cheap enough to take every few
    /// seconds: it copies the queues and state, it does not wait for
    /// anything.
    pub fn checkpoint_parts(&self) -> Result<Vec<(String, Bytes)>, SnapshotError> {
        self.cut(None)
    }

    /// A cut as [`Self::checkpoint_parts`], or, with `number` (counting
    /// the checkpoints sent to the writer), periodic checkpoint `number`,
    /// which names bags on the durable spill space instead of copying them.
    pub(super) fn cut(&self, number: Option<u64>) -> Result<Vec<(String, Bytes)>, SnapshotError> {
        // Panes a streaming GroupByKey fired as an element arrived are in
        // neither its buffer nor a queue until delivery takes them, right
        // after that element.
        let undelivered = self.stages.iter_enumerated().find(|(_, s)| {
            s.grouping_state()
                .is_some_and(GroupingState::holds_fired_panes)
        });
        if let Some((idx, _)) = undelivered {
            return Err(SnapshotError::Codec {
                part: PartName::Stage(idx).to_string(),
                reason: "a cut while fired panes wait to be delivered".into(),
            });
        }
        let now = Instant::now();
        // What bundles in flight took, per stage, oldest bundle first.
        let mut flights: Vec<(&u64, &InFlight)> = self.in_flight.iter().collect();
        flights.sort_by_key(|(id, _)| **id);
        let (clock_offset, frozen_clock) = self.clock.record();
        let mut parts = Vec::with_capacity(2 + 2 * self.stages.len());
        let RecordedNames {
            stage_names,
            stage_heads,
            transforms,
        } = RecordedNames::of(&self.topology.plan);
        // The record, then (version 5 on) the names.
        let record = EngineRecord {
            version: SNAPSHOT_VERSION,
            stage_names,
            next_bundle: self.next_bundle,
            clock_offset,
            frozen_clock,
            bundles: self.summary.bundles,
            peak_pending_bytes: self.summary.peak_pending_bytes as u64,
            rerun_bundles: flights.iter().map(|(id, _)| **id).collect(),
        };
        let names = EngineNames {
            stage_heads,
            transforms,
        };
        parts.push(encode(PartName::Engine, &(record, names))?);
        for idx in self.stages.indices() {
            self.cut_stage(idx, &flights, number, now, &mut parts)?;
            self.cut_user_state(idx, number, &mut parts)?;
        }
        let side_inputs: SideInputSnapshot = self.side_inputs.lock().snapshot();
        parts.push(encode(PartName::SideInputs, &side_inputs)?);
        for (name, read) in &self.durability.extra_parts {
            parts.push((name.clone(), read()));
        }
        Ok(parts)
    }

    /// The parts of stage `idx` in a cut (see [`Self::cut`]): its record
    /// (with what the bundles in flight, `flights`, took from it put back),
    /// and what its queue and grouping buffer name on a store.
    fn cut_stage(
        &self,
        idx: StageIdx,
        flights: &[(&u64, &InFlight)],
        number: Option<u64>,
        now: Instant,
        parts: &mut Vec<(String, Bytes)>,
    ) -> Result<(), SnapshotError> {
        let s = &self.stages[idx];
        let mut pending = Vec::new();
        let kind = s.kind.record();
        let mut timers = kind.timers;
        for (_, flight) in flights.iter().filter(|(_, f)| f.stage == idx) {
            for q in &flight.elements {
                q.for_each_element(|e| pending.push(ElementRecord::of(e)));
            }
            if !flight.fired_timers.is_empty() {
                timers.to_mut().restore(flight.fired_timers.clone());
            }
        }
        let mut tail = Vec::new();
        let spilled_queue = s
            .queue
            .pending
            .checkpoint(
                number.is_some(),
                |e| pending.push(ElementRecord::of(e)),
                |e| tail.push(ElementRecord::of(e)),
            )
            .map_err(|source| SnapshotError::Queue {
                stage: self.topology.plan.stages[idx].name.clone(),
                source,
            })?;
        if let Some(spilled) = spilled_queue {
            parts.push(encode(
                PartName::QueueSpill(idx),
                &QueueSpillRecord { spilled, tail },
            )?);
        }
        let delayed = s
            .queue
            .delayed()
            .iter()
            .map(|d| {
                let wait = d.at.saturating_duration_since(now).as_millis() as u64;
                (wait, ElementRecord::of(&d.element), d.hold)
            })
            .collect();
        let (grouping, spilled_windows) = match s.grouping() {
            Some(g) => {
                let (snapshot, named) = g
                    .checkpoint(number.is_some())
                    .map_err(|e| SnapshotError::Grouping(e.to_string()))?;
                (Some(snapshot), named)
            }
            None => (None, None),
        };
        if let Some(named) = spilled_windows {
            parts.push(encode(PartName::GroupingSpill(idx), &named)?);
        }
        parts.push(encode(
            PartName::Stage(idx),
            &StageRecord {
                pending,
                delayed,
                grouping,
                timers,
                input_wm: s.progress.input_wm,
                output_wm: s.progress.output_wm,
                impulse_done: kind.impulse_done,
                stream_cursor: kind.stream_cursor,
                stream_wm: kind.stream_wm,
                state_gc_wm: kind.state_gc_wm,
                counters: s.progress.counters.record(now),
            },
        )?);
        Ok(())
    }

    /// The parts of stage `idx`'s user state in a cut: its cells, and
    /// (periodic checkpoint `number`) the bags it names on the durable
    /// store.
    fn cut_user_state(
        &self,
        idx: StageIdx,
        number: Option<u64>,
        parts: &mut Vec<(String, Bytes)>,
    ) -> Result<(), SnapshotError> {
        let user_state_error = |source| SnapshotError::UserState {
            stage: self.topology.plan.stages[idx].name.clone(),
            source,
        };
        let mut user_state = self.user_state[idx].lock();
        let (state, spilled) = match number {
            Some(number) => user_state.checkpoint(number),
            None => user_state.snapshot().map(|state| (state, None)),
        }
        .map_err(user_state_error)?;
        drop(user_state);
        parts.push(encode(PartName::UserState(idx), &state)?);
        if let Some(spilled) = spilled {
            parts.push(encode(PartName::UserStateSpill(idx), &spilled)?);
        }
        Ok(())
    }

    /// Continues from a checkpoint taken by [`Self::checkpoint_parts`] of
    /// an engine running this pipeline, fused as this plan is or not (see
    /// `manager/stage_map.rs`). Call before [`Self::run`].
    pub fn restore(&mut self, parts: &[(String, Bytes)]) -> Result<(), SnapshotError> {
        self.restore_renamed(parts, &NameMapping::new())
    }

    /// [`Self::restore`] onto a new version of the pipeline, in which the
    /// transforms `renamed` names have new unique names (or, mapped to
    /// `""`, are removed, and what they held is dropped on purpose).
    ///
    /// A job on shards restores from a checkpoint of as many shards, each
    /// shard from its own parts (see `manager/sharded_checkpoint.rs`).
    pub fn restore_renamed(
        &mut self,
        parts: &[(String, Bytes)],
        renamed: &NameMapping,
    ) -> Result<(), SnapshotError> {
        let running_on = self.shard_count();
        match (shards_of(parts)?, running_on) {
            (None, None) => self.restore_engine_parts(parts, renamed),
            (Some(wrote), Some(runs)) if wrote == runs => self.restore_shard(parts, renamed),
            // Key groups move to their new owners; one engine counts as
            // one shard owning them all.
            (_, _) if renamed.is_empty() => self.restore_resharded(parts, renamed),
            (wrote, runs) => Err(SnapshotError::Mismatch(format!(
                "it was written by a job on {}, and this one runs on {}; a checkpoint moves \
                 onto another number of shards, but not with transforms renamed at the same \
                 time",
                engines_text(wrote),
                engines_text(runs),
            ))),
        }
    }

    /// [`Self::restore_renamed`] from one engine's parts (a job's, or one
    /// shard's).
    pub(super) fn restore_engine_parts(
        &mut self,
        parts: &[(String, Bytes)],
        renamed: &NameMapping,
    ) -> Result<(), SnapshotError> {
        let engine_bytes = find_part(parts, PartName::Engine)
            .ok_or_else(|| SnapshotError::Mismatch("it has no part 'engine'".into()))?;
        let (engine, names) = decode_engine(engine_bytes)?;
        if !(OLDEST_SNAPSHOT_VERSION..=SNAPSHOT_VERSION).contains(&engine.version) {
            return Err(SnapshotError::Mismatch(format!(
                "it was written in format {}, this runner reads {OLDEST_SNAPSHOT_VERSION} to \
                 {SNAPSHOT_VERSION}",
                engine.version
            )));
        }
        let map =
            StageMap::new(&names, &self.topology.plan, renamed).map_err(SnapshotError::Mismatch)?;
        // Checkpointed stages no stage maps onto are checked here; the
        // others as they are restored (each decoded once).
        for old in 0..map.old_stages() {
            if map.targets(old).is_empty() && !map.dropped(old) {
                check_carried(&OldStage::decode(parts, old)?, &map, old)?;
            }
        }
        let now = Instant::now();
        for idx in self.stages.indices() {
            self.restore_stage(parts, &map, idx, now)?;
        }
        let mut side_inputs: SideInputSnapshot =
            decode(PartName::SideInputs, required(parts, PartName::SideInputs)?)?;
        side_inputs.rename_transforms(|id| map.rename(id));
        self.check_new_side_inputs(&map)?;
        *self.side_inputs.lock() = crate::state::SideInputTable::restore(side_inputs);
        self.next_bundle = engine.next_bundle;
        self.clock
            .restore((engine.clock_offset, engine.frozen_clock));
        self.summary.bundles = engine.bundles;
        self.summary.peak_pending_bytes = engine.peak_pending_bytes as usize;
        // Stages that had finished tell their side-input readers again
        // (on shards, once they have finished on every shard).
        for idx in self.stages.indices() {
            if self.finishes_alone() && self.stages[idx].progress.output_wm >= MAX_TIMESTAMP {
                self.on_stage_finished(idx);
            }
        }
        Ok(())
    }

    /// Restores stage `idx` from the checkpoint's stages `map` puts on it:
    /// the queue, timers, buffer and state of the one with anything in it,
    /// and the least of their watermarks. A stage no checkpointed stage
    /// maps onto starts afresh.
    fn restore_stage(
        &mut self,
        parts: &[(String, Bytes)],
        map: &StageMap,
        idx: StageIdx,
        now: Instant,
    ) -> Result<(), SnapshotError> {
        let sources = map.sources(idx);
        let mut olds = Vec::with_capacity(sources.len());
        for &old in sources {
            let stage = OldStage::decode(parts, old)?;
            // Checked once, where its first target is restored.
            if map.targets(old).first() == Some(&idx) {
                check_carried(&stage, map, old)?;
            }
            olds.push((old, stage));
        }
        let mut carrying = olds.iter().filter(|(_, o)| o.carries_anything());
        let Some((old, _)) = carrying.next().or(olds.first()) else {
            return Ok(());
        };
        if let Some((other, _)) = carrying.next() {
            return Err(SnapshotError::Mismatch(format!(
                "its stages reading for '{}' and for '{}' both hold elements or state, and the \
                 pipeline runs them as one stage '{}'",
                map.describe(*old),
                map.describe(*other),
                self.topology.plan.stages[idx].name
            )));
        }
        let old = *old;
        let input_wm = olds.iter().map(|(_, o)| o.record.input_wm).min();
        let output_wm = olds.iter().map(|(_, o)| o.record.output_wm).min();
        let Some(chosen) = olds.into_iter().find(|(o, _)| *o == old).map(|(_, o)| o) else {
            return Ok(());
        };
        let stage_name = self.topology.plan.stages[idx].name.clone();
        let OldStage {
            mut record,
            mut user_state,
            spilled_queue,
            spilled_windows,
            spilled_bags,
        } = chosen;
        let renamed_away = |id: TransformId, what: &str| {
            SnapshotError::Mismatch(format!(
                "it has {what} of '{}', which the pipeline does not have",
                map.old_name(&id)
            ))
        };
        record
            .timers
            .to_mut()
            .rename_transforms(|id| map.rename(id))
            .map_err(|id| renamed_away(id, "timers"))?;
        user_state
            .rename_transforms(|id| map.rename(id))
            .map_err(|id| renamed_away(id, "user state"))?;
        let gated = self.durability.checkpoints.is_some()
            && matches!(&self.topology.plan.stages[idx].kind, StageKind::Sdk(sdk) if sdk.stable_input);
        let s = &mut self.stages[idx];
        let front = record.pending.into_iter().map(ElementRecord::into_element);
        let spilled_queue = spilled_queue.map(|r| {
            let tail = r.tail.into_iter().map(ElementRecord::into_element);
            (r.spilled, tail.collect())
        });
        s.queue
            .pending
            .restore(front.collect(), spilled_queue)
            .map_err(|source| SnapshotError::Queue {
                stage: stage_name.clone(),
                source,
            })?;
        // It came from a checkpoint: it is stable input.
        s.queue.pending.all_durable();
        if gated {
            s.queue.pending.gate();
        }
        s.queue.restore_delayed(
            record
                .delayed
                .into_iter()
                .map(|(wait, e, hold)| Delayed {
                    at: now + Duration::from_millis(wait),
                    element: e.into_element(),
                    hold,
                })
                .collect(),
        );
        match (s.grouping_mut(), record.grouping) {
            (Some(g), Some(snapshot)) => g
                .restore(snapshot, spilled_windows)
                .map_err(|e| SnapshotError::Grouping(e.to_string()))?,
            (None, None) => {}
            (None, Some(snapshot)) if snapshot.is_empty() => {}
            (None, Some(_)) => {
                return Err(SnapshotError::Mismatch(format!(
                    "it has a GroupByKey buffer for '{}', which the pipeline runs as stage \
                     '{stage_name}', not a GroupByKey",
                    map.describe(old)
                )))
            }
            (Some(_), None) => {
                return Err(SnapshotError::Mismatch(format!(
                    "stage '{stage_name}' is a GroupByKey, and '{}' was not",
                    map.describe(old)
                )))
            }
        }
        s.kind
            .restore(KindRecord {
                timers: record.timers,
                impulse_done: record.impulse_done,
                stream_cursor: record.stream_cursor,
                stream_wm: record.stream_wm,
                state_gc_wm: record.state_gc_wm,
            })
            .map_err(|what| SnapshotError::Mismatch(format!("stage '{stage_name}' has {what}")))?;
        s.progress.input_wm = input_wm.unwrap_or(record.input_wm);
        s.progress.output_wm = output_wm.unwrap_or(record.output_wm);
        s.progress.counters = StageCounters::from_record(record.counters);
        self.user_state[idx]
            .lock()
            .restore(user_state, spilled_bags)
            .map_err(|source| SnapshotError::UserState {
                stage: stage_name,
                source,
            })?;
        Ok(())
    }

    /// Refuses a side input that a transform the checkpoint did not know
    /// reads, once its producer ran: what it produced before the cut is
    /// kept for its old readers only, so the new one would miss it.
    fn check_new_side_inputs(&self, map: &StageMap) -> Result<(), SnapshotError> {
        let plan = &self.topology.plan;
        for (name, side) in map.new_side_input_readers(plan) {
            let produced = plan.stages.iter_enumerated().any(|(p, producer)| {
                producer.outputs.contains(&side.pcollection)
                    && self.stages[p].progress.output_wm > MIN_TIMESTAMP
            });
            if produced {
                return Err(SnapshotError::Mismatch(format!(
                    "'{name}' is new and reads side input '{}', whose values before the \
                     checkpoint were kept only for the transforms that read it then",
                    side.id.tag
                )));
            }
        }
        Ok(())
    }
}

/// The bytes of part `name`, or an error naming it.
pub(super) fn required(parts: &[(String, Bytes)], name: PartName) -> Result<&Bytes, SnapshotError> {
    find_part(parts, name)
        .ok_or_else(|| SnapshotError::Mismatch(format!("it has no part '{name}'")))
}

/// Part `name` decoded, if the checkpoint has it.
fn optional<T: for<'a> Deserialize<'a>>(
    parts: &[(String, Bytes)],
    name: PartName,
) -> Result<Option<T>, SnapshotError> {
    find_part(parts, name).map(|b| decode(name, b)).transpose()
}

/// One stage of a checkpoint, decoded.
pub(super) struct OldStage<'a> {
    pub(super) record: StageRecord<'a>,
    pub(super) user_state: UserStateSnapshot,
    spilled_queue: Option<QueueSpillRecord>,
    spilled_windows: Option<SpilledWindows>,
    spilled_bags: Option<SpilledBags>,
}

impl<'a> OldStage<'a> {
    /// Stage `old` of the checkpoint `parts`.
    pub(super) fn decode(parts: &'a [(String, Bytes)], old: usize) -> Result<Self, SnapshotError> {
        let idx = StageIdx::new(old);
        let name = PartName::Stage(idx);
        let record = decode(name, required(parts, name)?)?;
        let name = PartName::UserState(idx);
        let user_state = decode(name, required(parts, name)?)?;
        Ok(OldStage {
            record,
            user_state,
            spilled_queue: optional(parts, PartName::QueueSpill(idx))?,
            spilled_windows: optional(parts, PartName::GroupingSpill(idx))?,
            spilled_bags: optional(parts, PartName::UserStateSpill(idx))?,
        })
    }

    /// Whether elements wait in its queue.
    fn has_elements(&self) -> bool {
        !self.record.pending.is_empty()
            || !self.record.delayed.is_empty()
            || self.spilled_queue.is_some()
    }

    /// Whether it holds what belongs to its one head: timers, user state
    /// or a GroupByKey's buffer.
    fn has_keyed_state(&self) -> bool {
        !self.record.timers.is_empty()
            || !self.user_state.is_empty()
            || self.record.grouping.as_ref().is_some_and(|g| !g.is_empty())
            || self.spilled_windows.is_some()
            || self
                .spilled_bags
                .as_ref()
                .is_some_and(SpilledBags::names_bags)
    }

    /// Whether it holds anything a restore must carry over.
    fn carries_anything(&self) -> bool {
        self.has_elements() || self.has_keyed_state()
    }

    /// Whether it names data on the durable spill space, kept under its
    /// stage number.
    pub(super) fn names_spilled_data(&self) -> bool {
        self.spilled_queue.is_some()
            || self.spilled_windows.is_some()
            || self
                .spilled_bags
                .as_ref()
                .is_some_and(SpilledBags::names_bags)
    }
}

/// Refuses a checkpoint whose stage `old` holds something that has no one
/// place to go in the plan `map` maps onto.
fn check_carried(stage: &OldStage<'_>, map: &StageMap, old: usize) -> Result<(), SnapshotError> {
    if map.dropped(old) {
        return Ok(());
    }
    let heads = map.describe(old);
    let targets = map.targets(old);
    if stage.has_elements() {
        if let Some(reason) = map.queue_refusal(old) {
            return Err(SnapshotError::Mismatch(reason));
        }
    }
    if stage.has_keyed_state() && targets.len() != 1 {
        return Err(SnapshotError::Mismatch(if targets.is_empty() {
            format!("it has timers, state or a GroupByKey buffer of '{heads}', which the pipeline does not have")
        } else {
            format!(
                "it has timers, state or a GroupByKey buffer of '{heads}', which the pipeline \
                 now reads in {} stages",
                targets.len()
            )
        }));
    }
    if stage.names_spilled_data() && targets.iter().any(|t| t.index() != old) {
        return Err(SnapshotError::Mismatch(format!(
            "the stage reading for '{heads}' spilled data that a periodic checkpoint names under \
             its stage number, and the pipeline is fused differently now; resume it with the \
             Refract that wrote it, or start from a savepoint of it"
        )));
    }
    Ok(())
}
