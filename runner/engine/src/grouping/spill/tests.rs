//! A spilling buffer filed by window against one that keeps everything
//! in memory, and which strategies spill.

use super::super::tests::{element, emitted, key_and_sorted_values, kv_coder as kv};
use super::super::{Fired, GroupingBuffer};
use crate::coder::Coder;
use crate::plan::{Trigger, WindowFn, WindowingStrategy};
use crate::spill::MemorySpillSpace;
use crate::time::MAX_TIMESTAMP;
use crate::window::Window;

/// (key, its values sorted) of every pane in `out`, sorted; each pane
/// must be its window's only one (first and last).
fn panes(out: Fired, window_coder: &Coder) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut p: Vec<(Vec<u8>, Vec<u8>)> = emitted(out, window_coder)
        .into_iter()
        .map(|e| {
            assert!(e.header.pane.is_first && e.header.pane.is_last);
            key_and_sorted_values(&e)
        })
        .collect();
    p.sort();
    p
}

#[test]
fn a_spilled_buffer_emits_what_an_unspilled_one_does() {
    let store = MemorySpillSpace::shared();
    let mut spilling = GroupingBuffer::new(
        WindowingStrategy::global_default(),
        kv(),
        Coder::GlobalWindow,
    );
    assert!(spilling.enable_spill(store.clone(), b"s/".to_vec(), 600));
    let mut plain = GroupingBuffer::new(
        WindowingStrategy::global_default(),
        kv(),
        Coder::GlobalWindow,
    );
    // (Values stay below 128: one-byte varints.)
    for i in 0..120u8 {
        let key = [b'k', i % 37];
        for g in [&mut spilling, &mut plain] {
            g.add(&element(&key, i, 0, Window::Global), 0, 0).unwrap();
        }
    }
    assert!(spilling.has_spilled());
    assert!(store.len() > 37, "several runs were written");
    assert_eq!(spilling.hold(), plain.hold());
    let (mut a, mut b) = (Fired::default(), Fired::default());
    // Emitted a little at a time, as a busy consumer would take it.
    let mut fired = spilling
        .evaluate(MAX_TIMESTAMP, 0, &mut a, usize::MAX)
        .unwrap();
    while spilling.is_draining() {
        assert!(spilling.hold().is_some(), "held until the last key is out");
        let step = a.bytes.len() + 20;
        fired += spilling
            .drain_spilled(MAX_TIMESTAMP, 0, &mut a, step)
            .unwrap();
    }
    assert_eq!(fired, 37);
    plain
        .evaluate(MAX_TIMESTAMP, 0, &mut b, usize::MAX)
        .unwrap();
    assert_eq!(
        panes(a, &Coder::GlobalWindow),
        panes(b, &Coder::GlobalWindow)
    );
    assert!(spilling.is_empty() && spilling.hold().is_none());
    assert!(store.is_empty(), "a drained window's bytes are deleted");
}

#[test]
fn a_checkpoint_of_a_spilled_buffer_holds_everything() {
    let store = MemorySpillSpace::shared();
    let mut g = GroupingBuffer::new(
        WindowingStrategy::global_default(),
        kv(),
        Coder::GlobalWindow,
    );
    g.enable_spill(store.clone(), b"s/".to_vec(), 300);
    for i in 0..100u8 {
        g.add(&element(&[i % 10], i, 0, Window::Global), 0, 0)
            .unwrap();
    }
    // Half drained when the checkpoint is taken.
    let mut first = Fired::default();
    g.evaluate(MAX_TIMESTAMP, 0, &mut first, usize::MAX)
        .unwrap();
    g.drain_spilled(MAX_TIMESTAMP, 0, &mut first, 1).unwrap();
    let snapshot = g.snapshot().unwrap();
    let mut restored = GroupingBuffer::new(
        WindowingStrategy::global_default(),
        kv(),
        Coder::GlobalWindow,
    );
    restored.enable_spill(MemorySpillSpace::shared(), b"r/".to_vec(), 300);
    restored.restore(snapshot, None).unwrap();
    let mut rest = Fired::default();
    restored
        .evaluate(MAX_TIMESTAMP, 0, &mut rest, usize::MAX)
        .unwrap();
    while restored.is_draining() {
        restored
            .drain_spilled(MAX_TIMESTAMP, 0, &mut rest, usize::MAX)
            .unwrap();
    }
    let mut all = panes(first, &Coder::GlobalWindow);
    all.extend(panes(rest, &Coder::GlobalWindow));
    all.sort();
    let want: Vec<(Vec<u8>, Vec<u8>)> = (0..10u8)
        .map(|k| (vec![k], (0..100u8).filter(|v| v % 10 == k).collect()))
        .collect();
    assert_eq!(all, want);
}

#[test]
fn fixed_windows_spill_and_drain_as_the_watermark_passes_each() {
    let mut strategy = WindowingStrategy::global_default();
    strategy.window_fn = WindowFn::Fixed {
        size: 10,
        offset: 0,
    };
    let store = MemorySpillSpace::shared();
    let mut g = GroupingBuffer::new(strategy, kv(), Coder::IntervalWindow);
    g.enable_spill(store.clone(), b"s/".to_vec(), 200);
    let w = |s| Window::Interval {
        start: s,
        end: s + 10,
    };
    for i in 0..60u8 {
        g.add(&element(&[i % 3], i, 0, w(i64::from(i % 2) * 10)), 0, 0)
            .unwrap();
    }
    assert!(g.has_spilled());
    assert_eq!(g.hold(), Some(9));
    let mut out = Fired::default();
    g.evaluate(10, 0, &mut out, usize::MAX).unwrap();
    while g.is_draining() {
        g.drain_spilled(10, 0, &mut out, usize::MAX).unwrap();
    }
    assert_eq!(g.hold(), Some(19), "the second window still holds");
    assert_eq!(panes(out, &Coder::IntervalWindow).len(), 3);
}

#[test]
fn windows_the_sdk_merges_do_not_spill() {
    let mut strategy = WindowingStrategy::global_default();
    strategy.window_fn = WindowFn::Custom { merging: true };
    let mut g = GroupingBuffer::new(strategy, kv(), Coder::IntervalWindow);
    assert!(!g.enable_spill(MemorySpillSpace::shared(), Vec::new(), 0));
    let mut sessions = WindowingStrategy::global_default();
    sessions.window_fn = WindowFn::Sessions { gap: 10 };
    let mut g = GroupingBuffer::new(sessions, kv(), Coder::IntervalWindow);
    assert!(g.enable_spill(MemorySpillSpace::shared(), Vec::new(), 0));
}

#[test]
fn triggers_that_fire_before_the_end_of_the_window_do_not_spill() {
    let spills = |trigger: Trigger, window_fn: WindowFn, allowed_lateness: i64| {
        let mut strategy = WindowingStrategy::global_default();
        strategy.trigger = trigger;
        strategy.window_fn = window_fn;
        strategy.allowed_lateness = allowed_lateness;
        let mut g = GroupingBuffer::new(strategy, kv(), Coder::IntervalWindow);
        g.enable_spill(MemorySpillSpace::shared(), Vec::new(), 0)
    };
    let fixed = || WindowFn::Fixed {
        size: 10,
        offset: 0,
    };
    let sessions = || WindowFn::Sessions { gap: 10 };
    let at_end = |late: Option<Trigger>| Trigger::AfterEndOfWindow {
        early: None,
        late: late.map(Box::new),
    };
    assert!(!spills(Trigger::ElementCount(2), fixed(), 0));
    assert!(!spills(
        Trigger::AfterEndOfWindow {
            early: Some(Box::new(Trigger::ElementCount(2))),
            late: None,
        },
        fixed(),
        0
    ));
    assert!(spills(Trigger::Default, fixed(), 5));
    assert!(spills(at_end(Some(Trigger::ElementCount(2))), fixed(), 5));
    assert!(spills(Trigger::Repeat(Box::new(at_end(None))), fixed(), 5));
    assert!(spills(at_end(Some(Trigger::Always)), sessions(), 0));
    assert!(spills(Trigger::Default, sessions(), 5));
}
