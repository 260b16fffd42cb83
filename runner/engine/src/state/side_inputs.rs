//! Materialized side inputs, by (consumer transform, tag, window): what a
//! bundle reads through `IterableSideInput` and `MultimapSideInput` state
//! keys once the side input's PCollection is complete.

use std::collections::HashMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::plan::{SideInputId, TransformId};
use crate::state::{StateError, StateKey};

/// One window of one side input: where its values are kept. Encoded, and
/// sorted, as the (transform, tag, window) triple it replaced.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
struct SideInputWindow {
    /// The side input.
    side_input: SideInputId,
    /// The window, encoded in the side input's window coder.
    window: Bytes,
}
/// Keys in first-seen order, and values by key.
type MultimapValues = (Vec<Bytes>, HashMap<Bytes, Vec<Bytes>>);

/// Values and keys of side inputs, per window, readable by state key.
#[derive(Debug, Default)]
pub struct SideInputTable {
    /// (transform, tag, window) -> whole nested values.
    iterable: HashMap<SideInputWindow, Vec<Bytes>>,
    /// (transform, tag, window) -> key -> values; keys kept in first-seen order.
    multimap: HashMap<SideInputWindow, MultimapValues>,
    /// Side inputs whose PCollection is complete and may be read.
    ready: std::collections::HashSet<SideInputId>,
}

impl SideInputTable {
    /// Record one value of an iterable side input in a window.
    pub fn add_iterable(&mut self, side_input: &SideInputId, window: Bytes, value: Bytes) {
        let at = SideInputWindow {
            side_input: side_input.clone(),
            window,
        };
        self.iterable.entry(at).or_default().push(value);
    }

    /// Record one key/value of a multimap side input in a window.
    pub fn add_multimap(
        &mut self,
        side_input: &SideInputId,
        window: Bytes,
        key: Bytes,
        value: Bytes,
    ) {
        let at = SideInputWindow {
            side_input: side_input.clone(),
            window,
        };
        let (keys, values) = self.multimap.entry(at).or_default();
        let entry = values.entry(key.clone()).or_insert_with(|| {
            keys.push(key);
            Vec::new()
        });
        entry.push(value);
    }

    /// Whether any value of the side input has arrived (in any window):
    /// in streaming, a globally windowed side input becomes readable with
    /// its first pane and is updated by later ones.
    pub fn has_values(&self, side_input: &SideInputId) -> bool {
        self.iterable
            .keys()
            .chain(self.multimap.keys())
            .any(|at| at.side_input == *side_input)
    }

    /// Mark a side input as complete (its producer's watermark is final).
    pub fn mark_ready(&mut self, side_input: &SideInputId) {
        if !self.ready.contains(side_input) {
            self.ready.insert(side_input.clone());
        }
    }

    pub(super) fn read(&self, key: &StateKey) -> Result<Vec<Bytes>, StateError> {
        // The side input's window, once the side input is complete.
        let complete = |side_input: &SideInputId, window: &Bytes| {
            if self.ready.contains(side_input) {
                Ok(SideInputWindow {
                    side_input: side_input.clone(),
                    window: window.clone(),
                })
            } else {
                Err(StateError(format!(
                    "side input '{}' of transform '{}' was read before it was complete",
                    side_input.tag, side_input.transform_id
                )))
            }
        };
        match key {
            StateKey::IterableSideInput { side_input, window } => {
                let at = complete(side_input, window)?;
                Ok(self.iterable.get(&at).cloned().unwrap_or_default())
            }
            StateKey::MultimapSideInput {
                side_input,
                window,
                key,
            } => {
                let at = complete(side_input, window)?;
                let values = self.multimap.get(&at).and_then(|(_, v)| v.get(key));
                Ok(values.cloned().unwrap_or_default())
            }
            StateKey::MultimapKeysSideInput { side_input, window } => {
                let at = complete(side_input, window)?;
                let keys = self.multimap.get(&at).map(|(keys, _)| keys.clone());
                Ok(keys.unwrap_or_default())
            }
            StateKey::BagUserState { .. }
            | StateKey::OrderedListUserState { .. }
            | StateKey::MultimapUserState { .. }
            | StateKey::MultimapKeysUserState { .. }
            | StateKey::MultimapEntriesUserState { .. } => Err(StateError(
                "user state requested from the side-input store".into(),
            )),
            StateKey::RunnerIterable { .. } => Err(StateError(
                "a handed-out iterable requested from the side-input store".into(),
            )),
        }
    }
}

/// A multimap side input in one window: its keys in first-seen order, and
/// values by key, sorted.
type MultimapSnapshot = (SideInputWindow, Vec<Bytes>, Vec<(Bytes, Vec<Bytes>)>);

/// What a checkpoint keeps of a [`SideInputTable`], in a stable order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct SideInputSnapshot {
    iterable: Vec<(SideInputWindow, Vec<Bytes>)>,
    multimap: Vec<MultimapSnapshot>,
    ready: Vec<SideInputId>,
}

impl SideInputSnapshot {
    /// Moves every side input to the id `rename` gives its reading
    /// transform (see [`crate::timers::TimerStore::rename_transforms`]);
    /// the side inputs of a transform with no new id go: nothing reads
    /// them any more.
    pub(crate) fn rename_transforms(
        &mut self,
        rename: impl Fn(&TransformId) -> Option<TransformId>,
    ) {
        let moved = |id: &mut SideInputId| match rename(&id.transform_id) {
            Some(new) => {
                id.transform_id = new;
                true
            }
            None => false,
        };
        self.iterable.retain_mut(|(w, _)| moved(&mut w.side_input));
        self.iterable.sort_by(|a, b| a.0.cmp(&b.0));
        self.multimap
            .retain_mut(|(w, _, _)| moved(&mut w.side_input));
        self.multimap.sort_by(|a, b| a.0.cmp(&b.0));
        self.ready.retain_mut(|id| moved(id));
        self.ready.sort();
    }
}

impl SideInputTable {
    /// What a checkpoint keeps: everything, sorted.
    pub(crate) fn snapshot(&self) -> SideInputSnapshot {
        let mut iterable: Vec<_> = self
            .iterable
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        iterable.sort_by(|a, b| a.0.cmp(&b.0));
        let mut multimap: Vec<_> = self
            .multimap
            .iter()
            .map(|(k, (order, values))| {
                let mut values: Vec<_> =
                    values.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                values.sort_by(|a, b| a.0.cmp(&b.0));
                (k.clone(), order.clone(), values)
            })
            .collect();
        multimap.sort_by(|a, b| a.0.cmp(&b.0));
        let mut ready: Vec<_> = self.ready.iter().cloned().collect();
        ready.sort();
        SideInputSnapshot {
            iterable,
            multimap,
            ready,
        }
    }

    /// The store a checkpoint kept.
    pub(crate) fn restore(snapshot: SideInputSnapshot) -> Self {
        SideInputTable {
            iterable: snapshot.iterable.into_iter().collect(),
            multimap: snapshot
                .multimap
                .into_iter()
                .map(|(k, order, values)| (k, (order, values.into_iter().collect())))
                .collect(),
            ready: snapshot.ready.into_iter().collect(),
        }
    }
}
