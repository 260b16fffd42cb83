//! When deleted spill data is worth a compaction.
//!
//! Deleting a key range in RocksDB writes a tombstone; the disk space comes
//! back only when a compaction rewrites the files the range overlaps. Those
//! files hold whatever was flushed with the range — with a GroupByKey that
//! spills many windows at once, every window's runs share every file — so
//! compacting at each deletion rewrites the live data once per deleted
//! range: 1 000 windows drained one by one rewrote the whole spill 1 000
//! times (a spilling Java job over 1 000 one-second windows spent 40 s of
//! the runner's CPU in LZ4, for 42 MB spilled).
//!
//! The ledger instead adds up what deletions made dead on disk and asks
//! for one compaction, over the span of everything deleted since the last,
//! once that is at least half of the files' size: each compaction then
//! rewrites at most twice what it gives back, so reclaiming costs time in
//! proportion to what was spilled, and dead data never takes more disk
//! than live data does (plus what RocksDB's own compactions have yet to
//! drop of ranges forgotten without counting).

/// Deletions not yet compacted away.
#[derive(Debug, Default)]
pub(crate) struct ReclaimLedger {
    /// Bytes on disk that deletions since the last compaction made dead
    /// (RocksDB's estimate of the files' bytes in each range).
    owed: u64,
    /// The smallest key range covering every deletion since then.
    span: Option<(Vec<u8>, Vec<u8>)>,
}

impl ReclaimLedger {
    /// Notes that `[from, to)` was deleted while `dead_bytes` of it were
    /// on disk, with `on_disk` bytes in all files; the range to compact if
    /// one is due now (the ledger starts over then).
    pub(crate) fn deleted(
        &mut self,
        from: &[u8],
        to: &[u8],
        dead_bytes: u64,
        on_disk: u64,
    ) -> Option<(Vec<u8>, Vec<u8>)> {
        self.span = Some(match self.span.take() {
            None => (from.to_vec(), to.to_vec()),
            Some((start, end)) => (
                if from < start.as_slice() {
                    from.to_vec()
                } else {
                    start
                },
                if to > end.as_slice() {
                    to.to_vec()
                } else {
                    end
                },
            ),
        });
        self.owed = self.owed.saturating_add(dead_bytes);
        if self.owed == 0 || self.owed.saturating_mul(2) < on_disk {
            return None;
        }
        self.owed = 0;
        self.span.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_on_disk_asks_for_no_compaction() {
        let mut ledger = ReclaimLedger::default();
        // Data still in memtables: the tombstone drops it at the flush.
        assert_eq!(ledger.deleted(b"a", b"b", 0, 0), None);
        assert_eq!(ledger.deleted(b"b", b"c", 0, 1000), None);
    }

    #[test]
    fn one_compaction_once_half_of_the_disk_is_dead_over_the_span_deleted() {
        let mut ledger = ReclaimLedger::default();
        // 100 ranges of 10 bytes each in 1 000 bytes of files.
        let mut compactions = Vec::new();
        for i in 0..100u8 {
            if let Some(span) = ledger.deleted(&[i], &[i + 1], 10, 1000) {
                compactions.push(span);
            }
        }
        // Due at the 50th (500 of 1 000 bytes dead), over ranges 0..50; the
        // next 50 make 500 bytes dead again.
        assert_eq!(
            compactions,
            vec![(vec![0], vec![50]), (vec![50], vec![100])],
            "one compaction per half of the disk given back"
        );
    }

    #[test]
    fn the_span_covers_ranges_deleted_in_any_order() {
        let mut ledger = ReclaimLedger::default();
        assert_eq!(ledger.deleted(b"m", b"n", 1, 100), None);
        assert_eq!(ledger.deleted(b"x", b"y", 1, 100), None);
        assert_eq!(
            ledger.deleted(b"c", b"d", 60, 100),
            Some((b"c".to_vec(), b"y".to_vec()))
        );
    }
}
