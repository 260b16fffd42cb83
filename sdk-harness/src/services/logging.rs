//! BeamFnLogging: log entries from a worker go to that worker's LogSink.

use std::sync::Arc;

use refract_proto::fn_api::beam_fn_logging_server::BeamFnLogging;
use refract_proto::fn_api::{log_entry, LogControl};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::BoxStream;
use crate::hub::Hub;

/// Serves BeamFnLogging for all workers.
pub(crate) struct LoggingService {
    hub: Arc<Hub>,
}

impl LoggingService {
    /// A service over `hub`.
    pub(crate) fn new(hub: Arc<Hub>) -> Self {
        Self { hub }
    }
}

#[tonic::async_trait]
impl BeamFnLogging for LoggingService {
    type LoggingStream = BoxStream<LogControl>;

    async fn logging(
        &self,
        request: Request<Streaming<log_entry::List>>,
    ) -> Result<Response<Self::LoggingStream>, Status> {
        let link = self.hub.link_for(&request)?;
        let mut incoming = request.into_inner();
        // We never send LogControl; the sender only lives as long as the
        // incoming stream, so our side ends when the SDK's side does.
        let (keep_open, closed) = mpsc::channel::<Result<LogControl, Status>>(1);
        tokio::spawn(async move {
            let _keep_open = keep_open;
            loop {
                match incoming.message().await {
                    Ok(Some(list)) => {
                        for entry in list.log_entries {
                            link.logs().log(link.id(), entry);
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(worker_id = %link.id(), error = %status, "logging stream failed");
                        break;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(closed))))
    }
}
