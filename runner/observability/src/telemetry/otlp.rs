//! OTLP export of the runner's metrics and traces.
//!
//! Nothing here runs unless an endpoint is configured (`--otlp_endpoint`,
//! else `OTEL_EXPORTER_OTLP_ENDPOINT`): without one the runner builds no
//! provider, registers no instrument and records no span, so telemetry
//! costs nothing.
//!
//! Metrics are observed at export time from the same sources as `/metrics`
//! ([`Insights`]: stage snapshots, job states, live workers), so the two
//! never disagree; only bundle durations are recorded as they happen, into
//! a histogram. Traces have one span per job (submission to terminal
//! state) with a child span per bundle carrying its stage and worker.

use std::time::Duration;

use opentelemetry::metrics::{AsyncInstrument, Histogram, Meter, MeterProvider as _};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{SdkTracerProvider, Span, Tracer};
use opentelemetry_sdk::Resource;
use refract_engine::time::wall_clock_ms;
use thiserror::Error;

use crate::insights::{BundleDurations, Insights};
use crate::job_api_text::state_name;
use crate::metric_catalog::{self as catalog, MetricKind, MetricSpec};

/// The standard variable naming the OTLP endpoint when no flag does.
pub const ENDPOINT_VARIABLE: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// The standard variable for the metric export interval, in ms.
const INTERVAL_VARIABLE: &str = "OTEL_METRIC_EXPORT_INTERVAL";

/// Metric export interval when `OTEL_METRIC_EXPORT_INTERVAL` is unset:
/// shorter than the SDK's minute, as local jobs are often short.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// Why OTLP export could not start.
#[derive(Debug, Error)]
pub enum OtlpError {
    /// The exporter rejected its configuration (e.g. a malformed endpoint).
    #[error("cannot export OTLP to '{endpoint}': {reason}")]
    Exporter {
        /// The endpoint asked for.
        endpoint: String,
        /// The exporter's reason.
        reason: String,
    },
}

/// The endpoint to export to: the flag's, else the standard variable's,
/// else none (no export).
pub fn endpoint(flag: Option<&str>) -> Option<String> {
    flag.map(str::to_string)
        .or_else(|| std::env::var(ENDPOINT_VARIABLE).ok())
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
}

/// Running OTLP exporters and the instruments recorded as things happen.
pub struct OtlpExport {
    meters: SdkMeterProvider,
    tracers: SdkTracerProvider,
    tracer: Tracer,
    bundle_duration: Histogram<f64>,
}

impl std::fmt::Debug for OtlpExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OtlpExport")
    }
}

impl OtlpExport {
    /// Starts exporting to `endpoint` (gRPC, e.g. `http://localhost:4317`),
    /// observing jobs through `insights`. Call inside a Tokio runtime.
    pub fn start(endpoint: &str, insights: Insights) -> Result<Self, OtlpError> {
        let failed = |e: &dyn std::fmt::Display| OtlpError::Exporter {
            endpoint: endpoint.to_string(),
            reason: e.to_string(),
        };
        let resource = Resource::builder().with_service_name("refract").build();
        let metric_exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| failed(&e))?;
        let mut reader = PeriodicReader::builder(metric_exporter);
        if std::env::var_os(INTERVAL_VARIABLE).is_none() {
            reader = reader.with_interval(DEFAULT_INTERVAL);
        }
        let meters = SdkMeterProvider::builder()
            .with_reader(reader.build())
            .with_resource(resource.clone())
            .build();
        let span_exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| failed(&e))?;
        let tracers = SdkTracerProvider::builder()
            .with_batch_exporter(span_exporter)
            .with_resource(resource)
            .build();
        let tracer = opentelemetry::trace::TracerProvider::tracer(&tracers, "refract");
        let meter = meters.meter("refract");
        register_observers(&meter, insights);
        let bundle_duration = meter
            .f64_histogram(catalog::BUNDLE_DURATION.otlp.unwrap_or_default())
            .with_description(catalog::BUNDLE_DURATION.help)
            .with_unit(catalog::BUNDLE_DURATION.unit)
            .with_boundaries(BundleDurations::BOUNDS_SECONDS.to_vec())
            .build();
        Ok(OtlpExport {
            meters,
            tracers,
            tracer,
            bundle_duration,
        })
    }

    /// Starts the span of a job, ended by [`JobSpan::end`].
    pub fn job_span(&self, job_id: &str, job_name: &str) -> JobSpan {
        let span = self
            .tracer
            .span_builder("job")
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("beam.job.id", job_id.to_string()),
                KeyValue::new("beam.job.name", job_name.to_string()),
            ])
            .start(&self.tracer);
        JobSpan { span }
    }

    /// Records one bundle: its duration in the histogram, and a span under
    /// the job's.
    pub(crate) fn bundle(&self, job: &SpanContext, job_id: &str, record: &super::BundleRecord<'_>) {
        let attributes = [
            KeyValue::new("beam.job.id", job_id.to_string()),
            KeyValue::new("refract.stage", record.stage.to_string()),
        ];
        self.bundle_duration
            .record(record.duration.as_secs_f64(), &attributes);
        let parent = Context::new().with_remote_span_context(job.clone());
        let mut span = self
            .tracer
            .span_builder("bundle")
            .with_start_time(record.started)
            .with_attributes([
                KeyValue::new("beam.job.id", job_id.to_string()),
                KeyValue::new("refract.stage", record.stage.to_string()),
                KeyValue::new("refract.worker", record.worker.to_string()),
                KeyValue::new("refract.bundle", record.bundle_id.to_string()),
                KeyValue::new("refract.input_bytes", record.input_bytes as i64),
            ])
            .start_with_context(&self.tracer, &parent);
        if let Some(error) = record.error {
            span.set_status(Status::error(error.to_string()));
        }
        span.end_with_timestamp(record.started + record.duration);
    }

    /// Exports what is pending and stops the exporters.
    pub fn shutdown(&self) {
        if let Err(error) = self.tracers.force_flush() {
            tracing::warn!(%error, "flushing OTLP spans");
        }
        if let Err(error) = self.meters.force_flush() {
            tracing::warn!(%error, "flushing OTLP metrics");
        }
        let _ = self.tracers.shutdown();
        let _ = self.meters.shutdown();
    }
}

/// The span of one job, from submission to its terminal state.
pub struct JobSpan {
    span: Span,
}

impl JobSpan {
    /// What bundle spans name as their parent.
    pub fn context(&self) -> SpanContext {
        self.span.span_context().clone()
    }

    /// Ends the span with the job's final state (and error, if it failed).
    pub fn end(mut self, final_state: &str, error: Option<&str>) {
        self.span
            .set_attribute(KeyValue::new("beam.job.state", final_state.to_string()));
        if let Some(error) = error {
            self.span.set_status(Status::error(error.to_string()));
        }
        self.span.end();
    }
}

/// Registers `metric` as an instrument observed at each export: a
/// counter or a gauge, as the catalog says. Metrics OTLP does not carry
/// are skipped.
fn register(
    meter: &Meter,
    metric: &MetricSpec,
    observe: impl Fn(&dyn AsyncInstrument<f64>) + Send + Sync + 'static,
) {
    let Some(name) = metric.otlp else {
        return;
    };
    match metric.kind {
        MetricKind::Counter => {
            meter
                .f64_observable_counter(name)
                .with_description(metric.help)
                .with_unit(metric.unit)
                .with_callback(observe)
                .build();
        }
        MetricKind::Gauge => {
            meter
                .f64_observable_gauge(name)
                .with_description(metric.help)
                .with_unit(metric.unit)
                .with_callback(observe)
                .build();
        }
        // Histograms are recorded as bundles end, not observed.
        MetricKind::Histogram => {}
    }
}

/// Registers the instruments observed at each export; each reads the
/// latest snapshots from `insights`. Values at the ends of time (infinite
/// watermarks) are left out.
fn register_observers(meter: &Meter, insights: Insights) {
    for reading in catalog::STAGE_READINGS {
        let insights = insights.clone();
        let observe = move |observer: &dyn AsyncInstrument<f64>| {
            let now = wall_clock_ms();
            for job in insights.jobs() {
                for stage in job.stages() {
                    if let Some(v) = (reading.read)(&stage, now).filter(|v| v.is_finite()) {
                        observer.observe(
                            v,
                            &[
                                KeyValue::new("beam.job.id", job.id().to_string()),
                                KeyValue::new("refract.stage", stage.name.clone()),
                            ],
                        );
                    }
                }
            }
        };
        register(meter, &reading.spec, observe);
    }
    for reading in catalog::CHECKPOINT_READINGS {
        let insights = insights.clone();
        let observe = move |observer: &dyn AsyncInstrument<f64>| {
            let now = wall_clock_ms();
            for job in insights.jobs() {
                let checkpoints = job.checkpoints();
                if !checkpoints.enabled {
                    continue;
                }
                if let Some(v) = (reading.read)(&checkpoints, now) {
                    observer.observe(v, &[KeyValue::new("beam.job.id", job.id().to_string())]);
                }
            }
        };
        register(meter, &reading.spec, observe);
    }
    let jobs = insights.clone();
    meter
        .u64_observable_gauge(catalog::JOBS.otlp.unwrap_or_default())
        .with_description(catalog::JOBS.help)
        .with_unit(catalog::JOBS.unit)
        .with_callback(move |observer| {
            let mut by_state = std::collections::BTreeMap::<String, u64>::new();
            for job in jobs.jobs() {
                *by_state.entry(state_name(job.state() as i32)).or_default() += 1;
            }
            for (state, n) in by_state {
                observer.observe(n, &[KeyValue::new("beam.job.state", state)]);
            }
        })
        .build();
    meter
        .u64_observable_gauge(catalog::HARNESSES_LIVE.otlp.unwrap_or_default())
        .with_description(catalog::HARNESSES_LIVE.help)
        .with_unit(catalog::HARNESSES_LIVE.unit)
        .with_callback(move |observer| observer.observe(insights.live_workers() as u64, &[]))
        .build();
}
