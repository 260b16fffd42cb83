//! Splits of running bundles: what the SDK gave back runs as work of its
//! own, and the bundle keeps (and holds) only what it kept.

use tracing::debug;

use super::pending::{truncate_elements, Queued};
use super::{Engine, EngineError};
use crate::executor::BundleSplit;
use crate::key_groups::{group_of, KeyGroupSet};

impl Engine {
    /// A running bundle was split: what it gave up runs as work of its own
    /// now, and a retry of the bundle (if it fails) does only what it kept.
    /// The bundle's holds stay until it ends: what it kept is no earlier
    /// than what it took.
    pub(super) fn apply_split(
        &mut self,
        bundle: u64,
        split: BundleSplit,
    ) -> Result<(), EngineError> {
        let Some(flight) = self.in_flight.get(&bundle) else {
            return Ok(());
        };
        let idx = flight.stage;
        let mut primaries = Vec::new();
        for p in &split.primaries {
            primaries.extend(self.decode_input(idx, p)?);
        }
        if let Some(flight) = self.in_flight.get_mut(&bundle) {
            truncate_elements(&mut flight.elements, split.kept_elements);
            flight
                .elements
                .extend(primaries.into_iter().map(Queued::One));
        }
        self.release_given_back_groups(bundle);
        self.defer_residuals(idx, &split.residuals)?;
        // Runnable at once (a split's residuals ask for no delay).
        self.release_delayed()?;
        Ok(())
    }

    /// A keyed stage's bundle that was split holds on to the key groups of
    /// what it kept (elements and timers) and lets the others go, so that
    /// what it gave back (split between key groups: see
    /// [`super::scheduling::group_by_key_group`]) can run beside it.
    fn release_given_back_groups(&mut self, bundle: u64) {
        let Some(flight) = self.in_flight.get_mut(&bundle) else {
            return;
        };
        if flight.key_groups == 0 {
            return;
        }
        let idx = flight.stage;
        let Some(&input) = self.topology.plan.stages[idx].inputs.first() else {
            return;
        };
        let coder = &self.topology.plan.pcollections[input].value_coder;
        let mut kept: KeyGroupSet = 0;
        for q in &flight.elements {
            q.for_each_element(|e| kept |= super::scheduling::element_key_group(coder, e));
        }
        for (_, t) in &flight.fired_timers {
            kept |= group_of(&t.timer.user_key);
        }
        let released = flight.key_groups & !kept;
        if released == 0 {
            return;
        }
        flight.key_groups &= kept;
        self.stages[idx].queue.unlock_key_groups(released);
        debug!(
            stage = %self.topology.plan.stages[idx].name,
            bundle,
            groups = released.count_ones(),
            "split bundle let key groups go"
        );
    }
}
