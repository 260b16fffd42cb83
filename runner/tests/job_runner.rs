//! The job runner against SDK workers, without Python: jobs submitted over
//! the Job API to a server in this process, whose pipelines run a ParDo
//! in an EXTERNAL environment. Its worker pool is a fake that connects a
//! scripted SDK harness over real gRPC, so each test plays the SDK's part
//! of a bundle (or of a failure) and checks what the job does.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;
#[path = "../../sdk-harness/tests/fake_sdk/mod.rs"]
mod fake_sdk;

use common::{
    external_environment, free_port, messages_to_end, pardo_in, peak_rss_bytes, pipeline_options,
    serve_args, wait_for_message, TestServer,
};
use fake_sdk::{within, FakeData, FakePool, FakeSdk, PoolMode};
use refract_jobservice::{decode_int_metric, IntMetric, SUM_INT64};
use refract_proto::fn_api::log_entry::{self, severity::Enum as Severity};
use refract_proto::fn_api::{
    instruction_request, InstructionResponse, LogEntry, ProcessBundleResponse,
};
use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::job_api::job_state::Enum as JobState;
use refract_proto::job_api::{CancelJobRequest, GetJobMetricsRequest, JobMessage};
use refract_proto::pipeline::{self as pb, MonitoringInfo};
use refract_proto::urns;

/// A server whose jobs start one worker per environment.
async fn server() -> TestServer {
    TestServer::start_with(serve_args(&["--sdk_worker_parallelism", "1"])).await
}

/// Impulse → "Split lines", a ParDo (transform `map`) in `environment`.
fn split_lines(environment: pb::Environment) -> pb::Pipeline {
    let mut p = pardo_in(environment);
    if let Some(map) = p.components.transforms.get_mut("map") {
        map.unique_name = "Split lines".into();
    }
    p.build()
}

/// A bundle the runner asked `sdk` to process: its instruction id and the
/// id of the data source its input comes through.
struct Bundle {
    instruction: String,
    source: String,
}

/// Waits for the runner's next ProcessBundle instruction to `sdk`.
async fn next_bundle(sdk: &mut FakeSdk) -> Bundle {
    loop {
        let request = sdk.next_instruction().await;
        let Some(instruction_request::Request::ProcessBundle(p)) = &request.request else {
            continue;
        };
        let descriptor = sdk
            .descriptor(&p.process_bundle_descriptor_id)
            .await
            .unwrap();
        let source = descriptor
            .transforms
            .iter()
            .find(|(_, t)| {
                t.spec
                    .as_ref()
                    .is_some_and(|s| s.urn == urns::transform::DATA_SOURCE)
            })
            .map(|(id, _)| id.clone())
            .expect("the bundle reads its input from the runner");
        return Bundle {
            instruction: request.instruction_id,
            source,
        };
    }
}

/// Reads `bundle`'s whole input, as an SDK does before it finishes.
async fn read_input(data: &mut FakeData, bundle: &Bundle) {
    data.recv_input(&bundle.instruction, &[&bundle.source], &[])
        .await;
}

/// The worker a pool started, as it took its first bundle and read the
/// bundle's input.
struct Worker {
    id: String,
    sdk: FakeSdk,
    data: FakeData,
    bundle: Bundle,
}

/// Waits for `pool`'s next worker, and for it to take a bundle.
async fn first_bundle(pool: &mut FakePool) -> Worker {
    let start = within("StartWorker", pool.starts.recv()).await.unwrap();
    let mut sdk = within("the SDK to connect", pool.sdks.recv())
        .await
        .unwrap();
    let bundle = next_bundle(&mut sdk).await;
    let mut data = sdk.open_data().await;
    read_input(&mut data, &bundle).await;
    Worker {
        id: start.worker_id,
        sdk,
        data,
        bundle,
    }
}

/// A server running job `name` (a [`split_lines`] with these `options`)
/// on a pool in `mode`: the server, the pool and the job's id.
async fn submitted(
    name: &str,
    mode: PoolMode,
    options: refract_proto::prost_types::Struct,
) -> (TestServer, FakePool, String) {
    let server = server().await;
    let pool = FakePool::start(mode).await;
    let id = server
        .submit(name, split_lines(pool.environment()), options)
        .await;
    (server, pool, id)
}

/// The texts of `messages` at `importance`.
fn texts(messages: &[JobMessage], importance: MessageImportance) -> Vec<&str> {
    messages
        .iter()
        .filter(|m| m.importance == importance as i32)
        .map(|m| m.message_text.as_str())
        .collect()
}

/// A worker id without its secret suffix (128 random bits in hex), which
/// every id the runner gives out ends in.
fn worker_name(id: &str) -> &str {
    let (name, secret) = id.rsplit_once('-').expect("a suffix");
    assert_eq!(secret.len(), 32, "{id}");
    assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dofn_on_an_external_worker_runs_to_done_with_its_logs_and_counters() {
    let (server, mut pool, id) =
        submitted("lines", PoolMode::Connect, pipeline_options(false, &[])).await;
    let worker = first_bundle(&mut pool).await;
    let (worker_id, sdk, bundle) = (&worker.id, &worker.sdk, &worker.bundle);
    assert_eq!(worker_name(worker_id), format!("{id}-e0-w0"));
    // A line the DoFn logs reaches the job's messages, saying where it
    // came from.
    let logs = sdk.open_logging().await;
    logs.send(log_entry::List {
        log_entries: vec![LogEntry {
            severity: Severity::Warn as i32,
            message: "skipped an empty line".into(),
            transform_id: "map".into(),
            ..Default::default()
        }],
    })
    .unwrap();
    let logged = format!("[{worker_id} Split lines] skipped an empty line");
    wait_for_message(server.client.clone(), &id, &logged).await;
    let mut payload = Vec::new();
    refract_engine::coder::encode_varint_u64(3, &mut payload);
    let lines = MonitoringInfo {
        urn: "beam:metric:user:sum_int64:v1".into(),
        r#type: SUM_INT64.into(),
        payload,
        labels: [
            ("PTRANSFORM".to_string(), "map".to_string()),
            ("NAMESPACE".to_string(), "wordcount".to_string()),
            ("NAME".to_string(), "lines".to_string()),
        ]
        .into(),
        start_time: None,
    };
    sdk.bundle_done(
        &bundle.instruction,
        ProcessBundleResponse {
            monitoring_infos: vec![lines],
            ..Default::default()
        },
    );

    let (messages, state) = messages_to_end(server.client.clone(), &id).await;
    assert_eq!(state, JobState::Done, "{messages:?}");
    assert!(
        texts(&messages, MessageImportance::JobMessageWarning).contains(&logged.as_str()),
        "{messages:?}"
    );
    // The counter, under the name the pipeline gave its transform.
    let metrics = server
        .client
        .clone()
        .get_job_metrics(GetJobMetricsRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner()
        .metrics
        .unwrap_or_default();
    let counted = metrics
        .committed
        .iter()
        .find(|m| m.labels.get("NAME").map(String::as_str) == Some("lines"))
        .unwrap_or_else(|| panic!("no 'lines' counter: {metrics:?}"));
    assert_eq!(
        counted.labels.get("PTRANSFORM").map(String::as_str),
        Some("Split lines")
    );
    assert_eq!(
        decode_int_metric(&counted.r#type, &counted.payload),
        Some(IntMetric::Counter(3))
    );
    // Its worker is let go.
    let stopped = within("StopWorker", pool.stops.recv()).await.unwrap();
    assert_eq!(stopped, *worker_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dofn_logging_huge_lines_leaves_the_job_a_bounded_history() {
    let (server, mut pool, id) =
        submitted("chatty", PoolMode::Connect, pipeline_options(false, &[])).await;
    let worker = first_bundle(&mut pool).await;
    let before = peak_rss_bytes().unwrap_or(0);
    // 256 lines of 1 MiB each: kept whole, 256 MiB of history. They are
    // sent 16 at a time, each batch once the server took the one before,
    // so that what this fake SDK buffers stays small.
    const LINES: usize = 256;
    let logs = worker.sdk.open_logging().await;
    for i in 0..LINES {
        if i > 0 && i % 16 == 0 {
            wait_for_message(server.client.clone(), &id, &format!("line {:03}", i - 1)).await;
        }
        let mut message = format!("line {i:03} ");
        message.push_str(&"x".repeat((1 << 20) - message.len()));
        logs.send(log_entry::List {
            log_entries: vec![LogEntry {
                severity: Severity::Info as i32,
                message,
                transform_id: "map".into(),
                ..Default::default()
            }],
        })
        .unwrap();
    }
    wait_for_message(
        server.client.clone(),
        &id,
        &format!("line {:03}", LINES - 1),
    )
    .await;
    worker
        .sdk
        .bundle_done(&worker.bundle.instruction, ProcessBundleResponse::default());
    let (messages, state) = messages_to_end(server.client.clone(), &id).await;
    assert_eq!(state, JobState::Done);
    let peak = peak_rss_bytes().unwrap_or(0);
    // Each line keeps its first 256 KiB and says what was cut; the oldest
    // go once the job's history holds 16 MiB of text.
    let lines: Vec<&JobMessage> = messages
        .iter()
        .filter(|m| m.message_text.contains("] line "))
        .collect();
    assert!(!lines.is_empty());
    for line in &lines {
        assert!(
            line.message_text.len() < (256 << 10) + 100,
            "{}",
            line.message_text.len()
        );
        assert!(
            line.message_text.ends_with(" bytes cut]"),
            "{}",
            &line.message_text[..60]
        );
    }
    let kept: usize = messages.iter().map(|m| m.message_text.len()).sum();
    assert!(kept <= 16 << 20, "{kept} bytes of messages kept");
    assert!(
        lines
            .last()
            .is_some_and(|m| m.message_text.contains(&format!("line {:03}", LINES - 1))),
        "the newest line is kept"
    );
    eprintln!(
        "{LINES} MiB logged; {} lines, {} MiB kept; peak RSS {} MiB (before {} MiB)",
        lines.len(),
        kept >> 20,
        peak >> 20,
        before >> 20
    );
    // Kept whole, the history alone would be 256 MiB. What the process
    // holds now: the 16 MiB kept, 16 lines in flight, and, while a reader
    // follows the job, its copies of the history (the server's, encoded,
    // and this test's, decoded).
    assert!(
        peak.saturating_sub(before) < 192 << 20,
        "peak RSS grew by {} MiB while {LINES} MiB were logged",
        peak.saturating_sub(before) >> 20
    );
}

/// What the fake SDK answers a failing bundle with: Python's traceback.
const TRACEBACK: &str = "Traceback (most recent call last):\n  File \"wordcount.py\", line 12, \
                         in process\nValueError: invalid literal for int() with base 10: 'x' \
                         [while running 'Split lines']";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_dofn_is_tried_as_often_as_asked_then_fails_the_job_with_its_traceback() {
    let (server, mut pool, id) = submitted(
        "failing",
        PoolMode::Connect,
        pipeline_options(false, &["refract_bundle_attempts=2"]),
    )
    .await;
    let Worker {
        mut sdk,
        mut data,
        mut bundle,
        ..
    } = first_bundle(&mut pool).await;
    // Two attempts, each failing. Had the runner wanted a third, the job
    // would not end below.
    for attempt in 1..=2 {
        if attempt > 1 {
            bundle = next_bundle(&mut sdk).await;
            read_input(&mut data, &bundle).await;
        }
        sdk.respond(InstructionResponse {
            instruction_id: bundle.instruction.clone(),
            error: TRACEBACK.into(),
            response: None,
        });
    }

    let (messages, state) = messages_to_end(server.client.clone(), &id).await;
    assert_eq!(state, JobState::Failed, "{messages:?}");
    let last = messages.last().expect("messages");
    assert_eq!(
        last.importance,
        MessageImportance::JobMessageError as i32,
        "{messages:?}"
    );
    assert!(
        last.message_text.contains(TRACEBACK),
        "{}",
        last.message_text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_job_whose_bundle_hangs_ends_it_cancelled_and_stops_its_worker() {
    let (server, mut pool, id) =
        submitted("hanging", PoolMode::Connect, pipeline_options(false, &[])).await;
    // The DoFn takes its input and never finishes.
    let worker = first_bundle(&mut pool).await;

    server
        .client
        .clone()
        .cancel(CancelJobRequest { job_id: id.clone() })
        .await
        .unwrap();
    let (messages, state) = messages_to_end(server.client.clone(), &id).await;
    assert_eq!(state, JobState::Cancelled, "{messages:?}");
    let stopped = within("StopWorker", pool.stops.recv()).await.unwrap();
    assert_eq!(stopped, worker.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_job_whose_worker_pool_refuses_fails_at_once_saying_why() {
    let refusal = "docker: image apache/beam_python3.11_sdk:2.60.0 not found";
    let (server, mut pool, id) = submitted(
        "refused",
        PoolMode::Fail(refusal.into()),
        pipeline_options(false, &[]),
    )
    .await;

    let (messages, state) = messages_to_end(server.client.clone(), &id).await;
    assert_eq!(state, JobState::Failed, "{messages:?}");
    let error = messages.last().expect("messages").message_text.clone();
    assert!(
        error.contains(&format!("cannot start worker {id}-e0-w0-"))
            && error.contains(&format!(
                ": the worker pool at {} reported: {refusal}",
                pool.url
            )),
        "{error}"
    );
    // A batch job does not try again: one worker was asked for, once.
    let asked: Vec<String> = std::iter::from_fn(|| pool.starts.try_recv().ok())
        .map(|start| worker_name(&start.worker_id).to_string())
        .collect();
    assert_eq!(asked, [format!("{id}-e0-w0")]);
    assert!(
        !messages
            .iter()
            .any(|m| m.message_text.contains("tries again")),
        "{messages:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_job_waits_for_a_late_worker_pool_and_runs_with_fresh_worker_ids() {
    let server = server().await;
    let url = format!("127.0.0.1:{}", free_port());
    let id = server
        .submit(
            "late-pool",
            split_lines(external_environment(&url)),
            pipeline_options(true, &[]),
        )
        .await;
    // Nothing listens there yet: the first attempt fails, and the job
    // says it tries again.
    wait_for_message(
        server.client.clone(),
        &id,
        "a streaming job tries again: attempt 2",
    )
    .await;
    let mut pool = FakePool::start_at(&url, PoolMode::Connect).await;
    let worker = first_bundle(&mut pool).await;
    // A worker id is never used twice (the Go SDK's pool refuses one it
    // has seen).
    assert_eq!(worker_name(&worker.id), format!("{id}-a1-e0-w0"));
    worker
        .sdk
        .bundle_done(&worker.bundle.instruction, ProcessBundleResponse::default());

    let (messages, state) = messages_to_end(server.client.clone(), &id).await;
    assert_eq!(state, JobState::Done, "{messages:?}");
    let warnings = texts(&messages, MessageImportance::JobMessageWarning);
    assert!(
        warnings
            .iter()
            .any(|w| w.contains(&format!("cannot start worker {id}-e0-w0-"))
                && w.contains(&format!(": cannot reach the worker pool at {url}"))),
        "{warnings:?}"
    );
}
