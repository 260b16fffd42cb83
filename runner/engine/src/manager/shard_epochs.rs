//! Checkpoints of a job on shards: aligned epochs.
//!
//! A checkpoint of one engine is a cut of its state between two commits.
//! A job on shards needs every shard's cut to agree on what crossed
//! between them: an element handed from shard A to shard B must be in
//! exactly one of the two cuts — in A's (not yet sent) or in B's (taken,
//! or recorded as taken) — never in both and never in neither. Shards cut
//! at different moments, so the exchange tags each delivery with the last
//! [`Epoch`] its sender had cut when it sent it, and a shard at epoch `e`
//! (its last cut) reads the tags of what it takes:
//!
//! * tagged `e`: sent after the sender's cut of `e`, as this shard's own
//!   work since `e` is; it is taken as usual, and belongs to epoch `e+1`.
//! * tagged `e+1`: the sender has cut epoch `e+1` already, and its cut
//!   does not hold this. This shard cuts `e+1` first (so its cut does not
//!   hold it either), then takes it.
//! * tagged below `e`: sent before the sender cut `e`, so in neither cut
//!   of `e` yet. It is taken, and also recorded beside this shard's cut of
//!   `e` (the `shard_inbox` part), as in Chandy and Lamport's snapshots:
//!   restoring puts it back.
//!
//! Any shard may start an epoch (its checkpoint is due and the previous
//! one is written): it sends what it has for other shards, cuts, and
//! marks the cut on the board, which wakes the others; each cuts the same
//! epoch at its next take. A shard's cut of `e` is complete once every
//! other shard has cut `e` (nothing sent before their cuts can still
//! arrive after the take that shows it); then it goes to the collector
//! (`sharded_checkpoint.rs`), which writes epoch `e` once every shard's
//! cut is in. A shard starts an epoch only once its own cut of the
//! previous one went out, which needs every shard to have cut that one:
//! the shards' cut numbers differ by at most one, and a shard that sees a
//! newer epoch sends its open one first. Periodic epochs also wait until
//! the previous one is written; a savepoint's does not.
//!
//! A savepoint is an epoch shard 0 cuts when asked ([`EpochRequest`]).
//! With stop, shard 0 puts the stop on the board before it cuts, so every
//! shard learns of it by the time it cuts: from its cut on it runs nothing
//! more (it only takes what others sent before their cuts, for its cut's
//! record), and it stops once its cut went out.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::checkpointing::Taken;
use super::scheduling::element_key_group_index;
use super::sharded_checkpoint::{
    shard_parts, split_sharded_checkpoint, EngineParts, FINAL_PART, INBOX_PART,
};
use super::stage_map::NameMapping;
use super::{CheckpointProgress, Engine, EngineError, SnapshotError};
use crate::coder::decode_windowed_values;
use crate::plan::PCollectionIdx;
use crate::shards::exchange::{Delivery, Handed};
use crate::shards::{Epoch, ShardId};

/// A request to one shard of a job for an epoch now (a savepoint): it
/// answers with the epoch that will hold the job as of now, which the
/// epochs' collector then puts together. With `stop`, every shard stops
/// once its cut of that epoch is complete, so that nothing happens between
/// the savepoint and the stop.
#[derive(Debug)]
pub struct EpochRequest {
    /// Stop every shard after the epoch.
    pub stop: bool,
    /// Where the epoch's number goes, once it is cut here.
    pub cut: tokio::sync::oneshot::Sender<Epoch>,
}

/// Where one shard is in its job's checkpoint epochs.
#[derive(Default)]
pub(super) struct EpochState {
    /// The last epoch this shard cut.
    cut: Epoch,
    /// The newest epoch any shard had cut at this shard's last take.
    newest: Epoch,
    /// The epoch cut and not complete yet.
    open: Option<OpenEpoch>,
    /// Deliveries a restored cut recorded, taken at the first take.
    restored: Vec<Delivery>,
    /// Requests for an epoch not answered yet.
    requested: Vec<EpochRequest>,
    /// The epoch after which this shard stops, as the board said.
    stop_after: Option<Epoch>,
    /// The last epoch whose cut this shard sent.
    sent: Epoch,
}

/// A cut waiting for the other shards to cut the same epoch.
struct OpenEpoch {
    epoch: Epoch,
    taken: Taken,
    /// Deliveries sent before the epoch and taken after the cut.
    inbox: Vec<Delivery>,
}

/// The deliveries a cut's `shard_inbox` part records.
fn decode_inbox(bytes: &[u8]) -> Result<Vec<InboxRecord>, SnapshotError> {
    postcard::from_bytes(bytes).map_err(|e| SnapshotError::Codec {
        part: INBOX_PART.into(),
        reason: e.to_string(),
    })
}

/// A delivery as a cut records it: by PCollection id, which outlives the
/// plan's numbering.
#[derive(Debug, Serialize, Deserialize)]
struct InboxRecord {
    pcollection: String,
    side_input: bool,
    elements: Vec<u8>,
}

impl Engine {
    /// Takes `handed` in epoch order (see the module docs): `newest` is
    /// the newest epoch any shard cut, `others_cut` the oldest every other
    /// unfinished shard cut.
    pub(super) fn take_handed(
        &mut self,
        handed: Vec<Handed>,
        newest: Epoch,
        others_cut: Epoch,
        stop_after: Option<Epoch>,
    ) -> Result<(), EngineError> {
        let Some(shard) = self.shard.as_mut() else {
            return Ok(());
        };
        for delivery in std::mem::take(&mut shard.epochs.restored) {
            self.apply_delivery(delivery)?;
        }
        let Some(shard) = self.shard.as_mut() else {
            return Ok(());
        };
        shard.epochs.newest = shard.epochs.newest.max(newest);
        shard.epochs.stop_after = stop_after;
        let mine = shard.epochs.cut;
        let mut after_next_cut = Vec::new();
        for Handed { epoch, delivery } in handed {
            if epoch > mine {
                after_next_cut.push(delivery);
                continue;
            }
            if epoch < mine {
                if let Some(open) = self.shard.as_mut().and_then(|s| s.epochs.open.as_mut()) {
                    open.inbox.push(delivery.clone());
                }
            }
            self.apply_delivery(delivery)?;
        }
        // Nobody starts an epoch before every shard cut the one before:
        // an open epoch is complete by the time a newer one shows.
        self.send_epoch_if_complete(others_cut)?;
        if newest > mine && self.checkpoints_enabled() {
            self.cut_epoch().map_err(|source| EngineError::ShardCut {
                shard: self.shard_id_or_sources(),
                epoch: mine.next(),
                source,
            })?;
        }
        for delivery in after_next_cut {
            self.apply_delivery(delivery)?;
        }
        self.send_epoch_if_complete(others_cut)?;
        self.answer_epoch_requests();
        Ok(())
    }

    /// Takes a request for an epoch now (see [`EpochRequest`]).
    pub(super) fn request_epoch(&mut self, request: EpochRequest) {
        if let Some(shard) = self.shard.as_mut() {
            shard.epochs.requested.push(request);
        }
        self.answer_epoch_requests();
    }

    /// Answers the requests for an epoch: one without stop with the epoch
    /// this shard has open (its cut is as recent as the request's wish:
    /// nothing this shard did since is lost, it is redone from there), or
    /// with a new one cut now; with stop, always a new one, whose stop the
    /// board holds before anyone cuts it (so that every shard stops at its
    /// cut), once no epoch is being cut.
    fn answer_epoch_requests(&mut self) {
        let Some(shard) = self.shard.as_ref() else {
            return;
        };
        if shard.epochs.requested.is_empty() || !self.checkpoints_enabled() {
            return;
        }
        if shard.epochs.newest > shard.epochs.cut {
            return;
        }
        let stops = shard.epochs.requested.iter().any(|r| r.stop);
        if stops && shard.epochs.open.is_some() {
            return;
        }
        if shard.epochs.open.is_none() {
            if stops {
                shard.link.stop_after(shard.epochs.cut.next());
            }
            if let Err(error) = self.cut_epoch() {
                warn!(%error, "cannot cut the epoch a savepoint asked for");
                return;
            }
        }
        let Some(shard) = self.shard.as_mut() else {
            return;
        };
        let epoch = shard.epochs.cut;
        for request in shard.epochs.requested.drain(..) {
            let _ = request.cut.send(epoch);
        }
    }

    /// Whether this shard cut the epoch the job stops after and waits for
    /// the others' cuts: nothing more runs here (as nothing runs after one
    /// engine's savepoint with stop); it only takes what they sent before
    /// their cuts.
    pub(super) fn frozen_for_stop(&self) -> bool {
        self.shard.as_ref().is_some_and(|s| {
            s.epochs
                .stop_after
                .is_some_and(|stop| stop <= s.epochs.cut && stop > s.epochs.sent)
        })
    }

    /// On a shard, the number of the last epoch it cut (a commit now is
    /// in the next one only); `None` for a single engine.
    pub(super) fn last_epoch_cut(&self) -> Option<u64> {
        self.shard.as_ref().map(|s| s.epochs.cut.number())
    }

    /// Whether this shard's cut of the epoch the job stops after went out:
    /// the run ends here (as a single engine's does after a savepoint with
    /// stop).
    pub(super) fn stopped_after_epoch(&self) -> bool {
        self.shard.as_ref().is_some_and(|s| {
            s.epochs
                .stop_after
                .is_some_and(|stop| stop <= s.epochs.sent)
        })
    }

    /// Sends the open epoch if every other shard has cut it
    /// (`others_cut`): whatever they sent before was in this take.
    fn send_epoch_if_complete(&mut self, others_cut: Epoch) -> Result<(), EngineError> {
        let complete = self
            .shard
            .as_ref()
            .and_then(|s| s.epochs.open.as_ref())
            .is_some_and(|open| open.epoch <= others_cut);
        if complete {
            self.send_epoch()?;
        }
        Ok(())
    }

    /// A periodic checkpoint is due on this shard: starts the next epoch,
    /// unless one is being cut. A failed cut leaves the board as it was:
    /// the job goes on, and the previous epoch stays the latest.
    pub(super) fn start_epoch(&mut self) {
        let Some(shard) = &self.shard else {
            return;
        };
        if shard.epochs.open.is_some() || shard.epochs.newest > shard.epochs.cut {
            return;
        }
        if let Err(error) = self.cut_epoch() {
            warn!(%error, "cannot start a checkpoint epoch");
        }
    }

    /// Cuts the next epoch: sends what waits for other shards (it was
    /// made before the cut), cuts, and marks the cut on the board.
    fn cut_epoch(&mut self) -> Result<(), SnapshotError> {
        self.send_outgoing();
        let epoch = match &self.shard {
            Some(shard) => shard.epochs.cut.next(),
            None => return Ok(()),
        };
        let taken = self.cut_for_checkpoint(epoch.number())?;
        if let Some(shard) = self.shard.as_mut() {
            shard.link.cut(epoch);
            shard.epochs.cut = epoch;
            shard.epochs.newest = shard.epochs.newest.max(epoch);
            shard.epochs.open = Some(OpenEpoch {
                epoch,
                taken,
                inbox: Vec::new(),
            });
            debug!(shard = %shard.link.id(), %epoch, "cut a checkpoint epoch");
        }
        Ok(())
    }

    /// The open epoch is complete here: its cut, with the deliveries it
    /// recorded, goes to the collector.
    fn send_epoch(&mut self) -> Result<(), EngineError> {
        let Some(open) = self.shard.as_mut().and_then(|s| s.epochs.open.take()) else {
            return Ok(());
        };
        let OpenEpoch {
            epoch,
            mut taken,
            inbox,
        } = open;
        if !inbox.is_empty() {
            let bytes = self
                .encode_inbox(inbox)
                .map_err(|source| EngineError::ShardCut {
                    shard: self.shard_id_or_sources(),
                    epoch,
                    source,
                })?;
            taken.push(INBOX_PART.to_string(), bytes);
        }
        self.send_checkpoint(taken);
        if let Some(shard) = self.shard.as_mut() {
            shard.epochs.sent = epoch;
        }
        Ok(())
    }

    /// This shard finished: the epoch it cut goes out as it is (nothing
    /// more can arrive), then its last cut, which stands in for it in
    /// every later epoch.
    pub(super) fn send_last_cut(&mut self) -> Result<(), EngineError> {
        if self.shard.is_none() || !self.checkpoints_enabled() {
            return Ok(());
        }
        self.send_epoch()?;
        let mut parts = self.cut(None).map_err(|source| EngineError::ShardCut {
            shard: self.shard_id_or_sources(),
            epoch: Epoch::EVERY,
            source,
        })?;
        parts.push((FINAL_PART.to_string(), Bytes::new()));
        self.send_checkpoint_parts(parts);
        Ok(())
    }

    /// On a shard that finished: its end is not the job's (another shard
    /// may still fail, and the job resume from the last written epoch), so
    /// what its bundles finalize waits until the epoch holding its last
    /// cut — the next one written after the epochs it sent — is durable,
    /// or the writer is gone. A single engine runs them as it ends.
    pub(super) async fn finalize_after_last_cut(
        &mut self,
        mut progress: Option<watch::Receiver<CheckpointProgress>>,
        cancel: &mut watch::Receiver<bool>,
    ) -> Result<(), EngineError> {
        if self.shard.is_none() {
            return Ok(());
        }
        let Some((sent, true)) = self.waiting_for_durability() else {
            self.run_every_after_durable();
            return Ok(());
        };
        while let Some(watching) = progress.as_mut() {
            let durable = watching.borrow_and_update().durable;
            if durable > sent {
                break;
            }
            tokio::select! {
                changed = watching.changed() => {
                    if changed.is_err() {
                        progress = None;
                    }
                }
                changed = cancel.changed() => {
                    if changed.is_err() || *cancel.borrow() {
                        return Err(EngineError::Cancelled);
                    }
                }
            }
        }
        self.run_every_after_durable();
        Ok(())
    }

    /// Restores this shard from its parts of the sharded checkpoint
    /// `parts` (see [`Engine::restore_renamed`]); the deliveries its cut
    /// recorded are taken at the first take.
    pub(super) fn restore_shard(
        &mut self,
        parts: &[(String, Bytes)],
        renamed: &NameMapping,
    ) -> Result<(), SnapshotError> {
        let Some(id) = self.shard.as_ref().map(|s| s.link.id()) else {
            return Ok(());
        };
        let own = shard_parts(parts, id);
        self.restore_engine_parts(&own, renamed)?;
        self.restore_inbox(&own)
    }

    /// Restores this shard (or this one engine) from a checkpoint of
    /// another number of shards (or of one engine, read as one shard
    /// owning every key group), moving key groups (see `reshard.rs`).
    pub(super) fn restore_resharded(
        &mut self,
        parts: &[(String, Bytes)],
        renamed: &NameMapping,
    ) -> Result<(), SnapshotError> {
        let old = match split_sharded_checkpoint(parts)? {
            Some(old) => old,
            None => vec![parts.to_vec()],
        };
        let cut = self.reshard_cut(&old)?;
        self.restore_engine_parts(&cut, renamed)?;
        if self.shard_id().is_some_and(|id| id != ShardId::SOURCES) {
            // A one-engine cut's sources' progress is shard 0's alone.
            self.leave_sources_to_shard_zero();
        }
        self.restore_inbox(&cut)
    }

    /// Keeps the deliveries a restored cut recorded (its `shard_inbox`
    /// part), for a shard's first take; one engine, which takes nothing
    /// from others, queues them at once.
    fn restore_inbox(&mut self, parts: &[(String, Bytes)]) -> Result<(), SnapshotError> {
        let Some((_, bytes)) = parts.iter().find(|(name, _)| name == INBOX_PART) else {
            return Ok(());
        };
        let mut restored = Vec::new();
        for record in decode_inbox(bytes)? {
            let pcollection = self.pcollection_in_transit(&record.pcollection)?;
            let elements = Bytes::from(record.elements);
            restored.push(Delivery::new(pcollection, record.side_input, elements));
        }
        match self.shard.as_mut() {
            Some(shard) => shard.epochs.restored = restored,
            None => {
                for delivery in restored {
                    self.apply_delivery(delivery)
                        .map_err(|e| SnapshotError::Codec {
                            part: INBOX_PART.into(),
                            reason: e.to_string(),
                        })?;
                }
            }
        }
        Ok(())
    }

    /// The elements in transit to this shard, from the cuts `old` of
    /// another number of shards: those of keys whose group `owns` accepts,
    /// from every old shard, and side-input elements from old shard
    /// `primary` only (each old shard had every broadcast element, taken
    /// or in transit).
    pub(super) fn reshard_inbox(
        &self,
        old: &[EngineParts],
        primary: usize,
        owns: impl Fn(u32) -> bool,
    ) -> Result<Option<(String, Bytes)>, SnapshotError> {
        let mut kept = Vec::new();
        for (k, cut) in old.iter().enumerate() {
            let Some((_, bytes)) = cut.iter().find(|(name, _)| name == INBOX_PART) else {
                continue;
            };
            for record in decode_inbox(bytes)? {
                if record.side_input {
                    if k == primary {
                        kept.push(record);
                    }
                    continue;
                }
                let pcollection = self.pcollection_in_transit(&record.pcollection)?;
                let pc = &self.topology.plan.pcollections[pcollection];
                let elements = decode_windowed_values(
                    &Bytes::from(record.elements),
                    &pc.value_coder,
                    &pc.window_coder,
                )
                .map_err(|e| SnapshotError::Codec {
                    part: INBOX_PART.into(),
                    reason: e.to_string(),
                })?;
                let mut mine = Vec::new();
                for e in elements {
                    if owns(element_key_group_index(&pc.value_coder, &e)) {
                        mine.extend_from_slice(&e.encoded);
                    }
                }
                if !mine.is_empty() {
                    kept.push(InboxRecord {
                        pcollection: record.pcollection,
                        side_input: false,
                        elements: mine,
                    });
                }
            }
        }
        if kept.is_empty() {
            return Ok(None);
        }
        let bytes = postcard::to_allocvec(&kept).map_err(|e| SnapshotError::Codec {
            part: INBOX_PART.into(),
            reason: e.to_string(),
        })?;
        Ok(Some((INBOX_PART.to_string(), Bytes::from(bytes))))
    }

    fn encode_inbox(&self, inbox: Vec<Delivery>) -> Result<Bytes, SnapshotError> {
        let pcollections = &self.topology.plan.pcollections;
        let records: Vec<InboxRecord> = inbox
            .into_iter()
            .map(|delivery| {
                let (pcollection, side_input, elements) = delivery.into_parts();
                InboxRecord {
                    pcollection: pcollections[pcollection].id.clone(),
                    side_input,
                    elements: elements.to_vec(),
                }
            })
            .collect();
        postcard::to_allocvec(&records)
            .map(Bytes::from)
            .map_err(|e| SnapshotError::Codec {
                part: INBOX_PART.into(),
                reason: e.to_string(),
            })
    }

    /// The PCollection a cut's recorded delivery is of, by its id; a
    /// pipeline without it cannot take the checkpoint.
    fn pcollection_in_transit(&self, id: &str) -> Result<PCollectionIdx, SnapshotError> {
        self.topology
            .plan
            .pcollections
            .iter_enumerated()
            .find(|(_, p)| p.id == id)
            .map(|(idx, _)| idx)
            .ok_or_else(|| {
                SnapshotError::Mismatch(format!(
                    "elements in transit between shards are of PCollection '{id}', which this \
                     pipeline does not have"
                ))
            })
    }

    pub(super) fn shard_id_or_sources(&self) -> crate::shards::ShardId {
        self.shard_id().unwrap_or(ShardId::SOURCES)
    }
}
