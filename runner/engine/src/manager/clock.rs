//! Processing time as the engine sees it: the wall clock it was given, or,
//! in a pipeline with a TestStream, a clock frozen at the start and moved
//! only by the stream's processing-time events.

use std::sync::Arc;

use crate::time::Timestamp;

/// The source of processing time the engine was built with (ms).
pub type ClockFn = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Processing time of one run, in ms.
pub(super) struct ProcessingClock {
    /// The wall clock.
    source: ClockFn,
    /// Processing time advanced by TestStream events, added to `source`.
    offset: i64,
    /// Pipelines with a TestStream keep processing time where it was when
    /// the run started, moved only by the stream's processing-time events
    /// (as Prism does): an SDK that sets a timer `d` ahead of its own clock
    /// then sees it fire exactly when the stream has advanced by `d`, not
    /// also by however long the run took.
    frozen: Option<Timestamp>,
}

impl ProcessingClock {
    /// A clock reading `source`, frozen at its first reading if the
    /// pipeline's processing time is `scripted` (it has a TestStream).
    pub(super) fn new(source: ClockFn, scripted: bool) -> Self {
        let frozen = scripted.then(|| source());
        ProcessingClock {
            source,
            offset: 0,
            frozen,
        }
    }

    /// Processing time now: the clock (or where it was frozen) plus what
    /// TestStreams advanced it by.
    pub(super) fn now(&self) -> Timestamp {
        self.frozen
            .unwrap_or_else(|| (self.source)())
            .saturating_add(self.offset)
    }

    /// A TestStream's processing-time event moves the clock `ms` ahead
    /// (never back).
    pub(super) fn advance(&mut self, ms: i64) {
        self.offset = self.offset.saturating_add(ms.max(0));
    }

    /// Whether processing time is scripted (frozen, moved by events).
    pub(super) fn is_scripted(&self) -> bool {
        self.frozen.is_some()
    }

    /// A scripted clock follows another's reading `now` (a shard's clock
    /// follows the shard that replays the job's TestStream); a wall clock
    /// is left alone.
    pub(super) fn follow(&mut self, now: Timestamp) {
        if self.frozen.is_some() {
            self.frozen = Some(now);
            self.offset = 0;
        }
    }

    /// What a checkpoint keeps: the offset and where the clock was frozen.
    pub(super) fn record(&self) -> (i64, Option<Timestamp>) {
        (self.offset, self.frozen)
    }

    /// Takes back what [`Self::record`] kept.
    pub(super) fn restore(&mut self, (offset, frozen): (i64, Option<Timestamp>)) {
        self.offset = offset;
        self.frozen = frozen;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scripted_clock_moves_only_by_its_events() {
        let wall = Arc::new(std::sync::atomic::AtomicI64::new(100));
        let reading = wall.clone();
        let source: ClockFn = Arc::new(move || reading.load(std::sync::atomic::Ordering::SeqCst));
        let mut scripted = ProcessingClock::new(source.clone(), true);
        let live = ProcessingClock::new(source, false);
        wall.store(500, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(scripted.now(), 100, "frozen at the start");
        assert_eq!(live.now(), 500);
        scripted.advance(7);
        scripted.advance(-3);
        assert_eq!(scripted.now(), 107, "never back");
        let mut restored = ProcessingClock::new(Arc::new(|| 0), false);
        restored.restore(scripted.record());
        assert_eq!(restored.now(), 107);
    }
}
