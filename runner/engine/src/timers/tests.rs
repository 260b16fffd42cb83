//! Tests of the timer store: single behaviours, then a property test
//! against a walk over every timer, with checkpoint round trips.

use super::*;
use crate::coder::PaneInfo;
use proptest::prelude::*;

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
fn a_due_event_time_timer_holds_at_its_firing_time_whatever_its_output_time() {
    let mut s = TimerStore::default();
    // No output timestamp: the SDK writes the end of time as the hold.
    let mut unheld = timer("k", 10, false);
    unheld.hold_timestamp = MAX_TIMESTAMP;
    s.apply("t", "e", TimeDomain::EventTime, vec![unheld.clone()]);
    assert_eq!(s.hold(), Some(10));
    // A processing-time timer's firing time is not event time.
    let mut s = TimerStore::default();
    s.apply("t", "p", TimeDomain::ProcessingTime, vec![unheld]);
    assert_eq!(s.hold(), Some(MAX_TIMESTAMP));
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
fn renamed_transforms_keep_their_timers_and_a_lost_owner_is_named() {
    let mut s = TimerStore::default();
    s.apply("t1", "e", TimeDomain::EventTime, vec![timer("a", 5, false)]);
    s.apply("t2", "e", TimeDomain::EventTime, vec![timer("b", 7, false)]);
    // t2 becomes t0: it now sorts first, and fires under its new id.
    s.rename_transforms(|id| Some(TransformId::new(if **id == *"t2" { "t0" } else { id })))
        .expect("every owner has a new id");
    let fired: Vec<(String, i64)> = s
        .take_ready_where(20, 0, None, 10, |_| true)
        .into_iter()
        .map(|(_, f)| (f.transform_id.to_string(), f.timer.fire_timestamp))
        .collect();
    assert_eq!(fired, [("t1".to_string(), 5), ("t0".to_string(), 7)]);
    let mut s = TimerStore::default();
    s.apply(
        "gone",
        "e",
        TimeDomain::EventTime,
        vec![timer("a", 5, false)],
    );
    let lost = s
        .rename_transforms(|_| None)
        .expect_err("a timer without an owner");
    assert_eq!(lost, TransformId::new("gone"));
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

/// The checkpoint form of a store (and the store as it was before it
/// was indexed).
#[derive(Default, Serialize, Deserialize, PartialEq, Debug)]
#[serde(rename = "TimerStore")]
struct Plain {
    timers: BTreeMap<TimerId<'static>, (TimeDomain, TimerValue)>,
}

/// The oracle: one map by identity, every question answered by a walk
/// over all of it. Each timer set gets the next arrival number, so
/// that timers due together are taken in the order they were set.
#[derive(Default)]
struct Oracle {
    timers: BTreeMap<TimerId<'static>, (TimeDomain, TimerValue, u64)>,
    arrivals: u64,
}

impl Oracle {
    fn write(&mut self, t: &str, f: &str, domain: TimeDomain, timer: TimerValue, keep: bool) {
        let id = TimerId {
            transform_id: Cow::Owned(t.into()),
            family_id: Cow::Owned(f.into()),
            user_key: Cow::Owned(timer.user_key.clone()),
            dynamic_tag: Cow::Owned(timer.dynamic_tag.clone()),
            window: Cow::Owned(timer.windows[0].clone()),
        };
        if timer.clear {
            self.timers.remove(&id);
        } else if !(keep && self.timers.contains_key(&id)) {
            self.timers.insert(id, (domain, timer, self.arrivals));
            self.arrivals += 1;
        }
    }

    fn plain(&self) -> Plain {
        let timers = self
            .timers
            .iter()
            .map(|(id, (d, t, _))| (id.clone(), (*d, t.clone())));
        Plain {
            timers: timers.collect(),
        }
    }

    fn take(
        &mut self,
        wm: Timestamp,
        now: Timestamp,
        last: (&str, &str),
        max: usize,
        eligible: impl Fn(&[u8]) -> bool,
    ) -> Vec<(TimeDomain, FiredTimer)> {
        let ready = |last_family: bool| -> Vec<TimerId<'static>> {
            let mut ids: Vec<(&TimerId, Timestamp, u64)> = self
                .timers
                .iter()
                .filter(|(id, (d, t, _))| {
                    ((&*id.transform_id, &*id.family_id) == last) == last_family
                        && eligible(&id.user_key)
                        && (wm >= MAX_TIMESTAMP
                            || match d {
                                TimeDomain::EventTime => t.fire_timestamp < wm,
                                TimeDomain::ProcessingTime => t.fire_timestamp <= now,
                            })
                })
                .map(|(id, (_, t, arrival))| (id, t.fire_timestamp, *arrival))
                .collect();
            ids.sort_by_key(|(id, fire, arrival)| {
                (
                    *fire,
                    id.transform_id.clone(),
                    id.family_id.clone(),
                    *arrival,
                )
            });
            ids.into_iter()
                .take(max)
                .map(|(id, _, _)| id.clone())
                .collect()
        };
        let mut ids = ready(false);
        if ids.is_empty() {
            ids = ready(true);
        }
        ids.into_iter()
            .filter_map(|id| {
                let (domain, timer, _) = self.timers.remove(&id)?;
                Some((
                    domain,
                    FiredTimer {
                        transform_id: TransformId::new(&id.transform_id),
                        family_id: id.family_id.into_owned(),
                        timer,
                    },
                ))
            })
            .collect()
    }

    fn drop_expired(&mut self, wm: Timestamp, gc: impl Fn(&Window) -> Timestamp) -> usize {
        let before = self.timers.len();
        self.timers.retain(|id, (d, t, _)| {
            let at = gc(&id.window);
            at >= wm || (*d == TimeDomain::EventTime && t.fire_timestamp <= at)
        });
        before - self.timers.len()
    }

    /// An event-time timer holds at its output timestamp or its
    /// firing time, whichever is earlier.
    fn hold(&self) -> Option<Timestamp> {
        self.timers
            .values()
            .map(|(d, t, _)| match d {
                TimeDomain::EventTime => t.hold_timestamp.min(t.fire_timestamp),
                _ => t.hold_timestamp,
            })
            .min()
    }

    fn next_processing_time(&self) -> Option<Timestamp> {
        self.timers
            .values()
            .filter(|(d, _, _)| *d == TimeDomain::ProcessingTime)
            .map(|(_, t, _)| t.fire_timestamp)
            .min()
    }

    fn windows(&self) -> BTreeSet<Window> {
        self.timers
            .keys()
            .map(|id| id.window.clone().into_owned())
            .collect()
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Family 0 (event), 1 (processing) or 2 (window expiration,
    /// runner-owned); key; window; fire; hold offset; clear.
    Write(usize, u8, usize, i64, i64, bool),
    Take(i64, i64, usize, u8),
    /// The last take's bundle failed: its timers go back.
    Restore,
    DropExpired(i64),
    Checkpoint,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 0..5u8, 0..3usize, 0..40i64, 0..5i64, any::<bool>())
            .prop_map(|(f, k, w, at, h, c)| Op::Write(f, k, w, at, h, c)),
        2 => (0..45i64, 0..45i64, 1..4usize, 0..32u8)
            .prop_map(|(wm, now, max, mask)| Op::Take(wm, now, max, mask)),
        1 => Just(Op::Restore),
        1 => (0..45i64).prop_map(Op::DropExpired),
        1 => Just(Op::Checkpoint),
    ]
}

fn window_of(w: usize) -> Window {
    match w {
        0 => Window::Global,
        w => Window::Interval {
            start: (w as i64 - 1) * 20,
            end: w as i64 * 20,
        },
    }
}

proptest! {
    /// Any sequence of writes, bounded takes, expirations and
    /// checkpoint round trips leaves the indexed store answering every
    /// question as the walk over all timers does.
    #[test]
    fn answers_as_a_walk_over_every_timer_would(ops in proptest::collection::vec(op(), 1..60)) {
        let families = [("t", "e", TimeDomain::EventTime), ("t", "p", TimeDomain::ProcessingTime), ("t", "owe", TimeDomain::EventTime)];
        let last = ("t", "owe");
        let gc = |w: &Window| w.max_timestamp().saturating_add(3);
        let mut store = TimerStore::default();
        let mut oracle = Oracle::default();
        let mut taken = Vec::new();
        for op in ops {
            match op {
                Op::Write(f, k, w, at, h, clear) => {
                    let (t, family, domain) = families[f];
                    let mut write = timer(&format!("k{k}"), at, clear && f != 2);
                    write.windows = smallvec::smallvec![window_of(w)];
                    write.hold_timestamp = at + h;
                    if f == 2 {
                        store.set_if_absent(t, family, write.clone());
                        oracle.write(t, family, domain, write, true);
                    } else {
                        store.apply(t, family, domain, vec![write.clone()]);
                        oracle.write(t, family, domain, write, false);
                    }
                }
                Op::Take(wm, now, max, mask) => {
                    let eligible = |key: &[u8]| mask & (1 << (key[1] - b'0')) != 0;
                    let wm = if wm == 44 { MAX_TIMESTAMP } else { wm };
                    let got = store.take_ready_where(wm, now, Some(last), max, eligible);
                    let want = oracle.take(wm, now, last, max, eligible);
                    let seen = |fired: &[(TimeDomain, FiredTimer)]| -> Vec<(String, TimerValue)> {
                        fired.iter().map(|(_, f)| (f.family_id.clone(), f.timer.clone())).collect()
                    };
                    prop_assert_eq!(seen(&got), seen(&want));
                    taken = got;
                }
                Op::Restore => {
                    for (domain, f) in &taken {
                        oracle.write(&f.transform_id, &f.family_id, *domain, f.timer.clone(), true);
                    }
                    store.restore(std::mem::take(&mut taken));
                }
                Op::DropExpired(wm) => {
                    prop_assert_eq!(store.drop_expired(wm, gc), oracle.drop_expired(wm, gc));
                }
                Op::Checkpoint => {
                    let bytes = postcard::to_stdvec(&store).unwrap();
                    // The checkpoint form, readable as the plain map...
                    let plain: Plain = postcard::from_bytes(&bytes).unwrap();
                    prop_assert_eq!(&plain, &oracle.plain());
                    // ... and the plain map's checkpoints readable as a store.
                    let from_plain: TimerStore =
                        postcard::from_bytes(&postcard::to_stdvec(&plain).unwrap()).unwrap();
                    let again: Plain = postcard::from_bytes(&postcard::to_stdvec(&from_plain).unwrap()).unwrap();
                    prop_assert_eq!(&again, &plain);
                    // Restored, the store fires timers due together in the same order.
                    store = postcard::from_bytes(&bytes).unwrap();
                    prop_assert_eq!(postcard::to_stdvec(&store).unwrap(), bytes);
                }
            }
            prop_assert_eq!(store.hold(), oracle.hold());
            prop_assert_eq!(store.next_processing_time(), oracle.next_processing_time());
            prop_assert_eq!(store.windows(), oracle.windows());
            prop_assert_eq!(store.is_empty(), oracle.timers.is_empty());
        }
    }
}
