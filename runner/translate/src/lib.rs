//! Translation from Beam's pipeline proto to Refract's stage plan.
//!
//! This crate is the only place where Beam pipeline protos become the
//! engine's proto-free [`Plan`]. It
//! 1. validates what the pipeline asks for ([`validate`]);
//! 2. walks composites down to the leaves of a `graph`, turning Reshuffle
//!    into an identity flatten, lifting unlifted combiners and expanding
//!    splittable DoFns (`builder`, reading `payloads`; windowing strategies
//!    in `windowing`);
//! 3. fuses SDK transforms greedily into stages (`fuse`);
//! 4. rewrites the coders of every PCollection that crosses a stage boundary
//!    so the runner can walk their bytes (`coders`, `rewrite`);
//! 5. builds a ProcessBundleDescriptor per SDK stage (`descriptor`) and the
//!    engine's stages and PCollections (`assemble`).
//!
//! What a pipeline may ask for, and how large it may be, is checked before
//! anything walks it (`limits`): a pipeline comes from whoever can reach
//! the job port.

mod assemble;
mod builder;
mod coders;
mod compatibility;
mod descriptor;
mod drain;
mod environments;
mod error;
mod fuse;
mod graph;
mod limits;
mod merge;
mod payloads;
mod rewrite;
mod test_stream;
mod transcode;
mod validate;
mod windowing;

use std::collections::HashMap;

use refract_engine::plan::{PCollectionIdx, Plan, StageIdx};
use refract_proto::{fn_api, pipeline};

pub use compatibility::state_compatibility;
pub use environments::{EnvironmentKind, EnvironmentPreference, PreferenceError};
pub use error::TranslateError;
pub use fuse::Fusion;

/// What translation needs to know about the job and the runner.
#[derive(Debug, Clone)]
pub struct TranslateOptions {
    /// "host:port" of the runner's Fn API server, for RemoteGrpcPort.api_service_descriptor, state and timer descriptors.
    pub fn_api_url: String,
    /// Prefix for bundle-descriptor ids so they are unique across jobs (e.g. the job id).
    pub descriptor_id_prefix: String,
    /// Whether the job runs in streaming mode. The plan's shape does not
    /// depend on it (combiners are lifted in both modes when the trigger
    /// allows, as Prism does); it is recorded in the translation log.
    pub streaming: bool,
    /// Start the job draining (the `drain_on_start` experiment): every
    /// splittable DoFn's restrictions pass through its
    /// `truncate_sized_restrictions` step before processing, so unbounded
    /// sources stop and bounded ones may shorten their work, as Beam's
    /// drain defines it.
    pub drain: bool,
    /// Which alternative of an AnyOf environment (as expansion services
    /// return) the job's workers are started from.
    pub environment_preference: EnvironmentPreference,
    /// How SDK transforms are fused into stages: greedily
    /// ([`Fusion::Greedy`], the default) or, in strict mode, never across
    /// two of the pipeline's root transforms
    /// ([`Fusion::WithinRootTransforms`]: every element passing from one to
    /// the next crosses its PCollection's coder).
    pub fusion: Fusion,
}

/// A bundle descriptor that merges a custom window function's windows in
/// the SDK, for one GroupByKey stage.
#[derive(Debug, Clone)]
pub struct WindowMerger {
    /// source → merge_windows → sink.
    pub descriptor: fn_api::ProcessBundleDescriptor,
    /// The environment that knows the window function.
    pub environment_id: String,
    /// Data source transform id.
    pub source: String,
    /// Data sink transform id.
    pub sink: String,
}

/// A translated pipeline: the engine's plan plus what the SDK side needs.
#[derive(Debug, Clone)]
pub struct Translated {
    /// The proto-free stage graph the engine executes.
    pub plan: Plan,
    /// For every stage whose kind is StageKind::Sdk, keyed by StageIdx.
    pub sdk_stages: HashMap<StageIdx, SdkStageDescriptor>,
    /// transform id -> unique_name for every transform (metrics labels and error text use unique names).
    pub unique_names: HashMap<String, String>,
    /// The pipeline's environments by id, for starting SDK workers.
    pub environments: HashMap<String, pipeline::Environment>,
    /// For GroupByKey stages whose windows an SDK must merge, keyed by
    /// StageIdx.
    pub window_mergers: std::collections::HashMap<refract_engine::plan::StageIdx, WindowMerger>,
    /// GroupByKey outputs whose consumers all read them through a
    /// state-backed iterable coder (their data sources say so), so that
    /// the GroupByKey may hand out keys too large for memory
    /// (`EngineBuilder::state_backed_outputs`).
    pub state_backed_outputs: Vec<PCollectionIdx>,
}

/// The Fn API side of one SDK stage.
#[derive(Debug, Clone)]
pub struct SdkStageDescriptor {
    /// The bundle descriptor: fully built, coders transitively closed,
    /// environments included.
    pub descriptor: fn_api::ProcessBundleDescriptor,
    /// The environment whose workers run the stage.
    pub environment_id: String,
    /// Data-source transform id in the descriptor for the stage's main input (the engine's `Stage.inputs[0]`); None if the stage has no main input.
    pub input_transform_id: Option<String>,
    /// (sink transform id, engine PCollection index) for every output in Stage.outputs.
    pub outputs: Vec<(String, PCollectionIdx)>,
    /// (transform id, timer family id) of every timer family in the descriptor (the engine's SdkStage.timer_families, same order).
    pub timer_families: Vec<(String, String)>,
    /// For splittable process stages: the same stage with a
    /// `truncate_sized_restrictions` step before processing, used for the
    /// stage's bundles once the job drains.
    pub drain_descriptor: Option<fn_api::ProcessBundleDescriptor>,
    /// The stage's input feeds a splittable DoFn's process step: the runner
    /// may split its bundles.
    pub splittable: bool,
    /// Keyed state: what a split of a bundle gives back waits for the
    /// bundle's keys, so splitting it cannot share work.
    pub stateful: bool,
}

/// Check a pipeline at submission: every leaf transform URN, every
/// `requirements` entry, every environment URN, windowing strategies (window
/// fns incl. pickled/custom allowed; merge status), state/timer specs. The
/// error names what is unsupported and where, so a job is rejected at
/// `Prepare` rather than failing mid-run. It runs the whole translation
/// (with placeholder options) and discards the result, so a pipeline that
/// validates also translates.
pub fn validate(pipeline: &pipeline::Pipeline) -> Result<(), TranslateError> {
    let opts = TranslateOptions {
        fn_api_url: String::new(),
        descriptor_id_prefix: String::new(),
        streaming: false,
        drain: false,
        environment_preference: EnvironmentPreference::default(),
        fusion: Fusion::Greedy,
    };
    translate(pipeline, &opts).map(|_| ())
}

/// Translates a pipeline into the engine's plan and the SDK stages' bundle
/// descriptors. Runs every check of [`validate`] first.
pub fn translate(
    pipeline: &pipeline::Pipeline,
    opts: &TranslateOptions,
) -> Result<Translated, TranslateError> {
    let limits = limits::Limits::default();
    assemble::assemble(
        prepare(pipeline, opts.drain, &opts.environment_preference, &limits)?,
        opts,
        &limits,
    )
}

/// The checks that need no fusion, and the executable graph they produce.
/// Sizes come first: nothing walks a pipeline before its counts are known
/// to be within [`limits::Limits`].
fn prepare(
    pipeline: &pipeline::Pipeline,
    drain: bool,
    preference: &EnvironmentPreference,
    limits: &limits::Limits,
) -> Result<graph::Graph, TranslateError> {
    limits::check_counts(pipeline, limits)?;
    validate::requirements(pipeline)?;
    let pipeline = environments::resolve(pipeline, preference)?;
    let mut graph = builder::build(&pipeline, drain, limits)?;
    validate::windowing_strategies(&graph)?;
    transcode::flatten_inputs(&mut graph);
    transcode::test_stream_outputs(&mut graph);
    Ok(graph)
}
