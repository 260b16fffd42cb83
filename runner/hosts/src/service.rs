//! The coordinator's side of the control plane: the `ShardHosts` gRPC
//! service. An Attach stream is trusted only once its first message, a
//! Hello, proves the cluster's secret; the host is then in the directory
//! until its stream ends or breaks. A FetchArtifact request names its
//! secret, an open run and a content hash that run staged, and gets
//! nothing else.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use refract_proto::hosts::shard_hosts_server::ShardHosts;
use refract_proto::hosts::{
    host_command, host_message, ArtifactChunk, FetchArtifactRequest, HostCommand, HostMessage,
    Welcome,
};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, warn};

use crate::directory::HostDirectory;

/// How long a new stream may take to say Hello.
const HELLO_WITHIN: Duration = Duration::from_secs(10);

/// The longest name or address a Hello may give, and the longest nonce.
const MAX_HELLO_FIELD: usize = 256;

/// Bytes of a staged file per chunk.
pub(crate) const CHUNK_BYTES: usize = 1 << 20;

/// The service, over one directory.
pub(crate) struct HostsService {
    pub(crate) directory: Arc<HostDirectory>,
}

type Outbound<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl ShardHosts for HostsService {
    type AttachStream = Outbound<HostCommand>;
    type FetchArtifactStream = Outbound<ArtifactChunk>;

    async fn attach(
        &self,
        request: Request<Streaming<HostMessage>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(HELLO_WITHIN, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no Hello within 10 s"))??;
        let Some(HostMessage {
            body: Some(host_message::Body::Hello(hello)),
        }) = first
        else {
            return Err(Status::invalid_argument(
                "the first message of an Attach stream is a Hello",
            ));
        };
        if !self.directory.secret().matches(&hello.secret) {
            warn!(name = %short(&hello.name), "a shard host with the wrong secret was refused");
            return Err(Status::unauthenticated(
                "the cluster secret does not match the coordinator's",
            ));
        }
        if hello.name.len() > MAX_HELLO_FIELD
            || hello.exchange_address.len() > MAX_HELLO_FIELD
            || hello.nonce.len() > MAX_HELLO_FIELD
            || hello.exchange_address.is_empty()
        {
            return Err(Status::invalid_argument(
                "a Hello's name, exchange address and nonce hold 1 to 256 bytes",
            ));
        }
        let (id, commands) = self
            .directory
            .attach(hello.name.clone(), hello.exchange_address.clone());
        let directory = self.directory.clone();
        tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(HostMessage {
                        body: Some(host_message::Body::Report(report)),
                    })) => directory.report(id, report).await,
                    Ok(Some(_)) => {
                        warn!(host = %id, "a shard host sent a second Hello; dropping it");
                        break;
                    }
                    Ok(None) => break,
                    Err(status) => {
                        debug!(host = %id, %status, "a shard host's stream broke");
                        break;
                    }
                }
            }
            directory.detach(id);
        });
        let welcome = HostCommand {
            body: Some(host_command::Body::Welcome(Welcome {
                host: id.number(),
                proof: self.directory.secret().proof(&hello.nonce),
            })),
        };
        let outbound = tokio_stream::once(welcome)
            .chain(ReceiverStream::new(commands))
            .map(Ok);
        Ok(Response::new(Box::pin(outbound)))
    }

    async fn fetch_artifact(
        &self,
        request: Request<FetchArtifactRequest>,
    ) -> Result<Response<Self::FetchArtifactStream>, Status> {
        let request = request.into_inner();
        if !self.directory.secret().matches(&request.secret) {
            return Err(Status::unauthenticated(
                "the cluster secret does not match the coordinator's",
            ));
        }
        let path = self
            .directory
            .staged_file(&request.run, &request.sha256)
            .ok_or_else(|| Status::not_found("no such staged file of an open run"))?;
        let mut file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| Status::unavailable(format!("the staged file cannot be read: {e}")))?;
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                let mut chunk = vec![0u8; CHUNK_BYTES];
                match file.read(&mut chunk).await {
                    Ok(0) => return,
                    Ok(n) => {
                        chunk.truncate(n);
                        if tx.send(Ok(ArtifactChunk { data: chunk })).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx
                            .send(Err(Status::unavailable(format!(
                                "reading the staged file: {e}"
                            ))))
                            .await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// At most 64 bytes of `text`, for a log line about a stranger.
fn short(text: &str) -> &str {
    let mut end = text.len().min(64);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
