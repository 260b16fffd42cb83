//! Watermark holds: the timestamps a stage still owes its consumers.

use std::collections::BTreeMap;

use crate::time::Timestamp;

/// A multiset of timestamps, for holds: each thing a stage still owes
/// adds its timestamp, and the minimum is what holds the watermark.
#[derive(Debug, Default)]
pub(crate) struct Holds(BTreeMap<Timestamp, usize>);

impl Holds {
    /// Hold at `ts` once more.
    pub(crate) fn add(&mut self, ts: Timestamp) {
        *self.0.entry(ts).or_default() += 1;
    }
    /// Release one hold at `ts`.
    pub(crate) fn remove(&mut self, ts: Timestamp) {
        if let Some(n) = self.0.get_mut(&ts) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(&ts);
            }
        }
    }
    /// The earliest hold.
    pub(crate) fn min(&self) -> Option<Timestamp> {
        self.0.keys().next().copied()
    }
}
