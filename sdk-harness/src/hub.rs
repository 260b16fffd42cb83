//! The registry behind the shared server: workers by id, bundle descriptors
//! by id, and the routing of each incoming call through its `worker_id`
//! metadata header.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use refract_proto::fn_api::ProcessBundleDescriptor;
use tonic::{Request, Status};

use crate::error::HarnessError;
use crate::link::WorkerLink;

/// The metadata key every SDK call carries (set by the SDK's worker-id interceptor).
pub(crate) const WORKER_ID_HEADER: &str = "worker_id";

/// Workers and descriptors known to the server.
#[derive(Default)]
pub(crate) struct Hub {
    workers: RwLock<HashMap<String, Arc<WorkerLink>>>,
    descriptors: RwLock<HashMap<String, ProcessBundleDescriptor>>,
}

impl Hub {
    /// Adds a worker; its id must be new.
    pub(crate) fn add(&self, link: Arc<WorkerLink>) -> Result<(), HarnessError> {
        let mut workers = self.workers.write();
        if workers.contains_key(link.id()) {
            return Err(HarnessError::DuplicateWorker(link.id().to_string()));
        }
        workers.insert(link.id().to_string(), link);
        Ok(())
    }

    /// Removes a worker, but only if `link` is still the one registered.
    pub(crate) fn remove(&self, link: &Arc<WorkerLink>) {
        let mut workers = self.workers.write();
        if workers
            .get(link.id())
            .is_some_and(|current| Arc::ptr_eq(current, link))
        {
            workers.remove(link.id());
        }
    }

    /// The worker a call comes from, by its `worker_id` header.
    // `Status` is large, but it is what every tonic handler returns.
    #[allow(clippy::result_large_err)]
    pub(crate) fn link_for<T>(&self, request: &Request<T>) -> Result<Arc<WorkerLink>, Status> {
        let id = request
            .metadata()
            .get(WORKER_ID_HEADER)
            .ok_or_else(|| Status::invalid_argument("missing worker_id metadata header"))?
            .to_str()
            .map_err(|_| Status::invalid_argument("worker_id metadata header is not ASCII"))?;
        self.workers
            .read()
            .get(id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("unknown worker id {id:?}")))
    }

    /// Stores a descriptor for GetProcessBundleDescriptor.
    pub(crate) fn register_descriptor(&self, descriptor: ProcessBundleDescriptor) {
        let mut descriptors = self.descriptors.write();
        if let Some(old) = descriptors.get(&descriptor.id) {
            if *old != descriptor {
                tracing::error!(
                    descriptor_id = %descriptor.id,
                    "descriptor id re-registered with different content; SDKs that cached the old one will not see the change"
                );
            }
        }
        descriptors.insert(descriptor.id.clone(), descriptor);
    }

    /// Drops a descriptor no worker will ask for again.
    pub(crate) fn forget_descriptor(&self, id: &str) {
        self.descriptors.write().remove(id);
    }

    /// A registered descriptor.
    pub(crate) fn descriptor(&self, id: &str) -> Option<ProcessBundleDescriptor> {
        self.descriptors.read().get(id).cloned()
    }
}
