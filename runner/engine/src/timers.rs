//! Pending timers of a stateful stage.
//!
//! The SDK sets and clears timers by writing them to the data channel; the
//! runner keeps the latest write per (transform, family, key, tag, window)
//! — a later set overwrites, a clear deletes — and delivers a timer back to
//! the SDK once its time domain has passed its firing time. A pending timer
//! holds the stage's output watermark at its hold timestamp, so output the
//! timer will produce is never late.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use bytes::Bytes;

use crate::coder::{Coder, TimerValue};
use crate::plan::TimeDomain;
use crate::time::{Timestamp, MAX_TIMESTAMP};
use crate::window::Window;

/// Identity of a timer: a later write with the same id replaces it.
type TimerId = (String, String, Bytes, String, Window);

/// A timer ready to be delivered, with where it goes.
#[derive(Debug, Clone)]
pub struct FiredTimer {
    /// Transform id of the timer's ParDo.
    pub transform_id: String,
    /// Timer family id.
    pub family_id: String,
    /// The timer as it will be sent (one window).
    pub timer: TimerValue,
}

/// Timers of one stage.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct TimerStore {
    timers: BTreeMap<TimerId, (TimeDomain, TimerValue)>,
}

impl TimerStore {
    /// Apply the timer writes of a committed bundle, in order.
    pub fn apply(
        &mut self,
        transform_id: &str,
        family_id: &str,
        domain: TimeDomain,
        writes: Vec<TimerValue>,
    ) {
        for timer in writes {
            for window in &timer.windows {
                let id = (
                    transform_id.to_string(),
                    family_id.to_string(),
                    timer.user_key.clone(),
                    timer.dynamic_tag.clone(),
                    window.clone(),
                );
                if timer.clear {
                    self.timers.remove(&id);
                } else {
                    let mut single = timer.clone();
                    single.windows = smallvec::smallvec![window.clone()];
                    self.timers.insert(id, (domain, single));
                }
            }
        }
    }

    /// Set an event-time timer the runner owns (a window-expiration
    /// callback) unless one with the same identity is already pending: it
    /// is set again for every element of its key and window, and the first
    /// setting stands. Returns whether it was new.
    pub fn set_if_absent(
        &mut self,
        transform_id: &str,
        family_id: &str,
        timer: TimerValue,
    ) -> bool {
        let Some(window) = timer.windows.first().cloned() else {
            return false;
        };
        let id = (
            transform_id.to_string(),
            family_id.to_string(),
            timer.user_key.clone(),
            timer.dynamic_tag.clone(),
            window,
        );
        if self.timers.contains_key(&id) {
            return false;
        }
        self.timers.insert(id, (TimeDomain::EventTime, timer));
        true
    }

    /// Put back timers of a bundle that failed, unless a newer write replaced them.
    pub fn restore(&mut self, fired: Vec<(TimeDomain, FiredTimer)>) {
        for (domain, f) in fired {
            for window in &f.timer.windows {
                let id = (
                    f.transform_id.clone(),
                    f.family_id.clone(),
                    f.timer.user_key.clone(),
                    f.timer.dynamic_tag.clone(),
                    window.clone(),
                );
                self.timers
                    .entry(id)
                    .or_insert_with(|| (domain, f.timer.clone()));
            }
        }
    }

    /// The earliest hold of any pending timer.
    pub fn hold(&self) -> Option<Timestamp> {
        self.timers.values().map(|(_, t)| t.hold_timestamp).min()
    }

    /// The earliest firing time of a pending processing-time timer.
    pub fn next_processing_time(&self) -> Option<Timestamp> {
        self.timers
            .values()
            .filter(|(d, _)| *d == TimeDomain::ProcessingTime)
            .map(|(_, t)| t.fire_timestamp)
            .min()
    }

    /// Drop the timers of windows that `expired_at` says were garbage
    /// collected at a time behind `input_watermark`, unless they are
    /// event-time timers due by then (those fire first). Returns how many
    /// were dropped.
    pub fn drop_expired(
        &mut self,
        input_watermark: Timestamp,
        mut expired_at: impl FnMut(&Window) -> Timestamp,
    ) -> usize {
        let before = self.timers.len();
        self.timers.retain(|(_, _, _, _, window), (domain, timer)| {
            let gc = expired_at(window);
            gc >= input_watermark
                || (*domain == TimeDomain::EventTime && timer.fire_timestamp <= gc)
        });
        before - self.timers.len()
    }

    /// The windows that still have a pending timer (their state must live
    /// until those timers fired).
    pub fn windows(&self) -> std::collections::BTreeSet<Window> {
        self.timers
            .keys()
            .map(|(_, _, _, _, w)| w.clone())
            .collect()
    }

    /// Whether no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.timers.is_empty()
    }

    /// Remove and return the timers that may fire: event-time timers whose
    /// firing time the input watermark has passed, processing-time timers
    /// whose time `now` has reached, and every timer once the input is
    /// complete (`input_watermark` at +∞: a bounded input ends, so
    /// processing time is treated as having run out too). Ordered by firing
    /// time. Timers of the `last` family (transform, family) — the
    /// window-expiration callback — fire only when no other timer is ready,
    /// so they see the effects of every user timer of their window.
    pub fn take_ready(
        &mut self,
        input_watermark: Timestamp,
        now: Timestamp,
        last: Option<(&str, &str)>,
    ) -> Vec<(TimeDomain, FiredTimer)> {
        self.take_ready_where(input_watermark, now, last, usize::MAX, |_| true)
    }

    /// [`Self::take_ready`] among the timers `eligible` accepts (the others
    /// stay, ready or not: their keys are busy in another bundle), at most
    /// `max` of them: the earliest, so that the rest fire in later bundles
    /// after them (a bundle's timers are bounded like its elements; a
    /// window closing over a million keys is not one bundle).
    pub fn take_ready_where(
        &mut self,
        input_watermark: Timestamp,
        now: Timestamp,
        last: Option<(&str, &str)>,
        max: usize,
        eligible: impl Fn(&TimerValue) -> bool,
    ) -> Vec<(TimeDomain, FiredTimer)> {
        let is_ready = |(domain, t): &(TimeDomain, TimerValue)| {
            eligible(t)
                && (input_watermark >= MAX_TIMESTAMP
                    || match domain {
                        TimeDomain::EventTime => t.fire_timestamp < input_watermark,
                        TimeDomain::ProcessingTime => t.fire_timestamp <= now,
                    })
        };
        let is_last = |id: &TimerId| last.is_some_and(|(t, f)| id.0 == t && id.1 == f);
        // Borrowed while choosing: only the chosen ids are copied (a
        // bounded take out of many ready timers must not copy them all).
        let ready_of = |last_family: bool| -> Vec<(Timestamp, &TimerId)> {
            self.timers
                .iter()
                .filter(|(id, v)| is_last(id) == last_family && is_ready(v))
                .map(|(id, (_, t))| (t.fire_timestamp, id))
                .collect()
        };
        let mut ready = ready_of(false);
        if ready.is_empty() {
            ready = ready_of(true);
        }
        let max = max.max(1);
        if ready.len() > max {
            ready.select_nth_unstable_by_key(max, |(at, _)| *at);
            ready.truncate(max);
        }
        let chosen: Vec<TimerId> = ready.into_iter().map(|(_, id)| id.clone()).collect();
        let mut fired: Vec<(TimeDomain, FiredTimer)> = chosen
            .into_iter()
            .filter_map(|id| {
                self.timers.remove(&id).map(|(domain, timer)| {
                    (
                        domain,
                        FiredTimer {
                            transform_id: id.0,
                            family_id: id.1,
                            timer,
                        },
                    )
                })
            })
            .collect();
        fired.sort_by_key(|(_, f)| f.timer.fire_timestamp);
        fired
    }

    /// Encode fired timers of one (transform, family) for the data channel.
    pub fn encode(
        fired: &[&FiredTimer],
        window_coder: &Coder,
    ) -> Result<Bytes, crate::coder::CoderError> {
        let mut out = Vec::new();
        for f in fired {
            f.timer.encode(window_coder, &mut out)?;
        }
        Ok(Bytes::from(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coder::PaneInfo;

    fn timer(key: &str, fire: Timestamp, clear: bool) -> TimerValue {
        TimerValue {
            user_key: Bytes::copy_from_slice(key.as_bytes()),
            dynamic_tag: String::new(),
            windows: smallvec::smallvec![Window::Global],
            clear,
            fire_timestamp: fire,
            hold_timestamp: fire,
            pane: PaneInfo::NO_FIRING,
        }
    }

    #[test]
    fn last_write_wins_and_clear_deletes() {
        let mut s = TimerStore::default();
        s.apply(
            "t",
            "ts-a",
            TimeDomain::EventTime,
            vec![timer("k", 10, false), timer("k", 20, false)],
        );
        assert_eq!(s.hold(), Some(20));
        s.apply(
            "t",
            "ts-a",
            TimeDomain::EventTime,
            vec![timer("k", 0, true)],
        );
        assert!(s.is_empty());
    }

    #[test]
    fn expired_windows_lose_the_timers_they_can_no_longer_fire() {
        let mut s = TimerStore::default();
        // Due before the window's GC time (19): kept, it fires first.
        s.apply("t", "e", TimeDomain::EventTime, vec![timer("a", 15, false)]);
        // Set beyond the GC time: dropped once the window expired.
        s.apply("t", "e", TimeDomain::EventTime, vec![timer("b", 50, false)]);
        s.apply(
            "t",
            "p",
            TimeDomain::ProcessingTime,
            vec![timer("c", 5, false)],
        );
        assert_eq!(s.drop_expired(10, |_| 19), 0, "not expired yet");
        assert_eq!(s.drop_expired(30, |_| 19), 2);
        let left = s.take_ready(30, 0, None);
        assert_eq!(left.len(), 1);
        assert_eq!(&left[0].1.timer.user_key[..], b"a");
    }

    #[test]
    fn runner_owned_timers_keep_their_first_setting() {
        let mut s = TimerStore::default();
        assert!(s.set_if_absent("t", "owe", timer("k", 19, false)));
        assert!(!s.set_if_absent("t", "owe", timer("k", 50, false)));
        assert!(s.set_if_absent("t", "owe", timer("j", 19, false)));
        s.apply(
            "t",
            "user",
            TimeDomain::EventTime,
            vec![timer("k", 5, false)],
        );
        let last = Some(("t", "owe"));
        assert!(
            s.take_ready(5, 0, last).is_empty(),
            "fires only past its time"
        );
        let fired = s.take_ready(20, 0, last);
        assert_eq!(fired.len(), 1, "user timers of the window fire first");
        assert_eq!(fired[0].1.family_id, "user");
        let fired = s.take_ready(20, 0, last);
        assert_eq!(fired.len(), 2);
        assert!(fired.iter().all(|(_, f)| f.timer.fire_timestamp == 19));
    }

    /// At most `max` timers are taken, the earliest; the others stay and
    /// come next, still ahead of the window-expiration family.
    #[test]
    fn a_bounded_take_fires_the_earliest_first() {
        let mut s = TimerStore::default();
        let keys = ["a", "b", "c", "d", "e", "f", "g"];
        for (i, k) in keys.iter().enumerate() {
            let at = 10 - i as i64;
            s.apply("t", "e", TimeDomain::EventTime, vec![timer(k, at, false)]);
        }
        assert!(s.set_if_absent("t", "owe", timer("a", 3, false)));
        let last = Some(("t", "owe"));
        let times = |fired: Vec<(TimeDomain, FiredTimer)>| -> Vec<i64> {
            fired.iter().map(|(_, f)| f.timer.fire_timestamp).collect()
        };
        assert_eq!(
            times(s.take_ready_where(20, 0, last, 3, |_| true)),
            [4, 5, 6]
        );
        assert_eq!(
            times(s.take_ready_where(20, 0, last, 3, |_| true)),
            [7, 8, 9]
        );
        assert_eq!(times(s.take_ready_where(20, 0, last, 3, |_| true)), [10]);
        let expiry = s.take_ready_where(20, 0, last, 3, |_| true);
        assert_eq!(expiry.len(), 1);
        assert_eq!(expiry[0].1.family_id, "owe");
        assert!(s.is_empty());
    }

    #[test]
    fn fires_by_domain() {
        let mut s = TimerStore::default();
        s.apply("t", "e", TimeDomain::EventTime, vec![timer("a", 10, false)]);
        s.apply(
            "t",
            "p",
            TimeDomain::ProcessingTime,
            vec![timer("b", 100, false)],
        );
        assert!(s.take_ready(10, 0, None).is_empty());
        let fired = s.take_ready(11, 0, None);
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].1.family_id, "e");
        assert_eq!(s.take_ready(11, 100, None).len(), 1);
        assert!(s.is_empty());
    }
}
