//! Scratch space for GroupByKey buffers larger than memory.
//!
//! A RocksDB database of its own, apart from the job store: what is spilled
//! is not durable state (a checkpoint never points into it), so writes skip
//! the write-ahead log and are never synced, and the database is emptied
//! when opened — whatever a previous process left there is garbage.
//!
//! Writes never wait inside RocksDB for a write stall: on a full disk,
//! RocksDB keeps "recovering" from the failed flush (polling for free
//! space every few seconds, for ever), and a writer already waiting for
//! that flush waits with it — the job would neither fail nor end. Told not
//! to wait, a write says it was stalled; it is tried again shortly, and
//! once the flush has failed the next try returns its error.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::spill_reclaim::ReclaimLedger;
use crate::StoreError;

/// Spilled entries: (key, value).
pub type SpillEntries = Vec<(Vec<u8>, Vec<u8>)>;

/// The spill database.
pub struct SpillDb {
    db: rocksdb::DB,
    dir: PathBuf,
    /// Deletions whose space is yet to be given back.
    reclaim: Mutex<ReclaimLedger>,
    /// Compactions deletions asked for.
    compactions: AtomicU64,
}

impl std::fmt::Debug for SpillDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillDb").field("dir", &self.dir).finish()
    }
}

fn backend(e: rocksdb::Error) -> StoreError {
    StoreError::Backend(e.into_string())
}

fn options() -> rocksdb::Options {
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    // Spilled values are mostly user bytes; LZ4 is cheap when they do not
    // compress.
    options.set_compression_type(rocksdb::DBCompressionType::Lz4);
    // Memtables are what the spill costs in memory: two of 32 MiB.
    options.set_write_buffer_size(32 << 20);
    options.set_max_write_buffer_number(2);
    options
}

impl SpillDb {
    /// Opens an empty spill database in `dir` (created if missing; a
    /// database already there is destroyed first).
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Backend(format!("creating {}: {e}", dir.display())))?;
        let options = options();
        rocksdb::DB::destroy(&options, dir).map_err(|e| {
            StoreError::Backend(format!("clearing {}: {}", dir.display(), e.into_string()))
        })?;
        let db = rocksdb::DB::open(&options, dir).map_err(|e| {
            StoreError::Backend(format!("opening {}: {}", dir.display(), e.into_string()))
        })?;
        // Spilled data is the jobs' data: this user's only (clearing the
        // database made the directory anew, with the default mode).
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| StoreError::Backend(format!("protecting {}: {e}", dir.display())))?;
        Ok(SpillDb {
            db,
            dir: dir.to_path_buf(),
            reclaim: Mutex::new(ReclaimLedger::default()),
            compactions: AtomicU64::new(0),
        })
    }

    /// Where it lives.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn write_options() -> rocksdb::WriteOptions {
        let mut options = rocksdb::WriteOptions::default();
        options.disable_wal(true);
        // A stall is waited out here, not in RocksDB (see the module docs).
        options.set_no_slowdown(true);
        options
    }

    /// Writes the batch `make` builds (again after each stall).
    fn write(&self, make: impl Fn() -> rocksdb::WriteBatch) -> Result<(), StoreError> {
        let options = Self::write_options();
        through_stalls(|| self.db.write_opt(make(), &options), stalled).map_err(backend)
    }

    /// Writes `entries` (not durable).
    pub fn put(&self, entries: SpillEntries) -> Result<(), StoreError> {
        self.write(|| {
            let mut batch = rocksdb::WriteBatch::default();
            for (k, v) in &entries {
                batch.put(k, v);
            }
            batch
        })
    }

    /// Entries with keys in `[from, to)` in key order, stopping after the
    /// entry that brings the values read past `max_bytes`.
    pub fn scan(
        &self,
        from: &[u8],
        to: &[u8],
        max_bytes: usize,
    ) -> Result<SpillEntries, StoreError> {
        let mut read = rocksdb::ReadOptions::default();
        read.set_iterate_upper_bound(to.to_vec());
        // A drain reads each entry once: keep it out of the block cache.
        read.fill_cache(false);
        let iter = self.db.iterator_opt(
            rocksdb::IteratorMode::From(from, rocksdb::Direction::Forward),
            read,
        );
        let mut out = Vec::new();
        let mut bytes = 0;
        for item in iter {
            let (k, v) = item.map_err(backend)?;
            bytes += v.len();
            out.push((k.to_vec(), v.to_vec()));
            if bytes > max_bytes {
                break;
            }
        }
        Ok(out)
    }

    /// Forgets every key in `[from, to)` and gives their disk space back
    /// soon: once deletions since the last compaction made at least half
    /// of the files' bytes dead, one compaction over their span drops them
    /// (see the `spill_reclaim` module), so many small ranges cost no more
    /// than a few large ones.
    pub fn delete_range(&self, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        let dead = self
            .db
            .get_approximate_sizes(&[rocksdb::Range::new(from, to)])
            .first()
            .copied()
            .unwrap_or(0);
        self.forget_range(from, to)?;
        let on_disk = self
            .db
            .property_int_value("rocksdb.live-sst-files-size")
            .map_err(backend)?
            .unwrap_or(0);
        let due = self.reclaim.lock().deleted(from, to, dead, on_disk);
        if let Some((start, end)) = due {
            self.db.compact_range(Some(start), Some(end));
            self.compactions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// How many compactions deletions have asked for: what giving spilled
    /// space back has cost, besides the writes.
    pub fn compactions(&self) -> u64 {
        self.compactions.load(Ordering::Relaxed)
    }

    /// Forgets every key in `[from, to)`, leaving their disk space to
    /// RocksDB's own compactions: for ranges deleted often and soon after
    /// they were written (most never leave the memtable).
    pub fn forget_range(&self, from: &[u8], to: &[u8]) -> Result<(), StoreError> {
        self.write(|| {
            let mut batch = rocksdb::WriteBatch::default();
            batch.delete_range(from, to);
            batch
        })
    }
}

/// How long a stalled write waits before it is tried again: at first, and
/// at most.
const STALL_WAIT: Duration = Duration::from_millis(1);
const MAX_STALL_WAIT: Duration = Duration::from_millis(50);

/// Whether RocksDB refused a write only because writes are stalled for now
/// (its memtables wait for a flush) and the write was told not to wait.
fn stalled(error: &rocksdb::Error) -> bool {
    error.kind() == rocksdb::ErrorKind::Incomplete && error.as_ref().ends_with("Write stall")
}

/// Makes `attempt` until it is not `stalled`, waiting a little longer after
/// each stall; its first other outcome, error or not.
fn through_stalls<E>(
    mut attempt: impl FnMut() -> Result<(), E>,
    stalled: impl Fn(&E) -> bool,
) -> Result<(), E> {
    let mut wait = STALL_WAIT;
    loop {
        match attempt() {
            Err(error) if stalled(&error) => {
                std::thread::sleep(wait);
                wait = (wait * 2).min(MAX_STALL_WAIT);
            }
            outcome => return outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_back_in_key_order_until_deleted_and_reopening_clears() {
        let dir = tempfile::tempdir().unwrap();
        let db = SpillDb::open(dir.path()).unwrap();
        db.put(vec![
            (b"b2".to_vec(), b"x".to_vec()),
            (b"b1".to_vec(), b"yy".to_vec()),
        ])
        .unwrap();
        db.put(vec![
            (b"a".to_vec(), b"z".to_vec()),
            (b"c".to_vec(), b"w".to_vec()),
        ])
        .unwrap();
        let all = db.scan(b"b", b"c", usize::MAX).unwrap();
        assert_eq!(
            all,
            vec![
                (b"b1".to_vec(), b"yy".to_vec()),
                (b"b2".to_vec(), b"x".to_vec())
            ]
        );
        assert_eq!(
            db.scan(b"a", b"d", 0).unwrap().len(),
            1,
            "stops past the limit"
        );
        db.delete_range(b"b", b"c").unwrap();
        assert!(db.scan(b"b", b"c", usize::MAX).unwrap().is_empty());
        drop(db);
        let db = SpillDb::open(dir.path()).unwrap();
        assert!(db.scan(b"", b"\xff", usize::MAX).unwrap().is_empty());
    }

    #[test]
    fn windows_deleted_one_by_one_are_reclaimed_in_few_compactions() {
        // A GroupByKey that spilled 100 windows 16 times: every flushed file
        // holds a run of every window. Compacting at each window's deletion
        // rewrote every file a hundred times; the space must still all come
        // back, in a few compactions.
        let dir = tempfile::tempdir().unwrap();
        let db = SpillDb::open(dir.path()).unwrap();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut noise = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect()
        };
        const WINDOWS: u16 = 100;
        for run in 0..16u8 {
            let entries = (0..WINDOWS)
                .map(|w| {
                    let mut key = w.to_be_bytes().to_vec();
                    key.push(run);
                    (key, noise(8 << 10))
                })
                .collect();
            db.put(entries).unwrap();
            db.db.flush().unwrap();
        }
        let live = |db: &SpillDb| {
            db.db
                .property_int_value("rocksdb.live-sst-files-size")
                .unwrap()
                .unwrap_or(0)
        };
        let spilled = live(&db);
        assert!(spilled > 8 << 20, "{spilled} bytes on disk");
        for w in 0..WINDOWS {
            db.delete_range(&w.to_be_bytes(), &(w + 1).to_be_bytes())
                .unwrap();
        }
        assert!(db.scan(b"", b"\xff", usize::MAX).unwrap().is_empty());
        let compactions = db.compactions();
        assert!(
            (1..=12).contains(&compactions),
            "{compactions} compactions for {WINDOWS} windows"
        );
        let left = live(&db);
        assert!(
            left < spilled / 20,
            "{left} of {spilled} bytes still on disk"
        );
    }

    #[test]
    fn a_stalled_write_is_tried_again_until_it_is_written_or_fails() {
        // Stalled twice, then the flush it waited for failed (a full disk):
        // that error comes back, instead of a wait for ever.
        let mut attempts = 0;
        let outcome = through_stalls(
            || {
                attempts += 1;
                match attempts {
                    1 | 2 => Err("Result incomplete: Write stall"),
                    _ => Err("IO error: No space left on device"),
                }
            },
            |e: &&str| e.ends_with("Write stall"),
        );
        assert_eq!(outcome, Err("IO error: No space left on device"));
        assert_eq!(attempts, 3);
        // Stalled, then written.
        let mut attempts = 0;
        let outcome = through_stalls(
            || {
                attempts += 1;
                if attempts == 1 {
                    Err("Result incomplete: Write stall")
                } else {
                    Ok(())
                }
            },
            |e: &&str| e.ends_with("Write stall"),
        );
        assert_eq!((outcome, attempts), (Ok(()), 2));
    }

    #[test]
    fn writes_that_may_not_wait_go_through_when_nothing_stalls() {
        let dir = tempfile::tempdir().unwrap();
        let db = SpillDb::open(dir.path()).unwrap();
        // No stall here: writes with no_slowdown go through, and read back.
        db.put(vec![(b"k".to_vec(), b"v".to_vec())]).unwrap();
        db.forget_range(b"k", b"l").unwrap();
        assert!(db.scan(b"", b"\xff", usize::MAX).unwrap().is_empty());
    }
}
