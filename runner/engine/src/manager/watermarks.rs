//! The watermark pass: each stage's input watermark from its producers
//! (on every shard: [`Engine::producer_watermark`]),
//! a step of the stage at it ([`StageState::step`]), what the step emitted
//! delivered, and the stage's output watermark from its holds — producers
//! first, round and round until nothing changes.

use tracing::debug;

use super::step::{StepContext, StepError, Stepped};
use super::{spill_failed, Engine, EngineError};
use crate::plan::StageIdx;
use crate::time::{Timestamp, MAX_TIMESTAMP};

impl Engine {
    /// Recompute watermarks, step every stage and deliver what it emits,
    /// until nothing changes.
    pub(super) fn advance(&mut self) -> Result<(), EngineError> {
        self.refill_fire_budgets();
        loop {
            let mut changed = false;
            for i in 0..self.topology.order.len() {
                let idx = self.topology.order[i];
                let input_wm = self
                    .topology
                    .input_watermark(idx, |p| self.producer_watermark(p));
                self.stages[idx].progress.input_wm = input_wm;
                let stepped = self.step(idx, input_wm)?;
                changed |= stepped.emitted_anything();
                self.deliver(idx, stepped)?;
                let out_wm = self.stages[idx].output_watermark(input_wm);
                let progress = &mut self.stages[idx].progress;
                if out_wm > progress.output_wm {
                    progress.output_wm = out_wm;
                    changed = true;
                    if out_wm >= MAX_TIMESTAMP {
                        debug!(stage = %self.topology.plan.stages[idx].name, "stage finished");
                        if self.finishes_alone() {
                            self.on_stage_finished(idx);
                        }
                    }
                }
            }
            if !changed {
                self.tell_side_inputs_finished_everywhere();
                return Ok(());
            }
        }
    }

    /// Stage `idx`'s step at `input_wm`, with its errors named for the job.
    fn step(&mut self, idx: StageIdx, input_wm: Timestamp) -> Result<Stepped, EngineError> {
        let consumers_blocked = self.stages[idx].may_fire_panes() && self.backpressured(idx);
        let stage = &self.topology.plan.stages[idx];
        let cx = StepContext {
            stage,
            pcollections: &self.topology.plan.pcollections,
            input_wm,
            clock: &self.clock,
            consumers_blocked,
            user_state: &self.user_state[idx],
        };
        self.stages[idx].step(&cx).map_err(|e| match e {
            StepError::Encode {
                pcollection,
                source,
            } => EngineError::Decode {
                pcollection,
                source,
            },
            StepError::Grouping(e) => {
                let output = format!("output of '{}'", stage.name);
                self.grouping_error(idx, output, e)
            }
            StepError::Spill(source) => spill_failed(&self.topology.plan, idx)(source),
        })
    }

    /// A finished stage's outputs are complete: side inputs reading them
    /// are ready.
    pub(super) fn on_stage_finished(&mut self, idx: StageIdx) {
        let mut store = self.side_inputs.lock();
        for &out in &self.topology.plan.stages[idx].outputs {
            for (side_input, _) in &self.topology.consumers[out].side_inputs {
                store.mark_ready(side_input);
            }
        }
    }

    /// Hands what waits at every Flatten on to its outputs' consumers,
    /// upstream first: while a large output is routed a page at a time,
    /// each page moves on to queues that can spill instead of piling up at
    /// a Flatten (a `Reshuffle` is one) until the next watermark pass.
    pub(super) fn forward_flattens(&mut self) -> Result<(), EngineError> {
        for i in 0..self.topology.order.len() {
            let idx = self.topology.order[i];
            if self.stages[idx].is_flatten() {
                let input_wm = self.stages[idx].progress.input_wm;
                let stepped = self.step(idx, input_wm)?;
                self.deliver(idx, stepped)?;
            }
        }
        Ok(())
    }
}
