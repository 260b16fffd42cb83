//! Keys whose values outgrow memory: written out of line, and handed to
//! their consumers as state-backed iterables.
//!
//! A GroupByKey emits all of a key's values in a window as one element, so
//! one hot key — a few gigabytes of values under one key, in a batch job
//! with a budget of one — cannot be emitted from memory, however well the
//! rest of the buffer spills. Beam's answer is the state-backed iterable
//! (`beam:coder:state_backed_iterable:v1`): the element carries some of the
//! values, or none, then a token, and the SDK pages through the rest over
//! the Fn API's state channel (`StateKey.Runner`) as its DoFn iterates.
//!
//! Two things make that possible here:
//!
//! * **Out of line.** A spill writes a pane of at least [`OUT_OF_LINE_BYTES`]
//!   as chunks of about [`CHUNK_BYTES`], cut between values, under a key
//!   space of their own — (buffer, marker, window, key, run, chunk) — and
//!   leaves only its header and run number in the run's block. A drain's
//!   cursors then hold small blocks even when one key fills every run (a
//!   hot key's part of a run is up to the buffer's whole share of memory,
//!   and a drain holds one block per run).
//! * **Handed out.** A drain that meets a key whose parts add up to more
//!   than the buffer's share of memory, in a buffer whose consumers all
//!   read its output through a state-backed iterable (the runner rewrites
//!   their input coder, and only where every one of them may), copies the
//!   key's small parts into the same space and emits the key with no
//!   values inline and a token naming its space. The SDK reads about
//!   [`PAGE_BYTES`] of whole chunks per page. Otherwise the parts are read
//!   back into one pane, as before.
//!
//! A handed-out key's chunks stay while a consumer may still read them (a
//! retried bundle reads them again). Checkpoints cannot hold them (spilled
//! bytes are scratch, and an element in a queue carries only the token),
//! so until the engine sees every consumer with nothing waiting and
//! nothing running — and releases the buffer's hand-outs, deleting their
//! chunks — the buffer counts as spilled: periodic checkpoints wait, and
//! an explicit one fails and says why. The chunks of keys that were not
//! handed out go with their window.

use bytes::Bytes;

use super::encoding::put_len;
use super::RunWriter;
use crate::coder::Coder;
use crate::spill::{prefix_end, SpillError, SpillSpace};

/// A spilled pane this large or larger is written out of line.
pub(super) const OUT_OF_LINE_BYTES: usize = 1 << 20;

/// About how many bytes of values an out-of-line chunk holds (one value
/// larger than this is a chunk of its own).
const CHUNK_BYTES: usize = 1 << 20;

/// About how many bytes of chunks one page the SDK reads holds (whole
/// chunks: at least one, and a chunk past this ends it).
const PAGE_BYTES: usize = 4 << 20;

/// Where out-of-line values are filed under a buffer's prefix: a length no
/// window's encoding has, so that the space is apart from every window's.
const LARGE_SPACE: [u8; 4] = [0xFF; 4];

/// First byte of a token: its layout's version.
const TOKEN_VERSION: u8 = 1;

/// The out-of-line space of the window whose entries start with
/// `window_start` (which starts with the buffer's `prefix`).
pub(super) fn window_space(prefix: &[u8], window_start: &[u8]) -> Vec<u8> {
    let window = window_start.get(prefix.len()..).unwrap_or_default();
    let mut space = Vec::with_capacity(prefix.len() + LARGE_SPACE.len() + window.len());
    space.extend_from_slice(prefix);
    space.extend_from_slice(&LARGE_SPACE);
    space.extend_from_slice(window);
    space
}

/// The out-of-line space of `key` in the window whose space is
/// `window_space` (length first, so that no key's space is the start of
/// another's).
pub(super) fn key_space(window_space: &[u8], key: &[u8]) -> Result<Vec<u8>, SpillError> {
    let mut space = Vec::with_capacity(window_space.len() + 4 + key.len());
    space.extend_from_slice(window_space);
    put_len(&mut space, key.len())?;
    space.extend_from_slice(key);
    Ok(space)
}

/// The space of one run's part of a key.
fn part_space(key_space: &[u8], run: u32) -> Vec<u8> {
    let mut space = Vec::with_capacity(key_space.len() + 4);
    space.extend_from_slice(key_space);
    space.extend_from_slice(&run.to_be_bytes());
    space
}

/// Writes `values` (nested encodings of `value_coder`, back to back) as
/// run `run`'s part of the key whose space is `key_space`, in chunks cut
/// between values.
pub(super) fn write_part(
    key_space: &[u8],
    run: u32,
    values: &[u8],
    value_coder: &Coder,
    writer: &mut RunWriter,
    store: &dyn SpillSpace,
    spilled_bytes: &mut u64,
) -> Result<(), SpillError> {
    let space = part_space(key_space, run);
    // A part a crash cut short may be here under the same number (a
    // durable spill space reuses the numbers of runs after the checkpoint it
    // restores): its chunks must not join this one's.
    store.forget_range(&space, &prefix_end(&space).unwrap_or_default())?;
    let mut chunk: u32 = 0;
    let mut start = 0usize;
    let mut at = 0usize;
    while at < values.len() {
        let len = value_coder
            .nested_len(&values[at..])
            .map_err(|e| SpillError(format!("a spilled value does not decode: {e}")))?;
        if len == 0 {
            return Err(SpillError(
                "the value coder writes zero-byte values, which cannot be cut into chunks".into(),
            ));
        }
        at += len;
        if at - start >= CHUNK_BYTES || at >= values.len() {
            let mut key = space.clone();
            key.extend_from_slice(&chunk.to_be_bytes());
            chunk = chunk
                .checked_add(1)
                .ok_or_else(|| SpillError("too many chunks in one spilled pane".into()))?;
            writer.push(store, (key, values[start..at].to_vec()), spilled_bytes)?;
            start = at;
        }
    }
    Ok(())
}

/// Reads run `run`'s part of the key whose space is `key_space` back, its
/// chunks in order.
pub(super) fn read_part(
    store: &dyn SpillSpace,
    key_space: &[u8],
    run: u32,
) -> Result<Vec<u8>, SpillError> {
    let space = part_space(key_space, run);
    let end = prefix_end(&space).unwrap_or_default();
    let chunks = store.scan(&space, &end, usize::MAX)?;
    Ok(concat(chunks))
}

/// The values of `chunks`, one after another (one chunk as it is).
fn concat(chunks: crate::spill::Entries) -> Vec<u8> {
    match <[(Vec<u8>, Vec<u8>); 1]>::try_from(chunks) {
        Ok([(_, one)]) => one,
        Err(many) => many
            .into_iter()
            .map(|(_, chunk)| chunk)
            .collect::<Vec<_>>()
            .concat(),
    }
}

/// The token a consumer reads the key whose space is `key_space` with.
pub(super) fn token(key_space: &[u8]) -> Vec<u8> {
    let mut token = Vec::with_capacity(1 + key_space.len());
    token.push(TOKEN_VERSION);
    token.extend_from_slice(key_space);
    token
}

/// A page of a state-backed iterable's values.
#[derive(Debug)]
pub struct IterablePage {
    /// Whole values, back to back.
    pub data: Bytes,
    /// Where the next page starts, if one may follow.
    pub continuation: Option<Bytes>,
}

/// The page of the values behind `token` that starts at `continuation`
/// (the first, if none): whole chunks, about `PAGE_BYTES`. `job_space`
/// is the spill space of the job whose bundle asks; a token from anywhere
/// else is refused, as is a continuation outside the token's space (both
/// come from the SDK).
pub fn read_iterable_page(
    store: &dyn SpillSpace,
    job_space: &[u8],
    token: &[u8],
    continuation: Option<&[u8]>,
) -> Result<IterablePage, SpillError> {
    let space = match token.split_first() {
        Some((&TOKEN_VERSION, space)) if space.starts_with(job_space) => space,
        _ => {
            return Err(SpillError(
                "not a state-backed iterable token of this job".into(),
            ))
        }
    };
    let from = match continuation {
        None => space,
        Some(from) if from.starts_with(space) => from,
        Some(_) => {
            return Err(SpillError(
                "a state-backed iterable's continuation token is not its own".into(),
            ))
        }
    };
    let end = prefix_end(space).unwrap_or_default();
    let chunks = store.scan(from, &end, PAGE_BYTES - CHUNK_BYTES)?;
    let Some(mut next) = chunks.last().map(|(key, _)| key.clone()) else {
        return Ok(IterablePage {
            data: Bytes::new(),
            continuation: None,
        });
    };
    next.push(0);
    Ok(IterablePage {
        data: Bytes::from(concat(chunks)),
        continuation: Some(Bytes::from(next)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spill::MemorySpillSpace;

    fn values(n: usize, each: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..n {
            // Coder::Bytes nested: a varint length, then the bytes.
            let v = vec![(i % 251) as u8; each];
            crate::coder::encode_varint_u64(v.len() as u64, &mut out);
            out.extend_from_slice(&v);
        }
        out
    }

    fn read_all(store: &MemorySpillSpace, job: &[u8], token: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut next: Option<Bytes> = None;
        loop {
            let page = read_iterable_page(store, job, token, next.as_deref()).unwrap();
            out.extend_from_slice(&page.data);
            match page.continuation {
                Some(c) => next = Some(c),
                None => return out,
            }
        }
    }

    #[test]
    fn a_part_comes_back_whole_and_a_token_pages_through_every_part_in_run_order() {
        let store = MemorySpillSpace::default();
        let prefix = b"\0\0\0\x03job\0\0\0\x01".to_vec();
        let window = window_space(&prefix, &[prefix.clone(), b"\0\0\0\0".to_vec()].concat());
        let space = key_space(&window, b"hot").unwrap();
        let other = key_space(&window, b"hot2").unwrap();
        let (a, b) = (values(3000, 700), values(10, 5));
        let mut writer = RunWriter::default();
        let mut bytes = 0;
        for (space, run, values) in [(&space, 2, &b), (&space, 0, &a), (&other, 1, &b)] {
            write_part(
                space,
                run,
                values,
                &Coder::Bytes,
                &mut writer,
                &store,
                &mut bytes,
            )
            .unwrap();
        }
        writer.flush(&store, &mut bytes).unwrap();
        assert_eq!(read_part(&store, &space, 0).unwrap(), a);
        assert_eq!(read_part(&store, &space, 2).unwrap(), b);
        // Three chunks for the big part (2.1 MB, cut between values), one
        // for each small one.
        assert_eq!(store.len(), 5);
        let token = token(&space);
        assert_eq!(read_all(&store, &prefix, &token), [a, b].concat());
    }

    #[test]
    fn tokens_and_continuations_from_elsewhere_are_refused() {
        let store = MemorySpillSpace::default();
        let token = token(b"\0\0\0\x03job\0\0\0\x01");
        assert!(read_iterable_page(&store, b"\0\0\0\x03jab", &token, None).is_err());
        assert!(read_iterable_page(&store, b"\0\0\0\x03job", &token[1..], None).is_err());
        assert!(read_iterable_page(&store, b"\0\0\0\x03job", &token, Some(b"\0\0\0\x02")).is_err());
        let empty = read_iterable_page(&store, b"\0\0\0\x03job", &token, None).unwrap();
        assert!(empty.data.is_empty() && empty.continuation.is_none());
    }
}
