//! The key-value interface the store is written over, and its backends.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::StoreError;

/// What a write deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    /// One key.
    Key(Vec<u8>),
    /// Every key that starts with these bytes, without reading them (a
    /// large part's chunks, a job's parts). Not empty.
    Prefix(Vec<u8>),
    /// Every key in `[from, to)`, without reading them (state a job keeps
    /// outside its checkpoints that a restore found no checkpoint names).
    Range(Vec<u8>, Vec<u8>),
}

/// Ordered keys with atomic multi-key writes: all a checkpoint needs.
pub trait Kv: Send + Sync {
    /// The value of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError>;
    /// Every entry whose key starts with `prefix`, in key order.
    fn scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Bytes)>, StoreError>;
    /// The entries with keys in `[from, to)`, in key order, stopping after
    /// the first entry that brings the values read past `max_bytes` (so at
    /// least one if any is there): a page of a range that may be large.
    fn scan_range(
        &self,
        from: &[u8],
        to: &[u8],
        max_bytes: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StoreError>;
    /// Applies `deletes`, then `puts`, together and durably: after a crash
    /// either all of them are visible or none. Values are shared, not
    /// copied: a checkpoint part can be as large as a stage's user state.
    fn write(&self, puts: Vec<(Vec<u8>, Bytes)>, deletes: Vec<Deletion>) -> Result<(), StoreError>;

    /// Like [`Kv::write`], but neither durable nor atomic with anything
    /// until the next `write`, which makes it durable too: for the chunks
    /// of a large part, written under keys nothing refers to yet before
    /// the write that names them, so that no one write holds it all.
    fn write_ahead(
        &self,
        puts: Vec<(Vec<u8>, Bytes)>,
        deletes: Vec<Deletion>,
    ) -> Result<(), StoreError> {
        self.write(puts, deletes)
    }
}

/// The first key after every key starting with `prefix` (`None`: no key
/// is; the prefix is all `0xff`).
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The entries whose keys start with `prefix`, in key order.
pub(crate) fn under<'a, V>(
    entries: &'a BTreeMap<Vec<u8>, V>,
    prefix: &'a [u8],
) -> impl Iterator<Item = (&'a Vec<u8>, &'a V)> {
    entries
        .range(prefix.to_vec()..)
        .take_while(move |(k, _)| k.starts_with(prefix))
}

/// The first entries of `range`, up to the one whose value brings them
/// past `max_bytes` (see [`Kv::scan_range`]).
fn page_of(
    range: impl Iterator<Item = Result<(Vec<u8>, Bytes), StoreError>>,
    max_bytes: usize,
) -> Result<Vec<(Vec<u8>, Bytes)>, StoreError> {
    let mut page = Vec::new();
    let mut bytes = 0usize;
    for entry in range {
        let (key, value) = entry?;
        bytes += value.len();
        page.push((key, value));
        if bytes > max_bytes {
            break;
        }
    }
    Ok(page)
}

/// Keys in memory: for tests and for servers without a state directory.
#[derive(Debug, Default)]
pub struct MemoryKv {
    entries: Mutex<BTreeMap<Vec<u8>, Bytes>>,
}

impl Kv for MemoryKv {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        Ok(self.entries.lock().get(key).cloned())
    }

    fn scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Bytes)>, StoreError> {
        Ok(under(&self.entries.lock(), prefix)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn scan_range(
        &self,
        from: &[u8],
        to: &[u8],
        max_bytes: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StoreError> {
        let entries = self.entries.lock();
        let mut page = Vec::new();
        let mut bytes = 0usize;
        for (k, v) in entries
            .range(from.to_vec()..)
            .take_while(|(k, _)| k.as_slice() < to)
        {
            bytes += v.len();
            page.push((k.clone(), v.clone()));
            if bytes > max_bytes {
                break;
            }
        }
        Ok(page)
    }

    fn write(&self, puts: Vec<(Vec<u8>, Bytes)>, deletes: Vec<Deletion>) -> Result<(), StoreError> {
        let mut entries = self.entries.lock();
        for deletion in deletes {
            match deletion {
                Deletion::Key(k) => {
                    entries.remove(&k);
                }
                Deletion::Prefix(prefix) => {
                    let doomed: Vec<Vec<u8>> =
                        under(&entries, &prefix).map(|(k, _)| k.clone()).collect();
                    for k in doomed {
                        entries.remove(&k);
                    }
                }
                Deletion::Range(from, to) => {
                    let doomed: Vec<Vec<u8>> = entries
                        .range(from..)
                        .take_while(|(k, _)| k.as_slice() < to.as_slice())
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in doomed {
                        entries.remove(&k);
                    }
                }
            }
        }
        for (k, v) in puts {
            entries.insert(k, v);
        }
        Ok(())
    }
}

/// Once writes put this many bytes since the last flush, the memtable is
/// flushed at once.
const FLUSH_AFTER_BYTES: usize = 16 << 20;

/// Keys in a RocksDB database; every write is one write batch, synced
/// except ahead writes.
pub struct RocksKv {
    db: rocksdb::DB,
    /// Bytes put since the memtable was last flushed by us.
    unflushed: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for RocksKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksKv")
            .field("path", &self.db.path())
            .finish()
    }
}

fn backend(e: rocksdb::Error) -> StoreError {
    StoreError::Backend(e.into_string())
}

impl RocksKv {
    /// Opens (or creates) the database in `dir`. Fails if another process
    /// has it open.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        options.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let db = rocksdb::DB::open(&options, dir).map_err(|e| {
            StoreError::Backend(format!("opening {}: {}", dir.display(), e.into_string()))
        })?;
        Ok(RocksKv {
            db,
            unflushed: Default::default(),
        })
    }

    /// Bytes held in memtables (what a flush gives back).
    #[cfg(test)]
    pub(crate) fn memtable_bytes(&self) -> u64 {
        self.db
            .property_int_value("rocksdb.cur-size-all-mem-tables")
            .ok()
            .flatten()
            .unwrap_or(0)
    }
}

impl Kv for RocksKv {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        Ok(self.db.get(key).map_err(backend)?.map(Bytes::from))
    }

    fn scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Bytes)>, StoreError> {
        let mut out = Vec::new();
        let iter = self.db.iterator(rocksdb::IteratorMode::From(
            prefix,
            rocksdb::Direction::Forward,
        ));
        for item in iter {
            let (k, v) = item.map_err(backend)?;
            if !k.starts_with(prefix) {
                break;
            }
            out.push((k.to_vec(), Bytes::from(v.to_vec())));
        }
        Ok(out)
    }

    fn scan_range(
        &self,
        from: &[u8],
        to: &[u8],
        max_bytes: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StoreError> {
        let mut options = rocksdb::ReadOptions::default();
        options.set_iterate_upper_bound(to.to_vec());
        let range = self
            .db
            .iterator_opt(
                rocksdb::IteratorMode::From(from, rocksdb::Direction::Forward),
                options,
            )
            .map(|item| {
                let (k, v) = item.map_err(backend)?;
                Ok((k.to_vec(), Bytes::from(v.to_vec())))
            });
        page_of(range, max_bytes)
    }

    fn write(&self, puts: Vec<(Vec<u8>, Bytes)>, deletes: Vec<Deletion>) -> Result<(), StoreError> {
        self.write_batch(puts, deletes, true)
    }

    fn write_ahead(
        &self,
        puts: Vec<(Vec<u8>, Bytes)>,
        deletes: Vec<Deletion>,
    ) -> Result<(), StoreError> {
        // Unsynced, it is in the write-ahead log all the same; the next
        // synced write syncs the log up to itself.
        self.write_batch(puts, deletes, false)
    }
}

impl RocksKv {
    fn write_batch(
        &self,
        puts: Vec<(Vec<u8>, Bytes)>,
        deletes: Vec<Deletion>,
        sync: bool,
    ) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering;
        let mut batch = rocksdb::WriteBatch::default();
        let mut put_bytes = 0usize;
        for deletion in deletes {
            match deletion {
                Deletion::Key(k) => batch.delete(k),
                Deletion::Prefix(prefix) => match prefix_end(&prefix) {
                    Some(end) => batch.delete_range(prefix, end),
                    None => {
                        return Err(StoreError::Backend(format!(
                            "cannot delete the key prefix {prefix:?}"
                        )))
                    }
                },
                Deletion::Range(from, to) => batch.delete_range(from, to),
            }
        }
        for (k, v) in &puts {
            put_bytes += v.len();
            batch.put(k, v);
        }
        // The batch holds its own copy: the values can go before the write.
        drop(puts);
        let mut options = rocksdb::WriteOptions::default();
        options.set_sync(sync);
        self.db.write_opt(batch, &options).map_err(backend)?;
        let unflushed = self.unflushed.fetch_add(put_bytes, Ordering::Relaxed) + put_bytes;
        if unflushed >= FLUSH_AFTER_BYTES {
            // Large writes sit in a memtable until RocksDB flushes it,
            // beside the next checkpoint's parts being built: flush now,
            // so that a job with large state holds one copy of it at rest.
            // The write is done either way: a failed flush must not report
            // it failed (the caller would take it as not written).
            self.unflushed.store(0, Ordering::Relaxed);
            if let Err(error) = self.db.flush() {
                tracing::warn!(error = %error.into_string(), "cannot flush large writes");
            }
        }
        Ok(())
    }
}
