//! Command-line flags.
//!
//! Beam's SDKs start a Prism binary with Go-style flags (`-job_port=8073`,
//! `--serve_http=false`), and Beam's test suites start it as
//! `BIN --job_port N` with no subcommand. Refract accepts all of those
//! spellings so that it can stand in for Prism unchanged; `serve` is the
//! explicit form of the same thing.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Refract: a portable Apache Beam runner.
#[derive(Debug, Parser)]
#[command(
    name = "refract",
    version = crate::tested_with::VERSION_TEXT,
    about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// What to do (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Flags of `serve`, accepted without the subcommand as Beam launches Prism.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Subcommands.
// Parsed once per process: the size of the serve flags does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the Beam Job API and run submitted pipelines.
    Serve(ServeArgs),
    /// Drain a running job: stop its sources, flush its windows, finish DONE.
    Drain(JobArgs),
    /// Cancel a job.
    Cancel(JobArgs),
    /// List the server's jobs with their states, newest first.
    Jobs(JobsArgs),
    /// Start a failed job again from its latest checkpoint, under its id
    /// (a server with --state_dir keeps failed jobs for this).
    Resume(JobArgs),
    /// Forget an ended job: its record, checkpoints and staged files.
    Delete(JobArgs),
    /// Show a job's state and its user metrics.
    Status(JobArgs),
    /// Print a job's messages (its log as the SDK sees it).
    Logs(LogsArgs),
    /// Write a savepoint of a running job to a file (through the server's
    /// web UI port); with --stop, end the job right after it. Start the
    /// same pipeline from it with `--experiments=refract_savepoint=FILE`.
    Savepoint(SavepointArgs),
    /// Move a running job onto another number of engine shards, under its
    /// id: it stops at a savepoint and goes on from it, each key group's
    /// state on the shard owning it now. A job on shards moves only on a
    /// server with --state_dir.
    Rescale(RescaleArgs),
    /// Run a Python pipeline on Refract: on the server at --job_endpoint,
    /// else on one listening at 127.0.0.1:8073, else on one started for the
    /// run. Shows each stage's progress, then the job's metrics.
    Run(RunArgs),
    /// List, add or remove the server's remote SDK worker pools.
    #[command(subcommand)]
    Pools(PoolsCommand),
    /// Serve a Beam worker pool on this host for a Refract server elsewhere
    /// (`serve --worker_pool`): each worker it is asked for is a run of an
    /// SDK's boot program, as in Beam's Java and Go images, which have no
    /// pool of their own.
    #[command(name = "worker-pool")]
    WorkerPool(WorkerPoolArgs),
    /// Run engine shards of jobs for a coordinator elsewhere (`serve
    /// --shard_listen`): attach to it, start SDK workers and engines here
    /// for the shards it places on this host, and exchange elements with
    /// the other hosts' shards directly.
    Shard(ShardArgs),
}

/// Flags of `refract shard`.
#[derive(Debug, Clone, Args)]
pub struct ShardArgs {
    /// The coordinator's shard port, `HOST:PORT` (its `serve
    /// --shard_listen`). Re-attaches when it restarts.
    #[arg(long = "coordinator")]
    pub coordinator: String,
    /// A file holding the cluster's shared secret (at least 16 bytes; the
    /// coordinator's `--shard_secret_file` holds the same): this host
    /// proves it to the coordinator, which proves it back before the
    /// host takes its work.
    #[arg(long = "secret_file")]
    pub secret_file: PathBuf,
    /// Where this host's exchange server listens, `HOST:PORT` (port 0:
    /// any free port). Other hosts' shards send to it: an address only
    /// the cluster's network reaches.
    #[arg(long = "listen", default_value = "127.0.0.1:0")]
    pub listen: String,
    /// The `HOST:PORT` other hosts reach the exchange server at (a pod's
    /// DNS name, say); default: the address it listens on, which must
    /// then be a specific one.
    #[arg(long = "advertise")]
    pub advertise: Option<String>,
    /// This host's name in the coordinator's logs and messages (default:
    /// the advertised address).
    #[arg(long = "name")]
    pub name: Option<String>,
    /// Where this host's SDK workers reach its Fn API: an address of this
    /// host that the pools of `--worker_pool` reach, if it uses any.
    #[arg(long = "fn_api_host", default_value = "127.0.0.1")]
    pub fn_api_host: String,
    /// A pool of SDK workers this host starts its runs' workers on, as
    /// `serve --worker_pool` (repeatable).
    #[arg(long = "worker_pool")]
    pub worker_pool: Vec<refract_pools::PoolSpec>,
    /// A file (mode 600) holding the token of the pools (`refract
    /// worker-pool --token_file`), as `serve --worker_pool_token_file`.
    #[arg(long = "worker_pool_token_file")]
    pub worker_pool_token_file: Option<PathBuf>,
    /// The token `$REFRACT_POOL_TOKEN` held when the process started.
    #[arg(skip)]
    pub worker_pool_token_from_env: Option<refract_sdk_harness::PoolToken>,
    /// SDK workers started per environment of a job's run here, as
    /// `serve --sdk_worker_parallelism` (0: one per core, one for SDKs
    /// that run bundles in parallel).
    #[arg(long = "sdk_worker_parallelism", default_value_t = 0)]
    pub sdk_worker_parallelism: usize,
    /// Which alternative to start when an environment offers several,
    /// as `serve --environment_preference`.
    #[arg(
        long = "environment_preference",
        default_value = "external,process,docker"
    )]
    pub environment_preference: refract_translate::EnvironmentPreference,
    /// How long an SDK worker may go without answering before it is
    /// declared lost (Go duration), as `serve --worker_liveness_timeout`.
    #[arg(long = "worker_liveness_timeout", default_value = "12s", value_parser = parse_go_duration)]
    pub worker_liveness_timeout: std::time::Duration,
    /// Where runs keep the files their jobs staged while they run
    /// (default: a temporary directory removed at exit).
    #[arg(long = "work_dir")]
    pub work_dir: Option<PathBuf>,
    /// Log level: debug, info, warn or error.
    #[arg(long = "log_level", default_value = "info")]
    pub log_level: String,
}

/// Who of this host's users may connect to a server's ports, as flags
/// write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LocalPeersArg {
    /// This user and root.
    SameUser,
    /// Every user of the host.
    Anyone,
}

impl From<LocalPeersArg> for refract_peercred::LocalPeers {
    fn from(arg: LocalPeersArg) -> Self {
        match arg {
            LocalPeersArg::SameUser => refract_peercred::LocalPeers::SameUser,
            LocalPeersArg::Anyone => refract_peercred::LocalPeers::Anyone,
        }
    }
}

/// Flags of `refract worker-pool`.
#[derive(Debug, Clone, Args)]
pub struct WorkerPoolArgs {
    /// The SDK's boot program, run once per worker with the standard
    /// `--id`, `--*_endpoint` and `--semi_persist_dir` flags (in Beam's
    /// SDK images: /opt/apache/beam/boot).
    #[arg(long)]
    pub boot: PathBuf,
    /// Address to listen on. Whoever reaches the port can make this host
    /// run the boot program against a runner of their choosing: use an
    /// address only the Refract server's network reaches.
    #[arg(long = "host", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (what `serve --worker_pool HOST:PORT` names).
    #[arg(long = "port", default_value_t = 50000)]
    pub port: u16,
    /// Which users of this host may connect to the pool's port: `same-user`
    /// (this user and root; other users' connections are closed unread,
    /// told apart by the kernel's socket tables) or `anyone`.
    #[arg(long = "local_peers", value_enum, default_value_t = LocalPeersArg::SameUser)]
    pub local_peers: LocalPeersArg,
    /// A file (mode 600) holding the callers' tokens, one per line, each
    /// of at least 16 characters; every call must show one (a server's
    /// `serve --worker_pool_token_file` holds its own on its first line).
    /// A caller stops and replaces only the workers it started. Without
    /// the file, the token in `$REFRACT_POOL_TOKEN` if that is set (one
    /// caller); without either, any caller the port admits is served.
    #[arg(long = "token_file")]
    pub token_file: Option<PathBuf>,
    /// The token `$REFRACT_POOL_TOKEN` held when the process started (the
    /// binary takes it out of its environment first thing).
    #[arg(skip)]
    pub token_from_env: Option<refract_sdk_harness::PoolToken>,
    /// Workers running at once; more are refused (default: four per core).
    #[arg(long = "max_workers", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_workers: Option<usize>,
    /// Stop a worker once its runner has not answered for this long (its
    /// host gone or cut off), freeing its place: the pool asks each runner
    /// with workers here four times per timeout. `0` never stops them.
    #[arg(long = "runner_timeout", default_value = "60s", value_parser = parse_go_duration)]
    pub runner_timeout: std::time::Duration,
}

/// `refract pools ...`.
#[derive(Debug, Clone, Subcommand)]
pub enum PoolsCommand {
    /// Show each pool: its source, address, state, capacity and workers.
    List(ServerArgs),
    /// Start new workers on these pools too (as `serve --worker_pool`
    /// takes them: `[SDK=]HOST:PORT` or `ray://HEAD:PORT`).
    Add(PoolArgs),
    /// Start no more workers on these pools (as `list` shows them); the
    /// workers there are replaced on the others.
    Remove(PoolArgs),
}

/// One pool source on one server.
#[derive(Debug, Clone, Args)]
pub struct PoolArgs {
    /// The pools, as `serve --worker_pool` takes them.
    pub spec: String,
    /// Which server.
    #[command(flatten)]
    pub server: ServerArgs,
}

/// Flags of `refract run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// A running job service to use (default: 127.0.0.1:8073 if one
    /// listens there, else a server embedded in this process).
    #[arg(long = "job_endpoint")]
    pub job_endpoint: Option<String>,
    /// The Python interpreter with apache-beam installed (default:
    /// $REFRACT_PYTHON, else `python3`).
    #[arg(long = "python")]
    pub python: Option<String>,
    /// The pipeline's Python file.
    pub pipeline: PathBuf,
    /// Arguments for the pipeline, passed on as they are (its `--runner`
    /// and `--job_endpoint` are set; unless they choose an environment,
    /// its workers are processes, one per core).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub pipeline_args: Vec<String>,
}

/// Flags of `refract savepoint`.
#[derive(Debug, Clone, Args)]
pub struct SavepointArgs {
    /// The job's id.
    pub job_id: String,
    /// The file to write: a file name in the server's savepoint directory
    /// (`serve --savepoint_dir`), or an absolute path in it. It must not
    /// exist yet.
    #[arg(long = "path")]
    pub path: PathBuf,
    /// End the job (CANCELLED) right after the savepoint.
    #[arg(long)]
    pub stop: bool,
    /// The server's web UI address (`host:port`; see `serve --ui_port`).
    #[arg(long = "ui_endpoint", default_value = "localhost:8074")]
    pub ui_endpoint: String,
}

/// Which server a command talks to.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The job service to talk to.
    #[arg(long = "job_endpoint", default_value = "127.0.0.1:8073")]
    pub job_endpoint: String,
}

/// Flags of `refract jobs`.
#[derive(Debug, Clone, Args)]
pub struct JobsArgs {
    /// Which server.
    #[command(flatten)]
    pub server: ServerArgs,
    /// Jobs to list at most.
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Continue after an earlier listing (the token it printed last).
    #[arg(long = "page_token")]
    pub page_token: Option<String>,
}

/// Flags of `refract logs`.
#[derive(Debug, Clone, Args)]
pub struct LogsArgs {
    /// Which job.
    #[command(flatten)]
    pub job: JobArgs,
    /// Keep printing new messages until the job ends.
    #[arg(long, short = 'f')]
    pub follow: bool,
}

/// Which job of which server a job command acts on.
#[derive(Debug, Clone, Args)]
pub struct JobArgs {
    /// The job's id (as printed by the server and the SDK).
    pub job_id: String,
    /// The job service to talk to.
    #[arg(long = "job_endpoint", default_value = "127.0.0.1:8073")]
    pub job_endpoint: String,
}

/// Flags of `refract rescale`.
#[derive(Debug, Clone, Args)]
pub struct RescaleArgs {
    /// Which job, on which server.
    #[command(flatten)]
    pub job: JobArgs,
    /// The number of engine shards to run on: 1 (one engine) to 128.
    #[arg(long = "shards", value_parser = clap::value_parser!(u32).range(1..=128))]
    pub shards: u32,
}

/// Flags of the job server.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Port of the Job API (and artifact staging); 0 picks a free port.
    #[arg(long = "job_port", default_value_t = 8073)]
    pub job_port: u16,
    /// Address to listen on. Anyone who can reach the job port can run code
    /// on this machine: keep the default unless the network is trusted.
    #[arg(long = "host", default_value = "127.0.0.1")]
    pub host: String,
    /// Log level: debug, info, warn or error.
    #[arg(long = "log_level", default_value = "info")]
    pub log_level: LogLevel,
    /// Log format: text, json (Prism's JSON lines), dev or console.
    #[arg(long = "log_kind", default_value = "text")]
    pub log_kind: LogKind,
    /// Serve the web UI and `/metrics` on `--ui_port` (Beam's SDKs pass
    /// `--serve_http=false` when they start a runner for a test).
    #[arg(long = "serve_http", default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub serve_http: bool,
    /// Port of the web UI and `/metrics` (0: any free port). A port in use
    /// costs the UI, not the server. `--web_port` is Prism's name for it.
    #[arg(long = "ui_port", alias = "web_port", default_value_t = 8074)]
    pub ui_port: u16,
    /// Which users of this host may connect to the job, Fn API and UI ports: `same-user`
    /// (this user and root; other users' connections are closed unread,
    /// told apart by the kernel's socket tables) or `anyone`.
    #[arg(long = "local_peers", value_enum, default_value_t = LocalPeersArg::SameUser)]
    pub local_peers: LocalPeersArg,
    /// A host name the web UI answers to besides localhost, 127.0.0.1 and
    /// ::1 (repeatable): needed to reach it by another name, e.g. with
    /// `--host 0.0.0.0`. Requests naming other hosts are refused, which
    /// keeps web pages from reaching it through DNS rebinding.
    #[arg(long = "ui_allowed_host")]
    pub ui_allowed_host: Vec<String>,
    /// The only directory savepoints are written to (as new files named
    /// by the request; never over an existing file) and started from
    /// (`--experiments=refract_savepoint=FILE` names a regular file in
    /// it). Default: `STATE_DIR/savepoints` with `--state_dir`, else
    /// `~/.local/share/refract/savepoints`.
    #[arg(long = "savepoint_dir")]
    pub savepoint_dir: Option<PathBuf>,
    /// The largest savepoint a job may start from (it is read into
    /// memory whole); a larger file fails the job at its start.
    #[arg(long = "max_savepoint_bytes", default_value = "2g", value_parser = refract_execution::memory::parse_byte_size)]
    pub max_savepoint_bytes: usize,
    /// Exit after this long with no jobs (Go duration, e.g. `30s`, `5m`); 0 never.
    #[arg(long = "idle_shutdown_timeout", default_value = "0")]
    pub idle_shutdown_timeout: String,
    /// How long an SDK worker may go without answering before it is
    /// declared lost (Go duration): its connection is pinged after half
    /// of this without traffic and closed when the ping goes unanswered
    /// for the other half; its bundles are then retried on another worker.
    #[arg(long = "worker_liveness_timeout", default_value = "12s", value_parser = parse_go_duration)]
    pub worker_liveness_timeout: std::time::Duration,
    /// How long a running bundle may go without progress (no element,
    /// metric or output change in the SDK's progress reports) before it is
    /// listed in the web UI and told in the job's messages, naming the
    /// transform it is busy in (Go duration; 0: never looked at).
    #[arg(long = "bundle_stall_timeout", default_value = "5m", value_parser = parse_go_duration)]
    pub bundle_stall_timeout: std::time::Duration,
    /// Also fail such a bundle: the engine runs its input again (the SDK
    /// cannot be told to abandon it; its thread ends when it returns).
    #[arg(long = "fail_stalled_bundles", default_value_t = false)]
    pub fail_stalled_bundles: bool,
    /// Where the Fn API listens, and the address SDK workers are told to
    /// connect to (default: `--host`). Workers on other hosts (see
    /// `--worker_pool`) need an address of this host they can reach; a
    /// DNS name is handed to them as written. Every call must name a
    /// worker by its id, which carries 128 secret random bits; the
    /// traffic is not encrypted, so use a trusted network only.
    #[arg(long = "fn_api_host")]
    pub fn_api_host: Option<String>,
    /// Port of the Fn API (0: any free port).
    #[arg(long = "fn_api_port", default_value_t = 0)]
    pub fn_api_port: u16,
    /// A pool of SDK workers on another host (repeatable): `[SDK=]HOST:PORT`
    /// for a Beam worker pool service (Python's `worker_pool_main`, Java's
    /// `ExternalWorkerService`, Go's pool; SDK is python, java or go, and
    /// an unlabelled pool takes any environment; a DNS name stands for all
    /// its addresses, looked up again every 10 s), or `ray://HEAD:PORT` for
    /// one Python pool per node of a Ray cluster. Environments these pools
    /// serve start their workers there; others start as before.
    #[arg(long = "worker_pool")]
    pub worker_pool: Vec<refract_pools::PoolSpec>,
    /// A file (mode 600) holding the token `refract worker-pool
    /// --token_file` was given: every call to a worker pool carries it.
    /// Without it, the token in `$REFRACT_POOL_TOKEN` if that is set.
    #[arg(long = "worker_pool_token_file")]
    pub worker_pool_token_file: Option<PathBuf>,
    /// The token `$REFRACT_POOL_TOKEN` held when the process started (the
    /// binary takes it out of its environment first thing).
    #[arg(skip)]
    pub worker_pool_token_from_env: Option<refract_sdk_harness::PoolToken>,
    /// SDK workers started per environment of a job when the job's own
    /// `--sdk_worker_parallelism` option is 0, or 1 (Python's default)
    /// when this flag is set (0 here: one per core, one for SDKs that run
    /// bundles in parallel (Java, Go), or as many as the pools' capacity
    /// for environments run on pools).
    #[arg(long = "sdk_worker_parallelism", default_value_t = 0)]
    pub sdk_worker_parallelism: usize,
    /// Which alternative to start when an environment offers several
    /// (`beam:env:anyof:v1`, as expansion services answer): kinds in order
    /// of preference, comma-separated; kinds left out are used only when
    /// nothing listed is offered.
    #[arg(
        long = "environment_preference",
        default_value = "external,process,docker"
    )]
    pub environment_preference: refract_translate::EnvironmentPreference,
    /// When no Docker engine is reachable, run DOCKER environments that
    /// name Beam's Python or Java SDK image as local processes (the SDK's
    /// harness in a matching interpreter or JDK of this host).
    #[arg(long = "sdk_images_as_processes", default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub sdk_images_as_processes: bool,
    /// The Python interpreter for Beam's Python SDK images run as processes
    /// (it must have the image's Python and Beam versions); default:
    /// `pythonX.Y`, then `python3`, on PATH.
    #[arg(long = "sdk_python")]
    pub sdk_python: Option<PathBuf>,
    /// The `java` for Beam's Java SDK images run as processes (at least the
    /// image's Java release); default: `$JAVA_HOME/bin/java`, then `java`.
    #[arg(long = "sdk_java")]
    pub sdk_java: Option<PathBuf>,
    /// Export metrics and traces over OTLP/gRPC to this endpoint (e.g.
    /// `http://localhost:4317`); default: `$OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// and no export when neither is set.
    #[arg(long = "otlp_endpoint")]
    pub otlp_endpoint: Option<String>,
    /// Keep jobs durably in this directory (RocksDB): each running job
    /// checkpoints there, and a server started again on the same directory
    /// resumes the jobs that had not ended. Default: in memory only.
    #[arg(long = "state_dir")]
    pub state_dir: Option<PathBuf>,
    /// Keep job records and checkpoints in object storage instead of
    /// `STATE_DIR/db`: `s3://BUCKET/PREFIX`, reached as the `AWS_*`
    /// environment variables say (`AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, and `AWS_ENDPOINT_URL` for
    /// an S3-compatible server). A server started on the same URL resumes
    /// the jobs that had not ended. Needs `--state_dir`, which keeps staged
    /// files, savepoints and histories.
    #[arg(long = "checkpoint_store", requires = "state_dir")]
    pub checkpoint_store: Option<String>,
    /// How often running jobs checkpoint with `--state_dir` (Go duration);
    /// `0` checkpoints after every bundle commit, as often as the disk
    /// keeps up (bundles committed meanwhile share the next write).
    #[arg(long = "checkpoint_interval", default_value = "5s")]
    pub checkpoint_interval: String,
    /// Checkpoint writes that may fail in a row (a full disk) before the
    /// job stops, keeping its latest written checkpoint: a streaming job
    /// then starts again from it with backoff, a batch job fails and can be
    /// resumed. 0 (Flink's default): the first failure stops it.
    #[arg(long = "tolerable_checkpoint_failures", default_value_t = 0)]
    pub tolerable_checkpoint_failures: u32,
    /// Where staged artifacts are kept (default: `STATE_DIR/staging` with
    /// `--state_dir`, else a temporary directory).
    #[arg(long = "staging_dir")]
    pub staging_dir: Option<PathBuf>,
    /// Memory the jobs' data (elements waiting between stages, GroupByKey
    /// buffers, bag state) may take on this server, all jobs together
    /// (e.g. `512m`, `2g`). A job's share is split over its stages; a stage
    /// whose consumer is over its share is not scheduled, and a batch
    /// GroupByKey or a bag over its share spills to `--spill_dir`. Default:
    /// a quarter of the memory this process may use (the machine's, or its
    /// cgroup's limit when lower).
    #[arg(long = "memory_budget", value_parser = refract_execution::memory::parse_byte_size)]
    pub memory_budget: Option<usize>,
    /// The most of `--memory_budget` one job is granted (default: half of
    /// it). A job starting when less is left gets what is left, at least
    /// 4 MiB a stage, or waits (STARTING) until a job ends.
    #[arg(long = "job_memory_budget", value_parser = refract_execution::memory::parse_byte_size)]
    pub job_memory_budget: Option<usize>,
    /// The largest Job API request the server reads (a pipeline in
    /// `Prepare`, a chunk of a staged artifact): a larger one is refused
    /// (OUT_OF_RANGE, naming the limit) before it is decoded. Two are read at once
    /// at most, so this bounds what submissions make the server hold.
    #[arg(long = "max_message_bytes", default_value = "128m", value_parser = refract_execution::memory::parse_byte_size)]
    pub max_message_bytes: usize,
    /// Bytes one job may stage (its artifacts: jars, packages, the pickled
    /// main session); staging past it fails the job, saying so.
    #[arg(long = "max_staged_bytes", default_value = "4g", value_parser = refract_execution::memory::parse_byte_size)]
    pub max_staged_bytes: usize,
    /// Ended jobs kept in memory, newest first (their states, messages and
    /// metrics); older ones are let go. Failed jobs kept in --state_dir
    /// stay until resumed or deleted.
    #[arg(long = "retain_finished_jobs", default_value_t = 1000)]
    pub retain_finished_jobs: usize,
    /// Ended jobs are let go this long after they ended (Go duration).
    #[arg(long = "retain_finished_for", default_value = "24h", value_parser = parse_go_duration)]
    pub retain_finished_for: std::time::Duration,
    /// A job prepared and never run is cancelled, and its staged files
    /// removed, this long after it was prepared (Go duration).
    #[arg(long = "prepared_job_timeout", default_value = "1h", value_parser = parse_go_duration)]
    pub prepared_job_timeout: std::time::Duration,
    /// Coordinate shard hosts: listen on `HOST:PORT` for `refract shard
    /// --coordinator` processes, and run every job's engine shards on
    /// them (one per attached host, or `--experiments=refract_shards=N`
    /// spread over them), none here. Needs `--shard_secret_file`.
    #[arg(long = "shard_listen", requires = "shard_secret_file")]
    pub shard_listen: Option<String>,
    /// A file holding the secret shard hosts must prove (at least 16
    /// bytes; each host's `--secret_file` holds the same).
    #[arg(long = "shard_secret_file", requires = "shard_listen")]
    pub shard_secret_file: Option<PathBuf>,
    /// Where GroupByKey buffers larger than their memory share spill (a
    /// RocksDB database, emptied at start). Default: `STATE_DIR/spill` with
    /// `--state_dir`, else a temporary directory removed at exit.
    #[arg(long = "spill_dir")]
    pub spill_dir: Option<PathBuf>,
}

/// Log verbosity, as Beam's PrismRunner names it.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogLevel {
    /// Everything.
    Debug,
    /// Normal operation.
    Info,
    /// Problems only.
    Warn,
    /// Failures only.
    Error,
}

/// Log format, as Beam's PrismRunner names it.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogKind {
    /// Human-readable lines.
    Text,
    /// Human-readable, with colours.
    Dev,
    /// Same as text.
    Console,
    /// JSON lines in the shape Prism writes (Go's `log/slog`), which
    /// Beam's Python SDK parses back into log records.
    Json,
}

/// Turn Go-style single-dash long flags (`-job_port=1`) into `--job_port=1`.
pub fn normalize_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let args: Vec<String> = args.into_iter().collect();
    // `refract run FILE ARGS...`: the pipeline's own arguments are its own.
    if args.get(1).is_some_and(|a| a == "run") {
        return args;
    }
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            let single_dash_long = i > 0
                && a.len() > 2
                && a.starts_with('-')
                && !a.starts_with("--")
                && a[1..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic());
            if single_dash_long {
                format!("-{a}")
            } else {
                a
            }
        })
        .collect()
}

/// Parse a Go duration such as `90s`, `5m`, `1h30m` or `250ms` (0 = none).
pub fn parse_go_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    if s == "0" || s.is_empty() {
        return Ok(std::time::Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("duration '{s}' lacks a unit (ns, us, ms, s, m, h)"))?;
        let value: f64 = rest[..num_end]
            .parse()
            .map_err(|_| format!("invalid duration '{s}'"))?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => return Err(format!("unknown unit '{other}' in duration '{s}'")),
        };
        total += value * scale;
        rest = &rest[unit_end..];
    }
    Ok(std::time::Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(normalize_args(args.iter().map(|s| s.to_string())))
    }

    #[test]
    fn accepts_prism_style_flags() {
        let cli = parse(&[
            "refract",
            "-job_port=9000",
            "-serve_http=false",
            "-idle_shutdown_timeout=5m",
            "-web_port=9100",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.job_port, 9000);
        assert!(!cli.serve.serve_http);
        assert_eq!(cli.serve.ui_port, 9100);
        let cli = parse(&[
            "refract",
            "--job_port",
            "9001",
            "--log_level",
            "warn",
            "--log_kind",
            "json",
            "--serve_http=false",
        ])
        .unwrap();
        assert_eq!(cli.serve.job_port, 9001);
        let cli = parse(&["refract", "serve", "--job_port", "9002"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Serve(ServeArgs { job_port: 9002, .. }))
        ));
    }

    #[test]
    fn job_commands_take_a_job_id() {
        let cli = parse(&["refract", "drain", "job-1", "--job_endpoint", "localhost:9"]).unwrap();
        assert!(
            matches!(cli.command, Some(Command::Drain(JobArgs { ref job_id, .. })) if job_id == "job-1")
        );
        assert!(parse(&["refract", "cancel"]).is_err());
    }

    #[test]
    fn rejects_unknown_flags() {
        assert!(parse(&["refract", "--no_such_flag"]).is_err());
        assert!(parse(&["refract", "--log_level", "loud"]).is_err());
    }

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_go_duration("0").unwrap().as_secs(), 0);
        assert_eq!(parse_go_duration("1h30m").unwrap().as_secs(), 5400);
        assert_eq!(parse_go_duration("250ms").unwrap().as_millis(), 250);
        assert!(parse_go_duration("5").is_err());
        assert!(parse_go_duration("5y").is_err());
    }
}
