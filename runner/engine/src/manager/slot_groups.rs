//! The engine's side of [`BundleSlots`]: which stages share which slots,
//! and how many bundles each group has running.

use std::sync::Arc;

use crate::bundle_slots::BundleSlots;
use crate::executor::StageExecutor;
use crate::plan::{Plan, StageIdx, StageKind, StageVec};

/// One executor-given set of slots and the bundles running in it.
struct Group {
    slots: Arc<BundleSlots>,
    running: usize,
}

/// The slot groups of a plan's SDK stages.
#[derive(Default)]
pub(super) struct SlotGroups {
    /// Stage → its group, if its bundles are bounded by one.
    of_stage: StageVec<Option<usize>>,
    groups: Vec<Group>,
    /// Stage → the look at which it began to wait for a slot with input
    /// and no bundle running, if it has not had one since: the longest
    /// waiting gets the next free slot.
    waiting_since: StageVec<Option<u64>>,
    /// Looks so far.
    looks: u64,
}

impl SlotGroups {
    /// Asks `executor` for the slots of each SDK stage of `plan`; stages
    /// given the same slots form one group.
    pub(super) fn new(plan: &Plan, executor: &dyn StageExecutor) -> Self {
        let mut groups: Vec<Group> = Vec::new();
        let of_stage = plan
            .stages
            .iter_enumerated()
            .map(|(idx, stage)| {
                if !matches!(stage.kind, StageKind::Sdk(_)) {
                    return None;
                }
                let slots = executor.bundle_slots(idx)?;
                Some(
                    match groups.iter().position(|g| Arc::ptr_eq(&g.slots, &slots)) {
                        Some(g) => g,
                        None => {
                            groups.push(Group { slots, running: 0 });
                            groups.len() - 1
                        }
                    },
                )
            })
            .collect();
        SlotGroups {
            of_stage,
            groups,
            waiting_since: StageVec::from(vec![None; plan.stages.len()]),
            looks: 0,
        }
    }

    /// `topo` (every stage, in topological order) with the waiting stages
    /// first, longest waiting first: the order in which stages take free
    /// slots, so that a stage that waited is not passed over again by one
    /// upstream of it that just had its turn.
    pub(super) fn longest_waiting_first(&self, topo: &[StageIdx]) -> Vec<StageIdx> {
        let since = |idx: StageIdx| self.waiting_since.get(idx).copied().flatten();
        let mut waiting: Vec<(u64, usize, StageIdx)> = topo
            .iter()
            .enumerate()
            .filter_map(|(at, &idx)| since(idx).map(|look| (look, at, idx)))
            .collect();
        waiting.sort_unstable();
        waiting
            .into_iter()
            .map(|(_, _, idx)| idx)
            .chain(topo.iter().copied().filter(|&idx| since(idx).is_none()))
            .collect()
    }

    fn group(&self, stage: StageIdx) -> Option<&Group> {
        self.of_stage
            .get(stage)
            .copied()
            .flatten()
            .and_then(|g| self.groups.get(g))
    }

    fn group_mut(&mut self, stage: StageIdx) -> Option<&mut Group> {
        let g = self.of_stage.get(stage).copied().flatten()?;
        self.groups.get_mut(g)
    }

    /// How many bundles `stage`'s group runs at most at once (`usize::MAX`
    /// for a stage no group bounds).
    pub(super) fn capacity(&self, stage: StageIdx) -> usize {
        self.group(stage).map_or(usize::MAX, |g| g.slots.capacity())
    }

    /// How many more bundles of `stage` may start now.
    pub(super) fn free(&self, stage: StageIdx) -> usize {
        self.group(stage)
            .map_or(usize::MAX, |g| g.slots.capacity().saturating_sub(g.running))
    }

    /// A new look at every stage begins: no stage waits yet.
    pub(super) fn begin_look(&mut self) {
        self.looks += 1;
        for g in &self.groups {
            g.slots.clear_waiting();
        }
    }

    /// `stage` has work but its group has no free slot; `running`: it has
    /// bundles of its own in flight (it waits for those, not for a turn).
    pub(super) fn wait(&mut self, stage: StageIdx, running: bool) {
        let Some(g) = self.group(stage) else {
            return;
        };
        g.slots.note_waiting(stage);
        if let Some(since) = self.waiting_since.get_mut(stage).filter(|_| !running) {
            since.get_or_insert(self.looks);
        }
    }

    /// A bundle of `stage` started.
    pub(super) fn take(&mut self, stage: StageIdx) {
        if let Some(since) = self.waiting_since.get_mut(stage) {
            *since = None;
        }
        if let Some(g) = self.group_mut(stage) {
            g.running += 1;
        }
    }

    /// A bundle of `stage` ended, whatever its outcome.
    pub(super) fn give_back(&mut self, stage: StageIdx) {
        if let Some(g) = self.group_mut(stage) {
            g.running = g.running.saturating_sub(1);
        }
    }
}
