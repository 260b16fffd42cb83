//! A spilling sessions buffer against one that keeps everything in memory.

use proptest::prelude::*;

use crate::coder::{Coder, DecodedElement, PaneTiming};
use crate::grouping::tests::{element, emitted, kv_coder};
use crate::grouping::{Fired, GroupingBuffer};
use crate::plan::{OutputTime, WindowFn, WindowingStrategy};
use crate::spill::MemorySpillStore;
use crate::time::{Timestamp, MAX_TIMESTAMP};
use crate::window::Window;

const GAP: i64 = 10;

fn strategy(output_time: OutputTime) -> WindowingStrategy {
    WindowingStrategy {
        window_fn: WindowFn::Sessions { gap: GAP },
        output_time,
        ..WindowingStrategy::global_default()
    }
}

fn buffer(output_time: OutputTime) -> GroupingBuffer {
    GroupingBuffer::new(strategy(output_time), kv_coder(), Coder::IntervalWindow)
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
/// never emits behind the output watermark it published and never holds
/// more than its limit in memory.
struct Driver {
    g: GroupingBuffer,
    store: std::sync::Arc<MemorySpillStore>,
    limit: usize,
    watermark: Timestamp,
    log: Vec<Event>,
    said: Vec<Said>,
}

impl Driver {
    fn new(limit: usize, output_time: OutputTime) -> Self {
        let store = MemorySpillStore::shared();
        let mut g = buffer(output_time);
        assert!(g.enable_spill(store.clone(), b"s/".to_vec(), limit));
        Driver {
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
            self.g.buffered_bytes() <= self.limit,
            "spilled past its limit"
        );
        self.log.push(Event::Add(e, self.watermark));
    }

    /// One step's worth of emitting, `f` being evaluate or drain.
    fn emit(&mut self, f: impl FnOnce(&mut GroupingBuffer, &mut Fired)) {
        let published = self.g.output_watermark;
        let mut out = Fired::default();
        f(&mut self.g, &mut out);
        for s in said(out) {
            assert!(s.3 >= published, "{s:?} came out behind {published}");
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
    fn replayed(&self, output_time: OutputTime) -> Vec<Said> {
        let mut plain = buffer(output_time);
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
    ) {
        let output_time = if earliest { OutputTime::EarliestInPane } else { OutputTime::EndOfWindow };
        let mut d = Driver::new(limit, output_time);
        for op in ops {
            match op {
                Op::Add { key, ahead, value } => {
                    let ts = d.watermark - 3 + ahead;
                    d.add(session_element(key, value, ts));
                }
                Op::Advance(by) => d.advance(by),
                Op::Drain(bytes) => d.drain(bytes),
            }
        }
        d.finish();
        // An element's output time can differ where the two published
        // different output watermarks (one behind the other's is stamped
        // at its own time, not its window's end: both on time); both
        // never emit behind what they published (checked as it goes).
        let times = |s: Vec<Said>| -> Vec<Said> {
            if earliest {
                s.into_iter().map(|p| (p.0, p.1, p.2, 0, p.4, p.5, p.6)).collect()
            } else {
                s
            }
        };
        prop_assert_eq!(times(d.sorted()), times(d.replayed(output_time)));
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
    assert_eq!(got, d.replayed(OutputTime::EndOfWindow));
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
    let snapshot = d.g.snapshot().unwrap();
    let mut restored = buffer(OutputTime::EndOfWindow);
    restored.restore(snapshot).unwrap();
    let mut out = Fired::default();
    restored
        .evaluate(MAX_TIMESTAMP, 0, &mut out, usize::MAX)
        .unwrap();
    assert!(restored.is_empty());
    let mut all = d.said.clone();
    all.extend(said(out));
    all.sort();
    assert_eq!(all, d.replayed_to_the_end());
}

impl Driver {
    /// [`Driver::replayed`] with the end of the input evaluated too.
    fn replayed_to_the_end(&mut self) -> Vec<Said> {
        self.log.push(Event::Evaluate(MAX_TIMESTAMP));
        self.replayed(OutputTime::EndOfWindow)
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
