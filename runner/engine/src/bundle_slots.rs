//! How many bundles the SDK workers behind a set of stages run at once.
//!
//! A worker that processes bundles on one core — a Python worker behind
//! its interpreter lock, a TypeScript worker on its event loop — gains
//! nothing from a second bundle beside the first: both slow down, each
//! builds its own processor, and the runner cuts its input into smaller
//! bundles than it would if it waited. An SDK says it runs bundles in
//! parallel with the `beam:protocol:multi_core_bundle_processing:v1`
//! capability (Java and Go do); without it, a worker is one slot.
//!
//! The executor, which knows its workers, gives the engine one
//! [`BundleSlots`] per group of stages sharing workers (an environment).
//! The engine starts no bundle of those stages past the slots'
//! [`capacity`](BundleSlots::capacity), gives a freed slot to a stage that
//! waited for one before the others, and notes which stage waited: what the
//! executor reads ([`BundleSlots::wanted_by_other_than`]) to decide whether
//! splitting a running bundle helps anyone, since a residual that no free
//! slot can take only costs the SDK work.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::plan::StageIdx;

/// No stage waited at the last look.
const NONE: usize = usize::MAX;
/// More than one stage waited.
const SEVERAL: usize = usize::MAX - 1;

/// The bundle capacity of one group of stages' workers, shared by the
/// executor (which sets it) and the engine (which keeps to it).
#[derive(Debug)]
pub struct BundleSlots {
    capacity: AtomicUsize,
    /// Which stage waited for a slot at the engine's last look: [`NONE`],
    /// a stage, or [`SEVERAL`].
    waiting: AtomicUsize,
}

impl BundleSlots {
    /// Slots for `capacity` bundles at once (at least one: with none, no
    /// bundle would start, and none would ask for a replacement worker).
    pub fn new(capacity: usize) -> Self {
        BundleSlots {
            capacity: AtomicUsize::new(capacity.max(1)),
            waiting: AtomicUsize::new(NONE),
        }
    }

    /// How many bundles the group may run at once.
    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    /// The workers changed (one died, a replacement came): `capacity`
    /// bundles from now on (at least one).
    pub fn set_capacity(&self, capacity: usize) {
        self.capacity.store(capacity.max(1), Ordering::Relaxed);
    }

    /// Whether, at the engine's last look, a stage other than `stage` had
    /// input but no free slot: what a running bundle of `stage` gives back
    /// when split would let that stage run. (Its own stage's waiting input
    /// would only queue behind what it gave back.)
    pub fn wanted_by_other_than(&self, stage: StageIdx) -> bool {
        let waiting = self.waiting.load(Ordering::Relaxed);
        waiting != NONE && waiting != stage.index()
    }

    /// A new look: no stage waits yet.
    pub(crate) fn clear_waiting(&self) {
        self.waiting.store(NONE, Ordering::Relaxed);
    }

    /// `stage` had input but no free slot at this look.
    pub(crate) fn note_waiting(&self, stage: StageIdx) {
        let _ = self
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| match w {
                NONE => Some(stage.index()),
                w if w == stage.index() => None,
                _ => Some(SEVERAL),
            });
    }
}

#[cfg(test)]
mod tests {
    use super::BundleSlots;
    use crate::plan::StageIdx;

    #[test]
    fn capacity_is_never_zero() {
        let slots = BundleSlots::new(0);
        assert_eq!(slots.capacity(), 1);
        slots.set_capacity(3);
        assert_eq!(slots.capacity(), 3);
        slots.set_capacity(0);
        assert_eq!(slots.capacity(), 1);
    }

    #[test]
    fn a_stage_is_not_wanted_by_itself() {
        let slots = BundleSlots::new(1);
        assert!(!slots.wanted_by_other_than(StageIdx::new(3)));
        slots.note_waiting(StageIdx::new(3));
        assert!(!slots.wanted_by_other_than(StageIdx::new(3)));
        assert!(slots.wanted_by_other_than(StageIdx::new(5)));
        slots.note_waiting(StageIdx::new(3));
        assert!(!slots.wanted_by_other_than(StageIdx::new(3)));
        slots.note_waiting(StageIdx::new(4));
        assert!(slots.wanted_by_other_than(StageIdx::new(3)));
        assert!(slots.wanted_by_other_than(StageIdx::new(4)));
        slots.clear_waiting();
        assert!(!slots.wanted_by_other_than(StageIdx::new(4)));
    }
}
