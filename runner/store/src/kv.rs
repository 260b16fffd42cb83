//! The key-value interface the store is written over, and its backends.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::StoreError;

/// Ordered keys with atomic multi-key writes: all a checkpoint needs.
pub trait Kv: Send + Sync {
    /// The value of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError>;
    /// Every entry whose key starts with `prefix`, in key order.
    fn scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Bytes)>, StoreError>;
    /// Applies `puts` and `deletes` together: after a crash either all of
    /// them are visible or none. Values are shared, not copied: a
    /// checkpoint part can be as large as a stage's user state.
    fn write(&self, puts: Vec<(Vec<u8>, Bytes)>, deletes: Vec<Vec<u8>>) -> Result<(), StoreError>;
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
        Ok(self
            .entries
            .lock()
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn write(&self, puts: Vec<(Vec<u8>, Bytes)>, deletes: Vec<Vec<u8>>) -> Result<(), StoreError> {
        let mut entries = self.entries.lock();
        for k in deletes {
            entries.remove(&k);
        }
        for (k, v) in puts {
            entries.insert(k, v);
        }
        Ok(())
    }
}

/// A write at least this large is flushed from the memtable at once.
const FLUSH_AFTER_BYTES: usize = 16 << 20;

/// Keys in a RocksDB database; every write is one synced write batch.
pub struct RocksKv {
    db: rocksdb::DB,
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
        Ok(RocksKv { db })
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

    fn write(&self, puts: Vec<(Vec<u8>, Bytes)>, deletes: Vec<Vec<u8>>) -> Result<(), StoreError> {
        let mut batch = rocksdb::WriteBatch::default();
        let mut put_bytes = 0usize;
        for k in deletes {
            batch.delete(k);
        }
        for (k, v) in &puts {
            put_bytes += v.len();
            batch.put(k, v);
        }
        // The batch holds its own copy: the values can go before the write.
        drop(puts);
        let mut options = rocksdb::WriteOptions::default();
        options.set_sync(true);
        self.db.write_opt(batch, &options).map_err(backend)?;
        if put_bytes >= FLUSH_AFTER_BYTES {
            // A large write sits in a memtable until RocksDB flushes it,
            // beside the next checkpoint's parts being built: flush now,
            // so that a job with large state holds one copy of it at rest.
            // The write is done either way: a failed flush must not report
            // it failed (the caller would take it as not written).
            if let Err(error) = self.db.flush() {
                tracing::warn!(error = %error.into_string(), "cannot flush a large write");
            }
        }
        Ok(())
    }
}
