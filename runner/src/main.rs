//! The `refract` binary: parses flags, starts the Fn API and Job API
//! servers, and runs until interrupted (or idle for too long).

#[cfg(feature = "glibc-2-34")]
mod glibc_compat;

use anyhow::{Context, Result};
use clap::Parser;
use refract::cli::{normalize_args, parse_go_duration, Cli, Command, LogKind, LogLevel, ServeArgs};
use refract::client;
use refract::logging::{RedactingStderr, SlogJson};
use refract::serve;
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
        .with_writer(RedactingStderr);
    match args.log_kind {
        LogKind::Json => builder.with_ansi(false).event_format(SlogJson).init(),
        LogKind::Dev => builder.init(),
        LogKind::Text | LogKind::Console => builder.with_ansi(false).init(),
    }
}

async fn run_server(args: ServeArgs) -> Result<()> {
    let idle = parse_go_duration(&args.idle_shutdown_timeout)
        .map_err(anyhow::Error::msg)
        .context("--idle_shutdown_timeout")?;
    let (idle_tx, idle_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate_signal() => {}
            _ = idle_rx => {}
        }
    };
    let server = serve::start(&args, shutdown).await?;
    if !idle.is_zero() {
        let activity = server.activity.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                if activity.idle_for() >= idle {
                    info!(timeout = ?idle, "no job for the idle shutdown timeout; exiting");
                    let _ = idle_tx.send(());
                    return;
                }
            }
        });
    }
    server.wait().await
}

/// Resolves when the process is asked to terminate (SIGTERM: `docker stop`,
/// systemd, a test harness), so the server shuts down as on Ctrl-C —
/// removing its temporary directories and flushing telemetry — instead of
/// dying where it stands. Never resolves where there is no such signal.
async fn terminate_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
                return;
            }
            Err(error) => tracing::warn!(%error, "cannot listen for SIGTERM"),
        }
    }
    std::future::pending::<()>().await
}

/// Plain-text logs on stderr for a command other than `serve`, at `level`
/// unless `REFRACT_LOG` says otherwise.
fn init_command_logging(level: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("REFRACT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with_writer(RedactingStderr)
        .with_ansi(false)
        .init();
}

/// The runtime of a long-running command.
fn multi_thread_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
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
    // Before any thread allocates: see the module's docs for why.
    let allocator_tuned = refract_engine::allocator::tune_system_allocator();
    // Before any thread starts, too: it leaves the environment, which the
    // processes started later (SDK workers) inherit.
    let pool_token = refract_sdk_harness::PoolToken::take_from_env();
    let cli = Cli::parse_from(normalize_args(std::env::args()));
    let args = match cli.command {
        Some(Command::Serve(mut args)) => {
            args.worker_pool_token_from_env = pool_token?;
            args
        }
        Some(Command::Drain(job)) => return block_on(client::drain(job)),
        Some(Command::Cancel(job)) => return block_on(client::cancel(job)),
        Some(Command::Jobs(args)) => return block_on(client::jobs(args)),
        Some(Command::Resume(job)) => return block_on(client::resume(job)),
        Some(Command::Delete(job)) => return block_on(client::delete(job)),
        Some(Command::Status(job)) => return block_on(client::status(job)),
        Some(Command::Logs(logs)) => return block_on(client::logs(logs)),
        Some(Command::Savepoint(args)) => return block_on(client::savepoint(args)),
        Some(Command::Rescale(args)) => return block_on(client::rescale(args)),
        Some(Command::Pools(command)) => return block_on(refract::pools_command::run(command)),
        Some(Command::WorkerPool(mut pool)) => {
            pool.token_from_env = pool_token?;
            init_command_logging("info");
            return multi_thread_runtime()?.block_on(refract::worker_pool_command::run(
                pool,
                async {
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = terminate_signal() => {}
                    }
                },
            ));
        }
        Some(Command::Shard(mut shard)) => {
            shard.worker_pool_token_from_env = pool_token?;
            init_command_logging(&shard.log_level);
            return multi_thread_runtime()?.block_on(refract::shard_command::run(shard, async {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate_signal() => {}
                }
            }));
        }
        Some(Command::Run(run)) => {
            // An embedded server's routine logs would bury the progress;
            // its workers' lines are the job's messages, which the
            // pipeline's client prints itself.
            init_command_logging(&format!("warn,{}=off", refract::logging::SDK_WORKER_TARGET));
            let code = multi_thread_runtime()?.block_on(refract::run_command::run(run))?;
            std::process::exit(code);
        }
        None => {
            let mut args = cli.serve;
            args.worker_pool_token_from_env = pool_token?;
            args
        }
    };
    init_logging(&args);
    tracing::debug!(allocator_tuned, "fixed glibc's mmap and trim thresholds");
    multi_thread_runtime()?.block_on(run_server(args))
}
