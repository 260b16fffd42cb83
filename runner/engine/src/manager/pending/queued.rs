//! What one entry of a stage's queue, and of a bundle's input, is: an
//! element, or a run of them that a GroupByKey's firing emitted together
//! (see [`ElementRun`]).

use bytes::Bytes;

use crate::coder::{DecodedElement, ElementRun};
use crate::holds::Holds;
use crate::time::Timestamp;

/// An entry of a queue or of a bundle's input.
#[derive(Debug, Clone)]
pub(in crate::manager) enum Queued {
    /// One element, holding at its timestamp.
    One(DecodedElement),
    /// Elements that travel together, each holding at the run's hold.
    Run(ElementRun),
}

impl Queued {
    /// How many elements it is.
    #[inline]
    pub(in crate::manager) fn len(&self) -> usize {
        match self {
            Queued::One(_) => 1,
            Queued::Run(run) => run.len(),
        }
    }

    /// Its encoded bytes.
    #[inline]
    pub(in crate::manager) fn encoded_len(&self) -> usize {
        match self {
            Queued::One(e) => e.encoded.len(),
            Queued::Run(run) => run.encoded_len(),
        }
    }

    /// Adds its holds to `holds`.
    #[inline]
    pub(in crate::manager) fn hold_in(&self, holds: &mut Holds) {
        let (ts, n) = self.holds();
        holds.add_many(ts, n);
    }

    /// Takes its holds out of `holds`.
    #[inline]
    pub(in crate::manager) fn release_from(&self, holds: &mut Holds) {
        let (ts, n) = self.holds();
        holds.remove_many(ts, n);
    }

    /// Its holds as (timestamp, how many), for a bundle's record.
    #[inline]
    pub(in crate::manager) fn holds(&self) -> (Timestamp, usize) {
        match self {
            Queued::One(e) => (e.header.timestamp, 1),
            Queued::Run(run) => (run.hold(), run.len()),
        }
    }

    /// Calls `f` with each of its elements, in order.
    #[inline]
    pub(in crate::manager) fn for_each_element(&self, mut f: impl FnMut(&DecodedElement)) {
        match self {
            Queued::One(e) => f(e),
            Queued::Run(run) => run.elements().for_each(|e| f(&e)),
        }
    }

    /// Its elements, in order.
    #[cfg(test)]
    pub(in crate::manager) fn into_elements(self) -> Vec<DecodedElement> {
        match self {
            Queued::One(e) => vec![e],
            Queued::Run(run) => run.elements().collect(),
        }
    }

    /// Each element's encoded length, in order.
    #[inline]
    pub(in crate::manager) fn element_lengths(&self, out: &mut Vec<usize>) {
        match self {
            Queued::One(e) => out.push(e.encoded.len()),
            Queued::Run(run) => out.extend(run.element_lengths()),
        }
    }
}

/// How many elements `entries` are.
pub(in crate::manager) fn element_count(entries: &[Queued]) -> usize {
    entries.iter().map(Queued::len).sum()
}

/// Keeps the first `n` elements of `entries` (cutting a run if one
/// straddles the cut).
pub(in crate::manager) fn truncate_elements(entries: &mut Vec<Queued>, n: usize) {
    let mut kept = 0;
    let mut cut = None;
    for (at, q) in entries.iter().enumerate() {
        if kept + q.len() > n {
            cut = Some((at, n - kept));
            break;
        }
        kept += q.len();
    }
    let Some((at, keep)) = cut else {
        return;
    };
    // Only a run can be cut inside (a single element is kept or not).
    if let (true, Some(Queued::Run(run))) = (keep > 0, entries.get_mut(at)) {
        *run = run.split_to(keep);
        entries.truncate(at + 1);
    } else {
        entries.truncate(at);
    }
}

/// Whole encoded elements of `entries` as chunks of about `chunk_bytes`
/// (one element each for 0): single elements and runs shorter than a
/// chunk are copied together (a streaming GroupByKey fires runs of one
/// element), longer runs are sliced where they lie.
pub(in crate::manager) fn chunk_entries(entries: &[Queued], chunk_bytes: usize) -> Vec<Bytes> {
    let mut chunks = Vec::new();
    let mut current: Vec<u8> = Vec::new();
    let copy = |bytes: &[u8], chunks: &mut Vec<Bytes>, current: &mut Vec<u8>| {
        if !current.is_empty() && current.len() + bytes.len() > chunk_bytes {
            chunks.push(Bytes::from(std::mem::take(current)));
        }
        current.extend_from_slice(bytes);
    };
    for q in entries {
        match q {
            Queued::One(e) => copy(&e.encoded, &mut chunks, &mut current),
            Queued::Run(run) if chunk_bytes > 0 && run.encoded_len() < chunk_bytes => {
                copy(&run.bytes(), &mut chunks, &mut current)
            }
            Queued::Run(run) => {
                if !current.is_empty() {
                    chunks.push(Bytes::from(std::mem::take(&mut current)));
                }
                chunks.extend(run.chunks(chunk_bytes));
            }
        }
    }
    if !current.is_empty() {
        chunks.push(Bytes::from(current));
    }
    chunks
}
