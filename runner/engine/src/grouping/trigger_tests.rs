//! Triggers other than the default, through a grouping buffer.

use super::tests::emitted;
use super::{Fired, GroupingBuffer};
use crate::coder::{Coder, DecodedElement};
use crate::plan::{ClosingBehavior, Trigger, WindowFn, WindowingStrategy};
use crate::time::{Timestamp, MAX_TIMESTAMP};
use crate::window::Window;

/// A `KV<bytes, varint>` element in its 10 ms fixed window.
fn element(key: &[u8], value: u8, ts: Timestamp) -> DecodedElement {
    let start = ts - ts.rem_euclid(10);
    let window = Window::Interval {
        start,
        end: start + 10,
    };
    crate::grouping::tests::element(key, value, ts, window)
}

/// (key, values, is_last) of every pane emitted.
fn panes(out: Fired) -> Vec<(u8, Vec<u8>, bool)> {
    emitted(out, &Coder::IntervalWindow)
        .into_iter()
        .map(|e| (e.value()[1], e.value()[6..].to_vec(), e.header.pane.is_last))
        .collect()
}

fn after_count(per_element: bool) -> Vec<(u8, Vec<u8>, bool)> {
    let strategy = WindowingStrategy {
        window_fn: WindowFn::Fixed {
            size: 10,
            offset: 0,
        },
        trigger: Trigger::ElementCount(3),
        closing_behavior: ClosingBehavior::EmitAlways,
        ..WindowingStrategy::global_default()
    };
    let kv = Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Varint));
    let mut g = GroupingBuffer::new(strategy, kv, Coder::IntervalWindow);
    let mut out = Fired::default();
    for t in [1u8, 2, 3, 4, 5, 10, 11] {
        for (k, v) in [(b'A', t), (b'B', t + 5)] {
            g.add(&element(&[k], v, i64::from(v)), 0, 0).unwrap();
            if per_element {
                g.evaluate(0, 0, &mut out, usize::MAX).unwrap();
            }
        }
    }
    g.evaluate(0, 0, &mut out, usize::MAX).unwrap();
    g.evaluate(MAX_TIMESTAMP, 0, &mut out, usize::MAX).unwrap();
    let mut p = panes(out);
    p.sort();
    p
}

#[test]
fn after_count_fires_per_element_in_streaming() {
    assert_eq!(
        after_count(true),
        vec![
            (b'A', vec![1, 2, 3], true),
            (b'A', vec![4, 5], true),
            (b'A', vec![10, 11], true),
            (b'B', vec![6, 7, 8], true),
            (b'B', vec![9], true),
            (b'B', vec![10, 15, 16], true),
        ]
    );
}

/// `Repeatedly(t)` fires whenever `t` would: repeating a trigger that
/// waits for the watermark still waits for it, so an element before
/// the end of its window owes its key no look, and does not pin the
/// stage's hold to the watermark already published.
#[test]
fn a_repeated_watermark_trigger_waits_for_the_watermark_as_its_part_does() {
    let at_end = Trigger::AfterEndOfWindow {
        early: None,
        late: None,
    };
    for trigger in [
        Trigger::Default,
        Trigger::Repeat(Box::new(Trigger::Default)),
        Trigger::Repeat(Box::new(at_end)),
    ] {
        let strategy = WindowingStrategy {
            window_fn: WindowFn::Fixed {
                size: 10,
                offset: 0,
            },
            trigger: trigger.clone(),
            ..WindowingStrategy::global_default()
        };
        let kv = Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Varint));
        let mut g = GroupingBuffer::new(strategy, kv, Coder::IntervalWindow);
        let mut out = Fired::default();
        g.evaluate(5, 0, &mut out, usize::MAX).unwrap();
        g.add(&element(b"a", 1, 7), 5, 0).unwrap();
        assert!(!g.has_unevaluated(), "{trigger:?}");
        assert_eq!(g.hold(), Some(9), "{trigger:?}");
        g.evaluate(10, 0, &mut out, usize::MAX).unwrap();
        assert_eq!(panes(out), vec![(b'a', vec![1], true)], "{trigger:?}");
    }
}

#[test]
fn after_count_fires_per_batch_when_evaluated_per_batch() {
    assert_eq!(
        after_count(false),
        vec![
            (b'A', vec![1, 2, 3, 4, 5], true),
            (b'A', vec![10, 11], true),
            (b'B', vec![6, 7, 8, 9], true),
            (b'B', vec![10, 15, 16], true),
        ]
    );
}
