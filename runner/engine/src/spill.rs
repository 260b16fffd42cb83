//! Where a GroupByKey puts what does not fit in its share of memory.
//!
//! A batch GroupByKey must hold all of a window's values until the window
//! closes, which for a bounded input is the end of the input: its buffer
//! can be far larger than memory. Once a buffer outgrows its share of the
//! job's `--memory_budget`, it writes what it holds to a [`SpillSpace`] as
//! one *run* and starts over in memory; when the window fires, the runs
//! and what is still in memory are merged key by key and emitted a few
//! megabytes at a time, as fast as the consumer takes them. (Sessions are
//! filed by key instead, and merged as they are read back.)
//!
//! The store is an ordered key-value space: ordering does the merge (all
//! runs of one key are adjacent), so no sort happens in the runner. The
//! runner backs it with RocksDB; [`MemorySpillSpace`] is for tests.
//! Spilled bytes are scratch space, not durable state: a checkpoint that
//! must include a spilled buffer reads it back (see the grouping module).
//! The same interface also fronts a durable spill space beside the checkpoints,
//! where checkpoints name what was spilled instead (`OwedDeletes` keeps
//! what they may still name).
//!
//! The same store also takes what a GroupByKey is not the only place for:
//! the output of a bundle that cannot be split
//! ([`crate::spilled_output`]) and the back of a queue that output
//! overfills (the manager's `pending` module). Those are read once, soon,
//! in the order written, and deleted with [`SpillSpace::forget_range`].

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use parking_lot::Mutex;
use thiserror::Error;

use crate::plan::StageIdx;

/// Entries as written and read: (key, value).
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// The spill space failed (I/O, a full disk).
#[derive(Debug, Clone, Error)]
#[error("spilling to disk: {0}")]
pub struct SpillError(pub String);

/// An ordered key-value space for spilled grouping buffers. Keys written
/// by different buffers never overlap (each has its own prefix).
pub trait SpillSpace: Send + Sync + Debug {
    /// Writes `entries` (no durability needed: a crash discards them).
    fn put(&self, entries: Entries) -> Result<(), SpillError>;
    /// Entries with keys in `[from, to)`, in key order, stopping after the
    /// first entry that brings the values read past `max_bytes` (so at
    /// least one entry if any is there). Empty when the range is.
    fn scan(&self, from: &[u8], to: &[u8], max_bytes: usize) -> Result<Entries, SpillError>;
    /// Forgets every key in `[from, to)`, giving the space back soon (a
    /// GroupByKey's drained window: one of few large ones, or of many
    /// small ones, whose reclaiming the store batches).
    fn delete_range(&self, from: &[u8], to: &[u8]) -> Result<(), SpillError>;
    /// Forgets every key in `[from, to)`, without hurrying to give the
    /// space back: for small ranges deleted often, soon after they were
    /// written (a queue's segments, a bundle's output), where reclaiming
    /// each at once would cost far more than the data.
    fn forget_range(&self, from: &[u8], to: &[u8]) -> Result<(), SpillError> {
        self.delete_range(from, to)
    }
}

/// A [`SpillSpace`] in memory, for engine tests: it exercises the same
/// spill, merge and drain logic without a disk.
#[derive(Debug, Default)]
pub struct MemorySpillSpace {
    entries: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl MemorySpillSpace {
    /// An empty store, shareable by an engine's buffers.
    pub fn shared() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// How many entries it holds (tests check spilled data is removed).
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.lock().is_empty()
    }
}

impl SpillSpace for MemorySpillSpace {
    fn put(&self, entries: Entries) -> Result<(), SpillError> {
        self.entries.lock().extend(entries);
        Ok(())
    }

    fn scan(&self, from: &[u8], to: &[u8], max_bytes: usize) -> Result<Entries, SpillError> {
        let entries = self.entries.lock();
        let mut out = Vec::new();
        let mut bytes = 0;
        for (k, v) in entries.range(from.to_vec()..to.to_vec()) {
            bytes += v.len();
            out.push((k.clone(), v.clone()));
            if bytes > max_bytes {
                break;
            }
        }
        Ok(out)
    }

    fn delete_range(&self, from: &[u8], to: &[u8]) -> Result<(), SpillError> {
        let mut entries = self.entries.lock();
        let doomed: Vec<Vec<u8>> = entries
            .range(from.to_vec()..to.to_vec())
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            entries.remove(&k);
        }
        Ok(())
    }
}

/// About how many bytes are read from the store at once by a reader that
/// goes through a range in pages.
const PAGE_BYTES: usize = 4 << 20;

/// A key range of the store read a page at a time, in key order.
#[derive(Debug)]
pub(crate) struct PagedRange {
    /// The first key past the range.
    end: Vec<u8>,
    /// Where the next read starts; `None` once the range is read out.
    next: Option<Vec<u8>>,
}

impl PagedRange {
    /// Every key that starts with `start`.
    pub(crate) fn prefixed(start: &[u8]) -> Self {
        PagedRange {
            end: prefix_end(start).unwrap_or_default(),
            next: Some(start.to_vec()),
        }
    }

    /// The next [`PAGE_BYTES`] or so of entries; none once read out.
    pub(crate) fn next_page(&mut self, store: &dyn SpillSpace) -> Result<Entries, SpillError> {
        self.next_entries(store, PAGE_BYTES)
    }

    /// The next entries, up to the one whose value brings them past
    /// `max_bytes` (so at least one, if any is left; with 0, one that is
    /// not empty); none once read out.
    pub(crate) fn next_entries(
        &mut self,
        store: &dyn SpillSpace,
        max_bytes: usize,
    ) -> Result<Entries, SpillError> {
        let Some(from) = self.next.take() else {
            return Ok(Vec::new());
        };
        let entries = store.scan(&from, &self.end, max_bytes)?;
        if let Some((last, _)) = entries.last() {
            let mut next = last.clone();
            next.push(0);
            self.next = Some(next);
        }
        Ok(entries)
    }

    /// Everything not read yet.
    pub(crate) fn rest(&self, store: &dyn SpillSpace) -> Result<Entries, SpillError> {
        match &self.next {
            Some(from) => store.scan(from, &self.end, usize::MAX),
            None => Ok(Vec::new()),
        }
    }
}

/// Deletes a durable spill space owes: data that was consumed (a cleared bag's
/// parts, a queue segment read back) but that the latest durable
/// checkpoint may still name, so it must stay until a checkpoint taken
/// after it was consumed is durable. Every checkpoint lists what is still
/// owed, which a restore deletes (a crash may come between the checkpoint
/// and the deletes).
#[derive(Debug)]
struct OwedDeletes<K> {
    /// Consumed since the last checkpoint was taken.
    since_checkpoint: Vec<K>,
    /// Consumed before checkpoint `n` was taken: deleted once it is durable.
    before: std::collections::VecDeque<(u64, Vec<K>)>,
}

impl<K> Default for OwedDeletes<K> {
    fn default() -> Self {
        OwedDeletes {
            since_checkpoint: Vec::new(),
            before: std::collections::VecDeque::new(),
        }
    }
}

impl<K: Clone + Ord> OwedDeletes<K> {
    /// `keys` were consumed: deleted once a checkpoint taken from now on
    /// is durable.
    fn owe(&mut self, keys: impl IntoIterator<Item = K>) {
        self.since_checkpoint.extend(keys);
    }

    /// Everything consumed and not deleted yet, sorted: what a checkpoint
    /// taken now lists as owed.
    fn listed(&self) -> Vec<K> {
        let mut owed: Vec<K> = self
            .before
            .iter()
            .flat_map(|(_, keys)| keys.iter().cloned())
            .chain(self.since_checkpoint.iter().cloned())
            .collect();
        owed.sort_unstable();
        owed
    }

    /// Checkpoint `number` was taken: what was consumed before it may be
    /// deleted once it is durable.
    fn checkpoint_taken(&mut self, number: u64) {
        let consumed = std::mem::take(&mut self.since_checkpoint);
        if !consumed.is_empty() {
            self.before.push_back((number, consumed));
        }
    }

    /// Checkpoints up to `number` are durable: what may be deleted now.
    /// Whatever the caller then fails to delete goes back with
    /// [`Self::owe`], for the next checkpoint to list again.
    fn due(&mut self, number: u64) -> Vec<K> {
        let mut due = Vec::new();
        while self.before.front().is_some_and(|(n, _)| *n <= number) {
            if let Some((_, keys)) = self.before.pop_front() {
                due.extend(keys);
            }
        }
        due
    }
}

/// When the pieces an owner consumed leave the store — a queue segment read
/// back, a cleared bag's parts, a drained GroupByKey window — by the kind
/// of store they are on. The one home of that rule for queues, bags and
/// GroupByKeys alike.
///
/// On scratch space, which a crash empties and no checkpoint names,
/// consumed pieces are deleted at once. On a durable spill space beside the
/// checkpoints they stay until no checkpoint a restore may read names
/// them ([`OwedDeletes`]).
#[derive(Debug)]
pub(crate) struct Reclaim<K> {
    /// What a durable spill space owes; `None` on scratch.
    owed: Option<OwedDeletes<K>>,
}

impl<K: Clone + Ord> Reclaim<K> {
    /// Deletes on scratch: at once.
    pub(crate) fn scratch() -> Self {
        Reclaim { owed: None }
    }

    /// Deletes on a durable spill space, owing nothing yet.
    pub(crate) fn durable() -> Self {
        Reclaim {
            owed: Some(OwedDeletes::default()),
        }
    }

    /// Whether the store is durable (checkpoints name its pieces).
    pub(crate) fn is_durable(&self) -> bool {
        self.owed.is_some()
    }

    /// `pieces` were consumed: deleted now with `delete` on scratch,
    /// owed on a durable spill space.
    pub(crate) fn consumed(
        &mut self,
        pieces: impl IntoIterator<Item = K>,
        mut delete: impl FnMut(&K) -> Result<(), SpillError>,
    ) -> Result<(), SpillError> {
        match &mut self.owed {
            None => pieces.into_iter().try_for_each(|piece| delete(&piece)),
            Some(owed) => {
                owed.owe(pieces);
                Ok(())
            }
        }
    }

    /// What a checkpoint taken now lists as owed (nothing on scratch).
    pub(crate) fn listed(&self) -> Vec<K> {
        self.owed
            .as_ref()
            .map_or_else(Vec::new, OwedDeletes::listed)
    }

    /// Checkpoint `number` was taken: what was consumed before it is
    /// deleted once it is durable ([`Self::checkpoint_durable`]).
    pub(crate) fn checkpoint_taken(&mut self, number: u64) {
        if let Some(owed) = &mut self.owed {
            owed.checkpoint_taken(number);
        }
    }

    /// [`Self::listed`], then [`Self::checkpoint_taken`].
    pub(crate) fn checkpoint(&mut self, number: u64) -> Vec<K> {
        let listed = self.listed();
        self.checkpoint_taken(number);
        listed
    }

    /// Checkpoints up to `number` are durable: what was consumed before
    /// them is deleted with `delete`. A failed delete, and those after it,
    /// are owed again (the next checkpoint lists them).
    pub(crate) fn checkpoint_durable(
        &mut self,
        number: u64,
        mut delete: impl FnMut(&K) -> Result<(), SpillError>,
    ) -> Result<(), SpillError> {
        let Some(owed) = &mut self.owed else {
            return Ok(());
        };
        let mut due = owed.due(number).into_iter();
        while let Some(piece) = due.next() {
            if let Err(error) = delete(&piece) {
                owed.owe(std::iter::once(piece).chain(due));
                return Err(error);
            }
        }
        Ok(())
    }

    /// Owes nothing any more: a restore carried out the deletes its
    /// checkpoint listed.
    pub(crate) fn restart(&mut self) {
        if let Some(owed) = &mut self.owed {
            *owed = OwedDeletes::default();
        }
    }
}

/// Deletes everything under `prefix` and gives its space back soon
/// ([`SpillSpace::delete_range`]: a GroupByKey buffer's scratch space).
pub(crate) fn delete_prefix(store: &dyn SpillSpace, prefix: &[u8]) -> Result<(), SpillError> {
    let end = prefix_end(prefix).unwrap_or_default();
    store.delete_range(prefix, &end)
}

/// Forgets everything under `prefix` ([`SpillSpace::forget_range`]: a queue's
/// segments, a bundle's output parts).
pub fn forget_prefix(store: &dyn SpillSpace, prefix: &[u8]) -> Result<(), SpillError> {
    let end = prefix_end(prefix).unwrap_or_default();
    store.forget_range(prefix, &end)
}

/// Where everything a job spills is filed: `job_prefix` (unique to the
/// job), length first, so that no job's space is the start of another's.
pub fn job_space(job_prefix: &[u8]) -> Vec<u8> {
    let mut space = Vec::with_capacity(job_prefix.len() + 8);
    space.extend_from_slice(&(job_prefix.len() as u32).to_be_bytes());
    space.extend_from_slice(job_prefix);
    space
}

/// What a job files in its spill space, each under a prefix of its own:
/// the one definition of the layout. A key starts with the job's
/// [`job_space`], then a 4-byte big-endian number: a stage's own number
/// for its scratch space, or one of the numbers at the top of the range
/// (no plan has that many stages) for the spaces shared by every stage,
/// followed by the stage's number where the space is per stage. Durable
/// stores keep these keys across restarts: the numbers must not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpillArea {
    /// A stage's scratch space on the spill space: its GroupByKey's runs,
    /// or the back of its queue.
    Stage(StageIdx),
    /// A stateful stage's bags, on whichever store they spill to.
    UserState(StageIdx),
    /// The back of a stage's queue on a durable spill space.
    DurableQueue(StageIdx),
    /// A GroupByKey's spilled windows on a durable spill space.
    DurableGrouping(StageIdx),
    /// Bundle outputs waiting in the spill space for their bundle to end.
    BundleOutputs,
}

impl SpillArea {
    /// The number of the space bundle outputs share.
    const BUNDLE_OUTPUTS: u32 = u32::MAX;
    /// The number of the space every stage's bags share.
    const USER_STATE: u32 = u32::MAX - 1;
    /// The number of the space every durable queue shares.
    const DURABLE_QUEUES: u32 = u32::MAX - 2;
    /// The number of the space every durable GroupByKey spill shares.
    const DURABLE_GROUPINGS: u32 = u32::MAX - 3;

    /// The prefix of every key of this space in the job whose prefix is
    /// `job_prefix`.
    pub fn prefix(self, job_prefix: &[u8]) -> Vec<u8> {
        let mut key = job_space(job_prefix);
        let (shared, stage) = match self {
            SpillArea::Stage(stage) => (None, Some(stage)),
            SpillArea::UserState(stage) => (Some(Self::USER_STATE), Some(stage)),
            SpillArea::DurableQueue(stage) => (Some(Self::DURABLE_QUEUES), Some(stage)),
            SpillArea::DurableGrouping(stage) => (Some(Self::DURABLE_GROUPINGS), Some(stage)),
            SpillArea::BundleOutputs => (Some(Self::BUNDLE_OUTPUTS), None),
        };
        if let Some(number) = shared {
            key.extend_from_slice(&number.to_be_bytes());
        }
        if let Some(stage) = stage {
            // Plans are far smaller than the shared numbers (translation
            // refuses huge pipelines), so a stage's number never reaches
            // them.
            let number = u32::try_from(stage.index()).unwrap_or(Self::DURABLE_GROUPINGS - 1);
            key.extend_from_slice(&number.to_be_bytes());
        }
        key
    }
}

/// The first key after every key that starts with `prefix` (for ranges
/// over a prefix); `None` if there is none (all bytes 0xFF).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_first_key_past_the_prefix() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xFF]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xFF, 0xFF]), None);
    }

    #[test]
    fn spill_areas_keep_their_layout_and_never_overlap() {
        let job = b"job";
        let mut head = job_space(job);
        head.extend_from_slice(&[0, 0, 0, 2]);
        assert_eq!(SpillArea::Stage(StageIdx::new(2)).prefix(job), head);
        let shared = |number: u32, stage: Option<u32>| {
            let mut key = job_space(job);
            key.extend_from_slice(&number.to_be_bytes());
            key.extend(stage.map(u32::to_be_bytes).into_iter().flatten());
            key
        };
        let stage = StageIdx::new(7);
        assert_eq!(SpillArea::BundleOutputs.prefix(job), shared(u32::MAX, None));
        assert_eq!(
            SpillArea::UserState(stage).prefix(job),
            shared(u32::MAX - 1, Some(7))
        );
        assert_eq!(
            SpillArea::DurableQueue(stage).prefix(job),
            shared(u32::MAX - 2, Some(7))
        );
        assert_eq!(
            SpillArea::DurableGrouping(stage).prefix(job),
            shared(u32::MAX - 3, Some(7))
        );
        let mut spaces = vec![SpillArea::BundleOutputs];
        for i in [0, 1, 255, 256, 70_000] {
            let stage = StageIdx::new(i);
            spaces.extend([
                SpillArea::Stage(stage),
                SpillArea::UserState(stage),
                SpillArea::DurableQueue(stage),
                SpillArea::DurableGrouping(stage),
            ]);
        }
        for (i, a) in spaces.iter().enumerate() {
            for b in &spaces[i + 1..] {
                let (a, b) = (a.prefix(job), b.prefix(job));
                assert!(!a.starts_with(&b) && !b.starts_with(&a), "{a:?} / {b:?}");
            }
        }
        // Another job's space is never inside this one's.
        assert!(!SpillArea::Stage(StageIdx::new(0))
            .prefix(b"jo")
            .starts_with(&job_space(job)));
    }

    #[test]
    fn consumed_pieces_go_at_once_on_scratch_and_after_a_durable_checkpoint_otherwise() {
        let mut deleted = Vec::new();
        let mut scratch = Reclaim::scratch();
        scratch
            .consumed([1, 2], |&n| {
                deleted.push(n);
                Ok(())
            })
            .unwrap();
        assert_eq!(deleted, [1, 2]);
        assert!(scratch.listed().is_empty());

        let mut durable = Reclaim::durable();
        let never = |_: &u64| -> Result<(), SpillError> { panic!("deleted too early") };
        durable.consumed([3], never).unwrap();
        assert_eq!(durable.checkpoint(1), [3], "checkpoint 1 lists it as owed");
        durable.consumed([4, 5], never).unwrap();
        durable.checkpoint_taken(2);
        // Checkpoint 1 is durable: what was consumed before it may go,
        // and no more. The first delete fails: it and the rest are owed
        // again, for the next checkpoint to list.
        let mut tries = Vec::new();
        let failing = |&n: &u64| {
            tries.push(n);
            Err(SpillError("disk full".into()))
        };
        assert!(durable.checkpoint_durable(1, failing).is_err());
        assert_eq!(tries, [3]);
        assert_eq!(durable.listed(), [3, 4, 5]);
        durable.checkpoint_taken(3);
        let mut deleted = Vec::new();
        durable
            .checkpoint_durable(3, |&n| {
                deleted.push(n);
                Ok(())
            })
            .unwrap();
        deleted.sort_unstable();
        assert_eq!(deleted, [3, 4, 5]);
        assert!(durable.listed().is_empty());
        durable.consumed([6], never).unwrap();
        durable.restart();
        assert!(durable.listed().is_empty(), "a restore carried them out");
    }

    #[test]
    fn scans_stop_after_the_byte_limit_and_deletes_remove_ranges() {
        let s = MemorySpillSpace::default();
        let put: Vec<(Vec<u8>, Vec<u8>)> = (0u8..10).map(|i| (vec![1, i], vec![i; 4])).collect();
        s.put(put).unwrap();
        let page = s.scan(&[1], &[2], 5).unwrap();
        assert_eq!(page.len(), 2);
        s.delete_range(&[1, 0], &[1, 5]).unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(s.scan(&[1], &[2], usize::MAX).unwrap()[0].0, vec![1, 5]);
    }
}
