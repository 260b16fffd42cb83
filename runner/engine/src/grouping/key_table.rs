//! The keys a GroupByKey buffers, each with its panes.
//!
//! A batch GroupByKey over distinct keys holds one small entry per element,
//! hundreds of thousands of them, and fires them all at once. A hash map
//! holding the entries themselves keeps up to half its slots empty and
//! moves every entry each time it grows; one holding pointers to them costs
//! an allocation per key and a cache miss per look. So the entries live in
//! one dense vector, mostly in the order the keys arrived (an evaluation
//! walks it front to back), and a hash table of positions finds a key's
//! entry. Each position carries its key's hash, so the table grows, and
//! entries leave it, without reading the entries again.
//!
//! A firing walks the entries and may stop part way (it emits a few
//! megabytes per step): the entries it removed leave a gap, which the
//! last entries fill, so a step costs what it removed, not what is left
//! (closing the gap by sliding the rest down made a firing over `n` keys
//! cost `n²/step`). A walk does not keep the index up to date as it goes
//! (a cache miss per key in a big index, for a batch firing that empties
//! the table anyway): it marks it stale, and the next lookup rebuilds it
//! from the entries, which costs about what the walk did.

use std::hash::BuildHasher;

use bytes::Bytes;
use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;
use smallvec::SmallVec;

/// A key's bytes: short keys (most are) kept in the entry itself, without
/// an allocation or a second cache miss to compare them.
pub(super) type Key = SmallVec<[u8; 24]>;

/// Where a key's entry is, and the key's hash (so that neither growing the
/// index nor a lookup that collides on the hash table's tag reads the
/// entry).
#[derive(Debug, Clone, Copy)]
struct Slot {
    at: u32,
    hash: u32,
}

/// Keys (the runner's own encoded bytes) and a value for each.
#[derive(Debug, Clone)]
pub(super) struct KeyTable<V> {
    /// Positions into `entries`, hashed by the entry's key; out of date
    /// while `stale`.
    index: HashTable<Slot>,
    entries: Vec<(Key, V)>,
    /// A walk moved or removed entries since the index was built.
    stale: bool,
    /// Lookups that could insert since [`KeyTable::expect_lookups`] last
    /// looked (or the table was last empty), and how many of them made a
    /// key: its guess of what more lookups will add.
    lookups: usize,
    made: usize,
}

/// What [`KeyTable::retain`] does with the entry it was shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retain {
    /// The entry stays.
    Keep,
    /// The entry goes.
    Remove,
    /// The entry and every one not looked at yet stay; the walk ends.
    Stop,
}

impl Retain {
    /// [`Retain::Keep`] if `keep`, else [`Retain::Remove`].
    pub(super) fn keep_if(keep: bool) -> Self {
        if keep {
            Retain::Keep
        } else {
            Retain::Remove
        }
    }
}

impl<V> Default for KeyTable<V> {
    fn default() -> Self {
        KeyTable {
            index: HashTable::new(),
            entries: Vec::new(),
            stale: false,
            lookups: 0,
            made: 0,
        }
    }
}

/// The hash of a key, the same for its bytes and its `Bytes`. (No keyed
/// hash needed: keys are looked up, never iterated by hash.) 32 bits are
/// kept; they are spread over the 64 the index looks at (its top bits pick
/// the tag, its low bits the bucket).
pub(super) fn hash(key: &[u8]) -> u32 {
    let h = FxBuildHasher.hash_one(key);
    (h ^ (h >> 32)) as u32
}

fn spread(hash: u32) -> u64 {
    (u64::from(hash) << 32) | u64::from(hash)
}

/// Lookups seen before [`KeyTable::expect_lookups`] trusts their share of
/// new keys.
const EXPECT_AFTER_LOOKUPS: usize = 512;
/// Fewer expected new keys than this are left to ordinary growth.
const EXPECT_AT_LEAST: usize = 1024;

/// A position as the index keeps it. Four billion keys in one buffer would
/// take a terabyte of entries; a buffer spills long before.
fn slot_at(at: usize) -> u32 {
    debug_assert!(u32::try_from(at).is_ok(), "key table position {at}");
    at as u32
}

impl<V> KeyTable<V> {
    /// How many keys there are.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no keys.
    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn position(&self, key: &[u8]) -> Option<usize> {
        if self.stale {
            // Only a lookup that cannot rebuild the index gets here.
            return self.entries.iter().position(|(k, _)| k.as_ref() == key);
        }
        let entries = &self.entries;
        let h = hash(key);
        self.index
            .find(spread(h), |s| {
                s.hash == h && entries[s.at as usize].0.as_ref() == key
            })
            .map(|s| s.at as usize)
    }

    /// The value of `key`.
    pub(super) fn get(&self, key: &[u8]) -> Option<&V> {
        self.position(key).map(|at| &self.entries[at].1)
    }

    /// The value of `key`, to change.
    pub(super) fn get_mut(&mut self, key: &[u8]) -> Option<&mut V> {
        self.refresh();
        self.position(key).map(|at| &mut self.entries[at].1)
    }

    /// The value of `key`, made by `make` (the key copied) if it has none;
    /// whether it was made.
    pub(super) fn get_or_insert_with(
        &mut self,
        key: &[u8],
        make: impl FnOnce() -> V,
    ) -> (&mut V, bool) {
        self.refresh();
        self.lookups += 1;
        // One probe of the index whether the key is there or not (a find
        // and then an insert would probe twice for every new key).
        let h = hash(key);
        let at = self.entries.len();
        let entries = &self.entries;
        let found = self.index.entry(
            spread(h),
            |s| s.hash == h && entries[s.at as usize].0.as_ref() == key,
            |s| spread(s.hash),
        );
        match found {
            Entry::Occupied(slot) => {
                let at = slot.get().at as usize;
                (&mut self.entries[at].1, false)
            }
            Entry::Vacant(slot) => {
                slot.insert(Slot {
                    at: slot_at(at),
                    hash: h,
                });
                self.made += 1;
                self.entries.push((Key::from_slice(key), make()));
                (&mut self.entries[at].1, true)
            }
        }
    }

    /// About `lookups` more [`KeyTable::get_or_insert_with`]s are coming
    /// (the rest of an input chunk): makes room at once for the keys they
    /// are likely to add, judged by the share of the lookups since the
    /// last call that added one. A GroupByKey over distinct keys otherwise
    /// grows its entries and its index by doubling, copying every entry
    /// and rehashing every position about once more in all. (The recent
    /// share, not the overall one: over few keys, the first lookups all
    /// add one, the later ones none.)
    pub(super) fn expect_lookups(&mut self, lookups: usize) {
        if self.lookups < EXPECT_AFTER_LOOKUPS {
            return;
        }
        let new = lookups.saturating_mul(self.made) / self.lookups;
        self.lookups = 0;
        self.made = 0;
        if new < EXPECT_AT_LEAST || self.entries.capacity() - self.entries.len() >= new {
            return;
        }
        // Exactly, with an eighth more for the guess's error: `reserve`
        // would double the vector whenever the guess exceeds the room by
        // even one (200k entries' room for 100k, past glibc's mmap
        // threshold, mapped and unmapped at every firing).
        let room = new.saturating_add(new / 8);
        self.entries.reserve_exact(room);
        if !self.stale {
            self.index.reserve(room, |s| spread(s.hash));
        }
    }

    /// The value of `key`, the default if it has none.
    pub(super) fn get_or_default(&mut self, key: &[u8]) -> &mut V
    where
        V: Default,
    {
        self.get_or_insert_with(key, V::default).0
    }

    /// Removes `key` and its value.
    pub(super) fn remove(&mut self, key: &[u8]) -> Option<V> {
        self.refresh();
        let at = self.position(key)?;
        self.unindex(at);
        let (_, value) = self.entries.swap_remove(at);
        if at < self.entries.len() {
            self.reindex(self.entries.len(), at);
        }
        self.give_back_room();
        Some(value)
    }

    /// Takes the entry at `at` out of the index (the entry stays).
    fn unindex(&mut self, at: usize) {
        let h = hash(&self.entries[at].0);
        let at = slot_at(at);
        if let Ok(found) = self.index.find_entry(spread(h), |s| s.at == at) {
            found.remove();
        }
    }

    /// The entry indexed at `from` now sits at `to`.
    fn reindex(&mut self, from: usize, to: usize) {
        let h = hash(&self.entries[to].0);
        let from = slot_at(from);
        if let Some(slot) = self.index.find_mut(spread(h), |s| s.at == from) {
            slot.at = slot_at(to);
        }
    }

    /// Shows `keep` the entries in order, each at most once, until it says
    /// [`Retain::Stop`]; removes those it says [`Retain::Remove`] to. Kept
    /// entries move down over removed ones; the gap left at the stop is
    /// filled from the end. A walk that removes every entry moves none, and
    /// one that stops moves at most as many as it removed.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&[u8], &mut V) -> Retain) {
        let len = self.entries.len();
        let mut kept = 0;
        let mut at = 0;
        while at < len {
            let (key, value) = &mut self.entries[at];
            match keep(key, value) {
                Retain::Stop => break,
                Retain::Remove => {}
                Retain::Keep => {
                    if kept != at {
                        self.entries.swap(kept, at);
                    }
                    kept += 1;
                }
            }
            at += 1;
        }
        // Removed entries are in [kept, at); [at, len) were not looked at.
        let gap = at - kept;
        if gap == 0 {
            return;
        }
        let rest = len - at;
        // The rest slides down when it is no longer than the gap (its order
        // kept); otherwise the gap's worth of last entries fill it.
        let from = if rest <= gap { at } else { len - gap };
        for (i, source) in (from..len).enumerate() {
            self.entries.swap(kept + i, source);
        }
        self.entries.truncate(len - gap);
        if self.entries.is_empty() {
            self.index.clear();
            self.stale = false;
        } else {
            self.stale = true;
        }
        self.give_back_room();
    }

    /// Rebuilds the index if a walk left it stale.
    fn refresh(&mut self) {
        if !self.stale {
            return;
        }
        self.stale = false;
        self.index.clear();
        let len = self.entries.len();
        self.index.shrink_to(len, |s| spread(s.hash));
        self.index.reserve(len, |s| spread(s.hash));
        for (at, (key, _)) in self.entries.iter().enumerate() {
            let slot = Slot {
                at: slot_at(at),
                hash: hash(key),
            };
            self.index
                .insert_unique(spread(slot.hash), slot, |s| spread(s.hash));
        }
    }

    /// After most keys went (a window fired over them), returns the room
    /// they took: a buffer's memory is counted by what it holds, so it
    /// must not keep the peak's allocation. An empty table also forgets
    /// its lookups: the next input may have other keys.
    fn give_back_room(&mut self) {
        let len = self.entries.len();
        if len == 0 {
            self.lookups = 0;
            self.made = 0;
        }
        if self.entries.capacity() > 1024 && len * 4 < self.entries.capacity() {
            self.entries.shrink_to(len * 2);
            if !self.stale {
                self.index.shrink_to(len * 2, |s| spread(s.hash));
            }
        }
    }

    /// Every key and its value, in the table's order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&[u8], &V)> {
        self.entries.iter().map(|(k, v)| (k.as_slice(), v))
    }

    /// The entry at position `at` of [`KeyTable::iter`]'s order.
    ///
    /// # Panics
    /// If there is no such entry: positions come from `iter`, on a table
    /// not changed since.
    pub(super) fn entry_at(&self, at: u32) -> (&[u8], &V) {
        let (k, v) = &self.entries[at as usize];
        (k.as_slice(), v)
    }

    /// Every key and its value, the table given up (without copying the
    /// keys out, as `into_iter` does).
    pub(super) fn into_entries(self) -> impl Iterator<Item = (Key, V)> {
        self.entries.into_iter()
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
            table.retain(|_, v| Retain::keep_if(*v % 5 != round));
            oracle.retain(|_, v| *v % 5 != round);
            // A walk that stops part way, having kept some and removed some.
            let mut looked = 0;
            let mut removed = Vec::new();
            table.retain(|k, v| {
                looked += 1;
                if looked > 37 + round {
                    return Retain::Stop;
                }
                if *v % 3 == 0 {
                    removed.push(k.to_vec());
                    return Retain::Remove;
                }
                Retain::Keep
            });
            for k in removed {
                assert!(oracle.remove(&k).is_some());
            }
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

    /// Walks that each remove what they look at and stop after `step`
    /// keys (a firing emitting a few megabytes per step) see every key
    /// exactly once, and leave every other key findable, however the steps
    /// fall against the table's length.
    #[test]
    fn walks_that_stop_part_way_see_each_key_once() {
        for (keys, step) in [(100u32, 7u32), (100, 60), (1000, 1), (10, 100), (64, 32)] {
            let mut table: KeyTable<u32> = (0..keys).map(|i| (Bytes::from(key(i)), i)).collect();
            let mut seen = Vec::new();
            while !table.is_empty() {
                let mut left = step;
                table.retain(|_, v| {
                    if left == 0 {
                        return Retain::Stop;
                    }
                    left -= 1;
                    seen.push(*v);
                    Retain::Remove
                });
                let keys: Vec<(Vec<u8>, u32)> =
                    table.iter().map(|(k, v)| (k.to_vec(), *v)).collect();
                for (k, mut v) in keys {
                    assert_eq!(table.get_mut(&k), Some(&mut v));
                }
            }
            seen.sort_unstable();
            assert_eq!(
                seen,
                (0..keys).collect::<Vec<_>>(),
                "{keys} keys, {step} a step"
            );
        }
    }

    /// `n` lookups of keys from `first` on, each key `repeat` times in a row.
    fn look_up(table: &mut KeyTable<u32>, first: u32, n: u32, repeat: u32) {
        for i in 0..n {
            *table.get_or_insert_with(&key(first + i / repeat), || 0).0 += 1;
        }
    }

    /// A stream of new keys is given room for what is announced at once,
    /// within an eighth over; a stream of known keys is given none; an
    /// emptied table forgets what it saw. The contents stay right either
    /// way.
    #[test]
    fn expected_lookups_make_room_by_the_recent_share_of_new_keys() {
        let mut distinct: KeyTable<u32> = KeyTable::default();
        look_up(&mut distinct, 0, 2_000, 1);
        distinct.expect_lookups(98_000);
        let room = distinct.entries.capacity();
        assert!((100_000..=112_250).contains(&room), "{room}");
        look_up(&mut distinct, 2_000, 98_000, 1);
        assert_eq!(distinct.entries.capacity(), room, "grown again");
        assert_eq!(distinct.len(), 100_000);
        assert_eq!(distinct.get(&key(77_777)), Some(&1));

        // 1 000 keys, each looked up 50 times: the first lookups all made
        // a key, the ones just before the call none.
        let mut few: KeyTable<u32> = KeyTable::default();
        look_up(&mut few, 0, 2_000, 1);
        few.expect_lookups(0);
        look_up(&mut few, 0, 2_000, 2);
        few.expect_lookups(1_000_000);
        assert!(few.entries.capacity() < 4_096, "{}", few.entries.capacity());

        // Too few lookups since the table was emptied: no guess.
        distinct.retain(|_, _| Retain::Remove);
        look_up(&mut distinct, 0, 100, 1);
        distinct.expect_lookups(1_000_000);
        assert!(distinct.entries.capacity() < 100_000);
    }

    #[test]
    fn a_table_emptied_by_a_firing_gives_its_room_back() {
        let mut table: KeyTable<u32> = (0..10_000).map(|i| (Bytes::from(key(i)), i)).collect();
        table.retain(|_, v| Retain::keep_if(*v < 10));
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
            Retain::keep_if(*v % 2 == 0)
        });
        looked.sort_unstable();
        assert_eq!(looked, (0..100).collect::<Vec<_>>());
        assert_eq!(table.iter().count(), 50);
        assert!(table.values().all(|v| v % 2 == 0));
        assert_eq!(table.get_mut(&key(3)), None);
        assert_eq!(table.get_or_default(&key(4)), &mut 4);
    }
}
