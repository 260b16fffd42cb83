//! Watermark holds: the timestamps a stage still owes its consumers.

use super::*;

/// A multiset of timestamps, for holds.
#[derive(Debug, Default)]
pub(super) struct Holds(BTreeMap<Timestamp, usize>);

impl Holds {
    pub(super) fn add(&mut self, ts: Timestamp) {
        *self.0.entry(ts).or_default() += 1;
    }
    pub(super) fn remove(&mut self, ts: Timestamp) {
        if let Some(n) = self.0.get_mut(&ts) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(&ts);
            }
        }
    }
    pub(super) fn min(&self) -> Option<Timestamp> {
        self.0.keys().next().copied()
    }
}
