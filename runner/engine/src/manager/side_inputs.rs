//! When a main-input element may read its stage's side inputs.

use super::Engine;
use crate::coder::DecodedElement;
use crate::plan::StageIdx;
use crate::time::{Timestamp, MAX_TIMESTAMP};
use crate::window::Window;

/// How complete one side input of a stage is.
pub(super) struct SideGate {
    /// The side input producer's output watermark.
    pub(super) watermark: Timestamp,
    /// The side input is in the global window.
    pub(super) global: bool,
    /// Some value of it has arrived.
    pub(super) has_values: bool,
    /// Its trigger fires panes before its windows end.
    pub(super) fires_early: bool,
}

impl SideGate {
    /// Whether main-input element `e` may read this side input now. The
    /// SDK maps main-input windows to side-input windows itself, so the
    /// runner waits until the side input's watermark has passed the end of
    /// the window the element could map to: the global window's end for a
    /// globally windowed side input, else the element's own windows' ends
    /// (the same window function on both sides is the common case). In
    /// streaming, a globally windowed side input whose trigger fires early
    /// is readable as soon as its first pane arrived, and later panes
    /// update it.
    pub(super) fn allows(&self, e: &DecodedElement, streaming: bool) -> bool {
        if self.watermark >= MAX_TIMESTAMP {
            return true;
        }
        if self.global {
            return self.watermark > crate::time::GLOBAL_WINDOW_MAX_TIMESTAMP
                || (streaming && self.fires_early && self.has_values);
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
        self.topology.plan.stages[idx]
            .side_inputs
            .iter()
            .map(|si| SideGate {
                watermark: self.topology.producers[si.pcollection]
                    .map(|p| self.producer_watermark(p))
                    .unwrap_or(MAX_TIMESTAMP),
                global: self.topology.plan.pcollections[si.pcollection].window_coder
                    == crate::coder::Coder::GlobalWindow,
                has_values: store.has_values(&si.id),
                fires_early: si.fires_early,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coder::{PaneInfo, WindowedValueHeader};
    use bytes::Bytes;

    fn main_element() -> DecodedElement {
        let header = WindowedValueHeader {
            timestamp: 100,
            windows: smallvec::smallvec![Window::Global],
            pane: PaneInfo::NO_FIRING,
        };
        DecodedElement::new(header, Bytes::new(), 0)
    }

    fn global_side(fires_early: bool) -> SideGate {
        SideGate {
            watermark: 110,
            global: true,
            has_values: true,
            fires_early,
        }
    }

    #[test]
    fn an_open_global_side_input_waits_unless_its_trigger_fires_early() {
        let e = main_element();
        // Default trigger: complete only once its window closes, even in
        // streaming and with values already there.
        assert!(!global_side(false).allows(&e, true));
        // A trigger with early panes: its first pane is readable.
        assert!(global_side(true).allows(&e, true));
        // In batch a side input is always read complete.
        assert!(!global_side(true).allows(&e, false));
        let closed = SideGate {
            watermark: crate::time::GLOBAL_WINDOW_MAX_TIMESTAMP + 1,
            ..global_side(false)
        };
        assert!(closed.allows(&e, false));
    }
}
