//! The checkpoint of a job on several shards, as one list of parts, and
//! the task that makes it from the shards' cuts.
//!
//! Every shard cuts each checkpoint epoch once (`shard_epochs.rs`) and
//! sends its cut, an engine checkpoint of its own, to its channel. The
//! collector ([`collect_epochs`]) takes the `n`th cut of every shard, puts
//! each shard's parts under the prefix `shard/{k}/`, adds a `shards` part
//! that records how many shards there were and the job's own parts (its
//! metrics), and hands the whole to the job's checkpoint writer as one
//! checkpoint: epoch `n` is durable only when every shard's part of it is.
//! The writer's progress goes back to every shard, each of which counts
//! its cuts as an engine alone counts its checkpoints.
//!
//! A shard that finished sends one last cut, marked final: its state
//! never changes again, so it stands in for that shard in every later
//! epoch.

use std::future::Future;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use super::{CheckpointProgress, ExtraPart, SnapshotError};
use crate::shards::{ShardId, ShardLayout};

/// The part recording the shards of a sharded checkpoint.
const LAYOUT_PART: &str = "shards";
/// In a shard's cut: the shard had finished (the part is empty).
pub(super) const FINAL_PART: &str = "shard_final";
/// In a shard's cut: what other shards had handed it before the epoch that
/// it took only after its own cut (see `shard_epochs.rs`).
pub(super) const INBOX_PART: &str = "shard_inbox";

/// Version of the sharded layout (the `shards` part and the prefixes);
/// each shard's parts are an engine checkpoint of
/// [`super::SNAPSHOT_VERSION`].
pub const SHARDED_FORMAT: u32 = 1;

/// Cuts a shard may have waiting for the collector: one per epoch, and
/// an epoch starts only once the previous one is written, so two (an
/// epoch's cut and a finished shard's last) would do.
const CUTS_IN_FLIGHT: usize = 4;

/// What the `shards` part holds.
#[derive(Debug, Serialize, Deserialize)]
struct LayoutRecord {
    format: u32,
    shards: u32,
}

fn shard_prefix(shard: usize) -> String {
    format!("shard/{shard}/")
}

/// Every shard's cut of one epoch (in shard order) as one checkpoint.
fn assemble(cuts: &[Vec<(String, Bytes)>]) -> Result<Vec<(String, Bytes)>, SnapshotError> {
    let layout = LayoutRecord {
        format: SHARDED_FORMAT,
        shards: cuts.len() as u32,
    };
    let layout = postcard::to_allocvec(&layout).map_err(|e| SnapshotError::Codec {
        part: LAYOUT_PART.into(),
        reason: e.to_string(),
    })?;
    let mut parts = vec![(LAYOUT_PART.to_string(), Bytes::from(layout))];
    for (shard, cut) in cuts.iter().enumerate() {
        let prefix = shard_prefix(shard);
        parts.extend(
            cut.iter()
                .map(|(name, bytes)| (format!("{prefix}{name}"), bytes.clone())),
        );
    }
    Ok(parts)
}

/// How many shards wrote the checkpoint `parts`: `None` for an engine
/// alone.
pub(super) fn shards_of(parts: &[(String, Bytes)]) -> Result<Option<u32>, SnapshotError> {
    let Some((_, bytes)) = parts.iter().find(|(name, _)| name == LAYOUT_PART) else {
        return Ok(None);
    };
    let layout: LayoutRecord = postcard::from_bytes(bytes).map_err(|e| SnapshotError::Codec {
        part: LAYOUT_PART.into(),
        reason: e.to_string(),
    })?;
    if layout.format != SHARDED_FORMAT {
        return Err(SnapshotError::Mismatch(format!(
            "its shards were recorded in format {}, this runner reads {SHARDED_FORMAT}",
            layout.format
        )));
    }
    Ok(Some(layout.shards))
}

/// Shard `shard`'s own parts of a sharded checkpoint, under their engine
/// names.
pub(super) fn shard_parts(parts: &[(String, Bytes)], shard: ShardId) -> Vec<(String, Bytes)> {
    let prefix = shard_prefix(shard.index());
    parts
        .iter()
        .filter_map(|(name, bytes)| {
            name.strip_prefix(&prefix)
                .map(|name| (name.to_string(), bytes.clone()))
        })
        .collect()
}

/// One engine's checkpoint: its named parts.
pub type EngineParts = Vec<(String, Bytes)>;

/// Every shard's parts of the checkpoint `parts`, in shard order (each an
/// engine checkpoint, as [`super::describe_checkpoint`] reads one), or
/// `None` if one engine alone wrote it.
pub fn split_sharded_checkpoint(
    parts: &[(String, Bytes)],
) -> Result<Option<Vec<EngineParts>>, SnapshotError> {
    let Some(shards) = shards_of(parts)? else {
        return Ok(None);
    };
    let layout = ShardLayout::new(shards).map_err(|e| SnapshotError::Codec {
        part: LAYOUT_PART.into(),
        reason: e.to_string(),
    })?;
    Ok(Some(
        layout.ids().map(|id| shard_parts(parts, id)).collect(),
    ))
}

/// One shard's way to the collector: the channel its engine sends its
/// cuts to (see [`super::EngineBuilder::checkpoints`]) and the progress
/// of the job's checkpoints, which counts its cuts.
pub struct ShardCheckpoints {
    /// Where the shard's cuts go.
    pub tx: mpsc::Sender<Vec<(String, Bytes)>>,
    /// How far the job's checkpoints have got.
    pub progress: watch::Receiver<CheckpointProgress>,
}

/// The collector of a job on `shards` shards (see the module docs): what
/// each shard's engine is built with, in shard order, and the task to
/// run. Each epoch goes to `out` with `extra_parts` read as it goes;
/// `writer` is the writer's progress (without, an epoch counts as durable
/// once `out` took it). The task stops collecting when a shard's engine is
/// gone without a last cut (no later epoch can be complete) or `out`
/// closes, and ends once the writer's progress has ended too.
pub fn collect_epochs(
    shards: u32,
    extra_parts: Vec<(String, ExtraPart)>,
    out: mpsc::Sender<Vec<(String, Bytes)>>,
    writer: Option<watch::Receiver<CheckpointProgress>>,
) -> (Vec<ShardCheckpoints>, impl Future<Output = ()> + Send) {
    let (progress_tx, progress) = watch::channel(CheckpointProgress::default());
    let (senders, mut receivers): (Vec<_>, Vec<_>) = (0..shards)
        .map(|_| mpsc::channel::<Vec<(String, Bytes)>>(CUTS_IN_FLIGHT))
        .unzip();
    let ends = senders
        .into_iter()
        .map(|tx| ShardCheckpoints {
            tx,
            progress: progress.clone(),
        })
        .collect();
    let task = async move {
        let relay = writer.map(|mut writer| {
            let progress_tx = progress_tx.clone();
            tokio::spawn(async move {
                while writer.changed().await.is_ok() {
                    progress_tx.send_replace(*writer.borrow_and_update());
                }
            })
        });
        // Without the writer's progress, an epoch `out` took counts as
        // durable.
        let own_progress = relay.is_none().then_some(progress_tx);
        assemble_epochs(&mut receivers, &extra_parts, &out, own_progress).await;
        // The writer still reports the last epochs it was given: shards
        // that finished wait for the one holding their last cut. It ends
        // once `out` is gone and it wrote them.
        drop(out);
        if let Some(relay) = relay {
            let _ = relay.await;
        }
    };
    (ends, task)
}

/// Puts the `n`th cut of every shard together, for `n` = 1, 2, ..., and
/// sends each to `out` (reporting it durable on `progress`, if given),
/// until a shard's engine is gone without a last cut, every shard's last
/// cut went out, or `out` closes.
async fn assemble_epochs(
    receivers: &mut [mpsc::Receiver<Vec<(String, Bytes)>>],
    extra_parts: &[(String, ExtraPart)],
    out: &mpsc::Sender<Vec<(String, Bytes)>>,
    progress: Option<watch::Sender<CheckpointProgress>>,
) {
    let mut finals: Vec<Option<Vec<(String, Bytes)>>> = vec![None; receivers.len()];
    let mut epochs = 0u64;
    loop {
        let mut cuts = Vec::with_capacity(receivers.len());
        let mut fresh = false;
        for (rx, last) in receivers.iter_mut().zip(&mut finals) {
            if let Some(parts) = last {
                cuts.push(parts.clone());
                continue;
            }
            let Some(parts) = rx.recv().await else {
                debug!("a shard's engine is gone: no more epochs");
                return;
            };
            fresh = true;
            if parts.iter().any(|(name, _)| name == FINAL_PART) {
                *last = Some(parts.clone());
            }
            cuts.push(parts);
        }
        if !fresh {
            // Every shard finished, and their last cuts went out.
            return;
        }
        let mut parts = match assemble(&cuts) {
            Ok(parts) => parts,
            Err(error) => {
                warn!(%error, "cannot put the shards' cuts together");
                return;
            }
        };
        for (name, read) in extra_parts {
            parts.push((name.clone(), read()));
        }
        if out.send(parts).await.is_err() {
            return;
        }
        epochs += 1;
        if let Some(progress) = &progress {
            progress.send_replace(CheckpointProgress::all_durable(epochs));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(name: &str) -> Vec<(String, Bytes)> {
        vec![(name.to_string(), Bytes::from_static(b"x"))]
    }

    #[test]
    fn a_sharded_checkpoint_splits_into_what_each_shard_cut() {
        let parts = assemble(&[cut("engine"), cut("stage/0")]).expect("assembled");
        // Stores and savepoints hold these names and bytes: a change to
        // them needs a new SHARDED_FORMAT and a reader of this one.
        let names: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["shards", "shard/0/engine", "shard/1/stage/0"]);
        assert_eq!(parts[0].1.as_ref(), [1, 2], "format 1, two shards");
        assert_eq!(shards_of(&parts).expect("readable"), Some(2));
        assert_eq!(shard_parts(&parts, ShardId::SOURCES), cut("engine"));
        let split = split_sharded_checkpoint(&parts)
            .expect("readable")
            .expect("sharded");
        assert_eq!(split, [cut("engine"), cut("stage/0")]);
        assert_eq!(shards_of(&cut("engine")).expect("readable"), None);
    }

    #[tokio::test]
    async fn an_epoch_is_written_once_every_shard_cut_it() {
        let (out, mut written) = mpsc::channel(4);
        let metrics: ExtraPart = std::sync::Arc::new(|| Bytes::from_static(b"m"));
        let (ends, task) = collect_epochs(2, vec![("metrics".into(), metrics)], out, None);
        let collector = tokio::spawn(task);
        ends[0].tx.send(cut("a1")).await.expect("sent");
        tokio::task::yield_now().await;
        assert!(written.try_recv().is_err(), "shard 1 has not cut");
        ends[1].tx.send(cut("b1")).await.expect("sent");
        let first = written.recv().await.expect("epoch 1");
        let names: Vec<&str> = first.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["shards", "shard/0/a1", "shard/1/b1", "metrics"]);
        let mut progress = ends[0].progress.clone();
        progress
            .wait_for(|p| p.durable == 1)
            .await
            .expect("progress");
        // Shard 1 finishes: its last cut stands in for it from then on.
        let mut last = cut("b-final");
        last.push((FINAL_PART.into(), Bytes::new()));
        ends[1].tx.send(last).await.expect("sent");
        ends[0].tx.send(cut("a2")).await.expect("sent");
        let second = written.recv().await.expect("epoch 2");
        assert!(second.iter().any(|(n, _)| n == "shard/1/b-final"));
        ends[0].tx.send(cut("a3")).await.expect("sent");
        let third = written.recv().await.expect("epoch 3");
        assert!(third.iter().any(|(n, _)| n == "shard/0/a3"));
        assert!(third.iter().any(|(n, _)| n == "shard/1/b-final"));
        drop(ends);
        collector.await.expect("the collector ends");
    }
}
