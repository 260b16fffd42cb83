//! User state of expired windows, user and expiry timers, TestStream's
//! processing time, time-sorted input.

use super::fixtures::*;

#[tokio::test]
async fn user_state_of_an_expired_window_is_collected() {
    // TestStream -> stateful stage. The stage appends to the bag of each
    // element's window; the second element, in a later window, reads the
    // first window's bag after the watermark passed that window's end.
    let w0 = Window::Interval { start: 0, end: 10 };
    let mut w0_bytes = Vec::new();
    Coder::IntervalWindow
        .encode_window(&w0, &mut w0_bytes)
        .unwrap();
    let w0_bytes = Bytes::from(w0_bytes);
    let plan = stateful_plan(
        vec![
            TestStreamEvent::Elements {
                output: PCollectionIdx::new(0),
                elements: vec![keyed_at("k", 5)],
            },
            TestStreamEvent::Watermark(50),
            TestStreamEvent::Elements {
                output: PCollectionIdx::new(0),
                elements: vec![keyed_at("k", 105)],
            },
        ],
        SdkStage {
            stateful: true,
            ..SdkStage::default()
        },
    );
    let window = window_by_hundreds();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let stateful: StageFn = Arc::new(move |input| {
        let bag = |window: Bytes| {
            StateKey::BagUserState(CellId {
                transform_id: "t".into(),
                state_id: "s".into(),
                window,
                key: Bytes::from_static(b"\x01k"),
            })
        };
        for chunk in &input.elements {
            for e in
                decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::IntervalWindow).unwrap()
            {
                let mut w = Vec::new();
                Coder::IntervalWindow
                    .encode_window(&e.header.windows[0], &mut w)
                    .unwrap();
                let own = input.state.get(&bag(Bytes::from(w.clone())), None).unwrap();
                let first = input.state.get(&bag(w0_bytes.clone()), None).unwrap();
                seen2.lock().push((own.data.len(), first.data.len()));
                input
                    .state
                    .append(&bag(Bytes::from(w)), Bytes::from_static(b"\x01x"))
                    .unwrap();
            }
        }
        Ok(BundleOutput::default())
    });
    let exec = FakeExecutor {
        stages: [(1, window), (2, stateful)].into_iter().collect(),
        bundles: AtomicUsize::new(0),
    };
    run(plan, exec, config(10)).await.unwrap();
    // First element: nothing yet. Second element: its own bag is empty and
    // the first window's bag was collected when the watermark passed 10.
    assert_eq!(*seen.lock(), vec![(0, 0), (0, 0)]);
}

/// A stage assigning `[t - t % 100, + 10)` windows to `KV<bytes, varint>`
/// elements, as an SDK's WindowInto would.
fn window_by_hundreds() -> StageFn {
    Arc::new(|input| {
        let mut out = Vec::new();
        for chunk in &input.elements {
            for e in
                decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::GlobalWindow).unwrap()
            {
                let ts = e.header.timestamp;
                let start = ts - ts % 100;
                let header = WindowedValueHeader {
                    timestamp: ts,
                    windows: smallvec::smallvec![Window::Interval {
                        start,
                        end: start + 10,
                    }],
                    pane: PaneInfo::NO_FIRING,
                };
                encode_windowed_value(&header, &Coder::IntervalWindow, e.value(), &mut out)
                    .unwrap();
            }
        }
        Ok(BundleOutput {
            outputs: vec![(PCollectionIdx::new(1), Bytes::from(out))],
            ..Default::default()
        })
    })
}

/// `KV<key, ts>` at event time `ts`, as a TestStream element.
fn keyed_at(key: &str, ts: i64) -> (Bytes, i64) {
    let mut v = vec![key.len() as u8];
    v.extend_from_slice(key.as_bytes());
    encode_varint_i64(ts, &mut v);
    (Bytes::from(v), ts)
}

/// TestStream (`events`) -> windowing by hundreds -> `stateful`.
fn stateful_plan(events: Vec<TestStreamEvent>, stateful: SdkStage) -> Plan {
    let kv = kv_bytes_varint();
    Plan {
        pcollections: vec![
            pc("raw", kv.clone(), Coder::GlobalWindow),
            pc("in", kv, Coder::IntervalWindow),
        ]
        .into(),
        stages: vec![
            Stage {
                name: "stream".into(),
                kind: StageKind::TestStream(events),
                inputs: vec![],
                side_inputs: vec![],
                outputs: vec![PCollectionIdx::new(0)],
            },
            sdk_stage("window", vec![0], vec![1]),
            Stage {
                kind: StageKind::Sdk(stateful),
                ..sdk_stage("stateful", vec![1], vec![])
            },
        ]
        .into(),
        names: Default::default(),
    }
}

fn event_time_family(family_id: &str) -> TimerFamily {
    TimerFamily {
        transform_id: "t".into(),
        family_id: family_id.into(),
        domain: TimeDomain::EventTime,
        key_coder: Coder::Bytes,
        window_coder: Coder::IntervalWindow,
    }
}

/// What the stateful stage saw: an element (key, timestamp) or a timer
/// (family, key, window, firing time).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Element(Vec<u8>, i64),
    Timer(String, Vec<u8>, Window, i64),
}

/// What a fake stateful stage returns when each element of its bundle (a
/// one-letter key) sets a "user" timer in its window at `fire_at` of its
/// timestamp.
fn user_timer_per_element(input: &BundleInput, fire_at: impl Fn(i64) -> i64) -> BundleOutput {
    let mut set = Vec::new();
    for chunk in &input.elements {
        for e in decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::IntervalWindow).unwrap()
        {
            let at = fire_at(e.header.timestamp);
            TimerValue {
                user_key: e.value_bytes().slice(..2),
                dynamic_tag: String::new(),
                windows: e.header.windows.clone(),
                clear: false,
                fire_timestamp: at,
                hold_timestamp: at,
                pane: PaneInfo::NO_FIRING,
            }
            .encode(&Coder::IntervalWindow, &mut set)
            .unwrap();
        }
    }
    BundleOutput {
        timers: vec![TimerInput {
            transform_id: "t".into(),
            family_id: "user".into(),
            data: Bytes::from(set),
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn window_expiration_fires_once_per_key_and_window_after_its_user_timers() {
    let events = vec![
        TestStreamEvent::Elements {
            output: PCollectionIdx::new(0),
            elements: vec![keyed_at("a", 1), keyed_at("a", 3), keyed_at("b", 5)],
        },
        TestStreamEvent::Watermark(50),
        TestStreamEvent::Elements {
            output: PCollectionIdx::new(0),
            elements: vec![keyed_at("a", 105)],
        },
    ];
    let plan = stateful_plan(
        events,
        SdkStage {
            stateful: true,
            timer_families: vec![event_time_family("user"), event_time_family("expiry")],
            window_expiration: Some(WindowExpiration {
                transform_id: "t".into(),
                family_id: "expiry".into(),
            }),
            ..SdkStage::default()
        },
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    // Every element sets a "user" timer at its timestamp + 1 in its window.
    let stateful: StageFn = Arc::new(move |input| {
        let mut log = seen2.lock();
        for t in &input.timers {
            for timer in decode_timers(&t.data, &Coder::Bytes, &Coder::IntervalWindow).unwrap() {
                log.push(Seen::Timer(
                    t.family_id.clone(),
                    timer.user_key.to_vec(),
                    timer.windows[0].clone(),
                    timer.fire_timestamp,
                ));
            }
        }
        for chunk in &input.elements {
            for e in
                decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::IntervalWindow).unwrap()
            {
                log.push(Seen::Element(e.value()[..2].to_vec(), e.header.timestamp));
            }
        }
        Ok(user_timer_per_element(input, |ts| ts + 1))
    });
    let exec = FakeExecutor {
        stages: [(1, window_by_hundreds()), (2, stateful)]
            .into_iter()
            .collect(),
        bundles: AtomicUsize::new(0),
    };
    run(plan, exec, config(10)).await.unwrap();

    let seen = seen.lock().clone();
    let first = Window::Interval { start: 0, end: 10 };
    let later = Window::Interval {
        start: 100,
        end: 110,
    };
    let expiries: Vec<(Vec<u8>, Window, i64)> = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Timer(f, k, w, t) if f == "expiry" => Some((k.clone(), w.clone(), *t)),
            _ => None,
        })
        .collect();
    // Once per key and window, firing at the window's end (no lateness).
    assert_eq!(
        expiries,
        vec![
            (b"\x01a".to_vec(), first.clone(), 9),
            (b"\x01b".to_vec(), first.clone(), 9),
            (b"\x01a".to_vec(), later.clone(), 109),
        ],
        "{seen:?}"
    );
    // Each after every user timer and element of its window.
    for (key, window, _) in &expiries {
        let at = seen
            .iter()
            .position(|s| matches!(s, Seen::Timer(f, k, w, _) if f == "expiry" && k == key && w == window))
            .unwrap();
        let user_timer_after = seen[at..].iter().any(
            |s| matches!(s, Seen::Timer(f, k, w, _) if f == "user" && k == key && w == window),
        );
        assert!(!user_timer_after, "{seen:?}");
    }
    assert!(seen.contains(&Seen::Timer("user".into(), b"\x01a".to_vec(), first, 4)));
}

/// Timers that come due together (a window closing over many keys) are
/// spread over bundles no bigger than the element bound, and each fires
/// once.
#[tokio::test]
async fn timers_due_together_fire_in_bundles_of_the_element_bound() {
    let keys = ["a", "b", "c", "d", "e", "f", "g"];
    let events = vec![TestStreamEvent::Elements {
        output: PCollectionIdx::new(0),
        elements: keys.iter().map(|k| keyed_at(k, 1)).collect(),
    }];
    let plan = stateful_plan(
        events,
        SdkStage {
            stateful: true,
            timer_families: vec![event_time_family("user")],
            ..SdkStage::default()
        },
    );
    let per_bundle = Arc::new(Mutex::new(Vec::new()));
    let per_bundle2 = per_bundle.clone();
    // Every element sets a timer at 50, in its window [0, 100).
    let stateful: StageFn = Arc::new(move |input| {
        let mut fired = Vec::new();
        for t in &input.timers {
            for timer in decode_timers(&t.data, &Coder::Bytes, &Coder::IntervalWindow).unwrap() {
                fired.push(timer.user_key.to_vec());
            }
        }
        per_bundle2.lock().push(fired);
        Ok(user_timer_per_element(input, |_| 50))
    });
    let exec = FakeExecutor {
        stages: [(1, window_by_hundreds()), (2, stateful)]
            .into_iter()
            .collect(),
        bundles: AtomicUsize::new(0),
    };
    run(plan, exec, config(2)).await.unwrap();
    let per_bundle = per_bundle.lock().clone();
    assert!(per_bundle.iter().all(|t| t.len() <= 2), "{per_bundle:?}");
    let mut fired: Vec<Vec<u8>> = per_bundle.into_iter().flatten().collect();
    fired.sort();
    let want: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| [&[1u8][..], k.as_bytes()].concat())
        .collect();
    assert_eq!(fired, want);
}

#[tokio::test]
async fn a_test_stream_pipeline_moves_processing_time_only_by_its_events() {
    processing_time_moves_only_by_test_stream_events(1, "k", false).await;
}

/// A TestStream moves processing time only by its events: a timer set
/// 10 s ahead fires after 15 s of stream time, not after 5, however fast
/// the wall clock runs; on `shards` shards, with one-letter `key`'s timer
/// on whichever shard owns it (`frames`: the shards exchanging frames).
pub(super) async fn processing_time_moves_only_by_test_stream_events(
    shards: u32,
    key: &str,
    frames: bool,
) {
    use std::sync::atomic::AtomicI64;
    // A wall clock that runs fast: a second per reading.
    let wall = Arc::new(AtomicI64::new(1_000_000));
    let read_wall = {
        let wall = wall.clone();
        move || wall.fetch_add(1_000, Ordering::SeqCst)
    };
    let events = vec![
        TestStreamEvent::Elements {
            output: PCollectionIdx::new(0),
            elements: vec![keyed_at(key, 1)],
        },
        TestStreamEvent::ProcessingTime(5_000),
        TestStreamEvent::Elements {
            output: PCollectionIdx::new(0),
            elements: vec![keyed_at(key, 2)],
        },
        TestStreamEvent::ProcessingTime(10_000),
    ];
    let mut family = event_time_family("later");
    family.domain = TimeDomain::ProcessingTime;
    let plan = stateful_plan(
        events,
        SdkStage {
            stateful: true,
            timer_families: vec![family],
            ..SdkStage::default()
        },
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    // The first element sets a processing-time timer 10 s ahead of the
    // time the run started at (as an SDK would, from its own clock).
    let stateful: StageFn = Arc::new(move |input| {
        let mut log = seen2.lock();
        if input.timers.iter().any(|t| !t.data.is_empty()) {
            log.push("timer".to_string());
        }
        let mut set = Vec::new();
        for chunk in &input.elements {
            for e in
                decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::IntervalWindow).unwrap()
            {
                log.push(format!("element@{}", e.header.timestamp));
                if e.header.timestamp == 1 {
                    TimerValue {
                        user_key: e.value_bytes().slice(..2),
                        dynamic_tag: String::new(),
                        windows: e.header.windows.clone(),
                        clear: false,
                        fire_timestamp: 1_000_000 + 10_000,
                        hold_timestamp: 1,
                        pane: PaneInfo::NO_FIRING,
                    }
                    .encode(&Coder::IntervalWindow, &mut set)
                    .unwrap();
                }
            }
        }
        Ok(BundleOutput {
            timers: vec![TimerInput {
                transform_id: "t".into(),
                family_id: "later".into(),
                data: Bytes::from(set),
            }],
            ..Default::default()
        })
    });
    let exec = Arc::new(FakeExecutor {
        stages: [(1, window_by_hundreds()), (2, stateful)]
            .into_iter()
            .collect(),
        bundles: AtomicUsize::new(0),
    });
    if frames {
        run_on_frames(plan, exec, config(10), shards, Arc::new(read_wall))
            .await
            .unwrap();
    } else {
        run_on_shards(plan, exec, config(10), shards, Arc::new(read_wall))
            .await
            .unwrap();
    }
    // 5 s of stream time is not enough, whatever the wall clock did; the
    // second advance is.
    assert_eq!(
        *seen.lock(),
        vec!["element@1", "element@2", "timer"],
        "wall clock read {} times",
        (wall.load(Ordering::SeqCst) - 1_000_000) / 1_000
    );
}

#[tokio::test]
async fn time_sorted_input_waits_for_the_watermark_and_arrives_in_order() {
    let events = vec![
        TestStreamEvent::Elements {
            output: PCollectionIdx::new(0),
            elements: vec![keyed_at("k", 30), keyed_at("k", 10), keyed_at("k", 20)],
        },
        TestStreamEvent::Watermark(25),
        TestStreamEvent::Elements {
            output: PCollectionIdx::new(0),
            elements: vec![keyed_at("k", 40), keyed_at("k", 5)],
        },
    ];
    let plan = stateful_plan(
        events,
        SdkStage {
            stateful: true,
            time_sorted_input: true,
            ..SdkStage::default()
        },
    );
    let bundles = Arc::new(Mutex::new(Vec::new()));
    let bundles2 = bundles.clone();
    let stateful: StageFn = Arc::new(move |input| {
        let mut times = Vec::new();
        for chunk in &input.elements {
            for e in
                decode_windowed_values(chunk, &kv_bytes_varint(), &Coder::IntervalWindow).unwrap()
            {
                times.push(e.header.timestamp);
            }
        }
        bundles2.lock().push(times);
        Ok(BundleOutput::default())
    });
    let exec = FakeExecutor {
        stages: [(1, window_by_hundreds()), (2, stateful)]
            .into_iter()
            .collect(),
        bundles: AtomicUsize::new(0),
    };
    run(plan, exec, config(10)).await.unwrap();
    // 30 waits for the watermark to pass it; 5 is behind the watermark
    // when it arrives and goes first; the rest when the input ends.
    let bundles = bundles.lock().clone();
    assert_eq!(bundles[0], vec![10, 20], "{bundles:?}");
    assert_eq!(bundles.concat(), vec![10, 20, 5, 30, 40], "{bundles:?}");
}
