//! Runs merged back from the store: a spilling buffer against one kept in
//! memory, over keys chosen to share long prefixes (so sorting cannot stop
//! at a key's first bytes), many small runs, four fixed windows, drains taken a
//! little at a time, and checkpoints taken mid-way.

use proptest::prelude::*;

use super::super::tests::{element, emitted, key_and_sorted_values, kv_coder};
use super::super::{Fired, GroupingBuffer};
use crate::coder::Coder;
use crate::plan::{WindowFn, WindowingStrategy};
use crate::spill::MemorySpillSpace;
use crate::time::MAX_TIMESTAMP;
use crate::window::Window;

/// What was emitted: (window, key, values sorted), sorted.
fn emitted_panes(out: Fired) -> Vec<(Window, Vec<u8>, Vec<u8>)> {
    let mut all: Vec<_> = emitted(out, &Coder::IntervalWindow)
        .into_iter()
        .map(|e| {
            let (key, values) = key_and_sorted_values(&e);
            (e.header.windows[0].clone(), key, values)
        })
        .collect();
    all.sort();
    all
}

fn strategy() -> WindowingStrategy {
    let mut strategy = WindowingStrategy::global_default();
    strategy.window_fn = WindowFn::Fixed {
        size: 10,
        offset: 0,
    };
    strategy
}

fn spilling(limit: usize) -> GroupingBuffer {
    let mut g = GroupingBuffer::new(strategy(), kv_coder(), Coder::IntervalWindow);
    assert!(g.enable_spill(MemorySpillSpace::shared(), b"s/".to_vec(), limit));
    g
}

/// The same buffer, checkpointed and restored into a fresh one (and
/// evaluated once before the watermark moves, as the engine does: until
/// then a restored buffer holds at what it last published).
fn restored(g: &GroupingBuffer, limit: usize) -> GroupingBuffer {
    let snapshot = g.snapshot().unwrap();
    let mut r = spilling(limit);
    r.restore(snapshot, None).unwrap();
    let mut nothing = Fired::default();
    assert_eq!(r.evaluate(0, 0, &mut nothing, usize::MAX).unwrap(), 0);
    r
}

/// An element: a key from a two-letter alphabet, half of them after ten
/// shared bytes (so that their first eight bytes tie), a value, which of
/// four windows.
fn an_element() -> impl Strategy<Value = (Vec<u8>, u8, i64)> {
    let letters = proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b')], 0..5);
    let key = (any::<bool>(), letters).prop_map(|(shared, letters)| {
        let mut key = if shared {
            b"abababab".to_vec()
        } else {
            Vec::new()
        };
        key.extend(letters);
        key
    });
    (key, 0u8..128, 0i64..4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn merged_runs_emit_what_memory_does(
        elements in proptest::collection::vec(an_element(), 1..200),
        limit in 40usize..600,
        checkpoint_at in proptest::option::of(0usize..200),
        step in 1usize..200,
        checkpoint_while_draining in any::<bool>(),
    ) {
        let mut g = spilling(limit);
        let mut plain = GroupingBuffer::new(strategy(), kv_coder(), Coder::IntervalWindow);
        for (i, (key, value, window)) in elements.iter().enumerate() {
            let start = window * 10;
            let window = Window::Interval { start, end: start + 10 };
            let e = element(key, *value, start + 1, window);
            g.add(&e, 0, 0).unwrap();
            plain.add(&e, 0, 0).unwrap();
            if checkpoint_at == Some(i) {
                g = restored(&g, limit);
            }
        }
        prop_assert_eq!(g.hold(), plain.hold());
        let mut out = Fired::default();
        g.evaluate(MAX_TIMESTAMP, 0, &mut out, usize::MAX).unwrap();
        let mut checkpointed = !checkpoint_while_draining;
        while g.is_draining() {
            prop_assert!(g.hold().is_some(), "held until the last key is out");
            let max = out.bytes.len() + step;
            g.drain_spilled(MAX_TIMESTAMP, 0, &mut out, max).unwrap();
            if !checkpointed {
                checkpointed = true;
                let mut r = restored(&g, limit);
                r.evaluate(MAX_TIMESTAMP, 0, &mut out, usize::MAX).unwrap();
                g = r;
            }
        }
        prop_assert!(g.is_empty() && g.hold().is_none());
        let mut want = Fired::default();
        plain.evaluate(MAX_TIMESTAMP, 0, &mut want, usize::MAX).unwrap();
        prop_assert_eq!(emitted_panes(out), emitted_panes(want));
    }
}
