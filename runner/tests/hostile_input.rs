//! Pipelines no SDK would send, against the real server over gRPC: each is
//! refused at `Prepare` with a message naming what is wrong (or, within the
//! limits, prepared and run), and the server serves on. A stack overflow
//! in any of them aborts this test binary.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;

use std::time::{Duration, Instant};

use clap::Parser;
use common::{coder, peak_rss_bytes, Pipe, TestServer, BYTES, KV_BYTES};
use refract_proto::job_api::job_state::Enum as JobState;
use refract_proto::pipeline as pb;
use refract_proto::prost::Message;
use refract_proto::urns;

/// The largest transform count the server accepts (translation's limit).
const MAX_TRANSFORMS: usize = 100_000;

/// Impulse → Flatten(p0 → p1), with `p0`/`p1` in `coder_id`.
fn flatten_with(coder_id: &str) -> Pipe {
    let mut p = Pipe::new();
    p.root_transform("impulse", urns::transform::IMPULSE, &[], &[("out", "p0")]);
    p.root_transform(
        "flatten",
        urns::transform::FLATTEN,
        &[("0", "p0")],
        &[("out", "p1")],
    );
    p.pcollection("p0", coder_id).pcollection("p1", coder_id);
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coders_that_contain_themselves_are_refused_on_every_path() {
    let server = TestServer::start().await;

    let mut p = flatten_with("self");
    p.components
        .coders
        .insert("self".into(), coder(urns::coder::KV, &["self", "self"]));
    server
        .assert_refused(
            "a kv coder whose components are itself, on a Flatten",
            p.build(),
            "coder 'self' contains itself",
        )
        .await;

    // The Flatten's input and output coders differ in id only, so they are
    // compared component by component.
    let mut p = flatten_with("a");
    p.pcollection("p1", "b");
    p.components
        .coders
        .insert("a".into(), coder(urns::coder::KV, &[BYTES, "b"]));
    p.components
        .coders
        .insert("b".into(), coder(urns::coder::KV, &[BYTES, "a"]));
    server
        .assert_refused(
            "two coders containing each other",
            p.build(),
            "contains itself",
        )
        .await;

    let mut p = Pipe::chain(1);
    p.components.coders.insert(
        "window".into(),
        coder(urns::coder::INTERVAL_WINDOW, &["window"]),
    );
    if let Some(ws) = p.components.windowing_strategies.get_mut(common::GLOBAL) {
        ws.window_coder_id = "window".into();
    }
    server
        .assert_refused(
            "a window coder containing itself",
            p.build(),
            "coder 'window' contains itself",
        )
        .await;

    let mut p = Pipe::chain(1);
    p.components
        .coders
        .insert("unused".into(), coder(urns::coder::ITERABLE, &["unused"]));
    server
        .assert_refused(
            "an unused coder containing itself",
            p.build(),
            "coder 'unused' contains itself",
        )
        .await;

    let mut p = Pipe::new();
    p.root_transform(
        "test_stream",
        urns::transform::TEST_STREAM,
        &[],
        &[("out", "p0")],
    )
    .spec = Some(pb::FunctionSpec {
        urn: urns::transform::TEST_STREAM.into(),
        payload: pb::TestStreamPayload {
            coder_id: "loop".into(),
            ..Default::default()
        }
        .encode_to_vec(),
    });
    p.pcollection("p0", KV_BYTES);
    p.components
        .coders
        .insert("loop".into(), coder(urns::coder::NULLABLE, &["loop"]));
    server
        .assert_refused(
            "a TestStream whose coder contains itself",
            p.build(),
            "coder 'loop' contains itself",
        )
        .await;
}

/// `n` composites, each the only subtransform of the one before, around
/// an Impulse.
fn nested_composites(n: usize) -> Pipe {
    let mut p = Pipe::new();
    p.pcollection("p0", BYTES);
    p.transform("impulse", urns::transform::IMPULSE, &[], &[("out", "p0")]);
    let mut inner = "impulse".to_string();
    for i in 0..n {
        let id = format!("composite{i}");
        p.transform(&id, "", &[], &[("out", "p0")]).subtransforms = vec![inner];
        inner = id;
    }
    p.roots.push(inner);
    p
}

/// A coder `n` levels deep: `iterable[iterable[...[bytes]]]`.
fn deep_coder(p: &mut Pipe, n: usize) -> String {
    let mut inner = BYTES.to_string();
    for i in 0..n {
        let id = format!("deep{i}");
        p.components
            .coders
            .insert(id.clone(), coder(urns::coder::ITERABLE, &[&inner]));
        inner = id;
    }
    inner
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_structures_are_refused_with_the_limit_they_passed() {
    let server = TestServer::start().await;
    server
        .assert_refused(
            "200 000 nested composites",
            nested_composites(200_000).build(),
            &format!("200001 transforms; this server accepts at most {MAX_TRANSFORMS}"),
        )
        .await;
    server
        .assert_refused(
            "2 000 nested composites",
            nested_composites(2_000).build(),
            "levels of composite transforms above transform",
        )
        .await;
    // Within the limit, nesting is walked without recursion.
    server
        .prepare(nested_composites(999).build())
        .await
        .expect("999 nested composites are accepted");

    let mut p = Pipe::chain(1);
    let deep = deep_coder(&mut p, 100_000);
    p.pcollection("p1", &deep);
    server
        .assert_refused(
            "a coder nested 100 000 deep",
            p.build(),
            "100003 coders; this server accepts at most 100000",
        )
        .await;
    let mut p = Pipe::chain(1);
    let deep = deep_coder(&mut p, 99_990);
    p.pcollection("p1", &deep);
    server
        .assert_refused(
            "a coder nested 99 990 deep",
            p.build(),
            "levels of components in coder",
        )
        .await;
    let mut p = Pipe::chain(1);
    let deep = deep_coder(&mut p, 1_000);
    p.pcollection("p1", &deep);
    server
        .assert_refused(
            "a coder nested 1 000 deep",
            p.build(),
            "this server accepts at most 100",
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coders_sharing_components_cost_what_they_share() {
    let server = TestServer::start().await;
    // Two structurally equal coders with distinct ids, 60 levels of kv
    // whose two components are the same coder: 2^60 paths, 120 ids.
    let mut p = flatten_with("x59");
    p.pcollection("p1", "y59");
    for side in ["x", "y"] {
        for i in 0..60 {
            let inner = if i == 0 {
                BYTES.to_string()
            } else {
                format!("{side}{}", i - 1)
            };
            p.components.coders.insert(
                format!("{side}{i}"),
                coder(urns::coder::KV, &[&inner, &inner]),
            );
        }
    }
    let started = Instant::now();
    server
        .assert_refused("a coder of 2^60 paths", p.build(), "unfolds into more than")
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_chains_are_planned_in_linear_memory_and_run() {
    let server = TestServer::start().await;
    let before = peak_rss_bytes().unwrap_or(0);
    let started = Instant::now();
    server
        .prepare(Pipe::chain(MAX_TRANSFORMS - 1).build())
        .await
        .expect("a chain of 99 999 Flattens is accepted");
    let peak = peak_rss_bytes().unwrap_or(0);
    eprintln!(
        "99 999 Flattens prepared in {:?}; peak RSS {} MiB (before: {} MiB)",
        started.elapsed(),
        peak >> 20,
        before >> 20
    );
    // Quadratic planning needed ~11 GB for 300 000 Flattens.
    assert!(
        peak < 4 << 30,
        "peak RSS {} MiB after preparing 99 999 Flattens",
        peak >> 20
    );
    server
        .assert_refused(
            "150 000 Flattens",
            Pipe::chain(150_000).build(),
            "150001 transforms; this server accepts at most 100000",
        )
        .await;
    let state = server
        .run_to_end(Pipe::chain(2_000).build(), Duration::from_secs(120))
        .await;
    assert_eq!(state, JobState::Done);
}

/// A root TestStream of `kv[bytes, bytes]` ("kvs") replaying one event.
fn test_stream_of_kvs(p: &mut Pipe, event: pb::test_stream_payload::event::Event) {
    p.root_transform("ts", urns::transform::TEST_STREAM, &[], &[("out", "kvs")])
        .spec = Some(pb::FunctionSpec {
        urn: urns::transform::TEST_STREAM.into(),
        payload: pb::TestStreamPayload {
            coder_id: KV_BYTES.into(),
            events: vec![pb::test_stream_payload::Event { event: Some(event) }],
            endpoint: None,
        }
        .encode_to_vec(),
    });
    p.pcollection("kvs", KV_BYTES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diamond_of_flattens_runs_without_walking_every_path() {
    // TestStream (no elements) → GroupByKey → 40 layers of two Flattens,
    // each reading both of the layer before: 2^40 paths from the
    // GroupByKey, which asks at every firing whether they hold it back.
    let mut p = Pipe::new();
    test_stream_of_kvs(
        &mut p,
        pb::test_stream_payload::event::Event::WatermarkEvent(
            pb::test_stream_payload::event::AdvanceWatermark {
                new_watermark: i64::MAX / 1000,
                tag: String::new(),
            },
        ),
    );
    p.components
        .coders
        .insert("iter_bytes".into(), coder(urns::coder::ITERABLE, &[BYTES]));
    p.components.coders.insert(
        "grouped".into(),
        coder(urns::coder::KV, &[BYTES, "iter_bytes"]),
    );
    p.pcollection("l0a", "grouped");
    p.root_transform(
        "gbk",
        urns::transform::GROUP_BY_KEY,
        &[("0", "kvs")],
        &[("out", "l0a")],
    );
    let mut previous = vec!["l0a".to_string(), "l0a".to_string()];
    for layer in 1..=40 {
        let mut outputs = Vec::new();
        for side in ["a", "b"] {
            let out = format!("l{layer}{side}");
            p.pcollection(&out, "grouped");
            p.root_transform(
                &format!("flatten{layer}{side}"),
                urns::transform::FLATTEN,
                &[("0", &previous[0]), ("1", &previous[1])],
                &[("out", &out)],
            );
            outputs.push(out);
        }
        previous = outputs;
    }
    let server = TestServer::start().await;
    let state = server.run_to_end(p.build(), Duration::from_secs(60)).await;
    assert_eq!(state, JobState::Done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_and_dangling_references_are_named() {
    let server = TestServer::start().await;

    let mut p = Pipe::chain(1);
    p.roots.push("flatten1".into());
    server
        .assert_refused(
            "a root listed twice",
            p.build(),
            "transform 'flatten1' appears more than once",
        )
        .await;

    let mut p = Pipe::chain(1);
    p.roots.retain(|r| r != "flatten1");
    p.transform("outer", "", &[], &[]).subtransforms = vec!["outer".into()];
    p.roots.push("outer".into());
    server
        .assert_refused(
            "a composite that is its own subtransform",
            p.build(),
            "transform 'outer' appears more than once",
        )
        .await;

    let mut p = Pipe::chain(1);
    p.root_transform(
        "again",
        urns::transform::FLATTEN,
        &[("0", "p0")],
        &[("out", "p1")],
    );
    server
        .assert_refused(
            "a PCollection with two producers",
            p.build(),
            "PCollection 'p1' is produced by both",
        )
        .await;

    let mut p = Pipe::chain(1);
    p.roots.push("nowhere".into());
    server
        .assert_refused(
            "a missing root",
            p.build(),
            "transform 'nowhere' referenced by the pipeline's root transforms is missing",
        )
        .await;

    let mut p = Pipe::chain(1);
    p.components.pcollections.remove("p1");
    server
        .assert_refused(
            "a missing PCollection",
            p.build(),
            "PCollection 'p1' referenced by transform 'flatten1' is missing",
        )
        .await;

    let mut p = Pipe::chain(1);
    p.pcollection("p1", "nothing");
    server
        .assert_refused(
            "a missing coder",
            p.build(),
            "coder 'nothing' referenced by PCollection 'p1' is missing",
        )
        .await;

    let mut p = Pipe::chain(1);
    p.components
        .coders
        .insert("half".into(), coder(urns::coder::KV, &[BYTES, "gone"]));
    p.pcollection("p1", "half");
    server
        .assert_refused(
            "a missing coder component",
            p.build(),
            "coder 'gone' referenced by",
        )
        .await;

    let mut p = Pipe::chain(1);
    if let Some(pc) = p.components.pcollections.get_mut("p1") {
        pc.windowing_strategy_id = "no_such_strategy".into();
    }
    server
        .assert_refused(
            "a missing windowing strategy",
            p.build(),
            "windowing strategy 'no_such_strategy' referenced by PCollection 'p1' is missing",
        )
        .await;

    let mut p = Pipe::chain(1);
    p.root_transform(
        "map",
        urns::transform::PAR_DO,
        &[("in", "p1")],
        &[("out", "p2")],
    )
    .environment_id = "no_such_env".into();
    p.pcollection("p2", BYTES);
    server
        .assert_refused(
            "a missing environment",
            p.build(),
            "environment 'no_such_env' referenced by transform 'map' is missing",
        )
        .await;

    server
        .assert_refused(
            "no components at all",
            pb::Pipeline::default(),
            "the pipeline has no components",
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_claiming_a_terabyte_is_refused_not_allocated() {
    // A TestStream element of kv[bytes, bytes] whose key claims 2^40
    // bytes.
    let mut element = Vec::new();
    let mut length: u64 = 1 << 40;
    while length >= 0x80 {
        element.push((length as u8 & 0x7f) | 0x80);
        length >>= 7;
    }
    element.push(length as u8);
    element.extend_from_slice(b"short");
    let mut p = Pipe::new();
    test_stream_of_kvs(
        &mut p,
        pb::test_stream_payload::event::Event::ElementEvent(
            pb::test_stream_payload::event::AddElements {
                elements: vec![pb::test_stream_payload::TimestampedElement {
                    encoded_element: element,
                    timestamp: 0,
                }],
                tag: String::new(),
            },
        ),
    );
    let server = TestServer::start().await;
    server
        .assert_refused(
            "an element claiming 2^40 bytes",
            p.build(),
            "an element does not decode with its coder",
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_name_of_megabytes_is_refused_naming_the_limit() {
    let server = TestServer::start().await;
    let name = "n".repeat(5 << 20);
    let status = server
        .prepare_named(&name, Pipe::chain(1).build(), Default::default())
        .await
        .expect_err("a 5 MiB job name is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("the job name is 5242880 bytes long; at most 1024"),
        "{}",
        status.message()
    );
    // A name at the limit is taken.
    server
        .prepare_named(
            &"n".repeat(1024),
            Pipe::chain(1).build(),
            Default::default(),
        )
        .await
        .expect("a 1 KiB job name is accepted");
    server.assert_serving("a 5 MiB job name").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn savepoints_are_started_from_regular_files_in_the_savepoint_directory_only() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("savepoints");
    std::fs::create_dir(&dir).unwrap();
    let dir_flag = dir.to_string_lossy().into_owned();
    let server = TestServer::start_with(common::serve_args(&[
        "--savepoint_dir",
        &dir_flag,
        "--max_savepoint_bytes",
        "1k",
    ]))
    .await;
    // A FIFO no one writes to: opening it for reading would wait forever,
    // and the job with it.
    let fifo = dir.join("fifo.sp");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    std::fs::write(dir.join("big.sp"), vec![0u8; 2048]).unwrap();
    let outside = base.path().join("outside.sp");
    std::fs::write(&outside, b"RFSP1").unwrap();
    for (asked, reason) in [
        ("fifo.sp".to_string(), "is not a regular file"),
        (
            outside.to_string_lossy().into_owned(),
            "its directory is not the savepoint directory",
        ),
        (
            "/etc/passwd".to_string(),
            "its directory is not the savepoint directory",
        ),
        (
            "../outside.sp".to_string(),
            "a relative path must be a plain file name",
        ),
        ("big.sp".to_string(), "2048 bytes, over the limit of 1024"),
    ] {
        let experiment = format!("refract_savepoint={asked}");
        let id = server
            .submit(
                "from-savepoint",
                Pipe::chain(1).build(),
                common::pipeline_options(false, &[&experiment]),
            )
            .await;
        let (messages, state) = common::messages_to_end(server.client.clone(), &id).await;
        assert_eq!(state, JobState::Failed, "{asked}: {messages:?}");
        assert!(
            messages.iter().any(|m| m.message_text.contains(reason)),
            "{asked}: no message says {reason:?}: {messages:?}"
        );
    }
    server
        .assert_serving("savepoints that cannot be read")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_large_prepares_is_read_a_few_at_a_time() {
    // A server of its own, so that its memory is measured alone.
    let server = common::ServerProcess::start(common::free_port(), &[]).await;
    let pid = server.child.id();
    let before = common::peak_rss_bytes_of(pid).expect("the server's status");
    // Twelve Prepares of 48 MiB each, all at once, each refused when
    // validated (an unknown URN), so none is kept: what the server holds
    // at its peak is what it reads and decodes at once. Two at a time
    // (the planning turns) grew it 285 MiB when measured; all of them at
    // once (the gate taken out), 503 MiB.
    const PAYLOAD: usize = 48 << 20;
    const CALLS: usize = 12;
    let mut p = Pipe::chain(1);
    p.transform("hostile", "beam:transform:hostile:v1", &[], &[])
        .spec
        .as_mut()
        .expect("a spec")
        .payload = vec![7; PAYLOAD];
    p.roots.push("hostile".into());
    let pipeline = p.build();
    let jobs = server
        .jobs()
        .await
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    let calls: Vec<_> = (0..CALLS)
        .map(|_| {
            let (mut jobs, pipeline) = (jobs.clone(), pipeline.clone());
            tokio::spawn(async move {
                jobs.prepare(refract_proto::job_api::PrepareJobRequest {
                    pipeline: Some(pipeline),
                    pipeline_options: Some(Default::default()),
                    job_name: "large".into(),
                })
                .await
            })
        })
        .collect();
    drop(pipeline);
    for call in calls {
        let status = call.await.expect("joined").expect_err("refused");
        assert!(
            status.message().contains("beam:transform:hostile:v1")
                || status.code() == tonic::Code::ResourceExhausted,
            "{status:?}"
        );
    }
    let grown = common::peak_rss_bytes_of(pid).expect("status") - before;
    eprintln!(
        "{CALLS} Prepares of {} MiB at once: the server's peak grew {} MiB",
        PAYLOAD >> 20,
        grown >> 20
    );
    assert!(
        grown < 7 * PAYLOAD as u64,
        "the server's peak grew {} MiB",
        grown >> 20
    );
    // The server serves on.
    let mut jobs = server.jobs().await;
    jobs.get_jobs(refract_proto::job_api::GetJobsRequest {})
        .await
        .expect("GetJobs");
}

/// Impulse → one Flatten, the Flatten carrying an annotation of `bytes`:
/// a valid pipeline of any size.
fn chain_carrying(bytes: usize) -> common::Pipe {
    let mut pipe = common::Pipe::chain(1);
    pipe.components
        .transforms
        .get_mut("flatten1")
        .expect("a flatten")
        .annotations
        .insert("large".into(), vec![b'x'; bytes]);
    pipe
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_draws_the_graph_of_a_pipeline_larger_than_4_mib() {
    let argv = ["refract", "serve", "--job_port", "0", "--ui_port", "0"];
    let args = match refract::cli::Cli::try_parse_from(argv).unwrap().command {
        Some(refract::cli::Command::Serve(args)) => args,
        other => panic!("not serve flags: {other:?}"),
    };
    let server = TestServer::start_with(args).await;
    let ui_port = server.server.ui_address.expect("the UI is served").port();
    let id = server
        .prepare(chain_carrying(6 << 20).build())
        .await
        .expect("prepared");
    let request = format!("GET /api/jobs/{id}/graph HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n");
    let answer = String::from_utf8_lossy(&common::probe(None, ui_port, &request, 1 << 20).await)
        .into_owned();
    assert!(
        answer.starts_with("HTTP/1.0 200"),
        "{}",
        &answer[..answer.len().min(500)]
    );
    assert!(
        answer.contains("flatten1"),
        "{}",
        &answer[..answer.len().min(500)]
    );
    server.server.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_over_max_message_bytes_is_refused_before_it_is_decoded() {
    let server = TestServer::start_with(common::serve_args(&["--max_message_bytes", "8m"])).await;
    let status = server
        .prepare(chain_carrying(12 << 20).build())
        .await
        .expect_err("over the limit");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(
        status.message().contains(&(8usize << 20).to_string()),
        "the refusal names the limit: {status:?}"
    );
    // Under it, the next one is prepared.
    server
        .prepare(common::Pipe::chain(1).build())
        .await
        .expect("a small pipeline is prepared");
    server.server.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_copying_a_large_environment_are_refused_at_a_byte_limit() {
    use refract_proto::urns;
    // A server of its own, so that its memory is measured alone.
    let server = common::ServerProcess::start(common::free_port(), &[]).await;
    let pid = server.child.id();
    let before = common::peak_rss_bytes_of(pid).expect("the server's status");
    // One environment of 2 MiB (display data), and 1 000 SDK stages (a
    // ParDo then a GroupByKey, over and over) in it: a pipeline of about
    // 2 MiB whose descriptors, each with its copy of the environment,
    // would take 2 GiB.
    const ENVIRONMENT: usize = 2 << 20;
    const STAGES: usize = 1_000;
    let mut p = common::Pipe::new();
    p.components.environments.insert(
        "env".into(),
        pb::Environment {
            urn: "beam:env:external:v1".into(),
            display_data: vec![pb::DisplayData {
                urn: "large".into(),
                payload: vec![7; ENVIRONMENT],
            }],
            ..Default::default()
        },
    );
    p.components.coders.insert(
        "iter".into(),
        common::coder(urns::coder::ITERABLE, &[common::BYTES]),
    );
    p.components.coders.insert(
        "kv_iter".into(),
        common::coder(urns::coder::KV, &[common::BYTES, "iter"]),
    );
    p.root_transform("impulse", urns::transform::IMPULSE, &[], &[("out", "g0")]);
    p.pcollection("g0", common::BYTES);
    for i in 1..=STAGES {
        let (grouped, keyed, next) = (format!("g{}", i - 1), format!("k{i}"), format!("g{i}"));
        p.pcollection(&keyed, common::KV_BYTES);
        p.pcollection(&next, "kv_iter");
        p.root_transform(
            &format!("pardo{i}"),
            urns::transform::PAR_DO,
            &[("in", &grouped)],
            &[("out", &keyed)],
        )
        .environment_id = "env".into();
        p.root_transform(
            &format!("gbk{i}"),
            urns::transform::GROUP_BY_KEY,
            &[("in", &keyed)],
            &[("out", &next)],
        );
    }
    let mut jobs = server.jobs().await;
    let status = jobs
        .prepare(refract_proto::job_api::PrepareJobRequest {
            pipeline: Some(p.build()),
            pipeline_options: Some(Default::default()),
            job_name: "copies".into(),
        })
        .await
        .expect_err("refused");
    assert!(
        status.message().contains("bytes of bundle descriptors"),
        "{status:?}"
    );
    let grown = common::peak_rss_bytes_of(pid).expect("status") - before;
    eprintln!("the server's peak grew {} MiB", grown >> 20);
    // The limit (512 MiB) and one descriptor past it, with room for the
    // rest of translation; all of them would be 2 GiB.
    assert!(
        grown < 800 << 20,
        "the server's peak grew {} MiB",
        grown >> 20
    );
    jobs.get_jobs(refract_proto::job_api::GetJobsRequest {})
        .await
        .expect("the server serves on");
}
