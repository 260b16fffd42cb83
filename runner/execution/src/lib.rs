//! Running a job: what happens between the Job API's `Run` and the job's
//! terminal state.
//!
//! A [`job_runner::RefractRunner`] is the job service's `JobRunner`: it
//! translates the pipeline, starts the SDK workers of each environment
//! (local processes, containers, or remote pools), builds the engine
//! with the job's durability (checkpoints, state beside them, spill
//! space) and memory grant, and runs it, retrying the run after a lost
//! worker or a failed bundle as the job's options allow. The engine's
//! SDK stages run through the `harness_executor`, which sends bundles
//! to workers over the Fn API, answers their state requests
//! (`state_bridge`), splits long splittable bundles (`split_policy`)
//! and watches for stalled ones ([`stall_watch`]). What it records of a
//! job goes to `refract-observability`.

pub mod activity;
pub mod bundle_finalizations;
pub mod durability;
pub mod durable_spill;
pub(crate) mod harness_executor;
pub mod job_runner;
pub mod memory;
mod options;
pub mod output_spill;
pub mod scratch_spill;
pub mod shard_metrics;
mod split_policy;
pub mod stall_watch;
mod state_bridge;
pub mod worker_set;

/// The `tracing` target of an SDK worker's log line relayed into the
/// runner's log (with fields `worker`, `stage` and `transform`); the
/// binary's log formats write such lines as Prism writes its workers'.
pub const SDK_WORKER_TARGET: &str = "refract::sdk_worker";
