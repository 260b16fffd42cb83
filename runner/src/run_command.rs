//! `refract run PIPELINE.py [ARGS...]`: run a Python pipeline on Refract
//! from a terminal, without starting a server first.
//!
//! The pipeline goes to the Refract server at `--job_endpoint` (asked
//! whether it is one: anything else is refused), else to one of this user's
//! listening at `127.0.0.1:8073`, else to a server embedded in this process
//! for the run, with its web UI on a free port; the first line printed says
//! which. While the pipeline's process runs, each stage's progress
//! (elements processed, output watermark) is shown — rewritten in place on a
//! terminal; in a log, only the final lines are printed. At the end come the
//! job's state and metrics, as `refract status` prints them, and the exit
//! status is the pipeline process's.
//!
//! Fast without flags: unless the pipeline's arguments choose an
//! environment, its SDK workers are processes the server starts — one per
//! core unless `--sdk_worker_parallelism` says otherwise — each booted by
//! `PYTHON_BOOT` with the pipeline's own interpreter (it fetches the
//! staged main session, so `--save_main_session` pipelines work) and
//! forked from a fork server (`fork_server.rs`) that imported Beam while the pipeline's
//! process started, instead of importing Beam for a second itself. A
//! LOOPBACK worker is a thread of the pipeline's process: one interpreter
//! lock, one core. The Python SDK's `pip freeze` of the submission
//! environment (~0.4 s per job) is skipped.
//!
//! Interrupted (Ctrl-C, or SIGTERM), it stops what it started rather than
//! dying where it stands: the pipeline's process gets the signal (a
//! terminal sends it to the whole foreground group anyway), the job is
//! cancelled, the fork server and an embedded server stop (their workers
//! and temporary files with them), and the exit status is 128 + the
//! signal, as a shell reports a process the signal ended.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use futures::FutureExt;
use refract_proto::admin::GetServerInfoRequest;
use refract_proto::job_api::job_service_client::JobServiceClient;
use refract_proto::job_api::GetJobsRequest;
use refract_proto::tonic::transport::Channel;

use crate::cli::{Cli, Command, JobArgs, RunArgs};
use crate::client::connect;
use crate::fork_server::ForkServer;
use crate::run_progress::{progress_lines, StageProgress};
use crate::serve;

/// Where `refract run` looks for a running server first.
const DEFAULT_ENDPOINT: &str = "127.0.0.1:8073";
/// Its port.
const DEFAULT_PORT: u16 = 8073;

/// How often progress is refreshed.
const REFRESH: Duration = Duration::from_millis(500);

/// The boot program of Python PROCESS workers: asks the provision service
/// for the options, fetches the staged files, and starts the SDK harness
/// with `$BEAM_PYTHON`.
const PYTHON_BOOT: &str =
    include_str!("../../integration/wheel/python/refract_beam/python_boot.sh");

/// What [`PYTHON_BOOT`] runs: the worker's provisioning and harness, and
/// the fork server the workers of a run are forked from.
const PYTHON_WORKER: &str =
    include_str!("../../integration/wheel/python/refract_beam/python_worker.py");

/// The job server the run submits to, and the server itself if this run
/// started one: `--job_endpoint`'s (which must be a Refract server), a
/// Refract server already at the default port, or a new one in this
/// process for the run.
async fn job_server(args: &RunArgs) -> Result<(String, Option<serve::Server>)> {
    Ok(match &args.job_endpoint {
        Some(endpoint) => {
            let version = refract_version_at(endpoint).await.map_err(|why| {
                anyhow!(
                    "the job service at {endpoint} is not a Refract server ({why}); to run \
                     there, start the pipeline itself with --runner=PortableRunner \
                     --job_endpoint={endpoint}"
                )
            })?;
            eprintln!("refract: running on the Refract {version} server at {endpoint}");
            (endpoint.clone(), None)
        }
        None => match own_server_at_default_port().await {
            Some(version) => {
                eprintln!("refract: running on the Refract {version} server at {DEFAULT_ENDPOINT}");
                (DEFAULT_ENDPOINT.to_string(), None)
            }
            None => {
                let server = serve::start(&embedded_server_args()?, std::future::pending()).await?;
                let ui = server
                    .ui_address
                    .map(|a| format!("; its web UI, until the run ends: http://{a}/"))
                    .unwrap_or_default();
                eprintln!(
                    "refract: started a Refract {} server for this run at {}{ui}",
                    env!("CARGO_PKG_VERSION"),
                    server.job_endpoint
                );
                (server.job_endpoint.to_string(), Some(server))
            }
        },
    })
}

/// The pipeline's process: `python PIPELINE` submitting to `endpoint`
/// with the run's worker `options` and the user's arguments, killed with
/// this process.
fn pipeline_command(
    args: &RunArgs,
    python: &str,
    endpoint: &str,
    options: &[String],
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(python);
    command
        .arg(&args.pipeline)
        .arg("--runner=PortableRunner")
        .arg(format!("--job_endpoint={endpoint}"))
        .args(options)
        .args(&args.pipeline_args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    // Killed outright (SIGKILL, the OOM killer), this process cannot stop
    // the pipeline's: the kernel does, when the thread that started it
    // (this one, which runs until the process exits) ends.
    // SAFETY: the closure runs in the child between fork and exec, and
    // makes one system call, which is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(std::io::Error::from)
        });
    }
    command
}

/// Runs the pipeline; returns the exit code for this process.
pub async fn run(args: RunArgs) -> Result<i32> {
    let (endpoint, embedded) = job_server(&args).await?;
    let mut client = connect(&endpoint).await?;
    let before = job_ids(&mut client).await?;

    let python = args
        .python
        .clone()
        .or_else(|| std::env::var("REFRACT_PYTHON").ok())
        .unwrap_or_else(|| "python3".to_string());
    // Kept until the pipeline is done: its workers boot from here.
    let boot_dir = refract_private_dirs::private_temp_dir("refract-run-")
        .context("creating a directory for the workers' boot program")?;
    let import_path = worker_import_path(&args.pipeline, std::env::var_os("PYTHONPATH"));
    let defaults = worker_defaults(&args.pipeline_args, &python, &boot_dir.path(), &import_path)?;
    // Started beside the pipeline, it imports Beam while the pipeline's
    // process does; the workers are forked from it once the job runs.
    let fork_server = defaults
        .boot
        .as_ref()
        .map(|_| ForkServer::start(&python, &boot_dir.path()))
        .transpose()?;
    let mut command = pipeline_command(&args, &python, &endpoint, &defaults.options);
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {python} {}", args.pipeline.display()))?;

    let mut live = std::io::stderr()
        .is_terminal()
        .then(StageProgress::on_stderr);
    let mut job: Option<String> = None;
    let interrupt = Interrupt::listen()?;
    tokio::pin!(interrupt);
    let ended = loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.context("waiting for the pipeline")?;
                // A terminal's Ctrl-C reaches the pipeline too: it may end
                // first.
                break match (&mut interrupt).now_or_never() {
                    Some(signal) => Ended::Interrupted(signal),
                    None => Ended::Exited(status),
                };
            }
            signal = &mut interrupt => break Ended::Interrupted(signal),
            _ = tokio::time::sleep(REFRESH) => {}
        }
        if job.is_none() {
            job = new_job(&mut client, &before).await?;
        }
        if let (Some(progress), Some(id), Some(server)) = (&mut live, &job, &embedded) {
            progress.show(&progress_lines(
                &server.insights.stages(id).unwrap_or_default(),
            ));
        }
    };
    let code = match ended {
        Ended::Exited(status) => {
            if job.is_none() {
                job = new_job(&mut client, &before).await?;
            }
            match &job {
                Some(id) => {
                    if let Some(server) = &embedded {
                        let lines = progress_lines(&server.insights.stages(id).unwrap_or_default());
                        match live.take() {
                            Some(progress) => progress.finish(&lines),
                            None => lines.iter().for_each(|line| eprintln!("{line}")),
                        }
                    }
                    crate::client::status(JobArgs {
                        job_id: id.clone(),
                        job_endpoint: endpoint.clone(),
                    })
                    .await?;
                }
                None => eprintln!("refract: the pipeline submitted no job to {endpoint}"),
            }
            status.code().unwrap_or(1)
        }
        Ended::Interrupted(signal) => {
            stop_pipeline(signal, &mut child).await;
            // Looked for once the pipeline is gone: it cannot submit after.
            if job.is_none() {
                job = new_job(&mut client, &before).await.unwrap_or(None);
            }
            if let Some(job) = &job {
                cancel_job(&mut client, job).await;
            }
            signal.exit_code()
        }
    };
    if let Some(fork_server) = fork_server {
        fork_server.stop().await;
    }
    if let Some(server) = embedded {
        server.stop().await?;
    }
    Ok(code)
}

/// How long an interrupted pipeline's process has to end after the signal
/// before it is killed.
const INTERRUPTED_GRACE: Duration = Duration::from_secs(5);
/// How long cancelling an interrupted run's job may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// How the pipeline's process came to an end.
enum Ended {
    /// It exited by itself.
    Exited(std::process::ExitStatus),
    /// `refract run` was asked to stop.
    Interrupted(Interrupt),
}

/// A signal that asks `refract run` to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interrupt {
    /// SIGINT: Ctrl-C in a terminal.
    Int,
    /// SIGTERM: a supervisor or `kill`.
    Term,
}

impl Interrupt {
    /// Resolves with the first SIGINT or SIGTERM this process gets from now
    /// on (listening replaces their default action, dying at once).
    fn listen() -> Result<impl std::future::Future<Output = Interrupt>> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
        let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => Interrupt::Int,
                _ = term.recv() => Interrupt::Term,
            }
        })
    }

    /// The signal itself.
    fn signal(self) -> rustix::process::Signal {
        match self {
            Interrupt::Int => rustix::process::Signal::INT,
            Interrupt::Term => rustix::process::Signal::TERM,
        }
    }

    /// The exit status of a process this signal ended, as shells report it.
    fn exit_code(self) -> i32 {
        128 + self.signal().as_raw()
    }
}

/// Passes `signal` on to the pipeline's process (which a terminal's Ctrl-C
/// reached already; a `kill` of `refract run` did not), gives it
/// [`INTERRUPTED_GRACE`] to end, and kills it if it has not.
async fn stop_pipeline(signal: Interrupt, child: &mut tokio::process::Child) {
    eprintln!("refract: interrupted; stopping the pipeline");
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(rustix::process::Pid::from_raw);
    if let Some(pid) = pid {
        let _ = rustix::process::kill_process(pid, signal.signal());
    }
    if tokio::time::timeout(INTERRUPTED_GRACE, child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// Cancels an interrupted run's `job`, saying how that went.
async fn cancel_job(client: &mut JobServiceClient<Channel>, job: &str) {
    let request = refract_proto::job_api::CancelJobRequest {
        job_id: job.to_string(),
    };
    match tokio::time::timeout(CANCEL_TIMEOUT, client.cancel(request)).await {
        Ok(Ok(_)) => eprintln!("refract: cancelled {job}"),
        Ok(Err(status)) => eprintln!("refract: cancelling {job} failed: {}", status.message()),
        Err(_) => eprintln!("refract: cancelling {job} took too long; it may still run"),
    }
}

/// What `refract run` adds to a pipeline's arguments.
struct WorkerDefaults {
    /// Pipeline options.
    options: Vec<String>,
    /// The boot program of the PROCESS workers they choose, if they do.
    boot: Option<PathBuf>,
}

/// The pipeline options `refract run` adds to `pipeline_args`: PROCESS
/// workers booted with `python` (the boot program written into `dir`) and
/// `import_path` as their `PYTHONPATH`, one per core, unless the arguments
/// choose an environment or a worker count; and no `pip freeze` at
/// submission.
fn worker_defaults(
    pipeline_args: &[String],
    python: &str,
    dir: &Path,
    import_path: &str,
) -> Result<WorkerDefaults> {
    let given = |flag: &str| {
        pipeline_args
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    let mut options = vec!["--experiments=disable_logging_submission_environment".to_string()];
    let mut boot = None;
    if !given("--environment_type") && !given("--environment_config") {
        let program = write_boot(dir, &absolute_program(python))?;
        let config = serde_json::json!({
            "command": program.to_string_lossy(),
            "env": { "PYTHONPATH": import_path },
        });
        options.push("--environment_type=PROCESS".to_string());
        options.push(format!("--environment_config={config}"));
        if !given("--sdk_worker_parallelism") {
            // 0: the server's choice, one worker per core.
            options.push("--sdk_worker_parallelism=0".to_string());
        }
        boot = Some(program);
    }
    Ok(WorkerDefaults { options, boot })
}

/// The `PYTHONPATH` of the pipeline's workers: the directory of the
/// `pipeline` script, which Python puts first on the pipeline's own
/// `sys.path` (so modules beside it import there, and functions of theirs
/// are pickled by reference), then the `PYTHONPATH` the pipeline gets.
fn worker_import_path(pipeline: &Path, pythonpath: Option<std::ffi::OsString>) -> String {
    // As Python does for `python SCRIPT`: the script's directory, with
    // symbolic links resolved.
    let script = std::fs::canonicalize(pipeline)
        .or_else(|_| std::path::absolute(pipeline))
        .unwrap_or_else(|_| pipeline.to_path_buf());
    let mut entries: Vec<PathBuf> = script.parent().map(Path::to_path_buf).into_iter().collect();
    if let Some(pythonpath) = pythonpath {
        entries.extend(std::env::split_paths(&pythonpath).filter(|p| !p.as_os_str().is_empty()));
    }
    entries
        .iter()
        .map(|p| p.to_string_lossy())
        .collect::<Vec<_>>()
        .join(":")
}

/// Writes [`PYTHON_BOOT`], [`PYTHON_WORKER`] and a `boot` program running
/// the former with `python` and the fork server of `dir` into `dir`;
/// returns the `boot` program's path.
fn write_boot(dir: &Path, python: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("python_boot.sh");
    let boot = dir.join("boot");
    let quote = |p: &Path| format!("'{}'", p.to_string_lossy().replace('\'', "'\\''"));
    let wrapper = format!(
        "#!/bin/sh\nREFRACT_FORKSERVER={} BEAM_PYTHON={} exec {} \"$@\"\n",
        quote(&ForkServer::socket_in(dir)),
        quote(python),
        quote(&script)
    );
    for (path, text) in [
        (&script, PYTHON_BOOT),
        (&dir.join("python_worker.py"), PYTHON_WORKER),
        (&boot, wrapper.as_str()),
    ] {
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} executable", path.display()))?;
    }
    Ok(boot)
}

/// `program` as an absolute path, found on `PATH` if it names no
/// directory: the server that starts the workers may have another `PATH`.
/// (Not resolved through symlinks: a virtualenv's `python` is one, and
/// only its own path runs with the virtualenv's packages.)
fn absolute_program(program: &str) -> PathBuf {
    let path = Path::new(program);
    if program.contains('/') {
        return std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| path.to_path_buf())
}

/// The version of the Refract server at [`DEFAULT_PORT`], if one run by
/// this user listens there: another user's process (or another program)
/// could listen there, and submitting a pipeline hands it the pipeline's
/// code and data.
async fn own_server_at_default_port() -> Option<String> {
    let listeners = refract_peercred::listening_uids(DEFAULT_PORT);
    let me = refract_peercred::current_uid();
    match (me, listeners.as_slice()) {
        (Some(me), [_, ..]) if listeners.iter().all(|&uid| uid == me) => {}
        (_, []) => return None,
        _ => {
            eprintln!(
                "refract: port {DEFAULT_PORT} belongs to another user's process; starting a \
                 server for this run"
            );
            return None;
        }
    }
    match refract_version_at(DEFAULT_ENDPOINT).await {
        Ok(version) => Some(version),
        Err(why) => {
            eprintln!(
                "refract: what listens on port {DEFAULT_PORT} is not a Refract server ({why}); \
                 starting one for this run"
            );
            None
        }
    }
}

/// The version of the Refract server at `endpoint`, or why it is not one:
/// whatever listens may not speak gRPC at all, so the question is asked
/// with a short deadline.
async fn refract_version_at(endpoint: &str) -> Result<String, String> {
    let ask = async {
        let mut admin = crate::client::connect_admin(endpoint)
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        let info = admin
            .get_server_info(GetServerInfoRequest {})
            .await
            .map_err(|status| {
                format!(
                    "it does not answer Refract's GetServerInfo: {}",
                    status.message()
                )
            })?
            .into_inner();
        if info.name == refract_jobservice::SERVER_NAME {
            Ok(info.version)
        } else {
            Err(format!("it calls itself '{}'", info.name))
        }
    };
    tokio::time::timeout(Duration::from_secs(3), ask)
        .await
        .unwrap_or_else(|_| Err("no answer within 3 s".to_string()))
}

/// The flags of the embedded server: any free job port, and its web UI on
/// any free port.
fn embedded_server_args() -> Result<crate::cli::ServeArgs> {
    let cli = Cli::try_parse_from(["refract", "serve", "--job_port", "0", "--ui_port", "0"])
        .context("building the embedded server's flags")?;
    match cli.command {
        Some(Command::Serve(args)) => Ok(args),
        _ => Err(anyhow!("building the embedded server's flags")),
    }
}

/// The job the pipeline submitted: one the server did not have `before`.
async fn new_job(
    client: &mut JobServiceClient<Channel>,
    before: &[String],
) -> Result<Option<String>> {
    Ok(job_ids(client)
        .await?
        .into_iter()
        .find(|id| !before.contains(id)))
}

async fn job_ids(client: &mut JobServiceClient<Channel>) -> Result<Vec<String>> {
    Ok(client
        .get_jobs(GetJobsRequest {})
        .await
        .map_err(|s| anyhow!("listing jobs failed: {}", s.message()))?
        .into_inner()
        .job_info
        .into_iter()
        .map(|j| j.job_id)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_processes_unless_the_pipeline_chooses() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let defaults = worker_defaults(
            &args(&["--output", "x"]),
            "/usr/bin/python3",
            dir.path(),
            "/work/pipelines:/opt/lib",
        )
        .expect("defaults");
        assert_eq!(defaults.boot, Some(dir.path().join("boot")));
        assert!(dir.path().join("python_worker.py").is_file());
        let defaults = defaults.options;
        assert!(defaults.contains(&"--environment_type=PROCESS".to_string()));
        let config = defaults
            .iter()
            .find_map(|o| o.strip_prefix("--environment_config="))
            .expect("an environment config");
        let config: serde_json::Value = serde_json::from_str(config).expect("JSON");
        assert_eq!(config["env"]["PYTHONPATH"], "/work/pipelines:/opt/lib");
        assert!(defaults.contains(&"--sdk_worker_parallelism=0".to_string()));
        assert!(defaults.contains(&"--experiments=disable_logging_submission_environment".into()));
        let boot = std::fs::read_to_string(dir.path().join("boot")).expect("the boot program");
        assert!(
            boot.contains("BEAM_PYTHON='/usr/bin/python3' exec"),
            "{boot}"
        );
        assert!(boot.contains("REFRACT_FORKSERVER='"), "{boot}");

        let chosen = worker_defaults(
            &args(&[
                "--environment_type=LOOPBACK",
                "--sdk_worker_parallelism",
                "3",
            ]),
            "python3",
            dir.path(),
            "",
        )
        .expect("defaults");
        assert_eq!(chosen.boot, None);
        assert_eq!(
            chosen.options,
            vec!["--experiments=disable_logging_submission_environment".to_string()]
        );
        let two = worker_defaults(
            &args(&["--sdk_worker_parallelism=2"]),
            "python3",
            dir.path(),
            "",
        )
        .expect("defaults");
        assert!(!two
            .options
            .iter()
            .any(|a| a.starts_with("--sdk_worker_parallelism")));
    }

    #[test]
    fn workers_import_from_the_scripts_directory_first() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let script = dir.path().join("pipeline.py");
        std::fs::write(&script, "").expect("written");
        let home = std::fs::canonicalize(dir.path()).expect("canonical");
        assert_eq!(
            worker_import_path(&script, Some("/opt/a::/opt/b".into())),
            format!("{}:/opt/a:/opt/b", home.display())
        );
        assert_eq!(
            worker_import_path(&script, None),
            home.display().to_string()
        );
    }

    #[test]
    fn quotes_in_the_interpreter_path_stay_quoted() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let boot = write_boot(dir.path(), Path::new("/opt/it's/python")).expect("written");
        let text = std::fs::read_to_string(boot).expect("readable");
        assert!(
            text.contains("BEAM_PYTHON='/opt/it'\\''s/python'"),
            "{text}"
        );
    }
}
