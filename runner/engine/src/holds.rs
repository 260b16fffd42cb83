//! Watermark holds: the timestamps a stage still owes its consumers.
//!
//! Every element waiting for a stage, in a bundle, or buffered in a
//! GroupByKey's pane adds a hold and releases it later, so a hold is
//! touched several times per element. Most holds share a handful of
//! timestamps (a batch's elements all sit at one; a GroupByKey's panes of
//! one window at its end), so the multiset keeps up to [`FEW`] distinct
//! timestamps in a short sorted vector, where adding and releasing is a
//! scan of a cache line, and moves to an ordered map only when there are
//! more (a stream's elements, each at its own time).

use std::collections::BTreeMap;

use smallvec::SmallVec;

use crate::time::Timestamp;

/// Most distinct timestamps kept in the vector before the map takes over.
const FEW: usize = 8;

/// A multiset of timestamps, for holds: each thing a stage still owes
/// adds its timestamp, and the minimum is what holds the watermark.
///
/// At most one of `few` and `many` holds anything: `many` once more than
/// [`FEW`] distinct timestamps were held at once, until it empties.
#[derive(Debug, Default, Clone)]
pub(crate) struct Holds {
    /// Distinct timestamps, ascending, each with how many hold there.
    few: SmallVec<[(Timestamp, usize); FEW]>,
    many: BTreeMap<Timestamp, usize>,
}

impl Holds {
    /// Hold at `ts` once more.
    pub(crate) fn add(&mut self, ts: Timestamp) {
        self.add_many(ts, 1);
    }

    /// Hold at `ts` `n` times more (a run of elements at one hold).
    pub(crate) fn add_many(&mut self, ts: Timestamp, n: usize) {
        if n == 0 {
            return;
        }
        if !self.many.is_empty() {
            *self.many.entry(ts).or_default() += n;
            return;
        }
        match self.few.iter().position(|&(t, _)| t >= ts) {
            Some(at) if self.few[at].0 == ts => self.few[at].1 += n,
            _ if self.few.len() == FEW => {
                self.many.extend(self.few.drain(..));
                self.many.insert(ts, n);
            }
            Some(at) => self.few.insert(at, (ts, n)),
            None => self.few.push((ts, n)),
        }
    }

    /// Release one hold at `ts`.
    pub(crate) fn remove(&mut self, ts: Timestamp) {
        self.remove_many(ts, 1);
    }

    /// Release `n` holds at `ts` (as many as there are, if fewer).
    pub(crate) fn remove_many(&mut self, ts: Timestamp, n: usize) {
        if !self.many.is_empty() {
            if let Some(held) = self.many.get_mut(&ts) {
                *held = held.saturating_sub(n);
                if *held == 0 {
                    self.many.remove(&ts);
                }
            }
            return;
        }
        if let Some(at) = self.few.iter().position(|&(t, _)| t == ts) {
            self.few[at].1 = self.few[at].1.saturating_sub(n);
            if self.few[at].1 == 0 {
                self.few.remove(at);
            }
        }
    }

    /// Every distinct timestamp held, ascending, with how many hold there
    /// (what a checkpoint keeps of holds it does not recompute).
    pub(crate) fn entries(&self) -> Vec<(Timestamp, usize)> {
        if self.many.is_empty() {
            self.few.to_vec()
        } else {
            self.many.iter().map(|(&ts, &n)| (ts, n)).collect()
        }
    }

    /// The holds [`Self::entries`] listed.
    pub(crate) fn from_entries(entries: &[(Timestamp, usize)]) -> Self {
        let mut holds = Holds::default();
        for &(ts, n) in entries {
            holds.add_many(ts, n);
        }
        holds
    }

    /// The earliest hold.
    pub(crate) fn min(&self) -> Option<Timestamp> {
        match self.many.keys().next() {
            Some(&ts) => Some(ts),
            None => self.few.first().map(|&(ts, _)| ts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The multiset agrees with a counting map through adds and releases
    /// that cross between the vector and the map both ways.
    #[test]
    fn agrees_with_a_counting_map() {
        let mut holds = Holds::default();
        let mut oracle: BTreeMap<Timestamp, usize> = BTreeMap::new();
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            seed >> 33
        };
        for round in 0..2_000 {
            // Phases of few and of many distinct timestamps.
            let spread = if (round / 200) % 2 == 0 { 4 } else { 40 };
            let ts = (next() % spread) as Timestamp - 2;
            // Mostly one at a time; sometimes a run's worth at once.
            let n = if next() % 5 == 0 {
                next() as usize % 7
            } else {
                1
            };
            if next() % 3 == 0 {
                holds.remove_many(ts, n);
                if let Some(held) = oracle.get_mut(&ts) {
                    *held = held.saturating_sub(n);
                    if *held == 0 {
                        oracle.remove(&ts);
                    }
                }
            } else {
                holds.add_many(ts, n);
                if n > 0 {
                    *oracle.entry(ts).or_default() += n;
                }
            }
            assert_eq!(holds.min(), oracle.keys().next().copied(), "round {round}");
            assert!(holds.few.is_empty() || holds.many.is_empty());
        }
        // Draining everything leaves no hold, in either representation.
        for (ts, n) in oracle {
            holds.remove_many(ts, n);
        }
        assert_eq!(holds.min(), None);
        assert!(holds.few.is_empty() && holds.many.is_empty());
    }

    #[test]
    fn releasing_what_was_never_held_changes_nothing() {
        let mut holds = Holds::default();
        holds.add(5);
        holds.remove(3);
        assert_eq!(holds.min(), Some(5));
        holds.remove(5);
        holds.remove(5);
        assert_eq!(holds.min(), None);
    }
}
