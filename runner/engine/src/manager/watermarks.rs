//! Watermarks: each stage's input watermark from its producers, its output
//! watermark from its holds, and the runner-executed stages (impulse,
//! flatten, grouping) that run as the watermarks advance.

use super::*;

impl Engine {
    /// Recompute watermarks, run runner-executed stages and fire ready
    /// panes, until nothing changes.
    pub(super) fn advance(&mut self) -> Result<(), EngineError> {
        self.refill_fire_budgets();
        loop {
            let mut changed = false;
            for i in 0..self.topo.len() {
                let idx = self.topo[i];
                let input_wm = self.input_watermark(idx);
                self.stages[idx].progress.input_wm = input_wm;
                match self.plan.stages[idx].kind {
                    StageKind::Impulse => {
                        if self.stages[idx].take_impulse() {
                            let mut bytes = Vec::new();
                            let header = WindowedValueHeader {
                                timestamp: MIN_TIMESTAMP,
                                windows: smallvec::smallvec![Window::Global],
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
                        if self.forward_flatten(idx)? {
                            changed = true;
                        }
                    }
                    StageKind::GroupByKey(_) => {
                        // Not while the SDK merges this stage's windows.
                        let now = self.now();
                        let merging = self.stages[idx].grouping_state().is_some_and(|g| g.merging);
                        if !merging && self.fire_grouping(idx, input_wm, now)? {
                            changed = true;
                        }
                    }
                    StageKind::Sdk(_) => self.collect_expired_state(idx, input_wm)?,
                    StageKind::TestStream(_) => {}
                }
                let out_wm = self.output_watermark(idx, input_wm);
                let progress = &mut self.stages[idx].progress;
                if out_wm > progress.output_wm {
                    progress.output_wm = out_wm;
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

    pub(super) fn on_stage_finished(&mut self, idx: StageIdx) {
        let outputs = self.plan.stages[idx].outputs.clone();
        let mut store = self.side_inputs.lock();
        for out in outputs {
            for (side_input, _) in &self.consumers[out].side_inputs {
                store.mark_ready(side_input);
            }
        }
    }

    pub(super) fn input_watermark(&self, idx: StageIdx) -> Timestamp {
        let stage = &self.plan.stages[idx];
        if stage.inputs.is_empty() {
            return MAX_TIMESTAMP;
        }
        stage
            .inputs
            .iter()
            .map(|&p| {
                self.producers[p]
                    .map(|producer| self.stages[producer].progress.output_wm)
                    .unwrap_or(MAX_TIMESTAMP)
            })
            .min()
            .unwrap_or(MAX_TIMESTAMP)
    }

    /// Stage `idx`'s output watermark for input watermark `input_wm`
    /// ([`StageState::output_watermark`] has the formula).
    pub(super) fn output_watermark(&self, idx: StageIdx, input_wm: Timestamp) -> Timestamp {
        self.stages[idx].output_watermark(input_wm)
    }
}

impl Engine {
    /// Hands what waits at Flatten `idx` to its outputs' consumers (a copy
    /// for each output but the last); whether anything waited.
    fn forward_flatten(&mut self, idx: StageIdx) -> Result<bool, EngineError> {
        if self.stages[idx].queue.pending.is_empty() {
            return Ok(false);
        }
        let entries = self.stages[idx].queue.pending.take(usize::MAX);
        let outputs = self.plan.stages[idx].outputs.clone();
        if let Some((&last, others)) = outputs.split_last() {
            for &out in others {
                for q in &entries {
                    self.route_entry(out, q.clone())?;
                }
            }
            for q in entries {
                self.route_entry(last, q)?;
            }
        }
        Ok(true)
    }

    /// [`Self::forward_flatten`] for every Flatten, upstream first: while a
    /// large output is routed a page at a time, each page moves on to
    /// queues that can spill instead of piling up at a Flatten (a
    /// `Reshuffle` is one) until the next watermark pass.
    pub(super) fn forward_flattens(&mut self) -> Result<(), EngineError> {
        for i in 0..self.topo.len() {
            let idx = self.topo[i];
            if matches!(self.plan.stages[idx].kind, StageKind::Flatten) {
                self.forward_flatten(idx)?;
            }
        }
        Ok(())
    }
}
