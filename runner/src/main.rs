//! The `refract` binary: parses flags, starts the Fn API and Job API
//! servers, and runs until interrupted (or idle for too long).

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use refract::cli::{normalize_args, parse_go_duration, Cli, Command, LogKind, LogLevel, ServeArgs};
use refract::client;
use refract::job_runner::RefractRunner;
use refract_jobservice::{serve, JobServiceConfig};
use refract_sdk_harness::FnApiServer;
use tracing::info;

fn init_logging(args: &ServeArgs) {
    let level = match args.log_level {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Warn => "warn",
        LogLevel::Error => "error",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("REFRACT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_kind {
        LogKind::Json => builder.json().init(),
        LogKind::Dev => builder.init(),
        LogKind::Text | LogKind::Console => builder.with_ansi(false).init(),
    }
}

async fn run_server(args: ServeArgs) -> Result<()> {
    let idle = parse_go_duration(&args.idle_shutdown_timeout)
        .map_err(anyhow::Error::msg)
        .context("--idle_shutdown_timeout")?;
    let fn_server = FnApiServer::start(&args.host)
        .await
        .context("starting the Fn API server")?;
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.job_port))
        .await
        .with_context(|| format!("binding the job port {}:{}", args.host, args.job_port))?;
    let local = listener.local_addr()?;
    let staging_dir = match &args.staging_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("refract-staging-{}", std::process::id())),
    };
    std::fs::create_dir_all(&staging_dir)
        .with_context(|| format!("creating the staging directory {}", staging_dir.display()))?;
    info!(job_endpoint = %local, fn_api = %fn_server.url(), "refract is serving");
    let default_workers = match args.sdk_worker_parallelism {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    let runner = Arc::new(RefractRunner::new(fn_server).with_default_workers(default_workers));
    let activity = runner.activity();
    let insights = runner.insights();
    let config = JobServiceConfig {
        staging_dir,
        ..JobServiceConfig::default()
    };
    let shutdown = async move {
        let ctrl_c = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        if idle.is_zero() {
            ctrl_c.await;
        } else {
            let idle_long_enough = async {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    if activity.idle_for() >= idle {
                        info!(timeout = ?idle, "no job for the idle shutdown timeout; exiting");
                        return;
                    }
                }
            };
            tokio::select! {
                _ = ctrl_c => {}
                _ = idle_long_enough => {}
            }
        }
    };
    let (ui_stop, ui_stopped) = tokio::sync::oneshot::channel::<()>();
    if args.serve_http {
        start_ui(&args, &local.to_string(), insights, ui_stopped).await;
    }
    let served = serve(listener, runner, config, shutdown).await;
    let _ = ui_stop.send(());
    served.context("job service")?;
    Ok(())
}

/// Starts the web UI in the background; a port that cannot be bound is
/// logged and the server runs without a UI.
async fn start_ui(
    args: &ServeArgs,
    job_endpoint: &str,
    insights: refract::insights::Insights,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::bind((args.host.as_str(), args.ui_port)).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::warn!(port = args.ui_port, %error, "cannot serve the web UI; running without it");
            return;
        }
    };
    if let Ok(addr) = listener.local_addr() {
        info!(url = %format!("http://{addr}/"), "web UI and /metrics");
    }
    let job_endpoint = job_endpoint.to_string();
    tokio::spawn(async move {
        let stopped = async {
            let _ = stop.await;
        };
        if let Err(error) = refract::ui::serve(listener, &job_endpoint, insights, stopped).await {
            tracing::warn!(%error, "the web UI stopped");
        }
    });
}

/// Run a client command on a small runtime of its own.
fn block_on(command: impl std::future::Future<Output = Result<()>>) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(command)
}

fn main() -> Result<()> {
    let cli = Cli::parse_from(normalize_args(std::env::args()));
    let args = match cli.command {
        Some(Command::Serve(args)) => args,
        Some(Command::Drain(job)) => return block_on(client::drain(job)),
        Some(Command::Cancel(job)) => return block_on(client::cancel(job)),
        Some(Command::Jobs(server)) => return block_on(client::jobs(server)),
        Some(Command::Status(job)) => return block_on(client::status(job)),
        Some(Command::Logs(logs)) => return block_on(client::logs(logs)),
        None => cli.serve,
    };
    init_logging(&args);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run_server(args))
}
