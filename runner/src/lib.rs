//! The `refract` binary's library: its command line, the commands it
//! runs (`serve`, `run`, the job and pool clients, `worker-pool`,
//! `shard`) and the
//! wiring of the crates that do the work. `main.rs` is a thin shell over
//! it so that integration tests run the same code.

pub mod cli;
pub mod client;
mod fork_server;
pub mod logging;
pub mod pools_command;
pub mod run_command;
pub mod run_progress;
pub mod serve;
pub mod shard_command;
pub mod tested_with;
pub mod worker_pool_command;
