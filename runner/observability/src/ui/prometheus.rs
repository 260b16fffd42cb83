//! The server's jobs and their committed metrics in Prometheus' text
//! exposition format (version 0.0.4), for `/metrics`: the numbers are the
//! ones `GetJobMetrics` returns, so a scrape and the SDK's view agree.
//!
//! The samples are gathered per scrape from the jobs' snapshots into
//! families named by the metric catalog; `prometheus-client` writes them
//! (names, escaping, number formats, histogram buckets).

use std::collections::BTreeMap;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use refract_engine::manager::StageStats;
use refract_jobservice::{decode_int_metric as decode, IntMetric};
use refract_proto::pipeline::MonitoringInfo;

use crate::insights::CheckpointSummary;
use crate::metric_catalog::{self as catalog, MetricKind, MetricSpec};

/// URN of the runner's per-PCollection element counter.
const ELEMENT_COUNT: &str = "beam:metric:element_count:v1";
/// URN prefix of user metrics.
const USER_PREFIX: &str = "beam:metric:user:";

/// The `Content-Type` of what [`render`] returns.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

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
    pub bundle_latency: Vec<(String, Histogram)>,
    /// Its checkpoints.
    pub checkpoints: CheckpointSummary,
}

/// One sample's value: integers are written without a fraction, as
/// before any exporter, and infinities as `+Inf` and `-Inf`.
#[derive(Debug)]
enum Sample {
    Int(i64),
    Float(f64),
    Histogram(Histogram),
}

impl Sample {
    /// `v`, as an integer if it is one (and small enough to be exact).
    fn of(v: f64) -> Sample {
        if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
            Sample::Int(v as i64)
        } else {
            Sample::Float(v)
        }
    }
}

impl From<i64> for Sample {
    fn from(v: i64) -> Sample {
        Sample::Int(v)
    }
}

impl From<usize> for Sample {
    fn from(v: usize) -> Sample {
        Sample::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

/// The samples of one metric family, each with its labels.
#[derive(Debug)]
struct Family {
    spec: MetricSpec,
    samples: Vec<(Vec<(String, String)>, Sample)>,
}

/// Metric families by name, in the order a scrape lists them; what one
/// scrape writes.
#[derive(Debug, Default)]
struct Families(BTreeMap<&'static str, Family>);

impl Families {
    /// Adds a sample of `metric`.
    fn add(&mut self, metric: &MetricSpec, labels: &[(&str, &str)], value: impl Into<Sample>) {
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.0
            .entry(metric.prometheus)
            .or_insert_with(|| Family {
                spec: *metric,
                samples: Vec::new(),
            })
            .samples
            .push((labels, value.into()));
    }
}

impl From<f64> for Sample {
    fn from(v: f64) -> Sample {
        Sample::of(v)
    }
}

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in self.0.values() {
            let spec = &family.spec;
            // The encoder adds a counter's `_total` itself.
            let (name, kind) = match spec.kind {
                MetricKind::Counter => (
                    spec.prometheus
                        .strip_suffix("_total")
                        .unwrap_or(spec.prometheus),
                    MetricType::Counter,
                ),
                MetricKind::Gauge => (spec.prometheus, MetricType::Gauge),
                MetricKind::Histogram => (spec.prometheus, MetricType::Histogram),
            };
            let mut metric = encoder.encode_descriptor(name, spec.help, None, kind)?;
            for (labels, sample) in &family.samples {
                let sample_encoder = metric.encode_family(labels)?;
                match (spec.kind, sample) {
                    (MetricKind::Counter, Sample::Int(n)) => match u64::try_from(*n) {
                        Ok(n) => ConstCounter::new(n).encode(sample_encoder)?,
                        Err(_) => ConstCounter::new(*n as f64).encode(sample_encoder)?,
                    },
                    (MetricKind::Counter, Sample::Float(v)) => {
                        ConstCounter::new(*v).encode(sample_encoder)?
                    }
                    (_, Sample::Int(n)) => ConstGauge::new(*n).encode(sample_encoder)?,
                    (_, Sample::Float(v)) => ConstGauge::new(*v).encode(sample_encoder)?,
                    (_, Sample::Histogram(h)) => h.encode(sample_encoder)?,
                }
            }
        }
        Ok(())
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
        add_committed_metrics(&mut families, job);
    }
    for job in jobs {
        for stage in &job.stages {
            let labels = [("job", job.id.as_str()), ("stage", stage.name.as_str())];
            for reading in &catalog::STAGE_READINGS {
                if let Some(value) = (reading.read)(stage, now_ms) {
                    families.add(&reading.spec, &labels, value);
                }
            }
        }
    }
    for job in jobs.iter().filter(|j| j.checkpoints.enabled) {
        let labels = [("job", job.id.as_str())];
        for reading in &catalog::CHECKPOINT_READINGS {
            if let Some(value) = (reading.read)(&job.checkpoints, now_ms) {
                families.add(&reading.spec, &labels, value);
            }
        }
    }
    for job in jobs {
        for (stage, histogram) in &job.bundle_latency {
            let labels = [("job", job.id.as_str()), ("stage", stage.as_str())];
            families.add(
                &catalog::BUNDLE_DURATION,
                &labels,
                Sample::Histogram(histogram.clone()),
            );
        }
    }
    let mut registry = Registry::default();
    registry.register_collector(Box::new(families));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_text::encode(&mut out, &registry);
    out
}

/// `job`'s committed element counts and user metrics.
fn add_committed_metrics(families: &mut Families, job: &JobSnapshot) {
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
                    let h = Histogram::new(crate::insights::BundleDurations::BOUNDS_SECONDS);
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
