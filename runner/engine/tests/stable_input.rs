//! `@RequiresStableInput` against a source that is not deterministic.
//!
//! The source emits different values every time it runs. A stage with
//! stable input may only ever see values a durable checkpoint holds, so
//! that whatever it saw — in an attempt that failed, or before a crash —
//! is what it sees again after recovery. The run is crashed at each of its
//! first checkpoints and finished by a restored engine; every value the
//! stable stage saw in any attempt must be among the values finally
//! committed, and those must be each source index exactly once.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::crashes::{after_a_millisecond, recorded_on_commit, run_crashing_at, Commits, Writer};
use common::sourced_plan;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use refract_engine::coder::{
    decode_varint_i64, decode_windowed_values, encode_varint_i64, encode_windowed_value, Coder,
    PaneInfo, WindowedValueHeader,
};
use refract_engine::executor::{BundleInput, BundleOutput, ExecError, StageExecutor};
use refract_engine::manager::{Engine, EngineConfig};
use refract_engine::plan::{PCollectionIdx, Plan, SdkStage, StageKind};
use refract_engine::window::Window;

/// Elements the source emits per run.
const ELEMENTS: i64 = 20;

/// How long writing a checkpoint takes.
const WRITE_TIME: Duration = Duration::from_millis(10);

/// Plays the source (stage 1) and the stable-input stage (stage 2).
#[derive(Default)]
struct Sdk {
    /// Source runs so far: a value is `run * 1000 + index`.
    source_runs: AtomicI64,
    /// Every value the stable stage was given, in any attempt.
    seen: Mutex<BTreeSet<i64>>,
    /// (bundle number, values) of the stable stage's committed bundles.
    committed: Commits<Vec<i64>>,
}

impl StageExecutor for Sdk {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let output = match input.stage.index() {
            1 => {
                let run = self.source_runs.fetch_add(1, Ordering::SeqCst) + 1;
                let mut out = Vec::new();
                for i in 0..ELEMENTS {
                    let mut value = Vec::new();
                    encode_varint_i64(run * 1000 + i, &mut value);
                    let header = WindowedValueHeader {
                        timestamp: 0,
                        windows: smallvec::smallvec![Window::Global],
                        pane: PaneInfo::NO_FIRING,
                    };
                    encode_windowed_value(&header, &Coder::GlobalWindow, &value, &mut out)
                        .expect("encodes");
                }
                BundleOutput {
                    outputs: vec![(PCollectionIdx::new(1), Bytes::from(out))],
                    ..Default::default()
                }
            }
            _ => {
                let mut values = Vec::new();
                for chunk in &input.elements {
                    for e in decode_windowed_values(chunk, &Coder::Varint, &Coder::GlobalWindow)
                        .expect("decodes")
                    {
                        values.push(decode_varint_i64(e.value()).expect("a varint").0);
                    }
                }
                self.seen.lock().extend(values.iter().copied());
                recorded_on_commit(&self.committed, &input, values)
            }
        };
        after_a_millisecond(output)
    }
}

fn plan() -> Plan {
    sourced_plan(
        Coder::Varint,
        "stable",
        StageKind::Sdk(SdkStage {
            stable_input: true,
            ..SdkStage::default()
        }),
    )
}

fn config() -> EngineConfig {
    EngineConfig {
        // Several bundles, so that some commit before a crash.
        max_bundle_elements: 3,
        max_bundles_per_stage: 2,
        ..EngineConfig::default()
    }
}

/// Runs the plan with `writer`, crashing at its `crash_at`th checkpoint
/// and finishing from it; returns the values the stable stage committed,
/// in total.
async fn run(sdk: &Arc<Sdk>, writer: Writer) -> Vec<i64> {
    let executor: Arc<dyn StageExecutor> = sdk.clone();
    let engine = |tx, progress| {
        Engine::builder(plan(), executor.clone(), config(), "s", Arc::new(|| 0))
            .checkpoints(Duration::ZERO, tx, Some(progress))
            .build()
            .expect("a valid plan")
    };
    run_crashing_at(engine, &sdk.committed, writer, WRITE_TIME).await;
    committed_values(sdk)
}

fn committed_values(sdk: &Sdk) -> Vec<i64> {
    let mut values: Vec<i64> = sdk
        .committed
        .lock()
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    values.sort_unstable();
    values
}

/// Every writer the tests run: crashes at each of the first checkpoints,
/// none, and the same with the first writes failing (a failed write must
/// not stop checkpoints: the stable stage waits for one).
fn writers() -> Vec<Writer> {
    let mut writers = Vec::new();
    for failing in [0, 2] {
        writers.push(Writer {
            crash_at: None,
            failing,
        });
        for crash_at in (failing + 1)..=(failing + 8) {
            writers.push(Writer {
                crash_at: Some(crash_at),
                failing,
            });
        }
    }
    writers
}

#[tokio::test]
async fn a_stable_input_stage_sees_again_after_a_crash_exactly_what_it_saw_before() {
    for writer in writers() {
        let what = format!(
            "crash at checkpoint {:?}, {} failed writes first",
            writer.crash_at, writer.failing
        );
        let sdk = Arc::new(Sdk::default());
        let committed = tokio::time::timeout(Duration::from_secs(30), run(&sdk, writer))
            .await
            .unwrap_or_else(|_| panic!("{what}: the run did not end"));
        let mut indices: Vec<i64> = committed.iter().map(|v| v % 1000).collect();
        indices.sort_unstable();
        assert_eq!(
            indices,
            (0..ELEMENTS).collect::<Vec<_>>(),
            "{what}: every index exactly once ({committed:?})"
        );
        let committed: BTreeSet<i64> = committed.into_iter().collect();
        let seen = sdk.seen.lock().clone();
        let unstable: Vec<&i64> = seen.difference(&committed).collect();
        assert!(
            unstable.is_empty(),
            "{what}: the stable stage saw {unstable:?}, which the recovered run recomputed \
             differently"
        );
    }
}
