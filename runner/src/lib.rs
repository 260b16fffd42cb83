//! The `refract` runner: the glue between the Job API, translation, the
//! engine and the SDK harnesses. The binary in `main.rs` is a thin shell
//! over this library so that integration tests can run the same code.

pub mod activity;
pub mod bundle_finalizations;
pub mod cli;
pub mod client;
pub mod durability;
pub mod durable_state;
mod fork_server;
pub(crate) mod harness_executor;
pub mod job_runner;
pub mod logging;
pub mod memory;
mod options;
pub mod output_spill;
pub mod pools_command;
pub mod run_command;
pub mod serve;
pub mod spill_store;
mod split_policy;
pub mod stall_watch;
mod state_bridge;
pub mod tested_with;
pub mod worker_pool_command;
pub mod worker_set;
