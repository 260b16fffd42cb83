//! Beam's Job API for Refract.
//!
//! This crate owns everything a Beam SDK talks to before and around execution:
//! the `JobService` (prepare, run, state and message streams, cancel, metrics)
//! and the `ArtifactStagingService` (the server-driven reverse retrieval
//! protocol), both served by [`serve`] on one port. Execution itself lives
//! elsewhere: the runner implements [`JobRunner`] and drives each submitted
//! [`Job`] through its state machine, posts its messages and commits its
//! metrics.

#![warn(missing_docs)]

mod admin;
mod artifacts;
mod config;
mod decode_gate;
mod error;
mod event_log;
mod job;
mod job_state;
mod metrics;
mod planning;
pub mod redact;
mod registry;
mod runner;
mod server;
mod service;
mod staging;
mod streams;

pub use admin::SERVER_NAME;
pub use artifacts::{ArtifactStore, StagedArtifact};
pub use config::{JobServiceConfig, RecoveredJob};
pub use error::JobServiceError;
pub use event_log::{Event as JobEvent, HistoryPage, MessageRetention};
pub use job::Job;
pub use job_state::{is_terminal, JobState};
pub use metrics::{
    decode_int_metric, IntMetric, JobMetrics, DISTRIBUTION_INT64, LATEST_INT64, SUM_INT64,
};
pub use planning::PlanningTurn;
pub use registry::is_safe_job_id;
pub use runner::{JobRunner, RescaleError};
pub use server::serve;
