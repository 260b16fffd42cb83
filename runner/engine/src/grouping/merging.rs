//! Merging a key's windows: sessions, which the runner merges itself as
//! elements arrive, and the results of a merge the SDK did (custom merging
//! window functions).
//!
//! Either way, the panes of windows merged into one become one pane of
//! the result, which takes their values, holds, firings and trigger state
//! ([`Pane::absorb`]). Both the panes in memory and panes read back from a
//! spill are merged here, so that what comes back merges as memory would
//! have merged it.

use super::pane::{insert_pane, position, update_holds, KeyPanes, Pane};
use crate::holds::Holds;
use crate::plan::WindowingStrategy;
use crate::time::Timestamp;
use crate::window::Window;

/// Merges the panes of `originals` (those `windows` has) into one pane of
/// `result`, absorbing a pane `result` already has; `holds` follows.
pub(super) fn merge_windows(
    windows: &mut KeyPanes,
    originals: impl IntoIterator<Item = Window>,
    result: Window,
    strategy: &WindowingStrategy,
    holds: &mut Holds,
) {
    let mut combined: Option<Pane> = None;
    for original in originals {
        if let Ok(at) = position(windows, &original) {
            let (w, p) = windows.remove(at);
            update_holds(holds, p.hold(strategy, &w), None);
            match combined.as_mut() {
                Some(c) => c.absorb(p),
                None => combined = Some(p),
            }
        }
    }
    if let Some(c) = combined {
        insert_pane(windows, result, c, strategy, holds);
    }
}

/// Merge overlapping interval windows of one key (sessions): a new
/// element's window `[t, t + gap)` joins every window it overlaps.
pub(super) fn merge_intervals(
    windows: &mut KeyPanes,
    strategy: &WindowingStrategy,
    holds: &mut Holds,
) {
    let mut intervals: Vec<(Timestamp, Timestamp)> = windows
        .iter()
        .filter_map(|(w, _)| match w {
            Window::Interval { start, end } => Some((*start, *end)),
            _ => None,
        })
        .collect();
    if intervals.len() < 2 {
        return;
    }
    intervals.sort();
    type Interval = (Timestamp, Timestamp);
    let mut merged: Vec<(Interval, Vec<Interval>)> = Vec::new();
    for (start, end) in intervals {
        match merged.last_mut() {
            Some(((_, cur_end), members)) if start < *cur_end => {
                *cur_end = (*cur_end).max(end);
                members.push((start, end));
            }
            _ => merged.push(((start, end), vec![(start, end)])),
        }
    }
    for ((start, end), members) in merged {
        if members.len() == 1 && members[0] == (start, end) {
            continue;
        }
        let originals = members
            .into_iter()
            .map(|(s, e)| Window::Interval { start: s, end: e });
        merge_windows(
            windows,
            originals,
            Window::Interval { start, end },
            strategy,
            holds,
        );
    }
}
