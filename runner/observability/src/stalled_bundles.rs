//! A job's bundles that stopped making progress, as the UI and the
//! metrics list them. The runner finds them (from the SDK's progress
//! reports, in its stall watch) and marks them here while they stay
//! stalled.

use std::collections::BTreeMap;

use parking_lot::Mutex;

/// A bundle that has made no progress for the stall timeout, as the UI
/// lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StalledBundle {
    /// The fused stage it runs.
    pub stage: String,
    /// Its instruction id.
    pub bundle_id: String,
    /// The worker running it.
    pub worker: String,
    /// When it last made progress, in ms since the epoch.
    pub since_ms: i64,
    /// The transform whose time grew while nothing else did, when the
    /// SDK reports time per transform.
    pub transform: Option<String>,
}

/// A job's stalled bundles, while they run.
#[derive(Debug, Default)]
pub struct StalledBundles {
    by_bundle: Mutex<BTreeMap<String, StalledBundle>>,
}

impl StalledBundles {
    /// The bundles stalled now, oldest stall first.
    pub fn list(&self) -> Vec<StalledBundle> {
        let mut out: Vec<StalledBundle> = self.by_bundle.lock().values().cloned().collect();
        out.sort_by_key(|b| b.since_ms);
        out
    }

    /// Lists `bundle` as stalled (again, if it was: the newest report wins).
    pub fn mark(&self, bundle: StalledBundle) {
        self.by_bundle
            .lock()
            .insert(bundle.bundle_id.clone(), bundle);
    }

    /// The bundle `bundle_id` made progress or ended: no longer listed.
    pub fn clear(&self, bundle_id: &str) {
        self.by_bundle.lock().remove(bundle_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalled_bundles_are_listed_oldest_first_until_cleared() {
        let stalled = StalledBundles::default();
        for (id, since_ms) in [("b2", 20), ("b1", 10)] {
            stalled.mark(StalledBundle {
                stage: "S".into(),
                bundle_id: id.into(),
                worker: "w".into(),
                since_ms,
                transform: None,
            });
        }
        let ids: Vec<_> = stalled.list().into_iter().map(|b| b.bundle_id).collect();
        assert_eq!(ids, ["b1", "b2"]);
        stalled.clear("b1");
        assert_eq!(stalled.list().len(), 1);
    }
}
