//! EXTERNAL (and LOOPBACK) environments: ask a BeamFnExternalWorkerPool to
//! start a harness that connects back to us.

use std::time::Duration;

use prost::Message;
use refract_proto::fn_api::beam_fn_external_worker_pool_client::BeamFnExternalWorkerPoolClient;
use refract_proto::fn_api::{StartWorkerRequest, StopWorkerRequest};
use refract_proto::pipeline::{ApiServiceDescriptor, ExternalPayload};
use refract_proto::urns;
use tonic::transport::{Channel, Endpoint};

use crate::error::HarnessError;
use crate::pool_token::PoolToken;

/// How long StopWorker may take before we give up on it.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest a StartWorker call (connecting included) may take: pools
/// answer once they have launched the worker, so a pool taking longer is
/// on a host that is gone or cut off, and another pool should be asked.
const START_CALL_LIMIT: Duration = Duration::from_secs(30);

/// The longest connecting to a pool may take. A TCP handshake with a live
/// host takes milliseconds, a lost SYN is resent after 1 s and 3 s; a host
/// that answers none of them within this is gone or cut off, and the
/// worker should start on another pool rather than wait for it.
const POOL_CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// HTTP/2 pings on a pool connection, so a call to a host that vanished
/// mid-call fails instead of hanging.
const POOL_KEEPALIVE: Duration = Duration::from_secs(5);

/// A worker started by a pool.
pub(crate) struct ExternalWorker {
    worker_id: String,
    pool_url: String,
    token: Option<PoolToken>,
}

/// Calls StartWorker on the pool named in the payload.
pub(crate) async fn start(
    payload: &[u8],
    worker_id: &str,
    url: &str,
    timeout: Duration,
    token: Option<PoolToken>,
) -> Result<ExternalWorker, HarnessError> {
    let payload = ExternalPayload::decode(payload).map_err(|e| HarnessError::InvalidPayload {
        urn: urns::env::EXTERNAL.to_string(),
        reason: e.to_string(),
    })?;
    let pool_url = payload
        .endpoint
        .map(|e| e.url)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| HarnessError::InvalidPayload {
            urn: urns::env::EXTERNAL.to_string(),
            reason: "the payload names no worker pool endpoint".to_string(),
        })?;
    let start_error = |reason: String| HarnessError::WorkerStart {
        worker_id: worker_id.to_string(),
        reason,
    };
    let timeout = timeout.min(START_CALL_LIMIT);
    let mut client = connect(&pool_url, timeout.min(POOL_CONNECT_LIMIT))
        .await
        .map_err(|e| start_error(format!("cannot reach the worker pool at {pool_url}: {e}")))?;
    let endpoint = || {
        Some(ApiServiceDescriptor {
            url: url.to_string(),
            authentication: None,
        })
    };
    let request = StartWorkerRequest {
        worker_id: worker_id.to_string(),
        control_endpoint: endpoint(),
        logging_endpoint: endpoint(),
        artifact_endpoint: endpoint(),
        provision_endpoint: endpoint(),
        params: payload.params,
    };
    let mut request = tonic::Request::new(request);
    if let Some(token) = &token {
        token.attach(&mut request);
    }
    tracing::info!(worker_id, pool = %pool_url, "starting worker through the worker pool");
    let response = tokio::time::timeout(timeout, client.start_worker(request))
        .await
        .map_err(|_| {
            start_error(format!(
                "StartWorker at {pool_url} took longer than {timeout:?}"
            ))
        })?
        .map_err(|status| {
            start_error(format!(
                "StartWorker at {pool_url} failed: {}",
                status.message()
            ))
        })?
        .into_inner();
    if !response.error.is_empty() {
        return Err(start_error(format!(
            "the worker pool at {pool_url} reported: {}",
            response.error
        )));
    }
    Ok(ExternalWorker {
        worker_id: worker_id.to_string(),
        pool_url,
        token,
    })
}

impl ExternalWorker {
    /// Asks the pool to stop the worker; failures are logged, not returned,
    /// since the worker is being discarded anyway.
    pub(crate) async fn stop(self) {
        let call = async {
            let mut client = connect(&self.pool_url, POOL_CONNECT_LIMIT).await?;
            let mut request = tonic::Request::new(StopWorkerRequest {
                worker_id: self.worker_id.clone(),
            });
            if let Some(token) = &self.token {
                token.attach(&mut request);
            }
            let response = client
                .stop_worker(request)
                .await
                .map_err(|s| s.message().to_string())?
                .into_inner();
            if response.error.is_empty() {
                Ok(())
            } else {
                Err(response.error)
            }
        };
        match tokio::time::timeout(STOP_TIMEOUT, call).await {
            Ok(Ok(())) => {
                tracing::debug!(worker_id = %self.worker_id, "worker pool stopped the worker")
            }
            Ok(Err(e)) => {
                tracing::warn!(worker_id = %self.worker_id, pool = %self.pool_url, error = %e, "StopWorker failed")
            }
            Err(_) => {
                tracing::warn!(worker_id = %self.worker_id, pool = %self.pool_url, "StopWorker timed out")
            }
        }
    }
}

/// A client for the pool at `url` (`host:port`, or a full `http://` URL).
async fn connect(
    url: &str,
    timeout: Duration,
) -> Result<BeamFnExternalWorkerPoolClient<Channel>, String> {
    let channel = Endpoint::from_shared(refract_proto::endpoint::endpoint_uri(url))
        .map_err(|e| e.to_string())?
        .connect_timeout(timeout)
        .http2_keep_alive_interval(POOL_KEEPALIVE)
        .keep_alive_timeout(POOL_KEEPALIVE)
        .keep_alive_while_idle(true)
        .connect()
        .await
        .map_err(|e| format!("{e} ({:?})", std::error::Error::source(&e)))?;
    Ok(BeamFnExternalWorkerPoolClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX))
}
