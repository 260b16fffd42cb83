//! Keeps a Ray spec's pools in step with the Ray cluster. Refract has no
//! Ray client of its own: it runs a small Python driver (`ray_pools.py`,
//! built into the binary) that places one Beam Python worker pool per
//! live Ray node, as a Ray actor pinned to the node, and reports each pool
//! as a JSON line on its stdout:
//!
//! - `{"event": "add", "pool": "IP:PORT", "node": ID, "cpus": N}`: a pool
//!   is up on a node with N CPUs;
//! - `{"event": "remove", "pool": "IP:PORT", "node": ID}`: its node left
//!   or its actor died (Ray detects both);
//! - `{"event": "error", "message": TEXT}`: trouble worth showing.
//!
//! The driver exits when its stdin closes, and Ray ends the actors it
//! owns with it, so the pools never outlive this server. A driver that
//! exits is started again, after a pause that doubles up to a minute.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Weak;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::watch;

use super::directory::{Discovered, PoolDirectory};
use super::spec::PoolSpec;

/// The driver's source, written to a private file when first needed.
const DRIVER: &str = include_str!("../../../integration/ray/ray_pools.py");

/// Pause before restarting a driver that exited, doubling up to the last.
const RESTART_PAUSES: [Duration; 7] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
    Duration::from_secs(32),
    Duration::from_secs(60),
];

/// One line of the driver's stdout.
#[derive(Debug, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
enum DriverEvent {
    Add {
        pool: String,
        node: String,
        cpus: f64,
    },
    Remove {
        node: String,
    },
    Error {
        message: String,
    },
}

/// Runs the driver for `spec` (Ray at `address`, Python `python`) until the
/// spec is removed or the directory is gone.
pub(super) async fn follow(
    directory: Weak<PoolDirectory>,
    spec: PoolSpec,
    address: String,
    python: PathBuf,
    mut stop: watch::Receiver<bool>,
) {
    let script = match refract_private_dirs::private_temp_dir("refract-ray-") {
        Ok(dir) => {
            let path = dir.path().join("ray_pools.py");
            match std::fs::write(&path, DRIVER) {
                Ok(()) => (dir, path),
                Err(error) => {
                    note(
                        &directory,
                        &spec,
                        format!("cannot write the Ray driver: {error}"),
                    );
                    return;
                }
            }
        }
        Err(error) => {
            note(
                &directory,
                &spec,
                format!("cannot make a directory for the Ray driver: {error}"),
            );
            return;
        }
    };
    let mut failures = 0usize;
    loop {
        let ran_for = std::time::Instant::now();
        tokio::select! {
            outcome = run_driver(&directory, &spec, &address, &python, &script.1) => {
                let why = match outcome {
                    Ok(status) => format!("the Ray driver exited ({status})"),
                    Err(error) => format!("cannot run the Ray driver with {}: {error}", python.display()),
                };
                tracing::warn!(spec = %spec, reason = %why, "Ray worker pools are gone");
                if let Some(dir) = directory.upgrade() {
                    dir.set_pools(&spec, Vec::new());
                    dir.set_trouble(&spec, why);
                }
            }
            _ = stop.changed() => return,
        }
        // A driver that ran a good while was not failing.
        if ran_for.elapsed() > Duration::from_secs(120) {
            failures = 0;
        }
        let pause = RESTART_PAUSES
            .get(failures)
            .or(RESTART_PAUSES.last())
            .copied()
            .unwrap_or(Duration::from_secs(60));
        failures += 1;
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => return,
        }
    }
}

fn note(directory: &Weak<PoolDirectory>, spec: &PoolSpec, trouble: String) {
    tracing::error!(spec = %spec, %trouble, "Ray worker pools");
    if let Some(dir) = directory.upgrade() {
        dir.set_trouble(spec, trouble);
    }
}

/// Runs the driver once, applying its events, until it exits.
async fn run_driver(
    directory: &Weak<PoolDirectory>,
    spec: &PoolSpec,
    address: &str,
    python: &Path,
    script: &Path,
) -> std::io::Result<std::process::ExitStatus> {
    let mut child = Command::new(python)
        .arg(script)
        .arg("--address")
        .arg(address)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    // Held open for as long as the driver should run: dropping it (this
    // future cancelled, the server gone) closes the driver's stdin.
    let _stdin = child.stdin.take();
    if let Some(stderr) = child.stderr.take() {
        let spec = spec.to_string();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(target: "refract::ray", spec = %spec, "{line}");
            }
        });
    }
    let mut pools: BTreeMap<String, Discovered> = BTreeMap::new();
    if let Some(stdout) = child.stdout.take() {
        let mut lines = BufReader::new(stdout).lines();
        while let Some(line) = lines.next_line().await? {
            let Some(dir) = directory.upgrade() else {
                break;
            };
            match serde_json::from_str::<DriverEvent>(&line) {
                Ok(DriverEvent::Add { pool, node, cpus }) => {
                    tracing::info!(spec = %spec, %pool, %node, cpus, "Ray node's worker pool is up");
                    let capacity = (cpus.max(1.0).floor() as usize).max(1);
                    pools.insert(
                        node.clone(),
                        Discovered {
                            address: pool,
                            capacity,
                            node: Some(node),
                        },
                    );
                    dir.set_pools(spec, pools.values().cloned().collect());
                }
                Ok(DriverEvent::Remove { node }) => {
                    tracing::warn!(spec = %spec, %node, "Ray node's worker pool is gone");
                    pools.remove(&node);
                    dir.set_pools(spec, pools.values().cloned().collect());
                }
                Ok(DriverEvent::Error { message }) => {
                    tracing::warn!(spec = %spec, %message, "the Ray driver reports trouble");
                    dir.set_trouble(spec, message);
                }
                Err(error) => {
                    tracing::warn!(spec = %spec, %error, %line, "unreadable line from the Ray driver");
                }
            }
        }
    }
    child.wait().await
}

#[cfg(test)]
mod tests {
    use super::DriverEvent;

    #[test]
    fn reads_the_drivers_events() {
        let add: DriverEvent = serde_json::from_str(
            r#"{"event": "add", "pool": "10.0.0.2:4000", "node": "ab", "cpus": 4.0}"#,
        )
        .unwrap();
        assert!(
            matches!(add, DriverEvent::Add { ref pool, cpus, .. } if pool == "10.0.0.2:4000" && cpus == 4.0)
        );
        let remove: DriverEvent =
            serde_json::from_str(r#"{"event": "remove", "pool": "10.0.0.2:4000", "node": "ab"}"#)
                .unwrap();
        assert!(matches!(remove, DriverEvent::Remove { ref node } if node == "ab"));
        let error: DriverEvent =
            serde_json::from_str(r#"{"event": "error", "message": "no cluster"}"#).unwrap();
        assert!(matches!(error, DriverEvent::Error { .. }));
    }
}
