//! What Refract shows of its jobs, to people and to monitoring systems.
//!
//! The runner records into one [`insights::Insights`] (a [`insights::JobView`]
//! per job: stage counters, watermarks, bundle latencies, checkpoints,
//! failures, stalled bundles); everything here reads from it: the web UI
//! and its JSON (`ui`), Prometheus text on `/metrics` and the OTLP export
//! (`telemetry`), both walking the one table of metrics in
//! `metric_catalog`, and the stage history kept after a job ends. Nothing
//! here runs a job: the runner crate depends on this one, never the other
//! way round (the SDK workers of a job are seen through the
//! [`insights::ConnectedWorkers`] trait).

pub mod bundle_failures;
pub mod insights;
pub mod job_api_text;
pub mod metric_catalog;
pub mod stage_history;
pub mod stalled_bundles;
pub mod telemetry;
pub mod ui;
