//! BeamFnControl: the Control stream (instructions out, responses in) and
//! GetProcessBundleDescriptor.

use std::sync::Arc;

use futures::StreamExt;
use refract_proto::fn_api::beam_fn_control_server::BeamFnControl;
use refract_proto::fn_api::{
    GetProcessBundleDescriptorRequest, InstructionRequest, InstructionResponse,
    ProcessBundleDescriptor,
};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::BoxStream;
use crate::hub::{Hub, WORKER_ID_HEADER};
use crate::link::WorkerLink;

/// Serves BeamFnControl for all workers.
pub(crate) struct ControlService {
    hub: Arc<Hub>,
}

impl ControlService {
    /// A service over `hub`.
    pub(crate) fn new(hub: Arc<Hub>) -> Self {
        Self { hub }
    }
}

#[tonic::async_trait]
impl BeamFnControl for ControlService {
    type ControlStream = BoxStream<InstructionRequest>;

    async fn control(
        &self,
        request: Request<Streaming<InstructionResponse>>,
    ) -> Result<Response<Self::ControlStream>, Status> {
        let link = self.hub.link_for(&request)?;
        let outgoing = link.attach_control().ok_or_else(|| {
            Status::failed_precondition(format!(
                "worker {} already has a control stream, or was stopped",
                link.id()
            ))
        })?;
        tracing::info!(worker_id = %link.id(), "control stream connected");
        tokio::spawn(read_responses(Arc::clone(&link), request.into_inner()));
        let stream = UnboundedReceiverStream::new(outgoing)
            .map(Ok)
            .take_until(link.closed());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_process_bundle_descriptor(
        &self,
        request: Request<GetProcessBundleDescriptorRequest>,
    ) -> Result<Response<ProcessBundleDescriptor>, Status> {
        // The TypeScript SDK asks without its `worker_id` header. A
        // descriptor's id holds its job's random id, so a caller must
        // know the job already; a header that is there must name a worker.
        let worker = match request.metadata().get(WORKER_ID_HEADER) {
            Some(_) => Some(self.hub.link_for(&request)?.id().to_string()),
            None => None,
        };
        let id = &request.get_ref().process_bundle_descriptor_id;
        tracing::debug!(worker_id = ?worker, descriptor_id = %id, "descriptor requested");
        self.hub
            .descriptor(id)
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("unknown process bundle descriptor {id:?}")))
    }
}

/// Reads InstructionResponses until the stream ends, then closes the worker:
/// without a control stream no instruction in flight can ever finish.
async fn read_responses(link: Arc<WorkerLink>, mut incoming: Streaming<InstructionResponse>) {
    let reason = loop {
        match incoming.message().await {
            Ok(Some(response)) => link.inflight().on_response(response),
            Ok(None) => break super::stream_ended("control", link.id()),
            Err(status) => {
                break format!(
                    "control stream of worker {} failed: {}",
                    link.id(),
                    status.message()
                )
            }
        }
    };
    link.close(&reason);
}
