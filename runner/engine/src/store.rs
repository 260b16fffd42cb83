//! In-memory homes for the state the SDK reads and writes.
//!
//! [`SideInputStore`] holds materialized side inputs by (consumer transform,
//! tag, window); [`UserStateStore`] holds bags of user state by
//! (transform, state id, window, key). A bundle never writes to either
//! directly: it writes to a [`BundleOverlay`], which reads through to the
//! stores and is applied by the engine only when the bundle succeeded. That
//! is what makes a bundle a transaction: a failed bundle's state writes are
//! simply dropped with its overlay.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::state::{BundleState, StateError, StateKey, StatePage};

/// (consumer transform, side input tag, encoded window).
type SideInputWindow = (String, String, Bytes);
/// Keys in first-seen order, and values by key.
type MultimapValues = (Vec<Bytes>, HashMap<Bytes, Vec<Bytes>>);

/// Values and keys of side inputs, per window, readable by state key.
#[derive(Debug, Default)]
pub struct SideInputStore {
    /// (transform, tag, window) -> whole nested values.
    iterable: HashMap<SideInputWindow, Vec<Bytes>>,
    /// (transform, tag, window) -> key -> values; keys kept in first-seen order.
    multimap: HashMap<SideInputWindow, MultimapValues>,
    /// Side inputs whose PCollection is complete and may be read.
    ready: std::collections::HashSet<(String, String)>,
}

impl SideInputStore {
    /// Record one value of an iterable side input in a window.
    pub fn add_iterable(&mut self, transform: &str, tag: &str, window: Bytes, value: Bytes) {
        self.iterable
            .entry((transform.to_string(), tag.to_string(), window))
            .or_default()
            .push(value);
    }

    /// Record one key/value of a multimap side input in a window.
    pub fn add_multimap(
        &mut self,
        transform: &str,
        tag: &str,
        window: Bytes,
        key: Bytes,
        value: Bytes,
    ) {
        let (keys, values) = self
            .multimap
            .entry((transform.to_string(), tag.to_string(), window))
            .or_default();
        let entry = values.entry(key.clone()).or_insert_with(|| {
            keys.push(key);
            Vec::new()
        });
        entry.push(value);
    }

    /// Mark a side input as complete (its producer's watermark is final).
    pub fn mark_ready(&mut self, transform: &str, tag: &str) {
        self.ready.insert((transform.to_string(), tag.to_string()));
    }

    fn read(&self, key: &StateKey) -> Result<Vec<Bytes>, StateError> {
        let check = |t: &str, s: &str| {
            if self.ready.contains(&(t.to_string(), s.to_string())) {
                Ok(())
            } else {
                Err(StateError(format!(
                    "side input '{s}' of transform '{t}' was read before it was complete"
                )))
            }
        };
        match key {
            StateKey::IterableSideInput {
                transform_id,
                side_input_id,
                window,
            } => {
                check(transform_id, side_input_id)?;
                Ok(self
                    .iterable
                    .get(&(transform_id.clone(), side_input_id.clone(), window.clone()))
                    .cloned()
                    .unwrap_or_default())
            }
            StateKey::MultimapSideInput {
                transform_id,
                side_input_id,
                window,
                key,
            } => {
                check(transform_id, side_input_id)?;
                Ok(self
                    .multimap
                    .get(&(transform_id.clone(), side_input_id.clone(), window.clone()))
                    .and_then(|(_, values)| values.get(key).cloned())
                    .unwrap_or_default())
            }
            StateKey::MultimapKeysSideInput {
                transform_id,
                side_input_id,
                window,
            } => {
                check(transform_id, side_input_id)?;
                Ok(self
                    .multimap
                    .get(&(transform_id.clone(), side_input_id.clone(), window.clone()))
                    .map(|(keys, _)| keys.clone())
                    .unwrap_or_default())
            }
            StateKey::BagUserState { .. } => Err(StateError(
                "user state requested from the side-input store".into(),
            )),
        }
    }
}

/// Identifies one bag of user state.
pub type BagId = (String, String, Bytes, Bytes);

fn bag_id(key: &StateKey) -> Option<BagId> {
    match key {
        StateKey::BagUserState {
            transform_id,
            state_id,
            window,
            key,
        } => Some((
            transform_id.clone(),
            state_id.clone(),
            window.clone(),
            key.clone(),
        )),
        _ => None,
    }
}

/// Committed user state of one job.
#[derive(Debug, Default)]
pub struct UserStateStore {
    bags: HashMap<BagId, Vec<Bytes>>,
}

impl UserStateStore {
    /// Apply a committed bundle's writes.
    pub fn apply(&mut self, writes: HashMap<BagId, BagWrite>) {
        for (id, write) in writes {
            let bag = self.bags.entry(id.clone()).or_default();
            if write.cleared {
                bag.clear();
            }
            bag.extend(write.appended);
            if bag.is_empty() {
                self.bags.remove(&id);
            }
        }
    }

    /// Drop all state of windows whose expiry has passed (`expired` decides
    /// from the encoded window).
    pub fn retain_windows(&mut self, mut keep: impl FnMut(&Bytes) -> bool) {
        self.bags.retain(|(_, _, window, _), _| keep(window));
    }

    /// Number of non-empty bags, for tests and metrics.
    pub fn len(&self) -> usize {
        self.bags.len()
    }

    /// Whether no state is held.
    pub fn is_empty(&self) -> bool {
        self.bags.is_empty()
    }
}

/// A bundle's tentative writes to one bag.
#[derive(Debug, Default, Clone)]
pub struct BagWrite {
    /// The bag was cleared (before `appended`).
    pub cleared: bool,
    /// Chunks appended after the last clear.
    pub appended: Vec<Bytes>,
}

/// Maximum bytes returned in one page of a state read.
const PAGE_BYTES: usize = 4 << 20;

/// One bundle's view of state: reads see committed state plus the bundle's
/// own writes; writes stay here until [`BundleOverlay::take_writes`].
pub struct BundleOverlay {
    side_inputs: Arc<Mutex<SideInputStore>>,
    user_state: Arc<Mutex<UserStateStore>>,
    writes: Mutex<HashMap<BagId, BagWrite>>,
}

impl BundleOverlay {
    /// A fresh overlay over the job's stores.
    pub fn new(
        side_inputs: Arc<Mutex<SideInputStore>>,
        user_state: Arc<Mutex<UserStateStore>>,
    ) -> Self {
        BundleOverlay {
            side_inputs,
            user_state,
            writes: Mutex::new(HashMap::new()),
        }
    }

    /// The bundle's writes, to be applied on commit.
    pub fn take_writes(&self) -> HashMap<BagId, BagWrite> {
        std::mem::take(&mut *self.writes.lock())
    }

    fn read_all(&self, key: &StateKey) -> Result<Vec<Bytes>, StateError> {
        let Some(id) = bag_id(key) else {
            return self.side_inputs.lock().read(key);
        };
        let writes = self.writes.lock();
        let write = writes.get(&id);
        let mut chunks = if write.is_some_and(|w| w.cleared) {
            Vec::new()
        } else {
            self.user_state
                .lock()
                .bags
                .get(&id)
                .cloned()
                .unwrap_or_default()
        };
        if let Some(w) = write {
            chunks.extend(w.appended.iter().cloned());
        }
        Ok(chunks)
    }
}

impl BundleState for BundleOverlay {
    fn get(&self, key: &StateKey, continuation: Option<&[u8]>) -> Result<StatePage, StateError> {
        let chunks = self.read_all(key)?;
        let start = match continuation {
            None => 0,
            Some(token) => std::str::from_utf8(token)
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
                .ok_or_else(|| StateError("invalid continuation token".into()))?,
        };
        let mut data = Vec::new();
        let mut next = start;
        while next < chunks.len() {
            if !data.is_empty() && data.len() + chunks[next].len() > PAGE_BYTES {
                break;
            }
            data.extend_from_slice(&chunks[next]);
            next += 1;
        }
        Ok(StatePage {
            data: Bytes::from(data),
            continuation: (next < chunks.len()).then(|| Bytes::from(next.to_string())),
        })
    }

    fn append(&self, key: &StateKey, data: Bytes) -> Result<(), StateError> {
        let id = bag_id(key).ok_or_else(|| StateError("side inputs are read-only".into()))?;
        self.writes
            .lock()
            .entry(id)
            .or_default()
            .appended
            .push(data);
        Ok(())
    }

    fn clear(&self, key: &StateKey) -> Result<(), StateError> {
        let id = bag_id(key).ok_or_else(|| StateError("side inputs are read-only".into()))?;
        let mut writes = self.writes.lock();
        let w = writes.entry(id).or_default();
        w.cleared = true;
        w.appended.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bag(key: &str) -> StateKey {
        StateKey::BagUserState {
            transform_id: "t".into(),
            state_id: "s".into(),
            window: Bytes::new(),
            key: Bytes::copy_from_slice(key.as_bytes()),
        }
    }

    #[test]
    fn overlay_reads_its_own_writes_and_commits_only_when_applied() {
        let si = Arc::new(Mutex::new(SideInputStore::default()));
        let us = Arc::new(Mutex::new(UserStateStore::default()));
        let o = BundleOverlay::new(si.clone(), us.clone());
        o.append(&bag("k"), Bytes::from_static(b"\x01a")).unwrap();
        assert_eq!(&o.get(&bag("k"), None).unwrap().data[..], b"\x01a");
        assert!(us.lock().is_empty());
        us.lock().apply(o.take_writes());
        let o2 = BundleOverlay::new(si.clone(), us.clone());
        o2.clear(&bag("k")).unwrap();
        o2.append(&bag("k"), Bytes::from_static(b"\x01b")).unwrap();
        assert_eq!(&o2.get(&bag("k"), None).unwrap().data[..], b"\x01b");
        // A failed bundle's overlay is dropped: committed state is unchanged.
        drop(o2);
        let o3 = BundleOverlay::new(si, us);
        assert_eq!(&o3.get(&bag("k"), None).unwrap().data[..], b"\x01a");
    }

    #[test]
    fn side_inputs_must_be_ready() {
        let si = Arc::new(Mutex::new(SideInputStore::default()));
        si.lock()
            .add_iterable("t", "s", Bytes::new(), Bytes::from_static(b"\x01"));
        let o = BundleOverlay::new(si.clone(), Arc::default());
        let key = StateKey::IterableSideInput {
            transform_id: "t".into(),
            side_input_id: "s".into(),
            window: Bytes::new(),
        };
        assert!(o.get(&key, None).is_err());
        si.lock().mark_ready("t", "s");
        assert_eq!(&o.get(&key, None).unwrap().data[..], b"\x01");
    }
}
