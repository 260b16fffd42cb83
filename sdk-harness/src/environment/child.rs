//! Supervision of a spawned worker process: its output goes to `tracing`, its
//! exit is reported (with the tail of its stderr, which usually explains a
//! failed start), and stopping it kills its whole process group, since boot
//! programs start the actual harness as a child.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};

use crate::error::HarnessError;

/// Stderr lines kept to explain an early exit.
const STDERR_TAIL_LINES: usize = 30;
/// How long a stopped worker gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// How a worker process ended.
#[derive(Debug, Clone)]
pub(crate) struct ExitReport {
    /// The exit status, as text.
    pub(crate) status: String,
    /// Its last stderr lines.
    pub(crate) stderr_tail: String,
}

/// A supervised worker process.
pub(crate) struct ChildWorker {
    worker_id: String,
    stop_tx: Option<oneshot::Sender<()>>,
    exit: watch::Receiver<Option<ExitReport>>,
    /// A command that stops what the process started elsewhere (a container).
    cleanup: Option<Command>,
}

/// A new directory only this user can read, for one worker's files.
pub(crate) fn scratch_dir(worker_id: &str) -> std::io::Result<PathBuf> {
    let safe: String = worker_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let dir = std::env::temp_dir().join(format!(
        "refract-worker-{safe}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(&dir)?;
    Ok(dir)
}

impl ChildWorker {
    /// Spawns `command` and supervises it.
    pub(crate) fn spawn(
        worker_id: &str,
        command: Command,
        cleanup: Option<Command>,
    ) -> Result<Self, HarnessError> {
        Self::spawn_in(worker_id, command, cleanup, None)
    }

    /// Spawns `command`, whose files are in `scratch`, and supervises it;
    /// `scratch` is removed once the process has ended.
    pub(crate) fn spawn_with_scratch(
        worker_id: &str,
        command: Command,
        scratch: PathBuf,
    ) -> Result<Self, HarnessError> {
        Self::spawn_in(worker_id, command, None, Some(scratch))
    }

    fn spawn_in(
        worker_id: &str,
        mut command: Command,
        cleanup: Option<Command>,
        scratch: Option<PathBuf>,
    ) -> Result<Self, HarnessError> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        #[cfg(unix)]
        command.process_group(0);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                if let Some(dir) = &scratch {
                    // Nothing ran in it; it would be left behind.
                    let _ = std::fs::remove_dir_all(dir);
                }
                return Err(HarnessError::WorkerStart {
                    worker_id: worker_id.to_string(),
                    reason: format!("cannot spawn {:?}: {e}", command.as_std().get_program()),
                });
            }
        };
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let stdout = child
            .stdout
            .take()
            .map(|out| tokio::spawn(forward_lines(worker_id.to_string(), "stdout", out, None)));
        let stderr = child.stderr.take().map(|err| {
            tokio::spawn(forward_lines(
                worker_id.to_string(),
                "stderr",
                err,
                Some(Arc::clone(&tail)),
            ))
        });
        let (stop_tx, stop_rx) = oneshot::channel();
        let (exit_tx, exit) = watch::channel(None);
        let id = worker_id.to_string();
        tokio::spawn(async move {
            let status = supervise(&id, &mut child, stop_rx).await;
            // Give the output readers a moment to drain what the process wrote last.
            for reader in [stdout, stderr].into_iter().flatten() {
                let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
            }
            if let Some(dir) = scratch {
                if let Err(e) = tokio::fs::remove_dir_all(&dir).await {
                    tracing::debug!(worker_id = %id, dir = %dir.display(), error = %e, "could not remove the worker's scratch directory");
                }
            }
            let stderr_tail = tail.lock().iter().cloned().collect::<Vec<_>>().join("\n");
            tracing::info!(worker_id = %id, %status, "worker process exited");
            exit_tx.send_replace(Some(ExitReport {
                status,
                stderr_tail,
            }));
        });
        Ok(Self {
            worker_id: worker_id.to_string(),
            stop_tx: Some(stop_tx),
            exit,
            cleanup,
        })
    }

    /// Reports the process's exit.
    pub(crate) fn exit_watch(&self) -> watch::Receiver<Option<ExitReport>> {
        self.exit.clone()
    }

    /// Stops the process (and what it started) and waits for it to exit.
    pub(crate) async fn stop(mut self) {
        if let Some(mut cleanup) = self.cleanup.take() {
            cleanup.stdout(Stdio::null()).stderr(Stdio::null());
            match tokio::time::timeout(Duration::from_secs(20), cleanup.status()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(worker_id = %self.worker_id, error = %e, "worker cleanup command failed")
                }
                Err(_) => {
                    tracing::warn!(worker_id = %self.worker_id, "worker cleanup command timed out")
                }
            }
        }
        if let Some(stop) = self.stop_tx.take() {
            let _ = stop.send(());
        }
        let mut exit = self.exit.clone();
        let waited =
            tokio::time::timeout(STOP_GRACE * 3, exit.wait_for(|report| report.is_some())).await;
        if waited.is_err() {
            tracing::warn!(worker_id = %self.worker_id, "worker process did not exit after being killed");
        }
    }
}

/// Waits for the process to exit, or stops it when asked; returns its status.
async fn supervise(worker_id: &str, child: &mut Child, stop: oneshot::Receiver<()>) -> String {
    tokio::select! {
        status = child.wait() => describe(status),
        _ = stop => {
            signal_group(child, Signal::Term);
            match tokio::time::timeout(STOP_GRACE, child.wait()).await {
                Ok(status) => describe(status),
                Err(_) => {
                    tracing::warn!(worker_id, "worker process ignored SIGTERM; killing it");
                    signal_group(child, Signal::Kill);
                    if let Err(e) = child.start_kill() {
                        tracing::debug!(worker_id, error = %e, "kill failed (already gone?)");
                    }
                    describe(child.wait().await)
                }
            }
        }
    }
}

fn describe(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("unknown status ({e})"),
    }
}

#[derive(Clone, Copy)]
enum Signal {
    Term,
    Kill,
}

/// Signals the child's whole process group (it leads one, see `spawn`).
#[cfg(unix)]
fn signal_group(child: &mut Child, signal: Signal) {
    use rustix::process::{kill_process_group, Pid, Signal as S};
    let Some(pid) = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(Pid::from_raw)
    else {
        return;
    };
    let sig = match signal {
        Signal::Term => S::TERM,
        Signal::Kill => S::KILL,
    };
    if let Err(e) = kill_process_group(pid, sig) {
        tracing::debug!(error = %e, "signalling the worker's process group failed");
    }
}

/// Without process groups, signal the child alone.
#[cfg(not(unix))]
fn signal_group(child: &mut Child, signal: Signal) {
    if matches!(signal, Signal::Kill) {
        let _ = child.start_kill();
    }
}

/// Forwards a child's output lines to `tracing`, keeping a tail if asked.
async fn forward_lines(
    worker_id: String,
    stream: &'static str,
    output: impl AsyncRead + Unpin,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
) {
    let mut lines = BufReader::new(output).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => {
                tracing::info!(target: "refract_sdk_harness::worker_output", worker_id = %worker_id, stream, "{line}");
                if let Some(tail) = &tail {
                    let mut tail = tail.lock();
                    if tail.len() == STDERR_TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(worker_id = %worker_id, stream, error = %e, "reading worker output failed");
                break;
            }
        }
    }
}
