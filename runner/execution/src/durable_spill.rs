//! The engine's durable user-state store ([`refract_engine::spill::SpillSpace`])
//! over the state database: where a job's bags go past its share of
//! `--memory_budget` when it takes checkpoints, beside them, so that a
//! checkpoint names them instead of copying them (see the engine's
//! `store/bag_spill.rs`). Its writes and deletes are ahead of the job's
//! next checkpoint, whose synced write makes them durable; they go when
//! the job is forgotten.

use std::sync::Arc;

use refract_engine::spill::{Entries, SpillError, SpillSpace};
use refract_store::{Store, StoreError};

/// One job's state beside its checkpoints in a [`Store`].
pub struct DurableSpillSpace {
    store: Arc<Store>,
    job: String,
}

impl std::fmt::Debug for DurableSpillSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableSpillSpace")
            .field("job", &self.job)
            .finish_non_exhaustive()
    }
}

impl DurableSpillSpace {
    /// `job`'s space in `store`.
    pub fn new(store: Arc<Store>, job: &str) -> Self {
        DurableSpillSpace {
            store,
            job: job.to_string(),
        }
    }
}

fn state_error(e: StoreError) -> SpillError {
    SpillError(e.to_string())
}

impl SpillSpace for DurableSpillSpace {
    fn put(&self, entries: Entries) -> Result<(), SpillError> {
        let entries = entries
            .into_iter()
            .map(|(key, value)| (key, bytes::Bytes::from(value)))
            .collect();
        self.store
            .put_state(&self.job, entries)
            .map_err(state_error)
    }

    fn scan(&self, from: &[u8], to: &[u8], max_bytes: usize) -> Result<Entries, SpillError> {
        let page = self
            .store
            .scan_state(&self.job, from, to, max_bytes)
            .map_err(state_error)?;
        Ok(page.into_iter().map(|(k, v)| (k, Vec::from(v))).collect())
    }

    fn delete_range(&self, from: &[u8], to: &[u8]) -> Result<(), SpillError> {
        self.store
            .delete_state(&self.job, from, to)
            .map_err(state_error)
    }
}
