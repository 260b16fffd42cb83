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
    let callers = refract_sdk_harness::PoolCallers::from_file_or(
        args.token_file.as_deref(),
        args.token_from_env.as_ref(),
    )?;
    if callers.is_none() {
        tracing::warn!(
            "no --token_file or ${}: any caller that reaches this pool's port can have it run \
             the boot program",
            refract_sdk_harness::POOL_TOKEN_ENV
        );
    }
    if proc_shows_other_users_command_lines() {
        tracing::warn!(
            "/proc is mounted without hidepid: other users of this host can read each worker's \
             id in its boot program's command line (Beam's boot programs take it as --id) and \
             use it to pose as the worker where they reach its runner; mount /proc with \
             hidepid=invisible, or run the pool where no other user runs"
        );
    }
    let runner_timeout = (!args.runner_timeout.is_zero()).then_some(args.runner_timeout);
    let pool = BootPool::new(BootPoolConfig {
        boot: args.boot.clone(),
        max_workers,
        local_peers: args.local_peers.into(),
        callers,
        runner_timeout,
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

/// Whether this host's `/proc` lets every user read every process's command
/// line: mounted without `hidepid` (or with `hidepid=0`). Unknown (no
/// `/proc`, as off Linux) counts as hidden: nothing to warn about.
fn proc_shows_other_users_command_lines() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|table| proc_mount_options(&table).map(shows_command_lines))
        .unwrap_or(false)
}

/// The super-block options of the `proc` file system mounted at `/proc`,
/// from a `/proc/self/mountinfo` table (fields: id, parent, device, root,
/// mount point, mount options, optional fields, `-`, type, source, super
/// options).
fn proc_mount_options(mountinfo: &str) -> Option<&str> {
    mountinfo.lines().rev().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fs = fs.split(' ');
        let is_proc = fs.next() == Some("proc");
        let options = fs.nth(1)?;
        (is_proc && mount.split(' ').nth(4) == Some("/proc")).then_some(options)
    })
}

/// Whether `proc` mount options leave other users' command lines readable.
fn shows_command_lines(options: &str) -> bool {
    !options.split(',').any(|option| {
        matches!(
            option.strip_prefix("hidepid="),
            Some("1" | "2" | "noaccess" | "invisible")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_mounted_with_hidepid_hides_command_lines() {
        let table = "21 26 0:20 / /sys rw - sysfs sysfs rw\n\
                     22 27 0:21 / /proc rw,relatime shared:12 - proc proc rw,hidepid=invisible\n";
        let options = proc_mount_options(table).unwrap();
        assert_eq!(options, "rw,hidepid=invisible");
        assert!(!shows_command_lines(options));
        assert!(!shows_command_lines("rw,hidepid=2"));
        assert!(shows_command_lines("rw,hidepid=0"));
        assert!(shows_command_lines("rw"));
        // The last mount at /proc is the one in force.
        let remounted = "22 27 0:21 / /proc rw - proc proc rw,hidepid=2\n\
                         40 27 0:30 / /proc rw - proc proc rw\n";
        assert_eq!(proc_mount_options(remounted), Some("rw"));
        assert_eq!(
            proc_mount_options("1 1 0:1 / /other rw - proc proc rw\n"),
            None
        );
    }
}
