//! BeamFnData: bundle input out (queued until the SDK connects), outputs and
//! timers in, routed to their bundles.

use std::sync::Arc;

use futures::StreamExt;
use refract_proto::fn_api::beam_fn_data_server::BeamFnData;
use refract_proto::fn_api::Elements;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::BoxStream;
use crate::hub::Hub;
use crate::link::WorkerLink;

/// Serves BeamFnData for all workers.
pub(crate) struct DataService {
    hub: Arc<Hub>,
}

impl DataService {
    /// A service over `hub`.
    pub(crate) fn new(hub: Arc<Hub>) -> Self {
        Self { hub }
    }
}

#[tonic::async_trait]
impl BeamFnData for DataService {
    type DataStream = BoxStream<Elements>;

    async fn data(
        &self,
        request: Request<Streaming<Elements>>,
    ) -> Result<Response<Self::DataStream>, Status> {
        let link = self.hub.link_for(&request)?;
        let outgoing = link.attach_data().ok_or_else(|| {
            Status::failed_precondition(format!(
                "worker {} already has a data stream, or was stopped",
                link.id()
            ))
        })?;
        tracing::info!(worker_id = %link.id(), "data stream connected");
        tokio::spawn(read_elements(Arc::clone(&link), request.into_inner()));
        let stream = ReceiverStream::new(outgoing)
            .map(Ok)
            .take_until(link.closed());
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Routes incoming output data and timers until the stream ends. The data
/// queue cannot be re-attached, so an ended stream means the worker can no
/// longer run bundles: close it.
async fn read_elements(link: Arc<WorkerLink>, mut incoming: Streaming<Elements>) {
    let reason = loop {
        match incoming.message().await {
            Ok(Some(elements)) => link.inflight().on_elements(elements),
            Ok(None) => break super::stream_ended("data", link.id()),
            Err(status) => {
                break format!(
                    "data stream of worker {} failed: {}",
                    link.id(),
                    status.message()
                )
            }
        }
    };
    link.close(&reason);
}
