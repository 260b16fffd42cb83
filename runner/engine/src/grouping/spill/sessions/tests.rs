//! A spilling sessions buffer against one that keeps everything in memory.

use proptest::prelude::*;

use crate::coder::{Coder, DecodedElement, PaneTiming};
use crate::grouping::tests::{element, emitted, kv_coder};
use crate::grouping::{Fired, GroupingBuffer};
use crate::plan::{AccumulationMode, OutputTime, WindowFn, WindowingStrategy};
use crate::spill::MemorySpillSpace;
use crate::time::{Timestamp, MAX_TIMESTAMP};
use crate::window::Window;

const GAP: i64 = 10;

fn strategy(output_time: OutputTime, allowed_lateness: i64) -> WindowingStrategy {
    WindowingStrategy {
        window_fn: WindowFn::Sessions { gap: GAP },
        output_time,
        allowed_lateness,
        ..WindowingStrategy::global_default()
    }
}

fn buffer(strategy: &WindowingStrategy) -> GroupingBuffer {
    GroupingBuffer::new(strategy.clone(), kv_coder(), Coder::IntervalWindow)
}

/// A `KV<[key], value>` element at `ts`, in its own session window.
fn session_element(key: u8, value: u8, ts: Timestamp) -> DecodedElement {
    element(
        &[key],
        value,
        ts,
        Window::Interval {
            start: ts,
            end: ts + GAP,
        },
    )
}

/// What a pane says, comparable across buffers: key, window, values
/// (sorted), timestamp, first/last, timing.
type Said = (u8, Window, Vec<u8>, Timestamp, bool, bool, u8);

fn said(out: Fired) -> Vec<Said> {
    emitted(out, &Coder::IntervalWindow)
        .into_iter()
        .map(|e| {
            let v = e.value();
            let mut values = v[6..].to_vec();
            values.sort_unstable();
            let pane = e.header.pane;
            (
                v[1],
                e.header.windows[0].clone(),
                values,
                e.header.timestamp,
                pane.is_first,
                pane.is_last,
                pane.timing as u8,
            )
        })
        .collect()
}

/// What the spilling buffer did, for the in-memory one to replay: the
/// same data at the same watermarks, and an evaluation where the spilling
/// one evaluated outside a pass (so the in-memory one's evaluation lags
/// while a pass runs, as when backpressure postpones it).
enum Event {
    Add(DecodedElement, Timestamp),
    Evaluate(Timestamp),
}

/// A spilling buffer driven step by step, checking as it goes that it
/// never emits behind the output watermark it published (unless late data
/// may arrive) and never holds more than its limit in memory (past the
/// keys it keeps whole).
struct Driver {
    strategy: WindowingStrategy,
    g: GroupingBuffer,
    store: std::sync::Arc<MemorySpillSpace>,
    limit: usize,
    watermark: Timestamp,
    log: Vec<Event>,
    said: Vec<Said>,
}

impl Driver {
    fn new(limit: usize, output_time: OutputTime) -> Self {
        Driver::allowing_lateness(limit, output_time, 0)
    }

    fn allowing_lateness(limit: usize, output_time: OutputTime, lateness: i64) -> Self {
        let store = MemorySpillSpace::shared();
        let strategy = strategy(output_time, lateness);
        let mut g = buffer(&strategy);
        assert!(g.enable_spill(store.clone(), b"s/".to_vec(), limit));
        Driver {
            strategy,
            g,
            store,
            limit,
            watermark: 0,
            log: Vec::new(),
            said: Vec::new(),
        }
    }

    fn add(&mut self, e: DecodedElement) {
        self.g.add(&e, self.watermark, 0).unwrap();
        assert!(
            self.g.buffered_bytes() <= self.limit + self.g.spill_pinned(),
            "spilled past its limit"
        );
        self.log.push(Event::Add(e, self.watermark));
    }

    /// Panes accumulate instead of discarding (before any data).
    fn accumulate(&mut self) {
        self.strategy.accumulation = AccumulationMode::Accumulating;
        let mut g = buffer(&self.strategy);
        assert!(g.enable_spill(self.store.clone(), b"a/".to_vec(), self.limit));
        self.g = g;
    }

    /// One step's worth of emitting, `f` being evaluate or drain.
    fn emit(&mut self, f: impl FnOnce(&mut GroupingBuffer, &mut Fired)) {
        let published = self.g.output_watermark();
        let mut out = Fired::default();
        f(&mut self.g, &mut out);
        // Late data stays late: its pane is stamped at the end of its
        // window, wherever the watermark is, and a session it joins may be
        // stamped there too (in memory as well).
        let allows_late_data = self.strategy.allowed_lateness > 0;
        for s in said(out) {
            assert!(
                allows_late_data || s.3 >= published,
                "{s:?} came out behind {published}"
            );
            self.said.push(s);
        }
    }

    fn evaluate(&mut self) {
        let draining = self.g.is_draining();
        let wm = self.watermark;
        self.emit(|g, out| {
            g.evaluate(wm, 0, out, usize::MAX).unwrap();
        });
        if !draining {
            self.log.push(Event::Evaluate(wm));
        }
    }

    /// Emits at most about `bytes` of the pass under way, then (once the
    /// pass is done) evaluates, as the engine does.
    fn drain(&mut self, bytes: usize) {
        if !self.g.is_draining() {
            return;
        }
        let wm = self.watermark;
        self.emit(|g, out| {
            g.drain_spilled(wm, 0, out, bytes).unwrap();
        });
        if !self.g.is_draining() {
            assert!(self.g.has_unevaluated(), "the engine comes back to it");
            self.evaluate();
        }
    }

    fn advance(&mut self, by: i64) {
        self.watermark += by;
        self.evaluate();
    }

    /// The end of the input: everything comes out.
    fn finish(&mut self) {
        self.watermark = MAX_TIMESTAMP;
        self.evaluate();
        while self.g.is_draining() {
            self.drain(usize::MAX);
        }
        assert!(self.g.is_empty(), "everything came out");
        assert!(self.g.hold().is_none());
        assert!(self.store.is_empty(), "spilled bytes are deleted");
    }

    /// What an in-memory buffer says when it sees what this one saw.
    fn replayed(&self) -> Vec<Said> {
        let mut plain = buffer(&self.strategy);
        let mut out = Fired::default();
        for event in &self.log {
            match event {
                Event::Add(e, at) => plain.add(e, *at, 0).unwrap(),
                Event::Evaluate(wm) => {
                    plain.evaluate(*wm, 0, &mut out, usize::MAX).unwrap();
                }
            }
        }
        assert!(plain.is_empty());
        let mut s = said(out);
        s.sort();
        s
    }

    fn sorted(&self) -> Vec<Said> {
        let mut s = self.said.clone();
        s.sort();
        s
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// An element of `key` at `ahead - 3` past the watermark (a little
    /// behind it for some: late, or joining a window still open).
    Add {
        key: u8,
        ahead: i64,
        value: u8,
    },
    /// An element `behind` the watermark: late, and dropped if its
    /// window is past the allowed lateness.
    AddLate {
        key: u8,
        behind: i64,
        value: u8,
    },
    Advance(i64),
    /// A drain step of about this many bytes.
    Drain(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4, 0i64..30, 0u8..100).prop_map(|(key, ahead, value)| Op::Add {
            key,
            ahead,
            value
        }),
        2 => (0u8..4, 0i64..40, 0u8..100).prop_map(|(key, behind, value)| Op::AddLate {
            key,
            behind,
            value
        }),
        2 => (0i64..25).prop_map(Op::Advance),
        2 => (1usize..80).prop_map(Op::Drain),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Whatever it spills, and however the pass that reads it back is
    /// interleaved with new data and watermarks, a sessions buffer emits
    /// the panes an in-memory one does.
    #[test]
    fn emits_what_an_in_memory_buffer_does(
        ops in proptest::collection::vec(op(), 1..80),
        limit in 0usize..700,
        earliest in any::<bool>(),
        lateness in prop_oneof![Just(0i64), 1i64..40],
        accumulating in any::<bool>(),
    ) {
        let output_time = if earliest { OutputTime::EarliestInPane } else { OutputTime::EndOfWindow };
        let mut d = Driver::allowing_lateness(limit, output_time, lateness);
        if accumulating {
            d.accumulate();
        }
        for op in ops {
            match op {
                Op::Add { key, ahead, value } => {
                    let ts = d.watermark - 3 + ahead;
                    d.add(session_element(key, value, ts));
                }
                Op::AddLate { key, behind, value } => {
                    d.add(session_element(key, value, d.watermark - behind));
                }
                Op::Advance(by) => d.advance(by),
                Op::Drain(bytes) => d.drain(bytes),
            }
        }
        d.finish();
        // Where the two published different output watermarks (a pass
        // holds its own until it is done), an element's output time can
        // differ (one behind the other's is stamped at its own time, not
        // its window's end: both on time), and so can a window's first
        // pane's timing (LATE once the output watermark passed the window,
        // else ON_TIME); both never emit on-time panes behind what they
        // published (checked as it goes).
        let comparable = |s: Vec<Said>| -> Vec<Said> {
            let mut s: Vec<Said> = s
                .into_iter()
                .map(|p| {
                    let ts = if earliest { 0 } else { p.3 };
                    let timing = if p.4 && p.6 == PaneTiming::Late as u8 {
                        PaneTiming::OnTime as u8
                    } else {
                        p.6
                    };
                    (p.0, p.1, p.2, ts, p.4, p.5, timing)
                })
                .collect();
            s.sort();
            s
        };
        prop_assert_eq!(comparable(d.sorted()), comparable(d.replayed()));
    }
}

/// A batch input: everything arrives, then the watermark jumps to the end
/// of time; the buffer never holds more than its limit, and the sessions
/// come out merged across every run.
#[test]
fn a_batch_of_sessions_larger_than_memory_comes_out_whole() {
    let mut d = Driver::new(300, OutputTime::EndOfWindow);
    // Key k: sessions of 5 elements 3 ms apart, 100 ms between sessions,
    // elements arriving out of order across sessions and keys.
    for round in 0..5i64 {
        for session in 0..4i64 {
            for key in 0..6u8 {
                let ts = session * 100 + round * 3;
                d.add(session_element(key, (session * 5 + round) as u8, ts));
            }
        }
    }
    assert!(d.g.has_spilled());
    assert!(d.store.len() > 6, "several runs were written");
    d.finish();
    let got = d.sorted();
    assert_eq!(got.len(), 6 * 4, "a pane per key and session");
    for (key, window, values, ts, first, last, timing) in &got {
        let session = match window {
            Window::Interval { start, end } => {
                assert_eq!(end - start, 12 + GAP, "key {key}: {window:?}");
                start / 100
            }
            other => panic!("{other:?}"),
        };
        let want: Vec<u8> = (0..5).map(|r| (session * 5 + r) as u8).collect();
        assert_eq!(values, &want);
        assert_eq!(*ts, window.max_timestamp());
        assert!(*first && *last && *timing == PaneTiming::OnTime as u8);
    }
    assert_eq!(got, d.replayed());
}

/// A checkpoint taken halfway through reading the spill back holds what
/// is still to come: restored into a buffer with no spill, it emits the
/// rest.
#[test]
fn a_checkpoint_taken_during_a_pass_holds_the_rest() {
    let mut d = Driver::new(200, OutputTime::EndOfWindow);
    for i in 0..60u8 {
        let key = i % 7;
        let ts = i64::from(i / 7) * 4 + if i % 2 == 0 { 0 } else { 50 };
        d.add(session_element(key, i, ts));
    }
    assert!(d.g.has_spilled());
    d.watermark = MAX_TIMESTAMP;
    d.evaluate();
    d.drain(30);
    assert!(d.g.is_draining(), "the pass is under way");
    let before = d.said.len();
    assert!(before > 0);
    let mut all = d.said.clone();
    all.extend(d.restored_to_the_end());
    all.sort();
    assert_eq!(all, d.replayed_to_the_end());
}

impl Driver {
    /// What a buffer restored from a checkpoint of this one emits at the
    /// end of the input (all of it: it is left empty).
    fn restored_to_the_end(&self) -> Vec<Said> {
        let snapshot = self.g.snapshot().unwrap();
        let mut restored = buffer(&self.strategy);
        restored.restore(snapshot, None).unwrap();
        let mut out = Fired::default();
        restored
            .evaluate(MAX_TIMESTAMP, 0, &mut out, usize::MAX)
            .unwrap();
        assert!(restored.is_empty());
        let mut s = said(out);
        s.sort();
        s
    }

    /// [`Driver::replayed`] with the end of the input evaluated too.
    fn replayed_to_the_end(&mut self) -> Vec<Said> {
        self.log.push(Event::Evaluate(MAX_TIMESTAMP));
        self.replayed()
    }
}

/// Streaming: a session closes while the rest of the spill stays open;
/// the pass emits only it, puts the others back, and the stage's hold
/// moves on past it.
#[test]
fn a_pass_emits_the_closed_sessions_and_keeps_the_open_ones() {
    let mut d = Driver::new(0, OutputTime::EndOfWindow);
    d.add(session_element(1, 1, 0));
    d.add(session_element(2, 2, 100));
    d.add(session_element(1, 3, 5));
    assert!(d.g.has_spilled());
    assert_eq!(d.g.hold(), Some(9), "the first piece of key 1 holds");
    d.advance(20);
    while d.g.is_draining() {
        d.drain(usize::MAX);
    }
    let got = d.sorted();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, Window::Interval { start: 0, end: 15 });
    assert_eq!(got[0].2, vec![1, 3]);
    assert_eq!(d.g.hold(), Some(109), "key 2's session is still held");
    // It joins data that arrives later.
    d.add(session_element(2, 4, 105));
    d.finish();
    let got = d.sorted();
    assert_eq!(
        got[1].1,
        Window::Interval {
            start: 100,
            end: 115
        }
    );
    assert_eq!(got[1].2, vec![2, 4]);
}

/// With allowed lateness: a session that fired stays in memory, with the
/// rest of its key, while other keys spill; late data joins it and fires a
/// late pane (of the late data: panes discard) at once (its key has nothing in the store); a checkpoint
/// taken then holds both kinds.
#[test]
fn a_session_that_fired_stays_in_memory_for_late_data() {
    let mut d = Driver::allowing_lateness(0, OutputTime::EndOfWindow, 50);
    d.add(session_element(1, 1, 0));
    d.add(session_element(2, 2, 100));
    assert!(d.g.has_spilled());
    d.advance(20);
    while d.g.is_draining() {
        d.drain(usize::MAX);
    }
    let on_time = (
        1,
        Window::Interval { start: 0, end: 10 },
        vec![1],
        9,
        true,
        false,
        PaneTiming::OnTime as u8,
    );
    assert_eq!(d.sorted(), vec![on_time.clone()]);
    assert_eq!(d.g.buffered_bytes(), d.g.spill_pinned(), "key 1 stayed");
    // Late data for key 1, and more for key 2, which spills.
    d.add(session_element(1, 3, 5));
    d.add(session_element(2, 4, 104));
    assert!(d.g.has_spilled(), "key 2 is in the store");
    d.evaluate();
    assert!(!d.g.is_draining(), "no pass: key 1 is whole in memory");
    let late = (
        1,
        Window::Interval { start: 0, end: 15 },
        vec![3],
        14,
        false,
        false,
        PaneTiming::Late as u8,
    );
    assert_eq!(d.sorted(), vec![on_time.clone(), late.clone()]);
    // A checkpoint now holds key 1's fired session and key 2's pieces.
    let rest = d.restored_to_the_end();
    d.finish();
    let all = d.sorted();
    assert_eq!(&all[..2], &[on_time, late]);
    assert_eq!(
        rest,
        all[2..].to_vec(),
        "the restored buffer emits the rest"
    );
    assert_eq!(all, d.replayed_to_the_end());
}
