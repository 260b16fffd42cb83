//! When a main-input element may read its stage's side inputs.

use super::*;

/// How complete one side input of a stage is.
pub(super) struct SideGate {
    /// The side input producer's output watermark.
    pub(super) watermark: Timestamp,
    /// The side input is in the global window.
    pub(super) global: bool,
    /// Some value of it has arrived.
    pub(super) has_values: bool,
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
    pub(super) fn allows(&self, e: &DecodedElement, streaming: bool) -> bool {
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

impl Engine {
    /// How far each side input of a stage is complete, for deciding which
    /// main-input elements may read them.
    pub(super) fn side_input_gate(&self, idx: StageIdx) -> Vec<SideGate> {
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
}
