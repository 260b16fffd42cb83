//! `Prepare` requests wait for a planning turn before their bytes are
//! read. tonic decodes a request before its handler runs, so a limit taken
//! in the handler comes too late: a burst of large `Prepare`s would each be
//! buffered and decoded (up to the message limit, hundreds of MiB) while
//! they wait. [`DecodeGate`] wraps the Job API's gRPC service and takes the
//! turn first; a waiting request's bytes stay in its HTTP/2 stream's
//! flow-control window (64 KiB) until then.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use refract_proto::tonic::body::BoxBody;
use refract_proto::tonic::codegen::{http, BoxFuture, Service};
use refract_proto::tonic::server::NamedService;

use crate::planning::PlanningSlots;

/// The one method gated: its request holds a whole pipeline.
const PREPARE_PATH: &str = "/org.apache.beam.model.job_management.v1.JobService/Prepare";

/// A gRPC service whose `Prepare` calls run, decoding included, only with
/// a planning turn.
#[derive(Debug, Clone)]
pub(crate) struct DecodeGate<S> {
    inner: S,
    slots: Arc<PlanningSlots>,
}

impl<S> DecodeGate<S> {
    /// `inner`, gated by `slots`.
    pub(crate) fn new(inner: S, slots: Arc<PlanningSlots>) -> Self {
        DecodeGate { inner, slots }
    }
}

impl<S, B> Service<http::Request<B>> for DecodeGate<S>
where
    S: Service<http::Request<B>, Response = http::Response<BoxBody>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<BoxBody>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != PREPARE_PATH {
            return Box::pin(self.inner.call(request));
        }
        // The service polled ready is the one to call; a clone stays.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let slots = Arc::clone(&self.slots);
        Box::pin(async move {
            let turn = match slots.turn().await {
                Ok(turn) => turn,
                Err(status) => {
                    tracing::warn!(error = %status.message(), "Prepare refused");
                    return Ok(status.into_http());
                }
            };
            let response = inner.call(request).await;
            drop(turn);
            response
        })
    }
}

impl<S: NamedService> NamedService for DecodeGate<S> {
    const NAME: &'static str = S::NAME;
}
