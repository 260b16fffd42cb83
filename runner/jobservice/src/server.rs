//! Runs the Job API and artifact staging on one gRPC server.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use refract_proto::job_api::artifact_staging_service_server::ArtifactStagingServiceServer;
use refract_proto::job_api::job_service_server::JobServiceServer;
use refract_proto::tonic::transport::Server;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;

use crate::registry::JobRegistry;
use crate::service::JobServiceImpl;
use crate::staging::StagingService;
use crate::{JobRunner, JobServiceConfig, JobServiceError};

/// Serves the Job API and the artifact staging service on `listener` until
/// `shutdown` resolves. The listener is already bound (the CLI chooses host
/// and port); Prepare advertises this same server as the staging endpoint.
/// On shutdown, open state and message streams and staging transfers end
/// with `UNAVAILABLE`, and staged files of jobs that have not ended are
/// removed unless `config.retain_artifacts` is set.
pub async fn serve(
    listener: TcpListener,
    runner: Arc<dyn JobRunner>,
    config: JobServiceConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), JobServiceError> {
    let staging_root = prepare_staging_root(&config).await?;
    let local = listener.local_addr().map_err(JobServiceError::LocalAddr)?;
    let endpoint = advertised_endpoint(local, config.advertised_host.as_deref());

    let (stop_tx, stop_rx) = watch::channel(false);
    let registry = Arc::new(JobRegistry::new(
        staging_root.clone(),
        config.max_retained_events,
        config.retain_artifacts,
    ));
    let jobs = JobServiceImpl::new(
        Arc::clone(&registry),
        Arc::clone(&runner),
        endpoint.clone(),
        config.pipeline_options.clone(),
        stop_rx.clone(),
    );
    let staging = StagingService::new(Arc::clone(&registry), stop_rx);
    for recovered in config.recovered.clone() {
        let job = registry.adopt(recovered);
        tracing::info!(job_id = %job.id(), "resuming a job accepted by an earlier server");
        if job.begin_run().is_ok() {
            runner.start(job);
        }
    }

    let signal = async move {
        shutdown.await;
        tracing::info!("job service shutting down");
        stop_tx.send_replace(true);
    };
    // Small request/response round trips dominate job start latency.
    let incoming = TcpListenerStream::new(listener).map(|conn| {
        if let Ok(stream) = &conn {
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "could not set TCP_NODELAY");
            }
        }
        conn
    });

    tracing::info!(
        address = %local,
        %endpoint,
        staging_dir = %staging_root.display(),
        "job service listening"
    );
    let limit = config.max_message_bytes;
    let result = Server::builder()
        .add_service(
            JobServiceServer::new(jobs)
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
        )
        .add_service(
            ArtifactStagingServiceServer::new(staging)
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
        )
        .serve_with_incoming_shutdown(incoming, signal)
        .await;

    if !config.retain_artifacts {
        for job in registry.all() {
            if config.keep_unfinished_artifacts && !crate::is_terminal(job.state()) {
                continue;
            }
            job.artifacts().remove_files();
        }
    }
    result.map_err(JobServiceError::from)
}

/// Creates the staging root and makes it absolute, since the paths of staged
/// files are handed to other processes.
async fn prepare_staging_root(
    config: &JobServiceConfig,
) -> Result<std::path::PathBuf, JobServiceError> {
    let path = config.staging_dir.clone();
    let error = |source| JobServiceError::StagingDir {
        path: path.clone(),
        source,
    };
    tokio::fs::create_dir_all(&path).await.map_err(error)?;
    tokio::fs::canonicalize(&path).await.map_err(error)
}

/// `host:port` under which clients reach this server.
fn advertised_endpoint(local: SocketAddr, host: Option<&str>) -> String {
    match host {
        Some(host) => format!("{host}:{}", local.port()),
        None if local.ip().is_unspecified() => format!("localhost:{}", local.port()),
        // SocketAddr's Display brackets IPv6 addresses.
        None => local.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_uses_listener_or_override() {
        let v4: SocketAddr = "127.0.0.1:8099".parse().unwrap();
        assert_eq!(advertised_endpoint(v4, None), "127.0.0.1:8099");
        let any: SocketAddr = "0.0.0.0:8099".parse().unwrap();
        assert_eq!(advertised_endpoint(any, None), "localhost:8099");
        let v6: SocketAddr = "[::1]:8099".parse().unwrap();
        assert_eq!(advertised_endpoint(v6, None), "[::1]:8099");
        assert_eq!(
            advertised_endpoint(v4, Some("runner.local")),
            "runner.local:8099"
        );
    }
}
