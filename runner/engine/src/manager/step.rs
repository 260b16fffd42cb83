//! What a stage does when the watermark pass reaches it.
//!
//! The pass ([`super::Engine::advance`]) visits stages producers first and
//! asks each to [`StageState::step`] at its new input watermark: an Impulse
//! emits its one element, a Flatten hands on what waits at it, a
//! GroupByKey fires the panes its triggers allow, an SDK stage drops the
//! user state of windows that expired. The stage answers with what it
//! emitted ([`Stepped`]); the engine delivers that to the consumers. Each
//! kind's behaviour is here, beside its state, and the pass does not ask
//! which kind a stage is.

use bytes::Bytes;
use parking_lot::Mutex;
use thiserror::Error;

use super::clock::ProcessingClock;
use super::pending::Queued;
use super::stage_state::{KindState, StageState};
use crate::coder::{encode_windowed_value, CoderError, PaneInfo, WindowedValueHeader};
use crate::grouping::{Fired, GroupingError};
use crate::plan::{PCollection, PCollectionIdx, PCollectionVec, Stage, StageKind};
use crate::spill::SpillError;
use crate::state::UserStateTable;
use crate::time::{Timestamp, MIN_TIMESTAMP};
use crate::window::Window;

/// What a stage emitted in one step, for the engine to deliver.
pub(super) enum Stepped {
    /// Nothing.
    Idle,
    /// Encoded elements, each for one output (an Impulse's element).
    Emitted(Vec<(PCollectionIdx, Bytes)>),
    /// Queue entries for every output (what waited at a Flatten).
    Forwarded(Vec<Queued>),
    /// Panes for every output (what a GroupByKey's triggers fired).
    Fired(Fired),
}

impl Stepped {
    /// Whether anything was emitted (the pass goes round again then).
    pub(super) fn emitted_anything(&self) -> bool {
        match self {
            Stepped::Idle => false,
            Stepped::Emitted(v) => !v.is_empty(),
            Stepped::Forwarded(v) => !v.is_empty(),
            Stepped::Fired(_) => true,
        }
    }
}

/// What a stage's step may read besides its own state.
pub(super) struct StepContext<'a> {
    /// The stage's plan.
    pub(super) stage: &'a Stage,
    /// The job's PCollections (for their coders).
    pub(super) pcollections: &'a PCollectionVec<PCollection>,
    /// The stage's input watermark.
    pub(super) input_wm: Timestamp,
    /// Processing time (read only by a stage that needs it).
    pub(super) clock: &'a ProcessingClock,
    /// The stage's consumers are over their queue bound: a GroupByKey
    /// fires nothing now.
    pub(super) consumers_blocked: bool,
    /// The stage's user state.
    pub(super) user_state: &'a Mutex<UserStateTable>,
}

/// Why a stage's step failed.
#[derive(Debug, Error)]
pub(super) enum StepError {
    /// An element of PCollection `pcollection` could not be encoded.
    #[error("cannot encode an element of PCollection '{pcollection}': {source}")]
    Encode {
        /// The PCollection's id.
        pcollection: String,
        /// The coder's error.
        source: CoderError,
    },
    /// A GroupByKey's firing failed.
    #[error(transparent)]
    Grouping(#[from] GroupingError),
    /// A store the stage's state is on failed.
    #[error(transparent)]
    Spill(#[from] SpillError),
}

impl StageState {
    /// One step of the stage at `cx.input_wm`: what it emitted.
    pub(super) fn step(&mut self, cx: &StepContext<'_>) -> Result<Stepped, StepError> {
        let quiet = self.queue.is_quiet();
        match &mut self.kind {
            KindState::Impulse { emitted } if !*emitted => {
                *emitted = true;
                impulse_element(cx).map(Stepped::Emitted)
            }
            KindState::Impulse { .. } | KindState::TestStream(_) => Ok(Stepped::Idle),
            KindState::Flatten if self.queue.pending.is_empty() => Ok(Stepped::Idle),
            KindState::Flatten => Ok(Stepped::Forwarded(self.queue.pending.take(usize::MAX))),
            KindState::Grouping(g) => {
                let fired = g.fire(cx.input_wm, cx.clock.now(), cx.consumers_blocked)?;
                Ok(fired.map_or(Stepped::Idle, Stepped::Fired))
            }
            KindState::Sdk(sdk) => {
                if let (StageKind::Sdk(plan), Some(&input)) =
                    (&cx.stage.kind, cx.stage.inputs.first())
                {
                    if quiet {
                        let window_coder = &cx.pcollections[input].window_coder;
                        sdk.collect_expired_state(plan, window_coder, cx.input_wm, cx.user_state)?;
                    }
                }
                Ok(Stepped::Idle)
            }
        }
    }

    /// Whether the stage is a Flatten (its queue is handed on as it fills).
    pub(super) fn is_flatten(&self) -> bool {
        matches!(self.kind, KindState::Flatten)
    }

    /// Whether the stage may fire panes in its next step (a GroupByKey
    /// with budget left), so the pass must tell it whether its consumers
    /// are blocked.
    pub(super) fn may_fire_panes(&self) -> bool {
        matches!(&self.kind, KindState::Grouping(g) if g.may_fire())
    }
}

/// An Impulse's one element: an empty byte array in the global window at
/// the start of time, encoded for each of its outputs.
fn impulse_element(cx: &StepContext<'_>) -> Result<Vec<(PCollectionIdx, Bytes)>, StepError> {
    let header = WindowedValueHeader {
        timestamp: MIN_TIMESTAMP,
        windows: smallvec::smallvec![Window::Global],
        pane: PaneInfo::NO_FIRING,
    };
    cx.stage
        .outputs
        .iter()
        .map(|&out| {
            let pc = &cx.pcollections[out];
            let mut bytes = Vec::new();
            encode_windowed_value(&header, &pc.window_coder, &[0u8], &mut bytes).map_err(
                |source| StepError::Encode {
                    pcollection: pc.id.clone(),
                    source,
                },
            )?;
            Ok((out, Bytes::from(bytes)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coder::{decode_windowed_values, Coder};
    use crate::plan::PCollection;

    fn pcollections(n: usize) -> PCollectionVec<PCollection> {
        PCollectionVec::from(
            (0..n)
                .map(|i| PCollection {
                    id: format!("p{i}"),
                    value_coder: Coder::Bytes,
                    window_coder: Coder::GlobalWindow,
                    bounded: true,
                })
                .collect::<Vec<_>>(),
        )
    }

    fn stage(kind: StageKind, inputs: &[usize], outputs: &[usize]) -> Stage {
        Stage {
            name: "s".into(),
            kind,
            inputs: inputs.iter().map(|&i| PCollectionIdx::new(i)).collect(),
            side_inputs: Vec::new(),
            outputs: outputs.iter().map(|&i| PCollectionIdx::new(i)).collect(),
        }
    }

    fn state_of(kind: &StageKind) -> StageState {
        StageState::new(
            KindState::of(kind, false, |_| unreachable!("no GroupByKey here")).expect("a state"),
        )
    }

    fn step(
        state: &mut StageState,
        stage: &Stage,
        pcollections: &PCollectionVec<PCollection>,
    ) -> Stepped {
        let user_state = Mutex::default();
        let clock = ProcessingClock::new(std::sync::Arc::new(|| 0), false);
        let cx = StepContext {
            stage,
            pcollections,
            input_wm: MIN_TIMESTAMP,
            clock: &clock,
            consumers_blocked: false,
            user_state: &user_state,
        };
        state.step(&cx).expect("a step")
    }

    #[test]
    fn an_impulse_emits_one_empty_element_per_output_once() {
        let pcs = pcollections(2);
        let plan = stage(StageKind::Impulse, &[], &[0, 1]);
        let mut s = state_of(&plan.kind);
        assert_eq!(
            s.output_watermark(crate::time::MAX_TIMESTAMP),
            MIN_TIMESTAMP
        );
        let Stepped::Emitted(emitted) = step(&mut s, &plan, &pcs) else {
            panic!("an Impulse emits");
        };
        assert_eq!(emitted.len(), 2);
        for (_, bytes) in emitted {
            let elements = decode_windowed_values(&bytes, &Coder::Bytes, &Coder::GlobalWindow)
                .expect("decodes");
            assert_eq!(elements.len(), 1);
            assert_eq!(elements[0].header.timestamp, MIN_TIMESTAMP);
            assert!(
                elements[0].value().iter().all(|&b| b == 0),
                "an empty byte array"
            );
        }
        assert!(!step(&mut s, &plan, &pcs).emitted_anything(), "once");
        let end = crate::time::MAX_TIMESTAMP;
        assert_eq!(s.output_watermark(end), end, "finished once it emitted");
    }

    #[test]
    fn a_flatten_hands_on_what_waits_at_it() {
        let pcs = pcollections(2);
        let plan = stage(StageKind::Flatten, &[0], &[1]);
        let mut s = state_of(&plan.kind);
        assert!(!step(&mut s, &plan, &pcs).emitted_anything());
        let header = WindowedValueHeader {
            timestamp: 5,
            windows: smallvec::smallvec![Window::Global],
            pane: PaneInfo::NO_FIRING,
        };
        let element = crate::coder::DecodedElement::new(header, Bytes::from_static(&[0]), 0);
        s.queue.pending.push_back(element).expect("in memory");
        let Stepped::Forwarded(entries) = step(&mut s, &plan, &pcs) else {
            panic!("a Flatten forwards");
        };
        assert_eq!(entries.len(), 1);
        assert!(s.queue.pending.is_empty());
    }
}
