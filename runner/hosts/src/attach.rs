//! A shard host's side of the control plane: attaching to the
//! coordinator (and checking that it knows the secret), reporting on
//! runs, and fetching a run's staged files.

use std::io::Write;
use std::path::Path;

use refract_exchange::connection::channel_to_address;
use refract_proto::hosts::shard_hosts_client::ShardHostsClient;
use refract_proto::hosts::{
    host_command, host_message, run_report, FetchArtifactRequest, Hello, HostCommand, HostMessage,
    RunReport,
};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

use crate::error::HostsError;
use crate::secret::ClusterSecret;

/// The most a command from the coordinator may hold: a run's command
/// carries the whole pipeline, which may hold large serialized DoFns.
const MAX_COMMAND: usize = 1 << 30;

/// Reports waiting for the stream to the coordinator.
const REPORTS_IN_FLIGHT: usize = 256;

/// A host's attachment to its coordinator: where its reports go, and how
/// it fetches staged files. Dropping it (with every [`RunReporter`] and
/// the commands) ends the stream, which detaches the host.
#[derive(Debug)]
pub struct Attachment {
    /// The host's number on the coordinator.
    pub host: u64,
    reports: mpsc::Sender<HostMessage>,
    client: ShardHostsClient<Channel>,
    secret: ClusterSecret,
}

/// The coordinator's commands to a host, in order.
pub type Commands = Streaming<HostCommand>;

/// Attaches to the coordinator at `address` as `name`, whose exchange
/// server other shards reach at `exchange_address`: the attachment and
/// the coordinator's commands. Fails unless the coordinator proves it
/// knows `secret`.
pub async fn attach(
    address: &str,
    secret: &ClusterSecret,
    name: &str,
    exchange_address: &str,
) -> Result<(Attachment, Commands), HostsError> {
    let failed = |reason: String| HostsError::Coordinator {
        address: address.to_string(),
        reason,
    };
    let channel = channel_to_address(address).map_err(|e| failed(e.to_string()))?;
    let mut client = ShardHostsClient::new(channel).max_decoding_message_size(MAX_COMMAND);
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).map_err(|e| HostsError::Randomness(e.to_string()))?;
    let (reports, outbound) = mpsc::channel(REPORTS_IN_FLIGHT);
    let hello = HostMessage {
        body: Some(host_message::Body::Hello(Hello {
            secret: secret.as_str().to_string(),
            name: name.to_string(),
            exchange_address: exchange_address.to_string(),
            nonce: nonce.to_vec(),
        })),
    };
    reports
        .send(hello)
        .await
        .map_err(|_| failed("the stream closed before Hello".into()))?;
    let mut commands = client
        .attach(ReceiverStream::new(outbound))
        .await
        .map_err(|status| failed(status.message().to_string()))?
        .into_inner();
    let welcome = commands
        .message()
        .await
        .map_err(|status| failed(status.message().to_string()))?;
    let Some(HostCommand {
        body: Some(host_command::Body::Welcome(welcome)),
    }) = welcome
    else {
        return Err(failed("it did not answer Hello with Welcome".into()));
    };
    if welcome.proof != secret.proof(&nonce) {
        return Err(HostsError::Unauthenticated(format!(
            "the coordinator at {address} does not know the cluster secret; not taking its work"
        )));
    }
    let attachment = Attachment {
        host: welcome.host,
        reports,
        client,
        secret: secret.clone(),
    };
    Ok((attachment, commands))
}

impl Attachment {
    /// Where run `run`'s reports go.
    pub fn reporter(&self, run: &str) -> RunReporter {
        RunReporter {
            run: run.to_string(),
            reports: self.reports.clone(),
        }
    }

    /// Fetches run `run`'s staged file `sha256` (of `len` bytes) into
    /// `dest`, checking its length and hash.
    pub async fn fetch(
        &self,
        run: &str,
        sha256: &str,
        len: u64,
        dest: &Path,
    ) -> Result<(), HostsError> {
        let failed = |reason: String| HostsError::Fetch {
            sha256: sha256.to_string(),
            reason,
        };
        let mut chunks = self
            .client
            .clone()
            .fetch_artifact(FetchArtifactRequest {
                secret: self.secret.as_str().to_string(),
                run: run.to_string(),
                sha256: sha256.to_string(),
            })
            .await
            .map_err(|status| failed(status.message().to_string()))?
            .into_inner();
        let mut file = std::fs::File::create(dest).map_err(|e| failed(e.to_string()))?;
        let mut hash = Sha256::new();
        let mut got = 0u64;
        while let Some(chunk) = chunks
            .message()
            .await
            .map_err(|status| failed(status.message().to_string()))?
        {
            got += chunk.data.len() as u64;
            if got > len {
                return Err(failed(format!(
                    "more than the {len} bytes it was staged with"
                )));
            }
            hash.update(&chunk.data);
            file.write_all(&chunk.data)
                .map_err(|e| failed(e.to_string()))?;
        }
        file.sync_all().map_err(|e| failed(e.to_string()))?;
        let actual = hex::encode(hash.finalize());
        if got != len || actual != sha256 {
            return Err(failed(format!(
                "got {got} bytes hashing to {actual}, not the {len} staged"
            )));
        }
        Ok(())
    }
}

/// Where one run's reports go; cheap to clone.
#[derive(Debug, Clone)]
pub struct RunReporter {
    run: String,
    reports: mpsc::Sender<HostMessage>,
}

impl RunReporter {
    /// Sends `body`, waiting while the stream is full; `false` once the
    /// stream to the coordinator is gone.
    pub async fn send(&self, body: run_report::Body) -> bool {
        self.reports
            .send(HostMessage {
                body: Some(host_message::Body::Report(RunReport {
                    run: self.run.clone(),
                    body: Some(body),
                })),
            })
            .await
            .is_ok()
    }
}
