//! Where a bundle's output goes once it outgrows the bundle's share of the
//! memory budget: the job's spill space (see
//! [`refract_engine::spilled_output`] for why, and how the engine reads it
//! back).
//!
//! Store keys, after the job's spill prefix and a stage number no stage
//! has (so nothing a GroupByKey writes is near): the bundle's number, the
//! sink's position among the stage's outputs, then the part's number, all
//! big-endian — one sink's parts are one key range, in the order written.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use refract_engine::spill::{forget_prefix, SpillArea, SpillSpace};
use refract_engine::spilled_output::SpilledOutput;
use refract_sdk_harness::OutputSpill;
use tracing::warn;

/// One job's spill space for bundle outputs.
#[derive(Debug)]
pub struct JobOutputSpill {
    store: Arc<dyn SpillSpace>,
    /// Every key starts with it.
    prefix: Vec<u8>,
    /// Output bytes a bundle holds in memory before it writes them here.
    limit: usize,
    /// Bundles given a space so far.
    bundles: AtomicU64,
}

impl JobOutputSpill {
    /// Bundle outputs of the job whose spill prefix is `job_prefix`, held
    /// in memory up to `limit` bytes a bundle.
    pub fn new(store: Arc<dyn SpillSpace>, job_prefix: &[u8], limit: usize) -> Self {
        let prefix = SpillArea::BundleOutputs.prefix(job_prefix);
        JobOutputSpill {
            store,
            prefix,
            limit,
            bundles: AtomicU64::new(0),
        }
    }

    /// A space for one bundle whose outputs are `sinks` (the stage's sink
    /// transforms, in the order its outputs are listed).
    pub fn for_bundle(&self, sinks: Vec<String>) -> Arc<BundleOutputSpill> {
        let number = self.bundles.fetch_add(1, Ordering::Relaxed);
        let mut prefix = self.prefix.clone();
        prefix.extend_from_slice(&number.to_be_bytes());
        let parts = vec![SinkParts::default(); sinks.len()];
        Arc::new(BundleOutputSpill {
            store: self.store.clone(),
            prefix,
            limit: self.limit,
            sinks,
            parts: Mutex::new(Parts {
                sinks: parts,
                handed_over: false,
            }),
        })
    }
}

/// What one sink of a bundle wrote.
#[derive(Debug, Clone, Copy, Default)]
struct SinkParts {
    count: u32,
    bytes: u64,
}

#[derive(Debug)]
struct Parts {
    sinks: Vec<SinkParts>,
    /// [`BundleOutputSpill::take`] gave the parts to their readers.
    handed_over: bool,
}

/// One bundle's overflow: the SDK harness writes to it, the executor hands
/// what was written to the engine, and whatever is not handed over (the
/// bundle failed) is deleted with it.
#[derive(Debug)]
pub struct BundleOutputSpill {
    store: Arc<dyn SpillSpace>,
    prefix: Vec<u8>,
    limit: usize,
    sinks: Vec<String>,
    parts: Mutex<Parts>,
}

impl BundleOutputSpill {
    fn sink_prefix(&self, sink: usize) -> Vec<u8> {
        let mut key = self.prefix.clone();
        key.extend_from_slice(&(sink as u32).to_be_bytes());
        key
    }

    /// What each sink (by position) wrote, as outputs the engine reads
    /// back; after this, they are the engine's to delete.
    pub fn take(&self) -> Vec<(usize, SpilledOutput)> {
        let mut parts = self.parts.lock();
        parts.handed_over = true;
        parts
            .sinks
            .iter()
            .enumerate()
            .filter(|(_, p)| p.count > 0)
            .filter_map(|(at, p)| {
                SpilledOutput::new(self.store.clone(), self.sink_prefix(at), p.bytes)
                    .map(|output| (at, output))
            })
            .collect()
    }
}

impl OutputSpill for BundleOutputSpill {
    fn memory_limit(&self) -> usize {
        self.limit
    }

    fn write(&self, sink: &str, bytes: Vec<u8>) -> Result<(), String> {
        let at =
            self.sinks.iter().position(|s| s == sink).ok_or_else(|| {
                format!("output for sink '{sink}', which the stage does not have")
            })?;
        let mut parts = self.parts.lock();
        if parts.handed_over {
            return Err(format!("output for sink '{sink}' after the bundle ended"));
        }
        let part = &mut parts.sinks[at];
        let mut key = self.sink_prefix(at);
        key.extend_from_slice(&part.count.to_be_bytes());
        let len = bytes.len() as u64;
        self.store
            .put(vec![(key, bytes)])
            .map_err(|e| e.to_string())?;
        part.count = part
            .count
            .checked_add(1)
            .ok_or_else(|| format!("more than {} parts of output for sink '{sink}'", u32::MAX))?;
        part.bytes += len;
        Ok(())
    }
}

impl Drop for BundleOutputSpill {
    fn drop(&mut self) {
        let parts = self.parts.get_mut();
        if parts.handed_over || parts.sinks.iter().all(|p| p.count == 0) {
            return;
        }
        if let Err(e) = forget_prefix(self.store.as_ref(), &self.prefix) {
            warn!(error = %e, "could not delete a failed bundle's spilled output");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_engine::spill::MemorySpillSpace;

    #[test]
    fn parts_are_filed_per_sink_in_order_and_handed_over() {
        let store = MemorySpillSpace::shared();
        let spill = JobOutputSpill::new(store.clone(), b"job", 10);
        let bundle = spill.for_bundle(vec!["a".into(), "b".into()]);
        assert_eq!(bundle.memory_limit(), 10);
        bundle.write("b", b"b1".to_vec()).unwrap();
        bundle.write("b", b"b2".to_vec()).unwrap();
        assert!(bundle.write("c", b"?".to_vec()).is_err(), "no such sink");
        let taken = bundle.take();
        assert_eq!(taken.len(), 1);
        assert_eq!((taken[0].0, taken[0].1.bytes()), (1, 4));
        assert!(bundle.write("a", b"late".to_vec()).is_err());
        drop(bundle);
        assert_eq!(store.len(), 2, "handed over: the engine deletes them");
        drop(taken);
        assert!(store.is_empty());
    }

    #[test]
    fn a_failed_bundles_parts_go_with_it_and_other_bundles_stay() {
        let store = MemorySpillSpace::shared();
        let spill = JobOutputSpill::new(store.clone(), b"job", 10);
        let failed = spill.for_bundle(vec!["a".into()]);
        let other = spill.for_bundle(vec!["a".into()]);
        failed.write("a", b"x".to_vec()).unwrap();
        other.write("a", b"y".to_vec()).unwrap();
        drop(failed);
        assert_eq!(store.len(), 1);
        let taken = other.take();
        assert_eq!(taken.len(), 1);
    }
}
