//! Queues holding runs of elements beside single ones, checked against a
//! model of one element per entry: random pushes of both, takes that cut
//! runs, and takes of chosen elements (which take a run apart). Whatever
//! the entries, the queue hands out the model's elements in the model's
//! order, counts them and their bytes as the model does, and never holds
//! its stage's watermark later than its earliest waiting element.

use std::collections::VecDeque;

use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::coder::{Coder, DecodedElement, PaneInfo, RunRecord, WindowedValueHeader};
use crate::spill::MemorySpillSpace;
use crate::window::Window;

/// The header of element `id` at `timestamp`.
fn header(timestamp: i64) -> WindowedValueHeader {
    WindowedValueHeader {
        timestamp,
        windows: smallvec::smallvec![Window::Global],
        pane: PaneInfo::NO_FIRING,
    }
}

/// Encodes element `id` at `timestamp` into `buffer`, recording it.
fn encode(id: u32, timestamp: i64, buffer: &mut Vec<u8>, record: &mut RunRecord) {
    let header = header(timestamp);
    let start = buffer.len();
    header
        .encode(&Coder::GlobalWindow, buffer)
        .expect("encodes");
    let value_start = buffer.len();
    buffer.extend_from_slice(&id.to_be_bytes());
    record.push(header, start, value_start, buffer.len());
}

fn element(id: u32, timestamp: i64) -> DecodedElement {
    let mut buffer = Vec::new();
    let mut record = RunRecord::default();
    encode(id, timestamp, &mut buffer, &mut record);
    let mut elements = record
        .elements(&Bytes::from(buffer), 0..1)
        .collect::<Vec<_>>();
    elements.pop().expect("one element")
}

/// A run of elements `ids`, the n-th at `timestamps[n]`.
fn run(ids: std::ops::Range<u32>, timestamps: &[i64]) -> ElementRun {
    let mut buffer = Vec::new();
    let mut record = RunRecord::default();
    for (id, &ts) in ids.zip(timestamps) {
        encode(id, ts, &mut buffer, &mut record);
    }
    ElementRun::new(Bytes::from(buffer), record).expect("not empty")
}

fn id(e: &DecodedElement) -> u32 {
    let bytes: [u8; 4] = e.value()[..4].try_into().expect("an id");
    u32::from_be_bytes(bytes)
}

fn ids(entries: Vec<Queued>) -> Vec<u32> {
    entries
        .into_iter()
        .flat_map(Queued::into_elements)
        .map(|e| id(&e))
        .collect()
}

/// Bytes of one encoded element: a 13-byte global-window header and a
/// 4-byte id.
const ELEMENT_BYTES: usize = 17;

#[test]
fn a_take_cuts_a_run_and_its_hold_stays_until_the_run_is_gone() {
    let mut p = Pending::default();
    p.push_back(element(0, 50)).unwrap();
    p.push_run(run(1..6, &[30, 20, 40, 60, 70])).unwrap();
    p.push_back(element(6, 80)).unwrap();
    assert_eq!((p.len(), p.bytes()), (7, 7 * ELEMENT_BYTES));
    assert_eq!(p.hold(), Some(20));
    let taken = p.take(3);
    assert_eq!(taken.len(), 2, "the element and a part of the run");
    assert_eq!(ids(taken), [0, 1, 2]);
    // The rest of the run (40, 60, 70) still holds at the run's earliest.
    assert_eq!((p.len(), p.hold()), (4, Some(20)));
    let rest = p.take(3);
    assert!(matches!(rest.as_slice(), [Queued::Run(r)] if r.len() == 3));
    assert_eq!((p.len(), p.hold(), p.bytes()), (1, Some(80), ELEMENT_BYTES));
    assert_eq!(ids(p.take(10)), [6]);
    assert!(p.is_empty() && p.hold().is_none());
}

#[test]
fn what_takes_one_element_at_a_time_sees_a_runs_elements() {
    let mut p = Pending::default();
    p.push_run(run(0..4, &[10, 11, 12, 13])).unwrap();
    let mut seen = Vec::new();
    p.for_each(|e| seen.push(id(e))).unwrap();
    assert_eq!(seen, [0, 1, 2, 3]);
    assert!(p.any(|e| id(e) == 2));
    let odd = p.take_where(10, |e| id(e) % 2 == 1);
    assert_eq!(odd.iter().map(id).collect::<Vec<_>>(), [1, 3]);
    // Taken apart, each element holds at its own time.
    assert_eq!((p.len(), p.hold()), (2, Some(10)));
    assert_eq!(ids(p.take(1)), [0]);
    assert_eq!(p.hold(), Some(12));
}

#[test]
fn a_gated_queue_keeps_a_run_as_its_elements() {
    let mut p = Pending::default();
    p.push_run(run(0..2, &[5, 6])).unwrap();
    p.gate();
    let mark = p.checkpoint_mark();
    p.push_run(run(2..5, &[7, 8, 9])).unwrap();
    assert!(p.awaits_checkpoint());
    assert!(p.take(10).is_empty(), "nothing is durable yet");
    p.made_durable(mark);
    let durable = p.take(10);
    assert_eq!(durable.len(), 2, "one entry per element");
    assert_eq!(ids(durable), [0, 1]);
    p.made_durable(p.checkpoint_mark());
    assert_eq!(ids(p.take(10)), [2, 3, 4]);
}

#[test]
fn a_run_past_the_queues_bound_spills_element_by_element() {
    let store = MemorySpillSpace::shared();
    let mut p = Pending::default();
    p.enable_overflow(Overflow::new(
        store.clone(),
        b"q".to_vec(),
        Coder::GlobalWindow,
        2 * ELEMENT_BYTES,
    ));
    for n in 0..4u32 {
        p.push_back(element(n, 0)).unwrap();
    }
    p.push_run(run(4..8, &[1, 2, 3, 4])).unwrap();
    assert!(p.has_spilled());
    assert_eq!((p.len(), p.hold()), (8, Some(0)));
    let mut order = Vec::new();
    while !p.is_empty() {
        p.refill().unwrap();
        order.extend(ids(p.take(2)));
    }
    assert_eq!(order, (0..8).collect::<Vec<_>>());
}

#[test]
fn cutting_a_bundles_entries_keeps_whole_elements() {
    let entries = || {
        vec![
            Queued::One(element(0, 0)),
            Queued::Run(run(1..4, &[0, 0, 0])),
            Queued::One(element(4, 0)),
        ]
    };
    for (n, want) in [
        (0, vec![]),
        (1, vec![0]),
        (2, vec![0, 1]),
        (4, vec![0, 1, 2, 3]),
        (5, vec![0, 1, 2, 3, 4]),
        (9, vec![0, 1, 2, 3, 4]),
    ] {
        let mut cut = entries();
        truncate_elements(&mut cut, n);
        assert_eq!(element_count(&cut), want.len());
        assert_eq!(ids(cut), want, "first {n}");
    }
    // Chunks: single elements copied together, runs as long as a chunk
    // sliced in place, shorter ones copied with their neighbours.
    let sizes = |chunk_bytes: usize| -> Vec<usize> {
        let chunks = chunk_entries(&entries(), chunk_bytes);
        let whole: Vec<u8> = chunks.concat();
        let want: Vec<u8> = (0..5)
            .flat_map(|n| element(n, 0).encoded.to_vec())
            .collect();
        assert_eq!(whole, want, "the elements, in order, whole");
        chunks.iter().map(Bytes::len).collect()
    };
    let e = ELEMENT_BYTES;
    assert_eq!(sizes(2 * e), [e, 2 * e, e, e]);
    assert_eq!(sizes(4 * e), [4 * e, e]);
    assert_eq!(sizes(0), [e; 5]);
}

/// What the model does.
#[derive(Debug, Clone)]
enum Op {
    /// One element at this timestamp.
    One(i64),
    /// A run of elements at these timestamps.
    Run(Vec<i64>),
    /// Take up to this many elements.
    Take(u8),
    /// Take up to this many elements with an even id.
    TakeEven(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0i64..100).prop_map(Op::One),
        prop::collection::vec(0i64..100, 1..20).prop_map(Op::Run),
        (0u8..30).prop_map(Op::Take),
        (0u8..10).prop_map(Op::TakeEven),
    ]
}

proptest! {
    #[test]
    fn runs_and_elements_leave_in_the_order_they_came(ops in prop::collection::vec(op(), 1..60)) {
        let mut p = Pending::default();
        let mut model: VecDeque<(u32, i64)> = VecDeque::new();
        let mut next = 0u32;
        for op in ops {
            match op {
                Op::One(ts) => {
                    p.push_back(element(next, ts)).expect("in memory");
                    model.push_back((next, ts));
                    next += 1;
                }
                Op::Run(timestamps) => {
                    let n = timestamps.len() as u32;
                    p.push_run(run(next..next + n, &timestamps)).expect("in memory");
                    model.extend((next..next + n).zip(timestamps));
                    next += n;
                }
                Op::Take(n) => {
                    let taken = ids(p.take(usize::from(n)));
                    let want: Vec<u32> = model.drain(..taken.len()).map(|(id, _)| id).collect();
                    prop_assert_eq!(taken.len(), usize::from(n).min(taken.len() + model.len()));
                    prop_assert_eq!(taken, want);
                }
                Op::TakeEven(n) => {
                    let taken: Vec<u32> =
                        p.take_where(usize::from(n), |e| id(e).is_multiple_of(2)).iter().map(id).collect();
                    let want: Vec<u32> = model
                        .iter()
                        .map(|&(id, _)| id)
                        .filter(|id| id.is_multiple_of(2))
                        .take(usize::from(n))
                        .collect();
                    model.retain(|(id, _)| !want.contains(id));
                    prop_assert_eq!(taken, want);
                }
            }
            let runs = p.queue.iter().filter(|q| matches!(q, Queued::Run(_))).count();
            prop_assert_eq!(p.runs, runs);
            prop_assert_eq!(p.len(), model.len());
            prop_assert_eq!(p.bytes(), model.len() * ELEMENT_BYTES);
            let earliest = model.iter().map(|&(_, ts)| ts).min();
            match (p.hold(), earliest) {
                (Some(hold), Some(earliest)) => prop_assert!(hold <= earliest),
                (hold, earliest) => prop_assert_eq!(hold, earliest),
            }
        }
    }
}
