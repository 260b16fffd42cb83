//! Runs the Job API and artifact staging on one gRPC server.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use refract_proto::admin::refract_admin_server::RefractAdminServer;
use refract_proto::job_api::artifact_staging_service_server::ArtifactStagingServiceServer;
use refract_proto::job_api::job_service_server::JobServiceServer;
use refract_proto::tonic::transport::Server;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::AdminService;
use crate::decode_gate::DecodeGate;
use crate::planning::PlanningSlots;
use crate::registry::{JobRegistry, Retention};
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
    let planning = Arc::new(PlanningSlots::new(
        config.max_concurrent_prepares,
        config.max_waiting_prepares,
    ));
    let registry = Arc::new(
        JobRegistry::new(
            staging_root.clone(),
            config.message_retention,
            config.retain_artifacts,
        )
        .with_planning(Arc::clone(&planning)),
    );
    let jobs = JobServiceImpl::new(
        Arc::clone(&registry),
        Arc::clone(&runner),
        endpoint.clone(),
        config.pipeline_options.clone(),
        stop_rx.clone(),
    );
    let staging = StagingService::new(
        Arc::clone(&registry),
        stop_rx.clone(),
        config.max_staged_bytes_per_job,
    );
    let admin = AdminService::new(Arc::clone(&registry), Arc::clone(&runner));
    for recovered in config.recovered.clone() {
        let failed = recovered.failed.clone();
        let job = registry.adopt(recovered);
        job.mark_durable();
        if let Some(error) = failed {
            tracing::warn!(job_id = %job.id(), %error,
                           "a failed job kept by an earlier server: resume or delete it");
            job.fail(error);
            continue;
        }
        tracing::info!(job_id = %job.id(), "resuming a job accepted by an earlier server");
        if job.begin_run().is_ok() {
            runner.start(job);
        }
    }
    tokio::spawn(housekeeping(
        Arc::clone(&registry),
        Arc::clone(&runner),
        config.clone(),
        stop_rx.clone(),
    ));

    let signal = async move {
        shutdown.await;
        tracing::info!("job service shutting down");
        stop_tx.send_replace(true);
    };
    let incoming =
        refract_peercred::PeerGate::new(config.local_peers, "job service").admitted(listener);

    tracing::info!(
        address = %local,
        %endpoint,
        staging_dir = %staging_root.display(),
        "job service listening"
    );
    let limit = config.max_message_bytes;
    let result = Server::builder()
        // A Prepare waiting for its turn leaves up to a stream window of
        // its bytes unread, and unread bytes hold the connection's window
        // too: that window must have room for every waiting and running
        // Prepare, or one waiting call would stall the others sharing its
        // connection (the ones it waits for among them).
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(connection_window(&config))
        .add_service(DecodeGate::new(
            JobServiceServer::new(jobs)
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
            planning,
        ))
        .add_service(
            ArtifactStagingServiceServer::new(staging)
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
        )
        .add_service(RefractAdminServer::new(admin))
        .serve_with_incoming_shutdown(incoming, signal)
        .await;

    if !config.retain_artifacts {
        for job in registry.all() {
            // Unfinished jobs resume on the next start, failed durable
            // ones may be resumed: both need what was staged.
            let resumable = job.state() == crate::JobState::Failed && job.is_durable();
            if config.keep_unfinished_artifacts && (!crate::is_terminal(job.state()) || resumable) {
                continue;
            }
            job.artifacts().remove_files();
        }
    }
    result.map_err(JobServiceError::from)
}

/// Bytes a client may send on one stream before the server reads them.
const STREAM_WINDOW_BYTES: u32 = 1 << 20;

/// Bytes a client may send on one connection before the server reads
/// them: a stream window for each Prepare that may run or wait, and room
/// for the other calls.
fn connection_window(config: &JobServiceConfig) -> u32 {
    let streams = config
        .max_concurrent_prepares
        .saturating_add(config.max_waiting_prepares)
        .saturating_add(4);
    u32::try_from(streams)
        .unwrap_or(u32::MAX)
        .saturating_mul(STREAM_WINDOW_BYTES)
}

/// Applies the job table's rules every `housekeeping_interval` until the
/// server stops: ended jobs past the retention leave memory (the runner
/// drops its views of them), and jobs prepared but never run are cancelled
/// once `prepared_job_timeout` passed, which removes their staged files.
async fn housekeeping(
    registry: Arc<JobRegistry>,
    runner: Arc<dyn JobRunner>,
    config: JobServiceConfig,
    mut stop: watch::Receiver<bool>,
) {
    let retention = Retention {
        max_finished: config.retain_finished_jobs,
        max_age: config.retain_finished_for,
    };
    let timeout_ms = u64::try_from(config.prepared_job_timeout.as_millis()).unwrap_or(u64::MAX);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(config.housekeeping_interval) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        let now = crate::job::now_ms();
        for job in registry.never_run_since(now.saturating_sub(timeout_ms)) {
            tracing::info!(job_id = %job.id(), "cancelling a job prepared and never run");
            job.request_cancel();
        }
        for job in registry.evict(retention, now) {
            tracing::debug!(job_id = %job.id(), "an ended job left memory");
            runner.evicted(&job);
        }
    }
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
        None if local.ip().is_unspecified() => {
            let loopback = match local {
                SocketAddr::V4(_) => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
                SocketAddr::V6(_) => std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            };
            SocketAddr::new(loopback, local.port()).to_string()
        }
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
        assert_eq!(advertised_endpoint(any, None), "127.0.0.1:8099");
        let any6: SocketAddr = "[::]:8099".parse().unwrap();
        assert_eq!(advertised_endpoint(any6, None), "[::1]:8099");
        let v6: SocketAddr = "[::1]:8099".parse().unwrap();
        assert_eq!(advertised_endpoint(v6, None), "[::1]:8099");
        assert_eq!(
            advertised_endpoint(v4, Some("runner.local")),
            "runner.local:8099"
        );
    }
}
