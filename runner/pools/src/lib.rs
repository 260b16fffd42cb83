//! Remote SDK worker pools: where a job's workers run when they run on
//! other hosts.
//!
//! A *pool* is a Beam `BeamFnExternalWorkerPool` service on some host —
//! Python's `worker_pool_main`, Java's `ExternalWorkerService`, Go's pool,
//! or one per Ray node — which, asked `StartWorker`, starts an SDK harness
//! that connects back to this server's Fn API (`--fn_api_host`) and gets
//! its provisioning and artifacts over it. Operators name pools with
//! `--worker_pool [SDK=]HOST:PORT` (a DNS name stands for all its
//! addresses, re-resolved) or `--worker_pool ray://HEAD:PORT`, and change
//! them on a running server with `refract pools add|remove`.
//!
//! Which environments go to pools (`placement.rs`): a DOCKER environment
//! naming one of Beam's SDK images goes to the pools of its SDK or to
//! unlabelled ones; any other DOCKER or PROCESS environment to unlabelled
//! pools; an EXTERNAL environment naming one pool of a spec to all of
//! that spec's pools. Environments no pool serves start as before.
//!
//! - `spec.rs`: what the operator wrote, parsed.
//! - `directory.rs`: the pools known now, their health and load, and which
//!   one starts the next worker.
//! - `dns.rs` and `ray.rs`: the sources keeping a spec's pools current.

mod directory;
mod dns;
mod placement;
mod ray;
mod spec;

use std::path::PathBuf;
use std::sync::Arc;

pub use directory::{Discovered, Placement, PoolDirectory, PoolError, PoolNeed, PoolStatus};
pub use placement::{pool_need, pooled_environment};
pub use spec::{PoolSpec, PoolSpecError, PoolTarget};

/// The pools of one server and the tasks that keep them current.
pub struct WorkerPools {
    directory: Arc<PoolDirectory>,
    /// The Python that runs the Ray driver.
    ray_python: PathBuf,
}

impl WorkerPools {
    /// No pools yet. Pools named by address count `address_capacity`
    /// workers each; Ray drivers run on `ray_python`.
    pub fn new(address_capacity: usize, ray_python: PathBuf) -> Arc<Self> {
        Arc::new(WorkerPools {
            directory: Arc::new(PoolDirectory::new(address_capacity)),
            ray_python,
        })
    }

    /// The pools known now.
    pub fn directory(&self) -> &Arc<PoolDirectory> {
        &self.directory
    }

    /// Adds `spec` and starts following its pools (in the background: a
    /// name resolves, a Ray cluster's nodes report, soon after).
    pub fn add(&self, spec: PoolSpec) -> Result<(), PoolError> {
        let stop = self.directory.insert(spec.clone())?;
        let directory = Arc::downgrade(&self.directory);
        tracing::info!(spec = %spec, "worker pools added");
        match spec.target.clone() {
            PoolTarget::Address { host, port } => {
                tokio::spawn(dns::follow(directory, spec, host, port, stop));
            }
            PoolTarget::Ray { address } => {
                let python = self.ray_python.clone();
                tokio::spawn(ray::follow(directory, spec, address, python, stop));
            }
        }
        Ok(())
    }

    /// Removes the spec written `text` (as [`PoolSpec`] displays it): no
    /// new worker goes to its pools, and their workers are replaced
    /// elsewhere. Whether it was known.
    pub fn remove(&self, text: &str) -> bool {
        let removed = self.directory.remove(text);
        if removed {
            tracing::info!(spec = %text, "worker pools removed");
        }
        removed
    }
}
