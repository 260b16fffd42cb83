//! Differential tests of grouping, windowing and triggers: the engine against
//! a small reference evaluator written from the Beam model.
//!
//! # The model being checked
//!
//! A GroupByKey receives `KV<K, V>` elements, each with an event timestamp
//! and the windows the SDK assigned it to. The runner buffers values per
//! (key, window) — merging a key's overlapping session windows — and emits a
//! *pane* `KV<K, Iterable<V>>` in that window whenever the trigger fires.
//! What a pane contains and how it is labelled is fully determined by the
//! order in which elements and watermark advances reach the grouping:
//!
//! * **Late data.** An element is dropped for a window iff the window has
//!   expired when it arrives: `window.max_timestamp + allowed_lateness <
//!   input watermark`. Out-of-order data that is not that late is kept.
//! * **Firing.** The default trigger fires once the watermark passes the end
//!   of the window (`watermark > max_timestamp`) and again for late data;
//!   `Repeatedly(AfterCount(n))` whenever `n` elements arrived since its last
//!   firing; `AfterWatermark(early=AfterCount(1), late=AfterCount(1))` for
//!   new data before the end, at the end, and for new data after it;
//!   `AfterWatermark()` alone fires at the end and *finishes*: its window is
//!   closed and later data for it is dropped.
//! * **Emitting** (`needToEmit`): a firing emits a pane if it has new data, or
//!   if it is the on-time pane and `OnTimeBehavior::FireAlways`, or if it is
//!   the final pane and `ClosingBehavior::EmitAlways`.
//! * **Garbage collection.** Once the watermark passes `max_timestamp +
//!   allowed_lateness` (capped at the end of the global window, so every
//!   window closes at +∞) the window emits one final pane with what is left
//!   (`is_last`) and is forgotten.
//! * **Contents.** Discarding: each accepted element is in exactly one pane.
//!   Accumulating: in every pane from the first one after its arrival.
//! * **Pane info.** `index` counts a window's panes from 0; `is_first` iff
//!   index 0. EARLY iff the watermark had not passed the end of the window;
//!   then at most one ON_TIME pane; LATE after that — and a first non-early
//!   pane is LATE too if the window's end is already behind the stage's
//!   published output watermark (Beam's `PaneInfoTracker`). The
//!   non-speculative index is -1 for EARLY panes and counts non-early panes
//!   otherwise.
//! * **Timestamps.** End of window, or the earliest / latest timestamp among
//!   the pane's *new* elements that held the output watermark (Beam releases
//!   holds at each firing, and elements that were already behind the output
//!   watermark set no hold); the end of the window if there are none.
//!
//! In batch (all data, then the watermark at +∞) with the default trigger
//! this collapses to: one ON_TIME, first pane per (key, window) with all of
//! its values, and a timestamp over all of them.
//!
//! # What is run
//!
//! 1. Whole engine runs ([`pipeline`]) with random elements (few keys,
//!    out-of-order timestamps), window functions (global, fixed, sliding,
//!    sessions), output times, accumulation modes and allowed lateness,
//!    against [`model::batch_reference`].
//! 2. The same input under many bundle shapes (`max_bundle_elements` 1, 2,
//!    7, 100000; one or several source outputs; tiny data chunks; streaming
//!    evaluation; out-of-order bundle completion; one engine or 2 or 3
//!    engine shards, see `refract_engine::shards`) must give identical
//!    results.
//! 3. Streaming, with random interleavings of out-of-order and late
//!    elements and watermark advances, compared pane by pane with
//!    [`model::StreamingReference`] (default trigger, repeated element counts,
//!    early/on-time/late firings; both accumulation modes; both closing and
//!    on-time behaviours), in two ways:
//!    * [`GroupingBuffer`] driven directly (`add`, `evaluate`), where the
//!      stage's published output watermark can be modelled as the manager
//!      computes it (`min(input watermark, hold)`, never moving back);
//!    * whole engine runs fed by a TestStream, with triggers evaluated per
//!      element (streaming) or per upstream bundle, on 1, 2 or 3 shards.
//!
//! Not modelled: merging windows in streaming (sessions are checked in
//! batch only), and empty on-time panes (`FireAlways`) of triggers without
//! an on-time firing (`Repeatedly(AfterCount)`), whose Beam behaviour
//! depends on the output watermark at garbage collection.
//!
//! # Known engine bugs
//!
//! Bugs found by these properties are pinned down by minimal `#[ignore]`d
//! tests (and strict variants of the properties) at the end of this file;
//! run them with `cargo test -p refract-engine --test oracle -- --ignored`.
//! The main properties tolerate exactly those divergences, so that they keep
//! guarding everything else: a first non-early pane may be ON_TIME where
//! Beam says LATE; EarliestInPane / LatestInPane timestamps are only checked
//! against bounds (`[earliest value, end of window]`); `AfterWatermark()`
//! without late firings is left out; allowed lateness stays under a day.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

#[path = "common/mod.rs"]
mod common;
#[path = "oracle/model.rs"]
mod model;
#[path = "oracle/pipeline.rs"]
mod pipeline;
#[path = "oracle/wire.rs"]
mod wire;

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use refract_engine::grouping::{Fired, GroupingBuffer};
use refract_engine::plan::{
    AccumulationMode, ClosingBehavior, FinishedTrigger, OnTimeBehavior, OutputTime, Trigger,
    WindowFn, WindowingStrategy,
};
use refract_engine::time::{Timestamp, MAX_TIMESTAMP, MIN_TIMESTAMP};
use refract_engine::window::Window;

use model::{
    assign_windows, batch_reference, is_droppably_late, Input, Key, Pane, RefTrigger,
    StreamingReference, Timing,
};
use pipeline::{
    finish_on_other_shards, run_batch, run_stream, sixty_inputs_in_fixed_windows,
    small_bundles_out_of_order, Run, Shape, StreamEvent,
};
use wire::{decoded_input, kv_coder, window_coder_for};

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

/// Proptest settings: `cases` cases (or `PROPTEST_CASES`, for a deeper
/// run), and no regression files written into the source tree.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(cases),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Window functions; sessions only if `merging`.
fn window_fn(merging: bool) -> BoxedStrategy<WindowFn> {
    let fixed = (1i64..=30, 0i64..30).prop_map(|(size, offset)| WindowFn::Fixed {
        size,
        offset: offset % size,
    });
    let sliding =
        (1i64..=30, 1i64..=30, 0i64..30).prop_map(|(size, period, offset)| WindowFn::Sliding {
            size,
            period,
            offset: offset % period,
        });
    let sessions = (1i64..=20).prop_map(|gap| WindowFn::Sessions { gap });
    if merging {
        prop_oneof![Just(WindowFn::Global), fixed, sliding, sessions].boxed()
    } else {
        prop_oneof![Just(WindowFn::Global), fixed, sliding].boxed()
    }
}

fn output_time() -> impl Strategy<Value = OutputTime> {
    prop_oneof![
        Just(OutputTime::EndOfWindow),
        Just(OutputTime::EarliestInPane),
        Just(OutputTime::LatestInPane),
    ]
}

fn accumulation() -> impl Strategy<Value = AccumulationMode> {
    prop_oneof![
        Just(AccumulationMode::Discarding),
        Just(AccumulationMode::Accumulating),
    ]
}

/// Allowed lateness: often none, otherwise a few ms (less than a day: see
/// [`global_window_with_a_day_of_lateness_never_closes`]).
fn lateness() -> impl Strategy<Value = i64> {
    prop_oneof![Just(0i64), 1i64..40]
}

/// Up to `max` elements over three keys, timestamps in no particular order.
fn inputs(max: usize) -> impl Strategy<Value = Vec<Input>> {
    proptest::collection::vec((0u8..3, -20i64..100), 0..max).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (k, ts))| Input {
                key: b'a' + k,
                id: i as i64,
                ts,
            })
            .collect()
    })
}

/// A batch windowing strategy: default trigger, anything else random.
fn batch_strategy() -> impl Strategy<Value = WindowingStrategy> {
    (window_fn(true), output_time(), accumulation(), lateness()).prop_map(
        |(window_fn, output_time, accumulation, allowed_lateness)| WindowingStrategy {
            window_fn,
            trigger: Trigger::Default,
            accumulation,
            output_time,
            allowed_lateness,
            ..WindowingStrategy::global_default()
        },
    )
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop_oneof![Just(1usize), Just(2), Just(7), Just(100_000), 1usize..20],
        1usize..6,
        prop_oneof![Just(1usize << 20), 8usize..64],
        1usize..5,
        any::<bool>(),
        any::<u64>(),
        proptest::option::of(1usize..12),
        proptest::option::of(any::<u64>()),
        prop_oneof![2 => Just(1u32), 1 => 2u32..=3],
    )
        .prop_map(
            |(
                max_bundle_elements,
                create_chunks,
                chunk_bytes,
                per_stage,
                streaming,
                jitter,
                crash_at,
                strict,
                shards,
            )| {
                Shape {
                    max_bundle_elements,
                    create_chunks,
                    chunk_bytes,
                    max_bundles_per_stage: per_stage,
                    streaming,
                    jitter,
                    crash_at,
                    strict,
                    shards,
                    // Half the sharded runs overlap their shards on threads.
                    threads: 1 + (jitter % 2) as usize,
                    // Every other crash restores onto a renumbered plan,
                    // the others onto 1 to 3 shards.
                    renumber_on_restore: jitter % 2 == 1,
                    restore_on: (jitter % 2 == 0).then_some(1 + (jitter / 2 % 3) as u32),
                    // Half the sharded runs exchange through frames.
                    frames: jitter / 8 % 2 == 1,
                }
            },
        )
}

/// One step of a streaming scenario for [`GroupingBuffer`].
#[derive(Debug, Clone)]
enum Op {
    /// An element arrives at the current input watermark.
    Add(Input),
    /// The input watermark moves forward by this many ms (from -20 if it
    /// was still at -∞).
    Advance(i64),
    /// Triggers are evaluated (and the output watermark published).
    Evaluate,
}

/// A streaming scenario.
#[derive(Debug, Clone)]
struct StreamCase {
    strategy: WindowingStrategy,
    trigger: RefTrigger,
    ops: Vec<Op>,
}

/// The input watermark after `Op::Advance(by)` from `watermark`.
fn advance(watermark: Timestamp, by: i64) -> Timestamp {
    watermark.max(-20).saturating_add(by).min(MAX_TIMESTAMP)
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => (0u8..3, -20i64..100).prop_map(|(k, ts)| Op::Add(Input { key: b'a' + k, id: 0, ts })),
        1 => (0i64..30).prop_map(Op::Advance),
        2 => Just(Op::Evaluate),
    ];
    proptest::collection::vec(op, 0..60).prop_map(|mut ops| {
        // Unique values, so every value in a pane names one element.
        for (id, op) in ops.iter_mut().enumerate() {
            if let Op::Add(input) = op {
                input.id = id as i64;
            }
        }
        ops
    })
}

/// Streaming scenarios with one of `triggers` and one of `output_times`.
fn stream_case(
    triggers: Vec<RefTrigger>,
    output_times: Vec<OutputTime>,
) -> impl Strategy<Value = StreamCase> {
    (
        window_fn(false),
        proptest::sample::select(triggers),
        proptest::sample::select(output_times),
        accumulation(),
        lateness(),
        any::<bool>(),
        any::<bool>(),
        ops(),
    )
        .prop_map(
            |(
                window_fn,
                trigger,
                output_time,
                accumulation,
                lateness,
                fire_always,
                emit_always,
                ops,
            )| {
                // An empty on-time pane is only modelled for triggers with an
                // on-time firing (see `StreamingReference::evaluate`).
                let on_time_behavior = if fire_always && !matches!(trigger, RefTrigger::EveryN(_)) {
                    OnTimeBehavior::FireAlways
                } else {
                    OnTimeBehavior::FireIfNonEmpty
                };
                StreamCase {
                    strategy: WindowingStrategy {
                        window_fn,
                        trigger: trigger.to_engine(),
                        accumulation,
                        output_time,
                        allowed_lateness: lateness,
                        closing_behavior: if emit_always {
                            ClosingBehavior::EmitAlways
                        } else {
                            ClosingBehavior::EmitIfNonEmpty
                        },
                        on_time_behavior,
                        finished_trigger: FinishedTrigger::Restarts,
                    },
                    trigger,
                    ops,
                }
            },
        )
}

fn triggers() -> Vec<RefTrigger> {
    vec![
        RefTrigger::Default,
        RefTrigger::EveryN(1),
        RefTrigger::EveryN(2),
        RefTrigger::EveryN(3),
        RefTrigger::EarlyAndLate,
    ]
}

// ---------------------------------------------------------------------------
// Comparing panes
// ---------------------------------------------------------------------------

/// Equal sorted pane lists, or a failure listing the differences.
fn same_panes(got: &[Pane], want: &[Pane], context: &str) -> Result<(), TestCaseError> {
    if got == want {
        return Ok(());
    }
    let missing: Vec<&Pane> = want.iter().filter(|p| !got.contains(p)).collect();
    let unexpected: Vec<&Pane> = got.iter().filter(|p| !want.contains(p)).collect();
    Err(TestCaseError::fail(format!(
        "{context}: panes differ\n  expected but missing: {missing:#?}\n  emitted but not expected: {unexpected:#?}"
    )))
}

/// In batch, whether the on-time pane is also the last one depends on how
/// far the watermark jumps at once when allowed lateness is non-zero (the
/// window may expire later, with nothing left to emit); only with zero
/// lateness must it be last.
fn mask_is_last_unless_zero_lateness(panes: &mut [Pane], allowed_lateness: i64) {
    if allowed_lateness != 0 {
        for p in panes {
            p.is_last = true;
        }
    }
}

fn engine_run(
    inputs: &[Input],
    strategy: &WindowingStrategy,
    shape: &Shape,
) -> Result<Vec<Pane>, TestCaseError> {
    run_batch(inputs, strategy, shape)
        .map(|run| run.panes)
        .map_err(|e| TestCaseError::fail(format!("engine run failed under {shape:?}: {e}")))
}

// ---------------------------------------------------------------------------
// 1 and 2: whole engine runs, default trigger, batch
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(64))]

    /// The engine's grouped output equals the batch reference: per key and
    /// window (sessions merged), one first, on-time pane with exactly the
    /// window's values and the right output timestamp.
    #[test]
    fn batch_default_trigger_matches_reference(
        inputs in inputs(40),
        strategy in batch_strategy(),
        shape in shape(),
    ) {
        let mut got = engine_run(&inputs, &strategy, &shape)?;
        let mut want = batch_reference(&inputs, &strategy);
        mask_is_last_unless_zero_lateness(&mut got, strategy.allowed_lateness);
        mask_is_last_unless_zero_lateness(&mut want, strategy.allowed_lateness);
        same_panes(&got, &want, &format!("{shape:?}"))?;
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// Bundle sizes, output chunking, data-chunk sizes, streaming evaluation
    /// and bundle completion order do not change what is grouped.
    #[test]
    fn bundle_shapes_do_not_change_results(
        inputs in inputs(40),
        strategy in batch_strategy(),
        jitter in any::<u64>(),
    ) {
        let mut first: Option<(Shape, Vec<Pane>)> = None;
        for max_bundle_elements in [1, 2, 7, 100_000] {
            for (create_chunks, chunk_bytes, max_bundles_per_stage, streaming, crash_at, shards) in [
                (1, 1 << 20, 4, false, None, 1),
                (5, 16, 1, true, None, 1),
                (3, 40, 3, false, None, 1),
                (3, 40, 3, false, Some(2), 1),
                (5, 16, 2, true, Some(5), 1),
                (3, 40, 3, false, None, 2),
                (5, 16, 1, true, None, 3),
                (3, 40, 3, false, Some(2), 2),
                (5, 16, 2, true, Some(5), 3),
            ] {
                let shape = Shape {
                    max_bundle_elements,
                    create_chunks,
                    chunk_bytes,
                    max_bundles_per_stage,
                    streaming,
                    jitter,
                    crash_at,
                    strict: None,
                    shards,
                    threads: shards as usize,
                    renumber_on_restore: crash_at == Some(5),
                    restore_on: None,
                    // The sharded runs of every other case exchange frames.
                    frames: jitter % 2 == 1,
                };
                let mut got = engine_run(&inputs, &strategy, &shape)?;
                mask_is_last_unless_zero_lateness(&mut got, strategy.allowed_lateness);
                match &first {
                    None => {
                        let mut want = batch_reference(&inputs, &strategy);
                        mask_is_last_unless_zero_lateness(&mut want, strategy.allowed_lateness);
                        same_panes(&got, &want, &format!("{shape:?} vs reference"))?;
                        first = Some((shape, got));
                    }
                    Some((first_shape, first_got)) => {
                        same_panes(&got, first_got, &format!("{shape:?} vs {first_shape:?}"))?;
                    }
                }
            }
        }
    }
}

/// One, two and three shards group the same input into the same panes,
/// strict mode or not: each key's elements meet on the shard owning its
/// group, and no shard fires a window before every shard's elements for it
/// arrived.
#[test]
fn shards_give_the_panes_of_one_engine() {
    let (_, strategy) = sixty_inputs_in_fixed_windows();
    // Twelve keys, so that every shard owns some.
    let inputs: Vec<Input> = (0..120)
        .map(|i| Input {
            key: b'a' + (i % 12) as u8,
            id: i,
            ts: i * 7 % 50,
        })
        .collect();
    let one = small_bundles_out_of_order();
    let want = run_batch(&inputs, &strategy, &one).expect("one engine");
    assert_eq!(want.sink_engines, 1);
    assert!(!want.panes.is_empty());
    for (shards, strict, frames) in [
        (2, None, false),
        (3, None, false),
        (2, Some(7), false),
        (3, Some(8), false),
        (2, None, true),
        (3, Some(8), true),
    ] {
        let shape = Shape {
            shards,
            strict,
            frames,
            ..one.clone()
        };
        let got = run_batch(&inputs, &strategy, &shape).expect("a sharded run");
        assert_eq!(got.panes, want.panes, "{shape:?}");
        assert_eq!(got.sink_engines, shards as usize, "every shard fired panes");
        if strict.is_some() {
            let report = got.strict.expect("a strict report");
            assert!(report.replayed_bundles >= 3, "{report:?}");
        }
    }
}

/// A crash at a checkpoint taken while bundles were in flight, and a
/// restore into a new engine, give exactly the uninterrupted run's panes:
/// committed work is kept, in-flight work is redone once. The same when
/// the new engine's plan numbers its stages otherwise (another build's
/// fusion, a changed pipeline): stages are found by the transforms
/// reading their input, not by number. And the same on shards, whose
/// checkpoints are epochs every shard cut, over the board or frames.
#[test]
fn a_run_restored_from_a_mid_run_checkpoint_gives_the_same_panes() {
    let (inputs, strategy) = sixty_inputs_in_fixed_windows();
    let straight = small_bundles_out_of_order();
    let want = run_batch(&inputs, &strategy, &straight).expect("straight run");
    for (renumber_on_restore, shards, frames) in [
        (false, 1, false),
        (true, 1, false),
        (false, 2, false),
        (true, 3, false),
        (false, 2, true),
        (true, 3, true),
    ] {
        let mut restored_runs = 0;
        for crash_at in [1, 2, 3, 5, 8, 13] {
            let shape = Shape {
                crash_at: Some(crash_at),
                renumber_on_restore,
                shards,
                frames,
                ..straight.clone()
            };
            let got = run_batch(&inputs, &strategy, &shape).expect("crashed run");
            assert_eq!(
                got.panes, want.panes,
                "crash at checkpoint {crash_at} on {shards} shard(s)"
            );
            restored_runs += usize::from(got.restored);
        }
        assert!(
            restored_runs >= 4,
            "only {restored_runs} runs on {shards} shard(s) crashed before they ended"
        );
    }
}

/// Sixty elements over twelve keys whose panes fire per element, and
/// every element's value once, sorted: what a sink must have seen, once.
fn twelve_keys_firing_per_element() -> (Vec<Input>, WindowingStrategy, Vec<i64>) {
    let (inputs, mut strategy) = sixty_inputs_in_fixed_windows();
    strategy.trigger = RefTrigger::EveryN(1).to_engine();
    let inputs: Vec<Input> = inputs
        .into_iter()
        .map(|i| Input {
            key: b'a' + (i.id % 12) as u8,
            ..i
        })
        .collect();
    let mut want: Vec<i64> = inputs.iter().map(|i| i.id).collect();
    want.sort_unstable();
    (inputs, strategy, want)
}

/// A streaming run on `shards` shards on three threads, in small bundles,
/// three at a time: receiving shards commit while the source's shard still
/// sends.
fn per_element_on_threads(shards: u32, jitter: u64) -> Shape {
    Shape {
        shards,
        threads: 3,
        streaming: true,
        max_bundle_elements: 2,
        create_chunks: 12,
        max_bundles_per_stage: 3,
        jitter,
        ..Shape::default()
    }
}

/// A checkpoint of shards that holds elements one shard sent before the
/// epoch and another took after its cut (recorded beside that cut)
/// restores exactly: every element reaches the sink once, neither lost
/// nor taken twice. Panes fire per element here, so receiving shards
/// commit (and start epochs) while the source's shard still sends, on
/// threads of their own; the search stops once three such restores ran,
/// over the board and over frames.
#[test]
fn a_sharded_checkpoint_with_elements_in_transit_restores_exactly() {
    for frames in [false, true] {
        elements_in_transit_restore_exactly(frames);
    }
}

fn elements_in_transit_restore_exactly(frames: bool) {
    let (inputs, strategy, want) = twelve_keys_firing_per_element();
    let mut in_transit = 0;
    'search: for jitter in 0..100 {
        for crash_at in 1..16 {
            let shape = Shape {
                crash_at: Some(crash_at),
                frames,
                ..per_element_on_threads(3, jitter)
            };
            let got = run_batch(&inputs, &strategy, &shape).expect("crashed run");
            let mut values: Vec<i64> = got.panes.iter().flat_map(|p| p.values.clone()).collect();
            values.sort_unstable();
            assert_eq!(values, want, "{shape:?}");
            in_transit += usize::from(got.restored_in_transit);
            if in_transit >= 3 {
                break 'search;
            }
        }
    }
    assert!(
        in_transit >= 3,
        "only {in_transit} restored checkpoints held elements in transit (frames: {frames})"
    );
}

/// A checkpoint of shards restores onto another number of shards: each
/// key group's panes, queued elements and elements in transit go to its
/// new owner, and the run finishes with exactly the uninterrupted run's
/// panes, scaling up and down, at several cuts — and between one engine
/// (a layout of one shard) and shards, both ways.
#[test]
fn a_sharded_checkpoint_restores_onto_another_number_of_shards() {
    let (inputs, strategy) = sixty_inputs_in_fixed_windows();
    let straight = small_bundles_out_of_order();
    let want = run_batch(&inputs, &strategy, &straight).expect("straight run");
    let shape = |shards, threads| Shape {
        shards,
        threads,
        ..straight.clone()
    };
    // One engine is one shard: a job moves onto shards and back.
    for (from, to) in [
        (2, 3),
        (3, 2),
        (2, 5),
        (5, 2),
        (3, 3),
        (1, 3),
        (3, 1),
        (2, 1),
    ] {
        let mut restored = 0;
        for crash_at in [1, 2, 4, 7] {
            for threads in [1, 3] {
                let shape = shape(to, threads);
                let (got, moved) =
                    finish_on_other_shards(&inputs, &strategy, &shape, from, crash_at)
                        .unwrap_or_else(|e| panic!("{from} -> {to} at {crash_at}: {e}"));
                assert_eq!(
                    got, want.panes,
                    "{from} -> {to} shards at checkpoint {crash_at}"
                );
                restored += usize::from(moved);
            }
        }
        assert!(
            restored >= 4,
            "{from} -> {to}: only {restored} runs were restored"
        );
    }
}

/// The same for a streaming run whose panes fire per element while
/// elements cross between shards: every element reaches the sink once
/// after moving from 3 shards to 2, from 2 to 4, from one engine to 3
/// shards and from 2 shards to one engine.
#[test]
fn a_streaming_sharded_checkpoint_moves_every_element_once() {
    let (inputs, strategy, want) = twelve_keys_firing_per_element();
    for (from, to) in [(3, 2), (2, 4), (1, 3), (2, 1)] {
        let mut restored = 0;
        for crash_at in [1, 3, 6, 10] {
            for jitter in 0..4 {
                let shape = Shape {
                    frames: jitter % 2 == 1,
                    ..per_element_on_threads(to, jitter)
                };
                let (panes, moved) =
                    finish_on_other_shards(&inputs, &strategy, &shape, from, crash_at)
                        .unwrap_or_else(|e| panic!("{from} -> {to} at {crash_at}: {e}"));
                restored += usize::from(moved);
                let mut values: Vec<i64> = panes.iter().flat_map(|p| p.values.clone()).collect();
                values.sort_unstable();
                assert_eq!(
                    values, want,
                    "{from} -> {to} at {crash_at}, jitter {jitter}"
                );
            }
        }
        assert!(
            restored >= 4,
            "{from} -> {to}: only {restored} runs were restored"
        );
    }
}

/// Strict mode runs bundles twice, cuts them small and reorders them, and
/// the panes are still the uninterrupted run's (the sink counts what the
/// engine commits); with a crash and restore in the middle too.
#[test]
fn strict_mode_replays_and_cuts_bundles_and_changes_no_pane() {
    let (inputs, strategy) = sixty_inputs_in_fixed_windows();
    let straight = Shape {
        create_chunks: 6,
        jitter: 5,
        ..Shape::default()
    };
    let want = run_batch(&inputs, &strategy, &straight).expect("straight run");
    for (seed, crash_at) in [(1, None), (2, None), (3, Some(3)), (4, Some(6))] {
        let shape = Shape {
            strict: Some(seed),
            crash_at,
            ..straight.clone()
        };
        let got = run_batch(&inputs, &strategy, &shape).expect("strict run");
        assert_eq!(got.panes, want.panes, "{shape:?}");
        if crash_at.is_none() {
            let report = got.strict.expect("a strict report");
            assert_eq!(report.seed, seed);
            // Every SDK stage's first bundle, at least.
            assert!(report.replayed_bundles >= 3, "{report:?}");
            assert!(report.smaller_bundles >= 1, "{report:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// 3: GroupingBuffer under interleaved data and watermark advances
// ---------------------------------------------------------------------------

/// Which known divergences from the reference a check tolerates.
#[derive(Debug, Clone, Copy)]
struct Strictness {
    /// Require a first non-early pane whose window end is behind the output
    /// watermark to be LATE (otherwise ON_TIME is accepted for it).
    timing: bool,
    /// Require Beam's exact EarliestInPane / LatestInPane timestamps, and
    /// that no EARLY or ON_TIME pane is behind the published output
    /// watermark (otherwise only bounds are checked).
    timestamps: bool,
}

const TOLERANT: Strictness = Strictness {
    timing: false,
    timestamps: false,
};

/// A pane as emitted, with the input watermark it was emitted at.
struct Emitted {
    watermark: Timestamp,
    pane: Pane,
}

/// Applies the tolerated divergences to a pane (engine's or reference's)
/// before comparison.
fn tolerate(pane: &mut Pane, strictness: Strictness, output_time: OutputTime) {
    if !strictness.timing && pane.timing == Timing::Late && pane.nonspeculative_index == 0 {
        pane.timing = Timing::OnTime;
    }
    if !strictness.timestamps && output_time != OutputTime::EndOfWindow {
        pane.timestamp = 0;
    }
}

/// Bounds every pane's timestamp must respect, whatever the holds: never
/// past the end of the window, the end of the window for EndOfWindow or an
/// empty pane, and otherwise not before the pane's earliest value.
fn check_timestamp_bounds(
    pane: &Pane,
    output_time: OutputTime,
    timestamps: &HashMap<i64, Timestamp>,
) -> Result<(), TestCaseError> {
    let end = pane.window.max_timestamp();
    let earliest = pane.values.iter().map(|id| timestamps[id]).min();
    match (output_time, earliest) {
        (OutputTime::EndOfWindow, _) | (_, None) => {
            prop_assert_eq!(pane.timestamp, end, "{:?}", pane)
        }
        (_, Some(earliest)) => prop_assert!(
            earliest <= pane.timestamp && pane.timestamp <= end,
            "timestamp outside [earliest value {}, end of window {}]: {:?}",
            earliest,
            end,
            pane
        ),
    }
    Ok(())
}

/// Properties of each window's sequence of panes that hold whatever the
/// trigger: counted indices, EARLY* ON_TIME? LATE* with timing matching the
/// watermark at emission, nothing after the last pane, and each accepted
/// element emitted once (discarding) or in every pane from its first on
/// (accumulating).
fn check_pane_sequences(
    emitted: &[Emitted],
    accepted: &BTreeMap<(Key, Window), Vec<i64>>,
    accumulation: AccumulationMode,
) -> Result<(), TestCaseError> {
    let mut by_window: BTreeMap<(Key, Window), Vec<&Emitted>> = BTreeMap::new();
    for e in emitted {
        by_window
            .entry((e.pane.key, e.pane.window.clone()))
            .or_default()
            .push(e);
    }
    for ((key, window), seq) in &by_window {
        let end = window.max_timestamp();
        let mut nonspeculative = 0;
        let mut seen: Vec<i64> = Vec::new();
        for (i, e) in seq.iter().enumerate() {
            let p = &e.pane;
            prop_assert_eq!(p.index, i as i64, "pane index of {:?}", p);
            prop_assert_eq!(p.is_first, i == 0, "is_first of {:?}", p);
            prop_assert!(
                i == 0 || !seq[i - 1].pane.is_last,
                "a pane after the last one: {:?}",
                p
            );
            prop_assert_eq!(
                p.timing == Timing::Early,
                e.watermark <= end,
                "timing of {:?} at watermark {}",
                p,
                e.watermark
            );
            if p.timing == Timing::Early {
                prop_assert_eq!(p.nonspeculative_index, -1, "{:?}", p);
            } else {
                prop_assert!(
                    p.timing == Timing::Late || nonspeculative == 0,
                    "a second ON_TIME pane: {:?}",
                    p
                );
                prop_assert_eq!(p.nonspeculative_index, nonspeculative, "{:?}", p);
                nonspeculative += 1;
            }
            match accumulation {
                AccumulationMode::Discarding => seen.extend(&p.values),
                AccumulationMode::Accumulating => {
                    let mut previous = seen.clone();
                    for v in &p.values {
                        if let Some(at) = previous.iter().position(|x| x == v) {
                            previous.swap_remove(at);
                        }
                    }
                    prop_assert!(
                        previous.is_empty(),
                        "accumulating pane lost {:?}: {:?}",
                        previous,
                        p
                    );
                    seen = p.values.clone();
                }
            }
        }
        seen.sort_unstable();
        let want = accepted
            .get(&(*key, window.clone()))
            .cloned()
            .unwrap_or_default();
        prop_assert_eq!(seen, want, "values emitted for {:?} in {:?}", key, window);
    }
    for (k, ids) in accepted {
        prop_assert!(
            ids.is_empty() || by_window.contains_key(k),
            "accepted data never emitted: {:?} {:?}",
            k,
            ids
        );
    }
    Ok(())
}

/// Runs `case` on a [`GroupingBuffer`] and on the reference side by side,
/// comparing the panes of every evaluation, then checks the sequences and
/// that everything was flushed at the end.
fn check_stream_case(case: &StreamCase, strictness: Strictness) -> Result<(), TestCaseError> {
    let strategy = &case.strategy;
    let global = strategy.window_fn == WindowFn::Global;
    let window_coder = window_coder_for(global);
    let mut engine = GroupingBuffer::new(strategy.clone(), kv_coder(), window_coder.clone());
    let mut reference = StreamingReference::new(strategy, case.trigger);
    let mut watermark = MIN_TIMESTAMP;
    let mut output_watermark = MIN_TIMESTAMP;
    let mut emitted: Vec<Emitted> = Vec::new();
    let mut accepted: BTreeMap<(Key, Window), Vec<i64>> = BTreeMap::new();
    let mut timestamps: HashMap<i64, Timestamp> = HashMap::new();
    // At the end the watermark reaches +∞ and everything must be flushed.
    let ending = [Op::Advance(MAX_TIMESTAMP), Op::Evaluate];
    for (step, op) in case.ops.iter().chain(&ending).enumerate() {
        match op {
            Op::Add(input) => {
                let windows = assign_windows(&strategy.window_fn, input.ts);
                for w in &windows {
                    if !is_droppably_late(w, strategy.allowed_lateness, watermark) {
                        accepted
                            .entry((input.key, w.clone()))
                            .or_default()
                            .push(input.id);
                    }
                }
                timestamps.insert(input.id, input.ts);
                if windows.is_empty() {
                    continue;
                }
                let element = decoded_input(input, windows, &window_coder);
                engine
                    .add(&element, watermark, 0)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                reference.add(*input, watermark, output_watermark);
            }
            Op::Advance(by) => watermark = advance(watermark, *by),
            Op::Evaluate => {
                // One key per call (the smallest byte budget), until every
                // key was looked at: the engine emits a big firing in steps,
                // and the steps together must be the one firing.
                let mut out = Fired::default();
                let mut n = 0;
                loop {
                    let one_more = out.bytes.len() + 1;
                    n += engine
                        .evaluate(watermark, 0, &mut out, one_more)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    if !engine.has_unevaluated() {
                        break;
                    }
                }
                prop_assert_eq!(n, out.element_count(), "evaluate's count, as recorded");
                let mut got = wire::decode_panes(&out.bytes, &window_coder);
                prop_assert_eq!(n, got.len(), "evaluate's count");
                let mut want = reference.evaluate(watermark, output_watermark);
                for p in &got {
                    check_timestamp_bounds(p, strategy.output_time, &timestamps)?;
                    if strictness.timestamps && p.timing != Timing::Late {
                        prop_assert!(
                            p.timestamp >= output_watermark,
                            "{:?} pane behind the published output watermark {}: {:?}",
                            p.timing,
                            output_watermark,
                            p
                        );
                    }
                    emitted.push(Emitted {
                        watermark,
                        pane: p.clone(),
                    });
                }
                for p in got.iter_mut().chain(want.iter_mut()) {
                    tolerate(p, strictness, strategy.output_time);
                }
                got.sort();
                want.sort();
                same_panes(
                    &got,
                    &want,
                    &format!("step {step} (evaluate at watermark {watermark}, output watermark {output_watermark})"),
                )?;
                // What the manager publishes after evaluating: the input
                // watermark held back by buffered data, never moving back.
                let held = engine.hold().map_or(watermark, |h| h.min(watermark));
                output_watermark = output_watermark.max(held);
            }
        }
    }
    prop_assert!(reference.is_empty(), "the reference kept windows at +∞");
    prop_assert!(engine.is_empty(), "the engine kept buffered windows at +∞");
    prop_assert_eq!(engine.hold(), None);
    prop_assert_eq!(engine.dropped_late(), reference.dropped_late, "late drops");
    check_pane_sequences(&emitted, &accepted, strategy.accumulation)
}

proptest! {
    #![proptest_config(config(256))]

    /// Pane contents, pane info and (for EndOfWindow) timestamps of every
    /// evaluation match the reference, for the default trigger, repeated
    /// element counts and early/on-time/late firings, in both accumulation
    /// modes, with random late and out-of-order data.
    #[test]
    fn grouping_buffer_matches_streaming_reference(
        case in stream_case(triggers(), vec![OutputTime::EndOfWindow, OutputTime::EarliestInPane, OutputTime::LatestInPane]),
    ) {
        check_stream_case(&case, TOLERANT)?;
    }
}

// ---------------------------------------------------------------------------
// 3, through the whole engine: a TestStream drives the watermark
// ---------------------------------------------------------------------------

/// The TestStream script for `ops`: runs of `Add`s become one element batch
/// (an `Evaluate` just ends a batch: the engine decides when to evaluate),
/// `Advance`s become watermark events, and the script ends by advancing the
/// watermark to +∞ — after the last batch was processed, so that the
/// GroupByKey never sees a watermark the script did not set.
fn script(ops: &[Op]) -> Vec<StreamEvent> {
    let mut events = Vec::new();
    let mut batch = Vec::new();
    let mut watermark = MIN_TIMESTAMP;
    for op in ops {
        if let Op::Add(input) = op {
            batch.push(*input);
            continue;
        }
        if !batch.is_empty() {
            events.push(StreamEvent::Elements(std::mem::take(&mut batch)));
        }
        if let Op::Advance(by) = op {
            watermark = advance(watermark, *by);
            events.push(StreamEvent::Watermark(watermark));
        }
    }
    if !batch.is_empty() {
        events.push(StreamEvent::Elements(batch));
    }
    events.push(StreamEvent::Watermark(MAX_TIMESTAMP));
    events
}

/// The reference's panes for a TestStream `events` when the GroupByKey
/// evaluates triggers after every `every` elements of a batch, at the end of
/// each batch and at each watermark advance; and its late-drop count. The
/// output watermark cannot be observed from outside a run, so it is taken as
/// -∞ (compare tolerantly).
fn script_reference(
    events: &[StreamEvent],
    strategy: &WindowingStrategy,
    trigger: RefTrigger,
    every: usize,
) -> (Vec<Pane>, u64) {
    let mut reference = StreamingReference::new(strategy, trigger);
    let mut watermark = MIN_TIMESTAMP;
    let mut panes = Vec::new();
    for event in events {
        match event {
            StreamEvent::Elements(inputs) => {
                for (j, input) in inputs.iter().enumerate() {
                    reference.add(*input, watermark, MIN_TIMESTAMP);
                    if (j + 1) % every == 0 || j + 1 == inputs.len() {
                        panes.extend(reference.evaluate(watermark, MIN_TIMESTAMP));
                    }
                }
            }
            StreamEvent::Watermark(t) => {
                watermark = watermark.max(*t);
                panes.extend(reference.evaluate(watermark, MIN_TIMESTAMP));
            }
        }
    }
    (panes, reference.dropped_late)
}

fn all_output_times() -> Vec<OutputTime> {
    vec![
        OutputTime::EndOfWindow,
        OutputTime::EarliestInPane,
        OutputTime::LatestInPane,
    ]
}

proptest! {
    #![proptest_config(config(64))]

    /// A TestStream of element batches and watermark advances through the
    /// whole engine gives the reference's panes, whether triggers are
    /// evaluated per element (streaming) or per bundle of the upstream stage,
    /// on one engine or shards, and restored after a crash onto as many
    /// shards or another number (one engine among them).
    #[test]
    fn engine_with_test_stream_matches_streaming_reference(
        case in stream_case(triggers(), all_output_times()),
        max_bundle_elements in prop_oneof![Just(1usize), Just(2), Just(3), Just(100_000)],
        streaming in any::<bool>(),
        jitter in any::<u64>(),
        crash_at in proptest::option::of(1usize..10),
        shards in prop_oneof![2 => Just(1u32), 1 => 2u32..=3],
        restore_on in prop_oneof![2 => Just(None), 1 => (1u32..=3).prop_map(Some)],
    ) {
        let events = script(&case.ops);
        // One bundle at a time keeps the elements in script order, which
        // count-based triggers depend on. A crash and restore may regroup
        // re-run elements into other bundles, which per-bundle evaluation
        // would see: crash only runs that evaluate per element.
        let shape = Shape {
            max_bundle_elements,
            max_bundles_per_stage: 1,
            streaming,
            jitter,
            crash_at: crash_at.filter(|_| streaming),
            shards,
            restore_on,
            ..Shape::default()
        };
        let Run { panes: mut got, dropped_late, .. } = run_stream(&events, &case.strategy, &shape)
            .map_err(|e| TestCaseError::fail(format!("engine run failed: {e}")))?;
        let every = if streaming { 1 } else { max_bundle_elements };
        let (mut want, want_dropped) = script_reference(&events, &case.strategy, case.trigger, every);
        let timestamps: HashMap<i64, Timestamp> = case
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Add(i) => Some((i.id, i.ts)),
                _ => None,
            })
            .collect();
        for p in &got {
            check_timestamp_bounds(p, case.strategy.output_time, &timestamps)?;
        }
        for p in got.iter_mut().chain(want.iter_mut()) {
            tolerate(p, TOLERANT, case.strategy.output_time);
        }
        got.sort();
        want.sort();
        same_panes(&got, &want, &format!("{events:?}"))?;
        prop_assert_eq!(dropped_late, want_dropped, "late drops");
    }
}

// ---------------------------------------------------------------------------
// Engine bugs found by the properties above, pinned by minimal cases
// ---------------------------------------------------------------------------

fn a(id: i64, ts: Timestamp) -> Input {
    Input { key: b'a', id, ts }
}

fn fixed_10(strategy: WindowingStrategy) -> WindowingStrategy {
    WindowingStrategy {
        window_fn: WindowFn::Fixed {
            size: 10,
            offset: 0,
        },
        ..strategy
    }
}

fn stream_panes(events: Vec<StreamEvent>, strategy: &WindowingStrategy) -> Vec<Pane> {
    run_stream(&events, strategy, &Shape::default())
        .expect("the job finishes")
        .panes
}

fn pane(index: i64, timing: Timing, is_last: bool, timestamp: Timestamp, values: Vec<i64>) -> Pane {
    Pane {
        key: b'a',
        window: Window::Interval { start: 0, end: 10 },
        index,
        timing,
        nonspeculative_index: if timing == Timing::Early { -1 } else { 0 },
        is_first: index == 0,
        is_last,
        timestamp,
        values,
    }
}

/// Global window, one day of allowed lateness, one element: the job must
/// finish with one pane. `GLOBAL_WINDOW_MAX_TIMESTAMP + 1 day` is
/// `MAX_TIMESTAMP`, which the watermark never exceeds, so the engine's
/// `max + lateness < watermark` never holds and the GroupByKey stays busy.
#[test]
fn global_window_with_a_day_of_lateness_closes_at_the_end() {
    let strategy = WindowingStrategy {
        allowed_lateness: 86_400_000,
        ..WindowingStrategy::global_default()
    };
    let run = run_batch(&[a(0, 0)], &strategy, &Shape::default()).expect("the job finishes");
    assert_eq!(run.panes, batch_reference(&[a(0, 0)], &strategy));
}

proptest! {
    #![proptest_config(config(32))]

    /// Any allowed lateness, however large, still lets batch jobs finish.
    #[test]
    fn huge_allowed_lateness_still_closes_windows(
        inputs in inputs(10),
        strategy in batch_strategy(),
        lateness in prop_oneof![Just(86_400_000i64), 86_400_001i64..i64::MAX, Just(i64::MAX)],
    ) {
        let strategy = WindowingStrategy { allowed_lateness: lateness, ..strategy };
        let mut got = engine_run(&inputs, &strategy, &Shape::default())?;
        let mut want = batch_reference(&inputs, &strategy);
        mask_is_last_unless_zero_lateness(&mut got, lateness);
        mask_is_last_unless_zero_lateness(&mut want, lateness);
        same_panes(&got, &want, "huge allowed lateness")?;
    }
}

/// Watermark at 15, then an element for `[0, 10)` (allowed: lateness 20).
/// The stage's output watermark is already 15 > 9, so the pane cannot be on
/// time for anything downstream: Beam's `PaneInfoTracker` makes it LATE
/// (`isLateForOutput`). The engine says ON_TIME.
#[test]
fn data_arriving_after_the_end_of_its_window_makes_a_late_pane() {
    let strategy = WindowingStrategy {
        allowed_lateness: 20,
        ..fixed_10(WindowingStrategy::global_default())
    };
    let events = vec![
        StreamEvent::Watermark(15),
        StreamEvent::Elements(vec![a(0, 5)]),
        StreamEvent::Watermark(MAX_TIMESTAMP),
    ];
    assert_eq!(
        stream_panes(events, &strategy),
        vec![pane(0, Timing::Late, false, 9, vec![0])],
        "the window's end (9) is behind the output watermark (15)"
    );
}

/// `a@5`, watermark 8, then out-of-order `a@2` (its window `[0, 10)` is still
/// open). After the watermark advance the GroupByKey published an output
/// watermark of 5 (held by `a@5`); `a@2` is behind it and, in Beam, sets no
/// hold, so the pane's EarliestInPane timestamp is 5. The engine emits the
/// ON_TIME pane at 2 — behind its own output watermark, where a downstream
/// GroupByKey may already have expired the window and drop it.
#[test]
fn out_of_order_data_does_not_pull_a_pane_behind_the_output_watermark() {
    let strategy = WindowingStrategy {
        output_time: OutputTime::EarliestInPane,
        ..fixed_10(WindowingStrategy::global_default())
    };
    let events = vec![
        StreamEvent::Elements(vec![a(0, 5)]),
        StreamEvent::Watermark(8),
        StreamEvent::Elements(vec![a(1, 2)]),
        StreamEvent::Watermark(MAX_TIMESTAMP),
    ];
    assert_eq!(
        stream_panes(events, &strategy),
        vec![pane(0, Timing::OnTime, true, 5, vec![0, 1])]
    );
}

/// Accumulating, EarliestInPane, early firings per element: `a@1` fires an
/// early pane at 1; after the watermark reaches 6 (output watermark 6, no
/// holds left), `a@7` fires a pane with both values. Beam releases holds at
/// each firing, so its timestamp is 7 (the new element's); the engine keeps
/// the minimum over all accumulated values, 1, behind the output watermark.
#[test]
fn accumulating_panes_are_timestamped_by_their_new_elements() {
    let strategy = WindowingStrategy {
        output_time: OutputTime::EarliestInPane,
        accumulation: AccumulationMode::Accumulating,
        trigger: RefTrigger::EarlyAndLate.to_engine(),
        ..fixed_10(WindowingStrategy::global_default())
    };
    let events = vec![
        StreamEvent::Elements(vec![a(0, 1)]),
        StreamEvent::Watermark(6),
        StreamEvent::Elements(vec![a(1, 7)]),
        StreamEvent::Watermark(MAX_TIMESTAMP),
    ];
    assert_eq!(
        stream_panes(events, &strategy),
        vec![
            pane(0, Timing::Early, false, 1, vec![0]),
            pane(1, Timing::Early, false, 7, vec![0, 1]),
        ]
    );
}

/// `AfterWatermark()` without late firings finishes at its on-time pane; in
/// Beam the window is then closed and later data for it (here `a@6`, within
/// the allowed lateness) is dropped. (With `FinishedTrigger::Restarts`, for
/// Python pipelines, the engine restarts the trigger and emits a second
/// pane instead.)
#[test]
fn a_finished_trigger_closes_its_window() {
    let strategy = WindowingStrategy {
        allowed_lateness: 20,
        trigger: RefTrigger::OnTimeOnly.to_engine(),
        finished_trigger: FinishedTrigger::ClosesWindow,
        ..fixed_10(WindowingStrategy::global_default())
    };
    let events = vec![
        StreamEvent::Elements(vec![a(0, 5)]),
        StreamEvent::Watermark(10),
        StreamEvent::Elements(vec![a(1, 6)]),
        StreamEvent::Watermark(MAX_TIMESTAMP),
    ];
    assert_eq!(
        stream_panes(events, &strategy),
        vec![pane(0, Timing::OnTime, true, 9, vec![0])]
    );
}

proptest! {
    #![proptest_config(config(256))]

    /// As `grouping_buffer_matches_streaming_reference`, but a first
    /// non-early pane whose window end is behind the output watermark must
    /// be LATE.
    #[test]
    fn strict_pane_timing_matches_streaming_reference(
        case in stream_case(triggers(), vec![OutputTime::EndOfWindow]),
    ) {
        check_stream_case(&case, Strictness { timing: true, timestamps: false })?;
    }

    /// As `grouping_buffer_matches_streaming_reference`, with Beam's exact
    /// EarliestInPane / LatestInPane timestamps, and no EARLY or ON_TIME
    /// pane behind the published output watermark.
    #[test]
    #[ignore = "open: LatestInPane stamps a pane whose elements were all behind the published output watermark at the end of the window, where this model keeps the latest element timestamp; to be settled against Beam (issue 3)"]
    fn strict_output_timestamps_match_streaming_reference(
        case in stream_case(triggers(), vec![OutputTime::EarliestInPane, OutputTime::LatestInPane]),
    ) {
        check_stream_case(&case, Strictness { timing: false, timestamps: true })?;
    }

    /// `AfterWatermark()` alone: one on-time pane per window, later data
    /// dropped.
    #[test]
    #[ignore = "open: the streaming reference accepts data after a finished trigger (it models lateness only), so it agrees with neither rule of `FinishedTrigger`; `a_finished_trigger_closes_its_window` checks Beam's rule"]
    fn finished_triggers_match_streaming_reference(
        case in stream_case(vec![RefTrigger::OnTimeOnly], all_output_times()),
    ) {
        check_stream_case(&case, TOLERANT)?;
    }
}
