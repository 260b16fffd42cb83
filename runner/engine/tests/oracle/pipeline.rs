//! A whole engine run with a fake SDK: impulse → create → window → GBK → sink.
//!
//! * `create` (SDK stage) turns the impulse into the test's elements, in the
//!   global window at their own timestamps, written as `create_chunks`
//!   separate outputs.
//! * `window` (SDK stage) plays `WindowInto`: it re-emits every element in
//!   the windows [`assign_windows`] gives it. Because `create` committed all
//!   elements at once, `max_bundle_elements` decides how they are spread over
//!   `window`'s bundles, and so how many batches the GroupByKey sees and at
//!   which input watermarks (each pending element holds `window`'s output
//!   watermark at its timestamp).
//! * the runner's GroupByKey groups them.
//! * `sink` (SDK stage) records every pane it receives.
//!
//! Bundles of the fake SDK finish after a pseudo-random number of scheduler
//! yields, so concurrent bundles of a stage commit out of order.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use refract_engine::coder::{decode_windowed_values, Coder};
use refract_engine::executor::{BundleInput, BundleOutput, ExecError, StageExecutor};
use refract_engine::manager::{Engine, EngineConfig, EngineError};
use refract_engine::plan::{
    PCollection, Plan, SdkStage, Stage, StageKind, WindowFn, WindowingStrategy,
};
use refract_engine::window::Window;
use tokio::sync::watch;

use super::model::{assign_windows, Input, Pane};
use super::wire::{
    decode_panes, encode_input, grouped_coder, kv_coder, read_input, window_coder_for,
};

/// How the run is cut into bundles and batches.
#[derive(Debug, Clone)]
pub struct Shape {
    /// `EngineConfig::max_bundle_elements`.
    pub max_bundle_elements: usize,
    /// Into how many outputs `create` splits its elements.
    pub create_chunks: usize,
    /// `EngineConfig::chunk_bytes` (small values split bundles into many chunks).
    pub chunk_bytes: usize,
    /// `EngineConfig::max_bundles_per_stage`.
    pub max_bundles_per_stage: usize,
    /// `EngineConfig::streaming` (evaluate triggers after every element).
    pub streaming: bool,
    /// Seed of the bundles' completion delays.
    pub jitter: u64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            max_bundle_elements: 100_000,
            create_chunks: 1,
            chunk_bytes: 1 << 20,
            max_bundles_per_stage: 4,
            streaming: false,
            jitter: 0,
        }
    }
}

/// Indices of the SDK stages in the plan built by [`run_pipeline`].
const CREATE: usize = 1;
const WINDOW: usize = 2;
const SINK: usize = 4;

/// The fake SDK: what each SDK stage does with a bundle.
struct FakeSdk {
    inputs: Vec<Input>,
    window_fn: WindowFn,
    window_coder: Coder,
    create_chunks: usize,
    jitter: u64,
    sink: Mutex<Vec<Pane>>,
}

impl FakeSdk {
    fn create(&self) -> BundleOutput {
        let n = self.inputs.len();
        let chunks = self.create_chunks.max(1);
        let outputs = (0..chunks)
            .map(|c| {
                let mut out = Vec::new();
                for input in &self.inputs[c * n / chunks..(c + 1) * n / chunks] {
                    encode_input(input, vec![Window::Global], &Coder::GlobalWindow, &mut out);
                }
                (1, Bytes::from(out))
            })
            .collect();
        BundleOutput {
            outputs,
            ..BundleOutput::default()
        }
    }

    fn window(&self, input: &BundleInput) -> BundleOutput {
        let mut out = Vec::new();
        for chunk in &input.elements {
            for e in decode_windowed_values(chunk, &kv_coder(), &Coder::GlobalWindow)
                .expect("created elements decode")
            {
                let element = read_input(&e);
                let windows = assign_windows(&self.window_fn, element.ts);
                if !windows.is_empty() {
                    encode_input(&element, windows, &self.window_coder, &mut out);
                }
            }
        }
        BundleOutput {
            outputs: vec![(2, Bytes::from(out))],
            ..BundleOutput::default()
        }
    }

    fn sink(&self, input: &BundleInput) -> BundleOutput {
        let mut sink = self.sink.lock();
        for chunk in &input.elements {
            sink.extend(decode_panes(chunk, &self.window_coder));
        }
        BundleOutput::default()
    }
}

impl StageExecutor for FakeSdk {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let result = match input.stage {
            CREATE => Ok(self.create()),
            WINDOW => Ok(self.window(&input)),
            SINK => Ok(self.sink(&input)),
            other => Err(ExecError::Runner(format!("no SDK stage {other}"))),
        };
        let mut h = DefaultHasher::new();
        (self.jitter, &input.bundle_id).hash(&mut h);
        let yields = h.finish() % 4;
        async move {
            for _ in 0..yields {
                tokio::task::yield_now().await;
            }
            result
        }
        .boxed()
    }
}

fn pcollection(id: &str, value_coder: Coder, window_coder: Coder) -> PCollection {
    PCollection {
        id: id.into(),
        value_coder,
        window_coder,
        bounded: true,
    }
}

fn stage(name: &str, kind: StageKind, inputs: Vec<usize>, outputs: Vec<usize>) -> Stage {
    Stage {
        name: name.into(),
        kind,
        inputs,
        side_inputs: vec![],
        outputs,
    }
}

/// Runs `inputs` through a GroupByKey with `strategy`, cut into bundles as
/// `shape` says, and returns the panes the sink saw, sorted.
pub fn run_pipeline(
    inputs: &[Input],
    strategy: &WindowingStrategy,
    shape: &Shape,
) -> Result<Vec<Pane>, EngineError> {
    let window_coder = window_coder_for(strategy.window_fn == WindowFn::Global);
    let sdk = || StageKind::Sdk(SdkStage::default());
    let plan = Plan {
        pcollections: vec![
            pcollection("impulse", Coder::Bytes, Coder::GlobalWindow),
            pcollection("created", kv_coder(), Coder::GlobalWindow),
            pcollection("windowed", kv_coder(), window_coder.clone()),
            pcollection("grouped", grouped_coder(), window_coder.clone()),
        ],
        // Stage indices: impulse 0, CREATE, WINDOW, gbk 3, SINK.
        stages: vec![
            stage("impulse", StageKind::Impulse, vec![], vec![0]),
            stage("create", sdk(), vec![0], vec![1]),
            stage("window", sdk(), vec![1], vec![2]),
            stage(
                "gbk",
                StageKind::GroupByKey(strategy.clone()),
                vec![2],
                vec![3],
            ),
            stage("sink", sdk(), vec![3], vec![]),
        ],
    };
    let sdk = Arc::new(FakeSdk {
        inputs: inputs.to_vec(),
        window_fn: strategy.window_fn.clone(),
        window_coder,
        create_chunks: shape.create_chunks,
        jitter: shape.jitter,
        sink: Mutex::new(Vec::new()),
    });
    let config = EngineConfig {
        max_bundle_elements: shape.max_bundle_elements,
        chunk_bytes: shape.chunk_bytes,
        max_bundles_per_stage: shape.max_bundles_per_stage,
        streaming: shape.streaming,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let executor = sdk.clone();
    runtime.block_on(async move {
        // The sender must outlive the run: dropping it cancels the job.
        let (_cancel, cancelled) = watch::channel(false);
        let engine = Engine::new(plan, executor, config, "oracle", Arc::new(|| 0))?;
        tokio::time::timeout(Duration::from_secs(60), engine.run(cancelled))
            .await
            .map_err(|_| EngineError::Stuck("the run did not finish within 60 s".into()))??;
        Ok::<_, EngineError>(())
    })?;
    let mut panes = sdk.sink.lock().clone();
    panes.sort();
    Ok(panes)
}
