//! ProvisionService: a worker's boot program asks for its ProvisionInfo.

use std::sync::Arc;

use refract_proto::fn_api::provision_service_server::ProvisionService;
use refract_proto::fn_api::{GetProvisionInfoRequest, GetProvisionInfoResponse};
use tonic::{Request, Response, Status};

use crate::hub::Hub;

/// Serves ProvisionService for all workers.
pub(crate) struct ProvisionServiceImpl {
    hub: Arc<Hub>,
}

impl ProvisionServiceImpl {
    /// A service over `hub`.
    pub(crate) fn new(hub: Arc<Hub>) -> Self {
        Self { hub }
    }
}

#[tonic::async_trait]
impl ProvisionService for ProvisionServiceImpl {
    async fn get_provision_info(
        &self,
        request: Request<GetProvisionInfoRequest>,
    ) -> Result<Response<GetProvisionInfoResponse>, Status> {
        let link = self.hub.link_for(&request)?;
        tracing::debug!(worker_id = %link.id(), "provision info requested");
        Ok(Response::new(GetProvisionInfoResponse {
            info: Some(link.provision().clone()),
        }))
    }
}
