//! The fork server of `refract run`'s Python workers.
//!
//! Every Python SDK worker spends about a second of CPU importing Beam
//! before it connects; `refract run` starts two per core's worth of them on
//! a machine whose cores the pipeline's own start-up also wants. So it
//! starts one Python process, beside the pipeline, that imports Beam once
//! and forks each worker from itself (`python_worker.py serve SOCKET`): the
//! boot program hands it the worker's environment and standard streams
//! over a Unix socket in the run's private directory and stands for the
//! forked worker until it exits. A boot program that cannot reach the
//! server starts the worker itself, as without one.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result};

/// How long a fork server gets to end once asked before it is killed.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// A running fork server; killed if dropped without [`ForkServer::stop`].
pub(crate) struct ForkServer {
    /// Held open for the server's life: it ends when this closes, even if
    /// this process is killed.
    stdin: tokio::process::ChildStdin,
    child: tokio::process::Child,
}

impl ForkServer {
    /// Where the fork server of the boot directory `dir` listens.
    pub(crate) fn socket_in(dir: &Path) -> PathBuf {
        dir.join("fork.sock")
    }

    /// Starts `python` running `dir`'s `python_worker.py` as the fork
    /// server of `dir`; its own output goes to `dir/fork_server.log`.
    pub(crate) fn start(python: &str, dir: &Path) -> Result<Self> {
        let log_path = dir.join("fork_server.log");
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let mut child = tokio::process::Command::new(python)
            .arg(dir.join("python_worker.py"))
            .arg("serve")
            .arg(Self::socket_in(dir))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {python}, the workers' fork server"))?;
        let stdin = child
            .stdin
            .take()
            .context("the fork server's standard input was not piped")?;
        Ok(ForkServer { stdin, child })
    }

    /// Ends the server (its workers, if any are left, with it) and waits
    /// for it, so that its and its workers' CPU time are counted among
    /// this process's children's, as a worker's the server started would
    /// be.
    pub(crate) async fn stop(self) {
        let ForkServer { stdin, mut child } = self;
        drop(stdin);
        match tokio::time::timeout(STOP_GRACE, child.wait()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "waiting for the fork server failed"),
            Err(_) => {
                tracing::warn!("the fork server did not end when asked; killing it");
                if let Err(e) = child.kill().await {
                    tracing::debug!(error = %e, "killing the fork server failed");
                }
            }
        }
    }
}
