//! A job's ordered history of state changes and messages, with wakeups for
//! the streams that follow it.
//!
//! State changes and messages share one sequence so that a follower sees them
//! in the order they happened; that is what lets a failing job's ERROR
//! message reach the client before the FAILED state that ends the stream.

use std::collections::VecDeque;
use std::time::SystemTime;

use parking_lot::Mutex;
use refract_proto::job_api::{job_message::MessageImportance, JobMessage, JobStateEvent};
use refract_proto::prost_types::Timestamp;
use tokio::sync::watch;

use crate::job_state::{is_terminal, transition_allowed, JobState};

/// What a job's history keeps for followers that come late (the UI,
/// `refract logs`, a second `GetMessageStream`): the newest events within
/// both bounds, the newest one always. A DoFn may log without end, and
/// each line of its harness's log becomes a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageRetention {
    /// Messages and state changes kept at most.
    pub max_events: usize,
    /// Bytes of message text kept at most.
    pub max_bytes: usize,
    /// Bytes of one message's text kept: a longer text keeps its start
    /// and ends saying how much was cut.
    pub max_message_bytes: usize,
}

impl Default for MessageRetention {
    fn default() -> Self {
        MessageRetention {
            max_events: 100_000,
            max_bytes: 16 << 20,
            max_message_bytes: 256 << 10,
        }
    }
}

impl MessageRetention {
    /// The default byte bounds with at most `max_events` events.
    pub fn events(max_events: usize) -> Self {
        MessageRetention {
            max_events,
            ..MessageRetention::default()
        }
    }
}

/// `text` cut to at most `max` bytes of its own (at a character boundary),
/// followed by a note of how many were cut.
fn cut_text(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let cut = text.len() - end;
    text.truncate(end);
    text.push_str(&format!("... [{cut} bytes cut]"));
    text
}

/// Bytes an event counts against [`MessageRetention::max_bytes`].
fn text_bytes(event: &Event) -> usize {
    match event {
        Event::Message(message) => message.message_text.len(),
        Event::State(_) => 0,
    }
}

/// One entry of a job's history.
#[derive(Debug, Clone)]
pub enum Event {
    /// A message for the job's message stream.
    Message(JobMessage),
    /// A state change.
    State(JobStateEvent),
}

/// A state change the state machine does not allow (including any change
/// after a terminal state); it was not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IllegalTransition {
    pub from: JobState,
    pub to: JobState,
}

/// The history plus the current state. All mutation happens under one lock,
/// so a combined "message then state" append is atomic.
pub(crate) struct EventLog {
    inner: Mutex<Inner>,
    /// Carries the sequence number one past the newest event, so followers
    /// can sleep until something is appended.
    appended: watch::Sender<u64>,
}

struct Inner {
    state: JobStateEvent,
    /// The error text of [`EventLog::fail`], kept whatever retention drops.
    failure: Option<String>,
    events: VecDeque<Event>,
    /// Sequence number of `events[0]`.
    first_seq: u64,
    next_message_id: u64,
    retention: MessageRetention,
    /// Bytes of message text in `events`.
    text_bytes: usize,
}

impl Inner {
    fn end_seq(&self) -> u64 {
        self.first_seq + self.events.len() as u64
    }

    fn push(&mut self, event: Event) {
        self.text_bytes += text_bytes(&event);
        self.events.push_back(event);
        // Always keep the newest event: it may be the terminal state that
        // ends every stream.
        while self.events.len() > 1
            && (self.events.len() > self.retention.max_events
                || self.text_bytes > self.retention.max_bytes)
        {
            if let Some(dropped) = self.events.pop_front() {
                self.text_bytes -= text_bytes(&dropped);
            }
            self.first_seq += 1;
        }
    }

    /// Appends a message, with secret-looking values redacted
    /// ([`crate::redact`]): everything that reads a job's messages (the
    /// message stream, the UI, `refract logs`) reads them from here.
    fn push_message(&mut self, importance: MessageImportance, text: String) {
        let text = match crate::redact::redact_text(&text) {
            std::borrow::Cow::Borrowed(_) => text,
            std::borrow::Cow::Owned(redacted) => redacted,
        };
        self.push_redacted(importance, text);
    }

    /// Appends a message whose text is redacted already, cut to
    /// [`MessageRetention::max_message_bytes`].
    fn push_redacted(&mut self, importance: MessageImportance, text: String) {
        let text = cut_text(text, self.retention.max_message_bytes);
        self.push_cut(importance, text);
    }

    /// Appends a message whose text is redacted and cut already.
    fn push_cut(&mut self, importance: MessageImportance, text: String) {
        let message_id = self.next_message_id.to_string();
        self.next_message_id += 1;
        self.push(Event::Message(JobMessage {
            message_id,
            time: Timestamp::from(SystemTime::now()).to_string(),
            importance: importance as i32,
            message_text: text,
        }));
    }

    fn push_state(&mut self, to: JobState) -> Result<JobStateEvent, IllegalTransition> {
        let from = self.state.state();
        if !transition_allowed(from, to) {
            return Err(IllegalTransition { from, to });
        }
        let event = state_event(to);
        self.state = event;
        self.push(Event::State(event));
        Ok(event)
    }
}

fn state_event(state: JobState) -> JobStateEvent {
    JobStateEvent {
        state: state as i32,
        timestamp: Some(Timestamp::from(SystemTime::now())),
    }
}

/// One page of a job's history, read with [`crate::Job::history`].
#[derive(Debug, Clone, Default)]
pub struct HistoryPage {
    /// The events kept, each with its sequence number, oldest first.
    pub entries: Vec<(u64, Event)>,
    /// Where the following page starts.
    pub next: u64,
    /// Events dropped by retention between the cursor asked for and the
    /// oldest one still kept.
    pub missed: u64,
}

/// What a follower gets when it reads past its cursor.
pub(crate) struct ReadOutcome {
    /// Events from the cursor (or the oldest retained one) to the end.
    pub events: Vec<Event>,
    /// Where to continue reading.
    pub next: u64,
    /// Events that were dropped before the follower read them.
    pub missed: u64,
}

impl EventLog {
    /// A log whose job starts in `STOPPED`, keeping what `retention`
    /// allows for late subscribers.
    pub(crate) fn new(retention: MessageRetention) -> Self {
        let initial = state_event(JobState::Stopped);
        let mut events = VecDeque::new();
        events.push_back(Event::State(initial));
        let (appended, _) = watch::channel(1);
        Self {
            inner: Mutex::new(Inner {
                state: initial,
                failure: None,
                events,
                first_seq: 0,
                next_message_id: 1,
                retention,
                text_bytes: 0,
            }),
            appended,
        }
    }

    /// The current state with the time it was entered.
    pub(crate) fn current(&self) -> JobStateEvent {
        self.inner.lock().state
    }

    /// The current state and the sequence number just past the newest event,
    /// read together so that a follower starting there misses no change.
    pub(crate) fn current_with_cursor(&self) -> (JobStateEvent, u64) {
        let inner = self.inner.lock();
        (inner.state, inner.end_seq())
    }

    /// The error text the job failed with (redacted), if it failed.
    pub(crate) fn failure(&self) -> Option<String> {
        self.inner.lock().failure.clone()
    }

    /// Sequence number of the oldest retained event.
    pub(crate) fn oldest_seq(&self) -> u64 {
        self.inner.lock().first_seq
    }

    /// Records a state change if the state machine allows it.
    pub(crate) fn set_state(&self, to: JobState) -> Result<JobStateEvent, IllegalTransition> {
        let result = {
            let mut inner = self.inner.lock();
            let result = inner.push_state(to);
            (result, inner.end_seq())
        };
        if result.0.is_ok() {
            self.appended.send_replace(result.1);
        }
        result.0
    }

    /// Records `expected → to` only if the job is currently in `expected`
    /// (a compare-and-set, so Run and Cancel cannot race past each other).
    /// `Err` carries the actual current state.
    pub(crate) fn set_state_if(&self, expected: JobState, to: JobState) -> Result<(), JobState> {
        let end = {
            let mut inner = self.inner.lock();
            let current = inner.state.state();
            if current != expected {
                return Err(current);
            }
            inner.push_state(to).map_err(|illegal| illegal.from)?;
            inner.end_seq()
        };
        self.appended.send_replace(end);
        Ok(())
    }

    /// Records a message unless the job is already terminal (its streams have
    /// ended, so nobody could see it). Returns whether it was recorded.
    pub(crate) fn message(&self, importance: MessageImportance, text: String) -> bool {
        let end = {
            let mut inner = self.inner.lock();
            if is_terminal(inner.state.state()) {
                return false;
            }
            inner.push_message(importance, text);
            inner.end_seq()
        };
        self.appended.send_replace(end);
        true
    }

    /// Records an ERROR message and then `FAILED`, atomically, unless the job
    /// is already terminal. Returns the new state event if it was recorded.
    pub(crate) fn fail(&self, text: String) -> Result<JobStateEvent, IllegalTransition> {
        let (event, end) = {
            let mut inner = self.inner.lock();
            let from = inner.state.state();
            if !transition_allowed(from, JobState::Failed) {
                return Err(IllegalTransition {
                    from,
                    to: JobState::Failed,
                });
            }
            let text = cut_text(
                crate::redact::redact_text(&text).into_owned(),
                inner.retention.max_message_bytes,
            );
            inner.push_cut(MessageImportance::JobMessageError, text.clone());
            let event = inner.push_state(JobState::Failed)?;
            inner.failure = Some(text);
            (event, inner.end_seq())
        };
        self.appended.send_replace(end);
        Ok(event)
    }

    /// Events from sequence number `from` on.
    pub(crate) fn read_from(&self, from: u64) -> ReadOutcome {
        let inner = self.inner.lock();
        let start = from.max(inner.first_seq);
        let skip = usize::try_from(start - inner.first_seq).unwrap_or(usize::MAX);
        let events: Vec<Event> = inner.events.iter().skip(skip).cloned().collect();
        ReadOutcome {
            next: start + events.len() as u64,
            missed: start - from,
            events,
        }
    }

    /// Up to `limit` events that `keep` accepts: the first ones after
    /// sequence number `after`, or without it the newest ones. Only the
    /// events looked at are copied, so a reader polling a job that logs
    /// fast pays for what it shows.
    pub(crate) fn page(
        &self,
        after: Option<u64>,
        limit: usize,
        keep: &dyn Fn(&Event) -> bool,
    ) -> HistoryPage {
        let inner = self.inner.lock();
        let end = inner.end_seq();
        let numbered = inner
            .events
            .iter()
            .enumerate()
            .map(|(i, e)| (inner.first_seq + i as u64, e));
        match after {
            None => {
                let mut entries: Vec<(u64, Event)> = numbered
                    .rev()
                    .filter(|(_, e)| keep(e))
                    .take(limit)
                    .map(|(seq, e)| (seq, e.clone()))
                    .collect();
                entries.reverse();
                HistoryPage {
                    entries,
                    next: end,
                    missed: 0,
                }
            }
            Some(after) => {
                let start = after.saturating_add(1).max(inner.first_seq);
                let skip = usize::try_from(start - inner.first_seq).unwrap_or(usize::MAX);
                let mut entries = Vec::new();
                let mut next = end;
                for (seq, e) in numbered.skip(skip) {
                    if entries.len() == limit {
                        next = seq;
                        break;
                    }
                    if keep(e) {
                        entries.push((seq, e.clone()));
                    }
                }
                HistoryPage {
                    entries,
                    next,
                    missed: start - after.saturating_add(1),
                }
            }
        }
    }

    /// A receiver that changes whenever an event is appended.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.appended.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::Message(m) => format!("msg:{}", m.message_text),
                Event::State(s) => format!("state:{:?}", s.state()),
            })
            .collect()
    }

    #[test]
    fn fail_records_error_before_failed() {
        let log = EventLog::new(MessageRetention::events(100));
        log.set_state(JobState::Running).unwrap();
        log.fail("boom".into()).unwrap();
        let read = log.read_from(0);
        assert_eq!(
            kinds(&read.events),
            ["state:Stopped", "state:Running", "msg:boom", "state:Failed"]
        );
        assert_eq!(read.next, 4);
        // Terminal is final: neither messages nor states are recorded.
        assert!(!log.message(MessageImportance::JobMessageBasic, "late".into()));
        assert!(log.set_state(JobState::Done).is_err());
        assert!(log.fail("again".into()).is_err());
        assert_eq!(log.read_from(0).events.len(), 4);
    }

    #[test]
    fn retention_drops_oldest_and_reports_missed() {
        let log = EventLog::new(MessageRetention::events(2));
        for i in 0..5 {
            assert!(log.message(MessageImportance::JobMessageBasic, i.to_string()));
        }
        let read = log.read_from(0);
        assert_eq!(kinds(&read.events), ["msg:3", "msg:4"]);
        assert_eq!(read.missed, 4);
        assert_eq!(read.next, 6);
        assert_eq!(log.oldest_seq(), 4);
    }

    #[test]
    fn retention_keeps_message_text_within_its_bytes() {
        let log = EventLog::new(MessageRetention {
            max_events: 1000,
            max_bytes: 1000,
            max_message_bytes: 300,
        });
        for i in 0..100 {
            let text = format!("{i:03}{}", "x".repeat(297));
            assert!(log.message(MessageImportance::JobMessageBasic, text));
        }
        let read = log.read_from(0);
        let bytes: usize = read.events.iter().map(text_bytes).sum();
        assert!(bytes <= 1000, "{bytes}");
        assert_eq!(read.events.len(), 3);
        assert_eq!(read.missed + 3, read.next);
        let Event::Message(last) = &read.events[2] else {
            panic!("a state")
        };
        assert!(last.message_text.starts_with("099"));
        // A message larger than all of it is still kept, the newest.
        let log = EventLog::new(MessageRetention {
            max_events: 1000,
            max_bytes: 1000,
            max_message_bytes: 4000,
        });
        log.message(MessageImportance::JobMessageBasic, "y".repeat(3000));
        let read = log.read_from(0);
        assert_eq!(read.events.len(), 1);
        assert_eq!(text_bytes(&read.events[0]), 3000);
    }

    #[test]
    fn a_long_message_keeps_its_start_and_says_what_was_cut() {
        let log = EventLog::new(MessageRetention {
            max_message_bytes: 10,
            ..MessageRetention::default()
        });
        // 'é' is two bytes: the cut falls on a character boundary.
        log.message(
            MessageImportance::JobMessageBasic,
            format!("abcdefghé{}", "z".repeat(90)),
        );
        let read = log.read_from(0);
        let Event::Message(m) = &read.events[1] else {
            panic!("not a message")
        };
        assert_eq!(m.message_text, "abcdefghé... [90 bytes cut]");
        // A failure's text is cut once, the same in its message and record.
        log.fail("e".repeat(25)).unwrap();
        let failure = log.failure().unwrap();
        assert_eq!(failure, "eeeeeeeeee... [15 bytes cut]");
        let read = log.read_from(0);
        assert!(read
            .events
            .iter()
            .any(|e| matches!(e, Event::Message(m) if m.message_text == failure)));
    }

    #[test]
    fn illegal_transition_is_rejected() {
        let log = EventLog::new(MessageRetention::events(10));
        log.set_state(JobState::Running).unwrap();
        assert_eq!(
            log.set_state(JobState::Starting),
            Err(IllegalTransition {
                from: JobState::Running,
                to: JobState::Starting
            })
        );
        assert_eq!(log.current().state(), JobState::Running);
    }

    #[test]
    fn pages_read_the_newest_or_what_follows_a_cursor() {
        let log = EventLog::new(MessageRetention::events(5));
        for i in 0..8 {
            log.message(MessageImportance::JobMessageBasic, format!("m{i}"));
        }
        // Retained: seq 4..=8 (m3..m7).
        let all = |_: &Event| true;
        let texts =
            |p: &HistoryPage| kinds(&p.entries.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>());
        let newest = log.page(None, 2, &all);
        assert_eq!(texts(&newest), ["msg:m6", "msg:m7"]);
        assert_eq!(newest.next, 9);
        let after = log.page(Some(4), 2, &all);
        assert_eq!(texts(&after), ["msg:m4", "msg:m5"]);
        assert_eq!(after.next, 7);
        assert_eq!(after.missed, 0);
        let behind = log.page(Some(0), 10, &all);
        assert_eq!(
            texts(&behind),
            ["msg:m3", "msg:m4", "msg:m5", "msg:m6", "msg:m7"]
        );
        assert_eq!(behind.missed, 3);
        assert_eq!(behind.next, 9);
        let odd =
            |e: &Event| matches!(e, Event::Message(m) if m.message_text.ends_with(['3', '5', '7']));
        assert_eq!(
            texts(&log.page(None, 10, &odd)),
            ["msg:m3", "msg:m5", "msg:m7"]
        );
    }

    #[test]
    fn secrets_in_messages_are_redacted_as_they_are_recorded() {
        let log = EventLog::new(MessageRetention::events(10));
        log.message(
            MessageImportance::JobMessageBasic,
            "Pipeline_options: {'db_password': 'hunter2'}".into(),
        );
        let read = log.read_from(0);
        assert_eq!(
            kinds(&read.events)[1],
            "msg:Pipeline_options: {'db_password': '***'}"
        );
    }
}
