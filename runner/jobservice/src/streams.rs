//! `GetStateStream` and `GetMessageStream`: follow a job's history until it
//! ends.
//!
//! The message stream ends right after the terminal state, which is what
//! lets SDK clients that read it to its end finish without waiting on a
//! timeout. The state stream sends the terminal state and then stays open
//! for [`LINGER_AFTER_TERMINAL`], for the client to let go of it first
//! (clients stop reading at the terminal state; why it matters is on the
//! constant). Both end with `UNAVAILABLE` when the server shuts down, so a
//! graceful shutdown is not held up by subscribers of jobs that are still
//! running.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::stream::{self, BoxStream, StreamExt};
use refract_proto::job_api::{job_messages_response, JobMessagesResponse, JobStateEvent};
use refract_proto::tonic::Status;
use tokio::sync::watch;

use crate::event_log::Event;
use crate::job::Job;
use crate::job_state::is_terminal;

/// The current state immediately, then each change, ending
/// [`LINGER_AFTER_TERMINAL`] after a terminal state.
pub(crate) fn state_stream(
    job: Arc<Job>,
    shutdown: watch::Receiver<bool>,
) -> BoxStream<'static, Result<JobStateEvent, Status>> {
    let (current, cursor) = job.state_with_cursor();
    let first = stream::once(futures::future::ready(Ok(current)));
    if is_terminal(current.state()) {
        return first.chain(linger(shutdown)).boxed();
    }
    let follower = Follower::new(job, cursor, shutdown.clone());
    let rest = stream::unfold(Some(follower), |follower| async move {
        let mut follower = follower?;
        loop {
            match follower.next().await {
                Ok(Event::State(event)) => {
                    let next = (!is_terminal(event.state())).then_some(follower);
                    return Some((Ok(event), next));
                }
                Ok(Event::Message(_)) => continue,
                Err(status) => return Some((Err(status), None)),
            }
        }
    });
    first.chain(rest).chain(linger(shutdown)).boxed()
}

/// How long a state stream stays open after its terminal state, unless the
/// client lets go of it first.
///
/// Beam's Python client stops reading at the terminal state and, in a
/// script, exits at once. Had the server ended the stream too, gRPC
/// Python's channel thread may be handling that end while the interpreter
/// shuts down, frozen holding the call's lock, which the garbage collector
/// then waits for in `__del__`: the process never exits. Left open, the
/// call is cancelled by the collector itself, with nothing in flight.
/// Clients that read to the end of the stream wait this long.
pub(crate) const LINGER_AFTER_TERMINAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Nothing, after [`LINGER_AFTER_TERMINAL`] or once the server shuts down.
fn linger<T: Send + 'static>(mut shutdown: watch::Receiver<bool>) -> BoxStream<'static, T> {
    stream::once(async move {
        tokio::select! {
            _ = tokio::time::sleep(LINGER_AFTER_TERMINAL) => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
    })
    .filter_map(|()| futures::future::ready(None))
    .boxed()
}

/// The retained history of messages and state changes, then live ones,
/// ending after a terminal state (which comes after a failure's ERROR
/// message).
pub(crate) fn message_stream(
    job: Arc<Job>,
    shutdown: watch::Receiver<bool>,
) -> BoxStream<'static, Result<JobMessagesResponse, Status>> {
    let cursor = job.oldest_event();
    let follower = Follower::new(job, cursor, shutdown);
    stream::unfold(Some(follower), |follower| async move {
        let mut follower = follower?;
        match follower.next().await {
            Ok(Event::Message(message)) => Some((
                Ok(JobMessagesResponse {
                    response: Some(job_messages_response::Response::MessageResponse(message)),
                }),
                Some(follower),
            )),
            Ok(Event::State(event)) => {
                let next = (!is_terminal(event.state())).then_some(follower);
                Some((
                    Ok(JobMessagesResponse {
                        response: Some(job_messages_response::Response::StateResponse(event)),
                    }),
                    next,
                ))
            }
            Err(status) => Some((Err(status), None)),
        }
    })
    .boxed()
}

/// Reads a job's history in order from a cursor, sleeping while there is
/// nothing new.
struct Follower {
    job: Arc<Job>,
    cursor: u64,
    wake: watch::Receiver<u64>,
    shutdown: watch::Receiver<bool>,
    buffered: VecDeque<Event>,
}

impl Follower {
    fn new(job: Arc<Job>, cursor: u64, shutdown: watch::Receiver<bool>) -> Self {
        let wake = job.watch_events();
        Self {
            job,
            cursor,
            wake,
            shutdown,
            buffered: VecDeque::new(),
        }
    }

    async fn next(&mut self) -> Result<Event, Status> {
        loop {
            if let Some(event) = self.buffered.pop_front() {
                return Ok(event);
            }
            // Mark the wakeup as seen before reading, so an append between
            // the read and the wait still wakes us.
            self.wake.borrow_and_update();
            let read = self.job.read_events(self.cursor);
            if read.missed > 0 {
                tracing::warn!(
                    job_id = %self.job.id(),
                    missed = read.missed,
                    "slow job stream subscriber missed events beyond the retention limit"
                );
            }
            self.cursor = read.next;
            if !read.events.is_empty() {
                self.buffered.extend(read.events);
                continue;
            }
            tokio::select! {
                changed = self.wake.changed() => {
                    if changed.is_err() {
                        return Err(Status::aborted("job history closed"));
                    }
                }
                _ = self.shutdown.wait_for(|stop| *stop) => {
                    return Err(Status::unavailable("job service is shutting down"));
                }
            }
        }
    }
}
