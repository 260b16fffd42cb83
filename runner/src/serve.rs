//! Starting a Refract server — Fn API, Job API and (unless turned off) the
//! web UI — for `refract serve` and for `refract run`, which embeds one when
//! no server is listening.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use refract_execution::activity::Activity;
use refract_execution::durability::Durability;
use refract_execution::job_runner::{RefractRunner, ShardHostsAccess};
use refract_execution::memory::MemoryLedger;
use refract_execution::scratch_spill::ScratchSpillSpace;
use refract_execution::stall_watch::StallPolicy;
use refract_hosts::{ClusterSecret, CoordinatorServer};
use refract_jobservice::{serve, JobServiceConfig};
use refract_observability::insights::Insights;
use refract_observability::telemetry::{self, OtlpExport};
use refract_observability::ui::guard::AllowedHosts;
use refract_observability::ui::UiSettings;
use refract_peercred::LocalPeers;
use refract_pools::WorkerPools;
use refract_private_dirs::{private_temp_dir, TempDirGuard};
use refract_sdk_harness::FnApiServer;
use refract_store::savepoint_dir::SavepointDir;
use tokio::sync::oneshot;
use tracing::info;

use crate::cli::{parse_go_duration, ServeArgs};

/// A server started by [`start`], running until [`Server::stop`] or its
/// `shutdown` future resolves.
pub struct Server {
    /// Where the Job API listens.
    pub job_endpoint: SocketAddr,
    /// Where the web UI listens, if it does.
    pub ui_address: Option<SocketAddr>,
    /// Where the Fn API listens (`host:port`, as workers are told).
    pub fn_api: String,
    /// Stage snapshots of its jobs.
    pub insights: Insights,
    /// Job activity, for idle shutdown.
    pub activity: Arc<Activity>,
    stop: Option<oneshot::Sender<()>>,
    finished: tokio::task::JoinHandle<Result<()>>,
}

impl Server {
    /// Stops the server and waits for it to finish.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.wait().await
    }

    /// Waits until the server finished (its shutdown future resolved).
    pub async fn wait(self) -> Result<()> {
        self.finished.await.context("the job service task")?
    }
}

/// Binds the ports of `args` and starts serving; the server stops when
/// `shutdown` resolves or [`Server::stop`] is called.
pub async fn start(
    args: &ServeArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Server> {
    if args.worker_liveness_timeout.is_zero() {
        anyhow::bail!("--worker_liveness_timeout must be longer than 0");
    }
    // The job port first: the Fn API takes any free port, and could take
    // the very port a caller chose for the job API if it went first.
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.job_port))
        .await
        .with_context(|| format!("binding the job port {}:{}", args.host, args.job_port))?;
    let local_peers = args.local_peers.into();
    let fn_server = start_fn_api(args, local_peers).await?;
    let job_endpoint = listener.local_addr()?;
    warn_about_reach(job_endpoint, args.local_peers);
    let durability = open_durability(args)?;
    sweep_abandoned_dirs();
    let (staging_dir, remove_staging) = server_dir(
        args.staging_dir.as_ref(),
        args.state_dir.as_ref(),
        "staging",
    )
    .context("creating the staging directory")?;
    refract_private_dirs::create_private_dir_all(&staging_dir)
        .with_context(|| format!("creating the staging directory {}", staging_dir.display()))?;
    let fn_api = fn_server.url();
    info!(job_endpoint = %job_endpoint, %fn_api, "refract is serving");
    let (spill_dir, remove_spill) =
        server_dir(args.spill_dir.as_ref(), args.state_dir.as_ref(), "spill")
            .context("creating the spill directory")?;
    let spill = ScratchSpillSpace::open(&spill_dir)
        .with_context(|| format!("opening the spill directory {}", spill_dir.display()))?;
    let savepoints = savepoint_dir(args);
    let coordinator = start_coordinator(args).await?;
    let runner = job_runner(args, fn_server, savepoints.clone(), spill)?.with_shard_hosts(
        coordinator.as_ref().map(|c| ShardHostsAccess {
            directory: c.directory().clone(),
            exchange: c.exchange().clone(),
        }),
    );
    let insights = runner.insights();
    let otlp = start_otlp(args, &insights)?;
    let recovered = match &durability {
        Some(d) => d
            .recovered_jobs()
            .context("reading the jobs in the state directory")?,
        None => Vec::new(),
    };
    let runner = Arc::new(
        runner
            .with_otlp(otlp.clone())
            .with_durability(durability.clone()),
    );
    let activity = runner.activity();
    let config = JobServiceConfig {
        staging_dir,
        keep_unfinished_artifacts: durability.is_some(),
        recovered,
        local_peers,
        ..job_service_limits(args)
    };
    let (ui_stop, ui_stopped) = oneshot::channel::<()>();
    let mut ui_address = None;
    if args.serve_http {
        let settings = UiSettings {
            allowed_hosts: AllowedHosts::new(&args.ui_allowed_host),
            savepoints,
            local_peers,
        };
        ui_address = start_ui(
            args,
            &job_endpoint.to_string(),
            insights.clone(),
            settings,
            ui_stopped,
        )
        .await;
    }
    let (stop, stopped) = oneshot::channel::<()>();
    let finished = tokio::spawn(async move {
        let shutdown = async move {
            tokio::select! {
                _ = shutdown => {}
                _ = stopped => {}
            }
        };
        let served = serve(listener, runner, config, shutdown).await;
        drop(coordinator);
        drop(remove_spill);
        drop(remove_staging);
        let _ = ui_stop.send(());
        if let Some(otlp) = otlp {
            // The exporters flush on threads of their own; do not hold a
            // runtime worker while they do.
            let _ = tokio::task::spawn_blocking(move || otlp.shutdown()).await;
        }
        served.context("job service")
    });
    Ok(Server {
        job_endpoint,
        ui_address,
        fn_api,
        insights,
        activity,
        stop: Some(stop),
        finished,
    })
}

/// The listener for shard hosts of `--shard_listen`, if given.
async fn start_coordinator(args: &ServeArgs) -> Result<Option<CoordinatorServer>> {
    let (Some(listen), Some(secret_file)) = (&args.shard_listen, &args.shard_secret_file) else {
        return Ok(None);
    };
    let secret = ClusterSecret::read(secret_file)?;
    let coordinator = CoordinatorServer::bind(listen, secret).await?;
    info!(shard_listen = %coordinator.addr(), "coordinating shard hosts: jobs run their shards on them");
    Ok(Some(coordinator))
}

/// The Fn API server every job's SDK workers connect to, on
/// `--fn_api_host` (else `--host`) and `--fn_api_port`, with the worker
/// pools' token and the host harnesses that stand in for SDK images.
async fn start_fn_api(args: &ServeArgs, local_peers: LocalPeers) -> Result<Arc<FnApiServer>> {
    let fn_host = args.fn_api_host.as_deref().unwrap_or(&args.host);
    let fn_server = FnApiServer::start_with(
        fn_host,
        args.fn_api_port,
        args.worker_liveness_timeout,
        local_peers,
    )
    .await
    .with_context(|| {
        format!(
            "starting the Fn API server on {fn_host}:{}",
            args.fn_api_port
        )
    })?;
    fn_server.set_pool_token(refract_sdk_harness::PoolToken::from_file_or(
        args.worker_pool_token_file.as_deref(),
        args.worker_pool_token_from_env.as_ref(),
    )?);
    fn_server.set_host_harnesses(refract_sdk_harness::HostHarnesses {
        enabled: args.sdk_images_as_processes,
        python: args.sdk_python.clone(),
        java: args.sdk_java.clone(),
    });
    Ok(fn_server)
}

/// The checkpoints and job records of `--state_dir`, if given.
fn open_durability(args: &ServeArgs) -> Result<Option<Arc<Durability>>> {
    let Some(dir) = &args.state_dir else {
        return Ok(None);
    };
    let every = parse_go_duration(&args.checkpoint_interval)
        .map_err(anyhow::Error::msg)
        .context("--checkpoint_interval")?;
    let durability = match &args.checkpoint_store {
        Some(url) => {
            let store = refract_store::Store::open_url(url)
                .with_context(|| format!("opening the checkpoint store {url}"))?;
            let files = refract_store::ObjectFiles::open_url(url)
                .with_context(|| format!("opening the checkpoint store {url}"))?;
            info!(checkpoint_store = %url,
                  "job records, checkpoints and staged files go to object storage");
            Durability::open_with(dir, store, Some(files), every)
        }
        None => Durability::open(dir, every),
    }
    .with_context(|| format!("opening the state directory {}", dir.display()))?
    .with_tolerable_failures(args.tolerable_checkpoint_failures);
    info!(state_dir = %dir.display(), checkpoint_interval = ?every, "keeping jobs durably");
    Ok(Some(Arc::new(durability)))
}

/// Servers killed without a chance to clean up left their staging and
/// spill directories behind; removes those in the background.
fn sweep_abandoned_dirs() {
    tokio::task::spawn_blocking(|| {
        let swept = refract_private_dirs::sweep_abandoned_temp_dirs(&std::env::temp_dir());
        if swept.directories > 0 {
            info!(
                directories = swept.directories,
                megabytes = swept.bytes / (1 << 20),
                "removed temporary directories of Refract servers that ended without cleaning up"
            );
        }
    });
}

/// The job runner as the flags configure it: workers per environment,
/// remote pools, the memory budgets, spill space, savepoints, the
/// environments preferred and the stall policy.
fn job_runner(
    args: &ServeArgs,
    fn_server: Arc<FnApiServer>,
    savepoints: Option<Arc<SavepointDir>>,
    spill: ScratchSpillSpace,
) -> Result<RefractRunner> {
    let default_workers = match args.sdk_worker_parallelism {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    let memory_budget = args
        .memory_budget
        .unwrap_or_else(refract_execution::memory::default_budget);
    let job_memory_budget = args
        .job_memory_budget
        .unwrap_or(memory_budget / 2)
        .min(memory_budget);
    info!(
        memory_budget,
        job_memory_budget, "memory budget of the jobs' data, and of one job"
    );
    let pools = worker_pools(args, &fn_server.url(), default_workers)?;
    let runner = RefractRunner::new(fn_server)
        .with_savepoints(savepoints)
        .with_default_workers(default_workers)
        .with_pools(pools)
        .with_memory(MemoryLedger::new(memory_budget), job_memory_budget)
        .with_spill(Arc::new(spill))
        .with_environment_preference(args.environment_preference.clone())
        .with_stall_policy(
            (!args.bundle_stall_timeout.is_zero()).then_some(StallPolicy {
                timeout: args.bundle_stall_timeout,
                fail: args.fail_stalled_bundles,
            }),
        );
    Ok(match args.sdk_worker_parallelism {
        0 => runner,
        n => runner.with_asked_workers(n),
    })
}

/// The OTLP export of `--otlp_endpoint` (or the environment's), if any.
fn start_otlp(args: &ServeArgs, insights: &Insights) -> Result<Option<Arc<OtlpExport>>> {
    let Some(endpoint) = telemetry::otlp::endpoint(args.otlp_endpoint.as_deref()) else {
        return Ok(None);
    };
    let export = OtlpExport::start(&endpoint, insights.clone())?;
    info!(%endpoint, "exporting metrics and traces over OTLP");
    Ok(Some(Arc::new(export)))
}

/// The job service's limits and retention, as the flags set them.
fn job_service_limits(args: &ServeArgs) -> JobServiceConfig {
    JobServiceConfig {
        max_staged_bytes_per_job: args.max_staged_bytes as u64,
        max_message_bytes: args.max_message_bytes,
        retain_finished_jobs: args.retain_finished_jobs,
        retain_finished_for: args.retain_finished_for,
        prepared_job_timeout: args.prepared_job_timeout,
        ..JobServiceConfig::default()
    }
}

/// The pools of `--worker_pool`, following their sources from now on
/// (none without the flag; `refract pools add` adds more). Pools named by
/// address count `capacity` workers each.
fn worker_pools(
    args: &ServeArgs,
    fn_api_url: &str,
    capacity: usize,
) -> Result<Option<Arc<WorkerPools>>> {
    if !args.worker_pool.is_empty()
        && (fn_api_url.starts_with("127.") || fn_api_url.starts_with("[::1]"))
    {
        tracing::warn!(
            fn_api = %fn_api_url,
            "workers on other hosts cannot reach a loopback Fn API: \
             pass --fn_api_host with an address of this host they can reach"
        );
    }
    let ray_python = args
        .sdk_python
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("python3"));
    let pools = WorkerPools::new(capacity, ray_python);
    for spec in &args.worker_pool {
        pools
            .add(spec.clone())
            .with_context(|| format!("--worker_pool {spec}"))?;
    }
    Ok(Some(pools))
}

/// Says at start who besides this user can submit jobs, which run code as
/// this user: other hosts when the job port is not on loopback (Beam's
/// clients send no credential), other local users with `--local_peers
/// anyone`.
fn warn_about_reach(job_endpoint: SocketAddr, local_peers: crate::cli::LocalPeersArg) {
    if !job_endpoint.ip().is_loopback() {
        tracing::warn!(
            address = %job_endpoint,
            "the job port is reachable from other hosts, and Beam's clients send no \
             credential: anyone who reaches it can run code as this user; keep it on a \
             trusted network"
        );
    }
    if local_peers == crate::cli::LocalPeersArg::Anyone {
        tracing::warn!(
            "--local_peers anyone: every user of this machine can submit jobs here, which \
             run as this user"
        );
    }
}

/// Starts the web UI in the background and returns its address; a port
/// that cannot be bound is logged and the server runs without a UI.
async fn start_ui(
    args: &ServeArgs,
    job_endpoint: &str,
    insights: Insights,
    settings: UiSettings,
    stop: oneshot::Receiver<()>,
) -> Option<SocketAddr> {
    let listener = match tokio::net::TcpListener::bind((args.host.as_str(), args.ui_port)).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::warn!(port = args.ui_port, %error, "cannot serve the web UI; running without it");
            return None;
        }
    };
    let address = listener.local_addr().ok();
    if let Some(addr) = address {
        info!(url = %format!("http://{addr}/"), "web UI and /metrics");
    }
    let job_endpoint = job_endpoint.to_string();
    tokio::spawn(async move {
        let stopped = async {
            let _ = stop.await;
        };
        if let Err(error) =
            refract_observability::ui::serve(listener, &job_endpoint, insights, settings, stopped)
                .await
        {
            tracing::warn!(%error, "the web UI stopped");
        }
    });
    address
}

/// The directory savepoints may be written to and started from
/// (`--savepoint_dir` or its default); `None`, with a warning, when there
/// is none.
fn savepoint_dir(args: &ServeArgs) -> Option<Arc<SavepointDir>> {
    let chosen = args
        .savepoint_dir
        .clone()
        .or_else(|| SavepointDir::default_location(args.state_dir.as_deref()));
    let Some(dir) = chosen else {
        tracing::warn!("no home directory: savepoints are off unless --savepoint_dir is given");
        return None;
    };
    info!(savepoint_dir = %dir.display(), "savepoints are written here");
    Some(Arc::new(
        SavepointDir::new(dir).with_max_read_bytes(args.max_savepoint_bytes as u64),
    ))
}

/// Where the server keeps `what` (staged artifacts, spilled data): the
/// directory given for it, else under `--state_dir`, else a private
/// directory of its own in the temp dir — which goes when the server has
/// finished (the guard returned; not when `start` returns: the server runs
/// on after it).
fn server_dir(
    given: Option<&std::path::PathBuf>,
    state_dir: Option<&std::path::PathBuf>,
    what: &str,
) -> std::io::Result<(std::path::PathBuf, Option<TempDirGuard>)> {
    Ok(match (given, state_dir) {
        (Some(dir), _) => (dir.clone(), None),
        (None, Some(state)) => (state.join(what), None),
        (None, None) => {
            let dir = private_temp_dir(&format!("refract-{what}-"))?;
            (dir.path(), Some(dir))
        }
    })
}
