//! [`Kv`] over object storage (S3 and what speaks its API): the store's
//! records and checkpoints kept in a bucket, where a server on any host
//! finds them.
//!
//! An object store has no multi-key writes, and an object once written is
//! whole or absent. So every [`Kv::write`] becomes two objects under the
//! store's prefix, numbered by the write's *sequence* number:
//!
//! * `values/{seq}`: the write's values, one after the other;
//! * `heads/{seq}`: its deletions, and each key it puts with where its
//!   value lies (an object, an offset, a length). Written second, it is the
//!   commit point: a write whose head is absent did not happen.
//!
//! Opening reads the heads in order (not the values) into an index held
//! in memory, key by key; a read fetches the byte range its value lies in.
//! A values object none of whose keys is live any more (overwritten or
//! deleted by a later write) is deleted once that write is durable. Every
//! [`SNAPSHOT_EVERY`] writes the index itself is written as one head, a
//! *snapshot*, which stands for every head before it, and those heads
//! are deleted: the heads read at open stay few.
//!
//! One server writes under a prefix at a time (as one process opens a
//! RocksDB directory); the object store's own retries cover passing
//! failures, and a write that still fails returns an error, leaving the
//! previous state whole.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parking_lot::Mutex;

use crate::kv::{under, Deletion, Kv};
use crate::object_runtime::{backend, ObjectRuntime};
use crate::StoreError;

/// Writes between two snapshots of the index.
const SNAPSHOT_EVERY: u64 = 32;

/// Values read at once by one scan.
const READS_AT_ONCE: usize = 8;

/// What a head's first bytes are.
const MAGIC: &[u8; 4] = b"RKV1";

/// Where a key's value lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ValueRef {
    /// The sequence number of the values object holding it.
    object: u64,
    offset: u64,
    len: u64,
}

/// A head, decoded.
#[derive(Debug, Default, PartialEq, Eq)]
struct Head {
    /// Whether it stands for every head before it.
    snapshot: bool,
    deletes: Vec<Deletion>,
    puts: Vec<(Vec<u8>, ValueRef)>,
}

/// The index: every live key's value, and how many live keys each values
/// object holds.
#[derive(Debug, Default)]
struct Index {
    keys: BTreeMap<Vec<u8>, ValueRef>,
    live: HashMap<u64, usize>,
    /// The next write's sequence number.
    next: u64,
    /// Heads written since the last snapshot (which is among them).
    heads: Vec<u64>,
}

impl Index {
    /// The next write's sequence number, taken.
    fn take_seq(&mut self) -> u64 {
        let seq = self.next;
        self.next += 1;
        seq
    }

    /// Applies `head`'s deletions then its puts; returns the values
    /// objects that hold no live key any more.
    fn apply(&mut self, head: &Head) -> Vec<u64> {
        let mut emptied = Vec::new();
        for deletion in &head.deletes {
            let doomed: Vec<Vec<u8>> = match deletion {
                Deletion::Key(key) => vec![key.clone()],
                Deletion::Prefix(prefix) => {
                    under(&self.keys, prefix).map(|(k, _)| k.clone()).collect()
                }
                Deletion::Range(from, to) => self
                    .keys
                    .range(from.clone()..to.clone())
                    .map(|(k, _)| k.clone())
                    .collect(),
            };
            for key in doomed {
                if let Some(old) = self.keys.remove(&key) {
                    self.release(old.object, &mut emptied);
                }
            }
        }
        for (key, value) in &head.puts {
            *self.live.entry(value.object).or_default() += 1;
            if let Some(old) = self.keys.insert(key.clone(), *value) {
                self.release(old.object, &mut emptied);
            }
        }
        emptied.retain(|object| !self.live.contains_key(object));
        emptied
    }

    fn release(&mut self, object: u64, emptied: &mut Vec<u64>) {
        if let Some(count) = self.live.get_mut(&object) {
            *count -= 1;
            if *count == 0 {
                self.live.remove(&object);
                emptied.push(object);
            }
        }
    }

    /// The whole index as one head.
    fn snapshot(&self) -> Head {
        Head {
            snapshot: true,
            deletes: Vec::new(),
            puts: self.keys.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        }
    }
}

/// Keys in an object store (see the module docs).
pub struct ObjectKv {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// The object store's calls run here, whatever thread asks.
    runtime: ObjectRuntime,
    index: Mutex<Index>,
    /// One write at a time, in sequence order.
    writing: Mutex<()>,
}

impl std::fmt::Debug for ObjectKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectKv")
            .field("store", &self.store.to_string())
            .field("prefix", &self.prefix.as_ref())
            .finish()
    }
}

/// The sequence number an object's name ends with.
fn sequence_of(path: &Path) -> Option<u64> {
    path.filename()?.parse().ok()
}

impl ObjectKv {
    /// Opens the keys kept under `prefix` of `store` (none at first):
    /// reads the heads, and deletes what earlier servers left behind
    /// (heads a snapshot stands for, values no key names).
    pub fn open(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<Self, StoreError> {
        let kv = ObjectKv {
            store,
            prefix: Path::from(prefix),
            runtime: ObjectRuntime::new()?,
            index: Mutex::default(),
            writing: Mutex::new(()),
        };
        kv.recover()?;
        Ok(kv)
    }

    /// Runs `work` on the store's runtime and waits for it.
    fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.runtime.run(work)
    }

    fn head_path(&self, seq: u64) -> Path {
        self.prefix
            .clone()
            .join("heads")
            .join(format!("{seq:020}").as_str())
    }

    fn values_path(&self, seq: u64) -> Path {
        self.prefix
            .clone()
            .join("values")
            .join(format!("{seq:020}").as_str())
    }

    /// Every object's sequence number under `dir`, in order.
    fn list(&self, dir: &str) -> Result<Vec<u64>, StoreError> {
        let store = self.store.clone();
        let prefix = self.prefix.clone().join(dir);
        let mut seqs: Vec<u64> = self.run(async move {
            let found: Vec<_> = store
                .list(Some(&prefix))
                .try_collect()
                .await
                .map_err(|e| backend("listing", e))?;
            Ok(found
                .iter()
                .filter_map(|meta| sequence_of(&meta.location))
                .collect())
        })?;
        seqs.sort_unstable();
        Ok(seqs)
    }

    fn read(&self, path: Path) -> Result<Bytes, StoreError> {
        let store = self.store.clone();
        self.run(async move {
            let got = store
                .get(&path)
                .await
                .map_err(|e| backend(&format!("reading {path}"), e))?;
            got.bytes()
                .await
                .map_err(|e| backend(&format!("reading {path}"), e))
        })
    }

    fn put(&self, path: Path, payload: PutPayload) -> Result<(), StoreError> {
        let store = self.store.clone();
        self.run(async move {
            store
                .put(&path, payload)
                .await
                .map(|_| ())
                .map_err(|e| backend(&format!("writing {path}"), e))
        })
    }

    /// Deletes `paths`, as far as it can: what is left is garbage the next
    /// open deletes.
    fn delete_all(&self, paths: Vec<Path>) {
        let store = self.store.clone();
        let deleted = self.run(async move {
            for path in paths {
                if let Err(error) = store.delete(&path).await {
                    tracing::warn!(%path, %error, "cannot delete an object no key needs");
                }
            }
            Ok(())
        });
        if let Err(error) = deleted {
            tracing::warn!(%error, "cannot delete objects no key needs");
        }
    }

    /// Rebuilds the index from the heads, from the latest snapshot on.
    fn recover(&self) -> Result<(), StoreError> {
        let seqs = self.list("heads")?;
        let mut heads = Vec::with_capacity(seqs.len());
        for &seq in &seqs {
            heads.push((seq, decode_head(&self.read(self.head_path(seq))?)?));
        }
        let start = heads.iter().rposition(|(_, h)| h.snapshot).unwrap_or(0);
        let mut index = Index::default();
        for (_, head) in &heads[start..] {
            index.apply(head);
        }
        index.next = seqs.last().map_or(0, |s| s + 1);
        index.heads = heads[start..].iter().map(|(seq, _)| *seq).collect();
        let mut garbage: Vec<Path> = heads[..start]
            .iter()
            .map(|(seq, _)| self.head_path(*seq))
            .collect();
        for seq in self.list("values")? {
            if !index.live.contains_key(&seq) {
                garbage.push(self.values_path(seq));
            }
        }
        *self.index.lock() = index;
        if !garbage.is_empty() {
            self.delete_all(garbage);
        }
        Ok(())
    }

    /// The values of `refs`, in order.
    fn fetch(&self, refs: Vec<ValueRef>) -> Result<Vec<Bytes>, StoreError> {
        let store = self.store.clone();
        let paths: Vec<Path> = refs.iter().map(|r| self.values_path(r.object)).collect();
        self.run(async move {
            futures::stream::iter(refs.into_iter().zip(paths))
                .map(|(r, path)| {
                    let store = store.clone();
                    async move {
                        if r.len == 0 {
                            return Ok(Bytes::new());
                        }
                        store
                            .get_range(&path, r.offset..r.offset + r.len)
                            .await
                            .map_err(|e| backend(&format!("reading {path}"), e))
                    }
                })
                .buffered(READS_AT_ONCE)
                .try_collect()
                .await
        })
    }

    /// Writes the index as a snapshot head, then deletes the heads it
    /// stands for.
    fn take_snapshot(&self) -> Result<(), StoreError> {
        let (seq, head, old) = {
            let mut index = self.index.lock();
            let seq = index.take_seq();
            (seq, index.snapshot(), std::mem::take(&mut index.heads))
        };
        if let Err(error) = self.put(self.head_path(seq), encode_head(&head).into()) {
            // The heads still stand; the next snapshot covers them.
            self.index.lock().heads.splice(0..0, old);
            return Err(error);
        }
        self.index.lock().heads.insert(0, seq);
        self.delete_all(old.into_iter().map(|s| self.head_path(s)).collect());
        Ok(())
    }
}

impl Kv for ObjectKv {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        let Some(found) = self.index.lock().keys.get(key).copied() else {
            return Ok(None);
        };
        Ok(self.fetch(vec![found])?.pop())
    }

    fn scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Bytes)>, StoreError> {
        let found: Vec<(Vec<u8>, ValueRef)> = under(&self.index.lock().keys, prefix)
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        let (keys, refs): (Vec<_>, Vec<_>) = found.into_iter().unzip();
        Ok(keys.into_iter().zip(self.fetch(refs)?).collect())
    }

    fn scan_range(
        &self,
        from: &[u8],
        to: &[u8],
        max_bytes: usize,
    ) -> Result<Vec<(Vec<u8>, Bytes)>, StoreError> {
        let mut found = Vec::new();
        {
            let index = self.index.lock();
            let mut bytes = 0u64;
            for (k, v) in index.keys.range(from.to_vec()..to.to_vec()) {
                bytes += v.len;
                found.push((k.clone(), *v));
                if bytes > max_bytes as u64 {
                    break;
                }
            }
        }
        let (keys, refs): (Vec<_>, Vec<_>) = found.into_iter().unzip();
        Ok(keys.into_iter().zip(self.fetch(refs)?).collect())
    }

    fn write(&self, puts: Vec<(Vec<u8>, Bytes)>, deletes: Vec<Deletion>) -> Result<(), StoreError> {
        let _one_at_a_time = self.writing.lock();
        let seq = self.index.lock().take_seq();
        let mut head = Head {
            snapshot: false,
            deletes,
            puts: Vec::with_capacity(puts.len()),
        };
        let mut offset = 0u64;
        let mut values = Vec::with_capacity(puts.len());
        for (key, value) in puts {
            let len = value.len() as u64;
            head.puts.push((
                key,
                ValueRef {
                    object: seq,
                    offset,
                    len,
                },
            ));
            offset += len;
            values.push(value);
        }
        if offset > 0 {
            self.put(self.values_path(seq), values.into_iter().collect())?;
        }
        self.put(self.head_path(seq), encode_head(&head).into())?;
        let (emptied, due) = {
            let mut index = self.index.lock();
            let mut emptied = index.apply(&head);
            if offset == 0 {
                // Nothing was written under this number.
                emptied.retain(|&o| o != seq);
            }
            index.heads.push(seq);
            (emptied, index.heads.len() as u64 > SNAPSHOT_EVERY)
        };
        if !emptied.is_empty() {
            self.delete_all(emptied.into_iter().map(|o| self.values_path(o)).collect());
        }
        if due {
            // The write is durable already; a snapshot that fails is
            // taken at a later write.
            if let Err(error) = self.take_snapshot() {
                tracing::warn!(%error, "cannot write a snapshot of the object store's index");
            }
        }
        Ok(())
    }
}

fn put_bytes(out: &mut BytesMut, bytes: &[u8]) {
    out.put_u32_le(bytes.len() as u32);
    out.put_slice(bytes);
}

fn encode_head(head: &Head) -> Bytes {
    let mut out = BytesMut::new();
    out.put_slice(MAGIC);
    out.put_u8(u8::from(head.snapshot));
    out.put_u32_le(head.deletes.len() as u32);
    for deletion in &head.deletes {
        match deletion {
            Deletion::Key(key) => {
                out.put_u8(0);
                put_bytes(&mut out, key);
            }
            Deletion::Prefix(prefix) => {
                out.put_u8(1);
                put_bytes(&mut out, prefix);
            }
            Deletion::Range(from, to) => {
                out.put_u8(2);
                put_bytes(&mut out, from);
                put_bytes(&mut out, to);
            }
        }
    }
    out.put_u32_le(head.puts.len() as u32);
    for (key, value) in &head.puts {
        put_bytes(&mut out, key);
        out.put_u64_le(value.object);
        out.put_u64_le(value.offset);
        out.put_u64_le(value.len);
    }
    out.freeze()
}

/// Reads a head written by [`encode_head`]; a truncated or foreign object
/// is an error naming what is wrong.
fn decode_head(bytes: &[u8]) -> Result<Head, StoreError> {
    let bad = |why: &str| StoreError::Corrupt {
        what: "object store head".into(),
        why: why.into(),
    };
    let mut buf = bytes;
    let need = |buf: &[u8], n: usize| {
        if buf.remaining() < n {
            Err(bad("it ends early"))
        } else {
            Ok(())
        }
    };
    let take_bytes = |buf: &mut &[u8]| -> Result<Vec<u8>, StoreError> {
        need(buf, 4)?;
        let len = buf.get_u32_le() as usize;
        need(buf, len)?;
        let out = buf[..len].to_vec();
        buf.advance(len);
        Ok(out)
    };
    need(buf, 5)?;
    if &buf[..4] != MAGIC {
        return Err(bad("it is not one (wrong magic)"));
    }
    buf.advance(4);
    let snapshot = buf.get_u8() == 1;
    need(buf, 4)?;
    let deletes_len = buf.get_u32_le() as usize;
    let mut deletes = Vec::with_capacity(deletes_len.min(1 << 16));
    for _ in 0..deletes_len {
        need(buf, 1)?;
        deletes.push(match buf.get_u8() {
            0 => Deletion::Key(take_bytes(&mut buf)?),
            1 => Deletion::Prefix(take_bytes(&mut buf)?),
            2 => {
                let from = take_bytes(&mut buf)?;
                Deletion::Range(from, take_bytes(&mut buf)?)
            }
            other => return Err(bad(&format!("unknown deletion kind {other}"))),
        });
    }
    need(buf, 4)?;
    let puts_len = buf.get_u32_le() as usize;
    let mut puts = Vec::with_capacity(puts_len.min(1 << 16));
    for _ in 0..puts_len {
        let key = take_bytes(&mut buf)?;
        need(buf, 24)?;
        let object = buf.get_u64_le();
        let offset = buf.get_u64_le();
        let len = buf.get_u64_le();
        puts.push((
            key,
            ValueRef {
                object,
                offset,
                len,
            },
        ));
    }
    Ok(Head {
        snapshot,
        deletes,
        puts,
    })
}

#[cfg(test)]
mod tests;
