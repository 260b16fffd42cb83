//! Garbage collection of user state and timers of expired windows.

use parking_lot::Mutex;

use super::stage_state::SdkState;
use crate::coder::Coder;
use crate::plan::SdkStage;
use crate::spill::SpillError;
use crate::state::UserStateTable;
use crate::time::{Timestamp, MAX_TIMESTAMP};
use crate::window::Window;

impl SdkState {
    /// Drops the user state (in `user_state`) of windows that expired —
    /// their end plus the allowed lateness is behind the input watermark
    /// — once per watermark advance. Called only between bundles (the
    /// stage's queue is quiet), so no bundle sees state vanish. Windows
    /// are read with `window_coder`, the stage input's.
    pub(super) fn collect_expired_state(
        &mut self,
        stage: &SdkStage,
        window_coder: &Coder,
        input_wm: Timestamp,
        user_state: &Mutex<UserStateTable>,
    ) -> Result<(), SpillError> {
        if !stage.stateful || input_wm <= self.state_gc_wm {
            return Ok(());
        }
        let lateness = stage.allowed_lateness;
        let gc_time = |w: &Window| w.garbage_collection_time(lateness);
        // Timers that can no longer fire go with their window; those due by
        // its GC time fire (and may read its state) before it goes.
        // (At the end of the input every timer fires instead.)
        if input_wm < MAX_TIMESTAMP {
            self.timers.drop_expired(input_wm, gc_time);
        }
        let timer_windows = self.timers.windows();
        self.state_gc_wm = input_wm;
        user_state.lock().retain_windows(|bytes| {
            match window_coder.decode_window(bytes) {
                Ok((w, _)) => timer_windows.contains(&w) || gc_time(&w) >= input_wm,
                // Keep what cannot be read; it is freed with the job.
                Err(_) => true,
            }
        })
    }
}
