//! The names of an engine checkpoint's parts.
//!
//! A checkpoint is a list of named parts, so that an incremental store
//! rewrites only the parts whose bytes changed; the names are written into
//! stores and savepoint files, so their spelling is part of the format.
//! They are made and read here only.

use std::fmt;

use crate::plan::StageIdx;

/// One part of an engine checkpoint (the engine's owner may add parts of
/// its own, under other names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PartName {
    /// Engine-wide values: format version, stage names, counters, clock.
    Engine,
    /// The side-input store.
    SideInputs,
    /// A stage's queue, delayed residuals, grouping buffer, timers and
    /// watermarks.
    Stage(StageIdx),
    /// The spilled back of a stage's queue, named on the durable spill space.
    QueueSpill(StageIdx),
    /// The spilled windows of a stage's GroupByKey, named on the durable
    /// store.
    GroupingSpill(StageIdx),
    /// A stage's user state.
    UserState(StageIdx),
    /// Where a stage's bags on the durable spill space are.
    UserStateSpill(StageIdx),
}

impl fmt::Display for PartName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartName::Engine => f.write_str("engine"),
            PartName::SideInputs => f.write_str("side_inputs"),
            PartName::Stage(idx) => write!(f, "stage/{idx}"),
            PartName::QueueSpill(idx) => write!(f, "queue_spill/{idx}"),
            PartName::GroupingSpill(idx) => write!(f, "grouping_spill/{idx}"),
            PartName::UserState(idx) => write!(f, "user_state/{idx}"),
            PartName::UserStateSpill(idx) => write!(f, "user_state_spill/{idx}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_spelled_as_stores_and_savepoints_hold_them() {
        let stage = StageIdx::new(3);
        let names: Vec<String> = [
            PartName::Engine,
            PartName::SideInputs,
            PartName::Stage(stage),
            PartName::QueueSpill(stage),
            PartName::GroupingSpill(stage),
            PartName::UserState(stage),
            PartName::UserStateSpill(stage),
        ]
        .iter()
        .map(PartName::to_string)
        .collect();
        assert_eq!(
            names,
            [
                "engine",
                "side_inputs",
                "stage/3",
                "queue_spill/3",
                "grouping_spill/3",
                "user_state/3",
                "user_state_spill/3"
            ]
        );
    }
}
