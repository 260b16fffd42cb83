//! ArtifactRetrievalService: a worker's boot program downloads the
//! environment's dependencies, streamed from the files the worker's
//! ArtifactSource names.

use std::sync::Arc;

use refract_proto::job_api::artifact_retrieval_service_server::ArtifactRetrievalService;
use refract_proto::job_api::{
    GetArtifactRequest, GetArtifactResponse, ResolveArtifactsRequest, ResolveArtifactsResponse,
};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::BoxStream;
use crate::hub::Hub;

/// Largest chunk sent in one GetArtifactResponse.
pub(crate) const ARTIFACT_CHUNK_BYTES: usize = 2 << 20;

/// Serves ArtifactRetrievalService for all workers.
pub(crate) struct ArtifactService {
    hub: Arc<Hub>,
}

impl ArtifactService {
    /// A service over `hub`.
    pub(crate) fn new(hub: Arc<Hub>) -> Self {
        Self { hub }
    }
}

#[tonic::async_trait]
impl ArtifactRetrievalService for ArtifactService {
    type GetArtifactStream = BoxStream<GetArtifactResponse>;

    async fn resolve_artifacts(
        &self,
        request: Request<ResolveArtifactsRequest>,
    ) -> Result<Response<ResolveArtifactsResponse>, Status> {
        // Artifacts were resolved when they were staged: a worker's own
        // are echoed, and naming any other is refused, so that a worker
        // learns nothing about what other jobs staged.
        let link = self.hub.link_for(&request)?;
        let artifacts = request.into_inner().artifacts;
        if let Some(unknown) = artifacts
            .iter()
            .find(|a| link.artifacts().open(a).is_none())
        {
            return Err(Status::not_found(format!(
                "worker {} has no artifact {} ({} payload bytes)",
                link.id(),
                unknown.type_urn,
                unknown.type_payload.len()
            )));
        }
        Ok(Response::new(ResolveArtifactsResponse {
            replacements: artifacts,
        }))
    }

    async fn get_artifact(
        &self,
        request: Request<GetArtifactRequest>,
    ) -> Result<Response<Self::GetArtifactStream>, Status> {
        let link = self.hub.link_for(&request)?;
        let artifact = request
            .into_inner()
            .artifact
            .ok_or_else(|| Status::invalid_argument("GetArtifactRequest without an artifact"))?;
        let path = link.artifacts().open(&artifact).ok_or_else(|| {
            Status::not_found(format!(
                "worker {} has no artifact {} ({} payload bytes)",
                link.id(),
                artifact.type_urn,
                artifact.type_payload.len()
            ))
        })?;
        let mut file = tokio::fs::File::open(&path).await.map_err(|e| {
            Status::not_found(format!("cannot open artifact file {}: {e}", path.display()))
        })?;
        tracing::debug!(worker_id = %link.id(), path = %path.display(), "serving artifact");
        let (tx, rx) = mpsc::channel(2);
        tokio::spawn(async move {
            loop {
                let mut chunk = Vec::with_capacity(ARTIFACT_CHUNK_BYTES);
                let read = (&mut file)
                    .take(ARTIFACT_CHUNK_BYTES as u64)
                    .read_to_end(&mut chunk)
                    .await;
                let message = match read {
                    Ok(0) => break,
                    Ok(_) => Ok(GetArtifactResponse { data: chunk }),
                    Err(e) => Err(Status::internal(format!(
                        "reading artifact file {}: {e}",
                        path.display()
                    ))),
                };
                let failed = message.is_err();
                if tx.send(message).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
