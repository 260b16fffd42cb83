//! `refract shard`: a shard host. It listens for the other hosts' shards
//! on its exchange server, attaches to its coordinator, and runs the
//! shards the coordinator places on it, each run as a task of its own,
//! until it is stopped. When the coordinator's stream ends or breaks (the
//! coordinator restarted, or is cut off), the host cancels what it runs
//! and attaches again.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use refract_engine::manager::CheckpointProgress;
use refract_execution::job_runner::{RunControl, RunStop, ShardHostRunner};
use refract_execution::scratch_spill::ScratchSpillSpace;
use refract_hosts::{attach, Attachment, ClusterSecret, Commands};
use refract_pools::WorkerPools;
use refract_proto::hosts::host_command;
use refract_sdk_harness::FnApiServer;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::cli::ShardArgs;

/// The longest wait between attempts to attach.
const MAX_ATTACH_PAUSE: Duration = Duration::from_secs(5);

/// Runs a shard host until `shutdown` resolves.
pub async fn run(args: ShardArgs, shutdown: impl Future<Output = ()>) -> Result<()> {
    let secret = ClusterSecret::read(&args.secret_file)?;
    let exchange = refract_exchange::ExchangeServer::bind(&args.listen)
        .await
        .with_context(|| format!("--listen {}", args.listen))?;
    let advertise = match &args.advertise {
        Some(address) => address.clone(),
        None if exchange.addr().ip().is_unspecified() => anyhow::bail!(
            "--listen {} takes every address: say which one other hosts reach with --advertise",
            args.listen
        ),
        None => exchange.addr().to_string(),
    };
    let name = args.name.clone().unwrap_or_else(|| advertise.clone());
    let fn_server = FnApiServer::start_with(
        &args.fn_api_host,
        0,
        args.worker_liveness_timeout,
        refract_peercred::LocalPeers::SameUser,
    )
    .await
    .with_context(|| format!("starting the Fn API server on {}", args.fn_api_host))?;
    fn_server.set_pool_token(refract_sdk_harness::PoolToken::from_file_or(
        args.worker_pool_token_file.as_deref(),
        args.worker_pool_token_from_env.as_ref(),
    )?);
    let (work_dir, _remove_work_dir) = match &args.work_dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let dir = refract_private_dirs::private_temp_dir("refract-shard-")
                .context("creating the work directory")?;
            (dir.path(), Some(dir))
        }
    };
    let workers = match args.sdk_worker_parallelism {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    let pools = if args.worker_pool.is_empty() {
        None
    } else {
        let pools = WorkerPools::new(workers, std::path::PathBuf::from("python3"));
        for spec in &args.worker_pool {
            pools
                .add(spec.clone())
                .with_context(|| format!("--worker_pool {spec}"))?;
        }
        Some(pools)
    };
    let spill_dir = work_dir.join("spill");
    let spill = ScratchSpillSpace::open(&spill_dir)
        .with_context(|| format!("opening the spill directory {}", spill_dir.display()))?;
    let runner = ShardHostRunner::new(
        fn_server,
        exchange.host().clone(),
        args.coordinator.clone(),
        work_dir,
    )
    .with_spill(Arc::new(spill))
    .with_workers(workers, args.sdk_worker_parallelism > 0)
    .with_environment_preference(args.environment_preference.clone())
    .with_pools(pools);
    info!(exchange = %advertise, coordinator = %args.coordinator, "a shard host is up");
    tokio::select! {
        _ = shutdown => {}
        _ = attach_for_good(&args.coordinator, &secret, &name, &advertise, &runner) => {}
    }
    info!("the shard host stops");
    exchange.stop().await;
    Ok(())
}

/// Attaches to the coordinator and serves its commands, again and again.
async fn attach_for_good(
    coordinator: &str,
    secret: &ClusterSecret,
    name: &str,
    advertise: &str,
    runner: &ShardHostRunner,
) {
    let mut pause = Duration::from_millis(200);
    loop {
        match attach(coordinator, secret, name, advertise).await {
            Ok((attachment, commands)) => {
                pause = Duration::from_millis(200);
                info!(host = attachment.host, %coordinator, "attached to the coordinator");
                serve_commands(Arc::new(attachment), commands, runner).await;
                warn!(%coordinator, "the coordinator's stream ended; attaching again");
            }
            Err(error) => {
                warn!(%error, "cannot attach to the coordinator; trying again");
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_ATTACH_PAUSE);
    }
}

/// Runs what the coordinator commands until its stream ends; then
/// cancels every run still going.
async fn serve_commands(
    attachment: Arc<Attachment>,
    mut commands: Commands,
    runner: &ShardHostRunner,
) {
    let mut runs: HashMap<String, Control> = HashMap::new();
    loop {
        let command = match commands.message().await {
            Ok(Some(command)) => command,
            Ok(None) => break,
            Err(status) => {
                warn!(%status, "the coordinator's stream broke");
                break;
            }
        };
        runs.retain(|_, control| !control.stop.is_closed());
        match command.body {
            Some(host_command::Body::Run(run)) => {
                let (stop, stopped) = watch::channel(RunStop::Running);
                let (progress, progress_rx) = watch::channel(CheckpointProgress::default());
                let (cuts, cut_requests) = mpsc::channel(4);
                runs.insert(
                    run.run.clone(),
                    Control {
                        stop,
                        progress,
                        cuts,
                    },
                );
                let reporter = attachment.reporter(&run.run);
                let (runner, attachment) = (runner.clone(), attachment.clone());
                info!(run = %run.run, job = %run.job_id, shards = ?run.local, "running shards");
                let control = RunControl {
                    stop: stopped,
                    progress: progress_rx,
                    cut_requests,
                };
                tokio::spawn(async move {
                    runner.run(run, &attachment, reporter, control).await;
                });
            }
            Some(host_command::Body::Stop(stop)) => {
                if let Some(control) = runs.get(&stop.run) {
                    let _ = control.stop.send(if stop.drain {
                        RunStop::Drain
                    } else {
                        RunStop::Cancel
                    });
                }
            }
            Some(host_command::Body::Progress(progress)) => {
                if let Some(control) = runs.get(&progress.run) {
                    let _ = control.progress.send(CheckpointProgress {
                        durable: progress.durable,
                        finished: progress.finished,
                    });
                }
            }
            Some(host_command::Body::CutEpoch(cut)) => {
                if let Some(control) = runs.get(&cut.run) {
                    // A full queue: the requester hears no epoch came.
                    let _ = control.cuts.try_send((cut.request, cut.stop));
                }
            }
            Some(host_command::Body::Welcome(_)) | None => {
                warn!("an unexpected command from the coordinator; ignoring it");
            }
        }
    }
    for control in runs.values() {
        let _ = control.stop.send(RunStop::Cancel);
    }
}

/// How the coordinator's commands reach one run here.
struct Control {
    stop: watch::Sender<RunStop>,
    progress: watch::Sender<CheckpointProgress>,
    cuts: mpsc::Sender<(u64, bool)>,
}
