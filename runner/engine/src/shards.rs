//! Shards: one job's engine spread over several engines, each owning a
//! range of the [key groups](crate::key_groups) of every keyed stage.
//!
//! # The model
//!
//! Every shard runs the whole plan, but each element is processed on one
//! shard only:
//!
//! * A PCollection that a *keyed* stage reads (a GroupByKey, or an SDK stage
//!   with user state or timers) is *partitioned*: each element goes to the
//!   shard owning its key's group, and every stage reading it processes it
//!   there. A key's GroupByKey buffer, state and timers so live on exactly
//!   one shard, as they live in one key group on one engine.
//! * Any other PCollection stays on the shard that produced it: non-keyed
//!   work runs wherever its input is.
//! * A PCollection read as a side input is *broadcast*: every shard keeps a
//!   whole copy, since any shard's elements may read it.
//! * Sources (Impulses, TestStreams) run on shard 0; on every other shard
//!   they are done from the start. A TestStream's next event is applied
//!   only once every shard is quiet (as a single engine applies it once it
//!   is), and its scripted processing time is every shard's.
//!
//! Time is a two-level minimum. Each shard computes its stages' output
//! watermarks over the elements, bundles, panes and timers it holds, and
//! publishes them; a stage's input watermark on a shard is the least output
//! watermark of its producers over *every* shard. A shard hands elements to
//! another before it publishes the watermark that those elements held, and
//! a shard takes what it was handed before it reads the others'
//! watermarks, so no element is ever behind a watermark that passed it in
//! transit.
//!
//! A shard with nothing to do *parks* until another shard hands it elements
//! or publishes new watermarks. When every shard that has not finished is
//! parked and nothing changed since they parked, the pipeline is quiet: the
//! shard with TestStream events left applies the next one, and with none
//! left the job is stuck (as a single engine is when nothing can run).
//!
//! One shard is the common case, and the same code: an engine without a
//! [`ShardLink`] partitions nothing and reads only its own watermarks.
//! [`exchange`] is what a shard's engine exchanges, through one of two
//! exchanges: the in-process board ([`ShardLink::in_process`]), or the
//! [`peer`] frame protocol that a transport carries between processes.

mod board;
mod channels;
pub mod exchange;
pub mod frames;
pub mod peer;
pub mod quiet;
mod views;

use thiserror::Error;

use crate::key_groups::{slice_mask, KeyGroupSet, KEY_GROUPS};

pub use exchange::ShardLink;

/// A checkpoint epoch of a job on shards: every shard cuts epoch `n`
/// once, and the job's checkpoint `n` is their cuts together (see
/// `manager/shard_epochs.rs`). Counted from 1; [`Epoch::NONE`] is before
/// the first.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Epoch(u64);

impl Epoch {
    /// Before any epoch was cut.
    pub const NONE: Epoch = Epoch(0);
    /// Later than every epoch: what a finished shard counts as having cut.
    pub const EVERY: Epoch = Epoch(u64::MAX);

    /// The epoch after this one.
    pub fn next(self) -> Epoch {
        Epoch(self.0.saturating_add(1))
    }

    /// The epoch's number, which is also the number of the shard's
    /// checkpoint sent for it.
    pub fn number(self) -> u64 {
        self.0
    }

    /// The epoch numbered `number`: what a transport reads off the wire.
    pub fn from_number(number: u64) -> Epoch {
        Epoch(number)
    }
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "epoch {}", self.0)
    }
}

/// A shard's number within its job, from 0 to the number of shards less one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(u32);

impl ShardId {
    /// The shard that runs a job's sources.
    pub const SOURCES: ShardId = ShardId(0);

    /// The shard's number, as an index.
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// Shard number `number` of `layout`, if the layout has it: what a
    /// transport reads off the wire.
    pub fn of(layout: ShardLayout, number: u32) -> Option<ShardId> {
        (number < layout.shards()).then_some(ShardId(number))
    }

    /// The shard's number, as sent on the wire.
    pub fn number(self) -> u32 {
        self.0
    }

    /// Where this shard of a job whose spill prefix is `job_prefix` spills:
    /// shards of one job share a spill space, each under a prefix of its
    /// own (and the job's owner gives each back when the job ends).
    pub fn spill_prefix(self, job_prefix: &[u8]) -> Vec<u8> {
        let mut prefix = job_prefix.to_vec();
        prefix.extend_from_slice(format!("/shard-{}", self.0).as_bytes());
        prefix
    }
}

impl std::fmt::Display for ShardId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "shard {}", self.0)
    }
}

/// Why a layout of shards cannot be made.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ShardError {
    /// Each shard must own at least one key group.
    #[error("a job runs on 1 to {KEY_GROUPS} shards (one key group each at least), not {0}")]
    OutOfRange(u32),
}

/// How a job's key groups are spread over its shards: shard `k` of `n`
/// owns the `k`-th of `n` equal runs of groups, so a key's owner is one
/// division away and a rescale moves whole runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLayout {
    shards: u32,
}

impl ShardLayout {
    /// One shard owning every key group: what one engine is.
    pub const ONE: ShardLayout = ShardLayout { shards: 1 };

    /// A layout of `shards` shards (1 to [`KEY_GROUPS`]).
    pub fn new(shards: u32) -> Result<Self, ShardError> {
        if (1..=KEY_GROUPS).contains(&shards) {
            Ok(ShardLayout { shards })
        } else {
            Err(ShardError::OutOfRange(shards))
        }
    }

    /// How many shards there are.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// Every shard, in order.
    pub fn ids(&self) -> impl Iterator<Item = ShardId> {
        (0..self.shards).map(ShardId)
    }

    /// The shard owning key group `group`: the last shard whose run of
    /// groups starts at or before it.
    pub fn owner(&self, group: u32) -> ShardId {
        let group = group.min(KEY_GROUPS - 1);
        ShardId(((group + 1) * self.shards - 1) / KEY_GROUPS)
    }

    /// The key groups shard `shard` owns.
    pub fn key_groups(&self, shard: ShardId) -> KeyGroupSet {
        slice_mask(shard.index(), self.shards as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_group_has_one_owner_which_owns_it() {
        for shards in 1..=KEY_GROUPS {
            let layout = ShardLayout::new(shards).expect("in range");
            let mut covered: KeyGroupSet = 0;
            for shard in layout.ids() {
                let groups = layout.key_groups(shard);
                assert_ne!(groups, 0, "{shard} of {shards} owns a group");
                assert_eq!(covered & groups, 0, "{shard} of {shards} overlaps");
                covered |= groups;
                for group in 0..KEY_GROUPS {
                    let owned = groups & (1u128 << group) != 0;
                    assert_eq!(
                        layout.owner(group) == shard,
                        owned,
                        "group {group} of {shards}"
                    );
                }
            }
            assert_eq!(covered, u128::MAX);
        }
    }

    #[test]
    fn layouts_outside_the_range_are_refused() {
        assert_eq!(ShardLayout::new(0), Err(ShardError::OutOfRange(0)));
        assert_eq!(
            ShardLayout::new(KEY_GROUPS + 1),
            Err(ShardError::OutOfRange(KEY_GROUPS + 1))
        );
        assert!(ShardLayout::new(KEY_GROUPS).is_ok());
    }
}
