//! The server's jobs and their committed metrics in Prometheus' text
//! exposition format (version 0.0.4), for `/metrics`: the numbers are the
//! ones `GetJobMetrics` returns, so a scrape and the SDK's view agree.

use std::collections::BTreeMap;
use std::fmt::{Display, Write};

use refract_engine::manager::StageStats;
use refract_jobservice::{decode_int_metric as decode, IntMetric};
use refract_proto::pipeline::MonitoringInfo;

use crate::insights::CheckpointSummary;
use crate::latency_histogram::LatencyHistogram;
use crate::metric_catalog::{self as catalog, MetricSpec};

/// URN of the runner's per-PCollection element counter.
const ELEMENT_COUNT: &str = "beam:metric:element_count:v1";
/// URN prefix of user metrics.
const USER_PREFIX: &str = "beam:metric:user:";

/// One job as `/metrics` reports it.
#[derive(Debug, Clone, Default)]
pub struct JobSnapshot {
    /// Job id.
    pub id: String,
    /// Job name.
    pub name: String,
    /// State name (`RUNNING`, `DONE`, ...).
    pub state: String,
    /// Committed metrics.
    pub metrics: Vec<MonitoringInfo>,
    /// The engine's latest stage snapshot (empty before the job runs).
    pub stages: Vec<StageStats>,
    /// Bundle durations per stage name.
    pub bundle_latency: Vec<(String, LatencyHistogram)>,
    /// Its checkpoints.
    pub checkpoints: CheckpointSummary,
}

/// A metric family being assembled: help text, type, and sample lines.
struct Family {
    help: &'static str,
    kind: &'static str,
    samples: Vec<String>,
}

/// Metric families by name, in the order a scrape lists them.
#[derive(Default)]
struct Families(BTreeMap<&'static str, Family>);

impl Families {
    /// Adds a sample of `metric`.
    fn add(&mut self, metric: &MetricSpec, labels: &[(&str, &str)], value: impl Display) {
        self.add_sample(metric, "", labels, value);
    }

    /// Adds a sample named `metric` + `suffix` (a histogram's `_bucket`,
    /// `_sum` and `_count`) to the family of `metric`.
    fn add_sample(
        &mut self,
        metric: &MetricSpec,
        suffix: &str,
        labels: &[(&str, &str)],
        value: impl Display,
    ) {
        let name = metric.prometheus;
        self.0
            .entry(name)
            .or_insert_with(|| Family {
                help: metric.help,
                kind: metric.kind.prometheus_type(),
                samples: Vec::new(),
            })
            .samples
            .push(format!("{name}{suffix}{} {value}", label_set(labels)));
    }
}

/// A sample value as the exposition format spells it: integers without a
/// fraction, infinities as `+Inf` and `-Inf`.
fn sample_value(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Renders `jobs` as a Prometheus scrape body; `live_workers` is the
/// number of connected SDK workers, `now_ms` the wall clock for
/// watermark lags.
pub fn render(jobs: &[JobSnapshot], live_workers: usize, now_ms: i64) -> String {
    let mut families = Families::default();
    let mut by_state: BTreeMap<&str, i64> = BTreeMap::new();
    for job in jobs {
        *by_state.entry(job.state.as_str()).or_default() += 1;
    }
    for (state, count) in by_state {
        families.add(&catalog::JOBS, &[("state", state)], count);
    }
    families.add(&catalog::HARNESSES_LIVE, &[], live_workers);
    for job in jobs {
        for info in &job.metrics {
            let Some(value) = decode(&info.r#type, &info.payload) else {
                continue;
            };
            let label = |key: &str| info.labels.get(key).map_or("", String::as_str);
            if info.urn == ELEMENT_COUNT {
                if let IntMetric::Counter(n) = value {
                    families.add(
                        &catalog::PCOLLECTION_ELEMENTS,
                        &[("job", &job.id), ("pcollection", label("PCOLLECTION"))],
                        n,
                    );
                }
                continue;
            }
            if !info.urn.starts_with(USER_PREFIX) {
                continue;
            }
            let labels = [
                ("job", job.id.as_str()),
                ("transform", label("PTRANSFORM")),
                ("namespace", label("NAMESPACE")),
                ("name", label("NAME")),
            ];
            match value {
                IntMetric::Counter(n) => families.add(&catalog::USER_COUNTER, &labels, n),
                IntMetric::Gauge(n) => families.add(&catalog::USER_GAUGE, &labels, n),
                IntMetric::Distribution {
                    count,
                    sum,
                    min,
                    max,
                } => {
                    families.add(&catalog::USER_DISTRIBUTION_COUNT, &labels, count);
                    families.add(&catalog::USER_DISTRIBUTION_SUM, &labels, sum);
                    families.add(&catalog::USER_DISTRIBUTION_MIN, &labels, min);
                    families.add(&catalog::USER_DISTRIBUTION_MAX, &labels, max);
                }
            }
        }
    }
    for job in jobs {
        for stage in &job.stages {
            let labels = [("job", job.id.as_str()), ("stage", stage.name.as_str())];
            for reading in &catalog::STAGE_READINGS {
                if let Some(value) = (reading.read)(stage, now_ms) {
                    families.add(&reading.spec, &labels, sample_value(value));
                }
            }
        }
    }
    for job in jobs.iter().filter(|j| j.checkpoints.enabled) {
        let labels = [("job", job.id.as_str())];
        for reading in &catalog::CHECKPOINT_READINGS {
            if let Some(value) = (reading.read)(&job.checkpoints, now_ms) {
                families.add(&reading.spec, &labels, sample_value(value));
            }
        }
    }
    for job in jobs {
        for (stage, histogram) in &job.bundle_latency {
            let labels = [("job", job.id.as_str()), ("stage", stage.as_str())];
            let metric = &catalog::BUNDLE_DURATION;
            for (bound, count) in histogram.cumulative() {
                let le = sample_value(bound);
                let mut with_le = labels.to_vec();
                with_le.push(("le", &le));
                families.add_sample(metric, "_bucket", &with_le, count);
            }
            // Prometheus reads `_sum` and `_count` as part of the family.
            families.add_sample(metric, "_sum", &labels, sample_value(histogram.sum()));
            families.add_sample(metric, "_count", &labels, histogram.count());
        }
    }
    let mut out = String::new();
    for (name, family) in families.0 {
        let _ = writeln!(out, "# HELP {name} {}", family.help);
        let _ = writeln!(out, "# TYPE {name} {}", family.kind);
        for sample in family.samples {
            out.push_str(&sample);
            out.push('\n');
        }
    }
    out
}

/// `{k="v",...}` (nothing for no labels) with values escaped as the format requires.
fn label_set(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let body: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            let escaped = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{escaped}\"")
        })
        .collect();
    format!("{{{}}}", body.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_engine::time::MIN_TIMESTAMP;

    fn info(urn: &str, kind: &str, labels: &[(&str, &str)], payload: Vec<u8>) -> MonitoringInfo {
        MonitoringInfo {
            urn: urn.into(),
            r#type: kind.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            payload,
            ..Default::default()
        }
    }

    #[test]
    fn renders_jobs_element_counts_and_user_metrics() {
        let jobs = vec![
            JobSnapshot {
                id: "job-1".into(),
                name: "wordcount".into(),
                state: "DONE".into(),
                metrics: vec![
                    info(
                        ELEMENT_COUNT,
                        refract_jobservice::SUM_INT64,
                        &[("PCOLLECTION", "words")],
                        vec![0x96, 0x01],
                    ),
                    info(
                        "beam:metric:user:sum_int64:v1",
                        refract_jobservice::SUM_INT64,
                        &[
                            ("PTRANSFORM", "Split \"lines\""),
                            ("NAMESPACE", "ns"),
                            ("NAME", "empty"),
                        ],
                        vec![3],
                    ),
                    info(
                        "beam:metric:user:distribution_int64:v1",
                        refract_jobservice::DISTRIBUTION_INT64,
                        &[("PTRANSFORM", "t"), ("NAMESPACE", "ns"), ("NAME", "len")],
                        vec![2, 10, 4, 6],
                    ),
                    info(
                        "beam:metric:user:sum_int64:v1",
                        "beam:metrics:sum_int64:v1",
                        &[],
                        vec![0x80],
                    ),
                ],
                stages: vec![],
                bundle_latency: vec![],
                checkpoints: CheckpointSummary {
                    enabled: true,
                    taken: 2,
                    total_duration: std::time::Duration::from_millis(30),
                    bytes_written: 900,
                    last: Some(refract_store::CheckpointStats {
                        id: 2,
                        parts: 4,
                        parts_written: 1,
                        bytes_written: 100,
                        total_bytes: 700,
                        duration: std::time::Duration::from_millis(10),
                    }),
                    restored_from: None,
                    failed: 1,
                    last_error: Some("No space left on device".into()),
                    since: Some(std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_500)),
                },
            },
            JobSnapshot {
                id: "job-2".into(),
                state: "RUNNING".into(),
                stages: vec![StageStats {
                    name: "Read+Split".into(),
                    kind: "sdk",
                    inputs: vec![],
                    input_watermark: MIN_TIMESTAMP,
                    output_watermark: 1_000,
                    pending_elements: 4,
                    pending_bytes: 40,
                    bundles_in_flight: 1,
                    bundles_committed: 2,
                    elements_processed: 9,
                    throttled_ms: 1_500,
                    spilled_bytes: 4_096,
                    bytes_out: 77,
                    ..StageStats::default()
                }],
                bundle_latency: vec![("Read+Split".into(), {
                    let mut h = LatencyHistogram::default();
                    h.observe(0.003);
                    h.observe(0.2);
                    h
                })],
                ..Default::default()
            },
        ];
        let text = render(&jobs, 3, 4_000);
        for line in [
            "# TYPE refract_jobs gauge",
            "refract_jobs{state=\"DONE\"} 1",
            "refract_jobs{state=\"RUNNING\"} 1",
            "# TYPE refract_pcollection_elements_total counter",
            "refract_pcollection_elements_total{job=\"job-1\",pcollection=\"words\"} 150",
            "refract_user_counter_total{job=\"job-1\",transform=\"Split \\\"lines\\\"\",namespace=\"ns\",name=\"empty\"} 3",
            "refract_user_distribution_max{job=\"job-1\",transform=\"t\",namespace=\"ns\",name=\"len\"} 6",
            "refract_stage_input_watermark_ms{job=\"job-2\",stage=\"Read+Split\"} -Inf",
            "refract_stage_output_watermark_ms{job=\"job-2\",stage=\"Read+Split\"} 1000",
            "refract_stage_pending_bytes{job=\"job-2\",stage=\"Read+Split\"} 40",
            "refract_stage_elements_total{job=\"job-2\",stage=\"Read+Split\"} 9",
            "refract_stage_throttled_seconds_total{job=\"job-2\",stage=\"Read+Split\"} 1.5",
            "refract_stage_spilled_bytes_total{job=\"job-2\",stage=\"Read+Split\"} 4096",
            "refract_stage_output_bytes_total{job=\"job-2\",stage=\"Read+Split\"} 77",
            "refract_stage_output_watermark_lag_seconds{job=\"job-2\",stage=\"Read+Split\"} 3",
            "refract_harnesses_live 3",
            "refract_checkpoints_total{job=\"job-1\"} 2",
            "refract_checkpoint_size_bytes{job=\"job-1\"} 700",
            "refract_checkpoint_seconds_total{job=\"job-1\"} 0.03",
            "refract_checkpoint_failures_total{job=\"job-1\"} 1",
            "refract_checkpoint_age_seconds{job=\"job-1\"} 2.5",
            "# TYPE refract_stage_bundle_duration_seconds histogram",
            "refract_stage_bundle_duration_seconds_bucket{job=\"job-2\",stage=\"Read+Split\",le=\"0.002\"} 0",
            "refract_stage_bundle_duration_seconds_bucket{job=\"job-2\",stage=\"Read+Split\",le=\"0.005\"} 1",
            "refract_stage_bundle_duration_seconds_bucket{job=\"job-2\",stage=\"Read+Split\",le=\"+Inf\"} 2",
            "refract_stage_bundle_duration_seconds_count{job=\"job-2\",stage=\"Read+Split\"} 2",
            "refract_stage_bundle_duration_seconds_sum{job=\"job-2\",stage=\"Read+Split\"} 0.203",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // Only jobs that checkpoint have checkpoint metrics.
        assert!(!text.contains("refract_checkpoints_total{job=\"job-2\"}"));
        // No lag at the ends of time.
        assert!(!text.contains("refract_stage_input_watermark_lag_seconds{"));
        // The undecodable payload is left out, not rendered wrong.
        assert_eq!(
            text.matches("refract_user_counter_total{").count(),
            1,
            "{text}"
        );
    }
}
