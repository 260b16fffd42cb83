//! Spilled buffers whose windows stay open for late data: checked against
//! the same buffer kept in memory, step by step.

use super::super::tests::{element, emitted, key_and_sorted_values, kv_coder};
use super::super::{Fired, GroupingBuffer};
use crate::coder::Coder;
use crate::plan::{AccumulationMode, Trigger, WindowFn, WindowingStrategy};
use crate::spill::MemorySpillSpace;
use crate::time::{Timestamp, MAX_TIMESTAMP};
use crate::window::Window;

/// One emitted pane: key, window, (index, on-time index, timing, first,
/// last), timestamp and its values sorted.
type Emitted = (
    Vec<u8>,
    Window,
    (i64, i64, String, bool, bool),
    i64,
    Vec<u8>,
);

fn describe(out: Fired) -> Vec<Emitted> {
    let mut all: Vec<Emitted> = emitted(out, &Coder::IntervalWindow)
        .into_iter()
        .map(|e| {
            let (key, values) = key_and_sorted_values(&e);
            let p = e.header.pane;
            (
                key,
                e.header.windows[0].clone(),
                (
                    p.index,
                    p.nonspeculative_index,
                    format!("{:?}", p.timing),
                    p.is_first,
                    p.is_last,
                ),
                e.header.timestamp,
                values,
            )
        })
        .collect();
    all.sort();
    all
}

fn window(start: Timestamp) -> Window {
    Window::Interval {
        start,
        end: start + 10,
    }
}

/// A spilling buffer and an in-memory one fed the same elements and
/// watermarks.
struct Pair {
    spilling: GroupingBuffer,
    plain: GroupingBuffer,
    store: std::sync::Arc<MemorySpillSpace>,
    value: u8,
}

impl Pair {
    fn new(strategy: WindowingStrategy) -> Self {
        let store = MemorySpillSpace::shared();
        let mut spilling = GroupingBuffer::new(strategy.clone(), kv_coder(), Coder::IntervalWindow);
        assert!(spilling.enable_spill(store.clone(), b"s/".to_vec(), 300));
        let plain = GroupingBuffer::new(strategy, kv_coder(), Coder::IntervalWindow);
        Pair {
            spilling,
            plain,
            store,
            value: 0,
        }
    }

    /// `n` elements of keys `k0..k<keys>` in the window starting at `start`.
    fn add(&mut self, n: usize, keys: u8, start: Timestamp, watermark: Timestamp) {
        for i in 0..n {
            // (Values stay below 128: one-byte varints.)
            self.value = (self.value + 1) % 128;
            let key = [b'k', (i % usize::from(keys)) as u8];
            let e = element(&key, self.value, start + 3, window(start));
            self.spilling.add(&e, watermark, 0).unwrap();
            self.plain.add(&e, watermark, 0).unwrap();
        }
    }

    /// Evaluates both at `watermark` (draining what the spilling one
    /// emits from the store) and checks that they emitted the same panes;
    /// how many.
    fn evaluate(&mut self, watermark: Timestamp) -> usize {
        let (mut a, mut b) = (Fired::default(), Fired::default());
        self.spilling
            .evaluate(watermark, 0, &mut a, usize::MAX)
            .unwrap();
        while self.spilling.is_draining() {
            self.spilling
                .drain_spilled(watermark, 0, &mut a, usize::MAX)
                .unwrap();
        }
        self.plain
            .evaluate(watermark, 0, &mut b, usize::MAX)
            .unwrap();
        let (a, b) = (describe(a), describe(b));
        assert_eq!(a, b, "at watermark {watermark}");
        assert_eq!(self.spilling.hold(), self.plain.hold());
        a.len()
    }
}

fn fixed_with_lateness(trigger: Trigger, accumulation: AccumulationMode) -> WindowingStrategy {
    let mut strategy = WindowingStrategy::global_default();
    strategy.window_fn = WindowFn::Fixed {
        size: 10,
        offset: 0,
    };
    strategy.allowed_lateness = 20;
    strategy.trigger = trigger;
    strategy.accumulation = accumulation;
    strategy
}

fn late_triggers() -> Vec<Trigger> {
    vec![
        Trigger::Default,
        Trigger::AfterEndOfWindow {
            early: None,
            late: Some(Box::new(Trigger::ElementCount(2))),
        },
        Trigger::Repeat(Box::new(Trigger::AfterEndOfWindow {
            early: None,
            late: None,
        })),
    ]
}

/// A window the watermark passed while it stays open fires its on-time
/// panes from memory, and late data then fires late panes counted (and,
/// accumulating, accumulated) from them, as if nothing had spilled; the
/// fired panes are not spilled while more data spills around them.
#[test]
fn a_window_open_for_late_data_fires_as_if_it_never_spilled() {
    for trigger in late_triggers() {
        for accumulation in [AccumulationMode::Discarding, AccumulationMode::Accumulating] {
            let mut pair = Pair::new(fixed_with_lateness(trigger.clone(), accumulation));
            pair.add(60, 5, 0, 0);
            pair.add(60, 5, 10, 0);
            assert!(pair.spilling.has_spilled());
            // Window [0, 10) is past its end, open until 29.
            assert_eq!(pair.evaluate(10), 5, "on time");
            // Late data for old and new keys, and enough on-time data for
            // the next window to spill again around the fired panes.
            pair.add(6, 7, 0, 10);
            pair.add(80, 5, 10, 10);
            pair.evaluate(10);
            pair.add(3, 2, 0, 10);
            pair.evaluate(15);
            // [10, 20) past its end, [0, 10) still open.
            pair.add(50, 5, 10, 15);
            pair.evaluate(20);
            pair.add(4, 4, 0, 20);
            pair.add(4, 4, 10, 20);
            pair.evaluate(25);
            // Both close.
            pair.evaluate(MAX_TIMESTAMP);
            assert!(pair.spilling.is_empty() && pair.plain.is_empty());
            assert!(pair.store.is_empty(), "{trigger:?} {accumulation:?}");
        }
    }
}

/// At the end of a bounded input the watermark jumps past every window's
/// lateness at once: spilled windows are emitted from the store, closing.
#[test]
fn a_window_whose_lateness_the_watermark_jumps_past_drains_from_the_store() {
    for trigger in late_triggers() {
        let mut pair = Pair::new(fixed_with_lateness(trigger, AccumulationMode::Discarding));
        pair.add(200, 40, 0, 0);
        pair.add(200, 40, 10, 0);
        assert!(pair.spilling.has_spilled());
        pair.spilling.start_drains(MAX_TIMESTAMP).unwrap();
        assert!(pair.spilling.is_draining(), "not read back into memory");
        assert_eq!(pair.evaluate(MAX_TIMESTAMP), 80);
        assert!(pair.store.is_empty());
    }
}

/// A checkpoint taken while a spilled window is open for late data, and
/// restored into a buffer that spills again, goes on as the original.
#[test]
fn a_restored_buffer_with_an_open_window_goes_on_alike() {
    let strategy = fixed_with_lateness(Trigger::Default, AccumulationMode::Accumulating);
    let mut pair = Pair::new(strategy.clone());
    pair.add(60, 5, 0, 0);
    pair.add(60, 5, 10, 0);
    pair.evaluate(10);
    pair.add(6, 7, 0, 10);
    let snapshot = pair.spilling.snapshot().unwrap();
    let mut restored = GroupingBuffer::new(strategy, kv_coder(), Coder::IntervalWindow);
    restored.enable_spill(pair.store.clone(), b"r/".to_vec(), 300);
    restored.restore(snapshot, None).unwrap();
    pair.spilling = restored;
    pair.evaluate(12);
    pair.add(30, 5, 10, 12);
    pair.evaluate(25);
    pair.evaluate(MAX_TIMESTAMP);
    assert!(pair.spilling.is_empty());
}

/// A window can close with panes that fired in memory (it was open for
/// late data) and a late pane that spilled once it had closed: the
/// spilled one is emitted from the store, the fired ones close from
/// memory, and nothing is emitted twice.
#[test]
fn a_window_closing_with_fired_and_spilled_panes_emits_each_once() {
    use crate::plan::ClosingBehavior;
    for (accumulation, closing) in [
        (
            AccumulationMode::Discarding,
            ClosingBehavior::EmitIfNonEmpty,
        ),
        (AccumulationMode::Discarding, ClosingBehavior::EmitAlways),
        (
            AccumulationMode::Accumulating,
            ClosingBehavior::EmitIfNonEmpty,
        ),
    ] {
        let mut strategy = fixed_with_lateness(Trigger::Default, accumulation);
        strategy.closing_behavior = closing;
        let mut pair = Pair::new(strategy);
        pair.add(60, 5, 0, 0);
        assert_eq!(pair.evaluate(10), 5, "on time");
        // Late data for a key that fired (it stays in memory) and for a
        // new key, not evaluated before [0, 10) closes (at 29); more data
        // for a later window then spills the new key's pane.
        pair.add(1, 1, 0, 10);
        let key = [b'z'];
        let e = crate::grouping::tests::element(&key, 1, 3, window(0));
        pair.spilling.add(&e, 10, 0).unwrap();
        pair.plain.add(&e, 10, 0).unwrap();
        pair.add(200, 40, 40, 35);
        assert!(spilled_runs(&pair.spilling) >= 2);
        pair.evaluate(35);
        pair.evaluate(MAX_TIMESTAMP);
        assert!(pair.store.is_empty());
    }
}

fn spilled_runs(g: &GroupingBuffer) -> u32 {
    g.spilled_runs()
}

/// Panes that may not spill (a window open for late data, many keys) are
/// not walked again at every element once they are over the limit: the
/// next spill waits for the limit's worth of new data.
#[test]
fn panes_that_stay_do_not_make_every_element_spill() {
    let mut pair = Pair::new(fixed_with_lateness(
        Trigger::Default,
        AccumulationMode::Accumulating,
    ));
    pair.add(100, 50, 0, 0);
    pair.evaluate(10);
    // [0, 10) is open and over the limit by itself: its panes stay.
    pair.add(20, 1, 10, 10);
    let runs = spilled_runs(&pair.spilling);
    pair.add(20, 1, 10, 10);
    assert!(
        spilled_runs(&pair.spilling) <= runs + 1,
        "20 small elements spilled {} times",
        spilled_runs(&pair.spilling) - runs
    );
    pair.evaluate(MAX_TIMESTAMP);
}
