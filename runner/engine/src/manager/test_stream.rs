//! Replaying TestStream events, one at a time, when the pipeline is quiet.

use bytes::Bytes;
use tracing::debug;

use super::stage_state::KindState;
use super::{Engine, EngineError};
use crate::coder::{encode_windowed_value, PaneInfo, WindowedValueHeader};
use crate::plan::{StageKind, TestStreamEvent};
use crate::window::Window;

impl Engine {
    /// Apply the next event of the first TestStream that has one left.
    /// Called only when nothing else can run, so every event sees the
    /// pipeline quiescent. Returns whether an event was applied.
    pub(super) fn step_test_streams(&mut self) -> Result<bool, EngineError> {
        for i in 0..self.topology.order.len() {
            let idx = self.topology.order[i];
            let StageKind::TestStream(events) = &self.topology.plan.stages[idx].kind else {
                continue;
            };
            let KindState::TestStream(cursor) = &mut self.stages[idx].kind else {
                continue;
            };
            let Some(event) = cursor.next_event(events).cloned() else {
                continue;
            };
            match event {
                TestStreamEvent::Elements { output, elements } => {
                    let pc = &self.topology.plan.pcollections[output];
                    let mut bytes = Vec::new();
                    for (value, timestamp) in &elements {
                        let header = WindowedValueHeader {
                            timestamp: *timestamp,
                            windows: smallvec::smallvec![Window::Global],
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
                    if let KindState::TestStream(cursor) = &mut self.stages[idx].kind {
                        cursor.advance_watermark(wm);
                    }
                }
                TestStreamEvent::ProcessingTime(ms) => {
                    self.clock.advance(ms);
                }
            }
            debug!(stage = %self.topology.plan.stages[idx].name, "applied a TestStream event");
            return Ok(true);
        }
        Ok(false)
    }
}
