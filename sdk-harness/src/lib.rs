//! The runner's side of Beam's Fn API.
//!
//! One gRPC server ([`FnApiServer`]) on one port serves BeamFnControl,
//! BeamFnData, BeamFnState, BeamFnLogging, ProvisionService and
//! ArtifactRetrievalService for every worker of every job, routing each call
//! by its `worker_id` metadata header. [`FnApiServer::start_worker`] starts
//! workers for EXTERNAL (and LOOPBACK), PROCESS and DOCKER environments;
//! [`Worker::process_bundle`] runs bundles on them.
//!
//! This crate knows the Fn API protocol and nothing about pipelines: the
//! engine decides what runs, this crate only moves bytes and instructions.
//! It also holds the other side of EXTERNAL environments for hosts without
//! a pool of their own: [`BootPool`], a worker pool that runs an SDK's boot
//! program per worker (`refract worker-pool`).

#![warn(missing_docs)]

mod boot_pool;
mod bundle;
mod collector;
mod config;
mod endpoint;
mod environment;
mod error;
mod framing;
mod hub;
mod inflight;
mod link;
mod pool_token;
mod server;
mod services;
mod worker;

pub use boot_pool::{BootPool, BootPoolConfig};
pub use bundle::{BundleRequest, BundleResult, OutputChunks, OutputSpill, StateHandler};
pub use config::{
    unguessable_worker_id, ArtifactSource, LogSink, NoArtifacts, TracingLogSink, WorkerConfig,
};
pub use environment::{BeamSdk, HostHarnesses};
pub use error::{BundleError, HarnessError};
pub use pool_token::{PoolCaller, PoolCallers, PoolToken, POOL_TOKEN_ENV, POOL_TOKEN_HEADER};
pub use server::{FnApiServer, DEFAULT_CONNECT_TIMEOUT, DEFAULT_WORKER_LIVENESS_TIMEOUT};
pub use worker::Worker;

/// The gRPC metadata key that names the calling worker.
pub const WORKER_ID_HEADER: &str = hub::WORKER_ID_HEADER;
