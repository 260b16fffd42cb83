//! When the executor asks the SDK to split a running bundle, and how much
//! of the remaining work the bundle keeps.
//!
//! Three reasons for a splittable DoFn's bundle, looked at every few
//! milliseconds while it runs. Any other bundle is split at an element
//! boundary, for size and for an idle worker but not for time (its
//! elements are not restrictions to share out); a stateful stage's for an
//! idle worker only where it may split between key groups (what it gives
//! back must hold keys it no longer needs, or it would wait for the bundle
//! anyway):
//!
//! * **time**: after a quarter second, then every second, where what it
//!   gives back can run beside it: the environment's workers run bundles
//!   in parallel, one of them idles, or the engine has another bundle
//!   waiting for a worker — and always in a streaming job, whose bundles'
//!   outputs reach their consumers only when they commit. A source read as
//!   one restriction otherwise keeps one worker busy while the others
//!   idle; but on a worker that runs one bundle at a time with nothing
//!   else to do (a single Python worker in batch), a split only costs the
//!   SDK a checkpoint and a second bundle.
//! * **size**: once the bundle has sent back its share of the memory
//!   budget (the stage's queue bound over the bundles it may run at once).
//! * **an idle worker** in the bundle's environment (seen at two looks in a
//!   row, so not one merely between two bundles): the idle worker can take
//!   half of what is left. At most every 100 ms, so the residual can reach
//!   it before the next look; after a split the SDK refused, twice as long
//!   as before (up to 3.2 s), since a bundle past its last allowed split
//!   point — a stateful bundle in its last key group, a bundle at its last
//!   element — refuses every one until it ends, and each costs the SDK's
//!   control thread a request.
//!
//! The first split of a bundle keeps half (the other half can start on
//! another worker at once); later splits for time or size keep 1% of what
//! is left, which ends the bundle soon; splits for an idle worker keep
//! half. (Never 0: Python's wrapper of a `BoundedSource` refuses to split
//! at the position it is at.)

use std::time::{Duration, Instant};

/// When a bundle is first split for time.
const FIRST_SPLIT_AFTER: Duration = Duration::from_millis(250);

/// How long after its previous split a bundle is split for time again.
const SPLIT_AFTER: Duration = Duration::from_millis(1000);

/// How long after its previous split a bundle is split for an idle worker.
const IDLE_SPLIT_EVERY: Duration = Duration::from_millis(100);

/// The longest wait between idle splits, however many were refused.
const IDLE_SPLIT_AT_MOST_EVERY: Duration = Duration::from_millis(3200);

/// What a bundle keeps of its remaining work at its first split.
const FIRST_FRACTION: f64 = 0.5;

/// What a bundle keeps at a later split for time or size.
const LATER_FRACTION: f64 = 0.01;

/// The split decisions for one running bundle.
#[derive(Debug)]
pub(crate) struct SplitPolicy {
    output_limit: u64,
    last_split: Instant,
    splits: u32,
    size_splits: u32,
    idle_seen: bool,
    /// Split for time (a splittable DoFn's bundle).
    for_time: bool,
    /// Split for an idle worker.
    for_idle: bool,
    /// How long after its previous split the bundle is next split for an
    /// idle worker: doubled by each refused split.
    idle_every: Duration,
}

impl SplitPolicy {
    /// A bundle that started at `started` and is split once it has sent
    /// back `output_limit` bytes.
    pub(crate) fn new(output_limit: u64, started: Instant) -> Self {
        SplitPolicy {
            output_limit,
            last_split: started,
            splits: 0,
            size_splits: 0,
            idle_seen: false,
            for_time: true,
            for_idle: true,
            idle_every: IDLE_SPLIT_EVERY,
        }
    }

    /// The SDK answered the last split with nothing to give back: idle
    /// splits wait twice as long.
    pub(crate) fn refused(&mut self) {
        self.idle_every = (self.idle_every * 2).min(IDLE_SPLIT_AT_MOST_EVERY);
    }

    /// The SDK gave back work at the last split: idle splits may come at
    /// their usual pace again.
    pub(crate) fn accepted(&mut self) {
        self.idle_every = IDLE_SPLIT_EVERY;
    }

    /// A bundle of elements (not restrictions), split once it has sent
    /// back `output_limit` bytes and, if `for_idle`, when a worker idles.
    pub(crate) fn for_elements(output_limit: u64, started: Instant, for_idle: bool) -> Self {
        SplitPolicy {
            for_time: false,
            for_idle,
            ..SplitPolicy::new(output_limit, started)
        }
    }

    /// One look at the bundle at `now`, which has sent back `received`
    /// bytes, while some worker of its environment is or is not idle and
    /// a split for time would or would not let its residual run beside it
    /// (`time_helps`): the fraction of its remaining work to keep, if it is
    /// to be split now.
    pub(crate) fn due(
        &mut self,
        now: Instant,
        received: u64,
        worker_idle: bool,
        time_helps: bool,
    ) -> Option<f64> {
        let idle_before = self.idle_seen;
        self.idle_seen = worker_idle;
        let since = now.saturating_duration_since(self.last_split);
        // A bundle not split for time keeps little at a split for size
        // from the start: that split is for memory, and what it gives back
        // is shared out anew.
        let later = if self.splits == 0 && self.for_time {
            FIRST_FRACTION
        } else {
            LATER_FRACTION
        };
        // The second split for size follows the first at once (the output
        // is still past the limit) and ends the bundle; no third.
        let by_size = self.size_splits < 2 && received >= self.output_limit;
        let period = if self.splits == 0 {
            FIRST_SPLIT_AFTER
        } else {
            SPLIT_AFTER
        };
        let fraction = if by_size {
            self.size_splits += 1;
            later
        } else if self.for_time && time_helps && since >= period {
            later
        } else if self.for_idle && idle_before && worker_idle && since >= self.idle_every {
            FIRST_FRACTION
        } else {
            return None;
        };
        self.splits += 1;
        self.last_split = now;
        Some(fraction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOK: Duration = Duration::from_millis(20);

    /// Looks every 20 ms from `from` until a split is due: its time since
    /// `start` and fraction.
    fn next_split(
        p: &mut SplitPolicy,
        start: Instant,
        from: Duration,
        received: u64,
        idle: bool,
    ) -> (Duration, f64) {
        let mut at = from;
        loop {
            at += LOOK;
            if let Some(f) = p.due(start + at, received, idle, true) {
                return (at, f);
            }
            assert!(at < Duration::from_secs(60), "no split in a minute");
        }
    }

    #[test]
    fn a_busy_bundle_is_halved_after_a_quarter_second_then_cut_every_second() {
        let start = Instant::now();
        let mut p = SplitPolicy::new(u64::MAX, start);
        let (at, f) = next_split(&mut p, start, Duration::ZERO, 0, false);
        assert_eq!((at, f), (Duration::from_millis(260), 0.5));
        let (at2, f2) = next_split(&mut p, start, at, 0, false);
        assert_eq!((at2 - at, f2), (Duration::from_millis(1000), 0.01));
    }

    #[test]
    fn a_bundle_no_other_work_could_run_beside_is_split_for_size_only() {
        let start = Instant::now();
        let mut p = SplitPolicy::new(u64::MAX, start);
        for look in 1..500 {
            assert_eq!(p.due(start + LOOK * look, 0, false, false), None);
        }
        // Once work waits for a worker, time splits resume.
        assert_eq!(p.due(start + LOOK * 500, 0, false, true), Some(0.5));

        let mut p = SplitPolicy::new(1000, start);
        assert_eq!(p.due(start + LOOK * 500, 999, false, false), None);
        assert_eq!(p.due(start + LOOK * 501, 1000, false, false), Some(0.5));
    }

    #[test]
    fn a_bundle_split_only_for_size_is_never_split_for_time_or_idle_workers() {
        let start = Instant::now();
        let mut p = SplitPolicy::for_elements(1000, start, false);
        for look in 1..200 {
            assert_eq!(p.due(start + LOOK * look, 999, true, true), None);
        }
        let later = start + Duration::from_secs(5);
        assert_eq!(p.due(later, 1000, false, true), Some(0.01));
        assert_eq!(p.due(later + LOOK, 5000, false, true), Some(0.01));
        assert_eq!(
            p.due(later + Duration::from_secs(10), 9000, true, true),
            None
        );
    }

    #[test]
    fn a_bundle_of_elements_is_halved_for_an_idle_worker_but_never_for_time() {
        let start = Instant::now();
        let mut p = SplitPolicy::for_elements(1000, start, true);
        for look in 1..200 {
            assert_eq!(p.due(start + LOOK * look, 0, false, true), None);
        }
        let (at, f) = next_split(&mut p, start, LOOK * 200, 0, true);
        assert_eq!((at, f), (LOOK * 202, 0.5), "two idle looks in a row");
        assert_eq!(p.due(start + at + LOOK * 6, 1000, false, true), Some(0.01));
    }

    #[test]
    fn output_past_the_limit_halves_then_ends_the_bundle_once() {
        let start = Instant::now();
        let mut p = SplitPolicy::new(1000, start);
        assert_eq!(p.due(start + LOOK, 999, false, true), None);
        assert_eq!(p.due(start + LOOK * 2, 1000, false, true), Some(0.5));
        assert_eq!(p.due(start + LOOK * 3, 5000, false, true), Some(0.01));
        // No third split for size; the next is for time, a second later.
        assert_eq!(p.due(start + LOOK * 4, 9000, false, true), None);
        assert_eq!(
            p.due(start + LOOK * 3 + Duration::from_secs(1), 9000, false, true),
            Some(0.01)
        );
    }

    #[test]
    fn an_idle_worker_seen_twice_gets_half_of_what_is_left() {
        let start = Instant::now();
        let mut p = SplitPolicy::new(u64::MAX, start);
        // Idle at one look only (a worker between two bundles): no split.
        assert_eq!(p.due(start + LOOK * 5, 0, true, true), None);
        assert_eq!(p.due(start + LOOK * 6, 0, false, true), None);
        assert_eq!(p.due(start + LOOK * 7, 0, true, true), None);
        assert_eq!(p.due(start + LOOK * 8, 0, true, true), Some(0.5));
        // Not again within 100 ms, even though the worker is still idle.
        assert_eq!(p.due(start + LOOK * 9, 0, true, true), None);
        assert_eq!(p.due(start + LOOK * 12, 0, true, true), None);
        assert_eq!(p.due(start + LOOK * 13, 0, true, true), Some(0.5));
    }

    #[test]
    fn refused_idle_splits_are_asked_for_less_and_less_often() {
        let start = Instant::now();
        let mut p = SplitPolicy::for_elements(u64::MAX, start, true);
        let (mut at, _) = next_split(&mut p, start, Duration::ZERO, 0, true);
        let mut gaps = Vec::new();
        for _ in 0..7 {
            p.refused();
            let (next, _) = next_split(&mut p, start, at, 0, true);
            gaps.push((next - at).as_millis());
            at = next;
        }
        assert_eq!(gaps, [200, 400, 800, 1600, 3200, 3200, 3200]);
        // One that gives work back: every 100 ms again.
        p.accepted();
        let (next, _) = next_split(&mut p, start, at, 0, true);
        assert_eq!((next - at).as_millis(), 100);
    }

    #[test]
    fn idle_splits_do_not_use_up_the_splits_for_size() {
        let start = Instant::now();
        let mut p = SplitPolicy::new(1000, start);
        p.due(start + LOOK, 0, true, true);
        assert_eq!(p.due(start + LOOK * 6, 0, true, true), Some(0.5));
        assert_eq!(p.due(start + LOOK * 12, 0, true, true), Some(0.5));
        // The output then passes the limit: cut to 1% (not the first split).
        assert_eq!(p.due(start + LOOK * 13, 2000, false, true), Some(0.01));
        assert_eq!(p.due(start + LOOK * 14, 3000, false, true), Some(0.01));
    }
}
