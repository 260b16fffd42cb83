//! `GetStateStream` and `GetMessageStream`: follow a job's history until it
//! ends.
//!
//! Both streams end right after the job's terminal state, and one opened
//! after it sends that state and ends at once, as Beam's Python job server
//! and Prism do. Beam's clients rely on it: Python's `TestPipeline` waits on
//! a job twice, the second time reading the same state stream past the
//! terminal state, and every client reads the message stream to its end.
//! Both end with `UNAVAILABLE` when the server shuts down, so a graceful
//! shutdown is not held up by subscribers of jobs that are still running.
//!
//! A message stream ends after the job's state streams have: Python's
//! client stops reading its state stream at the terminal state and waits
//! only for the message stream to end before the interpreter exits. A state
//! stream whose end reaches gRPC's channel thread during that exit leaves
//! the thread dead holding the channel's lock, and the exit then waits on
//! it for ever. Ending the state streams first means the client has taken
//! in their ends before its wait returns.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use refract_proto::job_api::{job_messages_response, JobMessagesResponse, JobStateEvent};
use refract_proto::tonic::Status;
use tokio::sync::watch;

use crate::event_log::Event;
use crate::job::Job;
use crate::job_state::is_terminal;

/// The current state immediately, then each change, ending with the
/// terminal state.
pub(crate) fn state_stream(
    job: Arc<Job>,
    shutdown: watch::Receiver<bool>,
) -> BoxStream<'static, Result<JobStateEvent, Status>> {
    let open = OpenStateStream::new(job.clone());
    let (current, cursor) = job.state_with_cursor();
    let first = stream::once(futures::future::ready(Ok(current)));
    if is_terminal(current.state()) {
        return counted(first, open);
    }
    let follower = Follower::new(job, cursor, shutdown);
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
    counted(first.chain(rest), open)
}

/// How long a message stream holds its terminal state back for the job's
/// state streams to end: a state stream whose client stopped reading may
/// never end, and must not keep the message stream open.
const STATE_STREAMS_END_FIRST: Duration = Duration::from_secs(2);

/// One state stream of a job, counted from its opening until it is
/// dropped, which tonic does once the stream's end has been sent.
struct OpenStateStream(Arc<Job>);

impl OpenStateStream {
    fn new(job: Arc<Job>) -> Self {
        job.open_state_streams().send_modify(|open| *open += 1);
        Self(job)
    }
}

impl Drop for OpenStateStream {
    fn drop(&mut self) {
        self.0
            .open_state_streams()
            .send_modify(|open| *open = open.saturating_sub(1));
    }
}

/// `events`, keeping `open` for as long as the stream lives.
fn counted(
    events: impl futures::Stream<Item = Result<JobStateEvent, Status>> + Send + 'static,
    open: OpenStateStream,
) -> BoxStream<'static, Result<JobStateEvent, Status>> {
    events
        .inspect(move |_| {
            let _counted = &open;
        })
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
                let terminal = is_terminal(event.state());
                if terminal {
                    follower.state_streams_ended().await;
                }
                let next = (!terminal).then_some(follower);
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

    /// Returns once the job's state streams have ended, after
    /// [`STATE_STREAMS_END_FIRST`] at most, or when the server shuts down.
    async fn state_streams_ended(&mut self) {
        let mut open = self.job.open_state_streams().subscribe();
        tokio::select! {
            _ = tokio::time::timeout(STATE_STREAMS_END_FIRST, open.wait_for(|open| *open == 0)) => {}
            _ = self.shutdown.wait_for(|stop| *stop) => {}
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
