//! Ten minutes of each stage's recent past, for the UI's small charts:
//! throughput, watermark lag and backlog over time.
//!
//! The engine publishes only the latest [`StageStats`]; a chart needs a
//! series. The job's view samples its snapshot every [`SAMPLE_EVERY`] into
//! its [`StageHistory`], which keeps
//! [`HISTORY_SPAN`] of samples and turns counters into rates on demand.
//! Samples keep the counters, not rates, so one missed tick costs
//! resolution, never correctness.

use std::collections::VecDeque;
use std::time::Duration;

use refract_engine::manager::StageStats;
use refract_engine::time::{MAX_TIMESTAMP, MIN_TIMESTAMP};

/// How far back the history reaches.
pub const HISTORY_SPAN: Duration = Duration::from_secs(600);
/// How often a running job's stages are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// What one stage looked like at one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StagePoint {
    elements_processed: u64,
    output_watermark: i64,
    pending_elements: u64,
}

/// Every stage at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sample {
    at_ms: i64,
    stages: Vec<StagePoint>,
}

/// A job's stage samples of the last [`HISTORY_SPAN`].
#[derive(Debug, Default)]
pub struct StageHistory {
    samples: VecDeque<Sample>,
}

/// One point of a stage's chart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeriesPoint {
    /// When, in ms since the epoch.
    pub at_ms: i64,
    /// Input elements per second since the previous sample.
    pub elements_per_second: f64,
    /// How far the output watermark was behind the wall clock, in ms;
    /// `None` at either end of time (before the first watermark, after
    /// the last).
    pub watermark_lag_ms: Option<i64>,
    /// Elements waiting for a bundle.
    pub backlog_elements: u64,
}

impl StageHistory {
    /// Adds a sample of `stages` taken at `at_ms`, and forgets samples
    /// older than [`HISTORY_SPAN`] before it.
    pub fn record(&mut self, at_ms: i64, stages: &[StageStats]) {
        if stages.is_empty() {
            return;
        }
        let points = stages
            .iter()
            .map(|s| StagePoint {
                elements_processed: s.elements_processed,
                output_watermark: s.output_watermark,
                pending_elements: s.pending_elements as u64,
            })
            .collect();
        self.samples.push_back(Sample {
            at_ms,
            stages: points,
        });
        let span = i64::try_from(HISTORY_SPAN.as_millis()).unwrap_or(i64::MAX);
        while self
            .samples
            .front()
            .is_some_and(|s| s.at_ms < at_ms.saturating_sub(span))
        {
            self.samples.pop_front();
        }
    }

    /// Each stage's series, by stage index: a point per sample after the
    /// first (a rate needs two). A stage missing from older samples (the
    /// plan of a retried attempt differs) starts where it appears.
    pub fn series(&self) -> Vec<Vec<SeriesPoint>> {
        let stages = self.samples.back().map_or(0, |s| s.stages.len());
        let mut series = vec![Vec::new(); stages];
        for (before, after) in self.samples.iter().zip(self.samples.iter().skip(1)) {
            let seconds = (after.at_ms - before.at_ms) as f64 / 1000.0;
            for (i, now) in after.stages.iter().enumerate().take(stages) {
                let Some(then) = before.stages.get(i) else {
                    continue;
                };
                let processed = now
                    .elements_processed
                    .saturating_sub(then.elements_processed);
                series[i].push(SeriesPoint {
                    at_ms: after.at_ms,
                    elements_per_second: if seconds > 0.0 {
                        processed as f64 / seconds
                    } else {
                        0.0
                    },
                    watermark_lag_ms: match now.output_watermark {
                        w if w <= MIN_TIMESTAMP || w >= MAX_TIMESTAMP => None,
                        w => Some(after.at_ms.saturating_sub(w).max(0)),
                    },
                    backlog_elements: now.pending_elements,
                });
            }
        }
        series
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(processed: u64, watermark: i64, pending: usize) -> StageStats {
        StageStats {
            name: "s".into(),
            kind: "sdk",
            inputs: Vec::new(),
            input_watermark: MIN_TIMESTAMP,
            output_watermark: watermark,
            pending_elements: pending,
            pending_bytes: 0,
            bundles_in_flight: 0,
            bundles_committed: 0,
            elements_processed: processed,
            bytes_processed: 0,
            elements_out: 0,
            bytes_out: 0,
            throttled_ms: 0,
            spilled_bytes: 0,
        }
    }

    #[test]
    fn counters_become_rates_lags_and_backlogs() {
        let mut h = StageHistory::default();
        h.record(10_000, &[stage(0, MIN_TIMESTAMP, 5)]);
        h.record(12_000, &[stage(100, 9_000, 7)]);
        h.record(14_000, &[stage(400, MAX_TIMESTAMP, 0)]);
        let series = h.series();
        assert_eq!(series.len(), 1);
        assert_eq!(
            series[0],
            vec![
                SeriesPoint {
                    at_ms: 12_000,
                    elements_per_second: 50.0,
                    watermark_lag_ms: Some(3_000),
                    backlog_elements: 7,
                },
                SeriesPoint {
                    at_ms: 14_000,
                    elements_per_second: 150.0,
                    watermark_lag_ms: None,
                    backlog_elements: 0,
                },
            ]
        );
    }

    #[test]
    fn keeps_ten_minutes_only() {
        let mut h = StageHistory::default();
        let every = SAMPLE_EVERY.as_millis() as i64;
        for i in 0..1_000 {
            h.record(i * every, &[stage(i as u64 * 1_000, 0, 0)]);
        }
        let kept = h.samples.len() as i64;
        let span = HISTORY_SPAN.as_millis() as i64;
        assert_eq!(kept, span / every + 1);
        let points = &h.series()[0];
        assert!(points.iter().all(|p| p.at_ms >= 999 * every - span));
        assert!(points.iter().all(|p| p.elements_per_second == 500.0));
    }

    #[test]
    fn a_stage_that_appears_later_starts_where_it_appears() {
        let mut h = StageHistory::default();
        h.record(0, &[stage(0, 0, 0)]);
        h.record(1_000, &[stage(10, 0, 0), stage(0, 0, 0)]);
        h.record(2_000, &[stage(20, 0, 0), stage(5, 0, 0)]);
        let series = h.series();
        assert_eq!(series[0].len(), 2);
        assert_eq!(series[1].len(), 1);
        assert_eq!(series[1][0].elements_per_second, 5.0);
        // An empty snapshot (before the engine starts) is not a sample.
        h.record(3_000, &[]);
        assert_eq!(h.series()[0].len(), 2);
    }
}
