//! Every metric Refract exports, once: its Prometheus and OTLP names, what
//! it means, its unit and kind, and (for the per-stage and per-checkpoint
//! numbers) how it is read from a snapshot.
//!
//! `/metrics` ([`crate::ui::prometheus`]) and the OTLP export
//! ([`crate::telemetry`]) both walk these tables, so a metric cannot be in
//! one export and missing from the other by accident, and the table in
//! `docs/operations.md` is generated from them ([`markdown_table`]; a test
//! keeps it current). A metric one export cannot carry says so with `None`.

use refract_engine::manager::StageStats;
use refract_engine::time::{finite, MAX_TIMESTAMP, MIN_TIMESTAMP};

use crate::insights::CheckpointSummary;
use MetricKind::{Counter, Gauge, Histogram};
use MetricScope::{Job, JobState, PCollection, Server, Stage, UserMetric};

/// Whether a metric only grows (a counter) or is a reading (a gauge), or
/// counts observations into buckets (a histogram).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only grows while its job runs.
    Counter,
    /// A reading that goes up and down.
    Gauge,
    /// Observations counted into buckets, with their sum.
    Histogram,
}

impl MetricKind {
    /// The name Prometheus' `# TYPE` line uses.
    pub fn prometheus_type(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// What a metric is labelled with (Prometheus labels; OTLP attributes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricScope {
    /// The whole server.
    Server,
    /// Jobs, by their state.
    JobState,
    /// One job.
    Job,
    /// One fused stage of a job.
    Stage,
    /// One PCollection of a job.
    PCollection,
    /// A user metric: the job, the transform, its namespace and name.
    UserMetric,
}

impl MetricScope {
    /// The Prometheus labels, in the order a sample lists them.
    pub fn prometheus_labels(self) -> &'static str {
        match self {
            Self::Server => "",
            Self::JobState => "`state`",
            Self::Job => "`job`",
            Self::Stage => "`job`, `stage`",
            Self::PCollection => "`job`, `pcollection`",
            Self::UserMetric => "`job`, `transform`, `namespace`, `name`",
        }
    }
}

/// One metric: its names in each export and what it means.
#[derive(Debug, Clone, Copy)]
pub struct MetricSpec {
    /// The Prometheus family name (`/metrics`).
    pub prometheus: &'static str,
    /// The OTLP instrument name, if OTLP exports it.
    pub otlp: Option<&'static str>,
    /// What it measures, for `# HELP`, the OTLP description and the docs.
    pub help: &'static str,
    /// Its unit in UCUM, as OTLP wants it (`s`, `By`, `{element}`, ...).
    pub unit: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// What its samples are labelled with.
    pub scope: MetricScope,
}

/// A metric read from a value of type `T` (a stage's or a job's
/// checkpoint numbers) at the wall-clock time `now_ms`; `None` where the
/// metric has no sample (a lag at the ends of time). Infinite values are
/// watermarks at the ends of time: Prometheus shows them as `±Inf`, OTLP
/// leaves them out.
#[derive(Debug, Clone, Copy)]
pub struct Reading<T> {
    /// The metric.
    pub spec: MetricSpec,
    /// Its value in a snapshot.
    pub read: fn(&T, i64) -> Option<f64>,
}

const fn spec(
    prometheus: &'static str,
    otlp: Option<&'static str>,
    kind: MetricKind,
    scope: MetricScope,
    unit: &'static str,
    help: &'static str,
) -> MetricSpec {
    MetricSpec {
        prometheus,
        otlp,
        help,
        unit,
        kind,
        scope,
    }
}

/// Jobs the server knows, by state.
pub const JOBS: MetricSpec = spec(
    "refract_jobs",
    Some("refract.jobs"),
    Gauge,
    JobState,
    "{job}",
    "Jobs the server knows, by state.",
);

/// Connected SDK workers.
pub const HARNESSES_LIVE: MetricSpec = spec(
    "refract_harnesses_live",
    Some("refract.harnesses.live"),
    Gauge,
    Server,
    "{worker}",
    "SDK harness workers connected now.",
);

/// How long bundles took, per stage.
pub const BUNDLE_DURATION: MetricSpec = spec(
    "refract_stage_bundle_duration_seconds",
    Some("refract.stage.bundle.duration"),
    Histogram,
    Stage,
    "s",
    "How long the stage's bundles took on their SDK workers.",
);

/// Beam's element counts per PCollection (what `GetJobMetrics` returns).
pub const PCOLLECTION_ELEMENTS: MetricSpec = spec(
    "refract_pcollection_elements_total",
    None,
    Counter,
    PCollection,
    "{element}",
    "Elements output into each PCollection by committed bundles.",
);

/// User counters.
pub const USER_COUNTER: MetricSpec = spec(
    "refract_user_counter_total",
    None,
    Counter,
    UserMetric,
    "1",
    "User counters (Metrics.counter), committed bundles only.",
);

/// User gauges.
pub const USER_GAUGE: MetricSpec = spec(
    "refract_user_gauge",
    None,
    Gauge,
    UserMetric,
    "1",
    "User gauges: the latest value set.",
);

/// User distributions: how many values.
pub const USER_DISTRIBUTION_COUNT: MetricSpec = spec(
    "refract_user_distribution_count",
    None,
    Gauge,
    UserMetric,
    "1",
    "User distributions: number of values.",
);

/// User distributions: their sum.
pub const USER_DISTRIBUTION_SUM: MetricSpec = spec(
    "refract_user_distribution_sum",
    None,
    Gauge,
    UserMetric,
    "1",
    "User distributions: sum of the values.",
);

/// User distributions: the smallest value.
pub const USER_DISTRIBUTION_MIN: MetricSpec = spec(
    "refract_user_distribution_min",
    None,
    Gauge,
    UserMetric,
    "1",
    "User distributions: smallest value.",
);

/// User distributions: the largest value.
pub const USER_DISTRIBUTION_MAX: MetricSpec = spec(
    "refract_user_distribution_max",
    None,
    Gauge,
    UserMetric,
    "1",
    "User distributions: largest value.",
);

/// A watermark as a metric value: ms, or an infinity at the ends of time.
fn watermark(t: i64) -> f64 {
    if t <= MIN_TIMESTAMP {
        f64::NEG_INFINITY
    } else if t >= MAX_TIMESTAMP {
        f64::INFINITY
    } else {
        t as f64
    }
}

/// How far a watermark is behind the wall clock, in seconds; none at the
/// ends of time.
fn lag_seconds(t: i64, now_ms: i64) -> Option<f64> {
    finite(t).map(|t| (now_ms - t) as f64 / 1000.0)
}

/// The per-stage metrics, read from the engine's stage snapshot.
pub const STAGE_READINGS: [Reading<StageStats>; 14] = [
    Reading {
        spec: spec(
            "refract_stage_input_watermark_ms",
            Some("refract.stage.watermark.input"),
            Gauge,
            Stage,
            "ms",
            "A stage's input watermark (ms since the epoch; -Inf before any input).",
        ),
        read: |s, _| Some(watermark(s.input_watermark)),
    },
    Reading {
        spec: spec(
            "refract_stage_output_watermark_ms",
            Some("refract.stage.watermark.output"),
            Gauge,
            Stage,
            "ms",
            "A stage's output watermark (ms since the epoch; +Inf once it finished).",
        ),
        read: |s, _| Some(watermark(s.output_watermark)),
    },
    Reading {
        spec: spec(
            "refract_stage_input_watermark_lag_seconds",
            Some("refract.stage.watermark.input.lag"),
            Gauge,
            Stage,
            "s",
            "How far the stage's input watermark is behind the wall clock.",
        ),
        read: |s, now| lag_seconds(s.input_watermark, now),
    },
    Reading {
        spec: spec(
            "refract_stage_output_watermark_lag_seconds",
            Some("refract.stage.watermark.output.lag"),
            Gauge,
            Stage,
            "s",
            "How far the stage's output watermark is behind the wall clock.",
        ),
        read: |s, now| lag_seconds(s.output_watermark, now),
    },
    Reading {
        spec: spec(
            "refract_stage_pending_elements",
            Some("refract.stage.backlog.elements"),
            Gauge,
            Stage,
            "{element}",
            "Elements waiting for a bundle of the stage.",
        ),
        read: |s, _| Some(s.pending_elements as f64),
    },
    Reading {
        spec: spec(
            "refract_stage_pending_bytes",
            Some("refract.stage.backlog.bytes"),
            Gauge,
            Stage,
            "By",
            "Encoded bytes waiting for a bundle of the stage, or in a GroupByKey's buffer (the backlog).",
        ),
        read: |s, _| Some(s.pending_bytes as f64),
    },
    Reading {
        spec: spec(
            "refract_stage_bundles_in_flight",
            Some("refract.stage.bundles.in_flight"),
            Gauge,
            Stage,
            "{bundle}",
            "Bundles of the stage running now.",
        ),
        read: |s, _| Some(s.bundles_in_flight as f64),
    },
    Reading {
        spec: spec(
            "refract_stage_bundles_total",
            Some("refract.stage.bundles"),
            Counter,
            Stage,
            "{bundle}",
            "Bundles of the stage committed.",
        ),
        read: |s, _| Some(s.bundles_committed as f64),
    },
    Reading {
        spec: spec(
            "refract_stage_elements_total",
            Some("refract.stage.elements.in"),
            Counter,
            Stage,
            "{element}",
            "Input elements of the stage's committed bundles.",
        ),
        read: |s, _| Some(s.elements_processed as f64),
    },
    Reading {
        spec: spec(
            "refract_stage_input_bytes_total",
            Some("refract.stage.bytes.in"),
            Counter,
            Stage,
            "By",
            "Encoded bytes of the stage's input elements.",
        ),
        read: |s, _| Some(s.bytes_processed as f64),
    },
    Reading {
        spec: spec(
            "refract_stage_output_elements_total",
            Some("refract.stage.elements.out"),
            Counter,
            Stage,
            "{element}",
            "Elements the stage emitted.",
        ),
        read: |s, _| Some(s.elements_out as f64),
    },
    Reading {
        spec: spec(
            "refract_stage_output_bytes_total",
            Some("refract.stage.bytes.out"),
            Counter,
            Stage,
            "By",
            "Encoded bytes of the elements the stage emitted.",
        ),
        read: |s, _| Some(s.bytes_out as f64),
    },
    Reading {
        spec: spec(
            "refract_stage_throttled_seconds_total",
            Some("refract.stage.throttled"),
            Counter,
            Stage,
            "s",
            "Time the stage was held back because a consumer's backlog was over its bound.",
        ),
        read: |s, _| Some(s.throttled_ms as f64 / 1000.0),
    },
    Reading {
        spec: spec(
            "refract_stage_spilled_bytes_total",
            Some("refract.stage.spilled"),
            Counter,
            Stage,
            "By",
            "Bytes a stage spilled to disk: a GroupByKey's buffer that outgrew its memory share, or a queue far past its bound.",
        ),
        read: |s, _| Some(s.spilled_bytes as f64),
    },
];

/// The per-job checkpoint metrics, for jobs that checkpoint.
pub const CHECKPOINT_READINGS: [Reading<CheckpointSummary>; 7] = [
    Reading {
        spec: spec(
            "refract_checkpoints_total",
            Some("refract.checkpoints"),
            Counter,
            Job,
            "{checkpoint}",
            "Checkpoints of the job written to the state store.",
        ),
        read: |c, _| Some(c.taken as f64),
    },
    Reading {
        spec: spec(
            "refract_checkpoint_failures_total",
            Some("refract.checkpoint.failures"),
            Counter,
            Job,
            "{checkpoint}",
            "Checkpoints of the job that could not be written (the job went on).",
        ),
        read: |c, _| Some(c.failed as f64),
    },
    Reading {
        spec: spec(
            "refract_checkpoint_seconds_total",
            Some("refract.checkpoint.duration"),
            Counter,
            Job,
            "s",
            "Time spent writing the job's checkpoints.",
        ),
        read: |c, _| Some(c.total_duration.as_secs_f64()),
    },
    Reading {
        spec: spec(
            "refract_checkpoint_written_bytes_total",
            Some("refract.checkpoint.written"),
            Counter,
            Job,
            "By",
            "Bytes the job's checkpoints wrote (changed parts only).",
        ),
        read: |c, _| Some(c.bytes_written as f64),
    },
    Reading {
        spec: spec(
            "refract_checkpoint_age_seconds",
            Some("refract.checkpoint.age"),
            Gauge,
            Job,
            "s",
            "Time since the job's latest checkpoint was written (or, before its first, since it started checkpointing): what a restart would redo.",
        ),
        read: |c, now_ms| {
            let now = std::time::UNIX_EPOCH
                + std::time::Duration::from_millis(u64::try_from(now_ms).unwrap_or(0));
            c.age_at(now).map(|age| age.as_secs_f64())
        },
    },
    Reading {
        spec: spec(
            "refract_checkpoint_size_bytes",
            Some("refract.checkpoint.size"),
            Gauge,
            Job,
            "By",
            "Size of the job's latest checkpoint (every part).",
        ),
        read: |c, _| c.last.as_ref().map(|l| l.total_bytes as f64),
    },
    Reading {
        spec: spec(
            "refract_checkpoint_last_seconds",
            Some("refract.checkpoint.last.duration"),
            Gauge,
            Job,
            "s",
            "How long writing the job's latest checkpoint took.",
        ),
        read: |c, _| c.last.as_ref().map(|l| l.duration.as_secs_f64()),
    },
];

/// Every metric, in the order the docs list them.
pub fn all() -> Vec<MetricSpec> {
    let mut all = vec![
        JOBS,
        HARNESSES_LIVE,
        PCOLLECTION_ELEMENTS,
        USER_COUNTER,
        USER_GAUGE,
        USER_DISTRIBUTION_COUNT,
        USER_DISTRIBUTION_SUM,
        USER_DISTRIBUTION_MIN,
        USER_DISTRIBUTION_MAX,
    ];
    all.extend(STAGE_READINGS.iter().map(|r| r.spec));
    all.push(BUNDLE_DURATION);
    all.extend(CHECKPOINT_READINGS.iter().map(|r| r.spec));
    all
}

/// The catalog as the Markdown table `docs/operations.md` shows.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| Prometheus | OTLP | kind | unit | labels | meaning |\n|---|---|---|---|---|---|\n",
    );
    for m in all() {
        let otlp = m.otlp.map_or("—".to_string(), |name| format!("`{name}`"));
        let labels = match m.scope.prometheus_labels() {
            "" => "none",
            labels => labels,
        };
        out.push_str(&format!(
            "| `{}` | {otlp} | {} | `{}` | {labels} | {} |\n",
            m.prometheus,
            m.kind.prometheus_type(),
            m.unit,
            m.help
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the generated table sits in `docs/operations.md`.
    const BEGIN: &str =
        "<!-- metric catalog: generated from runner/observability/src/metric_catalog.rs -->\n";
    const END: &str = "<!-- end of metric catalog -->";

    #[test]
    fn names_are_unique_and_follow_each_exports_rules() {
        let all = all();
        let mut prometheus: Vec<_> = all.iter().map(|m| m.prometheus).collect();
        let mut otlp: Vec<_> = all.iter().filter_map(|m| m.otlp).collect();
        for name in &prometheus {
            assert!(name.starts_with("refract_"), "{name}");
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{name}"
            );
        }
        for m in &all {
            let counter_suffix = m.prometheus.ends_with("_total");
            assert_eq!(counter_suffix, m.kind == Counter, "{}", m.prometheus);
        }
        for name in &otlp {
            assert!(name.starts_with("refract."), "{name}");
        }
        let (p, o) = (prometheus.len(), otlp.len());
        prometheus.sort();
        prometheus.dedup();
        otlp.sort();
        otlp.dedup();
        assert_eq!(
            (prometheus.len(), otlp.len()),
            (p, o),
            "a name is used twice"
        );
        // The OTLP export registers these by name, outside the tables.
        for m in [JOBS, HARNESSES_LIVE, BUNDLE_DURATION] {
            assert!(m.otlp.is_some(), "{}", m.prometheus);
        }
    }

    /// `docs/operations.md` shows the catalog as it is;
    /// `REFRACT_BLESS=1 cargo test -p refract-observability --lib metric_catalog`
    /// rewrites it after a change here.
    #[test]
    fn the_operations_guide_lists_the_catalog() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md");
        let doc = std::fs::read_to_string(&path).expect("docs/operations.md");
        let start = doc.find(BEGIN).expect("the catalog's begin marker") + BEGIN.len();
        let end = start + doc[start..].find(END).expect("the catalog's end marker");
        let table = markdown_table();
        if doc[start..end] == table {
            return;
        }
        if std::env::var("REFRACT_BLESS").as_deref() == Ok("1") {
            let updated = format!("{}{table}{}", &doc[..start], &doc[end..]);
            std::fs::write(&path, updated).expect("rewrite docs/operations.md");
            return;
        }
        panic!(
            "docs/operations.md's metric table is out of date; run\n  REFRACT_BLESS=1 cargo test -p refract-observability --lib metric_catalog\nThe table should be:\n{table}"
        );
    }
}
