//! Moving a running job onto another number of engine shards, under its
//! id (`refract rescale JOB --shards M`, the admin call `RescaleJob`).
//!
//! The job's attempt stops right after a savepoint taken in memory (as an
//! update stops the job it replaces), and the next attempt runs on the new
//! number of shards from that cut: each key group's queued elements,
//! GroupByKey buffers, user state and timers go to the shard owning the
//! group now (`refract_engine::manager`'s resharding; one engine counts
//! as one shard owning every group). On a server with `--state_dir` the
//! cut becomes the job's latest checkpoint and the new number goes into
//! its record before the next attempt starts, so a crash from there on
//! resumes it on the new shards; without, the cut is handed over in
//! memory. The job stays RUNNING throughout: its clients see messages,
//! not a new job.
//!
//! A job on two or more shards takes savepoints only with checkpoints on
//! (a server with `--state_dir`); the savepoint's refusal says so, and the
//! job runs on as it was.
//!
//! A checkpointed job on shard hosts that did not choose its number of
//! shards runs one shard per host, and follows the hosts: when more have
//! attached than it runs on, its run asks here to move onto one per host
//! ([`HostPlacement::follow`]), the same way, keeping no number in its
//! record. (Hosts that leave end their runs, which resume from the latest
//! checkpoint on the hosts left.)

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use refract_engine::manager::EngineError;
use refract_engine::shards::ShardLayout;
use refract_jobservice::{Job, RescaleError};
use refract_observability::insights::JobView;
use refract_proto::job_api::job_message::MessageImportance;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use super::update::HandedOver;
use super::JobError;
use crate::durability::Durability;

/// Rescale requests a job's task takes at once (more wait to be sent).
const QUEUED_REQUESTS: usize = 4;

/// How long an attempt that ended during a savepoint waits for the cut.
const CUT_AFTER_END: std::time::Duration = std::time::Duration::from_secs(10);

/// One request to move a job onto `to` shards, and where its answer goes.
pub(super) struct RescaleRequest {
    to: u32,
    /// Asked by a run following its shard hosts (see the module docs):
    /// the job goes on one shard per host, not on a chosen number.
    follows_hosts: bool,
    answer: oneshot::Sender<Result<u32, RescaleError>>,
}

impl RescaleRequest {
    /// The move this request makes from `from` shards, its savepoint cut.
    fn taken(self, from: u32, cut: Vec<(String, Bytes)>) -> Move {
        Move {
            from,
            to: self.to,
            follows_hosts: self.follows_hosts,
            cut,
            answer: self.answer,
        }
    }
}

/// A running job's way to its rescale requests, and how many shards it
/// runs on now.
struct Entry {
    tx: mpsc::Sender<RescaleRequest>,
    shards: Arc<AtomicU32>,
}

/// The rescale requests of the server's running jobs, by job id: the
/// admin call asks here, each job's task takes its own.
#[derive(Default)]
pub(super) struct RescaleDesk {
    open: Mutex<HashMap<String, Entry>>,
}

impl RescaleDesk {
    /// Opens job `job_id`'s inbox, the job running on `shards` shards;
    /// closed when the inbox is dropped.
    pub(super) fn open(self: &Arc<Self>, job_id: &str, shards: u32) -> RescaleInbox {
        let (tx, rx) = mpsc::channel(QUEUED_REQUESTS);
        let count = Arc::new(AtomicU32::new(shards));
        self.open.lock().insert(
            job_id.to_string(),
            Entry {
                tx: tx.clone(),
                shards: count.clone(),
            },
        );
        RescaleInbox {
            desk: self.clone(),
            job_id: job_id.to_string(),
            tx,
            rx,
            shards: count,
        }
    }

    /// How many shards running job `job_id` runs on (1: one engine).
    pub(super) fn shards(&self, job_id: &str) -> Option<u32> {
        self.open
            .lock()
            .get(job_id)
            .map(|e| e.shards.load(Ordering::Relaxed))
    }

    /// Asks running job `job_id` to move onto `to` shards; once it runs on
    /// them, the number it ran on before.
    pub(super) async fn ask(&self, job_id: &str, to: u32) -> Result<u32, RescaleError> {
        let tx = self.open.lock().get(job_id).map(|e| e.tx.clone());
        let not_running = || RescaleError::Refused(format!("job {job_id} is not running"));
        let tx = tx.ok_or_else(not_running)?;
        let (answer, answered) = oneshot::channel();
        tx.send(RescaleRequest {
            to,
            follows_hosts: false,
            answer,
        })
        .await
        .map_err(|_| not_running())?;
        answered.await.unwrap_or_else(|_| {
            Err(RescaleError::Refused(format!(
                "job {job_id} ended before it moved"
            )))
        })
    }
}

/// One job's rescale requests (see [`RescaleDesk::open`]).
pub(super) struct RescaleInbox {
    desk: Arc<RescaleDesk>,
    job_id: String,
    /// The sender the desk holds, to tell it from a later one of the same
    /// job id (a resumed job) when closing.
    tx: mpsc::Sender<RescaleRequest>,
    rx: mpsc::Receiver<RescaleRequest>,
    shards: Arc<AtomicU32>,
}

impl RescaleInbox {
    /// The job runs on `n` shards now.
    pub(super) fn set_shards(&self, n: u32) {
        self.shards.store(n, Ordering::Relaxed);
    }

    /// The handle a run on shard hosts says through how many shards it
    /// placed, and asks through to follow hosts that join.
    pub(super) fn placement(&self) -> HostPlacement {
        HostPlacement {
            job_id: self.job_id.clone(),
            requests: self.tx.clone(),
            shards: self.shards.clone(),
        }
    }

    /// The number of shards the job runs on now.
    fn shards_now(&self) -> u32 {
        self.shards.load(Ordering::Relaxed)
    }
}

/// A run on shard hosts' way into its job's rescale inbox (see
/// [`RescaleInbox::placement`]).
#[derive(Debug, Clone)]
pub(super) struct HostPlacement {
    job_id: String,
    requests: mpsc::Sender<RescaleRequest>,
    shards: Arc<AtomicU32>,
}

impl HostPlacement {
    /// The run was placed on `shards` shards (one per host when the job
    /// did not choose).
    pub(super) fn placed(&self, shards: u32) {
        self.shards.store(shards, Ordering::Relaxed);
    }

    /// Asks the job to move onto `to` shards, one per attached host, and
    /// waits for the answer, which is logged: the job's messages say what
    /// a move does.
    pub(super) async fn follow(&self, to: u32) {
        let (answer, answered) = oneshot::channel();
        let request = RescaleRequest {
            to,
            follows_hosts: true,
            answer,
        };
        if self.requests.send(request).await.is_err() {
            return;
        }
        match answered.await {
            Ok(Ok(from)) => info!(job = %self.job_id, from, to, "the job follows its shard hosts"),
            Ok(Err(refused)) => {
                info!(job = %self.job_id, to, %refused, "the job stays on its shard hosts")
            }
            Err(_) => {}
        }
    }
}

impl Drop for RescaleInbox {
    fn drop(&mut self) {
        let mut open = self.desk.open.lock();
        if open
            .get(&self.job_id)
            .is_some_and(|e| e.tx.same_channel(&self.tx))
        {
            open.remove(&self.job_id);
        }
    }
}

/// A move whose savepoint was taken: the attempt stops, and the next one
/// runs on `to` shards from `cut`.
pub(super) struct Move {
    from: u32,
    to: u32,
    follows_hosts: bool,
    cut: Vec<(String, Bytes)>,
    answer: oneshot::Sender<Result<u32, RescaleError>>,
}

impl Move {
    /// The move did not happen (the attempt ended otherwise): says why.
    pub(super) fn refuse(self, why: String) {
        let _ = self.answer.send(Err(RescaleError::Refused(why)));
    }
}

/// What the next attempt of a moved job runs with.
pub(super) struct NextAttempt {
    /// Its shards (`None`: one engine).
    pub(super) shards: Option<ShardLayout>,
    /// Whether it goes on following its shard hosts: one shard per host,
    /// its number not chosen.
    pub(super) follows_hosts: bool,
    /// The cut to start from, when it is not the job's latest checkpoint.
    pub(super) handed_over: Option<HandedOver>,
}

/// The shards a job runs on, counted: one engine is 1.
pub(super) fn count(shards: Option<ShardLayout>) -> u32 {
    shards.map_or(1, |l| l.shards())
}

/// The shards `n` counts ([`count`] undone): `None` for one engine, and
/// for a number no layout has.
fn layout_of(n: u32) -> Option<ShardLayout> {
    ShardLayout::new(n).ok().filter(|l| l.shards() > 1)
}

/// Runs `attempt` of `job` to its end, taking `inbox`'s requests
/// meanwhile: the first one that can be served stops the attempt at a
/// savepoint. Returns the attempt's outcome, and the move if its savepoint
/// was taken.
pub(super) async fn run_taking_requests(
    attempt: impl Future<Output = Result<(), JobError>>,
    inbox: &mut RescaleInbox,
    view: &Arc<JobView>,
    job: &Job,
) -> (Result<(), JobError>, Option<Move>) {
    tokio::pin!(attempt);
    let mut underway: Option<(RescaleRequest, tokio::task::JoinHandle<_>)> = None;
    let mut taken: Option<Move> = None;
    loop {
        tokio::select! {
            outcome = &mut attempt => {
                if let Some((request, savepoint)) = underway {
                    // The savepoint stops the attempt once it is cut, so the
                    // attempt may end before its cut is read here.
                    match tokio::time::timeout(CUT_AFTER_END, savepoint).await {
                        Ok(Ok(Ok(cut))) => taken = Some(request.taken(inbox.shards_now(), cut)),
                        _ => {
                            let _ = request.answer.send(Err(RescaleError::Refused(format!(
                                "job {} ended before its savepoint", job.id()
                            ))));
                        }
                    }
                }
                return (outcome, taken);
            }
            Some(request) = inbox.rx.recv() => {
                if underway.is_some() || taken.is_some() {
                    let _ = request.answer.send(Err(RescaleError::Refused(format!(
                        "job {} is moving between shards already", job.id()
                    ))));
                    continue;
                }
                let from = inbox.shards_now();
                if let Err(refusal) = check(job.id(), from, request.to) {
                    let _ = request.answer.send(Err(refusal));
                    continue;
                }
                job.message(
                    MessageImportance::JobMessageBasic,
                    format!(
                        "moving from {} to {}: stopping at a savepoint",
                        shards_text(from),
                        shards_text(request.to)
                    ),
                );
                let view = view.clone();
                underway = Some((request, tokio::spawn(async move { view.savepoint(true).await })));
            }
            cut = async {
                match underway.as_mut() {
                    Some((_, savepoint)) => savepoint.await,
                    None => std::future::pending().await,
                }
            } => {
                let Some((request, _)) = underway.take() else { continue };
                match cut.map_err(|e| format!("the savepoint crashed: {e}")) {
                    Ok(Ok(cut)) => taken = Some(request.taken(inbox.shards_now(), cut)),
                    Ok(Err(why)) | Err(why) => {
                        let why = format!("job {} runs on as it was: {why}", job.id());
                        warn!(error = %why, "a rescale was refused");
                        let _ = request.answer.send(Err(RescaleError::Refused(why)));
                    }
                }
            }
        }
    }
}

/// Whether job `job_id`, on `from` shards, may be asked to move onto `to`.
fn check(job_id: &str, from: u32, to: u32) -> Result<(), RescaleError> {
    ShardLayout::new(to).map_err(|e| RescaleError::Invalid(e.to_string()))?;
    if to == from {
        return Err(RescaleError::Refused(format!(
            "job {job_id} runs on {} already",
            shards_text(to)
        )));
    }
    Ok(())
}

/// `n` shards, in words.
fn shards_text(n: u32) -> String {
    match n {
        1 => "one engine".to_string(),
        n => format!("{n} shards"),
    }
}

/// The shards durable `job` runs on as its record says (`Some(None)`: one
/// engine), which differ from its options' once it was moved; `None` if
/// the record does not say (or is not read).
pub(super) async fn recorded_shards(
    durability: Option<&Arc<Durability>>,
    job: &Job,
) -> Option<Option<ShardLayout>> {
    let (store, id) = (durability?.clone(), job.id().to_string());
    let read = tokio::task::spawn_blocking(move || store.recorded_shards(&id)).await;
    match read {
        Ok(Ok(Some(n))) => Some(layout_of(n)),
        Ok(Ok(None)) => None,
        Ok(Err(error)) => {
            warn!(%error, "cannot read whether the job was moved onto other shards");
            None
        }
        Err(error) => {
            warn!(%error, "reading whether the job was moved onto other shards crashed");
            None
        }
    }
}

/// Whether an attempt that ended with `outcome` stopped for a move (not
/// for a cancel of the job, nor for a failure).
pub(super) fn stopped_to_move(outcome: &Result<(), JobError>, job: &Job) -> bool {
    matches!(outcome, Err(JobError::Engine(EngineError::Cancelled)))
        && !*job.cancel_requested().borrow()
}

/// Carries out `moved`, whose attempt stopped: keeps the cut durably when
/// the job is durable (else hands it over in memory), notes the new number
/// where the desk and the record show it, answers the request, and says
/// what the next attempt runs with. A durable job whose cut cannot be kept
/// starts again from its latest checkpoint on its old shards, as after a
/// crash, and the request is answered with why.
pub(super) async fn carry_out(
    moved: Move,
    job: &Job,
    inbox: &RescaleInbox,
    durability: Option<&Arc<Durability>>,
) -> NextAttempt {
    let Move {
        from,
        to,
        follows_hosts,
        cut,
        answer,
    } = moved;
    // A job following its hosts keeps no number in its record.
    let recorded = (!follows_hosts).then_some(to);
    let handed_over = match durability {
        Some(durability) => {
            let (store, id) = (durability.clone(), job.id().to_string());
            let written =
                tokio::task::spawn_blocking(move || store.record_rescale(&id, cut, recorded)).await;
            let error = match written {
                Ok(Ok(checkpoint)) => {
                    info!(
                        checkpoint,
                        from, to, "a rescale's savepoint is the job's checkpoint"
                    );
                    None
                }
                Ok(Err(error)) => Some(error.to_string()),
                Err(error) => Some(format!("the write crashed: {error}")),
            };
            if let Some(error) = error {
                let why = format!(
                    "job {} stays on {}: its savepoint cannot be kept ({error}); it starts \
                     again from its latest checkpoint",
                    job.id(),
                    shards_text(from)
                );
                warn!(%why, "a rescale failed");
                job.message(MessageImportance::JobMessageWarning, why.clone());
                let _ = answer.send(Err(RescaleError::Refused(why)));
                return NextAttempt {
                    shards: layout_of(from),
                    follows_hosts,
                    handed_over: None,
                };
            }
            None
        }
        None => Some(Arc::new(cut)),
    };
    inbox.set_shards(to);
    job.message(
        MessageImportance::JobMessageBasic,
        format!(
            "runs on {} from its savepoint (moved from {})",
            shards_text(to),
            shards_text(from)
        ),
    );
    let _ = answer.send(Ok(from));
    NextAttempt {
        shards: layout_of(to),
        follows_hosts,
        handed_over,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_that_is_not_running_is_not_asked() {
        let desk = Arc::new(RescaleDesk::default());
        let refused = desk.ask("gone", 2).await.expect_err("not running");
        assert_eq!(
            refused,
            RescaleError::Refused("job gone is not running".into())
        );
        let inbox = desk.open("gone", 1);
        drop(inbox);
        assert_eq!(desk.shards("gone"), None);
        assert!(desk.ask("gone", 2).await.is_err());
    }

    #[tokio::test]
    async fn a_resumed_job_keeps_its_inbox_when_the_old_one_closes() {
        let desk = Arc::new(RescaleDesk::default());
        let old = desk.open("job", 2);
        let mut new = desk.open("job", 3);
        drop(old);
        assert_eq!(desk.shards("job"), Some(3));
        let asking = tokio::spawn({
            let desk = desk.clone();
            async move { desk.ask("job", 1).await }
        });
        let request = new.rx.recv().await.expect("a request");
        assert_eq!(request.to, 1);
        let _ = request.answer.send(Ok(3));
        assert_eq!(asking.await.expect("no panic"), Ok(3));
    }

    #[tokio::test]
    async fn a_run_on_hosts_says_where_it_placed_and_asks_to_follow_them() {
        let desk = Arc::new(RescaleDesk::default());
        let mut inbox = desk.open("job", 1);
        let placement = inbox.placement();
        placement.placed(2);
        assert_eq!(desk.shards("job"), Some(2));
        let following = tokio::spawn(async move { placement.follow(3).await });
        let request = inbox.rx.recv().await.expect("a request");
        assert_eq!((request.to, request.follows_hosts), (3, true));
        let _ = request.answer.send(Ok(2));
        following.await.expect("no panic");
        // A rescale asked by a user chooses the number.
        let asking = tokio::spawn({
            let desk = desk.clone();
            async move { desk.ask("job", 1).await }
        });
        let request = inbox.rx.recv().await.expect("a request");
        assert!(!request.follows_hosts);
        let _ = request.answer.send(Ok(2));
        assert_eq!(asking.await.expect("no panic"), Ok(2));
    }

    #[test]
    fn moves_onto_as_many_shards_or_out_of_range_are_refused() {
        assert!(matches!(check("j", 2, 2), Err(RescaleError::Refused(t)) if t.contains("already")));
        assert!(matches!(check("j", 2, 0), Err(RescaleError::Invalid(_))));
        assert!(matches!(check("j", 2, 129), Err(RescaleError::Invalid(_))));
        assert_eq!(check("j", 1, 3), Ok(()));
        assert_eq!(check("j", 3, 1), Ok(()));
    }
}
