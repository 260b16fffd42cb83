//! One submitted job: what was submitted, where it is in its lifecycle, and
//! the channels between the job service and the runner executing it.

use std::path::PathBuf;

use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::job_api::JobStateEvent;
use refract_proto::pipeline::Pipeline;
use refract_proto::prost_types;
use tokio::sync::watch;

use crate::artifacts::ArtifactStore;
use crate::event_log::{EventLog, MessageRetention, ReadOutcome};
use crate::job_state::{is_terminal, JobState};
use crate::metrics::JobMetrics;

/// Progress of artifact staging for a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StagingStatus {
    /// No client has offered artifacts yet.
    NotStarted,
    /// A reverse retrieval stream is transferring artifacts.
    InProgress,
    /// Every declared dependency was stored.
    Done,
    /// Staging failed with this text (the job is failed too).
    Failed(String),
}

/// Everything [`Job::new`] needs besides the submission itself.
pub(crate) struct JobSettings {
    /// This job's own artifact directory.
    pub artifact_dir: PathBuf,
    /// What is kept for late message-stream subscribers.
    pub message_retention: MessageRetention,
    /// Keep staged files after the job ends.
    pub retain_artifacts: bool,
    /// Where it takes its turn to be translated.
    pub planning: std::sync::Arc<crate::planning::PlanningSlots>,
}

/// One submitted job, shared between the job service and the runner. The
/// runner drives it with [`Job::set_state`], [`Job::message`], [`Job::fail`]
/// and [`Job::metrics`]; clients observe it through the Job API.
pub struct Job {
    id: String,
    name: String,
    pipeline: Pipeline,
    options: prost_types::Struct,
    artifacts: ArtifactStore,
    metrics: JobMetrics,
    log: EventLog,
    cancel: watch::Sender<bool>,
    drain: watch::Sender<bool>,
    staging: watch::Sender<StagingStatus>,
    /// How many `GetStateStream`s of this job have not ended yet; the
    /// message streams end after them (see `crate::streams`).
    open_state_streams: watch::Sender<usize>,
    retain_artifacts: bool,
    /// Its record is in the state directory: a failure keeps its staged
    /// files, since [`crate::JobRunner::resumable`] may start it again.
    durable: std::sync::atomic::AtomicBool,
    /// When it was prepared (or taken over), in ms since the epoch.
    created_ms: u64,
    /// When it reached a terminal state, in ms since the epoch; 0 before.
    ended_ms: std::sync::atomic::AtomicU64,
    /// The server's planning turns, shared with `Prepare`.
    planning: std::sync::Arc<crate::planning::PlanningSlots>,
    /// The running job this one replaces (`--update`), set at Prepare.
    replaces: std::sync::OnceLock<std::sync::Arc<Job>>,
    /// The job that claimed to replace this one (by that job's start;
    /// released if it could not take over).
    replaced_by: std::sync::Mutex<Option<String>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl Job {
    /// A job in state `STOPPED`, as Prepare creates it.
    pub(crate) fn new(
        id: String,
        name: String,
        pipeline: Pipeline,
        options: prost_types::Struct,
        settings: JobSettings,
    ) -> Self {
        let artifacts = match pipeline.components.as_ref() {
            Some(components) => ArtifactStore::new(settings.artifact_dir, &components.environments),
            None => ArtifactStore::new(settings.artifact_dir, &Default::default()),
        };
        Self {
            id,
            name,
            pipeline,
            options,
            artifacts,
            metrics: JobMetrics::default(),
            log: EventLog::new(settings.message_retention),
            cancel: watch::channel(false).0,
            drain: watch::channel(false).0,
            staging: watch::channel(StagingStatus::NotStarted).0,
            open_state_streams: watch::channel(0).0,
            retain_artifacts: settings.retain_artifacts,
            durable: std::sync::atomic::AtomicBool::new(false),
            created_ms: now_ms(),
            ended_ms: std::sync::atomic::AtomicU64::new(0),
            planning: settings.planning,
            replaces: std::sync::OnceLock::new(),
            replaced_by: std::sync::Mutex::new(None),
        }
    }

    /// A job as a shard host runs part of it for a coordinator: listed by
    /// no job service here, its staged files the ones the host fetched
    /// into `artifact_dir` (`staged`, with their paths there), moved to
    /// `RUNNING` at once. The host forwards its messages and metrics to
    /// the coordinator, whose job is the one clients see, and raises its
    /// cancel and drain flags when the coordinator says so
    /// ([`Job::request_cancel`], [`Job::request_drain`]). Its files go
    /// when it ends.
    pub fn on_shard_host(
        id: String,
        name: String,
        pipeline: Pipeline,
        options: prost_types::Struct,
        artifact_dir: PathBuf,
        staged: &[crate::StagedArtifact],
    ) -> std::sync::Arc<Job> {
        let job = Job::new(
            id,
            name,
            pipeline,
            options,
            JobSettings {
                artifact_dir,
                message_retention: MessageRetention::events(10_000),
                retain_artifacts: false,
                planning: std::sync::Arc::new(crate::planning::PlanningSlots::new(1, 0)),
            },
        );
        job.artifacts.adopt(staged);
        job.set_state(JobState::Starting);
        job.set_state(JobState::Running);
        std::sync::Arc::new(job)
    }

    /// A turn to translate this job's pipeline, from the turns `Prepare`
    /// validates pipelines with: planning holds the pipeline several
    /// times over, so only a few are planned at once, however many jobs
    /// are run. `None` if the server is shutting down.
    pub async fn planning_turn(&self) -> Option<crate::PlanningTurn> {
        self.planning.turn_after_others().await
    }

    /// Notes that the job is kept in a state directory, so that a failure
    /// keeps what a resume needs (its staged files). The runner calls it
    /// before the job can end.
    pub fn mark_durable(&self) {
        self.durable
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether [`Self::mark_durable`] was called.
    pub fn is_durable(&self) -> bool {
        self.durable.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The error text the job failed with, if it failed.
    pub fn failure(&self) -> Option<String> {
        self.log.failure()
    }

    /// When the job was prepared, in ms since the epoch.
    pub fn created_ms(&self) -> u64 {
        self.created_ms
    }

    /// When the job ended, in ms since the epoch, if it has.
    pub fn ended_ms(&self) -> Option<u64> {
        match self.ended_ms.load(std::sync::atomic::Ordering::SeqCst) {
            0 => None,
            ms => Some(ms),
        }
    }

    /// The job id, which is also its preparation id and staging token, so
    /// clients may use the id Prepare returned everywhere.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The job name the client gave in Prepare.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The running job this one replaces (a pipeline update), if any.
    pub fn replaces(&self) -> Option<&std::sync::Arc<Job>> {
        self.replaces.get()
    }

    /// Makes this job the update of `old`, which it takes over when it
    /// starts (see [`Self::claim_replacement`]).
    pub(crate) fn set_replaces(&self, old: std::sync::Arc<Job>) {
        let _ = self.replaces.set(old);
    }

    /// Claims this job for replacement by job `by`: false if another job
    /// holds the claim (two updates of one job: one wins).
    pub fn claim_replacement(&self, by: &str) -> bool {
        let mut claim = self.replaced_by_slot();
        if claim.is_some() {
            return false;
        }
        *claim = Some(by.to_string());
        true
    }

    /// Gives up job `by`'s claim (it could not take over): the job runs
    /// on, and ends as it would have.
    pub fn release_replacement(&self, by: &str) {
        let mut claim = self.replaced_by_slot();
        if claim.as_deref() == Some(by) {
            *claim = None;
        }
    }

    /// The job that replaced this one, once one claimed it.
    pub fn replaced_by(&self) -> Option<String> {
        self.replaced_by_slot().clone()
    }

    /// The claim (a panic while it was held leaves it as it was).
    fn replaced_by_slot(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.replaced_by
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The pipeline as submitted (dependencies as the SDK declared them; use
    /// [`ArtifactStore::resolved_dependencies`] for the staged files).
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The pipeline options as sent in Prepare (keys `beam:option:<name>:v1`).
    pub fn options(&self) -> &prost_types::Struct {
        &self.options
    }

    /// What was staged for this job, for provisioning SDK harnesses.
    pub fn artifacts(&self) -> &ArtifactStore {
        &self.artifacts
    }

    /// The current lifecycle state.
    pub fn state(&self) -> JobState {
        self.log.current().state()
    }

    /// Moves the job to `state` if the state machine allows it
    /// (`STOPPED → STARTING → RUNNING → DONE | FAILED | CANCELLING →
    /// CANCELLED …`, optional steps may be skipped). Illegal moves, and any
    /// move after a terminal state, are logged and ignored, so a late report
    /// from a worker cannot resurrect a finished job. For failures prefer
    /// [`Job::fail`], which also tells the client why.
    pub fn set_state(&self, state: JobState) {
        match self.log.set_state(state) {
            Ok(_) => self.on_state_changed(state),
            Err(illegal) => tracing::warn!(
                job_id = %self.id,
                from = ?illegal.from,
                to = ?illegal.to,
                "ignoring illegal job state transition"
            ),
        }
    }

    /// Posts a message to the job's message stream (e.g. a harness log line
    /// or a runner notice). Ignored once the job is terminal, because its
    /// streams have ended.
    pub fn message(&self, importance: MessageImportance, text: impl Into<String>) {
        let text = text.into();
        tracing::debug!(job_id = %self.id, ?importance, %text, "job message");
        if !self.log.message(importance, text) {
            tracing::debug!(job_id = %self.id, "dropping message for a finished job");
        }
    }

    /// Fails the job: posts `error_text` as a `JOB_MESSAGE_ERROR`, then moves
    /// to `FAILED`, atomically and in that order, so clients that stop at the
    /// FAILED state have already received the text (the Python SDK raises
    /// with the last ERROR message). Pass the SDK's error unabridged. Ignored,
    /// with a log line, if the job is already terminal.
    pub fn fail(&self, error_text: impl Into<String>) {
        let text = error_text.into();
        match self.log.fail(text.clone()) {
            Ok(_) => {
                tracing::info!(job_id = %self.id, error = %text, "job failed");
                self.on_state_changed(JobState::Failed);
            }
            Err(illegal) => tracing::warn!(
                job_id = %self.id,
                state = ?illegal.from,
                error = %text,
                "ignoring failure of a job that already ended"
            ),
        }
    }

    /// Becomes `true` when a client cancels the job. The runner should watch
    /// it (`rx.wait_for(|c| *c)` also sees a request made before the call),
    /// stop the work, and then `set_state(CANCELLED)`; the job is already in
    /// `CANCELLING` by then.
    pub fn cancel_requested(&self) -> watch::Receiver<bool> {
        self.cancel.subscribe()
    }

    /// Becomes `true` when a client drains the job: the runner stops its
    /// sources (truncating splittable restrictions), lets windows flush,
    /// and finishes the job DONE. The job is in `DRAINING` by then.
    pub fn drain_requested(&self) -> watch::Receiver<bool> {
        self.drain.subscribe()
    }

    /// The job's committed metrics; the runner commits each successful
    /// bundle's MonitoringInfos here.
    pub fn metrics(&self) -> &JobMetrics {
        &self.metrics
    }

    /// The current state with the time it was entered, for `GetState`.
    pub(crate) fn state_event(&self) -> JobStateEvent {
        self.log.current()
    }

    /// The current state event and the history cursor just past it.
    pub(crate) fn state_with_cursor(&self) -> (JobStateEvent, u64) {
        self.log.current_with_cursor()
    }

    /// Cursor of the oldest retained history event.
    pub(crate) fn oldest_event(&self) -> u64 {
        self.log.oldest_seq()
    }

    /// A page of the job's messages and state changes, for readers that
    /// show history rather than follow it (the web UI): up to `limit`
    /// events `keep` accepts, the first after sequence number `after`, or
    /// the newest without it.
    pub fn history(
        &self,
        after: Option<u64>,
        limit: usize,
        keep: &dyn Fn(&crate::JobEvent) -> bool,
    ) -> crate::HistoryPage {
        self.log.page(after, limit, keep)
    }

    /// History from `cursor` on.
    pub(crate) fn read_events(&self, cursor: u64) -> ReadOutcome {
        self.log.read_from(cursor)
    }

    /// Wakes whenever history is appended (for readers of
    /// [`Job::history`] that follow it).
    pub fn watch_events(&self) -> watch::Receiver<u64> {
        self.log.subscribe()
    }

    /// The count of this job's state streams that have not ended.
    pub(crate) fn open_state_streams(&self) -> &watch::Sender<usize> {
        &self.open_state_streams
    }

    /// Moves `STOPPED → STARTING` for Run; `Err(current state)` if the job
    /// is not `STOPPED` (already run, cancelled or failed).
    pub(crate) fn begin_run(&self) -> Result<(), JobState> {
        self.transition_from(JobState::Stopped, JobState::Starting)
    }

    /// Handles a Cancel request and returns the resulting state: a job that
    /// never ran is cancelled at once; a running one gets its cancel flag
    /// raised and moves to `CANCELLING`; a finished one is left alone.
    pub fn request_cancel(&self) -> JobState {
        if self
            .transition_from(JobState::Stopped, JobState::Cancelled)
            .is_ok()
        {
            return JobState::Cancelled;
        }
        let current = self.state();
        if is_terminal(current) {
            return current;
        }
        self.cancel.send_replace(true);
        if current != JobState::Cancelling {
            self.set_state(JobState::Cancelling);
        }
        self.state()
    }

    /// Handles a Drain request and returns the resulting state: only a
    /// starting or running job can drain; others are left as they are.
    pub fn request_drain(&self) -> JobState {
        let current = self.state();
        if matches!(current, JobState::Starting | JobState::Running) {
            self.drain.send_replace(true);
            self.set_state(JobState::Draining);
        }
        self.state()
    }

    fn transition_from(&self, expected: JobState, to: JobState) -> Result<(), JobState> {
        match self.log.set_state_if(expected, to) {
            Ok(()) => {
                self.on_state_changed(to);
                Ok(())
            }
            Err(current) => Err(current),
        }
    }

    fn on_state_changed(&self, state: JobState) {
        tracing::info!(job_id = %self.id, ?state, "job state changed");
        if !is_terminal(state) {
            return;
        }
        self.ended_ms
            .store(now_ms().max(1), std::sync::atomic::Ordering::SeqCst);
        let resumable = state == JobState::Failed && self.is_durable();
        if !self.retain_artifacts && !resumable {
            self.artifacts.remove_files();
        }
    }

    /// Deletes the job's staged files (it is being forgotten).
    pub(crate) fn remove_files(&self) {
        if !self.retain_artifacts {
            self.artifacts.remove_files();
        }
    }

    /// Claims artifact staging for one reverse retrieval stream. Fails with
    /// the reason if another stream is staging or the job already ended.
    pub(crate) fn begin_staging(&self) -> Result<(), String> {
        let state = self.state();
        if is_terminal(state) {
            return Err(format!("job {} already ended in state {state:?}", self.id));
        }
        let mut claimed = false;
        self.staging.send_if_modified(|status| {
            if *status == StagingStatus::InProgress {
                return false;
            }
            *status = StagingStatus::InProgress;
            claimed = true;
            true
        });
        if claimed {
            Ok(())
        } else {
            Err(format!(
                "artifacts of job {} are already being staged",
                self.id
            ))
        }
    }

    /// Records the outcome of staging.
    pub(crate) fn finish_staging(&self, outcome: Result<(), String>) {
        self.staging.send_replace(match outcome {
            Ok(()) => StagingStatus::Done,
            Err(text) => StagingStatus::Failed(text),
        });
    }

    /// Follows staging progress (Run waits for an in-flight transfer).
    pub(crate) fn watch_staging(&self) -> watch::Receiver<StagingStatus> {
        self.staging.subscribe()
    }
}

/// Now, in ms since the epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
