//! The element manager: runs a [`Plan`] to completion.
//!
//! It keeps, per stage, the elements waiting to be processed, the bundles in
//! flight, grouping buffers and timers, and from those the stage's input and
//! output watermarks. One task owns all of that state; bundles run
//! concurrently on the executor and report back over a channel, and each
//! report is committed — outputs routed to consumers, state written, timers
//! stored, holds released — in one step, or, for a failed bundle, dropped.
//!
//! A job is done when every stage's output watermark has reached +∞. If no
//! bundle is in flight, nothing is scheduled or delayed, and yet some stage
//! has not finished, the job cannot make progress: it fails with the names
//! of the stages holding it, rather than hanging.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use thiserror::Error;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::coder::{
    decode_timers, decode_windowed_values, encode_windowed_value, CoderError, DecodedElement,
    PaneInfo, WindowedValueHeader,
};
use crate::executor::{BundleInput, BundleOutput, ExecError, StageExecutor, TimerInput};
use crate::grouping::GroupingBuffer;
use crate::plan::{
    PCollectionIdx, Plan, SideInputAccess, StageIdx, StageKind, TestStreamEvent, TimeDomain,
};
use crate::store::{BundleOverlay, SideInputStore, UserStateStore};
use crate::time::{Timestamp, MAX_TIMESTAMP, MIN_TIMESTAMP};
use crate::timers::{FiredTimer, TimerStore};
use crate::window::Window;

/// Why a job stopped without finishing.
#[derive(Debug, Error)]
pub enum EngineError {
    /// A bundle failed; the error carries the SDK's own text.
    #[error("{error}")]
    BundleFailed {
        /// The stage's name (for logs; not part of the message).
        stage: String,
        /// What went wrong.
        error: ExecError,
    },
    /// Bytes of a PCollection could not be read with its coder.
    #[error("cannot decode elements of PCollection '{pcollection}': {source}")]
    Decode {
        /// The PCollection's id.
        pcollection: String,
        /// The coder error.
        source: CoderError,
    },
    /// No work can run but the pipeline is not finished.
    #[error("the pipeline cannot make progress: {0}")]
    Stuck(String),
    /// The plan is not executable (e.g. a cycle).
    #[error("invalid plan: {0}")]
    InvalidPlan(String),
    /// The job was cancelled.
    #[error("cancelled")]
    Cancelled,
}

/// Tunables of one run.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Most elements in one bundle.
    pub max_bundle_elements: usize,
    /// Most bytes of elements in one data chunk sent to the executor.
    pub chunk_bytes: usize,
    /// Most bundles of one stateless stage in flight at once.
    pub max_bundles_per_stage: usize,
    /// Streaming semantics: triggers are evaluated after every element
    /// instead of after every batch of input a grouping stage receives.
    pub streaming: bool,
    /// How many times in a row a stage's bundles may fail before the job
    /// fails with the last error. A failed bundle leaves nothing behind, so
    /// its input is simply processed again.
    pub max_attempts: u32,
    /// Wait before the first retry of a failed bundle's input; it doubles
    /// with every further failure, up to ten seconds.
    pub retry_backoff: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_bundle_elements: 100_000,
            chunk_bytes: 1 << 20,
            max_bundles_per_stage: 4,
            streaming: false,
            max_attempts: 4,
            retry_backoff: Duration::from_millis(100),
        }
    }
}

/// What the run did, for logs and tests.
#[derive(Debug, Default, Clone)]
pub struct RunSummary {
    /// Bundles committed.
    pub bundles: u64,
    /// Late elements dropped by grouping.
    pub dropped_late: u64,
    /// Late elements dropped, per grouping stage (by stage name), for the
    /// job's metrics.
    pub dropped_late_by_stage: Vec<(String, u64)>,
}

/// A multiset of timestamps, for holds.
#[derive(Debug, Default)]
struct Holds(BTreeMap<Timestamp, usize>);

impl Holds {
    fn add(&mut self, ts: Timestamp) {
        *self.0.entry(ts).or_default() += 1;
    }
    fn remove(&mut self, ts: Timestamp) {
        if let Some(n) = self.0.get_mut(&ts) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(&ts);
            }
        }
    }
    fn min(&self) -> Option<Timestamp> {
        self.0.keys().next().copied()
    }
}

/// Run-time state of one stage.
struct StageRt {
    pending: VecDeque<DecodedElement>,
    pending_holds: Holds,
    in_flight: usize,
    in_flight_holds: Holds,
    delayed: Vec<(Instant, DecodedElement, Timestamp)>,
    grouping: Option<GroupingBuffer>,
    timers: TimerStore,
    input_wm: Timestamp,
    output_wm: Timestamp,
    impulse_done: bool,
    /// TestStream: index of the next event to apply.
    stream_cursor: usize,
    /// TestStream: the watermark its events advanced to.
    stream_wm: Timestamp,
    /// Grouping: a window-merge request is with the SDK.
    merging: bool,
    /// Stateful stages: the input watermark of the last state collection.
    state_gc_wm: Timestamp,
    /// Bundles of this stage that failed in a row.
    failures: u32,
    /// No bundle of this stage starts before this (retry backoff).
    retry_at: Option<Instant>,
}

/// Where elements of a PCollection go.
#[derive(Default, Clone)]
struct Consumers {
    /// Stages reading it as a main input (with multiplicity).
    stages: Vec<StageIdx>,
    /// Side inputs reading it: (transform id, tag, access).
    side_inputs: Vec<(String, String, SideInputAccess)>,
}

/// How complete one side input of a stage is.
struct SideGate {
    /// The side input producer's output watermark.
    watermark: Timestamp,
    /// The side input is in the global window.
    global: bool,
    /// Some value of it has arrived.
    has_values: bool,
}

impl SideGate {
    /// Whether main-input element `e` may read this side input now. The
    /// SDK maps main-input windows to side-input windows itself, so the
    /// runner waits until the side input's watermark has passed the end of
    /// the window the element could map to: the global window's end for a
    /// globally windowed side input, else the element's own windows' ends
    /// (the same window function on both sides is the common case). In
    /// streaming a globally windowed side input is readable as soon as its
    /// first pane arrived, and later panes update it.
    fn allows(&self, e: &DecodedElement, streaming: bool) -> bool {
        if self.watermark >= MAX_TIMESTAMP {
            return true;
        }
        if self.global {
            return self.watermark > crate::time::GLOBAL_WINDOW_MAX_TIMESTAMP
                || (streaming && self.has_values);
        }
        let end = e
            .header
            .windows
            .iter()
            .map(Window::max_timestamp)
            .max()
            .unwrap_or(e.header.timestamp);
        self.watermark > end
    }
}

/// A bundle in flight, remembered until it reports back.
struct InFlight {
    stage: StageIdx,
    holds: Vec<Timestamp>,
    overlay: Arc<BundleOverlay>,
    fired_timers: Vec<(TimeDomain, FiredTimer)>,
    /// The bundle's input, put back for a retry if the bundle fails.
    elements: Vec<DecodedElement>,
}

enum Report {
    /// An SDK stage's bundle finished.
    Bundle {
        bundle: u64,
        result: Result<BundleOutput, ExecError>,
    },
    /// The SDK answered a window-merge request of a grouping stage.
    Merge {
        stage: StageIdx,
        keys: Vec<Bytes>,
        result: Result<Bytes, ExecError>,
    },
}

/// Runs one plan.
pub struct Engine {
    plan: Plan,
    executor: Arc<dyn StageExecutor>,
    config: EngineConfig,
    stages: Vec<StageRt>,
    consumers: Vec<Consumers>,
    producers: Vec<Option<StageIdx>>,
    topo: Vec<StageIdx>,
    side_inputs: Arc<Mutex<SideInputStore>>,
    user_state: Vec<Arc<Mutex<UserStateStore>>>,
    in_flight: HashMap<u64, InFlight>,
    merges_in_flight: usize,
    next_bundle: u64,
    bundle_prefix: String,
    summary: RunSummary,
    clock: Arc<dyn Fn() -> Timestamp + Send + Sync>,
    /// Processing time advanced by TestStream events, added to `clock`.
    clock_offset: i64,
    /// Turns true when the job should drain.
    drain: Option<watch::Receiver<bool>>,
    /// The job is draining: delayed work runs at once, and splittable
    /// stages truncate their restrictions.
    draining: bool,
}

impl Engine {
    /// Prepare a run of `plan`. `bundle_prefix` makes bundle ids unique
    /// across jobs sharing workers; `clock` is processing time in ms.
    pub fn new(
        plan: Plan,
        executor: Arc<dyn StageExecutor>,
        config: EngineConfig,
        bundle_prefix: impl Into<String>,
        clock: Arc<dyn Fn() -> Timestamp + Send + Sync>,
    ) -> Result<Self, EngineError> {
        let n = plan.stages.len();
        let mut consumers = vec![Consumers::default(); plan.pcollections.len()];
        let mut producers = vec![None; plan.pcollections.len()];
        for (idx, stage) in plan.stages.iter().enumerate() {
            for &p in &stage.inputs {
                let c = consumers.get_mut(p).ok_or_else(|| {
                    EngineError::InvalidPlan(format!(
                        "stage '{}' reads unknown PCollection {p}",
                        stage.name
                    ))
                })?;
                c.stages.push(idx);
            }
            for si in &stage.side_inputs {
                let c = consumers.get_mut(si.pcollection).ok_or_else(|| {
                    EngineError::InvalidPlan(format!(
                        "stage '{}' reads unknown side input PCollection {}",
                        stage.name, si.pcollection
                    ))
                })?;
                c.side_inputs
                    .push((si.transform_id.clone(), si.tag.clone(), si.access));
            }
            for &p in &stage.outputs {
                let slot = producers.get_mut(p).ok_or_else(|| {
                    EngineError::InvalidPlan(format!(
                        "stage '{}' writes unknown PCollection {p}",
                        stage.name
                    ))
                })?;
                if slot.is_some() {
                    return Err(EngineError::InvalidPlan(format!(
                        "PCollection '{}' has two producers",
                        plan.pcollections[p].id
                    )));
                }
                *slot = Some(idx);
            }
        }
        let topo = topological_order(&plan, &producers)?;
        let mut stages = Vec::with_capacity(n);
        for stage in &plan.stages {
            let grouping = match &stage.kind {
                StageKind::GroupByKey(strategy) => {
                    let input = stage.inputs.first().ok_or_else(|| {
                        EngineError::InvalidPlan(format!(
                            "GroupByKey '{}' has no input",
                            stage.name
                        ))
                    })?;
                    let pc = &plan.pcollections[*input];
                    Some(GroupingBuffer::new(
                        strategy.clone(),
                        pc.value_coder.clone(),
                        pc.window_coder.clone(),
                    ))
                }
                _ => None,
            };
            stages.push(StageRt {
                pending: VecDeque::new(),
                pending_holds: Holds::default(),
                in_flight: 0,
                in_flight_holds: Holds::default(),
                delayed: Vec::new(),
                grouping,
                timers: TimerStore::default(),
                input_wm: MIN_TIMESTAMP,
                output_wm: MIN_TIMESTAMP,
                impulse_done: false,
                stream_cursor: 0,
                stream_wm: MIN_TIMESTAMP,
                merging: false,
                state_gc_wm: MIN_TIMESTAMP,
                failures: 0,
                retry_at: None,
            });
        }
        let user_state = (0..n).map(|_| Arc::default()).collect();
        Ok(Engine {
            plan,
            executor,
            config,
            stages,
            consumers,
            producers,
            topo,
            side_inputs: Arc::default(),
            user_state,
            in_flight: HashMap::new(),
            merges_in_flight: 0,
            next_bundle: 0,
            bundle_prefix: bundle_prefix.into(),
            summary: RunSummary::default(),
            clock,
            clock_offset: 0,
            drain: None,
            draining: false,
        })
    }

    /// Drain the job when `drain` turns true: sources stop (splittable
    /// restrictions are truncated), delayed work runs at once, windows
    /// flush as the watermarks reach +∞, and the run ends normally.
    pub fn with_drain(mut self, drain: watch::Receiver<bool>) -> Self {
        self.drain = Some(drain);
        self
    }

    /// Run until every stage is done, a bundle fails, or `cancel` turns true.
    pub async fn run(
        mut self,
        mut cancel: watch::Receiver<bool>,
    ) -> Result<RunSummary, EngineError> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Report>();
        let mut drain = self.drain.take();
        loop {
            if *cancel.borrow() {
                return Err(EngineError::Cancelled);
            }
            if !self.draining && drain.as_ref().is_some_and(|d| *d.borrow()) {
                info!("draining");
                self.draining = true;
                drain = None;
                let now = Instant::now();
                for s in &mut self.stages {
                    for d in &mut s.delayed {
                        d.0 = now;
                    }
                }
                self.release_delayed();
            }
            self.advance()?;
            self.schedule(&tx)?;
            if self.idle() && self.step_test_streams()? {
                continue;
            }
            if self.idle() && self.all_done() {
                self.summary.dropped_late_by_stage = self
                    .stages
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| {
                        let dropped = s.grouping.as_ref()?.dropped_late();
                        (dropped > 0).then(|| (self.plan.stages[i].name.clone(), dropped))
                    })
                    .collect();
                self.summary.dropped_late = self
                    .summary
                    .dropped_late_by_stage
                    .iter()
                    .map(|(_, n)| n)
                    .sum();
                info!(bundles = self.summary.bundles, "pipeline finished");
                return Ok(self.summary);
            }
            let next_wakeup = self.next_wakeup();
            if self.idle() && next_wakeup.is_none() {
                return Err(EngineError::Stuck(self.describe_unfinished()));
            }
            let sleep_until =
                next_wakeup.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                report = rx.recv() => {
                    if let Some(report) = report {
                        self.commit(report)?;
                    }
                }
                _ = tokio::time::sleep_until(sleep_until) => {
                    self.release_delayed();
                }
                changed = cancel.changed() => {
                    if changed.is_err() || *cancel.borrow() {
                        return Err(EngineError::Cancelled);
                    }
                }
                _ = async {
                    match drain.as_mut() {
                        Some(d) => {
                            if d.changed().await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        }
                        None => std::future::pending::<()>().await,
                    }
                } => {}
            }
        }
    }

    /// When something time-driven is due next: a delayed residual, a retry
    /// after backoff, a processing-time trigger or a processing-time timer.
    fn next_wakeup(&self) -> Option<Instant> {
        let delayed = self
            .stages
            .iter()
            .flat_map(|s| s.delayed.iter().map(|(at, _, _)| *at).chain(s.retry_at))
            .min();
        let processing = self
            .stages
            .iter()
            .filter_map(|s| {
                let grouping = s.grouping.as_ref().and_then(GroupingBuffer::next_deadline);
                let timers = s.timers.next_processing_time();
                match (grouping, timers) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            })
            .min()
            .map(|deadline| {
                let wait = deadline.saturating_sub(self.now()).max(0);
                Instant::now() + Duration::from_millis(wait as u64)
            });
        match (delayed, processing) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Drop the user state of windows that expired (their end plus the
    /// allowed lateness is behind the input watermark), once per watermark
    /// advance and only between bundles, so no bundle sees state vanish.
    fn collect_expired_state(
        &mut self,
        idx: StageIdx,
        input_wm: Timestamp,
    ) -> Result<(), EngineError> {
        let StageKind::Sdk(sdk) = &self.plan.stages[idx].kind else {
            return Ok(());
        };
        let s = &mut self.stages[idx];
        if !sdk.stateful || s.in_flight > 0 || !s.pending.is_empty() || input_wm <= s.state_gc_wm {
            return Ok(());
        }
        let Some(&input) = self.plan.stages[idx].inputs.first() else {
            return Ok(());
        };
        let lateness = sdk.allowed_lateness;
        let gc_time = |w: &Window| {
            w.max_timestamp()
                .saturating_add(lateness)
                .min(crate::time::GLOBAL_WINDOW_MAX_TIMESTAMP)
        };
        // Timers that can no longer fire go with their window; those due by
        // its GC time fire (and may read its state) before it goes.
        // (At the end of the input every timer fires instead.)
        if input_wm < MAX_TIMESTAMP {
            s.timers.drop_expired(input_wm, gc_time);
        }
        let timer_windows = s.timers.windows();
        s.state_gc_wm = input_wm;
        let window_coder = &self.plan.pcollections[input].window_coder;
        self.user_state[idx].lock().retain_windows(|bytes| {
            match window_coder.decode_window(bytes) {
                Ok((w, _)) => timer_windows.contains(&w) || gc_time(&w) >= input_wm,
                // Keep what cannot be read; it is freed with the job.
                Err(_) => true,
            }
        });
        Ok(())
    }

    /// Nothing is running on the executor: no bundle and no merge request.
    fn idle(&self) -> bool {
        self.in_flight.is_empty() && self.merges_in_flight == 0
    }

    /// Processing time, in ms: the clock plus what TestStreams advanced it by.
    fn now(&self) -> Timestamp {
        (self.clock)().saturating_add(self.clock_offset)
    }

    /// Apply the next event of the first TestStream that has one left.
    /// Called only when nothing else can run, so every event sees the
    /// pipeline quiescent. Returns whether an event was applied.
    fn step_test_streams(&mut self) -> Result<bool, EngineError> {
        for i in 0..self.topo.len() {
            let idx = self.topo[i];
            let StageKind::TestStream(events) = &self.plan.stages[idx].kind else {
                continue;
            };
            let Some(event) = events.get(self.stages[idx].stream_cursor).cloned() else {
                continue;
            };
            self.stages[idx].stream_cursor += 1;
            match event {
                TestStreamEvent::Elements { output, elements } => {
                    let pc = &self.plan.pcollections[output];
                    let mut bytes = Vec::new();
                    for (value, timestamp) in &elements {
                        let header = WindowedValueHeader {
                            timestamp: *timestamp,
                            windows: vec![Window::Global],
                            pane: PaneInfo::NO_FIRING,
                        };
                        encode_windowed_value(&header, &pc.window_coder, value, &mut bytes)
                            .map_err(|source| EngineError::Decode {
                                pcollection: pc.id.clone(),
                                source,
                            })?;
                    }
                    self.route(output, Bytes::from(bytes))?;
                }
                TestStreamEvent::Watermark(wm) => {
                    let s = &mut self.stages[idx];
                    s.stream_wm = s.stream_wm.max(wm);
                }
                TestStreamEvent::ProcessingTime(ms) => {
                    self.clock_offset = self.clock_offset.saturating_add(ms.max(0));
                }
            }
            debug!(stage = %self.plan.stages[idx].name, "applied a TestStream event");
            return Ok(true);
        }
        Ok(false)
    }

    fn all_done(&self) -> bool {
        self.stages.iter().all(|s| s.output_wm >= MAX_TIMESTAMP)
    }

    fn describe_unfinished(&self) -> String {
        let names: Vec<String> = self
            .topo
            .iter()
            .filter(|&&i| self.stages[i].output_wm < MAX_TIMESTAMP)
            .map(|&i| {
                let s = &self.stages[i];
                format!(
                    "stage '{}' (input watermark {}, output watermark {}, {} pending elements, {} timers)",
                    self.plan.stages[i].name,
                    s.input_wm,
                    s.output_wm,
                    s.pending.len(),
                    if s.timers.is_empty() { "no" } else { "pending" }
                )
            })
            .take(3)
            .collect();
        format!(
            "nothing can run, yet these stages are unfinished: {}",
            names.join("; ")
        )
    }

    fn release_delayed(&mut self) {
        let now = Instant::now();
        for s in &mut self.stages {
            let (ready, waiting): (Vec<_>, Vec<_>) =
                s.delayed.drain(..).partition(|(at, _, _)| *at <= now);
            s.delayed = waiting;
            for (_, e, _) in ready {
                s.pending_holds.add(e.header.timestamp);
                s.pending.push_back(e);
            }
        }
    }

    /// Recompute watermarks, run runner-executed stages and fire ready
    /// panes, until nothing changes.
    fn advance(&mut self) -> Result<(), EngineError> {
        loop {
            let mut changed = false;
            for i in 0..self.topo.len() {
                let idx = self.topo[i];
                let input_wm = self.input_watermark(idx);
                self.stages[idx].input_wm = input_wm;
                match self.plan.stages[idx].kind {
                    StageKind::Impulse => {
                        if !self.stages[idx].impulse_done {
                            self.stages[idx].impulse_done = true;
                            let mut bytes = Vec::new();
                            let header = WindowedValueHeader {
                                timestamp: MIN_TIMESTAMP,
                                windows: vec![Window::Global],
                                pane: PaneInfo::NO_FIRING,
                            };
                            for &out in &self.plan.stages[idx].outputs.clone() {
                                bytes.clear();
                                let pc = &self.plan.pcollections[out];
                                encode_windowed_value(
                                    &header,
                                    &pc.window_coder,
                                    &[0u8],
                                    &mut bytes,
                                )
                                .map_err(|source| {
                                    EngineError::Decode {
                                        pcollection: pc.id.clone(),
                                        source,
                                    }
                                })?;
                                self.route(out, Bytes::from(bytes.clone()))?;
                            }
                            changed = true;
                        }
                    }
                    StageKind::Flatten => {
                        if !self.stages[idx].pending.is_empty() {
                            let elements: Vec<DecodedElement> =
                                self.stages[idx].pending.drain(..).collect();
                            self.stages[idx].pending_holds = Holds::default();
                            for &out in &self.plan.stages[idx].outputs.clone() {
                                for e in &elements {
                                    self.route_element(out, e.clone())?;
                                }
                            }
                            changed = true;
                        }
                    }
                    StageKind::GroupByKey(_) => {
                        let mut out = Vec::new();
                        let now = self.now();
                        let merging = self.stages[idx].merging;
                        let fired = match self.stages[idx].grouping.as_mut() {
                            Some(g) if g.needs_merge() || merging => 0,
                            Some(g) => g.evaluate(input_wm, now, &mut out).map_err(|source| {
                                EngineError::Decode {
                                    pcollection: format!(
                                        "output of '{}'",
                                        self.plan.stages[idx].name
                                    ),
                                    source,
                                }
                            })?,
                            None => 0,
                        };
                        if fired > 0 {
                            let bytes = Bytes::from(out);
                            for &o in &self.plan.stages[idx].outputs.clone() {
                                self.route(o, bytes.clone())?;
                            }
                            changed = true;
                        }
                    }
                    StageKind::Sdk(_) => self.collect_expired_state(idx, input_wm)?,
                    StageKind::TestStream(_) => {}
                }
                let out_wm = self.output_watermark(idx, input_wm);
                let s = &mut self.stages[idx];
                if out_wm > s.output_wm {
                    s.output_wm = out_wm;
                    changed = true;
                    if out_wm >= MAX_TIMESTAMP {
                        debug!(stage = %self.plan.stages[idx].name, "stage finished");
                        self.on_stage_finished(idx);
                    }
                }
            }
            if !changed {
                return Ok(());
            }
        }
    }

    fn on_stage_finished(&mut self, idx: StageIdx) {
        let outputs = self.plan.stages[idx].outputs.clone();
        let mut store = self.side_inputs.lock();
        for out in outputs {
            for (transform, tag, _) in &self.consumers[out].side_inputs {
                store.mark_ready(transform, tag);
            }
        }
    }

    fn input_watermark(&self, idx: StageIdx) -> Timestamp {
        let stage = &self.plan.stages[idx];
        if stage.inputs.is_empty() {
            return MAX_TIMESTAMP;
        }
        stage
            .inputs
            .iter()
            .map(|&p| {
                self.producers[p]
                    .map(|producer| self.stages[producer].output_wm)
                    .unwrap_or(MAX_TIMESTAMP)
            })
            .min()
            .unwrap_or(MAX_TIMESTAMP)
    }

    fn output_watermark(&self, idx: StageIdx, input_wm: Timestamp) -> Timestamp {
        let s = &self.stages[idx];
        match &self.plan.stages[idx].kind {
            StageKind::Impulse => {
                return if s.impulse_done {
                    MAX_TIMESTAMP
                } else {
                    MIN_TIMESTAMP
                };
            }
            StageKind::TestStream(events) => {
                return if s.stream_cursor >= events.len() {
                    MAX_TIMESTAMP
                } else {
                    s.stream_wm
                };
            }
            _ => {}
        }
        let holds = [
            s.pending_holds.min(),
            s.in_flight_holds.min(),
            s.grouping.as_ref().and_then(GroupingBuffer::hold),
            s.timers.hold(),
            s.delayed.iter().map(|(_, _, h)| *h).min(),
        ];
        let mut wm = input_wm;
        for h in holds.into_iter().flatten() {
            wm = wm.min(h);
        }
        // Something still pending holds the stage below +∞ even if its
        // timestamp is +∞ (e.g. a timer at the end of time).
        let busy = s.in_flight > 0
            || !s.pending.is_empty()
            || !s.timers.is_empty()
            || !s.delayed.is_empty()
            || s.grouping.as_ref().is_some_and(|g| !g.is_empty());
        if busy && wm >= MAX_TIMESTAMP {
            wm = MAX_TIMESTAMP - 1;
        }
        wm
    }

    /// Deliver encoded windowed values produced into PCollection `pcoll`.
    fn route(&mut self, pcoll: PCollectionIdx, bytes: Bytes) -> Result<(), EngineError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let pc = &self.plan.pcollections[pcoll];
        let elements = decode_windowed_values(&bytes, &pc.value_coder, &pc.window_coder).map_err(
            |source| EngineError::Decode {
                pcollection: pc.id.clone(),
                source,
            },
        )?;
        for e in elements {
            self.route_element(pcoll, e)?;
        }
        Ok(())
    }

    fn route_element(
        &mut self,
        pcoll: PCollectionIdx,
        e: DecodedElement,
    ) -> Result<(), EngineError> {
        let consumers = &self.consumers[pcoll];
        if !consumers.side_inputs.is_empty() {
            let pc = &self.plan.pcollections[pcoll];
            let mut store = self.side_inputs.lock();
            for window in &e.header.windows {
                let mut wbytes = Vec::new();
                pc.window_coder
                    .encode_window(window, &mut wbytes)
                    .map_err(|source| EngineError::Decode {
                        pcollection: pc.id.clone(),
                        source,
                    })?;
                let wbytes = Bytes::from(wbytes);
                for (transform, tag, access) in &consumers.side_inputs {
                    match access {
                        SideInputAccess::Iterable => {
                            store.add_iterable(transform, tag, wbytes.clone(), e.value.clone())
                        }
                        SideInputAccess::Multimap => {
                            let n = pc.value_coder.kv_key_len(&e.value).map_err(|source| {
                                EngineError::Decode {
                                    pcollection: pc.id.clone(),
                                    source,
                                }
                            })?;
                            store.add_multimap(
                                transform,
                                tag,
                                wbytes.clone(),
                                e.value.slice(..n),
                                e.value.slice(n..),
                            );
                        }
                    }
                }
            }
        }
        for &stage in &self.consumers[pcoll].stages.clone() {
            let input_wm = self.stages[stage].input_wm;
            let now = self.now();
            let streaming = self.config.streaming;
            let s = &mut self.stages[stage];
            match s.grouping.as_mut() {
                Some(g) => {
                    g.add(&e, input_wm, now)
                        .map_err(|source| EngineError::Decode {
                            pcollection: self.plan.pcollections[pcoll].id.clone(),
                            source,
                        })?;
                    if streaming && !g.needs_merge() {
                        let mut out = Vec::new();
                        let fired = g.evaluate(input_wm, now, &mut out).map_err(|source| {
                            EngineError::Decode {
                                pcollection: format!(
                                    "output of '{}'",
                                    self.plan.stages[stage].name
                                ),
                                source,
                            }
                        })?;
                        if fired > 0 {
                            let bytes = Bytes::from(out);
                            for &o in &self.plan.stages[stage].outputs.clone() {
                                self.route(o, bytes.clone())?;
                            }
                        }
                    }
                }
                None => {
                    s.pending_holds.add(e.header.timestamp);
                    s.pending.push_back(e.clone());
                }
            }
        }
        Ok(())
    }

    /// How far each side input of a stage is complete, for deciding which
    /// main-input elements may read them.
    fn side_input_gate(&self, idx: StageIdx) -> Vec<SideGate> {
        let store = self.side_inputs.lock();
        self.plan.stages[idx]
            .side_inputs
            .iter()
            .map(|si| SideGate {
                watermark: self.producers[si.pcollection]
                    .map(|p| self.stages[p].output_wm)
                    .unwrap_or(MAX_TIMESTAMP),
                global: self.plan.pcollections[si.pcollection].window_coder
                    == crate::coder::Coder::GlobalWindow,
                has_values: store.has_values(&si.transform_id, &si.tag),
            })
            .collect()
    }

    /// Ask the SDK to merge the windows of grouping stages with a custom
    /// merging window function, where new windows arrived.
    fn schedule_merges(&mut self, tx: &mpsc::UnboundedSender<Report>) -> Result<(), EngineError> {
        for idx in 0..self.stages.len() {
            let s = &mut self.stages[idx];
            if s.merging {
                continue;
            }
            let Some(g) = s.grouping.as_ref() else {
                continue;
            };
            if !g.needs_merge() {
                continue;
            }
            let request = g.merge_request();
            let window_coder =
                &self.plan.pcollections[self.plan.stages[idx].inputs[0]].window_coder;
            let bytes =
                crate::window_merge::encode_request(&request, window_coder).map_err(|source| {
                    EngineError::Decode {
                        pcollection: format!(
                            "window merge request of '{}'",
                            self.plan.stages[idx].name
                        ),
                        source,
                    }
                })?;
            s.merging = true;
            let keys: Vec<Bytes> = request.into_iter().map(|(k, _)| k).collect();
            let bundle = self.next_bundle;
            self.next_bundle += 1;
            let fut = self.executor.merge_windows(
                idx,
                format!("{}-m{}", self.bundle_prefix, bundle),
                bytes,
            );
            let tx = tx.clone();
            self.merges_in_flight += 1;
            tokio::spawn(async move {
                let result = fut.await;
                let _ = tx.send(Report::Merge {
                    stage: idx,
                    keys,
                    result,
                });
            });
        }
        Ok(())
    }

    fn commit_merge(
        &mut self,
        idx: StageIdx,
        keys: Vec<Bytes>,
        result: Result<Bytes, ExecError>,
    ) -> Result<(), EngineError> {
        self.merges_in_flight -= 1;
        self.stages[idx].merging = false;
        let answer = result.map_err(|error| EngineError::BundleFailed {
            stage: self.plan.stages[idx].name.clone(),
            error,
        })?;
        let window_coder = &self.plan.pcollections[self.plan.stages[idx].inputs[0]].window_coder;
        let merges =
            crate::window_merge::decode_response(&answer, window_coder).map_err(|source| {
                EngineError::Decode {
                    pcollection: format!("window merge answer of '{}'", self.plan.stages[idx].name),
                    source,
                }
            })?;
        if let Some(g) = self.stages[idx].grouping.as_mut() {
            for (i, m) in merges {
                if let Some(key) = keys.get(i) {
                    g.apply_merges(key, m);
                }
            }
            g.clear_unmerged(&keys);
        }
        Ok(())
    }

    /// Start every bundle that may run now.
    fn schedule(&mut self, tx: &mpsc::UnboundedSender<Report>) -> Result<(), EngineError> {
        self.schedule_merges(tx)?;
        for i in 0..self.topo.len() {
            let idx = self.topo[i];
            let StageKind::Sdk(sdk) = &self.plan.stages[idx].kind else {
                continue;
            };
            let stateful = sdk.stateful;
            let splittable = sdk.splittable;
            let families = sdk.timer_families.clone();
            let streaming = self.config.streaming;
            let gate = self.side_input_gate(idx);
            if gate
                .iter()
                .any(|g| g.watermark <= MIN_TIMESTAMP && !g.has_values)
            {
                continue;
            }
            if !gate.is_empty() {
                let mut store = self.side_inputs.lock();
                for si in &self.plan.stages[idx].side_inputs {
                    store.mark_ready(&si.transform_id, &si.tag);
                }
            }
            if self.stages[idx]
                .retry_at
                .is_some_and(|at| at > Instant::now())
            {
                continue;
            }
            self.stages[idx].retry_at = None;
            loop {
                let now = self.now();
                let s = &mut self.stages[idx];
                let limit = if stateful || !families.is_empty() {
                    1
                } else {
                    self.config.max_bundles_per_stage
                };
                if s.in_flight >= limit {
                    break;
                }
                // Elements that already arrived are processed before any
                // timer fires, so a timer cannot overtake data that would
                // have reset or cleared it.
                let fired = if families.is_empty() || !s.pending.is_empty() {
                    Vec::new()
                } else {
                    s.timers.take_ready(s.input_wm, now)
                };
                if s.pending.is_empty() && fired.is_empty() {
                    break;
                }
                let elements: Vec<DecodedElement> = if gate.is_empty() {
                    let take = s.pending.len().min(self.config.max_bundle_elements);
                    s.pending.drain(..take).collect()
                } else {
                    // Only elements whose side inputs are ready.
                    let mut ready = Vec::new();
                    let mut waiting = VecDeque::with_capacity(s.pending.len());
                    for e in s.pending.drain(..) {
                        let allowed = gate.iter().all(|g| g.allows(&e, streaming));
                        if allowed && ready.len() < self.config.max_bundle_elements {
                            ready.push(e);
                        } else {
                            waiting.push_back(e);
                        }
                    }
                    s.pending = waiting;
                    ready
                };
                let take = elements.len();
                if elements.is_empty() && fired.is_empty() {
                    break;
                }
                let mut holds = Vec::with_capacity(elements.len() + fired.len());
                for e in &elements {
                    s.pending_holds.remove(e.header.timestamp);
                    s.in_flight_holds.add(e.header.timestamp);
                    holds.push(e.header.timestamp);
                }
                for (_, f) in &fired {
                    s.in_flight_holds.add(f.timer.hold_timestamp);
                    holds.push(f.timer.hold_timestamp);
                }
                s.in_flight += 1;
                let mut timer_inputs = Vec::with_capacity(families.len());
                for fam in &families {
                    let of_family: Vec<&FiredTimer> = fired
                        .iter()
                        .map(|(_, f)| f)
                        .filter(|f| {
                            f.transform_id == fam.transform_id && f.family_id == fam.family_id
                        })
                        .collect();
                    let data =
                        TimerStore::encode(&of_family, &fam.window_coder).map_err(|source| {
                            EngineError::Decode {
                                pcollection: format!("timers of '{}'", fam.transform_id),
                                source,
                            }
                        })?;
                    timer_inputs.push(TimerInput {
                        transform_id: fam.transform_id.clone(),
                        family_id: fam.family_id.clone(),
                        data,
                    });
                }
                // A splittable stage's inputs go one element per chunk, so
                // that the executor can hand back the elements a split
                // leaves unprocessed.
                let chunk_bytes = if splittable {
                    0
                } else {
                    self.config.chunk_bytes
                };
                let chunks = chunk_elements(&elements, chunk_bytes);
                let overlay = Arc::new(BundleOverlay::new(
                    self.side_inputs.clone(),
                    self.user_state[idx].clone(),
                ));
                let bundle = self.next_bundle;
                self.next_bundle += 1;
                self.in_flight.insert(
                    bundle,
                    InFlight {
                        stage: idx,
                        holds,
                        overlay: overlay.clone(),
                        fired_timers: fired,
                        elements,
                    },
                );
                let input = BundleInput {
                    stage: idx,
                    bundle_id: format!("{}-b{}", self.bundle_prefix, bundle),
                    elements: chunks,
                    timers: timer_inputs,
                    state: overlay,
                    draining: self.draining,
                };
                debug!(stage = %self.plan.stages[idx].name, bundle, elements = take, "starting bundle");
                let fut = self.executor.execute(input);
                let tx = tx.clone();
                tokio::spawn(async move {
                    let result = fut.await;
                    let _ = tx.send(Report::Bundle { bundle, result });
                });
            }
        }
        Ok(())
    }

    /// Apply a finished bundle's effects, or drop them if it failed.
    fn commit(&mut self, report: Report) -> Result<(), EngineError> {
        let (bundle, result) = match report {
            Report::Bundle { bundle, result } => (bundle, result),
            Report::Merge {
                stage,
                keys,
                result,
            } => return self.commit_merge(stage, keys, result),
        };
        let Some(flight) = self.in_flight.remove(&bundle) else {
            return Ok(());
        };
        let idx = flight.stage;
        {
            let s = &mut self.stages[idx];
            s.in_flight -= 1;
            for h in &flight.holds {
                s.in_flight_holds.remove(*h);
            }
        }
        let output = match result {
            Ok(output) => output,
            Err(error) => {
                let s = &mut self.stages[idx];
                s.timers.restore(flight.fired_timers);
                s.failures += 1;
                let retryable = !matches!(error, ExecError::Runner(_));
                if !retryable || s.failures >= self.config.max_attempts {
                    return Err(EngineError::BundleFailed {
                        stage: self.plan.stages[idx].name.clone(),
                        error,
                    });
                }
                // The bundle left nothing behind: put its input back, to be
                // processed again after a backoff.
                let backoff = self
                    .config
                    .retry_backoff
                    .saturating_mul(1 << (s.failures - 1).min(16))
                    .min(Duration::from_secs(10));
                s.retry_at = Some(Instant::now() + backoff);
                for e in flight.elements.into_iter().rev() {
                    s.pending_holds.add(e.header.timestamp);
                    s.pending.push_front(e);
                }
                tracing::warn!(
                    stage = %self.plan.stages[idx].name,
                    attempt = s.failures,
                    ?backoff,
                    %error,
                    "bundle failed; retrying its input"
                );
                return Ok(());
            }
        };
        self.stages[idx].failures = 0;
        self.summary.bundles += 1;
        self.user_state[idx]
            .lock()
            .apply(flight.overlay.take_writes());
        if let StageKind::Sdk(sdk) = &self.plan.stages[idx].kind {
            for t in &output.timers {
                let Some(fam) = sdk
                    .timer_families
                    .iter()
                    .find(|f| f.transform_id == t.transform_id && f.family_id == t.family_id)
                else {
                    continue;
                };
                let timers = decode_timers(&t.data, &fam.key_coder, &fam.window_coder).map_err(
                    |source| EngineError::Decode {
                        pcollection: format!("timers {}/{}", t.transform_id, t.family_id),
                        source,
                    },
                )?;
                self.stages[idx]
                    .timers
                    .apply(&t.transform_id, &t.family_id, fam.domain, timers);
            }
        }
        if !output.residuals.is_empty() {
            let input = self.plan.stages[idx].inputs.first().copied();
            if let Some(input) = input {
                let pc = &self.plan.pcollections[input];
                for r in &output.residuals {
                    let decoded =
                        decode_windowed_values(&r.element, &pc.value_coder, &pc.window_coder)
                            .map_err(|source| EngineError::Decode {
                                pcollection: pc.id.clone(),
                                source,
                            })?;
                    for e in decoded {
                        let hold = r.watermark.unwrap_or(e.header.timestamp);
                        let delay = if self.draining {
                            0
                        } else {
                            r.delay_ms.max(0) as u64
                        };
                        let at = Instant::now() + Duration::from_millis(delay);
                        self.stages[idx].delayed.push((at, e, hold));
                    }
                }
            }
        }
        for (pcoll, bytes) in output.outputs {
            self.route(pcoll, bytes)?;
        }
        Ok(())
    }
}

/// Concatenate whole encoded elements into chunks of about `chunk_bytes`.
fn chunk_elements(elements: &[DecodedElement], chunk_bytes: usize) -> Vec<Bytes> {
    let mut chunks = Vec::new();
    let mut current: Vec<u8> = Vec::new();
    for e in elements {
        if !current.is_empty() && current.len() + e.encoded.len() > chunk_bytes {
            chunks.push(Bytes::from(std::mem::take(&mut current)));
        }
        current.extend_from_slice(&e.encoded);
    }
    if !current.is_empty() {
        chunks.push(Bytes::from(current));
    }
    chunks
}

/// Stages ordered so every producer precedes its consumers (side inputs included).
fn topological_order(
    plan: &Plan,
    producers: &[Option<StageIdx>],
) -> Result<Vec<StageIdx>, EngineError> {
    let n = plan.stages.len();
    let mut indegree = vec![0usize; n];
    let mut edges: Vec<Vec<StageIdx>> = vec![Vec::new(); n];
    for (idx, stage) in plan.stages.iter().enumerate() {
        let upstream = stage
            .inputs
            .iter()
            .copied()
            .chain(stage.side_inputs.iter().map(|s| s.pcollection));
        for p in upstream {
            if let Some(producer) = producers[p] {
                edges[producer].push(idx);
                indegree[idx] += 1;
            }
        }
    }
    let mut queue: VecDeque<StageIdx> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = queue.pop_front() {
        order.push(i);
        for &j in &edges[i] {
            indegree[j] -= 1;
            if indegree[j] == 0 {
                queue.push_back(j);
            }
        }
    }
    if order.len() != n {
        return Err(EngineError::InvalidPlan(
            "the stage graph has a cycle".into(),
        ));
    }
    Ok(order)
}
