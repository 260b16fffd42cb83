//! Jobs that outlive the server: with `--state_dir`, every accepted job is
//! recorded in the state store (its pipeline, options and staged
//! artifacts), its engine checkpoints there every `--checkpoint_interval`,
//! and a server started again on the same directory takes the unfinished
//! jobs over and continues each from its latest checkpoint.
//!
//! The store itself (incremental, atomic checkpoints in RocksDB) is the
//! `refract-store` crate; what a checkpoint holds, and why restoring one
//! applies every state change exactly once, is the engine's
//! `manager::snapshot` module. This module is the glue: records in, jobs
//! out, and a writer task per job that keeps checkpointing off the
//! engine's thread.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use refract_engine::manager::{describe_checkpoint, renamed_name, CheckpointProgress, NameMapping};
use refract_jobservice::{Job, RecoveredJob, StagedArtifact};
use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::job_api::MetricResults;
use refract_proto::pipeline::MonitoringInfo;
use refract_proto::pipeline::Pipeline;
use refract_proto::prost_types;
use refract_store::{Checkpoint, ObjectFiles, Store, StoreError};
use thiserror::Error;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use refract_observability::insights::JobView;

/// Why durable job state could not be read or written.
#[derive(Debug, Error)]
pub enum DurabilityError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A job record could not be decoded.
    #[error("the record of job '{job}' in the state store cannot be read: {reason}")]
    Record {
        /// The job.
        job: String,
        /// Why.
        reason: String,
    },
}

/// What the store keeps of a job (its own encoding, not Beam's).
#[derive(Clone, PartialEq, prost::Message)]
struct JobRecord {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(bytes = "vec", tag = "2")]
    pipeline: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    options: Vec<u8>,
    #[prost(message, repeated, tag = "4")]
    staged: Vec<StagedRecord>,
    /// Set when the job failed: the error text. A failed job keeps its
    /// record and checkpoint until it is resumed (which clears this) or
    /// deleted; a server started on the directory lists it, failed.
    #[prost(string, optional, tag = "5")]
    failed: Option<String>,
    /// The number of engine shards the job runs on (1: one engine), which
    /// its options no longer say once it was moved (`refract rescale`).
    /// Absent in records of earlier versions: then its options say.
    #[prost(uint32, optional, tag = "6")]
    shards: Option<u32>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct StagedRecord {
    #[prost(string, tag = "1")]
    type_urn: String,
    #[prost(bytes = "vec", tag = "2")]
    type_payload: Vec<u8>,
    #[prost(string, tag = "3")]
    path: String,
    #[prost(string, tag = "4")]
    sha256: String,
    #[prost(uint64, tag = "5")]
    len: u64,
}

/// The state directory's store and checkpoint cadence.
#[derive(Debug)]
pub struct Durability {
    store: Arc<Store>,
    interval: Duration,
    /// Failed checkpoint writes in a row a job tolerates.
    tolerable_failures: u32,
    /// Where ended jobs' histories are written (`STATE_DIR/history`).
    history_dir: PathBuf,
    /// Where jobs' staged files are kept in object storage, with the
    /// records, if they are; and where they are fetched to on a host
    /// that does not have them (`STATE_DIR/staged/JOB`).
    files: Option<(ObjectFiles, PathBuf)>,
}

impl Durability {
    /// Opens the store under `state_dir` (created if missing); jobs will
    /// checkpoint every `interval`.
    pub fn open(state_dir: &Path, interval: Duration) -> Result<Self, DurabilityError> {
        create_state_dir(state_dir)?;
        let store = Store::open(&state_dir.join("db"))?;
        Ok(Self::over(state_dir, store, interval))
    }

    /// Keeps records and checkpoints in `store` (object storage, say)
    /// rather than under `state_dir`, which still holds the histories;
    /// and the files staged for each job in `files`, if given, so that a
    /// server on another host resumes the job with them.
    pub fn open_with(
        state_dir: &Path,
        store: Store,
        files: Option<ObjectFiles>,
        interval: Duration,
    ) -> Result<Self, DurabilityError> {
        create_state_dir(state_dir)?;
        let mut durability = Self::over(state_dir, store, interval);
        durability.files = files.map(|files| (files, state_dir.join("staged")));
        Ok(durability)
    }

    /// Jobs kept in `store`, their histories under `state_dir`.
    fn over(state_dir: &Path, store: Store, interval: Duration) -> Self {
        Durability {
            store: Arc::new(store),
            interval,
            tolerable_failures: 0,
            history_dir: state_dir.join("history"),
            files: None,
        }
    }

    /// The same store, whose jobs stop after more than `n` failed
    /// checkpoint writes in a row (by default, after the first).
    pub fn with_tolerable_failures(mut self, n: u32) -> Self {
        self.tolerable_failures = n;
        self
    }

    /// Failed checkpoint writes in a row a job tolerates.
    pub fn tolerable_failures(&self) -> u32 {
        self.tolerable_failures
    }

    /// How often running jobs checkpoint.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The jobs an earlier server accepted and did not finish, and those
    /// that failed (listed failed, not started). A record that cannot be
    /// read is reported as a failed job of that id, so it shows in the
    /// job list with the reason and can be deleted; the other jobs resume.
    pub fn recovered_jobs(&self) -> Result<Vec<RecoveredJob>, DurabilityError> {
        let mut jobs = Vec::new();
        let ended = self.sweep_ended()?;
        for (id, bytes) in self.store.jobs()? {
            if ended.contains(&id) {
                continue;
            }
            match decode_record(&id, &bytes) {
                Ok((record, pipeline, options)) => {
                    let mut staged: Vec<StagedArtifact> =
                        record.staged.into_iter().map(staged_artifact).collect();
                    let fetched = self.fetch_staged(&id, &mut staged);
                    jobs.push(RecoveredJob {
                        id,
                        name: record.name,
                        pipeline,
                        options,
                        staged,
                        failed: record.failed.or(fetched.err()),
                    })
                }
                Err(error) => {
                    tracing::error!(job = %id, %error,
                                    "skipping a job whose record cannot be read");
                    jobs.push(RecoveredJob {
                        failed: Some(format!(
                            "{error}; it was not resumed (delete it with `refract delete {id}`)"
                        )),
                        id,
                        name: "(unreadable record)".to_string(),
                        pipeline: Pipeline::default(),
                        options: prost_types::Struct::default(),
                        staged: Vec::new(),
                    });
                }
            }
        }
        Ok(jobs)
    }

    /// Fetches from object storage the staged files of `job` that are
    /// not where `staged` says (another host wrote the record), and points
    /// `staged` at the copies; why not, if one cannot be fetched.
    fn fetch_staged(&self, job: &str, staged: &mut [StagedArtifact]) -> Result<(), String> {
        let Some((files, staged_dir)) = &self.files else {
            return Ok(());
        };
        let here = |s: &StagedArtifact| whole_at(&s.path, s.len);
        if staged.iter().all(here) {
            return Ok(());
        }
        let dir = fetched_dir(staged_dir, job)
            .ok_or_else(|| format!("its id {job:?} cannot name a directory"))?;
        refract_private_dirs::create_private_dir_all(&dir)
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        for artifact in staged.iter_mut().filter(|s| !here(s)) {
            let to = dir.join(&artifact.sha256);
            // A copy fetched by an earlier start here is whole: a fetch
            // renames its file into place only once checked.
            if !whole_at(&to, artifact.len) {
                files
                    .download(job, &artifact.sha256, to.clone())
                    .map_err(|e| {
                        format!(
                            "its staged file {} is neither here nor fetched from the checkpoint \
                             store: {e}",
                            artifact.path.display()
                        )
                    })?;
            }
            tracing::info!(job, file = %to.display(), "fetched a staged file from the checkpoint store");
            artifact.path = to;
        }
        Ok(())
    }

    /// Records `job`, running on `shards` engine shards (1: one engine),
    /// so that a later server can take it over on as many (a resumed job's
    /// record loses its failure). With staged files kept in object
    /// storage, the job's go there first (those already there are not
    /// sent again), so that a record never names a file the store lacks.
    pub fn remember(&self, job: &Job, shards: u32) -> Result<(), DurabilityError> {
        if let Some((files, _)) = &self.files {
            for staged in job.artifacts().staged() {
                files.upload(job.id(), &staged.sha256, staged.len, staged.path)?;
            }
        }
        let record = JobRecord {
            name: job.name().to_string(),
            pipeline: job.pipeline().encode_to_vec(),
            options: job.options().encode_to_vec(),
            staged: job
                .artifacts()
                .staged()
                .into_iter()
                .map(|s| StagedRecord {
                    type_urn: s.type_urn,
                    type_payload: s.type_payload,
                    path: s.path.to_string_lossy().into_owned(),
                    sha256: s.sha256,
                    len: s.len,
                })
                .collect(),
            failed: None,
            shards: Some(shards),
        };
        Ok(self.store.put_job(job.id(), &record.encode_to_vec())?)
    }

    /// The number of engine shards `job_id`'s record says it runs on, if
    /// it says (see [`Self::remember`] and [`Self::record_rescale`]).
    pub fn recorded_shards(&self, job_id: &str) -> Result<Option<u32>, DurabilityError> {
        let Some(bytes) = self.store.job(job_id)? else {
            return Ok(None);
        };
        let record = JobRecord::decode(bytes.as_ref()).map_err(|e| DurabilityError::Record {
            job: job_id.to_string(),
            reason: e.to_string(),
        })?;
        Ok(record.shards)
    }

    /// Makes the cut `parts` of job `job_id`, taken as it stopped to move
    /// onto other engine shards, its latest checkpoint, then notes their
    /// number, if it was chosen (`shards`), in its record: a restart from
    /// here on resumes it on those shards (a crash between the two, on the
    /// old ones). A job following its shard hosts keeps none. Returns the
    /// checkpoint's id.
    pub fn record_rescale(
        &self,
        job_id: &str,
        parts: Vec<(String, Bytes)>,
        shards: Option<u32>,
    ) -> Result<u64, DurabilityError> {
        let written = self.store.checkpoint(job_id, parts)?;
        let Some(shards) = shards else {
            return Ok(written.id);
        };
        let Some(bytes) = self.store.job(job_id)? else {
            return Err(DurabilityError::Record {
                job: job_id.to_string(),
                reason: "the job has no record".into(),
            });
        };
        let mut record =
            JobRecord::decode(bytes.as_ref()).map_err(|e| DurabilityError::Record {
                job: job_id.to_string(),
                reason: e.to_string(),
            })?;
        record.shards = Some(shards);
        self.store.put_job(job_id, &record.encode_to_vec())?;
        Ok(written.id)
    }

    /// Notes in `job_id`'s record that it failed with `error`: the record
    /// and its latest checkpoint stay, for a resume.
    pub fn mark_failed(&self, job_id: &str, error: &str) -> Result<(), DurabilityError> {
        let Some(bytes) = self.store.job(job_id)? else {
            return Ok(());
        };
        let mut record =
            JobRecord::decode(bytes.as_ref()).map_err(|e| DurabilityError::Record {
                job: job_id.to_string(),
                reason: e.to_string(),
            })?;
        record.failed = Some(error.to_string());
        Ok(self.store.put_job(job_id, &record.encode_to_vec())?)
    }

    /// Whether `job_id` has a readable record (and so can resume from its
    /// latest checkpoint, or from the start if it took none).
    pub fn can_resume(&self, job_id: &str) -> bool {
        match self.store.job(job_id) {
            Ok(Some(bytes)) => decode_record(job_id, &bytes).is_ok(),
            _ => false,
        }
    }

    /// Writes an ended job's history — its state, error and retained
    /// messages — to `STATE_DIR/history/JOB.json`, where it stays readable
    /// after the job leaves the server's memory.
    pub fn write_history(&self, job: &Job) -> std::io::Result<PathBuf> {
        refract_private_dirs::create_private_dir_all(&self.history_dir)?;
        let messages: Vec<serde_json::Value> = job
            .history(None, usize::MAX, &|_| true)
            .entries
            .iter()
            .map(|(seq, event)| match event {
                refract_jobservice::JobEvent::Message(m) => serde_json::json!({
                    "seq": seq,
                    "time": m.time,
                    "level": refract_observability::job_api_text::message_level(m.importance),
                    "text": m.message_text,
                }),
                refract_jobservice::JobEvent::State(s) => serde_json::json!({
                    "seq": seq,
                    "level": "STATE",
                    "text": refract_observability::job_api_text::state_name(s.state),
                }),
            })
            .collect();
        let history = serde_json::json!({
            "id": job.id(),
            "name": job.name(),
            "state": job.state().as_str_name(),
            "created_ms": job.created_ms(),
            "ended_ms": job.ended_ms(),
            "error": job.failure(),
            "messages": messages,
        });
        // Ids this server makes are safe file names; one from an odd
        // record might not be.
        if !refract_jobservice::is_safe_job_id(job.id()) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("job id {:?} is not a file name", job.id()),
            ));
        }
        let path = self.history_dir.join(format!("{}.json", job.id()));
        std::fs::write(&path, history.to_string())?;
        Ok(path)
    }

    /// Forgets a job that ended for good (DONE, CANCELLED, or deleted):
    /// its record, checkpoints and state; nothing of it is resumed again.
    ///
    /// The job is marked ended first, in a write of a few bytes: when
    /// removing what it kept fails (a full disk), the mark alone keeps it
    /// from running again, and the next start removes the rest. An error
    /// means neither write went through: the job would be resumed by the
    /// next start, so the caller should try again.
    pub fn forget(&self, job_id: &str) -> Result<(), DurabilityError> {
        let marked = self.store.mark_ended(job_id);
        if marked.is_ok() {
            self.forget_staged(job_id);
        }
        match (self.store.remove_job(job_id), marked) {
            (Ok(()), _) => Ok(()),
            (Err(removal), Ok(())) => {
                tracing::warn!(job_id, error = %removal,
                    "cannot remove an ended job from the state store; it is marked ended, \
                     and the next start removes it");
                Ok(())
            }
            (Err(removal), Err(_)) => Err(removal.into()),
        }
    }

    /// Deletes an ended job's staged files from object storage and its
    /// fetched copies here, as far as it can.
    fn forget_staged(&self, job_id: &str) {
        if let Some((files, staged_dir)) = &self.files {
            files.delete_job(job_id);
            let Some(dir) = fetched_dir(staged_dir, job_id) else {
                return;
            };
            if dir.exists() {
                if let Err(error) = std::fs::remove_dir_all(&dir) {
                    tracing::warn!(job_id, %error, "cannot remove the job's fetched staged files");
                }
            }
        }
    }

    /// Removes what jobs marked ended still keep (their removal failed
    /// before); they are never resumed. Returns their ids.
    fn sweep_ended(&self) -> Result<std::collections::HashSet<String>, DurabilityError> {
        let ended: std::collections::HashSet<String> =
            self.store.ended_jobs()?.into_iter().collect();
        for id in &ended {
            self.forget_staged(id);
            match self.store.remove_job(id) {
                Ok(()) => {
                    tracing::info!(job_id = %id, "removed an ended job an earlier server could not")
                }
                Err(error) => tracing::warn!(job_id = %id, %error,
                    "cannot remove an ended job from the state store yet; it stays ended"),
            }
        }
        Ok(ended)
    }

    /// Where `job_id`'s engine keeps user state beside its checkpoints
    /// ([`refract_engine::manager::EngineBuilder::durable_state`]).
    pub fn state_store(&self, job_id: &str) -> Arc<dyn refract_engine::spill::SpillSpace> {
        Arc::new(crate::durable_spill::DurableSpillSpace::new(
            self.store.clone(),
            job_id,
        ))
    }

    /// `job_id`'s latest checkpoint.
    pub fn latest_checkpoint(&self, job_id: &str) -> Result<Option<Checkpoint>, DurabilityError> {
        Ok(self.store.latest_checkpoint(job_id)?)
    }

    /// A channel for `job_id`'s engine to send checkpoints on, and the task
    /// writing them (off the engine's thread, one at a time) and noting
    /// each in `view`. The watch reports, counting in the order received,
    /// how many checkpoints are durable (what the engine waits for before
    /// a stable-input stage may see elements or a bundle is finalized) and
    /// how many writes have ended either way (the engine takes no new
    /// checkpoint until the previous write has ended).
    ///
    /// A failed write is loud: the job's message stream says why, and
    /// `view` counts it (the UI, `/metrics`, OTLP and `refract status`
    /// show failures and the age of the latest written checkpoint). Its
    /// latest checkpoint stays the one to resume from; the engine stops
    /// the job once more writes failed in a row than tolerated.
    pub fn checkpoint_writer(&self, job: Arc<Job>, view: Arc<JobView>) -> CheckpointWriter {
        let (tx, mut rx) = mpsc::channel::<Vec<(String, Bytes)>>(1);
        let (report, progress) = watch::channel(CheckpointProgress::default());
        let store = self.store.clone();
        let job_id = job.id().to_string();
        let view_ok = view.clone();
        let failed = move |error: String| {
            let latest = view.checkpoints();
            let resume_from = match (&latest.last, latest.restored_from) {
                (Some(last), _) => format!("checkpoint {}", last.id),
                (None, Some(id)) => format!("checkpoint {id}"),
                (None, None) => "its start".to_string(),
            };
            job.message(
                MessageImportance::JobMessageWarning,
                format!(
                    "a checkpoint could not be written: {error}. A restart would resume the \
                     job from {resume_from}; past --tolerable_checkpoint_failures in a row \
                     the job stops"
                ),
            );
            view.observe_checkpoint_failure(error);
        };
        let task = tokio::spawn(async move {
            let mut received = 0u64;
            while let Some(parts) = rx.recv().await {
                received += 1;
                let store = store.clone();
                let id = job_id.clone();
                let written =
                    tokio::task::spawn_blocking(move || store.checkpoint(&id, parts)).await;
                match written {
                    Ok(Ok(stats)) => {
                        debug!(job = %job_id, checkpoint = stats.id, parts_written = stats.parts_written,
                               bytes_written = stats.bytes_written, ?stats.duration, "checkpoint written");
                        view_ok.observe_checkpoint(stats);
                        report.send_replace(CheckpointProgress::all_durable(received));
                    }
                    Ok(Err(error)) => {
                        warn!(job = %job_id, %error, "writing a checkpoint failed");
                        failed(error.to_string());
                        report.send_modify(|p| p.finished = received);
                    }
                    Err(error) => {
                        warn!(job = %job_id, %error, "the checkpoint writer panicked");
                        failed(format!("the writer crashed: {error}"));
                        report.send_modify(|p| p.finished = received);
                    }
                }
            }
        });
        CheckpointWriter { tx, progress, task }
    }
}

/// Creates `state_dir` (private) if it is missing.
/// Whether a staged file of `len` bytes is at `path`.
fn whole_at(path: &Path, len: u64) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() == len)
}

/// Where `job`'s fetched staged files go under `staged_dir`; none for an
/// id that would reach outside it.
fn fetched_dir(staged_dir: &Path, job: &str) -> Option<PathBuf> {
    let plain = !job.is_empty() && job != "." && job != ".." && !job.contains(['/', '\\', '\0']);
    plain.then(|| staged_dir.join(job))
}

fn create_state_dir(state_dir: &Path) -> Result<(), DurabilityError> {
    refract_private_dirs::create_private_dir_all(state_dir)
        .map_err(|e| StoreError::Backend(format!("creating {}: {e}", state_dir.display())))?;
    Ok(())
}

/// A record's job, pipeline and options, or why they cannot be read.
fn decode_record(
    id: &str,
    bytes: &[u8],
) -> Result<(JobRecord, Pipeline, prost_types::Struct), DurabilityError> {
    let bad = |reason: String| DurabilityError::Record {
        job: id.to_string(),
        reason,
    };
    let record = JobRecord::decode(bytes).map_err(|e| bad(e.to_string()))?;
    let pipeline = Pipeline::decode(record.pipeline.as_slice()).map_err(|e| bad(e.to_string()))?;
    let options =
        prost_types::Struct::decode(record.options.as_slice()).map_err(|e| bad(e.to_string()))?;
    Ok((record, pipeline, options))
}

fn staged_artifact(s: StagedRecord) -> StagedArtifact {
    StagedArtifact {
        type_urn: s.type_urn,
        type_payload: s.type_payload,
        path: s.path.into(),
        sha256: s.sha256,
        len: s.len,
    }
}

/// A job's checkpoint writer (see [`Durability::checkpoint_writer`]).
pub struct CheckpointWriter {
    /// Where the engine sends checkpoints.
    pub tx: mpsc::Sender<Vec<(String, Bytes)>>,
    /// How far the writing has got.
    pub progress: watch::Receiver<CheckpointProgress>,
    /// Ends once the engine drops `tx` and the last checkpoint is written.
    pub task: tokio::task::JoinHandle<()>,
}

/// Name of the checkpoint part holding the job's committed metrics.
pub const METRICS_PART: &str = "metrics";

/// The job's committed metrics as a checkpoint part.
pub fn metrics_part(job: &Job) -> Bytes {
    let results = MetricResults {
        committed: job.metrics().committed_infos(),
        attempted: Vec::new(),
    };
    Bytes::from(results.encode_to_vec())
}

/// Puts a checkpoint's metrics back into `job`: its counters go on from
/// there. A checkpoint without them (a savepoint of an older runner)
/// leaves the metrics as they are.
///
/// Metrics are kept by transform id, and ids change with the pipeline
/// (Python's count transforms): a transform's metrics move to the id its
/// unique name (renamed by `renamed`) has in this pipeline (as
/// `job.metrics()` was told), and those of a transform it no longer has go.
pub fn restore_metrics(
    job: &Job,
    parts: &[(String, Bytes)],
    renamed: &NameMapping,
) -> Result<(), DurabilityError> {
    if let Some(committed) = checkpointed_metrics(job, parts, renamed)? {
        job.metrics().restore(&committed);
    }
    Ok(())
}

/// The committed metrics an engine checkpoint holds (`None` without
/// them), moved to this pipeline's transform ids as [`restore_metrics`]
/// moves them.
pub fn checkpointed_metrics(
    job: &Job,
    parts: &[(String, Bytes)],
    renamed: &NameMapping,
) -> Result<Option<Vec<MonitoringInfo>>, DurabilityError> {
    let Some((_, bytes)) = parts.iter().find(|(name, _)| name == METRICS_PART) else {
        return Ok(None);
    };
    let unreadable = |reason: String| DurabilityError::Record {
        job: job.id().to_string(),
        reason,
    };
    let mut results = MetricResults::decode(bytes.as_ref())
        .map_err(|e| unreadable(format!("its checkpointed metrics: {e}")))?;
    // (The engine read the `engine` part already; without one, ids stay.)
    let old_names: HashMap<String, String> = describe_checkpoint(parts)
        .map(|info| info.transforms.into_iter().collect())
        .unwrap_or_default();
    let new_ids = if old_names.is_empty() {
        HashMap::new()
    } else {
        job.metrics().transform_ids_by_name()
    };
    let new_id = |old_id: &str| match old_names.get(old_id) {
        Some(name) => renamed_name(renamed, name).and_then(|name| new_ids.get(&name).cloned()),
        None => Some(old_id.to_string()),
    };
    results
        .committed
        .retain_mut(|info| match info.labels.get_mut(PTRANSFORM_LABEL) {
            Some(transform) => match new_id(transform) {
                Some(id) => {
                    *transform = id;
                    true
                }
                None => false,
            },
            None => true,
        });
    Ok(Some(results.committed))
}

/// The label naming a metric's transform, by its id.
const PTRANSFORM_LABEL: &str = "PTRANSFORM";

#[cfg(test)]
mod tests;
