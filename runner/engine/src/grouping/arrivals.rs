//! Elements a GroupByKey has taken but not yet filed under their keys.
//!
//! With the default trigger and output time, a pane fires once, when the
//! watermark passes the end of its window: a batch GroupByKey fires every
//! pane at once, when its input ends. Filing each element under its key as
//! it arrives (the key table) costs a random memory access per element and
//! a key entry that the firing reads back once and drops; with every key
//! distinct that was most of a GroupByKey's cost. [`Arrivals`] keeps the
//! elements as they came instead: each one's key and value lengths and
//! `KV` bytes, back to back, and beside them each one's key hash and
//! place. When the window closes, a radix sort by key hash brings each
//! key's elements together, in the order they came, and each group goes
//! out as one pane (a group costs one look into the bytes, where its
//! lengths and bytes lie together).
//!
//! Arrivals are one window's, and only while the key table is empty: a
//! second window, late data, a spill, a merge or a restore first files
//! them in the table ("settles" them, `memory`), so every other path sees
//! only the table. Their output time is their window's end whatever their
//! timestamps (the default output time), so no element's hold is kept.

use crate::plan::{OutputTime, Trigger, WindowingStrategy};
use crate::time::Timestamp;
use crate::window::Window;

use super::key_table::hash;

/// Elements of one window, kept as they arrived until they fire together
/// or are filed in the key table.
#[derive(Debug, Default)]
pub(super) struct Arrivals {
    /// The window every arrival is in (`None` while there are none).
    window: Option<Window>,
    /// Each arrival, in arrival order: its key's and its value's lengths
    /// (4 bytes each, little-endian), then its `KV` bytes.
    bytes: Vec<u8>,
    /// For each arrival, its key's hash (high half) and where it starts in
    /// `bytes` (low half): sorted, the arrivals grouped by key in arrival
    /// order (two keys with one hash are told apart by their bytes).
    order: Vec<u64>,
    /// `order` is sorted: a firing started; nothing may arrive until it
    /// ends.
    sorted: bool,
    /// How far into `order` the firing has emitted.
    next: usize,
    /// The `KV` bytes of those not fired.
    payload: usize,
}

/// One key's arrivals, as [`Arrivals::next_group`] gives them.
pub(super) struct Group<'a> {
    /// The key's encoded bytes.
    pub(super) key: &'a [u8],
    /// The first value (most keys of a GroupByKey over distinct keys have
    /// only this one).
    first: &'a [u8],
    arrivals: &'a Arrivals,
    /// The arrivals after the first.
    rest: &'a [u64],
}

impl<'a> Group<'a> {
    /// How many values the key has.
    pub(super) fn len(&self) -> usize {
        1 + self.rest.len()
    }

    /// The values, nested-encoded, in arrival order.
    pub(super) fn values(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let arrivals = self.arrivals;
        std::iter::once(self.first).chain(
            self.rest
                .iter()
                .map(move |&m| arrivals.key_value(offset(m)).1),
        )
    }
}

/// Where in `bytes` the arrival an `order` entry names starts.
fn offset(entry: u64) -> usize {
    (entry & u64::from(u32::MAX)) as usize
}

/// The bytes of an arrival's two lengths.
const LENGTHS: usize = 8;

/// The key hash an `order` entry carries.
fn key_hash(entry: u64) -> u32 {
    (entry >> 32) as u32
}

/// Fewer entries than this are sorted by comparison: a radix sort's
/// counting passes cost more than they save.
const RADIX_AT_LEAST: usize = 1024;
/// Bits of the hash each radix pass sorts by (three passes: 33 bits).
const RADIX_BITS: u32 = 11;

impl Arrivals {
    /// Whether a GroupByKey with `strategy` may keep arrivals: its panes
    /// fire only when the watermark passes the window's end, at the end of
    /// the window, and windows do not merge.
    pub(super) fn suit(strategy: &WindowingStrategy) -> bool {
        strategy.trigger == Trigger::Default
            && strategy.output_time == OutputTime::EndOfWindow
            && !strategy.window_fn.is_merging()
    }

    /// Whether there are none.
    pub(super) fn is_empty(&self) -> bool {
        self.next == self.order.len()
    }

    /// How many have not fired.
    pub(super) fn len(&self) -> usize {
        self.order.len() - self.next
    }

    /// Their window, while there are some.
    pub(super) fn window(&self) -> Option<&Window> {
        self.window.as_ref().filter(|_| !self.is_empty())
    }

    /// What their panes hold the output watermark at: their window's end.
    pub(super) fn hold(&self) -> Option<Timestamp> {
        self.window().map(Window::max_timestamp)
    }

    /// Whether a firing emitted some but not all of them.
    pub(super) fn is_firing(&self) -> bool {
        self.sorted && !self.is_empty()
    }

    /// Whether an element of `window` whose `KV` bytes are `kv_len` long
    /// may join them: the same window, no firing under way, and a place
    /// in `bytes` that fits 32 bits.
    pub(super) fn takes(&self, window: &Window, kv_len: usize) -> bool {
        !self.sorted
            && self.window.as_ref().is_none_or(|w| w == window)
            && self.bytes.len() <= u32::MAX as usize
            && u32::try_from(kv_len).is_ok()
    }

    /// Room for about `more` arrivals of the size of those so far.
    pub(super) fn reserve(&mut self, more: usize) {
        if self.order.is_empty() || self.sorted {
            return;
        }
        let per_element = self.bytes.len() / self.order.len();
        self.bytes.reserve(more.saturating_mul(per_element));
        self.order.reserve(more);
    }

    /// Adds an element of `window` whose `KV` bytes are `kv`, the first
    /// `key_len` of them its key. The caller checked [`Self::takes`].
    pub(super) fn push(&mut self, window: &Window, kv: &[u8], key_len: usize) {
        debug_assert!(self.takes(window, kv.len()));
        if self.window.as_ref() != Some(window) {
            self.window = Some(window.clone());
        }
        let (key, value) = kv.split_at(key_len);
        let start = self.bytes.len() as u64;
        self.bytes
            .extend_from_slice(&(key.len() as u32).to_le_bytes());
        self.bytes
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(kv);
        self.order.push((u64::from(hash(key)) << 32) | start);
        self.payload += kv.len();
    }

    /// The key and value of the arrival starting at `at` in `bytes`.
    fn key_value(&self, at: usize) -> (&[u8], &[u8]) {
        let length = |from: usize| {
            let mut le = [0u8; 4];
            le.copy_from_slice(&self.bytes[from..from + 4]);
            u32::from_le_bytes(le) as usize
        };
        let (key_len, value_len) = (length(at), length(at + 4));
        let key_start = at + LENGTHS;
        let value_start = key_start + key_len;
        (
            &self.bytes[key_start..value_start],
            &self.bytes[value_start..value_start + value_len],
        )
    }

    /// The `KV` bytes of those not fired, for a firing's room.
    pub(super) fn bytes_left(&self) -> usize {
        self.payload
    }

    /// Those not fired, as (key, value), each key's in arrival order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.order[self.next..]
            .iter()
            .map(|&m| self.key_value(offset(m)))
    }

    /// Starts a firing: sorts them by key hash (stable: a key's values
    /// stay in arrival order). Nothing arrives until they are all gone.
    pub(super) fn start_firing(&mut self) {
        if self.sorted {
            return;
        }
        self.sorted = true;
        if self.order.len() < RADIX_AT_LEAST {
            // The place in the low half keeps equal hashes in order.
            self.order.sort_unstable();
            return;
        }
        radix_sort_by_hash(&mut self.order);
    }

    /// The next key's arrivals of a firing ([`Self::start_firing`]
    /// first), which count as gone: the caller says how many `KV` bytes
    /// they were ([`Self::fired`]).
    pub(super) fn next_group(&mut self) -> Option<Group<'_>> {
        debug_assert!(self.sorted);
        let start = self.next;
        let first = *self.order.get(start)?;
        let h = key_hash(first);
        let mut end = start + 1;
        while end < self.order.len() && key_hash(self.order[end]) == h {
            end += 1;
        }
        if end - start > 1 {
            end = self.gather_key(start, end);
        }
        self.next = end;
        let (key, first) = self.key_value(offset(first));
        Some(Group {
            key,
            first,
            arrivals: self,
            rest: self.order.get(start + 1..end).unwrap_or(&[]),
        })
    }

    /// The group [`Self::next_group`] gave went out: it had `kv_bytes`
    /// `KV` bytes in all.
    pub(super) fn fired(&mut self, kv_bytes: usize) {
        self.payload = self.payload.saturating_sub(kv_bytes);
    }

    /// Among `order[start..end]`, entries of one hash, moves those whose
    /// key is the first's to the front (each side keeps its order); where
    /// they end. (Two keys share a hash rarely: the check is a comparison
    /// of each entry's key with the first's.)
    fn gather_key(&mut self, start: usize, end: usize) -> usize {
        let first = self.key_value(offset(self.order[start])).0;
        let same = |m: &u64| self.key_value(offset(*m)).0 == first;
        if self.order[start..end].iter().all(same) {
            return end;
        }
        let (mut ours, theirs): (Vec<u64>, Vec<u64>) =
            self.order[start..end].iter().partition(|m| same(m));
        let split = start + ours.len();
        ours.extend(theirs);
        self.order[start..end].copy_from_slice(&ours);
        split
    }

    /// Forgets them all, keeping no room.
    pub(super) fn clear(&mut self) {
        *self = Arrivals::default();
    }
}

/// Sorts `order` by the hash in each entry's high half, keeping entries of
/// equal hash in the order they had: three counting passes of
/// [`RADIX_BITS`] bits, least significant first (a pass every entry
/// falls into one bucket of is skipped).
fn radix_sort_by_hash(order: &mut Vec<u64>) {
    let buckets = 1usize << RADIX_BITS;
    let mask = (buckets - 1) as u64;
    let mut from = std::mem::take(order);
    let mut to = vec![0u64; from.len()];
    for pass in 0..3 {
        let shift = 32 + pass * RADIX_BITS;
        let mut counts = vec![0usize; buckets];
        for &e in &from {
            counts[((e >> shift) & mask) as usize] += 1;
        }
        if counts.contains(&from.len()) {
            continue;
        }
        let mut sum = 0;
        for c in counts.iter_mut() {
            let n = *c;
            *c = sum;
            sum += n;
        }
        for &e in &from {
            let b = ((e >> shift) & mask) as usize;
            to[counts[b]] = e;
            counts[b] += 1;
        }
        std::mem::swap(&mut from, &mut to);
    }
    *order = from;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kv(key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = key.to_vec();
        out.extend_from_slice(value);
        out
    }

    /// What a firing's groups are: (key, values), in the order it gives them.
    fn groups(arrivals: &mut Arrivals) -> Vec<(Vec<u8>, Vec<Vec<u8>>)> {
        arrivals.start_firing();
        let mut out = Vec::new();
        while let Some(g) = arrivals.next_group() {
            let values: Vec<Vec<u8>> = g.values().map(<[u8]>::to_vec).collect();
            let kv_bytes = values.iter().map(|v| g.key.len() + v.len()).sum();
            out.push((g.key.to_vec(), values));
            arrivals.fired(kv_bytes);
        }
        assert_eq!(arrivals.bytes_left(), 0);
        out
    }

    /// The oracle: each key's values in arrival order, keys sorted.
    fn by_key(elements: &[(Vec<u8>, Vec<u8>)]) -> Vec<(Vec<u8>, Vec<Vec<u8>>)> {
        let mut map: std::collections::BTreeMap<Vec<u8>, Vec<Vec<u8>>> = Default::default();
        for (k, v) in elements {
            map.entry(k.clone()).or_default().push(v.clone());
        }
        map.into_iter().collect()
    }

    proptest! {
        /// Every key comes out once, with all its values in arrival
        /// order, whether the radix or the comparison sort ran.
        #[test]
        fn a_firing_groups_every_key_once_in_arrival_order(
            elements in prop::collection::vec(
                (prop::collection::vec(0u8..4, 0..3), prop::collection::vec(any::<u8>(), 0..3)),
                0..3000,
            )
        ) {
            let mut arrivals = Arrivals::default();
            for (k, v) in &elements {
                arrivals.push(&Window::Global, &kv(k, v), k.len());
            }
            prop_assert_eq!(arrivals.len(), elements.len());
            let mut got = groups(&mut arrivals);
            got.sort();
            prop_assert_eq!(got, by_key(&elements));
            prop_assert!(arrivals.is_empty());
        }
    }

    /// Keys of one hash are told apart, each keeping its values' order.
    #[test]
    fn keys_sharing_a_hash_are_told_apart() {
        let mut arrivals = Arrivals::default();
        for (i, k) in [b"a", b"b", b"a", b"c", b"b"].iter().enumerate() {
            arrivals.push(&Window::Global, &kv(*k, &[i as u8]), 1);
        }
        // Every entry made to look alike by its hash (only its place
        // left).
        for e in arrivals.order.iter_mut() {
            *e &= u64::from(u32::MAX);
        }
        let got = groups(&mut arrivals);
        assert_eq!(
            got,
            vec![
                (b"a".to_vec(), vec![vec![0], vec![2]]),
                (b"b".to_vec(), vec![vec![1], vec![4]]),
                (b"c".to_vec(), vec![vec![3]]),
            ]
        );
    }

    /// Another window, or a firing under way, is not taken.
    #[test]
    fn one_window_and_nothing_while_firing() {
        let mut arrivals = Arrivals::default();
        let w = Window::Interval { start: 0, end: 10 };
        assert!(arrivals.takes(&w, 3));
        arrivals.push(&w, b"kvv", 1);
        assert!(arrivals.takes(&w, 3));
        assert!(!arrivals.takes(&Window::Global, 3));
        // An element too long for a 32-bit place goes to the key table.
        assert!(!arrivals.takes(&w, u32::MAX as usize + 1));
        assert!(arrivals.takes(&w, u32::MAX as usize - 100));
        assert_eq!(arrivals.hold(), Some(w.max_timestamp()));
        arrivals.start_firing();
        assert!(!arrivals.takes(&w, 3));
        assert!(arrivals.is_firing());
        let _ = arrivals.next_group();
        arrivals.fired(3);
        assert!(arrivals.is_empty() && !arrivals.is_firing());
        assert_eq!(arrivals.hold(), None);
    }
}
