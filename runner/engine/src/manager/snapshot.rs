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
use super::stage_state::{Delayed, KindRecord};
use super::stats::{CounterRecord, StageCounters};
use super::{Engine, InFlight};
use crate::coder::{DecodedElement, WindowedValueHeader};
use crate::grouping::{GroupingSnapshot, SpilledWindows};
use crate::plan::{StageIdx, StageKind};
use crate::state::{SideInputSnapshot, SpilledBags, UserStateSnapshot};
use crate::time::{Timestamp, MAX_TIMESTAMP};
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
    /// The job runs on several shards, which take no checkpoints yet.
    #[error("a job running on several shards (refract_shards) cannot take savepoints yet")]
    OnShards,
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
pub const SNAPSHOT_VERSION: u32 = 4;

/// The oldest version still read.
pub const OLDEST_SNAPSHOT_VERSION: u32 = 2;

/// An element as a checkpoint keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ElementRecord {
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

    fn into_element(self) -> DecodedElement {
        DecodedElement::new(self.header, self.encoded, self.value_offset as usize)
    }
}

/// Engine-wide values.
#[derive(Debug, Serialize, Deserialize)]
struct EngineRecord {
    version: u32,
    stage_names: Vec<String>,
    next_bundle: u64,
    clock_offset: i64,
    frozen_clock: Option<Timestamp>,
    bundles: u64,
    peak_pending_bytes: u64,
    /// Bundles in flight at the cut, which a restored engine runs again.
    rerun_bundles: Vec<u64>,
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
}

/// Reads what a checkpoint says about its run, for logs and for tests
/// that must tell committed work from work that will be redone.
pub fn describe_checkpoint(parts: &[(String, Bytes)]) -> Result<CheckpointInfo, SnapshotError> {
    let bytes = find_part(parts, PartName::Engine)
        .ok_or_else(|| SnapshotError::Mismatch("it has no part 'engine'".into()))?;
    let engine: EngineRecord = decode(PartName::Engine, bytes)?;
    Ok(CheckpointInfo {
        version: engine.version,
        next_bundle: engine.next_bundle,
        rerun_bundles: engine.rerun_bundles,
    })
}

/// One stage's queue, timers and progress.
#[derive(Debug, Serialize, Deserialize)]
struct StageRecord<'a> {
    pending: Vec<ElementRecord>,
    /// Residuals waiting to resume: (ms still to wait, element, hold).
    delayed: Vec<(u64, ElementRecord, Timestamp)>,
    grouping: Option<GroupingSnapshot>,
    /// Borrowed from the stage unless bundles in flight gave timers back.
    timers: Cow<'a, TimerStore>,
    input_wm: Timestamp,
    output_wm: Timestamp,
    impulse_done: bool,
    stream_cursor: u64,
    stream_wm: Timestamp,
    state_gc_wm: Timestamp,
    counters: CounterRecord,
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
fn encode<T: Serialize>(part: PartName, value: &T) -> Result<(String, Bytes), SnapshotError> {
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
        parts.push(encode(
            PartName::Engine,
            &EngineRecord {
                version: SNAPSHOT_VERSION,
                stage_names: self
                    .topology
                    .plan
                    .stages
                    .iter()
                    .map(|s| s.name.clone())
                    .collect(),
                next_bundle: self.next_bundle,
                clock_offset,
                frozen_clock,
                bundles: self.summary.bundles,
                peak_pending_bytes: self.summary.peak_pending_bytes as u64,
                rerun_bundles: flights.iter().map(|(id, _)| **id).collect(),
            },
        )?);
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
    /// an engine running the same plan. Call before [`Self::run`].
    pub fn restore(&mut self, parts: &[(String, Bytes)]) -> Result<(), SnapshotError> {
        let part = |name: PartName| {
            find_part(parts, name)
                .ok_or_else(|| SnapshotError::Mismatch(format!("it has no part '{name}'")))
        };
        let engine: EngineRecord = decode(PartName::Engine, part(PartName::Engine)?)?;
        if !(OLDEST_SNAPSHOT_VERSION..=SNAPSHOT_VERSION).contains(&engine.version) {
            return Err(SnapshotError::Mismatch(format!(
                "it was written in format {}, this runner reads {OLDEST_SNAPSHOT_VERSION} to \
                 {SNAPSHOT_VERSION}",
                engine.version
            )));
        }
        let names: Vec<&str> = self
            .topology
            .plan
            .stages
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        if engine.stage_names != names {
            return Err(SnapshotError::Mismatch(format!(
                "its stages are [{}], the pipeline's are [{}]",
                engine.stage_names.join(", "),
                names.join(", ")
            )));
        }
        let now = Instant::now();
        for idx in self.stages.indices() {
            let name = PartName::Stage(idx);
            let record: StageRecord = decode(name, part(name)?)?;
            let gated = self.durability.checkpoints.is_some()
                && matches!(&self.topology.plan.stages[idx].kind, StageKind::Sdk(sdk) if sdk.stable_input);
            let name = PartName::QueueSpill(idx);
            let spilled_queue: Option<QueueSpillRecord> = match find_part(parts, name) {
                Some(bytes) => Some(decode(name, bytes)?),
                None => None,
            };
            let name = PartName::GroupingSpill(idx);
            let spilled_windows: Option<SpilledWindows> = match find_part(parts, name) {
                Some(bytes) => Some(decode(name, bytes)?),
                None => None,
            };
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
                    stage: self.topology.plan.stages[idx].name.clone(),
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
                _ => {
                    return Err(SnapshotError::Mismatch(format!(
                        "stage {idx} is a grouping stage in one and not the other"
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
                .map_err(|what| SnapshotError::Mismatch(format!("stage {idx} has {what}")))?;
            s.progress.input_wm = record.input_wm;
            s.progress.output_wm = record.output_wm;
            s.progress.counters = StageCounters::from_record(record.counters);
            let name = PartName::UserState(idx);
            let state: UserStateSnapshot = decode(name, part(name)?)?;
            let name = PartName::UserStateSpill(idx);
            let spilled: Option<SpilledBags> = match find_part(parts, name) {
                Some(bytes) => Some(decode(name, bytes)?),
                None => None,
            };
            self.user_state[idx]
                .lock()
                .restore(state, spilled)
                .map_err(|source| SnapshotError::UserState {
                    stage: self.topology.plan.stages[idx].name.clone(),
                    source,
                })?;
        }
        let side_inputs: SideInputSnapshot =
            decode(PartName::SideInputs, part(PartName::SideInputs)?)?;
        *self.side_inputs.lock() = crate::state::SideInputTable::restore(side_inputs);
        self.next_bundle = engine.next_bundle;
        self.clock
            .restore((engine.clock_offset, engine.frozen_clock));
        self.summary.bundles = engine.bundles;
        self.summary.peak_pending_bytes = engine.peak_pending_bytes as usize;
        // Stages that had finished tell their side-input readers again.
        for idx in self.stages.indices() {
            if self.stages[idx].progress.output_wm >= MAX_TIMESTAMP {
                self.on_stage_finished(idx);
            }
        }
        Ok(())
    }
}
