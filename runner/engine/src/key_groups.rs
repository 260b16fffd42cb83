//! Key groups: the unit in which a keyed stage's work is spread over
//! bundles running at once.
//!
//! A stateful stage (user state or timers) must never process one key in
//! two bundles at once: each bundle reads the key's state as its last
//! commit left it, and two bundles would each write their own version.
//! Locking single keys would cost a lookup per element and a lock table
//! as large as the key space; locking nothing (one bundle at a time) wastes
//! every SDK worker but one. Keys are hashed into a fixed number of groups
//! instead, and the groups into as many *slices* as a stage may have
//! bundles in flight: a bundle takes the elements and timers of one slice
//! no bundle in flight holds, and holds it until it commits or fails.
//! (Taking every unlocked group instead would let the first bundle of a
//! queue in random key order hold them all.) With 128 groups, a set of
//! groups is one `u128`.

use std::hash::Hasher;

use rustc_hash::FxHasher;

/// How many key groups there are.
pub const KEY_GROUPS: u32 = 128;

/// A set of key groups, one bit each.
pub type KeyGroupSet = u128;

/// The key group of an encoded key.
pub fn key_group(key: &[u8]) -> u32 {
    let mut hasher = FxHasher::default();
    hasher.write(key);
    // The high bits of a multiplicative hash are its well-mixed ones.
    (hasher.finish() >> (64 - KEY_GROUPS.trailing_zeros())) as u32
}

/// The set holding only `key`'s group.
pub fn group_of(key: &[u8]) -> KeyGroupSet {
    1u128 << key_group(key)
}

/// The `k`-th of `slices` equal runs of key groups (`slices` between 1
/// and [`KEY_GROUPS`]): what one bundle of a keyed stage may take, so
/// that `slices` bundles can run at once.
pub fn slice_mask(k: usize, slices: usize) -> KeyGroupSet {
    let n = KEY_GROUPS as usize;
    let (from, to) = (k * n / slices, (k + 1) * n / slices);
    (from..to).fold(0, |m, g| m | (1u128 << g))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_over_every_group() {
        let mut seen: KeyGroupSet = 0;
        let mut counts = [0u32; KEY_GROUPS as usize];
        for i in 0..12_800u32 {
            let key = format!("key-{i}");
            seen |= group_of(key.as_bytes());
            counts[key_group(key.as_bytes()) as usize] += 1;
        }
        assert_eq!(seen, u128::MAX, "every group gets keys");
        let (min, max) = (counts.iter().min(), counts.iter().max());
        assert!(min >= Some(&50) && max <= Some(&150), "{min:?}..{max:?}");
    }

    #[test]
    fn slices_cover_every_group_once() {
        for slices in [1, 3, 4, 128] {
            let masks: Vec<KeyGroupSet> = (0..slices).map(|k| slice_mask(k, slices)).collect();
            assert_eq!(masks.iter().fold(0, |a, m| a | m), u128::MAX);
            assert_eq!(
                masks.iter().map(|m| m.count_ones()).sum::<u32>(),
                KEY_GROUPS
            );
        }
    }

    #[test]
    fn a_key_is_always_in_the_same_group() {
        assert_eq!(key_group(b"user-42"), key_group(b"user-42"));
        assert!(key_group(b"") < KEY_GROUPS);
    }
}
