//! Garbage collection of user state and timers of expired windows.

use super::*;

impl Engine {
    /// Drop the user state of windows that expired (their end plus the
    /// allowed lateness is behind the input watermark), once per watermark
    /// advance and only between bundles, so no bundle sees state vanish.
    pub(super) fn collect_expired_state(
        &mut self,
        idx: StageIdx,
        input_wm: Timestamp,
    ) -> Result<(), EngineError> {
        let StageKind::Sdk(sdk) = &self.plan.stages[idx].kind else {
            return Ok(());
        };
        let s = &mut self.stages[idx];
        let quiet = s.queue.is_quiet();
        let Some(state) = s.sdk_mut() else {
            return Ok(());
        };
        if !sdk.stateful || !quiet || input_wm <= state.state_gc_wm {
            return Ok(());
        }
        let Some(&input) = self.plan.stages[idx].inputs.first() else {
            return Ok(());
        };
        let lateness = sdk.allowed_lateness;
        let gc_time = |w: &Window| w.garbage_collection_time(lateness);
        // Timers that can no longer fire go with their window; those due by
        // its GC time fire (and may read its state) before it goes.
        // (At the end of the input every timer fires instead.)
        if input_wm < MAX_TIMESTAMP {
            state.timers.drop_expired(input_wm, gc_time);
        }
        let timer_windows = state.timers.windows();
        state.state_gc_wm = input_wm;
        let window_coder = &self.plan.pcollections[input].window_coder;
        self.user_state[idx]
            .lock()
            .retain_windows(|bytes| {
                match window_coder.decode_window(bytes) {
                    Ok((w, _)) => timer_windows.contains(&w) || gc_time(&w) >= input_wm,
                    // Keep what cannot be read; it is freed with the job.
                    Err(_) => true,
                }
            })
            .map_err(spill_failed(&self.plan, idx))?;
        Ok(())
    }
}
