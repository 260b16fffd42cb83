//! A GroupByKey spilling to a durable spill space, checked against a model:
//! random adds across fixed windows, watermark advances that emit windows
//! a little at a time, checkpoints (named between drains, copied during
//! one), writes of them, and crashes that restore the last one written
//! over the same store. Every pane emitted must be exactly the values of
//! its key and window that the model still owes; at the end every value
//! is out, and once a last checkpoint is durable the store is empty (a
//! restore left nothing the checkpoint did not name, and what was emitted
//! went).

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::super::tests::{element, emitted, key_and_sorted_values, kv_coder};
use super::*;
use crate::coder::Coder;
use crate::grouping::{GroupingBuffer, GroupingSnapshot};
use crate::plan::WindowingStrategy;
use crate::spill::MemorySpillSpace;
use crate::time::MAX_TIMESTAMP;

const WINDOW: i64 = 10;
/// Bytes the buffer may hold before it spills: a few dozen panes.
const LIMIT: usize = 2_000;

fn buffer(store: &Arc<MemorySpillSpace>) -> GroupingBuffer {
    let mut strategy = WindowingStrategy::global_default();
    strategy.window_fn = WindowFn::Fixed {
        size: WINDOW,
        offset: 0,
    };
    let mut g = GroupingBuffer::new(strategy, kv_coder(), Coder::IntervalWindow);
    assert!(g.enable_durable_spill(store.clone(), b"g/".to_vec(), LIMIT));
    g
}

/// (window start, key) → the values not yet emitted.
type Model = BTreeMap<(i64, u8), Vec<u8>>;

#[derive(Debug, Clone)]
enum Op {
    /// (key, window past the first open one, value) each.
    Add(Vec<(u8, u8, u8)>),
    /// Pass this many more windows' ends, emitting up to this many bytes.
    Advance(u8, usize),
    /// Emit up to this many bytes more of ready windows.
    Drain(usize),
    Checkpoint,
    Written,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => proptest::collection::vec((0u8..12, 0u8..4, 0u8..128), 1..40).prop_map(Op::Add),
        2 => (0u8..3, 1usize..400).prop_map(|(n, step)| Op::Advance(n, step)),
        2 => (1usize..400).prop_map(Op::Drain),
        2 => Just(Op::Checkpoint),
        2 => Just(Op::Written),
        1 => Just(Op::Crash),
    ]
}

/// A checkpoint as taken, with the model and the watermark then.
#[derive(Clone)]
struct Taken {
    number: u64,
    snapshot: GroupingSnapshot,
    named: Option<SpilledWindows>,
    model: Model,
    watermark: Timestamp,
}

/// Everything `g` holds, emitted: the watermark at the end of time.
fn emit_everything(g: &mut GroupingBuffer) -> Fired {
    let mut out = Fired::default();
    g.evaluate(MAX_TIMESTAMP, 0, &mut out, usize::MAX).unwrap();
    while g.is_draining() {
        g.drain_spilled(MAX_TIMESTAMP, 0, &mut out, usize::MAX)
            .unwrap();
    }
    out
}

/// Takes every pane in `out` off the model, which must owe exactly it.
fn check_emitted(out: Fired, model: &mut Model) -> Result<(), TestCaseError> {
    for e in emitted(out, &Coder::IntervalWindow) {
        let Window::Interval { start, .. } = e.header.windows[0] else {
            return Err(TestCaseError::fail("not an interval window"));
        };
        let (key, values) = key_and_sorted_values(&e);
        let owed = model.remove(&(start, key[0]));
        prop_assert_eq!(owed, Some(values), "window {}, key {}", start, key[0]);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_durable_spill_matches_the_model(ops in proptest::collection::vec(op(), 1..50)) {
        let store = MemorySpillSpace::shared();
        let mut g = buffer(&store);
        let mut model = Model::new();
        // Windows before this one's start have been passed.
        let mut watermark: Timestamp = 0;
        let (mut sent, mut unwritten, mut written) = (0u64, Vec::<Taken>::new(), None::<Taken>);
        for op in ops {
            match op {
                Op::Add(adds) => {
                    for (key, ahead, value) in adds {
                        let start = watermark + i64::from(ahead) * WINDOW;
                        let window = Window::Interval { start, end: start + WINDOW };
                        g.add(&element(&[key], value, start, window), watermark, 0).unwrap();
                        let values = model.entry((start, key)).or_default();
                        values.push(value);
                        values.sort_unstable();
                    }
                }
                Op::Advance(windows, step) => {
                    watermark += i64::from(windows) * WINDOW;
                    let mut out = Fired::default();
                    g.evaluate(watermark, 0, &mut out, step).unwrap();
                    check_emitted(out, &mut model)?;
                }
                Op::Drain(step) => {
                    let mut out = Fired::default();
                    g.drain_spilled(watermark, 0, &mut out, step).unwrap();
                    check_emitted(out, &mut model)?;
                }
                Op::Checkpoint => {
                    sent += 1;
                    let (snapshot, named) = g.checkpoint(true).unwrap();
                    prop_assert_eq!(named.is_none(), g.holds_scratch_spill() || g.is_draining());
                    g.checkpoint_taken(sent);
                    unwritten.push(Taken {
                        number: sent,
                        snapshot,
                        named,
                        model: model.clone(),
                        watermark,
                    });
                }
                Op::Written => {
                    if let Some(last) = unwritten.pop() {
                        g.checkpoint_durable(last.number).unwrap();
                        written = Some(last);
                        unwritten.clear();
                    }
                }
                Op::Crash => {
                    drop(g);
                    g = buffer(&store);
                    match &written {
                        Some(t) => {
                            g.restore(t.snapshot.clone(), t.named.clone())
                                .expect("every named run is on disk");
                            model = t.model.clone();
                            watermark = t.watermark;
                        }
                        None => {
                            let empty = buffer(&MemorySpillSpace::shared()).memory_snapshot();
                            g.restore(empty, None).unwrap();
                            model.clear();
                            watermark = 0;
                        }
                    }
                    sent = 0;
                    unwritten.clear();
                }
            }
        }
        // Everything out, each pane once; then nothing left on disk.
        check_emitted(emit_everything(&mut g), &mut model)?;
        prop_assert!(model.is_empty(), "never emitted: {:?}", model);
        let (_, named) = g.checkpoint(true).unwrap();
        prop_assert!(named.is_some());
        g.checkpoint_taken(sent + 1);
        g.checkpoint_durable(sent + 1).unwrap();
        prop_assert_eq!(store.len(), 0, "garbage on disk");
    }
}

/// Between drains a checkpoint names the spilled windows (and copies only
/// the panes in memory); restored over an empty store it is refused; over
/// the store it was taken on, the windows come back whole.
#[test]
fn a_checkpoint_names_spilled_windows_and_a_restore_needs_them() {
    let store = MemorySpillSpace::shared();
    let mut g = buffer(&store);
    for i in 0..120u8 {
        let start = i64::from(i % 3) * WINDOW;
        let window = Window::Interval {
            start,
            end: start + WINDOW,
        };
        g.add(&element(&[i % 40], i, start, window), 0, 0).unwrap();
    }
    assert!(g.has_spilled() && !g.holds_scratch_spill());
    let (snapshot, named) = g.checkpoint(true).unwrap();
    let named = named.expect("named");
    assert!(named.names_windows());
    let copied: usize = snapshot.panes.iter().map(|(_, w)| w.len()).sum();
    assert!(copied < 120 / 2, "{copied} panes copied");
    let mut elsewhere = buffer(&MemorySpillSpace::shared());
    assert!(elsewhere
        .restore(snapshot.clone(), Some(named.clone()))
        .is_err());
    let mut restored = buffer(&store);
    restored.restore(snapshot, Some(named)).unwrap();
    let out = emit_everything(&mut restored);
    let values: usize = emitted(out, &Coder::IntervalWindow)
        .iter()
        .map(|e| key_and_sorted_values(e).1.len())
        .sum();
    assert_eq!(values, 120);
}

/// Runs written after a checkpoint, into a window it names, are gone
/// after a restore: the restored buffer writes those run numbers again,
/// and a shorter run must not be followed by the old one's later blocks.
#[test]
fn runs_after_the_checkpoint_do_not_join_a_restored_window() {
    let store = MemorySpillSpace::shared();
    let window = Window::Interval {
        start: 0,
        end: WINDOW,
    };
    let key = |i: u16| {
        let mut k = vec![b'k'; 100];
        k[..2].copy_from_slice(&i.to_be_bytes());
        k
    };
    // Runs of some 64 KiB: a few blocks each.
    let large = || {
        let mut strategy = WindowingStrategy::global_default();
        strategy.window_fn = WindowFn::Fixed {
            size: WINDOW,
            offset: 0,
        };
        let mut g = GroupingBuffer::new(strategy, kv_coder(), Coder::IntervalWindow);
        assert!(g.enable_durable_spill(store.clone(), b"g/".to_vec(), 64 << 10));
        g
    };
    let add = |g: &mut GroupingBuffer, keys: std::ops::Range<u16>, value: u8| {
        for i in keys {
            g.add(&element(&key(i), value, 0, window.clone()), 0, 0)
                .unwrap();
        }
    };
    // Up to the first spill, which leaves nothing in memory: the next
    // run holds only what comes after the checkpoint.
    let mut g = large();
    let mut first = 0;
    while !g.has_spilled() {
        add(&mut g, first..first + 1, 1);
        first += 1;
    }
    let (snapshot, named) = g.checkpoint(true).unwrap();
    assert!(named.as_ref().is_some_and(SpilledWindows::names_windows));
    // After the checkpoint: another long run into the window (keys of
    // many values, so that a run's data is more than a block).
    let before = store.len();
    for _ in 0..1_000 {
        add(&mut g, 1_000..1_060, 2);
    }
    assert!(store.len() >= before + 2, "a run of several blocks");
    drop(g);
    let mut restored = large();
    restored.restore(snapshot, named).unwrap();
    // The same run number again, as the drain's last run: one block.
    add(&mut restored, 2_000..2_005, 3);
    let out = emit_everything(&mut restored);
    let mut values: Vec<u8> = emitted(out, &Coder::IntervalWindow)
        .iter()
        .flat_map(|e| key_and_sorted_values(e).1)
        .collect();
    values.sort_unstable();
    let stale = values.iter().filter(|&&v| v == 2).count();
    assert_eq!(stale, 0, "values from runs after the checkpoint");
    let want: Vec<u8> = std::iter::repeat_n(1, usize::from(first))
        .chain(std::iter::repeat_n(3, 5))
        .collect();
    assert!(values == want, "{} values", values.len());
}

/// A buffer on a durable spill space does not hand keys out: a token's reads go
/// to the job's spill space, and a checkpoint could not name the key.
#[test]
fn a_durable_spill_hands_no_key_out() {
    assert!(!buffer(&MemorySpillSpace::shared()).hand_out_large_keys());
    let mut scratch = GroupingBuffer::new(
        WindowingStrategy::global_default(),
        kv_coder(),
        Coder::GlobalWindow,
    );
    assert!(scratch.enable_spill(MemorySpillSpace::shared(), b"s/".to_vec(), LIMIT));
    assert!(scratch.hand_out_large_keys());
}
