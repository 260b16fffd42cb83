//! Shard hosts: the processes a job's engine shards run in when one
//! machine is not enough, and the control plane that places shards on
//! them.
//!
//! A *coordinator* (`refract serve --shard_listen ADDR`) keeps the Job
//! API, each job's plan, the web UI and the CLI. A *shard host* (`refract
//! shard --coordinator ADDR`) attaches to it with one long-lived stream
//! ([`attach()`]) and says where its exchange server listens. For each
//! attempt of a job — a *run* — the coordinator picks the attached hosts,
//! gives each shard of the run to one of them, and sends each host its
//! part: the pipeline and its options, the files the job staged (which the
//! host fetches by content hash), which shards are its own, and where every
//! other shard of the run lives. Each host starts its own SDK workers and
//! engines, and its shards exchange elements and watermarks with the
//! others' directly, over the exchange's frame protocol; the coordinator
//! only runs the run's quiet detector (one report per parked shard) and
//! reads what the hosts report on their stream: the job's messages, its
//! committed metrics, its stages' numbers and each host's end.
//!
//! The coordinator keeps the attached hosts and open runs in a
//! [`HostDirectory`]. A host whose stream breaks — killed, cut off (the
//! stream's pings fail within [`refract_exchange::connection::DETECTION_BOUND`]),
//! or stopped — is gone from the directory at once, and every run it had a
//! part in learns it was lost.
//!
//! Both ends know one shared secret ([`ClusterSecret`]): a host proves it
//! when it attaches, and the coordinator proves it back, so neither a
//! stranger attaching as a host nor a stranger listening where hosts look
//! for their coordinator can see or give work.

pub mod attach;
pub mod coordinator;
pub mod directory;
pub mod error;
pub mod secret;
mod service;

pub use attach::{attach, Attachment, Commands, RunReporter};
pub use coordinator::CoordinatorServer;
pub use directory::{HostDirectory, HostId, HostInfo, RunEvent, RunHandle};
pub use error::HostsError;
pub use secret::ClusterSecret;
