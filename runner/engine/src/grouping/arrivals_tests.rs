//! Arrivals against the key table: a buffer that keeps arrivals and one
//! that files every element under its key at once (the oracle) are given
//! the same random elements, watermarks, evaluations, checkpoints with a
//! restore, and spill limits, and must emit the same panes (keys in any
//! order, each key's values in the same order), hold the same output
//! watermark, and end empty together. An evaluation cut short by its byte
//! limit is finished before the next element comes (as the engine goes
//! on evaluating while keys are owed a look): which keys a cut-short one
//! emits first differs by design, and an element arriving in between
//! would join a pane in one buffer and start a late one in the other.

use proptest::prelude::*;

use super::tests::{element, emitted, kv_coder};
use super::{Fired, GroupingBuffer};
use crate::coder::{Coder, DecodedElement};
use crate::plan::{WindowFn, WindowingStrategy};
use crate::spill::MemorySpillSpace;
use crate::time::{Timestamp, MAX_TIMESTAMP};
use crate::window::Window;

/// What the test does next.
#[derive(Debug, Clone)]
enum Step {
    /// An element of key `key` (of `keys`), value `value`, at `ts`.
    Add { key: u8, value: u8, ts: Timestamp },
    /// The input watermark moves forward by this much.
    Advance(Timestamp),
    /// An evaluation emitting at most this many bytes (`None`: any).
    Evaluate(Option<usize>),
    /// A checkpoint, restored into a new buffer.
    Checkpoint,
    /// The input watermark reaches the end of time (the input ended).
    End,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (any::<u8>(), 0u8..128, 0i64..12).prop_map(|(key, value, ts)| Step::Add { key, value, ts }),
        1 => (0i64..15).prop_map(Step::Advance),
        2 => prop::option::of(1usize..60).prop_map(Step::Evaluate),
        1 => Just(Step::Checkpoint),
        1 => Just(Step::End),
    ]
}

/// A strategy with the default trigger: the global window, or fixed
/// windows of 10 ms with some allowed lateness.
fn strategy(fixed: bool, lateness: i64) -> WindowingStrategy {
    let mut s = WindowingStrategy::global_default();
    if fixed {
        s.window_fn = WindowFn::Fixed {
            size: 10,
            offset: 0,
        };
        s.allowed_lateness = lateness;
    }
    s
}

fn window_coder(fixed: bool) -> Coder {
    if fixed {
        Coder::IntervalWindow
    } else {
        Coder::GlobalWindow
    }
}

fn window_of(fixed: bool, ts: Timestamp) -> Window {
    if fixed {
        let start = ts - ts.rem_euclid(10);
        Window::Interval {
            start,
            end: start + 10,
        }
    } else {
        Window::Global
    }
}

/// The buffer under test and its oracle, and what each emitted.
struct Pair {
    strategy: WindowingStrategy,
    fixed: bool,
    batch: bool,
    spill_limit: Option<usize>,
    buffers: [GroupingBuffer; 2],
    emitted: [Vec<DecodedElement>; 2],
}

impl Pair {
    fn new(fixed: bool, lateness: i64, batch: bool, spill_limit: Option<usize>) -> Self {
        let strategy = strategy(fixed, lateness);
        let make = |arrivals: bool| {
            let g = buffer(&strategy, fixed, batch, spill_limit);
            if arrivals {
                g
            } else {
                g.without_arrivals()
            }
        };
        Pair {
            strategy: strategy.clone(),
            fixed,
            batch,
            spill_limit,
            buffers: [make(true), make(false)],
            emitted: [Vec::new(), Vec::new()],
        }
    }

    fn evaluate(&mut self, wm: Timestamp, max_bytes: usize) {
        for (g, emitted_so_far) in self.buffers.iter_mut().zip(self.emitted.iter_mut()) {
            let mut out = Fired::default();
            g.evaluate(wm, 0, &mut out, max_bytes).unwrap();
            let mut drained = Fired::default();
            g.drain_spilled(wm, 0, &mut drained, max_bytes).unwrap();
            let coder = window_coder(self.fixed);
            emitted_so_far.extend(emitted(out, &coder));
            emitted_so_far.extend(emitted(drained, &coder));
        }
    }

    /// Both emitted the same panes, in some order.
    fn emitted_alike(&self) -> bool {
        let sorted = |v: &Vec<DecodedElement>| {
            let mut v: Vec<_> = v
                .iter()
                .map(|e| format!("{:?} {:?}", e.header, e.value()))
                .collect();
            v.sort();
            v
        };
        sorted(&self.emitted[0]) == sorted(&self.emitted[1])
    }

    /// Each buffer checkpointed and restored into a new one (the oracle
    /// without arrivals again).
    fn restore(&mut self) {
        for (i, g) in self.buffers.iter_mut().enumerate() {
            let snapshot = g.snapshot().unwrap();
            let mut fresh = buffer(&self.strategy, self.fixed, self.batch, self.spill_limit);
            if i == 1 {
                fresh = fresh.without_arrivals();
            }
            fresh.restore(snapshot, None).unwrap();
            *g = fresh;
        }
    }
}

/// A buffer with `strategy`, batch or streaming, spilling past
/// `spill_limit` bytes if given.
fn buffer(
    strategy: &WindowingStrategy,
    fixed: bool,
    batch: bool,
    spill_limit: Option<usize>,
) -> GroupingBuffer {
    let mut g = GroupingBuffer::new(strategy.clone(), kv_coder(), window_coder(fixed));
    if batch {
        g = g.keeping_late_data();
    }
    if let Some(limit) = spill_limit {
        g.enable_spill(MemorySpillSpace::shared(), b"s/".to_vec(), limit);
    }
    g
}

fn run(
    fixed: bool,
    lateness: i64,
    batch: bool,
    spill_limit: Option<usize>,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    let mut pair = Pair::new(fixed, lateness, batch, spill_limit);
    let mut wm = crate::time::MIN_TIMESTAMP;
    let mut partial = false;
    for step in steps {
        match step {
            Step::Add { key, value, ts } => {
                if partial {
                    for _ in 0..1000 {
                        if !pair.buffers.iter().any(GroupingBuffer::has_unevaluated) {
                            break;
                        }
                        pair.evaluate(wm, usize::MAX);
                    }
                    partial = false;
                }
                // Few keys or many, as the key byte falls.
                let key = if key < 128 {
                    vec![key % 4]
                } else {
                    vec![key, 1]
                };
                let e = element(&key, value, ts, window_of(fixed, ts));
                for g in pair.buffers.iter_mut() {
                    g.add(&e, wm, 0).unwrap();
                }
            }
            Step::Advance(by) => {
                wm = if wm == crate::time::MIN_TIMESTAMP {
                    by
                } else {
                    wm + by
                };
            }
            Step::Evaluate(max_bytes) => {
                partial |= max_bytes.is_some();
                pair.evaluate(wm, max_bytes.unwrap_or(usize::MAX));
            }
            Step::Checkpoint => pair.restore(),
            Step::End => wm = MAX_TIMESTAMP,
        }
        // Step by step while no evaluation was cut short.
        if !partial {
            prop_assert!(
                pair.emitted_alike(),
                "{:?}\nvs\n{:?}",
                pair.emitted[0],
                pair.emitted[1]
            );
            prop_assert_eq!(pair.buffers[0].hold(), pair.buffers[1].hold());
        }
    }
    for _ in 0..1000 {
        if pair.buffers.iter().all(GroupingBuffer::is_empty) {
            break;
        }
        pair.evaluate(MAX_TIMESTAMP, 100);
    }
    prop_assert!(pair.buffers.iter().all(GroupingBuffer::is_empty));
    prop_assert!(
        pair.emitted_alike(),
        "{:?}\nvs\n{:?}",
        pair.emitted[0],
        pair.emitted[1]
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn arrivals_emit_what_the_key_table_does(
        fixed in any::<bool>(),
        lateness in prop_oneof![Just(0i64), Just(5), Just(50)],
        batch in any::<bool>(),
        spill_limit in prop::option::weighted(0.25, 200usize..20_000),
        steps in prop::collection::vec(step(), 0..150),
    ) {
        run(fixed, lateness, batch, spill_limit, steps)?;
    }
}

/// A big firing over distinct keys emitted a few bytes at a time, a
/// checkpoint taken and restored half way through it.
#[test]
fn a_firing_cut_short_and_checkpointed_emits_every_key_once() {
    let mut steps: Vec<Step> = (0..3000u32)
        .map(|i| Step::Add {
            key: 128 + (i % 120) as u8,
            value: (i % 128) as u8,
            ts: 1,
        })
        .collect();
    steps.extend([
        Step::End,
        Step::Evaluate(Some(200)),
        Step::Evaluate(Some(200)),
        Step::Checkpoint,
    ]);
    run(false, 0, true, None, steps).unwrap();
}
