//! The engine's spill space ([`refract_engine::spill`]) over the RocksDB
//! spill database: where a job's GroupByKey buffers, queues and bundle
//! outputs go when they outgrow their share of `--memory_budget`.

use std::path::Path;

use refract_engine::spill::{Entries, SpillError, SpillSpace};
use refract_store::{SpillDb, StoreError};

/// [`SpillDb`] as the engine sees it.
#[derive(Debug)]
pub struct ScratchSpillSpace(SpillDb);

fn spill_error(e: StoreError) -> SpillError {
    SpillError(e.to_string())
}

impl ScratchSpillSpace {
    /// Opens (emptied) the spill database in `dir`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        SpillDb::open(dir).map(ScratchSpillSpace)
    }

    /// Where it lives.
    pub fn dir(&self) -> &Path {
        self.0.dir()
    }
}

impl SpillSpace for ScratchSpillSpace {
    fn put(&self, entries: Entries) -> Result<(), SpillError> {
        self.0.put(entries).map_err(spill_error)
    }

    fn scan(&self, from: &[u8], to: &[u8], max_bytes: usize) -> Result<Entries, SpillError> {
        self.0.scan(from, to, max_bytes).map_err(spill_error)
    }

    fn delete_range(&self, from: &[u8], to: &[u8]) -> Result<(), SpillError> {
        self.0.delete_range(from, to).map_err(spill_error)
    }

    fn forget_range(&self, from: &[u8], to: &[u8]) -> Result<(), SpillError> {
        self.0.forget_range(from, to).map_err(spill_error)
    }
}
