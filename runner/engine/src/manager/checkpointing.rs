//! Periodic checkpoints of a running engine: when one is taken, how the
//! writer's progress comes back, and what waits for a checkpoint to be
//! durable (stable-input elements, bundle finalization).
//!
//! At most one checkpoint is outside the engine at a time. A checkpoint is
//! the engine's whole state encoded; taking the next one while the writer
//! still writes the previous would hold the state a third time (engine,
//! the one being written, the next one waiting), so the engine waits until
//! the writer reports the previous write finished — durable or failed —
//! and then takes a fresh one, which also holds everything committed
//! meanwhile.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Engine, EngineError, SnapshotError};
use crate::executor::CommitAction;
use crate::plan::{StageIdx, StageKind};

/// How far a checkpoint writer has got, counting checkpoints in the order
/// the engine sent them. The two counts differ once a write fails: that
/// checkpoint is finished but never durable, and the engine may take the
/// next one (which covers it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointProgress {
    /// Checkpoints received up to the last one written durably.
    pub durable: u64,
    /// Checkpoints received whose write has ended, durable or not.
    pub finished: u64,
}

impl CheckpointProgress {
    /// The first `n` checkpoints written, all durably.
    pub fn all_durable(n: u64) -> Self {
        Self {
            durable: n,
            finished: n,
        }
    }
}

/// A periodic checkpoint cut and not sent yet: its parts, and where it
/// cut each stage's queue (for stable input).
pub(super) struct Taken {
    pub(super) parts: Vec<(String, Bytes)>,
    marks: Vec<(StageIdx, u64)>,
}

impl Taken {
    /// Adds a part of the cut's owner.
    pub(super) fn push(&mut self, name: String, bytes: Bytes) {
        self.parts.push((name, bytes));
    }
}

/// Where a running engine sends its checkpoints (see [`super::EngineBuilder::checkpoints`]).
pub(super) struct CheckpointSink {
    pub(super) every: Duration,
    tx: mpsc::Sender<Vec<(String, Bytes)>>,
    pub(super) last: Instant,
    /// The writer's progress (the run loop takes it to wait on).
    pub(super) progress: Option<watch::Receiver<CheckpointProgress>>,
    /// Whether there is progress to wait for; without it a sent checkpoint
    /// counts as durable, and the channel's room says whether the writer
    /// is busy.
    acked: bool,
    /// Checkpoints sent so far.
    sent: u64,
    /// Checkpoints whose write has ended, as last reported.
    finished: u64,
    /// Sent checkpoints not yet durable, with where each cut the queues of
    /// stable-input stages.
    awaiting: VecDeque<(u64, Vec<(StageIdx, u64)>)>,
    /// Bundles committed since the last checkpoint was sent (what an
    /// interval of zero — a checkpoint after every commit — waits for).
    pub(super) commits: u64,
    /// Actions waiting for the checkpoint (by number sent) that holds
    /// their bundle's commit to be written.
    after_durable: VecDeque<(u64, CommitAction)>,
    /// Periodic checkpoints are put off while data is on the spill space
    /// (said once in the log when they start waiting, once when they go on).
    waiting_for_spill: bool,
    /// Writes that failed in a row (a full disk, say): each makes the
    /// next attempt wait longer ([`checkpoint_backoff`]), so a failing
    /// store is not asked again and again for a fresh copy of the state.
    failures: u32,
    /// No checkpoint is taken before this, after a failed write.
    retry_at: Option<Instant>,
    /// Failed writes in a row past which the run stops (see
    /// [`super::EngineBuilder::tolerable_checkpoint_failures`]); `None`:
    /// never.
    pub(super) tolerable_failures: Option<u32>,
}

/// The shortest first wait after failed checkpoint writes (with
/// checkpoints after every commit, the interval itself is zero).
const MIN_CHECKPOINT_BACKOFF: Duration = Duration::from_millis(1);
/// The longest wait between checkpoint attempts while writes fail.
const MAX_CHECKPOINT_BACKOFF: Duration = Duration::from_secs(60);

/// How long to wait before the next attempt after `failures` failed
/// writes in a row, with checkpoints every `every`: after one failure, as
/// usual (it may have been passing); after more, the interval (at least
/// [`MIN_CHECKPOINT_BACKOFF`]), doubling with each further failure, up to
/// [`MAX_CHECKPOINT_BACKOFF`]. `None`: no extra wait.
fn checkpoint_backoff(failures: u32, every: Duration) -> Option<Duration> {
    let doublings = failures.checked_sub(2)?.min(20);
    Some(
        every
            .max(MIN_CHECKPOINT_BACKOFF)
            .saturating_mul(1 << doublings)
            .min(MAX_CHECKPOINT_BACKOFF),
    )
}

impl CheckpointSink {
    /// Whether a checkpoint sent now would wait behind another: one sent
    /// and not finished, or, without progress reports, a full channel.
    fn writer_busy(&self) -> bool {
        if self.acked {
            self.sent > self.finished
        } else {
            self.tx.capacity() == 0
        }
    }
}

impl Engine {
    /// Send a checkpoint ([`Self::checkpoint_parts`]) to `tx` every
    /// `every` while the job runs; with `every` zero, after every commit,
    /// as often as the writer keeps up (bundles committed while it writes
    /// go into the next checkpoint together: group commit). A checkpoint
    /// due while the writer is busy with the previous one is not queued,
    /// and not even taken until the write ends (then at once, with
    /// `progress`; else an interval later): checkpointing never holds the
    /// job up nor piles up memory.
    ///
    /// Stages with stable input (`@RequiresStableInput`) are then given only
    /// elements a checkpoint holds; one is taken as soon as such a stage
    /// waits for it. With `progress` (see [`CheckpointProgress`]) an element
    /// counts once its checkpoint is durable, and the writer is busy until
    /// it reports the write finished; without, an element counts once its
    /// checkpoint is sent, and the writer is busy while the channel is full.
    pub(super) fn enable_checkpoints(
        &mut self,
        every: Duration,
        tx: mpsc::Sender<Vec<(String, Bytes)>>,
        progress: Option<watch::Receiver<CheckpointProgress>>,
    ) {
        self.durability.checkpoints = Some(CheckpointSink {
            every,
            tx,
            last: Instant::now(),
            acked: progress.is_some(),
            progress,
            sent: 0,
            finished: 0,
            awaiting: VecDeque::new(),
            commits: 0,
            after_durable: VecDeque::new(),
            waiting_for_spill: false,
            failures: 0,
            retry_at: None,
            tolerable_failures: None,
        });
        for (idx, stage) in self.topology.plan.stages.iter_enumerated() {
            if matches!(&stage.kind, StageKind::Sdk(sdk) if sdk.stable_input) {
                self.stages[idx].queue.pending.gate();
            }
        }
        if !self.durability.bags_may_spill(self.config.streaming) {
            for (idx, user_state) in self.user_state.iter_enumerated() {
                if let Err(error) = user_state.lock().disable_bag_spill() {
                    // Bags it could not read stay on disk (periodic
                    // checkpoints wait while they are there); parts it
                    // could not delete are garbage.
                    warn!(stage = %self.topology.plan.stages[idx].name, %error,
                          "turning off the spill of user state");
                }
            }
        }
    }

    /// Makes the next checkpoint due at once: an engine restored from a
    /// cut that only its caller holds (a savepoint file may go; an
    /// update's cut is in memory) is durable only once it wrote one of its
    /// own. Nothing happens without checkpoints.
    pub fn checkpoint_at_once(&mut self) {
        if let Some(sink) = &mut self.durability.checkpoints {
            if sink.every.is_zero() {
                sink.commits = sink.commits.max(1);
            } else if let Some(due) = Instant::now().checked_sub(sink.every) {
                sink.last = due;
            }
        }
    }

    /// Takes a checkpoint if one is due, or if a stable-input stage waits
    /// for one and none is being written.
    pub(super) fn maybe_checkpoint(&mut self) {
        let Some(sink) = &self.durability.checkpoints else {
            return;
        };
        let awaited = sink.awaiting.is_empty()
            && self
                .stages
                .iter()
                .any(|s| s.queue.pending.awaits_checkpoint());
        let due = if sink.every.is_zero() {
            sink.commits > 0
        } else {
            sink.last.elapsed() >= sink.every
        };
        if !due && !awaited {
            return;
        }
        if sink.retry_at.is_some_and(|at| at > Instant::now()) {
            return;
        }
        if sink.writer_busy() {
            // Taken now, it would only wait (or be dropped). With progress
            // reports it stays due, and the writer's next report wakes the
            // run loop to take it (the loop sets no timer for it meanwhile,
            // see `checkpoint_deadline`); without, the channel's room is
            // all there is to watch, and a periodic one comes a whole
            // interval later, as if taken now.
            if let Some(sink) = &mut self.durability.checkpoints {
                if !sink.every.is_zero() && !sink.acked {
                    sink.last = Instant::now();
                }
            }
            return;
        }
        self.release_hand_outs_or_warn();
        if !awaited {
            let spilled = self.spilled();
            let waits = self
                .durability
                .checkpoints
                .as_ref()
                .is_some_and(|s| s.waiting_for_spill);
            match spilled {
                // Not worth copying spilled bytes back: the previous
                // checkpoint stays the latest until they are worked off.
                Some((idx, what)) => {
                    if !waits {
                        let stage = &self.topology.plan.stages[idx].name;
                        let why = "periodic checkpoints wait while this stage has spilled data";
                        info!(%stage, what, "{why}");
                    }
                    if let Some(sink) = &mut self.durability.checkpoints {
                        sink.waiting_for_spill = true;
                        sink.last = Instant::now();
                    }
                    return;
                }
                None if waits => {
                    info!("periodic checkpoints resume: no data left on the spill space");
                    if let Some(sink) = &mut self.durability.checkpoints {
                        sink.waiting_for_spill = false;
                    }
                }
                None => {}
            }
        }
        if self.shard.is_some() {
            // On shards a checkpoint is an epoch every shard cuts.
            return self.start_epoch();
        }
        let number = self
            .durability
            .checkpoints
            .as_ref()
            .map_or(0, |sink| sink.sent + 1);
        match self.cut_for_checkpoint(number) {
            Ok(taken) => self.send_checkpoint(taken),
            Err(error) => {
                // The job goes on; the previous checkpoint stays the latest.
                if let Some(sink) = &mut self.durability.checkpoints {
                    sink.last = Instant::now();
                }
                warn!(%error, "cannot take a checkpoint");
            }
        }
    }

    /// Periodic checkpoint `number`, cut now: its parts, and where it cuts
    /// the queues of stable-input stages.
    pub(super) fn cut_for_checkpoint(&mut self, number: u64) -> Result<Taken, SnapshotError> {
        let parts = self.cut(Some(number))?;
        for s in &mut self.stages {
            s.queue.pending.checkpoint_taken(number);
            if let Some(g) = s.grouping_mut() {
                g.checkpoint_taken(number);
            }
        }
        let marks = self
            .stages
            .iter_enumerated()
            .map(|(idx, s)| (idx, s.queue.pending.checkpoint_mark()))
            .collect();
        Ok(Taken { parts, marks })
    }

    /// Sends a checkpoint cut by [`Self::cut_for_checkpoint`] to the
    /// writer, and keeps what waits for it to be durable.
    pub(super) fn send_checkpoint(&mut self, Taken { parts, marks }: Taken) {
        let Some(sink) = &mut self.durability.checkpoints else {
            return;
        };
        sink.last = Instant::now();
        match sink.tx.try_send(parts) {
            Ok(()) => {
                sink.sent += 1;
                sink.commits = 0;
                if sink.acked {
                    sink.awaiting.push_back((sink.sent, marks));
                } else {
                    let sent = sink.sent;
                    self.made_durable(marks);
                    self.spill_durable(sent);
                }
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                debug!("previous checkpoint still being written; skipping this one");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                debug!("nobody writes checkpoints any more");
            }
        }
    }

    /// Sends parts that are no periodic checkpoint of their own (a
    /// finished shard's last cut) to the writer, if it has room.
    pub(super) fn send_checkpoint_parts(&mut self, parts: Vec<(String, Bytes)>) {
        if let Some(sink) = &self.durability.checkpoints {
            if let Err(error) = sink.tx.try_send(parts) {
                debug!(%error, "the checkpoint writer took no more parts");
            }
        }
    }

    /// Whether checkpoints are taken at all.
    pub(super) fn checkpoints_enabled(&self) -> bool {
        self.durability.checkpoints.is_some()
    }

    /// The writer reported `progress` (or, with `None`, went away: nothing
    /// more becomes durable). Fails once more writes failed in a row than
    /// the sink tolerates.
    pub(super) fn checkpoint_progress(
        &mut self,
        progress: Option<CheckpointProgress>,
    ) -> Result<(), EngineError> {
        let Some(progress) = progress else {
            if let Some(sink) = &mut self.durability.checkpoints {
                sink.awaiting.clear();
                sink.acked = false;
                // Never durable: not finalized (a source delivers it
                // again).
                sink.after_durable.clear();
            }
            return Ok(());
        };
        self.checkpoints_written(progress.durable);
        if let Some(sink) = &mut self.durability.checkpoints {
            if progress.finished > sink.finished {
                if progress.finished > progress.durable {
                    sink.failures = sink.failures.saturating_add(1);
                    let wait = checkpoint_backoff(sink.failures, sink.every);
                    sink.retry_at = wait.map(|wait| Instant::now() + wait);
                    warn!(
                        failures = sink.failures,
                        ?wait,
                        "a checkpoint write failed; the next attempt waits"
                    );
                } else {
                    sink.failures = 0;
                    sink.retry_at = None;
                }
            }
            sink.finished = sink.finished.max(progress.finished);
            // Finished and not durable: failed. What they cut from
            // stable-input queues waits for a later checkpoint, which a
            // waiting stage now asks for (it would not while one is
            // awaited). Their finalizations wait too: they count on the
            // next checkpoint that is written, which holds their commits.
            let finished = sink.finished;
            sink.awaiting.retain(|(n, _)| *n > finished);
            if let Some(tolerable) = sink.tolerable_failures {
                if sink.failures > tolerable {
                    return Err(EngineError::CheckpointsFailing {
                        failures: sink.failures,
                        tolerable,
                    });
                }
            }
        }
        Ok(())
    }

    /// The writer made `written` checkpoints durable: what they cut from
    /// stable-input queues may now be processed. (A checkpoint whose write
    /// failed is covered by the later one that succeeded.)
    fn checkpoints_written(&mut self, written: u64) {
        let Some(sink) = &mut self.durability.checkpoints else {
            return;
        };
        let mut durable = Vec::new();
        while sink.awaiting.front().is_some_and(|(n, _)| *n <= written) {
            if let Some((_, marks)) = sink.awaiting.pop_front() {
                durable = marks;
            }
        }
        while sink
            .after_durable
            .front()
            .is_some_and(|(n, _)| *n <= written)
        {
            if let Some((_, action)) = sink.after_durable.pop_front() {
                action.run();
            }
        }
        self.made_durable(durable);
        self.spill_durable(written);
    }

    /// Checkpoints up to `number` are durable: bags, queue segments and
    /// GroupByKey windows on the durable spill space that only earlier ones
    /// named may go. (What cannot
    /// be deleted now is owed again by the next checkpoint.)
    fn spill_durable(&mut self, number: u64) {
        for (idx, user_state) in self.user_state.iter_enumerated() {
            if let Err(error) = user_state.lock().checkpoint_durable(number) {
                warn!(stage = %self.topology.plan.stages[idx].name, %error,
                      "cannot delete user state no checkpoint needs");
            }
        }
        for (idx, s) in self.stages.iter_enumerated_mut() {
            if let Err(error) = s.queue.pending.checkpoint_durable(number) {
                warn!(stage = %self.topology.plan.stages[idx].name, %error,
                      "cannot delete queued elements no checkpoint needs");
            }
            let grouping = s.grouping_mut().map(|g| g.checkpoint_durable(number));
            if let Some(Err(error)) = grouping {
                warn!(stage = %self.topology.plan.stages[idx].name, %error,
                      "cannot delete spilled GroupByKey windows no checkpoint needs");
            }
        }
    }

    /// Runs `action` once what was committed so far is durable: now, if
    /// checkpoints are not acknowledged, else after the next checkpoint
    /// (which will hold this commit) is written.
    pub(super) fn when_durable(&mut self, action: CommitAction) {
        // On a shard, sends lag cuts: an epoch cut and not yet sent does
        // not hold this commit either.
        let cut = self.last_epoch_cut();
        match &mut self.durability.checkpoints {
            Some(sink) if sink.acked => {
                let holding = cut.map_or(sink.sent, |cut| cut.max(sink.sent)) + 1;
                sink.after_durable.push_back((holding, action));
            }
            _ => action.run(),
        }
    }

    /// How many checkpoints were sent to the writer, and whether actions
    /// wait for them to be durable (`None` without acknowledged
    /// checkpoints).
    pub(super) fn waiting_for_durability(&self) -> Option<(u64, bool)> {
        let sink = self.durability.checkpoints.as_ref().filter(|s| s.acked)?;
        Some((sink.sent, !sink.after_durable.is_empty()))
    }

    /// The job is done: nothing will be redone, so its outputs are final
    /// whatever was written.
    pub(super) fn run_every_after_durable(&mut self) {
        if let Some(sink) = &mut self.durability.checkpoints {
            for (_, action) in sink.after_durable.drain(..) {
                action.run();
            }
        }
    }

    fn made_durable(&mut self, marks: Vec<(StageIdx, u64)>) {
        for (idx, mark) in marks {
            self.stages[idx].queue.pending.made_durable(mark);
        }
    }

    /// When the run loop must wake for the next periodic checkpoint: none
    /// while the writer is busy and will report (its report wakes it), or
    /// with an interval of zero (commits do).
    pub(super) fn checkpoint_deadline(&self) -> Option<Instant> {
        let sink = self.durability.checkpoints.as_ref()?;
        if sink.acked && sink.writer_busy() {
            return None;
        }
        let retry_at = sink.retry_at.filter(|at| *at > Instant::now());
        match (sink.every.is_zero(), retry_at) {
            (true, None) => None,
            (true, Some(at)) => Some(at),
            (false, at) => {
                Some(at.map_or(sink.last + sink.every, |at| at.max(sink.last + sink.every)))
            }
        }
    }

    /// When a stable-input stage waiting for a checkpoint may ask for one
    /// again: soon, unless failed writes made checkpoints wait.
    pub(super) fn checkpoint_retry_at(&self) -> Instant {
        let soon = Instant::now() + Duration::from_millis(5);
        self.durability
            .checkpoints
            .as_ref()
            .and_then(|sink| sink.retry_at)
            .map_or(soon, |at| at.max(soon))
    }

    /// Whether the run waits for the writer to make a checkpoint durable.
    pub(super) fn awaiting_checkpoint(&self) -> bool {
        self.durability
            .checkpoints
            .as_ref()
            .is_some_and(|sink| !sink.awaiting.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_after_failed_writes_doubles_up_to_a_minute() {
        let every = Duration::from_secs(5);
        assert_eq!(checkpoint_backoff(1, every), None);
        assert_eq!(checkpoint_backoff(2, every), Some(every));
        assert_eq!(checkpoint_backoff(4, every), Some(every * 4));
        assert_eq!(checkpoint_backoff(5, every), Some(every * 8));
        assert_eq!(checkpoint_backoff(6, every), Some(MAX_CHECKPOINT_BACKOFF));
        assert_eq!(
            checkpoint_backoff(u32::MAX, every),
            Some(MAX_CHECKPOINT_BACKOFF)
        );
        let after_every_commit = Duration::ZERO;
        assert_eq!(
            checkpoint_backoff(3, after_every_commit),
            Some(MIN_CHECKPOINT_BACKOFF * 2)
        );
    }
}
