//! The keys a GroupByKey buffers, each with its panes.
//!
//! A batch GroupByKey over distinct keys holds one small entry per element,
//! hundreds of thousands of them, and fires them all at once. A hash map
//! holding the entries themselves keeps up to half its slots empty and
//! moves every entry each time it grows; one holding pointers to them costs
//! an allocation per key and a cache miss per look. So the entries live in
//! one dense vector, in the order the keys arrived (an evaluation walks it
//! front to back), and a hash table of positions finds a key's entry. A
//! removed entry's place is taken by the last one, whose position is
//! updated.

use std::hash::BuildHasher;

use bytes::Bytes;
use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;
use smallvec::SmallVec;

/// A key's bytes: short keys (most are) kept in the entry itself, without
/// an allocation or a second cache miss to compare them.
pub(super) type Key = SmallVec<[u8; 24]>;

/// Keys (the runner's own encoded bytes) and a value for each.
#[derive(Debug, Clone)]
pub(super) struct KeyTable<V> {
    /// Positions into `entries`, hashed by the entry's key.
    index: HashTable<usize>,
    entries: Vec<(Key, V)>,
}

impl<V> Default for KeyTable<V> {
    fn default() -> Self {
        KeyTable {
            index: HashTable::new(),
            entries: Vec::new(),
        }
    }
}

/// The hash of a key, the same for its bytes and its `Bytes`. (No keyed
/// hash needed: keys are looked up, never iterated by hash.)
fn hash(key: &[u8]) -> u64 {
    FxBuildHasher.hash_one(key)
}

impl<V> KeyTable<V> {
    /// Whether there are no keys.
    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn position(&self, key: &[u8]) -> Option<usize> {
        let entries = &self.entries;
        self.index
            .find(hash(key), |&at| entries[at].0.as_ref() == key)
            .copied()
    }

    /// The value of `key`.
    pub(super) fn get(&self, key: &[u8]) -> Option<&V> {
        self.position(key).map(|at| &self.entries[at].1)
    }

    /// The value of `key`, to change.
    pub(super) fn get_mut(&mut self, key: &[u8]) -> Option<&mut V> {
        self.position(key).map(|at| &mut self.entries[at].1)
    }

    /// The value of `key`, made by `make` (the key copied) if it has none;
    /// whether it was made.
    pub(super) fn get_or_insert_with(
        &mut self,
        key: &[u8],
        make: impl FnOnce() -> V,
    ) -> (&mut V, bool) {
        match self.position(key) {
            Some(at) => (&mut self.entries[at].1, false),
            None => (self.push(Key::from_slice(key), make()), true),
        }
    }

    /// The value of `key`, the default if it has none.
    pub(super) fn get_or_default(&mut self, key: &[u8]) -> &mut V
    where
        V: Default,
    {
        self.get_or_insert_with(key, V::default).0
    }

    fn push(&mut self, key: Key, value: V) -> &mut V {
        let at = self.entries.len();
        let entries = &self.entries;
        self.index
            .insert_unique(hash(&key), at, |&i| hash(&entries[i].0));
        self.entries.push((key, value));
        &mut self.entries[at].1
    }

    /// Removes `key` and its value.
    pub(super) fn remove(&mut self, key: &[u8]) -> Option<V> {
        let at = self.position(key)?;
        Some(self.remove_at(at))
    }

    /// Removes the entry at `at`; the last entry takes its place.
    fn remove_at(&mut self, at: usize) -> V {
        let entries = &self.entries;
        if let Ok(found) = self.index.find_entry(hash(&entries[at].0), |&i| i == at) {
            found.remove();
        }
        let (_, value) = self.entries.swap_remove(at);
        if let Some((moved, _)) = self.entries.get(at) {
            let from = self.entries.len();
            if let Some(slot) = self.index.find_mut(hash(moved), |&i| i == from) {
                *slot = at;
            }
        }
        self.give_back_room();
        value
    }

    /// Keeps the entries for which `keep` says so, looking at each once,
    /// in order. Kept entries move down over removed ones (each at most
    /// once), so a firing that removes every key moves none.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&[u8], &mut V) -> bool) {
        let mut kept = 0;
        for at in 0..self.entries.len() {
            let (key, value) = &mut self.entries[at];
            let h = hash(key);
            if !keep(key, value) {
                if let Ok(found) = self.index.find_entry(h, |&i| i == at) {
                    found.remove();
                }
                continue;
            }
            if kept != at {
                if let Some(slot) = self.index.find_mut(h, |&i| i == at) {
                    *slot = kept;
                }
                self.entries.swap(kept, at);
            }
            kept += 1;
        }
        self.entries.truncate(kept);
        self.give_back_room();
    }

    /// After most keys went (a window fired over them), returns the room
    /// they took: a buffer's memory is counted by what it holds, so it
    /// must not keep the peak's allocation.
    fn give_back_room(&mut self) {
        let len = self.entries.len();
        if self.entries.capacity() > 1024 && len * 4 < self.entries.capacity() {
            self.entries.shrink_to(len * 2);
            let entries = &self.entries;
            self.index.shrink_to(len * 2, |&i| hash(&entries[i].0));
        }
    }

    /// Every key and its value, in the table's order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&[u8], &V)> {
        self.entries.iter().map(|(k, v)| (k.as_slice(), v))
    }

    /// Every value.
    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }
}

impl<V> IntoIterator for KeyTable<V> {
    type Item = (Bytes, V);
    type IntoIter = std::iter::Map<std::vec::IntoIter<(Key, V)>, fn((Key, V)) -> (Bytes, V)>;

    /// Every key and its value, the table given up.
    fn into_iter(self) -> Self::IntoIter {
        self.entries
            .into_iter()
            .map(|(k, v)| (Bytes::copy_from_slice(&k), v))
    }
}

impl<V: Default> FromIterator<(Bytes, V)> for KeyTable<V> {
    /// A table of `(key, value)`s; a repeated key keeps its last value.
    fn from_iter<I: IntoIterator<Item = (Bytes, V)>>(items: I) -> Self {
        let mut table = KeyTable::default();
        for (key, value) in items {
            *table.get_or_default(&key) = value;
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn key(i: u32) -> Vec<u8> {
        format!("k{i}").into_bytes()
    }

    /// The table agrees with a `BTreeMap` through inserts, removals and
    /// retains (every removal moves another entry, whose position must
    /// follow it).
    #[test]
    fn agrees_with_a_map_through_inserts_and_removals() {
        let mut table: KeyTable<u32> = KeyTable::default();
        let mut oracle: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
        for round in 0..4u32 {
            for i in 0..500 {
                let k = key(i * 7 % 613 + round);
                let (v, made) = table.get_or_insert_with(&k, || 0);
                assert_eq!(made, !oracle.contains_key(&k));
                *v += i;
                *oracle.entry(k).or_default() += i;
            }
            for i in (0..613).step_by(3 + round as usize) {
                assert_eq!(table.remove(&key(i)), oracle.remove(&key(i)));
            }
            table.retain(|_, v| *v % 5 != round);
            oracle.retain(|_, v| *v % 5 != round);
            assert_eq!(table.iter().count(), oracle.len());
            for (k, v) in &oracle {
                assert_eq!(table.get(k), Some(v));
            }
            let mut seen: Vec<(Vec<u8>, u32)> =
                table.iter().map(|(k, v)| (k.to_vec(), *v)).collect();
            seen.sort();
            let expected: Vec<(Vec<u8>, u32)> =
                oracle.iter().map(|(k, v)| (k.clone(), *v)).collect();
            assert_eq!(seen, expected);
        }
    }

    #[test]
    fn a_table_emptied_by_a_firing_gives_its_room_back() {
        let mut table: KeyTable<u32> = (0..10_000).map(|i| (Bytes::from(key(i)), i)).collect();
        table.retain(|_, v| *v < 10);
        assert!(
            table.entries.capacity() <= 20,
            "{}",
            table.entries.capacity()
        );
        for i in 0..10 {
            assert_eq!(table.get(&key(i)), Some(&i));
        }
    }

    #[test]
    fn retain_looks_at_each_entry_once() {
        let mut table: KeyTable<u32> = (0..100).map(|i| (Bytes::from(key(i)), i)).collect();
        let mut looked = Vec::new();
        table.retain(|_, v| {
            looked.push(*v);
            *v % 2 == 0
        });
        looked.sort_unstable();
        assert_eq!(looked, (0..100).collect::<Vec<_>>());
        assert_eq!(table.iter().count(), 50);
        assert!(table.values().all(|v| v % 2 == 0));
        assert_eq!(table.get_mut(&key(3)), None);
        assert_eq!(table.get_or_default(&key(4)), &mut 4);
    }
}
