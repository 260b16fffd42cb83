//! Bags that spill to disk, checked against a model: random bundles of
//! appends, clears and paged reads, some failing, with expiries and
//! checkpoints between them.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use proptest::prelude::*;

use super::{BundleOverlay, SideInputTable, UserStateTable};
use crate::spill::{Entries, MemorySpillSpace, SpillError, SpillSpace};
use crate::state::{BundleState, CellId, StateKey};

fn read_all(o: &BundleOverlay, key: &StateKey) -> Vec<u8> {
    let mut out = Vec::new();
    let mut token: Option<Bytes> = None;
    loop {
        let page = o.get(key, token.as_deref()).expect("get");
        out.extend_from_slice(&page.data);
        match page.continuation {
            Some(t) => token = Some(t),
            None => return out,
        }
    }
}

#[derive(Debug, Clone)]
enum BagOp {
    Append(u8, u8, Vec<u8>),
    Clear(u8, u8),
    Read(u8, u8),
}

/// Bag ops over two keys in two windows.
fn bag_op() -> impl Strategy<Value = BagOp> {
    prop_oneof![
        4 => (0u8..2, 0u8..2, proptest::collection::vec(any::<u8>(), 0..6))
            .prop_map(|(w, k, v)| BagOp::Append(w, k, v)),
        1 => (0u8..2, 0u8..2).prop_map(|(w, k)| BagOp::Clear(w, k)),
        2 => (0u8..2, 0u8..2).prop_map(|(w, k)| BagOp::Read(w, k)),
    ]
}

/// What happens after a bundle: nothing, a window expires, a checkpoint
/// is taken, the last one taken is written, or the process crashes and a
/// new one restores the last checkpoint written.
#[derive(Debug, Clone)]
enum Between {
    Nothing,
    Expire(u8),
    Checkpoint,
    Written,
    Crash,
}

fn between() -> impl Strategy<Value = Between> {
    prop_oneof![
        6 => Just(Between::Nothing),
        1 => (0u8..2).prop_map(Between::Expire),
        2 => Just(Between::Checkpoint),
        2 => Just(Between::Written),
        1 => Just(Between::Crash),
    ]
}

/// A checkpoint taken: its number, what it holds, and the model then.
type Taken = (
    u64,
    super::UserStateSnapshot,
    Option<super::SpilledBags>,
    BTreeMap<(u8, u8), Vec<u8>>,
);

fn bag_key(window: u8, key: u8) -> StateKey {
    StateKey::BagUserState(CellId {
        transform_id: "t".into(),
        state_id: "bag".into(),
        window: Bytes::from(vec![b'w', window]),
        key: Bytes::from(vec![1, b'a' + key]),
    })
}

/// A stage's bags, spilling past `limit` bytes to `store`.
fn spilling_bags(store: &Arc<MemorySpillSpace>, limit: usize) -> Arc<Mutex<UserStateTable>> {
    bags_on(store, limit, false)
}

/// A stage's bags, spilling past `limit` bytes to `store`, which is
/// durable (checkpoints name what is there) or scratch.
fn bags_on(
    store: &Arc<MemorySpillSpace>,
    limit: usize,
    durable: bool,
) -> Arc<Mutex<UserStateTable>> {
    let mut bags = UserStateTable::default();
    if durable {
        bags.enable_durable_bag_spill(store.clone(), b"bags/".to_vec(), limit);
    } else {
        bags.enable_bag_spill(store.clone(), b"bags/".to_vec(), limit);
    }
    Arc::new(Mutex::new(bags))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Bags that spill to disk past a few bytes (so most commits spill)
    /// read exactly as the model says, in every bundle and after expiries,
    /// checkpoints and crashes, with pages of a few bytes. On scratch, what
    /// is cleared or expired leaves the disk at once, and a crash loses the
    /// disk (the checkpoint holds the bags); on a durable spill space, the
    /// checkpoint names the parts, and a restore finds each one it names
    /// and leaves nothing else.
    #[test]
    fn spilling_bags_match_the_model(
        bundles in proptest::collection::vec(
            (proptest::collection::vec(bag_op(), 0..8), any::<bool>(), between()),
            1..12,
        ),
        limit in 0usize..16,
        durable in any::<bool>(),
    ) {
        let side_inputs = Arc::new(Mutex::new(SideInputTable::default()));
        let mut disk = MemorySpillSpace::shared();
        let mut user_state = bags_on(&disk, limit, durable);
        let mut committed: BTreeMap<(u8, u8), Vec<u8>> = BTreeMap::new();
        // Checkpoints taken since the last restore, the last taken (not yet
        // written) and the last written.
        let mut taken = 0u64;
        let mut unwritten: Option<Taken> = None;
        let mut written: Option<Taken> = None;
        for (ops, succeeds, then) in bundles {
            let o = BundleOverlay::new(side_inputs.clone(), user_state.clone()).with_page_bytes(3);
            let mut model = committed.clone();
            for op in ops {
                match op {
                    BagOp::Append(w, k, v) => {
                        o.append(&bag_key(w, k), Bytes::from(v.clone())).expect("append");
                        model.entry((w, k)).or_default().extend(v);
                    }
                    BagOp::Clear(w, k) => {
                        o.clear(&bag_key(w, k)).expect("clear");
                        model.remove(&(w, k));
                    }
                    BagOp::Read(w, k) => {
                        let got = read_all(&o, &bag_key(w, k));
                        prop_assert_eq!(got, model.get(&(w, k)).cloned().unwrap_or_default());
                    }
                }
            }
            if succeeds {
                user_state.lock().apply(o.take_writes()).expect("apply");
                committed = model;
            }
            match then {
                Between::Nothing => {}
                Between::Expire(w) => {
                    let gone = Bytes::from(vec![b'w', w]);
                    user_state.lock().retain_windows(|window| *window != gone).expect("expire");
                    committed.retain(|(window, _), _| *window != w);
                }
                Between::Checkpoint => {
                    taken += 1;
                    let (snapshot, spilled) = user_state.lock().checkpoint(taken).expect("checkpoint");
                    prop_assert_eq!(spilled.is_some(), durable);
                    unwritten = Some((taken, snapshot, spilled, committed.clone()));
                }
                Between::Written => {
                    if let Some(checkpoint) = unwritten.take() {
                        user_state.lock().checkpoint_durable(checkpoint.0).expect("deletes");
                        written = Some(checkpoint);
                    }
                }
                Between::Crash => {
                    if !durable {
                        // Scratch does not outlive the process.
                        disk = MemorySpillSpace::shared();
                    }
                    user_state = bags_on(&disk, limit, durable);
                    let (snapshot, spilled, model) = match written.clone() {
                        Some((_, snapshot, spilled, model)) => (snapshot, spilled, model),
                        None => Default::default(),
                    };
                    user_state.lock().restore(snapshot, spilled).expect("restore");
                    committed = model;
                    taken = 0;
                    unwritten = None;
                    written = None;
                    // Nothing is left on disk that the restored bags do not name.
                    prop_assert_eq!(disk.len(), user_state.lock().parts_on_disk());
                }
            }
            let check = BundleOverlay::new(side_inputs.clone(), user_state.clone()).with_page_bytes(3);
            for w in 0..2 {
                for k in 0..2 {
                    let got = read_all(&check, &bag_key(w, k));
                    prop_assert_eq!(got, committed.get(&(w, k)).cloned().unwrap_or_default());
                }
            }
            // (A bag of empty appends is there and reads as nothing.)
            prop_assert_eq!(user_state.lock().is_empty(), committed.is_empty());
            if committed.is_empty() && !durable {
                prop_assert!(disk.is_empty(), "nothing left on disk");
            }
        }
    }
}

/// Bags already on disk when spilling is turned off (a checkpointed
/// streaming job restored with more state than its share) come back into
/// memory, in order, and leave the disk.
#[test]
fn turning_the_spill_off_brings_spilled_bags_back() {
    let side_inputs = Arc::new(Mutex::new(SideInputTable::default()));
    let disk = MemorySpillSpace::shared();
    let user_state = spilling_bags(&disk, 4);
    for chunk in [&b"abc"[..], b"def"] {
        let write = BundleOverlay::new(side_inputs.clone(), user_state.clone());
        write
            .append(&bag_key(0, 0), Bytes::from_static(chunk))
            .unwrap();
        write
            .append(&bag_key(1, 1), Bytes::from_static(b"x"))
            .unwrap();
        user_state.lock().apply(write.take_writes()).unwrap();
    }
    assert!(user_state.lock().has_spilled() && !disk.is_empty());
    // One more chunk in memory after the parts on disk.
    let write = BundleOverlay::new(side_inputs.clone(), user_state.clone());
    write
        .append(&bag_key(0, 0), Bytes::from_static(b"g"))
        .unwrap();
    user_state.lock().apply(write.take_writes()).unwrap();
    user_state.lock().disable_bag_spill().unwrap();
    assert!(!user_state.lock().has_spilled());
    assert!(disk.is_empty(), "the parts are forgotten");
    let check = BundleOverlay::new(side_inputs.clone(), user_state.clone()).with_page_bytes(2);
    assert_eq!(read_all(&check, &bag_key(0, 0)), b"abcdefg");
    assert_eq!(read_all(&check, &bag_key(1, 1)), b"xx");
    // And it stays in memory however large it grows.
    let write = BundleOverlay::new(side_inputs, user_state.clone());
    write
        .append(&bag_key(0, 0), Bytes::from_static(b"0123456789"))
        .unwrap();
    user_state.lock().apply(write.take_writes()).unwrap();
    assert!(!user_state.lock().has_spilled());
}

/// A spill space whose deletes fail.
#[derive(Debug, Default)]
struct UndeletableStore(MemorySpillSpace);

impl SpillSpace for UndeletableStore {
    fn put(&self, entries: Entries) -> Result<(), SpillError> {
        self.0.put(entries)
    }

    fn scan(&self, from: &[u8], to: &[u8], max_bytes: usize) -> Result<Entries, SpillError> {
        self.0.scan(from, to, max_bytes)
    }

    fn delete_range(&self, _: &[u8], _: &[u8]) -> Result<(), SpillError> {
        Err(SpillError("the disk refuses deletes".into()))
    }
}

/// Turning the spill off when the parts cannot be deleted still brings
/// every bag back whole: the error is reported, nothing is lost.
#[test]
fn turning_the_spill_off_keeps_the_bags_when_their_parts_cannot_be_deleted() {
    let side_inputs = Arc::new(Mutex::new(SideInputTable::default()));
    let mut bags = UserStateTable::default();
    bags.enable_bag_spill(Arc::new(UndeletableStore::default()), b"bags/".to_vec(), 2);
    let user_state = Arc::new(Mutex::new(bags));
    let write = BundleOverlay::new(side_inputs.clone(), user_state.clone());
    write
        .append(&bag_key(0, 0), Bytes::from_static(b"abc"))
        .unwrap();
    user_state.lock().apply(write.take_writes()).unwrap();
    assert!(user_state.lock().has_spilled());
    assert!(user_state.lock().disable_bag_spill().is_err());
    assert!(!user_state.lock().has_spilled());
    let check = BundleOverlay::new(side_inputs, user_state.clone());
    assert_eq!(read_all(&check, &bag_key(0, 0)), b"abc");
}

/// A bundle paging through a bag finds the next chunk where it was when
/// another bundle's commit spills the bag's chunks between two pages.
#[test]
fn a_bag_read_across_a_spill_goes_on_where_it_was() {
    let side_inputs = Arc::new(Mutex::new(SideInputTable::default()));
    let disk = MemorySpillSpace::shared();
    let user_state = spilling_bags(&disk, 10);
    let write = BundleOverlay::new(side_inputs.clone(), user_state.clone());
    for chunk in [&b"abc"[..], b"def", b"ghi"] {
        write
            .append(&bag_key(0, 0), Bytes::from_static(chunk))
            .unwrap();
    }
    user_state.lock().apply(write.take_writes()).unwrap();
    assert!(!user_state.lock().has_spilled());
    let reader = BundleOverlay::new(side_inputs.clone(), user_state.clone()).with_page_bytes(3);
    let first = reader.get(&bag_key(0, 0), None).unwrap();
    assert_eq!(&first.data[..], b"abc");
    // Another key's commit takes the stage past its limit: every bag spills.
    let other = BundleOverlay::new(side_inputs, user_state.clone());
    other
        .append(&bag_key(0, 1), Bytes::from_static(b"0123"))
        .unwrap();
    user_state.lock().apply(other.take_writes()).unwrap();
    assert!(user_state.lock().has_spilled());
    let mut rest = Vec::new();
    let mut token = first.continuation;
    while let Some(t) = token {
        let page = reader.get(&bag_key(0, 0), Some(&t)).unwrap();
        rest.extend_from_slice(&page.data);
        token = page.continuation;
    }
    assert_eq!(rest, b"defghi");
}
