//! The stage graph the engine executes.
//!
//! Translation turns a Beam pipeline into this: PCollections that carry
//! windowed elements, and stages that consume and produce them. A stage is
//! either executed by the runner itself (impulse, flatten, group-by-key) or
//! by an SDK harness (a fused chain of user transforms), through the
//! [`crate::executor::StageExecutor`] the engine is given. Nothing here refers
//! to a proto: SDK stages are known to the engine only by index, and their
//! bundle descriptors live with translation.

use std::collections::BTreeMap;

use crate::coder::Coder;
use serde::{Deserialize, Serialize};

mod ids;

pub use ids::{
    PCollectionIdx, PCollectionVec, StageIdx, StageVec, TransformId, TypedIndex, TypedVec,
};

/// A whole job's stage graph.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Every PCollection that crosses a stage boundary.
    pub pcollections: PCollectionVec<PCollection>,
    /// The stages, in no particular order.
    pub stages: StageVec<Stage>,
    /// What the pipeline calls its stages and transforms: a checkpoint
    /// records it, so that it restores onto another fusion of the
    /// pipeline (another Refract build, or a changed pipeline).
    pub names: PipelineNames,
}

/// The names a pipeline gives what a stage holds, which outlive the one
/// fusion that a build of Refract makes of it.
///
/// A stage's number, and the ids an SDK gives its transforms (Python's
/// carry a running count), change when fusion or the pipeline changes; a
/// transform's unique name does not. A checkpoint therefore says, per
/// stage, which transforms read its input (the queue is theirs), and, per
/// transform id its timers, state and side inputs are kept under, the
/// transform's unique name.
#[derive(Debug, Clone, Default)]
pub struct PipelineNames {
    /// Per stage, the unique names of the transforms that read its main
    /// input, sorted (for a runner-executed stage or a source, its own
    /// transform). A stage not listed (a plan built by hand) is known by
    /// its [`Stage::name`].
    pub stage_heads: StageVec<Vec<String>>,
    /// The unique name of every SDK transform in a stage, by id.
    pub transforms: BTreeMap<TransformId, String>,
}

impl Plan {
    /// Stage `idx`'s heads (see [`PipelineNames::stage_heads`]).
    pub fn stage_heads(&self, idx: StageIdx) -> Vec<String> {
        match self.names.stage_heads.get(idx) {
            Some(heads) if !heads.is_empty() => heads.clone(),
            _ => vec![self.stages[idx].name.clone()],
        }
    }
}

/// A PCollection between stages, with the coders the runner uses to read it.
#[derive(Debug, Clone)]
pub struct PCollection {
    /// The pipeline's PCollection id (for logs and metrics).
    pub id: String,
    /// Runner-side coder of the element (inside the windowed value).
    pub value_coder: Coder,
    /// Coder of its windows (`GlobalWindow`, `IntervalWindow` or `CustomWindow`).
    pub window_coder: Coder,
    /// Whether the PCollection is bounded.
    pub bounded: bool,
}

/// What joins the names of a fused SDK stage's transforms into the
/// stage's name: the UI and the failure view read them back with
/// [`fused_transform_names`].
pub const FUSED_NAME_SEPARATOR: char = '+';

/// The transform names a stage's name lists, in fusion order (one name
/// for a runner-executed stage).
pub fn fused_transform_names(stage_name: &str) -> std::str::Split<'_, char> {
    stage_name.split(FUSED_NAME_SEPARATOR)
}

/// One stage of the plan.
#[derive(Debug, Clone)]
pub struct Stage {
    /// Human-readable name: the unique names of its transforms joined by
    /// [`FUSED_NAME_SEPARATOR`], for logs and the UI.
    pub name: String,
    /// What the stage does.
    pub kind: StageKind,
    /// PCollections whose elements this stage consumes as its main input.
    /// Empty for sources. More than one only for flattens; a PCollection may
    /// appear twice (its elements are then consumed twice).
    pub inputs: Vec<PCollectionIdx>,
    /// Side inputs the stage reads through the state API.
    pub side_inputs: Vec<SideInput>,
    /// PCollections the stage produces.
    pub outputs: Vec<PCollectionIdx>,
}

impl Stage {
    /// Whether the stage works per key: a GroupByKey, or an SDK stage with
    /// user state or timers. Its input is `KV`, one key's elements must
    /// meet in one place (one key group of one engine), and never in two
    /// bundles at once.
    pub fn is_keyed(&self) -> bool {
        match &self.kind {
            StageKind::GroupByKey(_) => true,
            StageKind::Sdk(sdk) => sdk.stateful || !sdk.timer_families.is_empty(),
            StageKind::Impulse | StageKind::Flatten | StageKind::TestStream(_) => false,
        }
    }
}

/// What kind of work a stage is.
#[derive(Debug, Clone)]
pub enum StageKind {
    /// Emits one empty-bytes element in the global window at the minimum
    /// timestamp, then is done.
    Impulse,
    /// Copies every input element to its one output (Flatten, Reshuffle).
    Flatten,
    /// Groups `KV<K, V>` by encoded key and window per the windowing strategy,
    /// emitting `KV<K, Iterable<V>>`.
    GroupByKey(WindowingStrategy),
    /// A fused chain of SDK transforms, run through the stage executor.
    Sdk(SdkStage),
    /// Replays a scripted stream of elements, watermark advances and
    /// processing-time advances (`beam:transform:teststream:v1`). Each event
    /// is applied only once the rest of the pipeline has nothing left to do,
    /// so tests see deterministic results.
    TestStream(Vec<TestStreamEvent>),
}

/// One scripted event of a TestStream.
#[derive(Debug, Clone, PartialEq)]
pub enum TestStreamEvent {
    /// Emit elements (nested-encoded values in the output's coder, with
    /// their timestamps) into one output, in the global window.
    Elements {
        /// The output PCollection.
        output: PCollectionIdx,
        /// (value bytes, event time) pairs.
        elements: Vec<(bytes::Bytes, crate::time::Timestamp)>,
    },
    /// Advance the TestStream's output watermark.
    Watermark(crate::time::Timestamp),
    /// Advance the runner's processing-time clock by this many ms.
    ProcessingTime(i64),
}

/// The engine-relevant facts about an SDK-executed stage.
#[derive(Debug, Clone, Default)]
pub struct SdkStage {
    /// Keyed stateful processing: input is `KV<K, V>`, and user state and
    /// timers are scoped by key and window. Bundles of one key never overlap.
    pub stateful: bool,
    /// Timer families of the stage's transforms.
    pub timer_families: Vec<TimerFamily>,
    /// The stage's main input is a splittable DoFn's sized-restriction input:
    /// residuals returned by the SDK re-enter this stage's input.
    pub splittable: bool,
    /// Bundle finalization was requested by some DoFn of the stage.
    pub requires_finalization: bool,
    /// For stateful stages: the input's allowed lateness in ms. User state
    /// of a window is dropped once the input watermark passes the window's
    /// end plus this.
    pub allowed_lateness: i64,
    /// For stateful stages with a window-expiration callback: the timer the
    /// runner sets for every key and window the stage sees, firing once the
    /// window expired (before its state is collected).
    pub window_expiration: Option<WindowExpiration>,
    /// For stateful stages: elements are handed over only once the input
    /// watermark passed their timestamp, in timestamp order.
    pub time_sorted_input: bool,
    /// `@RequiresStableInput`: when the engine checkpoints, the stage is
    /// given only elements a durable checkpoint already holds, so a retry
    /// or a recovery replays exactly what the DoFn saw, even if the stage
    /// upstream is not deterministic.
    pub stable_input: bool,
}

/// The timer family a stateful transform wants fired as each of its windows
/// expires. The family is also one of the stage's [`TimerFamily`]s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowExpiration {
    /// Transform id (inside the stage's bundle descriptor).
    pub transform_id: TransformId,
    /// Timer family id.
    pub family_id: String,
}

/// A timer family declared by one transform of an SDK stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerFamily {
    /// Transform id (inside the stage's bundle descriptor).
    pub transform_id: TransformId,
    /// Timer family id (Python: `ts-<name>`).
    pub family_id: String,
    /// Event or processing time.
    pub domain: TimeDomain,
    /// Runner-side coder of the timer's user key.
    pub key_coder: Coder,
    /// Coder of the timer's windows.
    pub window_coder: Coder,
}

/// Which clock a timer is set against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeDomain {
    /// Fires when the input watermark passes the timer's timestamp.
    EventTime,
    /// Fires when the runner's clock passes the timer's timestamp.
    ProcessingTime,
}

/// A side input of an SDK stage.
#[derive(Debug, Clone)]
pub struct SideInput {
    /// Which side input: the transform (in the stage's bundle descriptor)
    /// that reads it, and its tag there.
    pub id: SideInputId,
    /// The PCollection read.
    pub pcollection: PCollectionIdx,
    /// How the SDK reads it.
    pub access: SideInputAccess,
    /// Whether the side input's trigger fires panes before its windows
    /// end. In streaming, a reader may then read a globally windowed side
    /// input from its first pane on; otherwise it waits, as in batch, for
    /// the watermark to pass the window (the Go SDK, for one, expects its
    /// `passert` side inputs to be complete).
    pub fires_early: bool,
}

/// Which side input of a pipeline: the transform that reads it and its
/// local tag there (a PCollection read as a side input by two transforms
/// is two side inputs, each materialized for its reader).
///
/// Checkpoints encode it as the (transform, tag) pair it replaced, and it
/// sorts in that order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SideInputId {
    /// The reading transform's id (in its stage's bundle descriptor).
    pub transform_id: TransformId,
    /// The side input's local tag (e.g. `side0`).
    pub tag: String,
}

impl SideInputId {
    /// The side input `tag` of transform `transform_id`.
    pub fn new(transform_id: impl Into<TransformId>, tag: impl Into<String>) -> Self {
        SideInputId {
            transform_id: transform_id.into(),
            tag: tag.into(),
        }
    }
}

/// The side-input access pattern (`beam:side_input:*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideInputAccess {
    /// All values of a window.
    Iterable,
    /// Values by key of a `KV` PCollection.
    Multimap,
}

/// How a PCollection is windowed and triggered, for grouping.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowingStrategy {
    /// How elements were assigned to windows (and whether windows merge).
    pub window_fn: WindowFn,
    /// When panes fire.
    pub trigger: Trigger,
    /// Whether later panes include earlier panes' elements.
    pub accumulation: AccumulationMode,
    /// The timestamp of a grouped output.
    pub output_time: OutputTime,
    /// How late (past the end of the window) data is still accepted, in ms.
    pub allowed_lateness: i64,
    /// Whether a final pane is emitted when a window closes with no new data.
    pub closing_behavior: ClosingBehavior,
    /// Whether an on-time pane is emitted when it would be empty.
    pub on_time_behavior: OnTimeBehavior,
    /// What data arriving after the trigger finished does.
    pub finished_trigger: FinishedTrigger,
}

/// What a window's trigger does with data that arrives after it finished
/// (an `AfterCount(n)` that fired, an `OrFinally` whose end came).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishedTrigger {
    /// Beam's rule (Java, Go, Flink, Dataflow): the window is closed, and
    /// later data for it is dropped.
    ClosesWindow,
    /// Prism's rule, which Python's `PrismRunnerTest` expects: later data
    /// starts the trigger again, and what it does not fire goes out when
    /// the window closes.
    Restarts,
}

impl WindowingStrategy {
    /// Global windows with the default trigger: what an unwindowed pipeline has.
    pub fn global_default() -> Self {
        WindowingStrategy {
            window_fn: WindowFn::Global,
            trigger: Trigger::Default,
            accumulation: AccumulationMode::Discarding,
            output_time: OutputTime::EndOfWindow,
            allowed_lateness: 0,
            closing_behavior: ClosingBehavior::EmitIfNonEmpty,
            on_time_behavior: OnTimeBehavior::FireIfNonEmpty,
            finished_trigger: FinishedTrigger::Restarts,
        }
    }
}

/// A window function, as far as the runner must know it.
#[derive(Debug, Clone, PartialEq)]
pub enum WindowFn {
    /// One global window.
    Global,
    /// Fixed windows of `size` ms, shifted by `offset` ms.
    Fixed {
        /// Window length.
        size: i64,
        /// Offset from the epoch.
        offset: i64,
    },
    /// Sliding windows.
    Sliding {
        /// Window length.
        size: i64,
        /// Distance between window starts.
        period: i64,
        /// Offset from the epoch.
        offset: i64,
    },
    /// Session windows merged by the runner when they are within `gap` ms.
    Sessions {
        /// Inactivity gap.
        gap: i64,
    },
    /// A window function the runner cannot evaluate (assigned by the SDK).
    Custom {
        /// Whether its windows merge (merging happens in the SDK).
        merging: bool,
    },
}

impl WindowFn {
    /// Whether windows of this function are merged at grouping time.
    pub fn is_merging(&self) -> bool {
        matches!(
            self,
            WindowFn::Sessions { .. } | WindowFn::Custom { merging: true }
        )
    }
}

/// A trigger (`beam_runner_api.proto`'s `Trigger`). What can be told of
/// one before it runs (when it may fire) is answered by its methods in
/// [`crate::trigger`]; how it runs, by [`crate::trigger::TriggerState`].
#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    /// Fire once when the watermark passes the end of the window, and for
    /// every late element after that.
    Default,
    /// Fire once the watermark passes the end of the window, with optional
    /// early and late firings.
    AfterEndOfWindow {
        /// Fires before the end of the window.
        early: Option<Box<Trigger>>,
        /// Fires after the end of the window.
        late: Option<Box<Trigger>>,
    },
    /// Fire after `count` elements.
    ElementCount(i64),
    /// Fire after processing time passes the first element's arrival plus delays.
    AfterProcessingTime {
        /// Delay after the first element, in ms (sum of the delay transforms).
        delay_ms: i64,
        /// Align to multiples of this period (ms), with this offset, if set.
        align: Option<(i64, i64)>,
    },
    /// Synchronized processing time (treated as processing time).
    AfterSynchronizedProcessingTime,
    /// Fire whenever every sub-trigger has fired.
    AfterAll(Vec<Trigger>),
    /// Fire whenever any sub-trigger fires.
    AfterAny(Vec<Trigger>),
    /// Run sub-triggers in order.
    AfterEach(Vec<Trigger>),
    /// Fire for every element.
    Always,
    /// Never fire (only the final GC pane).
    Never,
    /// Fire on `main`, and finish once `finally` fires.
    OrFinally {
        /// The repeating part.
        main: Box<Trigger>,
        /// The terminating part.
        finally: Box<Trigger>,
    },
    /// Repeat the sub-trigger forever.
    Repeat(Box<Trigger>),
}

/// Whether a later pane includes earlier panes' data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccumulationMode {
    /// Each pane holds only new data.
    Discarding,
    /// Each pane holds all data so far.
    Accumulating,
}

/// The timestamp of a grouped output element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputTime {
    /// The window's max timestamp.
    EndOfWindow,
    /// The latest input timestamp in the pane.
    LatestInPane,
    /// The earliest input timestamp in the pane.
    EarliestInPane,
}

/// Whether a window's closing produces a pane when nothing new arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClosingBehavior {
    /// Always emit a final pane.
    EmitAlways,
    /// Only if there is new data.
    EmitIfNonEmpty,
}

/// Whether the on-time pane fires when empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeBehavior {
    /// Always fire the on-time pane.
    FireAlways,
    /// Only if non-empty.
    FireIfNonEmpty,
}
