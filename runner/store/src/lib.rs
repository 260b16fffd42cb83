//! Durable storage for Refract: what a restarted runner needs to resume
//! its jobs.
//!
//! Two things are kept per job: its *record* (an opaque blob the runner
//! writes when the job is accepted: pipeline, options, staged artifacts)
//! and its latest *checkpoint*, a set of named parts (one per piece of
//! engine state: a stage's queue, its timers, its user state, ...).
//!
//! Checkpoints are incremental: a part whose bytes did not change since
//! the job's previous checkpoint is not written again, only referenced by
//! the new checkpoint's manifest. A checkpoint — its new parts, the
//! manifest naming every part, and the deletion of the parts it replaced —
//! is one atomic write, so a crash at any moment (even in the middle of a
//! checkpoint) leaves the previous checkpoint whole, and only the latest
//! checkpoint is ever kept.
//!
//! The logic is written once over a tiny key-value interface ([`Kv`]) with
//! three backends: [`MemoryKv`] (tests, and servers without `--state_dir`),
//! [`RocksKv`] (RocksDB, synced writes) and [`ObjectKv`] (a bucket of an
//! S3-compatible object store, `--checkpoint_store`).
//!
//! A job may also keep state *beside* its checkpoints (user state too large
//! for memory, [`Store::put_state`]): entries it writes once and deletes
//! when no checkpoint needs them any more, which its checkpoint parts name
//! instead of holding. They are written ahead like chunks, so the next
//! checkpoint's synced write makes them durable with it, and they go with
//! the job.
//!
//! Key layout: `j/{job}` the record; `m/{job}` the manifest;
//! `p/{job}/{part}/{version}` a part's bytes at the checkpoint that wrote
//! it — or, for a part larger than a chunk, `p/{job}/{part}/{version}/{n}`
//! its chunks in order; `s/{job}/{key}` the job's state beside its
//! checkpoints. A large part is written in chunks ahead of the
//! checkpoint's atomic write (under a version no manifest names yet, so a
//! crash in between leaves the previous checkpoint whole, and the next
//! checkpoint, which writes that version, deletes what it left), because one
//! write of it would hold it twice more in memory — in the write batch and
//! in RocksDB's memtable — beside the engine's state and the part itself.

mod kv;
mod manifest;
mod object_files;
mod object_kv;
mod object_runtime;
mod object_url;
pub mod savepoint;
pub mod savepoint_dir;
mod spill;
mod spill_reclaim;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use thiserror::Error;

pub use kv::{Deletion, Kv, MemoryKv, RocksKv};
use manifest::{Manifest, PartRef};
pub use object_files::ObjectFiles;
pub use object_kv::ObjectKv;
pub use object_url::ObjectUrl;
pub use savepoint::{read_savepoint, write_savepoint};
pub use savepoint_dir::SavepointDir;
pub use spill::SpillDb;

/// Why the store failed.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The backend failed (I/O, a corrupt database, a lock held by another
    /// process).
    #[error("state store: {0}")]
    Backend(String),
    /// Stored bytes are not what this version of Refract writes.
    #[error("state store: corrupt {what}: {why}")]
    Corrupt {
        /// Which entry.
        what: String,
        /// What is wrong with it.
        why: String,
    },
}

/// A job's latest checkpoint, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Its number: 1 for a job's first checkpoint, then one more each time.
    pub id: u64,
    /// The parts by name, in the order they were given.
    pub parts: Vec<(String, Bytes)>,
}

/// What writing one checkpoint did, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointStats {
    /// The checkpoint's number.
    pub id: u64,
    /// Parts in the checkpoint.
    pub parts: usize,
    /// Parts that changed and were written.
    pub parts_written: usize,
    /// Bytes written (changed parts and the manifest).
    pub bytes_written: u64,
    /// Bytes of the whole checkpoint (every part).
    pub total_bytes: u64,
    /// How long the write took.
    pub duration: Duration,
}

/// Parts larger than this are written in chunks of this size.
const CHUNK_BYTES: usize = 4 << 20;

/// Chunks of a large part written ahead together, in one write.
const CHUNKS_PER_WRITE: usize = 4;

/// Job records and checkpoints over a [`Kv`] backend.
pub struct Store {
    kv: Box<dyn Kv>,
    /// Each job's last manifest, so a checkpoint need not read it back.
    manifests: Mutex<HashMap<String, Manifest>>,
    /// Parts larger than this are written in chunks of this size.
    chunk_bytes: usize,
    /// Jobs whose last checkpoint attempt in this process succeeded: no
    /// attempt cut short left chunks under the version their next
    /// checkpoint writes (see [`Store::checkpoint`]).
    swept: Mutex<std::collections::HashSet<String>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

fn job_key(job: &str) -> Vec<u8> {
    format!("j/{job}").into_bytes()
}

/// What every key of `job`'s state beside its checkpoints starts with.
fn state_prefix(job: &str) -> Vec<u8> {
    format!("s/{job}/").into_bytes()
}

fn state_key(job: &str, key: &[u8]) -> Vec<u8> {
    let mut full = state_prefix(job);
    full.extend_from_slice(key);
    full
}

/// The mark of a job that ended for good, until what it kept is removed.
fn ended_key(job: &str) -> Vec<u8> {
    format!("e/{job}").into_bytes()
}

fn manifest_key(job: &str) -> Vec<u8> {
    format!("m/{job}").into_bytes()
}

fn part_key(job: &str, part: &str, version: u64) -> Vec<u8> {
    format!("p/{job}/{part}/{version:020}").into_bytes()
}

/// What every chunk key of a part's version starts with.
fn chunk_prefix(job: &str, part: &str, version: u64) -> Vec<u8> {
    format!("p/{job}/{part}/{version:020}/").into_bytes()
}

fn chunk_key(job: &str, part: &str, version: u64, chunk: usize) -> Vec<u8> {
    format!("p/{job}/{part}/{version:020}/{chunk:08}").into_bytes()
}

/// Deletes a part's version as the manifest names it: its key, or its
/// chunks (one range delete, whatever their number).
fn part_deletion(job: &str, part: &PartRef) -> Deletion {
    if part.chunks == 0 {
        Deletion::Key(part_key(job, &part.name, part.version))
    } else {
        Deletion::Prefix(chunk_prefix(job, &part.name, part.version))
    }
}

/// The full key that ends a range of `job`'s state at `to` (empty: the
/// end of the job's state).
fn state_range_end(job: &str, to: &[u8]) -> Result<Vec<u8>, StoreError> {
    if to.is_empty() {
        kv::prefix_end(&state_prefix(job))
            .ok_or_else(|| StoreError::Backend(format!("job id {job:?} has no key range")))
    } else {
        Ok(state_key(job, to))
    }
}

impl Store {
    /// A store over `kv`.
    pub fn new(kv: impl Kv + 'static) -> Self {
        Store {
            kv: Box::new(kv),
            manifests: Mutex::default(),
            chunk_bytes: CHUNK_BYTES,
            swept: Mutex::default(),
        }
    }

    /// The same store writing parts larger than `bytes` in chunks of
    /// `bytes` (tests use small ones).
    #[cfg(test)]
    pub(crate) fn with_chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes.max(1);
        self
    }

    /// An in-memory store (nothing survives the process).
    pub fn in_memory() -> Self {
        Store::new(MemoryKv::default())
    }

    /// A RocksDB store in `dir` (created if missing).
    pub fn open(dir: &std::path::Path) -> Result<Self, StoreError> {
        Ok(Store::new(RocksKv::open(dir)?))
    }

    /// A store in the object storage `url` names (`s3://BUCKET/PREFIX`;
    /// see [`ObjectUrl::connect`]).
    pub fn open_url(url: &str) -> Result<Self, StoreError> {
        let url: ObjectUrl = url.parse()?;
        Ok(Store::new(ObjectKv::open(url.connect()?, &url.prefix)?))
    }

    /// Saves `job`'s record (replacing an earlier one).
    pub fn put_job(&self, job: &str, record: &[u8]) -> Result<(), StoreError> {
        self.kv.write(
            vec![(job_key(job), Bytes::copy_from_slice(record))],
            Vec::new(),
        )
    }

    /// `job`'s record, if it has one.
    pub fn job(&self, job: &str) -> Result<Option<Bytes>, StoreError> {
        self.kv.get(&job_key(job))
    }

    /// Every job with a record, as `(id, record)`.
    pub fn jobs(&self) -> Result<Vec<(String, Bytes)>, StoreError> {
        Ok(self
            .kv
            .scan(b"j/")?
            .into_iter()
            .map(|(k, v)| (String::from_utf8_lossy(&k[2..]).into_owned(), v))
            .collect())
    }

    /// Marks `job` as ended for good, in one small durable write, before
    /// what it kept is removed: if the removal fails (a full disk), the
    /// mark still says the job must not run again ([`Self::ended_jobs`]).
    pub fn mark_ended(&self, job: &str) -> Result<(), StoreError> {
        self.kv
            .write(vec![(ended_key(job), Bytes::new())], Vec::new())
    }

    /// The jobs marked ended whose removal has not happened yet.
    pub fn ended_jobs(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .kv
            .scan(b"e/")?
            .into_iter()
            .map(|(k, _)| String::from_utf8_lossy(&k[2..]).into_owned())
            .collect())
    }

    /// Forgets `job`: its record, manifest, parts, state and ended mark.
    pub fn remove_job(&self, job: &str) -> Result<(), StoreError> {
        let deletes = vec![
            Deletion::Key(job_key(job)),
            Deletion::Key(ended_key(job)),
            Deletion::Key(manifest_key(job)),
            Deletion::Prefix(format!("p/{job}/").into_bytes()),
            Deletion::Prefix(state_prefix(job)),
        ];
        self.manifests.lock().remove(job);
        self.swept.lock().remove(job);
        self.kv.write(Vec::new(), deletes)
    }

    /// Writes `entries` into `job`'s state beside its checkpoints, ahead:
    /// visible at once, durable with the job's next checkpoint (which is
    /// the only thing that may name them).
    pub fn put_state(&self, job: &str, entries: Vec<(Vec<u8>, Bytes)>) -> Result<(), StoreError> {
        let entries = entries
            .into_iter()
            .map(|(key, value)| (state_key(job, &key), value))
            .collect();
        self.kv.write_ahead(entries, Vec::new())
    }

    /// A page of `job`'s state beside its checkpoints: the entries with
    /// keys in `[from, to)` (an empty `to`: to the end of the job's state),
    /// stopping after the first that brings the values past `max_bytes`.
    /// Keys are returned as [`Self::put_state`] was given them.
    pub fn scan_state(
        &self,
        job: &str,
        from: &[u8],
        to: &[u8],
        max_bytes: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StoreError> {
        let prefix = state_prefix(job);
        let end = state_range_end(job, to)?;
        let page = self.kv.scan_range(&state_key(job, from), &end, max_bytes)?;
        Ok(page
            .into_iter()
            .map(|(key, value)| (key[prefix.len()..].to_vec(), value))
            .collect())
    }

    /// Deletes the keys in `[from, to)` (an empty `to`: to the end) of
    /// `job`'s state beside its checkpoints, ahead like
    /// [`Self::put_state`]: a crash may undo it until the next checkpoint.
    pub fn delete_state(&self, job: &str, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        let end = state_range_end(job, to)?;
        self.kv
            .write_ahead(Vec::new(), vec![Deletion::Range(state_key(job, from), end)])
    }

    /// The manifest of `job`'s latest checkpoint, from the cache or the
    /// backend.
    fn manifest(&self, job: &str) -> Result<Option<Manifest>, StoreError> {
        if let Some(m) = self.manifests.lock().get(job) {
            return Ok(Some(m.clone()));
        }
        match self.kv.get(&manifest_key(job))? {
            Some(bytes) => Ok(Some(Manifest::decode(&bytes).map_err(|why| {
                StoreError::Corrupt {
                    what: format!("manifest of job {job}"),
                    why,
                }
            })?)),
            None => Ok(None),
        }
    }

    /// Writes a checkpoint of `job` made of `parts` (names unique within
    /// the checkpoint), atomically; parts unchanged since the last
    /// checkpoint are kept, not rewritten. The parts are taken, not
    /// borrowed: a part can be as large as a stage's user state, and the
    /// write lets each go once it is in the write batch.
    ///
    /// An attempt at the same checkpoint that a crash or a failed write cut
    /// short may have left chunks written ahead under the version this one
    /// writes; a part rewritten in chunks deletes them first, and the first
    /// checkpoint of a job in this process (or the one after a failed
    /// attempt) deletes those of every other part in its atomic write, so
    /// that none stay for as long as the job.
    pub fn checkpoint(
        &self,
        job: &str,
        parts: Vec<(String, Bytes)>,
    ) -> Result<CheckpointStats, StoreError> {
        let started = Instant::now();
        // Put back only once this attempt has succeeded.
        let swept = self.swept.lock().remove(job);
        let previous = self.manifest(job)?;
        let id = previous.as_ref().map_or(1, |m| m.id + 1);
        let old: HashMap<&str, &PartRef> = previous
            .as_ref()
            .map(|m| m.parts.iter().map(|p| (p.name.as_str(), p)).collect())
            .unwrap_or_default();
        let mut puts = Vec::new();
        let mut deletes = Vec::new();
        let mut refs = Vec::with_capacity(parts.len());
        let mut bytes_written = 0u64;
        let mut total_bytes = 0u64;
        let parts_total = parts.len();
        // Names in the new checkpoint: the old parts without one go.
        let mut names = std::collections::HashSet::with_capacity(parts_total);
        let mut chunked = std::collections::HashSet::new();
        for (name, data) in parts {
            let digest: [u8; 32] = Sha256::digest(&data).into();
            total_bytes += data.len() as u64;
            match old.get(name.as_str()) {
                Some(p) if p.digest == digest => refs.push((*p).clone()),
                unchanged_or_new => {
                    if let Some(p) = unchanged_or_new {
                        deletes.push(part_deletion(job, p));
                    }
                    bytes_written += data.len() as u64;
                    let chunks = if data.len() > self.chunk_bytes {
                        chunked.insert(name.clone());
                        self.write_chunks_ahead(job, &name, id, data)?
                    } else {
                        puts.push((part_key(job, &name, id), data));
                        0
                    };
                    refs.push(PartRef {
                        name: name.clone(),
                        version: id,
                        digest,
                        chunks,
                    });
                }
            }
            names.insert(name);
        }
        for (name, p) in &old {
            if !names.contains(*name) {
                deletes.push(part_deletion(job, p));
            }
        }
        if !swept {
            let every: std::collections::BTreeSet<&str> = names
                .iter()
                .map(String::as_str)
                .chain(old.keys().copied())
                .collect();
            for name in every.into_iter().filter(|n| !chunked.contains(*n)) {
                deletes.push(Deletion::Prefix(chunk_prefix(job, name, id)));
            }
        }
        let manifest = Manifest { id, parts: refs };
        let encoded = manifest.encode();
        bytes_written += encoded.len() as u64;
        let parts_written = puts.len();
        puts.push((manifest_key(job), Bytes::from(encoded)));
        self.kv.write(puts, deletes)?;
        self.manifests.lock().insert(job.to_string(), manifest);
        self.swept.lock().insert(job.to_string());
        Ok(CheckpointStats {
            id,
            parts: parts_total,
            parts_written,
            bytes_written,
            total_bytes,
            duration: started.elapsed(),
        })
    }

    /// Writes `data`, part `name` of checkpoint `id`, as chunks ahead of
    /// the checkpoint's own write, a few chunks per write, and returns how
    /// many. First go the chunks an attempt at the same checkpoint that
    /// failed (or a crash) may have left under that version: the part's
    /// chunks are read by prefix, and would include them.
    fn write_chunks_ahead(
        &self,
        job: &str,
        name: &str,
        id: u64,
        data: Bytes,
    ) -> Result<u32, StoreError> {
        let count = data.len().div_ceil(self.chunk_bytes);
        let count = u32::try_from(count).map_err(|_| {
            StoreError::Backend(format!("part '{name}' has too many chunks ({count})"))
        })?;
        let mut deletes = vec![Deletion::Prefix(chunk_prefix(job, name, id))];
        let mut puts = Vec::with_capacity(CHUNKS_PER_WRITE);
        for (n, start) in (0..data.len()).step_by(self.chunk_bytes).enumerate() {
            let end = (start + self.chunk_bytes).min(data.len());
            puts.push((chunk_key(job, name, id, n), data.slice(start..end)));
            if puts.len() == CHUNKS_PER_WRITE {
                self.kv
                    .write_ahead(std::mem::take(&mut puts), std::mem::take(&mut deletes))?;
            }
        }
        if !puts.is_empty() || !deletes.is_empty() {
            self.kv.write_ahead(puts, deletes)?;
        }
        Ok(count)
    }

    /// The bytes of part `p` of `job`'s checkpoint `id`, whole or from its
    /// chunks.
    fn read_part(&self, job: &str, id: u64, p: &PartRef) -> Result<Bytes, StoreError> {
        let missing = |what: String| StoreError::Corrupt {
            what: format!("checkpoint {id} of job {job}"),
            why: format!("part '{}' (version {}) {what}", p.name, p.version),
        };
        if p.chunks == 0 {
            return self
                .kv
                .get(&part_key(job, &p.name, p.version))?
                .ok_or_else(|| missing("is missing".into()));
        }
        let chunks = self.kv.scan(&chunk_prefix(job, &p.name, p.version))?;
        if chunks.len() != p.chunks as usize {
            return Err(missing(format!(
                "has {} chunks, not {}",
                chunks.len(),
                p.chunks
            )));
        }
        let mut data = bytes::BytesMut::with_capacity(chunks.iter().map(|(_, c)| c.len()).sum());
        for (_, chunk) in chunks {
            data.extend_from_slice(&chunk);
        }
        Ok(data.freeze())
    }

    /// `job`'s latest complete checkpoint, if it has one.
    pub fn latest_checkpoint(&self, job: &str) -> Result<Option<Checkpoint>, StoreError> {
        let Some(manifest) = self.manifest(job)? else {
            return Ok(None);
        };
        let mut parts = Vec::with_capacity(manifest.parts.len());
        for p in &manifest.parts {
            let data = self.read_part(job, manifest.id, p)?;
            let digest: [u8; 32] = Sha256::digest(&data).into();
            if digest != p.digest {
                return Err(StoreError::Corrupt {
                    what: format!("checkpoint {} of job {job}", manifest.id),
                    why: format!("part '{}' does not match its digest", p.name),
                });
            }
            parts.push((p.name.clone(), data));
        }
        Ok(Some(Checkpoint {
            id: manifest.id,
            parts,
        }))
    }
}

#[cfg(test)]
mod tests;
