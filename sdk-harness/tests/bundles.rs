//! The bundle protocol against a fake SDK over real gRPC.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod fake_sdk;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fake_sdk::{data, setup, timers, within, FakeData, RecordingState};
use refract_proto::fn_api::{
    instruction_request, instruction_response, state_key, state_request, state_response, Elements,
    InstructionRequest, InstructionResponse, ProcessBundleDescriptor, ProcessBundleResponse,
    StateAppendRequest, StateGetRequest, StateKey, StateRequest,
};
use refract_sdk_harness::{BundleError, BundleRequest, BundleResult, OutputSpill, Worker};

fn request(instruction_id: &str, descriptor_id: &str) -> BundleRequest {
    BundleRequest {
        instruction_id: instruction_id.to_string(),
        descriptor_id: descriptor_id.to_string(),
        inputs: vec![("src".to_string(), vec![Bytes::from_static(b"in")])],
        timers: vec![],
        expected_sinks: vec!["sink".to_string()],
        expected_timer_families: vec![],
        state: Arc::new(RecordingState::default()),
        overflow: None,
    }
}

fn spawn_bundle(
    worker: &Arc<Worker>,
    req: BundleRequest,
) -> tokio::task::JoinHandle<Result<BundleResult, BundleError>> {
    let worker = Arc::clone(worker);
    tokio::spawn(async move { worker.process_bundle(req).await })
}

fn process_bundle_of(request: &InstructionRequest) -> &str {
    match &request.request {
        Some(instruction_request::Request::ProcessBundle(p)) => &p.process_bundle_descriptor_id,
        other => panic!("expected a process_bundle request, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bundle_round_trip_with_chunked_input_and_split_output() {
    let mut s = setup("w-roundtrip").await;
    s.server.register_descriptor(ProcessBundleDescriptor {
        id: "pbd-1".to_string(),
        ..Default::default()
    });
    let bundle = spawn_bundle(
        &s.worker,
        BundleRequest {
            inputs: vec![
                (
                    "src".to_string(),
                    vec![
                        Bytes::from_static(b"elem1elem2"),
                        Bytes::from_static(b"elem3"),
                    ],
                ),
                ("src-empty".to_string(), vec![]),
            ],
            timers: vec![(
                "pardo".to_string(),
                "ts-t".to_string(),
                Bytes::from_static(b"timer-in"),
            )],
            expected_timer_families: vec![("pardo".to_string(), "ts-t".to_string())],
            ..request("b-1", "pbd-1")
        },
    );

    // The request comes first, on Control; the SDK then fetches the
    // descriptor and only then opens its Data stream.
    let instruction = s.sdk.next_instruction().await;
    assert_eq!(instruction.instruction_id, "b-1");
    assert_eq!(process_bundle_of(&instruction), "pbd-1");
    let descriptor = s.sdk.descriptor("pbd-1").await.expect("descriptor");
    assert_eq!(descriptor.id, "pbd-1");
    assert_eq!(
        s.sdk.descriptor("nope").await.expect_err("unknown").code(),
        tonic::Code::NotFound
    );
    let mut data_stream = s.sdk.open_data().await;
    let (inputs, input_timers) = data_stream
        .recv_input("b-1", &["src", "src-empty"], &[("pardo", "ts-t")])
        .await;
    let src: Vec<_> = inputs.iter().filter(|d| d.transform_id == "src").collect();
    assert_eq!(src.len(), 3, "two whole chunks, then a separate is_last");
    assert_eq!(src[0].data, b"elem1elem2");
    assert_eq!(src[1].data, b"elem3");
    assert!(!src[0].is_last && !src[1].is_last);
    assert!(src[2].is_last && src[2].data.is_empty());
    let empty: Vec<_> = inputs
        .iter()
        .filter(|d| d.transform_id == "src-empty")
        .collect();
    assert_eq!(empty.len(), 1);
    assert!(empty[0].is_last && empty[0].data.is_empty());
    assert_eq!(input_timers.len(), 2);
    assert_eq!(input_timers[0].timers, b"timer-in");
    assert!(input_timers[1].is_last && input_timers[1].timers.is_empty());
    assert_eq!(input_timers[1].timer_family_id, "ts-t");

    // Output split in the middle of elements, across messages.
    data_stream.send_data("b-1", "sink", b"out-el");
    data_stream.send_data("b-1", "sink", b"ement-1|out-");
    data_stream.send(Elements {
        data: vec![data("b-1", "sink", b"element-2", false)],
        timers: vec![timers("b-1", "pardo", "ts-t", b"tim", false)],
    });
    data_stream.send(Elements {
        data: vec![data("b-1", "sink", b"", true)],
        timers: vec![
            timers("b-1", "pardo", "ts-t", b"er-out", false),
            timers("b-1", "pardo", "ts-t", b"", true),
        ],
    });
    s.sdk.bundle_done(
        "b-1",
        ProcessBundleResponse {
            requires_finalization: true,
            ..Default::default()
        },
    );
    let result = within("the bundle", bundle)
        .await
        .expect("join")
        .expect("bundle succeeds");
    assert_eq!(
        result.outputs["sink"].concat(),
        Bytes::from_static(b"out-element-1|out-element-2")
    );
    assert_eq!(
        result.timers[&("pardo".to_string(), "ts-t".to_string())],
        Bytes::from_static(b"timer-out")
    );
    assert!(result.response.requires_finalization);

    // Finalization is its own instruction naming the bundle.
    let worker = Arc::clone(&s.worker);
    let finalize = tokio::spawn(async move { worker.finalize_bundle("b-1").await });
    let instruction = s.sdk.next_instruction().await;
    match &instruction.request {
        Some(instruction_request::Request::FinalizeBundle(f)) => {
            assert_eq!(f.instruction_id, "b-1")
        }
        other => panic!("expected finalize_bundle, got {other:?}"),
    }
    assert_ne!(instruction.instruction_id, "b-1", "a fresh instruction id");
    s.sdk.respond(InstructionResponse {
        instruction_id: instruction.instruction_id.clone(),
        error: String::new(),
        response: Some(instruction_response::Response::FinalizeBundle(
            Default::default(),
        )),
    });
    within("finalize", finalize)
        .await
        .expect("join")
        .expect("finalized");
}

// Paused time: the sleep below ends only once every task (runner and fake
// SDK) is idle, so the bundle has seen everything the response can cause.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn response_before_last_data_waits_for_is_last() {
    let mut s = setup("w-early-response").await;
    let bundle = spawn_bundle(&s.worker, request("b-early", "pbd"));
    s.sdk.next_instruction().await;
    let mut data_stream = s.sdk.open_data().await;
    data_stream.recv_input("b-early", &["src"], &[]).await;
    data_stream.send_data("b-early", "sink", b"first");
    s.sdk
        .bundle_done("b-early", ProcessBundleResponse::default());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!bundle.is_finished(), "must wait for the sink's is_last");
    data_stream.send_data("b-early", "sink", b"+second");
    data_stream.close_sink("b-early", "sink");
    let result = within("the bundle", bundle)
        .await
        .expect("join")
        .expect("ok");
    assert_eq!(
        result.outputs["sink"].concat(),
        Bytes::from_static(b"first+second")
    );
}

/// Keeps what it is given, in order, and says how much it was given.
#[derive(Default)]
struct KeptOverflow(parking_lot::Mutex<Vec<(String, Vec<u8>)>>);

impl OutputSpill for KeptOverflow {
    fn memory_limit(&self) -> usize {
        8
    }
    fn write(&self, sink: &str, bytes: Vec<u8>) -> Result<(), String> {
        self.0.lock().push((sink.to_string(), bytes));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_past_the_overflow_limit_leaves_memory_in_order() {
    let mut s = setup("w-overflow").await;
    let overflow = Arc::new(KeptOverflow::default());
    let bundle = spawn_bundle(
        &s.worker,
        BundleRequest {
            overflow: Some(overflow.clone()),
            ..request("b-over", "pbd")
        },
    );
    s.sdk.next_instruction().await;
    let mut data_stream = s.sdk.open_data().await;
    data_stream.recv_input("b-over", &["src"], &[]).await;
    for part in [&b"0123"[..], b"4567", b"89", b"abcdefghij", b"k"] {
        data_stream.send_data("b-over", "sink", part);
    }
    data_stream.close_sink("b-over", "sink");
    s.sdk
        .bundle_done("b-over", ProcessBundleResponse::default());
    let result = within("the bundle", bundle)
        .await
        .expect("join")
        .expect("ok");
    let written: Vec<u8> = overflow
        .0
        .lock()
        .iter()
        .flat_map(|(sink, bytes)| {
            assert_eq!(sink, "sink");
            bytes.clone()
        })
        .collect();
    // Past 8 bytes held, everything held goes; what came after stays.
    assert_eq!(written, b"0123456789abcdefghij");
    assert_eq!(result.outputs["sink"].concat(), Bytes::from_static(b"k"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_response_aborts_without_is_last() {
    let mut s = setup("w-error").await;
    let bundle = spawn_bundle(&s.worker, request("b-err", "pbd"));
    s.sdk.next_instruction().await;
    let data_stream = s.sdk.open_data().await;
    data_stream.send_data("b-err", "sink", b"partial");
    let traceback = "Traceback (most recent call last):\n  File \"x.py\", line 1, in first\nValueError: boom [while running 'StageC']";
    s.sdk.respond(InstructionResponse {
        instruction_id: "b-err".to_string(),
        error: traceback.to_string(),
        response: None,
    });
    let outcome = within("the bundle", bundle).await.expect("join");
    assert_eq!(
        outcome.expect_err("fails"),
        BundleError::Sdk(traceback.to_string())
    );
    // Late data for the failed bundle is dropped, and the worker still works.
    data_stream.close_sink("b-err", "sink");
    let next = spawn_bundle(&s.worker, request("b-after-err", "pbd"));
    s.sdk.next_instruction().await;
    data_stream.close_sink("b-after-err", "sink");
    s.sdk
        .bundle_done("b-after-err", ProcessBundleResponse::default());
    within("the next bundle", next)
        .await
        .expect("join")
        .expect("ok");
}

fn bag_key(user_state_id: &str) -> Option<StateKey> {
    Some(StateKey {
        r#type: Some(state_key::Type::BagUserState(state_key::BagUserState {
            transform_id: "pardo".to_string(),
            user_state_id: user_state_id.to_string(),
            window: vec![],
            key: b"k".to_vec(),
        })),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_requests_are_answered_by_id_in_order() {
    let mut s = setup("w-state").await;
    let handler = Arc::new(RecordingState::default());
    let bundle = spawn_bundle(
        &s.worker,
        BundleRequest {
            state: handler.clone(),
            ..request("b-state", "pbd")
        },
    );
    s.sdk.next_instruction().await;
    let mut state = s.sdk.open_state().await;
    // Pipelined: append, append, get, then one for an unknown instruction.
    for (id, body) in [
        (
            "1",
            state_request::Request::Append(StateAppendRequest {
                data: b"a".to_vec(),
            }),
        ),
        (
            "2",
            state_request::Request::Append(StateAppendRequest {
                data: b"b".to_vec(),
            }),
        ),
        (
            "3",
            state_request::Request::Get(StateGetRequest {
                continuation_token: vec![],
            }),
        ),
    ] {
        state.send(StateRequest {
            id: id.to_string(),
            instruction_id: "b-state".to_string(),
            state_key: bag_key("bag"),
            request: Some(body),
        });
    }
    state.send(StateRequest {
        id: "4".to_string(),
        instruction_id: "no-such-bundle".to_string(),
        state_key: bag_key("bag"),
        request: Some(state_request::Request::Get(StateGetRequest::default())),
    });
    let mut responses = Vec::new();
    for _ in 0..4 {
        responses.push(state.recv().await);
    }
    let ids: Vec<_> = responses.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["1", "2", "3", "4"]);
    assert!(matches!(
        responses[0].response,
        Some(state_response::Response::Append(_))
    ));
    assert!(responses[0].error.is_empty());
    match &responses[2].response {
        Some(state_response::Response::Get(g)) => assert_eq!(g.data, b"value-for-3"),
        other => panic!("expected a get response, got {other:?}"),
    }
    assert!(
        responses[3].error.contains("no-such-bundle"),
        "{:?}",
        responses[3]
    );
    let seen: Vec<_> = handler.seen.lock().iter().map(|r| r.id.clone()).collect();
    assert_eq!(seen, ["1", "2", "3"]);

    let mut data_stream = s.sdk.open_data().await;
    data_stream.recv_input("b-state", &["src"], &[]).await;
    data_stream.close_sink("b-state", "sink");
    s.sdk
        .bundle_done("b-state", ProcessBundleResponse::default());
    within("the bundle", bundle)
        .await
        .expect("join")
        .expect("ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_fails_in_flight_bundles() {
    let mut s = setup("w-crash").await;
    let first = spawn_bundle(&s.worker, request("b-c1", "pbd"));
    let second = spawn_bundle(&s.worker, request("b-c2", "pbd"));
    s.sdk.next_instruction().await;
    s.sdk.next_instruction().await;
    s.sdk.crash();
    for bundle in [first, second] {
        match within("the bundle", bundle).await.expect("join") {
            Err(BundleError::Disconnected(reason)) => {
                assert!(reason.contains("w-crash"), "{reason}")
            }
            other => panic!("expected Disconnected, got {other:?}"),
        }
    }
    assert!(s.worker.disconnected().is_some());
    match s.worker.process_bundle(request("b-c3", "pbd")).await {
        Err(BundleError::Disconnected(_)) => {}
        other => panic!("expected Disconnected, got {other:?}"),
    }
}

async fn answer_bundle(data_stream: &FakeData, instruction_id: &str) {
    data_stream.send_data(
        instruction_id,
        "sink",
        format!("out-of-{instruction_id}").as_bytes(),
    );
    data_stream.close_sink(instruction_id, "sink");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_bundles_on_one_worker() {
    let mut s = setup("w-concurrent").await;
    let ids = ["b-p1", "b-p2", "b-p3"];
    let bundles: Vec<_> = ids
        .iter()
        .map(|id| spawn_bundle(&s.worker, request(id, "pbd")))
        .collect();
    let mut received = Vec::new();
    for _ in 0..ids.len() {
        received.push(s.sdk.next_instruction().await.instruction_id);
    }
    received.sort();
    assert_eq!(received, ids);
    let mut data_stream = s.sdk.open_data().await;
    // Inputs of the three bundles may interleave on the one stream.
    let mut open: Vec<&str> = ids.to_vec();
    while !open.is_empty() {
        for d in data_stream.recv().await.data {
            assert_eq!(d.transform_id, "src");
            if d.is_last {
                open.retain(|id| *id != d.instruction_id);
            } else {
                assert_eq!(d.data, b"in");
            }
        }
    }
    // Answer in reverse order, responses before data for one of them.
    s.sdk.bundle_done("b-p3", ProcessBundleResponse::default());
    answer_bundle(&data_stream, "b-p3").await;
    answer_bundle(&data_stream, "b-p2").await;
    s.sdk.bundle_done("b-p2", ProcessBundleResponse::default());
    s.sdk.bundle_done("b-p1", ProcessBundleResponse::default());
    answer_bundle(&data_stream, "b-p1").await;
    for (id, bundle) in ids.iter().zip(bundles) {
        let result = within("a bundle", bundle).await.expect("join").expect("ok");
        assert_eq!(
            result.outputs["sink"].concat(),
            Bytes::from(format!("out-of-{id}"))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_waits_for_the_data_stream_and_reused_ids_are_rejected() {
    let mut s = setup("w-buffer").await;
    // Many input chunks queue up before the SDK opens its Data stream.
    let chunks: Vec<Bytes> = (0..500)
        .map(|i| Bytes::from(vec![b'x'; 1000 + i]))
        .collect();
    let bundle = spawn_bundle(
        &s.worker,
        BundleRequest {
            inputs: vec![("src".to_string(), chunks.clone())],
            ..request("b-buf", "pbd")
        },
    );
    s.sdk.next_instruction().await;
    match s.worker.process_bundle(request("b-buf", "pbd")).await {
        Err(BundleError::Protocol(msg)) => assert!(msg.contains("b-buf")),
        other => panic!("expected a protocol error, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut data_stream = s.sdk.open_data().await;
    let (inputs, _) = data_stream.recv_input("b-buf", &["src"], &[]).await;
    let got: Vec<_> = inputs
        .iter()
        .filter(|d| !d.is_last)
        .map(|d| d.data.clone())
        .collect();
    assert_eq!(got.len(), chunks.len());
    assert!(got
        .iter()
        .zip(&chunks)
        .all(|(a, b)| a.as_slice() == b.as_ref()));
    data_stream.close_sink("b-buf", "sink");
    s.sdk.bundle_done("b-buf", ProcessBundleResponse::default());
    within("the bundle", bundle)
        .await
        .expect("join")
        .expect("ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_ends_the_control_stream_and_calls_stop_worker() {
    let mut s = setup("w-stop").await;
    let mut state = s.sdk.open_state().await;
    let bundle = spawn_bundle(&s.worker, request("b-stop", "pbd"));
    s.sdk.next_instruction().await;
    within("stop", s.worker.stop()).await;
    assert!(matches!(
        within("the bundle", bundle).await.expect("join"),
        Err(BundleError::Disconnected(_))
    ));
    assert!(s.sdk.control_ended().await);
    assert_eq!(
        within("StopWorker", s.pool.stops.recv()).await.as_deref(),
        Some("w-stop")
    );
    // A stopped worker that keeps its state stream open (Java's pooled
    // workers do) does not keep the runner's side of it.
    assert!(state.ended_by_runner().await);
    // The id no longer routes.
    assert_eq!(
        s.sdk.descriptor("pbd").await.expect_err("stopped").code(),
        tonic::Code::NotFound
    );
}
