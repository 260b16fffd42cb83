//! BeamFnState: every StateRequest is answered, with its id, by the state
//! handler of the bundle named in its `instruction_id`.
//!
//! Requests of one stream are answered in arrival order on one task: the SDK
//! pipelines appends and clears, so a later get must see them. Handlers answer
//! from memory and must not wait; a stream never holds a thread of its own
//! (a thread per stream ran out once workers that the runner had stopped kept
//! their streams open).

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
        let (response_tx, response_rx) = mpsc::unbounded_channel();
        // Requests are answered in order on this task (answers come from
        // in-memory state and never wait). It ends with the worker's stream,
        // or with the link: a worker the runner stopped may keep its streams
        // open (Java's worker pool does), and must not keep this task.
        tokio::spawn(async move {
            let closed = link.clone().closed();
            tokio::pin!(closed);
            loop {
                let message = tokio::select! {
                    message = incoming.message() => message,
                    _ = &mut closed => break,
                };
                match message {
                    Ok(Some(request)) => {
                        if response_tx.send(answer(&link, &request)).is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(worker_id = %link.id(), error = %status, "state stream failed");
                        break;
                    }
                }
            }
        });
        let stream = UnboundedReceiverStream::new(response_rx).map(Ok);
        Ok(Response::new(Box::pin(stream)))
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
