//! Settings of the job service.

use std::path::PathBuf;
use std::time::Duration;

use refract_proto::job_api::PipelineOptionDescriptor;

use crate::event_log::MessageRetention;

/// How [`crate::serve`] runs. Construct with [`JobServiceConfig::new`] or
/// [`Default`] and override fields; all of them have working defaults.
#[derive(Debug, Clone)]
pub struct JobServiceConfig {
    /// Root under which each job gets its own directory of staged artifacts.
    /// Created if missing. Only directories named after job ids are ever
    /// created or removed inside it.
    pub staging_dir: PathBuf,
    /// Largest gRPC message accepted or sent, in bytes. Pipelines with many
    /// transforms and artifact chunks can exceed tonic's 4 MiB default.
    pub max_message_bytes: usize,
    /// Host put into `PrepareJobResponse.artifact_staging_endpoint`. `None`
    /// uses the listener's address, or the loopback address of its family
    /// when the listener is bound to a wildcard address such as `0.0.0.0`
    /// (never `localhost`, which may name the other family's loopback,
    /// where another user could listen on the same port).
    pub advertised_host: Option<String>,
    /// Keep a job's staged artifacts after it reaches a terminal state
    /// (useful for debugging); by default they are deleted then, so CI runs of
    /// hundreds of jobs do not fill the disk.
    pub retain_artifacts: bool,
    /// How many messages and state events, and how many bytes of message
    /// text, each job keeps for late subscribers of `GetMessageStream`;
    /// older ones are dropped. Bounds memory for long jobs whose harness
    /// logs join the message stream.
    pub message_retention: MessageRetention,
    /// Runner-specific pipeline options announced by
    /// `DescribePipelineOptions`; the Python SDK adds them as command-line
    /// flags. Empty by default, which clients accept.
    pub pipeline_options: Vec<PipelineOptionDescriptor>,
    /// Jobs an earlier server accepted and did not finish, to be taken
    /// over: registered under their own ids and started at once. Their
    /// staged files stay where the earlier server put them.
    pub recovered: Vec<RecoveredJob>,
    /// Staged files of jobs that have not ended survive a shutdown (the
    /// runner keeps the jobs durably and resumes them on the next start).
    pub keep_unfinished_artifacts: bool,
    /// Pipelines planned at once: `Prepare`s decoded and validated, and
    /// jobs translated when they run, share these turns. Planning holds
    /// the whole pipeline several times over, so many at once could take
    /// the server's memory. A `Prepare` takes its turn before its request
    /// is read.
    pub max_concurrent_prepares: usize,
    /// `Prepare` requests that may wait for a turn; more are refused with
    /// `RESOURCE_EXHAUSTED` (a waiting one holds only its connection and
    /// its stream's flow-control window, 64 KiB).
    pub max_waiting_prepares: usize,
    /// Bytes one job may stage in all (its artifacts); staging past it
    /// fails the job with a message saying so.
    pub max_staged_bytes_per_job: u64,
    /// Ended jobs kept in memory (the newest); older ones are let go, with
    /// their messages. Failed jobs kept durably stay until deleted.
    pub retain_finished_jobs: usize,
    /// Ended jobs are let go this long after they ended.
    pub retain_finished_for: Duration,
    /// A job prepared and never run is cancelled (its staged files
    /// removed) this long after `Prepare`.
    pub prepared_job_timeout: Duration,
    /// How often the two rules above are applied.
    pub housekeeping_interval: Duration,
    /// Which users of this host may connect: whoever submits a job runs
    /// code as this server's user.
    pub local_peers: refract_peercred::LocalPeers,
}

/// A job taken over from an earlier server (see
/// [`JobServiceConfig::recovered`]).
#[derive(Debug, Clone)]
pub struct RecoveredJob {
    /// Its id, as clients know it.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The pipeline submitted.
    pub pipeline: refract_proto::pipeline::Pipeline,
    /// Its options.
    pub options: refract_proto::prost_types::Struct,
    /// The artifacts that had been staged for it.
    pub staged: Vec<crate::StagedArtifact>,
    /// It had failed (with this error text), or its record cannot be read
    /// (with why): it is listed as FAILED, not started; it may be resumed
    /// or deleted.
    pub failed: Option<String>,
}

impl JobServiceConfig {
    /// A configuration staging under `staging_dir`, everything else default.
    pub fn new(staging_dir: impl Into<PathBuf>) -> Self {
        Self {
            staging_dir: staging_dir.into(),
            ..Self::default()
        }
    }
}

impl Default for JobServiceConfig {
    fn default() -> Self {
        Self {
            staging_dir: std::env::temp_dir().join("refract-staging"),
            max_message_bytes: 128 << 20,
            advertised_host: None,
            retain_artifacts: false,
            message_retention: MessageRetention::default(),
            pipeline_options: Vec::new(),
            recovered: Vec::new(),
            keep_unfinished_artifacts: false,
            max_concurrent_prepares: 2,
            max_waiting_prepares: 32,
            max_staged_bytes_per_job: 4 << 30,
            retain_finished_jobs: 1_000,
            retain_finished_for: Duration::from_secs(24 * 3600),
            prepared_job_timeout: Duration::from_secs(3600),
            housekeeping_interval: Duration::from_secs(10),
            local_peers: refract_peercred::LocalPeers::SameUser,
        }
    }
}
