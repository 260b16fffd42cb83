//! BeamFnState: every StateRequest is answered, with its id, by the state
//! handler of the bundle named in its `instruction_id`.
//!
//! Requests of one stream are answered in arrival order on one blocking
//! thread: the SDK pipelines appends and clears, so a later get must see them,
//! and handlers may block (disk-backed state).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use futures::StreamExt;
use refract_proto::fn_api::beam_fn_state_server::BeamFnState;
use refract_proto::fn_api::{StateRequest, StateResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::BoxStream;
use crate::hub::Hub;
use crate::link::WorkerLink;

/// Serves BeamFnState for all workers.
pub(crate) struct StateService {
    hub: Arc<Hub>,
}

impl StateService {
    /// A service over `hub`.
    pub(crate) fn new(hub: Arc<Hub>) -> Self {
        Self { hub }
    }
}

#[tonic::async_trait]
impl BeamFnState for StateService {
    type StateStream = BoxStream<StateResponse>;

    async fn state(
        &self,
        request: Request<Streaming<StateRequest>>,
    ) -> Result<Response<Self::StateStream>, Status> {
        let link = self.hub.link_for(&request)?;
        tracing::info!(worker_id = %link.id(), "state stream connected");
        let mut incoming = request.into_inner();
        let (request_tx, request_rx) = mpsc::unbounded_channel();
        let (response_tx, response_rx) = mpsc::unbounded_channel();
        let worker_id = link.id().to_string();
        tokio::task::spawn_blocking(move || answer_all(&link, request_rx, &response_tx));
        tokio::spawn(async move {
            loop {
                match incoming.message().await {
                    Ok(Some(request)) => {
                        if request_tx.send(request).is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(worker_id, error = %status, "state stream failed");
                        break;
                    }
                }
            }
        });
        let stream = UnboundedReceiverStream::new(response_rx).map(Ok);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Answers requests in order until the incoming side ends.
fn answer_all(
    link: &WorkerLink,
    mut requests: mpsc::UnboundedReceiver<StateRequest>,
    responses: &mpsc::UnboundedSender<StateResponse>,
) {
    while let Some(request) = requests.blocking_recv() {
        let response = answer(link, &request);
        if responses.send(response).is_err() {
            break;
        }
    }
}

/// One answer; never silence (a missing answer hangs the SDK's bundle).
fn answer(link: &WorkerLink, request: &StateRequest) -> StateResponse {
    let mut response = match link.inflight().state_handler(&request.instruction_id) {
        Some(handler) => {
            catch_unwind(AssertUnwindSafe(|| handler.handle(request))).unwrap_or_else(|_| {
                tracing::error!(
                    worker_id = %link.id(),
                    instruction_id = %request.instruction_id,
                    "state handler panicked"
                );
                error_response("the runner's state handler failed on this request")
            })
        }
        None => error_response(&format!(
            "no bundle with instruction id {:?} is in flight on worker {}",
            request.instruction_id,
            link.id()
        )),
    };
    if response.id != request.id {
        if !response.id.is_empty() {
            tracing::warn!(
                worker_id = %link.id(),
                expected = %request.id,
                got = %response.id,
                "state handler set a wrong response id; replacing it"
            );
        }
        response.id.clone_from(&request.id);
    }
    response
}

fn error_response(message: &str) -> StateResponse {
    StateResponse {
        id: String::new(),
        error: message.to_string(),
        response: None,
    }
}
