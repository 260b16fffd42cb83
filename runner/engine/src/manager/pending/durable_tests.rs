//! Queues that spill to a durable spill space, checked against a model: random
//! pushes and takes, with checkpoints taken, written, and crashes that
//! restore the last one written over the same store. A restored queue must
//! hold exactly what the queue held when that checkpoint was taken, in
//! order, with its bytes and holds; a segment a written checkpoint names
//! must still be on disk; and after a restore the store holds the
//! restored queue's segments and nothing else.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::coder::{Coder, DecodedElement, PaneInfo, WindowedValueHeader};
use crate::spill::MemorySpillSpace;
use crate::window::Window;

/// Bytes of each element's value: four go to a segment (64 KiB at least).
const VALUE_BYTES: usize = 16 << 10;
/// The queue's bound: it spills past twice this.
const LIMIT: usize = 24 << 10;

/// Element `id`, at timestamp `id`, its value `id` then padding.
fn element(id: u32) -> DecodedElement {
    let header = WindowedValueHeader {
        timestamp: i64::from(id),
        windows: smallvec::smallvec![Window::Global],
        pane: PaneInfo::NO_FIRING,
    };
    let mut encoded = Vec::new();
    header
        .encode(&Coder::GlobalWindow, &mut encoded)
        .expect("encodes");
    let value_start = encoded.len();
    encoded.extend_from_slice(&id.to_be_bytes());
    encoded.resize(value_start + VALUE_BYTES, 0);
    DecodedElement::new(header, Bytes::from(encoded), value_start)
}

fn id(e: &DecodedElement) -> u32 {
    let bytes: [u8; 4] = e.value()[..4].try_into().expect("an id");
    u32::from_be_bytes(bytes)
}

fn durable_queue(store: &Arc<MemorySpillSpace>) -> Pending {
    let mut p = Pending::default();
    p.enable_overflow(Overflow::durable(
        store.clone(),
        b"q".to_vec(),
        Coder::GlobalWindow,
        LIMIT,
    ));
    p
}

fn ids(p: &Pending) -> VecDeque<u32> {
    let mut out = VecDeque::new();
    p.for_each(|e| out.push_back(id(e))).expect("reads");
    out
}

/// A checkpoint as taken: its number, the queue's front, the named back
/// and the elements after it, and the model then.
#[derive(Clone)]
struct Taken {
    number: u64,
    front: Vec<DecodedElement>,
    spilled: Option<(SpilledQueue, Vec<DecodedElement>)>,
    model: VecDeque<u32>,
}

#[derive(Debug, Clone)]
enum Op {
    Push(u8),
    Take(u8),
    Checkpoint,
    Written,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u8..12).prop_map(Op::Push),
        3 => (1u8..6).prop_map(Op::Take),
        2 => Just(Op::Checkpoint),
        2 => Just(Op::Written),
        1 => Just(Op::Crash),
    ]
}

fn take(p: &Pending, number: u64) -> Taken {
    let (mut front, mut tail) = (Vec::new(), Vec::new());
    let spilled = p
        .checkpoint(true, |e| front.push(e.clone()), |e| tail.push(e.clone()))
        .expect("a checkpoint");
    Taken {
        number,
        front,
        spilled: spilled.map(|record| (record, tail)),
        model: ids(p),
    }
}

fn assert_counts(p: &Pending, model: &VecDeque<u32>) {
    assert_eq!(p.len(), model.len());
    assert_eq!(
        p.bytes(),
        p.len() * (VALUE_BYTES + element(0).value_start())
    );
    assert_eq!(p.hold(), model.iter().min().map(|&id| i64::from(id)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn durable_queues_match_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        let store = MemorySpillSpace::shared();
        let mut p = durable_queue(&store);
        let mut model = VecDeque::new();
        let mut next_id = 0u32;
        // Checkpoints sent and not written yet (a restore never reads
        // them), and the last one written.
        let mut sent = 0u64;
        let mut unwritten: Vec<Taken> = Vec::new();
        let mut written: Option<Taken> = None;
        for op in ops {
            match op {
                Op::Push(n) => {
                    for _ in 0..n {
                        p.push_back(element(next_id)).expect("pushes");
                        model.push_back(next_id);
                        next_id += 1;
                    }
                }
                Op::Take(n) => {
                    p.refill().expect("refills");
                    let taken: Vec<u32> = p
                        .take(usize::from(n))
                        .into_iter()
                        .flat_map(Queued::into_elements)
                        .map(|e| id(&e))
                        .collect();
                    let want: Vec<u32> = model.drain(..taken.len()).collect();
                    prop_assert_eq!(taken, want);
                }
                Op::Checkpoint => {
                    sent += 1;
                    unwritten.push(take(&p, sent));
                    p.checkpoint_taken(sent);
                }
                Op::Written => {
                    if let Some(last) = unwritten.pop() {
                        p.checkpoint_durable(last.number).expect("deletes");
                        written = Some(last);
                        unwritten.clear();
                    }
                }
                Op::Crash => {
                    drop(p);
                    p = durable_queue(&store);
                    match &written {
                        Some(t) => {
                            p.restore(t.front.clone(), t.spilled.clone())
                                .expect("every named segment is on disk");
                            model = t.model.clone();
                        }
                        None => {
                            p.restore(Vec::new(), None).expect("restores");
                            model.clear();
                        }
                    }
                    p.all_durable();
                    // A new engine counts its checkpoints from one.
                    sent = 0;
                    unwritten.clear();
                    prop_assert_eq!(store.len(), p.segments_on_disk(), "no garbage");
                }
            }
            prop_assert_eq!(&ids(&p), &model);
            assert_counts(&p, &model);
        }
    }
}

/// A periodic checkpoint names the segments (a few bytes each) and copies
/// only the elements in memory; a savepoint copies them all.
#[test]
fn periodic_checkpoints_name_segments_and_savepoints_copy_them() {
    let store = MemorySpillSpace::shared();
    let mut p = durable_queue(&store);
    for id in 0..40 {
        p.push_back(element(id)).expect("pushes");
    }
    assert!(p.segments_on_disk() >= 8 && !p.holds_scratch_spill());
    let named = take(&p, 1);
    let (_, tail) = named.spilled.as_ref().expect("named");
    let copied = named.front.len() + tail.len();
    assert!(copied <= 8, "{copied} of 40 elements copied");
    let mut all = 0;
    let copy = p.checkpoint(false, |_| all += 1, |_| unreachable!("no tail"));
    assert!(copy.expect("reads").is_none());
    assert_eq!(all, 40);
}

/// A segment read back stays on disk until a checkpoint taken after that
/// is written; then it goes.
#[test]
fn a_read_back_segment_goes_once_a_later_checkpoint_is_durable() {
    let store = MemorySpillSpace::shared();
    let mut p = durable_queue(&store);
    for id in 0..40 {
        p.push_back(element(id)).expect("pushes");
    }
    let on_disk = store.len();
    p.checkpoint_taken(1);
    p.checkpoint_durable(1).expect("deletes");
    while p.segments_on_disk() == on_disk {
        p.refill().expect("refills");
        p.take(1);
    }
    assert_eq!(store.len(), on_disk, "checkpoint 1 names what was read");
    p.checkpoint_durable(1).expect("deletes");
    assert_eq!(store.len(), on_disk, "still");
    p.checkpoint_taken(2);
    assert_eq!(store.len(), on_disk, "checkpoint 2 is not durable yet");
    p.checkpoint_durable(2).expect("deletes");
    assert_eq!(store.len(), p.segments_on_disk());
}
