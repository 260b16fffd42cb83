//! The runner's own telemetry: what each bundle took, for `/metrics` and,
//! when an OTLP endpoint is set, for OpenTelemetry metrics and traces.
//!
//! A [`BundleRecorder`] is handed to each job's executor; it records every
//! bundle's duration in the job's [`JobView`] (always, so `/metrics` has a
//! latency histogram) and, only when [`OtlpExport`] runs, into the OTLP
//! histogram and as a span under the job's span.

pub mod otlp;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::SpanContext;

use crate::insights::JobView;
pub use otlp::{JobSpan, OtlpError, OtlpExport};

/// One finished bundle, as the executor saw it.
#[derive(Debug, Clone)]
pub struct BundleRecord<'a> {
    /// The stage's name.
    pub stage: &'a str,
    /// The worker that ran it.
    pub worker: &'a str,
    /// The bundle's instruction id.
    pub bundle_id: &'a str,
    /// When it was sent to the worker.
    pub started: SystemTime,
    /// How long until the worker's answer (or failure).
    pub duration: Duration,
    /// Encoded bytes of its input elements.
    pub input_bytes: usize,
    /// Why it failed, if it did.
    pub error: Option<&'a str>,
}

/// Records one job's bundles.
#[derive(Clone)]
pub struct BundleRecorder {
    view: Arc<JobView>,
    otlp: Option<(Arc<OtlpExport>, SpanContext)>,
}

impl BundleRecorder {
    /// Records into `view`, and into `otlp` under the job span `job_span`
    /// when exporting.
    pub fn new(view: Arc<JobView>, otlp: Option<(Arc<OtlpExport>, SpanContext)>) -> Self {
        BundleRecorder { view, otlp }
    }

    /// Notes a finished bundle.
    pub fn record(&self, record: &BundleRecord<'_>) {
        self.view
            .observe_bundle(record.stage, record.duration.as_secs_f64());
        if let Some(error) = record.error {
            self.view.observe_bundle_failure(record.stage, error);
        }
        if let Some((otlp, job_span)) = &self.otlp {
            otlp.bundle(job_span, self.view.id(), record);
        }
    }
}
