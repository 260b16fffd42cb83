//! Asking the SDK to merge the windows of custom merging window functions.

use bytes::Bytes;

use tokio::sync::mpsc;

use super::{Engine, EngineError, Report};
use crate::executor::ExecError;
use crate::plan::StageIdx;

impl Engine {
    /// Ask the SDK to merge the windows of grouping stages with a custom
    /// merging window function, where new windows arrived.
    pub(super) fn schedule_merges(
        &mut self,
        tx: &mpsc::UnboundedSender<Report>,
    ) -> Result<(), EngineError> {
        for idx in self.stages.indices() {
            let Some(g) = self.stages[idx].grouping_state_mut() else {
                continue;
            };
            if g.merging || !g.buffer.needs_merge() {
                continue;
            }
            let request = g.buffer.merge_request();
            let window_coder = &self.topology.plan.pcollections
                [self.topology.plan.stages[idx].inputs[0]]
                .window_coder;
            let bytes =
                crate::window_merge::encode_request(&request, window_coder).map_err(|source| {
                    EngineError::Decode {
                        pcollection: format!(
                            "window merge request of '{}'",
                            self.topology.plan.stages[idx].name
                        ),
                        source,
                    }
                })?;
            g.merging = true;
            let keys: Vec<Bytes> = request.into_iter().map(|(k, _)| k).collect();
            let bundle = self.next_bundle;
            self.next_bundle += 1;
            let fut = self.executor.merge_windows(
                idx,
                format!("{}-m{}", self.bundle_prefix, bundle),
                bytes,
            );
            let tx = tx.clone();
            self.merges_in_flight += 1;
            tokio::spawn(async move {
                let result = crate::executor::panics_as_errors(fut).await;
                let _ = tx.send(Report::Merge {
                    stage: idx,
                    keys,
                    result,
                });
            });
        }
        Ok(())
    }

    pub(super) fn commit_merge(
        &mut self,
        idx: StageIdx,
        keys: Vec<Bytes>,
        result: Result<Bytes, ExecError>,
    ) -> Result<(), EngineError> {
        self.merges_in_flight -= 1;
        if let Some(g) = self.stages[idx].grouping_state_mut() {
            g.merging = false;
        }
        let answer = result.map_err(|error| EngineError::BundleFailed {
            stage: self.topology.plan.stages[idx].name.clone(),
            error,
        })?;
        let window_coder =
            &self.topology.plan.pcollections[self.topology.plan.stages[idx].inputs[0]].window_coder;
        let merges =
            crate::window_merge::decode_response(&answer, window_coder).map_err(|source| {
                EngineError::Decode {
                    pcollection: format!(
                        "window merge answer of '{}'",
                        self.topology.plan.stages[idx].name
                    ),
                    source,
                }
            })?;
        if let Some(g) = self.stages[idx].grouping_mut() {
            for (i, m) in merges {
                if let Some(key) = keys.get(i) {
                    g.apply_merges(key, m);
                }
            }
            g.clear_unmerged(&keys);
        }
        Ok(())
    }
}
