//! What a shard host reports about its part of a run, both ways across
//! the wire: its stages' numbers, its committed metrics and how its part
//! ended. One home for the conversions, so the host's sending and the
//! coordinator's reading cannot drift apart.

use refract_engine::manager::{stage_kind_named, RunSummary, StageStats};
use refract_engine::plan::{StageIdx, TypedIndex};
use refract_proto::hosts::{run_ended, RunEnded, RunFailure, StageNumber, StageNumbers};
use refract_proto::pipeline::MonitoringInfo;
use refract_proto::prost::Message;

use super::JobError;

/// A host's stage snapshot (its shards' added up) as it crosses the wire.
pub(super) fn stage_numbers(stages: &[StageStats]) -> StageNumbers {
    StageNumbers {
        stages: stages
            .iter()
            .map(|s| StageNumber {
                name: s.name.clone(),
                kind: s.kind.to_string(),
                inputs: s.inputs.iter().map(|i| i.index() as u32).collect(),
                input_watermark: s.input_watermark,
                output_watermark: s.output_watermark,
                pending_elements: s.pending_elements as u64,
                pending_bytes: s.pending_bytes as u64,
                bundles_in_flight: s.bundles_in_flight as u64,
                bundles_committed: s.bundles_committed,
                elements_processed: s.elements_processed,
                bytes_processed: s.bytes_processed,
                elements_out: s.elements_out,
                bytes_out: s.bytes_out,
                throttled_ms: s.throttled_ms,
                spilled_bytes: s.spilled_bytes,
            })
            .collect(),
    }
}

/// A host's stage snapshot as the coordinator reads it; stages of a kind
/// no stage has are left out.
pub(super) fn stage_stats(numbers: &StageNumbers) -> Vec<StageStats> {
    numbers
        .stages
        .iter()
        .filter_map(|n| {
            Some(StageStats {
                name: n.name.clone(),
                kind: stage_kind_named(&n.kind)?,
                inputs: n
                    .inputs
                    .iter()
                    .map(|&i| StageIdx::from_index(i as usize))
                    .collect(),
                input_watermark: n.input_watermark,
                output_watermark: n.output_watermark,
                pending_elements: usize::try_from(n.pending_elements).unwrap_or(usize::MAX),
                pending_bytes: usize::try_from(n.pending_bytes).unwrap_or(usize::MAX),
                bundles_in_flight: usize::try_from(n.bundles_in_flight).unwrap_or(usize::MAX),
                bundles_committed: n.bundles_committed,
                elements_processed: n.elements_processed,
                bytes_processed: n.bytes_processed,
                elements_out: n.elements_out,
                bytes_out: n.bytes_out,
                throttled_ms: n.throttled_ms,
                spilled_bytes: n.spilled_bytes,
            })
        })
        .collect()
}

/// Committed metrics as they cross the wire.
pub(super) fn encode_metrics(infos: &[MonitoringInfo]) -> Vec<Vec<u8>> {
    infos.iter().map(Message::encode_to_vec).collect()
}

/// Committed metrics as the coordinator reads them; what does not decode
/// is left out.
pub(super) fn decode_metrics(infos: &[Vec<u8>]) -> Vec<MonitoringInfo> {
    infos
        .iter()
        .filter_map(|bytes| MonitoringInfo::decode(bytes.as_slice()).ok())
        .collect()
}

/// How a host's part of a run ended, as it crosses the wire.
pub(super) fn ended(outcome: &Result<RunSummary, JobError>) -> RunEnded {
    let outcome = match outcome {
        Ok(summary) => run_ended::Outcome::Done(refract_proto::hosts::RunSummary {
            bundles: summary.bundles,
            spilled_bytes: summary.spilled_bytes,
            output_spilled_bytes: summary.output_spilled_bytes,
            queue_spilled_bytes: summary.queue_spilled_bytes,
            state_spilled_bytes: summary.state_spilled_bytes,
            handed_out_keys: summary.handed_out_keys,
            dropped_late: summary.dropped_late_by_stage.iter().cloned().collect(),
        }),
        Err(error) => run_ended::Outcome::Failed(RunFailure {
            text: error.to_string(),
            may_pass: error.may_pass(),
            cancelled: error.is_cancelled(),
        }),
    };
    RunEnded {
        outcome: Some(outcome),
    }
}

/// The summary of a host's part that ended well, as the coordinator reads
/// it.
pub(super) fn summary(done: &refract_proto::hosts::RunSummary) -> RunSummary {
    let mut dropped_late_by_stage: Vec<(String, u64)> = done
        .dropped_late
        .iter()
        .map(|(step, n)| (step.clone(), *n))
        .collect();
    dropped_late_by_stage.sort();
    RunSummary {
        bundles: done.bundles,
        dropped_late: dropped_late_by_stage.iter().map(|(_, n)| n).sum(),
        dropped_late_by_stage,
        spilled_bytes: done.spilled_bytes,
        output_spilled_bytes: done.output_spilled_bytes,
        queue_spilled_bytes: done.queue_spilled_bytes,
        state_spilled_bytes: done.state_spilled_bytes,
        handed_out_keys: done.handed_out_keys,
        ..RunSummary::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_numbers_cross_the_wire_unchanged() {
        let stage = StageStats {
            name: "Read+Map".into(),
            kind: "sdk",
            inputs: vec![StageIdx::from_index(0), StageIdx::from_index(2)],
            input_watermark: -5,
            output_watermark: 7,
            pending_elements: 3,
            pending_bytes: 30,
            bundles_in_flight: 1,
            bundles_committed: 9,
            elements_processed: 90,
            bytes_processed: 900,
            elements_out: 80,
            bytes_out: 800,
            throttled_ms: 4,
            spilled_bytes: 2,
        };
        let back = stage_stats(&stage_numbers(std::slice::from_ref(&stage)));
        assert_eq!(format!("{back:?}"), format!("{:?}", vec![stage]));
    }

    #[test]
    fn a_stage_of_no_known_kind_is_left_out() {
        let numbers = StageNumbers {
            stages: vec![StageNumber {
                kind: "teleport".into(),
                ..StageNumber::default()
            }],
        };
        assert!(stage_stats(&numbers).is_empty());
    }
}
