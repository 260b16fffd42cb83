//! The `refract` runner: the glue between the Job API, translation, the
//! engine and the SDK harnesses. The binary in `main.rs` is a thin shell
//! over this library so that integration tests can run the same code.

pub mod activity;
pub mod bundle_failures;
pub mod bundle_finalizations;
pub mod cli;
pub mod client;
pub mod durability;
pub mod durable_state;
mod fork_server;
pub(crate) mod harness_executor;
pub mod insights;
pub mod job_api_text;
pub mod job_runner;
pub mod latency_histogram;
pub mod logging;
pub mod memory;
pub mod metric_catalog;
mod options;
pub mod output_spill;
pub mod pools;
pub mod pools_command;
pub mod private_dir;
pub mod run_command;
pub mod savepoints;
pub mod serve;
pub mod spill_store;
mod split_policy;
pub mod stage_history;
pub mod stalled_bundles;
mod state_bridge;
pub mod telemetry;
pub mod tested_with;
pub mod ui;
pub mod worker_pool_command;
pub mod worker_set;
