//! `ArtifactStagingService.ReverseArtifactRetrievalService`: the server-driven
//! protocol by which a client hands over the artifacts its environments
//! depend on.
//!
//! The client opens the stream and sends its staging token; from then on the
//! server asks and the client answers. For each distinct dependency the
//! server sends one `get_artifact` request and reads `get_artifact_response`
//! chunks until a message with `is_last`, streaming them to disk. When
//! everything is stored the server closes its side, which is what ends the
//! client's loop: a server that forgot to close would hang the client.

use std::sync::Arc;

use refract_proto::job_api::artifact_request_wrapper::Request;
use refract_proto::job_api::artifact_response_wrapper::Response;
use refract_proto::job_api::artifact_staging_service_server::ArtifactStagingService;
use refract_proto::job_api::{ArtifactRequestWrapper, ArtifactResponseWrapper, GetArtifactRequest};
use refract_proto::pipeline::ArtifactInformation;
use refract_proto::tonic::{
    self, Request as GrpcRequest, Response as GrpcResponse, Status, Streaming,
};
use refract_proto::urns;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::artifacts::{declared_sha256, describe, StagedFile};
use crate::job::Job;
use crate::registry::JobRegistry;

/// Why staging stopped before every artifact was stored.
#[derive(Debug, thiserror::Error)]
enum StagingError {
    #[error("client closed the stream before sending all of {artifact}")]
    ClientClosed { artifact: String },
    #[error("client stream failed while sending {artifact}: {status}")]
    Client { artifact: String, status: Status },
    #[error("client stopped reading requests")]
    ClientGone,
    #[error("unexpected message while receiving {artifact}: {what}")]
    Protocol {
        artifact: String,
        what: &'static str,
    },
    #[error("cannot store {artifact}: {source}")]
    Io {
        artifact: String,
        source: std::io::Error,
    },
    #[error(
        "staging {artifact} would pass the {limit} bytes a job may stage \
         (--max_staged_bytes)"
    )]
    TooLarge { artifact: String, limit: u64 },
    #[error("{artifact} has sha256 {actual}, but {expected} was declared")]
    Checksum {
        artifact: String,
        expected: String,
        actual: String,
    },
    #[error("job service is shutting down")]
    ShuttingDown,
}

impl StagingError {
    fn status(&self) -> Status {
        match self {
            Self::Protocol { .. } | Self::Checksum { .. } => {
                Status::invalid_argument(self.to_string())
            }
            Self::TooLarge { .. } => Status::resource_exhausted(self.to_string()),
            Self::Io { .. } => Status::internal(self.to_string()),
            Self::ShuttingDown => Status::unavailable(self.to_string()),
            Self::ClientClosed { .. } | Self::Client { .. } | Self::ClientGone => {
                Status::aborted(self.to_string())
            }
        }
    }
}

/// The staging service; shares the job table with the job service.
pub(crate) struct StagingService {
    registry: Arc<JobRegistry>,
    shutdown: watch::Receiver<bool>,
    /// Bytes one job may stage in all.
    max_job_bytes: u64,
}

impl StagingService {
    pub(crate) fn new(
        registry: Arc<JobRegistry>,
        shutdown: watch::Receiver<bool>,
        max_job_bytes: u64,
    ) -> Self {
        Self {
            registry,
            shutdown,
            max_job_bytes,
        }
    }
}

type Outbound = mpsc::Sender<Result<ArtifactRequestWrapper, Status>>;

#[tonic::async_trait]
impl ArtifactStagingService for StagingService {
    type ReverseArtifactRetrievalServiceStream =
        ReceiverStream<Result<ArtifactRequestWrapper, Status>>;

    async fn reverse_artifact_retrieval_service(
        &self,
        request: GrpcRequest<Streaming<ArtifactResponseWrapper>>,
    ) -> Result<GrpcResponse<Self::ReverseArtifactRetrievalServiceStream>, Status> {
        let mut inbound = request.into_inner();
        let mut shutdown = self.shutdown.clone();
        let first = tokio::select! {
            first = inbound.message() => first,
            _ = shutdown.wait_for(|stop| *stop) => {
                return Err(reject(Status::unavailable("job service is shutting down")));
            }
        };
        let first = match first {
            Ok(Some(first)) => first,
            Ok(None) => {
                return Err(reject(Status::invalid_argument(
                    "staging stream closed before the staging token was sent",
                )))
            }
            Err(status) => return Err(reject(status)),
        };
        if first.staging_token.is_empty() {
            return Err(reject(Status::invalid_argument(
                "the first staging message must carry the staging token",
            )));
        }
        let Some(job) = self.registry.get(&first.staging_token) else {
            return Err(reject(Status::not_found(format!(
                "no job with staging token {:?}",
                first.staging_token
            ))));
        };
        job.begin_staging()
            .map_err(|text| reject(Status::failed_precondition(text)))?;

        let (tx, rx) = mpsc::channel(4);
        let budget = self.max_job_bytes;
        tokio::spawn(async move { run_staging(job, inbound, tx, shutdown, budget).await });
        Ok(GrpcResponse::new(ReceiverStream::new(rx)))
    }
}

fn reject(status: Status) -> Status {
    tracing::info!(code = ?status.code(), message = status.message(), "rejected artifact staging");
    status
}

/// Stages everything, then closes the stream (by dropping `tx`), with an
/// error status if staging failed.
async fn run_staging(
    job: Arc<Job>,
    mut inbound: Streaming<ArtifactResponseWrapper>,
    tx: Outbound,
    mut shutdown: watch::Receiver<bool>,
    max_bytes: u64,
) {
    let pending = job.artifacts().pending();
    tracing::info!(job_id = %job.id(), artifacts = pending.len(), "staging artifacts");
    let (mut bytes, mut reused) = (0u64, 0usize);
    let mut outcome = Ok(());
    for artifact in &pending {
        if artifact.type_urn == urns::artifact::DEFERRED {
            // Python's SDK resolves these at expansion; Go's sends them
            // on, and cannot give them. A worker pool in the expansion
            // service (the usual EXTERNAL alternative) has the files
            // already; a worker started here that needs one fails saying
            // it was not staged.
            tracing::info!(
                job_id = %job.id(),
                artifact = %describe(artifact),
                "not staged: a deferred artifact only its expansion service can give"
            );
            continue;
        }
        if let Some(file) = job.artifacts().reuse(artifact).await {
            tracing::debug!(
                job_id = %job.id(),
                artifact = %describe(artifact),
                path = %file.path.display(),
                "reused a stored artifact"
            );
            reused += 1;
            job.artifacts().record(artifact, file);
            continue;
        }
        let left = max_bytes.saturating_sub(bytes);
        match fetch(
            &job,
            artifact,
            &mut inbound,
            &tx,
            &mut shutdown,
            (left, max_bytes),
        )
        .await
        {
            Ok(file) => {
                tracing::debug!(
                    job_id = %job.id(),
                    artifact = %describe(artifact),
                    path = %file.path.display(),
                    len = file.len,
                    "staged artifact"
                );
                bytes += file.len;
                job.artifacts().share(&file).await;
                job.artifacts().record(artifact, file);
            }
            Err(error) => {
                outcome = Err(error);
                break;
            }
        }
    }
    match outcome {
        Ok(()) => {
            tracing::info!(
                job_id = %job.id(),
                artifacts = pending.len(),
                reused,
                bytes,
                "artifacts staged"
            );
            job.finish_staging(Ok(()));
        }
        Err(error) => {
            let text = format!("artifact staging failed: {error}");
            tracing::warn!(job_id = %job.id(), "{text}");
            // The client may be gone already; nothing more to do then.
            let _ = tx.send(Err(error.status())).await;
            job.finish_staging(Err(text.clone()));
            job.fail(text);
        }
    }
    // Dropping `tx` here closes the server's side of the stream.
}

/// Requests one artifact and streams its chunks to disk, refusing it once
/// it passes the `(left, limit)` bytes the job may still stage.
async fn fetch(
    job: &Job,
    artifact: &ArtifactInformation,
    inbound: &mut Streaming<ArtifactResponseWrapper>,
    tx: &Outbound,
    shutdown: &mut watch::Receiver<bool>,
    budget: (u64, u64),
) -> Result<StagedFile, StagingError> {
    let name = describe(artifact);
    let request = ArtifactRequestWrapper {
        request: Some(Request::GetArtifact(GetArtifactRequest {
            artifact: Some(artifact.clone()),
        })),
    };
    tx.send(Ok(request))
        .await
        .map_err(|_| StagingError::ClientGone)?;

    let mut writer = job
        .artifacts()
        .writer()
        .await
        .map_err(|source| StagingError::Io {
            artifact: name.clone(),
            source,
        })?;
    let received = receive_chunks(&name, &mut writer, inbound, shutdown, budget).await;
    if let Err(error) = received {
        writer.abandon().await;
        return Err(error);
    }
    let file = writer.finish().await.map_err(|source| StagingError::Io {
        artifact: name.clone(),
        source,
    })?;
    if let Some(expected) = declared_sha256(artifact) {
        if expected != file.sha256 {
            return Err(StagingError::Checksum {
                artifact: name,
                expected,
                actual: file.sha256,
            });
        }
    }
    Ok(file)
}

/// Writes `get_artifact_response` chunks until the `is_last` message.
async fn receive_chunks(
    name: &str,
    writer: &mut crate::artifacts::ArtifactWriter,
    inbound: &mut Streaming<ArtifactResponseWrapper>,
    shutdown: &mut watch::Receiver<bool>,
    (left, limit): (u64, u64),
) -> Result<(), StagingError> {
    let mut received = 0u64;
    loop {
        let message = tokio::select! {
            message = inbound.message() => message,
            _ = shutdown.wait_for(|stop| *stop) => return Err(StagingError::ShuttingDown),
        };
        let message = match message {
            Ok(Some(message)) => message,
            Ok(None) => {
                return Err(StagingError::ClientClosed {
                    artifact: name.to_string(),
                })
            }
            Err(status) => {
                return Err(StagingError::Client {
                    artifact: name.to_string(),
                    status,
                })
            }
        };
        match message.response {
            Some(Response::GetArtifactResponse(chunk)) => {
                received += chunk.data.len() as u64;
                if received > left {
                    return Err(StagingError::TooLarge {
                        artifact: name.to_string(),
                        limit,
                    });
                }
                writer
                    .write(&chunk.data)
                    .await
                    .map_err(|source| StagingError::Io {
                        artifact: name.to_string(),
                        source,
                    })?;
            }
            Some(Response::ResolveArtifactResponse(_)) => {
                return Err(StagingError::Protocol {
                    artifact: name.to_string(),
                    what: "a resolve_artifact_response that was not requested",
                })
            }
            None if message.is_last => {}
            None => {
                return Err(StagingError::Protocol {
                    artifact: name.to_string(),
                    what: "a message with neither data nor is_last",
                })
            }
        }
        if message.is_last {
            return Ok(());
        }
    }
}
