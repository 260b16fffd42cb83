//! What each stage is doing, published for people and scrapers: the web
//! UI's stage graph and `/metrics` read these snapshots, never the engine's
//! own state, so watching a job costs it one small copy every so often.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::Engine;
use crate::grouping::GroupingBuffer;
use crate::plan::{StageIdx, StageKind};
use crate::time::Timestamp;

/// How often the engine publishes a snapshot while it runs.
const PUBLISH_EVERY: Duration = Duration::from_millis(250);

/// One stage as of the last snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageStats {
    /// The stage's name (its fused transforms, joined by `+`).
    pub name: String,
    /// What runs it: `sdk`, `group_by_key`, `flatten`, `impulse`, `test_stream`.
    pub kind: &'static str,
    /// Stages whose output this stage reads (main inputs and side inputs).
    pub inputs: Vec<StageIdx>,
    /// Input watermark, ms since the epoch.
    pub input_watermark: Timestamp,
    /// Output watermark, ms since the epoch.
    pub output_watermark: Timestamp,
    /// Elements waiting for a bundle (or in a grouping buffer's queue).
    pub pending_elements: usize,
    /// Their encoded size; for a GroupByKey, about what its buffer holds in
    /// memory (its backlog).
    pub pending_bytes: usize,
    /// Bundles of the stage in flight.
    pub bundles_in_flight: usize,
    /// Bundles committed.
    pub bundles_committed: u64,
    /// Input elements of committed bundles (for a grouping stage: elements
    /// it took in).
    pub elements_processed: u64,
    /// Their encoded size.
    pub bytes_processed: u64,
    /// Elements the stage emitted (to every consumer, counted once).
    pub elements_out: u64,
    /// Their encoded size.
    pub bytes_out: u64,
    /// Time the stage was not scheduled because a consumer was over its
    /// bound (backpressure), in ms.
    pub throttled_ms: u64,
    /// Bytes a stage spilled to disk: a GroupByKey's buffer that outgrew
    /// its memory share, or a queue far past its bound.
    pub spilled_bytes: u64,
}

impl StageStats {
    /// A job's stages from the snapshots of each of its shards (see
    /// [`crate::shards`]): counts and sizes add up, and watermarks are the
    /// least over the shards, as the job's own are. Shards that published
    /// nothing yet are left out.
    pub fn across_shards(shards: &[Vec<StageStats>]) -> Vec<StageStats> {
        let mut parts = shards.iter().filter(|s| !s.is_empty());
        let Some(first) = parts.next() else {
            return Vec::new();
        };
        let mut job = first.clone();
        for part in parts {
            for (stage, other) in job.iter_mut().zip(part) {
                stage.add(other);
            }
        }
        job
    }

    /// Adds another shard's snapshot of the same stage to this one.
    fn add(&mut self, other: &StageStats) {
        self.input_watermark = self.input_watermark.min(other.input_watermark);
        self.output_watermark = self.output_watermark.min(other.output_watermark);
        self.pending_elements += other.pending_elements;
        self.pending_bytes += other.pending_bytes;
        self.bundles_in_flight += other.bundles_in_flight;
        self.bundles_committed += other.bundles_committed;
        self.elements_processed += other.elements_processed;
        self.bytes_processed += other.bytes_processed;
        self.elements_out += other.elements_out;
        self.bytes_out += other.bytes_out;
        self.throttled_ms += other.throttled_ms;
        self.spilled_bytes += other.spilled_bytes;
    }
}

/// Per-stage counters the snapshots report.
#[derive(Debug, Default)]
pub(super) struct StageCounters {
    pub bundles_committed: u64,
    pub elements_processed: u64,
    pub bytes_processed: u64,
    pub elements_out: u64,
    pub bytes_out: u64,
    pub throttled: Duration,
    pub throttled_since: Option<Instant>,
}

/// What a checkpoint keeps of a stage's counters (the throttling in
/// progress counts up to the checkpoint).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(super) struct CounterRecord {
    bundles_committed: u64,
    elements_processed: u64,
    bytes_processed: u64,
    elements_out: u64,
    bytes_out: u64,
    throttled_ms: u64,
}

impl StageCounters {
    /// The counters as of `now`, for a checkpoint.
    pub(super) fn record(&self, now: Instant) -> CounterRecord {
        CounterRecord {
            bundles_committed: self.bundles_committed,
            elements_processed: self.elements_processed,
            bytes_processed: self.bytes_processed,
            elements_out: self.elements_out,
            bytes_out: self.bytes_out,
            throttled_ms: self.throttled_ms(now),
        }
    }

    /// Counters restored from a checkpoint (not throttled now).
    pub(super) fn from_record(r: CounterRecord) -> Self {
        StageCounters {
            bundles_committed: r.bundles_committed,
            elements_processed: r.elements_processed,
            bytes_processed: r.bytes_processed,
            elements_out: r.elements_out,
            bytes_out: r.bytes_out,
            throttled: Duration::from_millis(r.throttled_ms),
            throttled_since: None,
        }
    }

    /// Notes whether the stage is held back by backpressure right now.
    pub(super) fn set_throttled(&mut self, throttled: bool, now: Instant) {
        match (throttled, self.throttled_since) {
            (true, None) => self.throttled_since = Some(now),
            (false, Some(since)) => {
                self.throttled += now.saturating_duration_since(since);
                self.throttled_since = None;
            }
            _ => {}
        }
    }

    pub(super) fn throttled_ms(&self, now: Instant) -> u64 {
        let ongoing = self
            .throttled_since
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
        u64::try_from((self.throttled + ongoing).as_millis()).unwrap_or(u64::MAX)
    }
}

/// Every name [`StageStats::kind`] takes.
pub const STAGE_KINDS: [&str; 5] = ["sdk", "group_by_key", "flatten", "impulse", "test_stream"];

/// The kind named `name`, as [`StageStats::kind`] holds it, for snapshots
/// that crossed a process boundary; `None` for a name no stage has.
pub fn stage_kind_named(name: &str) -> Option<&'static str> {
    STAGE_KINDS.iter().copied().find(|kind| *kind == name)
}

fn kind_name(kind: &StageKind) -> &'static str {
    match kind {
        StageKind::Sdk(_) => "sdk",
        StageKind::GroupByKey(_) => "group_by_key",
        StageKind::Flatten => "flatten",
        StageKind::Impulse => "impulse",
        StageKind::TestStream(_) => "test_stream",
    }
}

impl Engine {
    /// Publishes a snapshot if one is due (or `force`).
    pub(super) fn publish_stats(&mut self, force: bool) {
        let Some(tx) = &self.stats else {
            return;
        };
        let now = Instant::now();
        if !force
            && self
                .last_published
                .is_some_and(|at| now < at + PUBLISH_EVERY)
        {
            return;
        }
        self.last_published = Some(now);
        let snapshot = self
            .topology
            .plan
            .stages
            .iter()
            .zip(&self.stages)
            .zip(&self.user_state)
            .map(|((stage, s), user_state)| {
                let mut inputs: Vec<StageIdx> = stage
                    .inputs
                    .iter()
                    .chain(stage.side_inputs.iter().map(|si| &si.pcollection))
                    .filter_map(|&p| self.topology.producers[p])
                    .collect();
                inputs.dedup();
                StageStats {
                    name: stage.name.clone(),
                    kind: kind_name(&stage.kind),
                    inputs,
                    input_watermark: s.progress.input_wm,
                    output_watermark: s.progress.output_wm,
                    pending_elements: s.queue.pending.len(),
                    pending_bytes: s.queue.pending.bytes()
                        + s.grouping().map_or(0, GroupingBuffer::buffered_bytes),
                    bundles_in_flight: s.queue.in_flight(),
                    bundles_committed: s.progress.counters.bundles_committed,
                    elements_processed: s.progress.counters.elements_processed,
                    bytes_processed: s.progress.counters.bytes_processed,
                    elements_out: s.progress.counters.elements_out,
                    bytes_out: s.progress.counters.bytes_out,
                    throttled_ms: s.progress.counters.throttled_ms(now),
                    spilled_bytes: s.grouping().map_or(0, GroupingBuffer::spilled_bytes)
                        + s.queue.pending.spilled_bytes()
                        + user_state.lock().spilled_bytes(),
                }
            })
            .collect();
        tx.send_replace(snapshot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(output_watermark: Timestamp, elements_processed: u64) -> StageStats {
        StageStats {
            name: "s".into(),
            input_watermark: output_watermark,
            output_watermark,
            elements_processed,
            pending_elements: 1,
            ..StageStats::default()
        }
    }

    #[test]
    fn shards_add_up_and_hold_the_watermark_at_their_least() {
        let job = StageStats::across_shards(&[
            vec![stage(10, 3), stage(5, 1)],
            Vec::new(),
            vec![stage(7, 4), stage(9, 2)],
        ]);
        assert_eq!(job.len(), 2);
        assert_eq!((job[0].output_watermark, job[0].elements_processed), (7, 7));
        assert_eq!((job[1].output_watermark, job[1].elements_processed), (5, 3));
        assert_eq!(job[0].pending_elements, 2);
        assert!(StageStats::across_shards(&[]).is_empty());
    }
}
