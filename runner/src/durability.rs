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

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use refract_engine::manager::CheckpointProgress;
use refract_jobservice::{Job, RecoveredJob, StagedArtifact};
use refract_proto::job_api::MetricResults;
use refract_proto::pipeline::Pipeline;
use refract_proto::prost_types;
use refract_store::{Checkpoint, Store, StoreError};
use thiserror::Error;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use crate::insights::JobView;

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
}

impl Durability {
    /// Opens the store under `state_dir` (created if missing); jobs will
    /// checkpoint every `interval`.
    pub fn open(state_dir: &Path, interval: Duration) -> Result<Self, DurabilityError> {
        std::fs::create_dir_all(state_dir)
            .map_err(|e| StoreError::Backend(format!("creating {}: {e}", state_dir.display())))?;
        Ok(Durability {
            store: Arc::new(Store::open(&state_dir.join("db"))?),
            interval,
        })
    }

    /// How often running jobs checkpoint.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The jobs an earlier server accepted and did not finish.
    pub fn recovered_jobs(&self) -> Result<Vec<RecoveredJob>, DurabilityError> {
        let mut jobs = Vec::new();
        for (id, bytes) in self.store.jobs()? {
            let bad = |reason: String| DurabilityError::Record {
                job: id.clone(),
                reason,
            };
            let record = JobRecord::decode(bytes.as_ref()).map_err(|e| bad(e.to_string()))?;
            let pipeline =
                Pipeline::decode(record.pipeline.as_slice()).map_err(|e| bad(e.to_string()))?;
            let options = prost_types::Struct::decode(record.options.as_slice())
                .map_err(|e| bad(e.to_string()))?;
            let staged = record
                .staged
                .into_iter()
                .map(|s| StagedArtifact {
                    type_urn: s.type_urn,
                    type_payload: s.type_payload,
                    path: s.path.into(),
                    sha256: s.sha256,
                    len: s.len,
                })
                .collect();
            jobs.push(RecoveredJob {
                id,
                name: record.name,
                pipeline,
                options,
                staged,
            });
        }
        Ok(jobs)
    }

    /// Records `job` so that a later server can take it over.
    pub fn remember(&self, job: &Job) -> Result<(), DurabilityError> {
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
        };
        Ok(self.store.put_job(job.id(), &record.encode_to_vec())?)
    }

    /// Forgets a job that ended: nothing of it is resumed again.
    pub fn forget(&self, job_id: &str) -> Result<(), DurabilityError> {
        Ok(self.store.remove_job(job_id)?)
    }

    /// Where `job_id`'s engine keeps user state beside its checkpoints
    /// ([`refract_engine::manager::Engine::with_durable_state`]).
    pub fn state_store(&self, job_id: &str) -> Arc<dyn refract_engine::spill::SpillStore> {
        Arc::new(crate::durable_state::DurableStateStore::new(
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
    pub fn checkpoint_writer(&self, job_id: &str, view: Arc<JobView>) -> CheckpointWriter {
        let (tx, mut rx) = mpsc::channel::<Vec<(String, Bytes)>>(1);
        let (report, progress) = watch::channel(CheckpointProgress::default());
        let store = self.store.clone();
        let job_id = job_id.to_string();
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
                        view.observe_checkpoint(stats);
                        report.send_replace(CheckpointProgress::all_durable(received));
                    }
                    Ok(Err(error)) => {
                        warn!(job = %job_id, %error, "writing a checkpoint failed");
                        report.send_modify(|p| p.finished = received);
                    }
                    Err(error) => {
                        warn!(job = %job_id, %error, "the checkpoint writer panicked");
                        report.send_modify(|p| p.finished = received);
                    }
                }
            }
        });
        CheckpointWriter { tx, progress, task }
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
pub fn restore_metrics(job: &Job, parts: &[(String, Bytes)]) -> Result<(), DurabilityError> {
    let Some((_, bytes)) = parts.iter().find(|(name, _)| name == METRICS_PART) else {
        return Ok(());
    };
    let results = MetricResults::decode(bytes.as_ref()).map_err(|e| DurabilityError::Record {
        job: job.id().to_string(),
        reason: format!("its checkpointed metrics: {e}"),
    })?;
    job.metrics().restore(&results.committed);
    Ok(())
}
