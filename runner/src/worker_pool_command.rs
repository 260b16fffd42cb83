//! `refract worker-pool`: a Beam worker pool on this host whose workers are
//! runs of an SDK's boot program (see [`refract_sdk_harness::BootPool`]).

use anyhow::{Context, Result};
use refract_sdk_harness::{BootPool, BootPoolConfig};

use crate::cli::WorkerPoolArgs;

/// Workers per core when `--max_workers` is not given.
const DEFAULT_WORKERS_PER_CORE: usize = 4;

/// Serves the pool until `shutdown` resolves, then stops its workers.
pub async fn run(
    args: WorkerPoolArgs,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let max_workers = args.max_workers.unwrap_or(cores * DEFAULT_WORKERS_PER_CORE);
    let token = refract_sdk_harness::PoolToken::from_file_or(
        args.token_file.as_deref(),
        args.token_from_env.as_ref(),
    )?;
    if token.is_none() {
        tracing::warn!(
            "no --token_file or ${}: any caller that reaches this pool's port can have it run \
             the boot program",
            refract_sdk_harness::POOL_TOKEN_ENV
        );
    }
    let pool = BootPool::new(BootPoolConfig {
        boot: args.boot.clone(),
        max_workers,
        local_peers: args.local_peers.into(),
        token,
    })?;
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let bound = listener
        .local_addr()
        .context("reading the pool's address")?;
    tracing::info!(address = %bound, boot = %args.boot.display(), max_workers, "worker pool listening");
    pool.serve(listener, shutdown).await?;
    Ok(())
}
