//! Job API behaviour: options, validation, lifecycle, streams, cancel,
//! metrics, and the error statuses of malformed or unknown requests.

use std::collections::HashMap;
use std::time::Duration;

use refract_proto::job_api::job_state::Enum as State;
use refract_proto::job_api::{
    CancelJobRequest, DescribePipelineOptionsRequest, DrainJobRequest, GetJobMetricsRequest,
    GetJobPipelineRequest, GetJobStateRequest, GetJobsRequest, JobMessagesRequest,
    PrepareJobRequest, RunJobRequest,
};
use refract_proto::tonic::Code;

use crate::harness::*;

fn decode_varints(mut bytes: &[u8]) -> Vec<u64> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let b = bytes[0];
            bytes = &bytes[1..];
            v |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        out.push(v);
    }
    out
}

#[tokio::test]
async fn options_probe_and_malformed_requests_get_statuses() {
    let server = Server::start().await;
    let mut jobs = server.jobs().await;

    let options = jobs
        .describe_pipeline_options(DescribePipelineOptionsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.options.is_empty());

    // The Python test harness's readiness probe.
    let probe = jobs
        .get_state(GetJobStateRequest {
            job_id: "[fake]".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(probe.code(), Code::NotFound);

    let no_pipeline = jobs
        .prepare(PrepareJobRequest::default())
        .await
        .unwrap_err();
    assert_eq!(no_pipeline.code(), Code::InvalidArgument);

    let unsupported = jobs
        .prepare(prepare_request(pipeline(vec![], UNSUPPORTED_URN), "done"))
        .await
        .unwrap_err();
    assert_eq!(unsupported.code(), Code::InvalidArgument);
    assert!(
        unsupported
            .message()
            .contains("unsupported transform URN beam:transform:foo:v1 (transform 'Outer/X'"),
        "{}",
        unsupported.message()
    );

    for code in [
        jobs.run(RunJobRequest {
            preparation_id: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err()
        .code(),
        jobs.cancel(CancelJobRequest {
            job_id: "nope".into(),
        })
        .await
        .unwrap_err()
        .code(),
        jobs.get_job_metrics(GetJobMetricsRequest {
            job_id: "nope".into(),
        })
        .await
        .unwrap_err()
        .code(),
        jobs.get_state_stream(GetJobStateRequest {
            job_id: "nope".into(),
        })
        .await
        .unwrap_err()
        .code(),
        jobs.get_message_stream(JobMessagesRequest {
            job_id: "nope".into(),
        })
        .await
        .unwrap_err()
        .code(),
    ] {
        assert_eq!(code, Code::NotFound);
    }

    let prepared = jobs
        .prepare(prepare_request(
            pipeline(vec![], "beam:transform:impulse:v1"),
            "done",
        ))
        .await
        .unwrap()
        .into_inner();
    let drain = jobs
        .drain(DrainJobRequest {
            job_id: prepared.preparation_id,
        })
        .await
        .unwrap_err();
    assert_eq!(drain.code(), Code::FailedPrecondition);
    // A job that has not run cannot drain.
    assert!(
        drain
            .message()
            .contains("only a starting or running job can be drained"),
        "{}",
        drain.message()
    );

    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn successful_job_streams_states_messages_and_metrics() {
    let server = Server::start().await;
    let mut jobs = server.jobs().await;
    let submitted = pipeline(vec![("py", vec![])], "beam:transform:impulse:v1");
    let prepared = jobs
        .prepare(prepare_request(submitted.clone(), "done"))
        .await
        .unwrap()
        .into_inner();
    let id = prepared.preparation_id.clone();
    assert_eq!(prepared.staging_session_token, id);
    assert_eq!(
        prepared.artifact_staging_endpoint.unwrap().url,
        server.addr.to_string()
    );

    // Nothing to stage: the server closes the stream at once.
    let mut staging = server.staging(&server.addr.to_string()).await;
    let offered = offer_artifacts(&mut staging, &id, &HashMap::new(), 1024)
        .await
        .unwrap();
    assert!(offered.requested.is_empty());

    // Subscribed with the preparation id before Run and without a deadline:
    // served (the Python SDK's deadlined pre-Run subscription is refused, see
    // `a_subscription_with_a_deadline_before_run_is_refused_and_the_retry_after_run_misses_nothing`).
    let mut states = jobs
        .get_state_stream(GetJobStateRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    let first = states.message().await.unwrap().unwrap();
    assert_eq!(first.state(), State::Stopped);
    let mut messages = jobs
        .get_message_stream(JobMessagesRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();

    let run = jobs
        .run(RunJobRequest {
            preparation_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(run.job_id, id);

    let rest = read_states(&mut states).await;
    assert_eq!(rest, [State::Starting, State::Running, State::Done]);
    let messages = describe_messages(&drain(&mut messages).await.unwrap());
    assert_eq!(
        messages,
        [
            "state Stopped",
            "state Starting",
            "state Running",
            "JobMessageBasic: hello from the runner",
            "state Done",
        ]
    );

    let state = jobs
        .get_state(GetJobStateRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state.state(), State::Done);
    assert!(state.timestamp.is_some());

    // Late subscribers get the final state / the history, then the end.
    let late = states_to_end(&mut jobs, GetJobStateRequest { job_id: id.clone() }).await;
    assert_eq!(late, [State::Done]);
    assert_eq!(messages_to_end(&mut jobs, &id).await, messages);

    let listed = jobs.get_jobs(GetJobsRequest {}).await.unwrap().into_inner();
    assert_eq!(listed.job_info.len(), 1);
    assert_eq!(listed.job_info[0].job_id, id);
    assert_eq!(listed.job_info[0].state(), State::Done);
    assert_eq!(listed.job_info[0].pipeline_options, Some(options("done")));

    let fetched = jobs
        .get_pipeline(GetJobPipelineRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fetched.pipeline, Some(submitted));

    let again = jobs
        .run(RunJobRequest {
            preparation_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition);

    let metrics = jobs
        .get_job_metrics(GetJobMetricsRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner()
        .metrics
        .unwrap();
    assert_eq!(metrics.committed, metrics.attempted);
    let mut by_name: HashMap<String, (String, Vec<u64>)> = HashMap::new();
    let mut element_counts = Vec::new();
    for info in &metrics.committed {
        if info.urn == "beam:metric:element_count:v1" {
            element_counts.push(info.labels["PCOLLECTION"].clone());
            continue;
        }
        assert!(info.urn.starts_with("beam:metric:user:"), "{}", info.urn);
        by_name.insert(
            info.labels["NAME"].clone(),
            (
                info.labels["PTRANSFORM"].clone(),
                decode_varints(&info.payload),
            ),
        );
    }
    assert_eq!(by_name.len(), 2);
    // The element counts of PCollections come along; other system metrics do not.
    assert_eq!(element_counts, ["pc1"]);
    // Counter: 1 + 2, relabelled to the unique name.
    assert_eq!(by_name["counter"], ("count1".to_string(), vec![3]));
    // Distribution: {3} merged with {1, 5}; no name mapping for this id.
    assert_eq!(
        by_name["distribution"],
        ("ref_dist_7".to_string(), vec![3, 9, 1, 5])
    );

    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn failed_job_sends_error_text_before_failed() {
    let server = Server::start().await;
    let mut jobs = server.jobs().await;
    let id = prepare_impulse_job(&mut jobs, "fail").await;
    let mut messages = jobs
        .get_message_stream(JobMessagesRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    jobs.run(RunJobRequest {
        preparation_id: id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let items = drain(&mut messages).await.unwrap();
    assert_eq!(
        describe_messages(&items),
        [
            "state Stopped",
            "state Starting",
            "state Running",
            "JobMessageBasic: about to fail",
            "JobMessageError: ValueError: boom [while running 'StageC']",
            "state Failed",
        ]
    );
    // The whole traceback survives, not just its last line.
    use refract_proto::job_api::job_messages_response::Response;
    let error = items
        .iter()
        .find_map(|i| match i.response.as_ref() {
            Some(Response::MessageResponse(m)) if m.importance == 5 => Some(m.message_text.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(error, FAILURE_TEXT);

    let state = jobs
        .get_state(GetJobStateRequest { job_id: id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state.state(), State::Failed);
    server.shutdown().await.unwrap();
}

/// `message` as the Python client sends it: with its
/// `--job_server_timeout` (300 s by default) as the call's deadline.
fn with_deadline<T>(message: T) -> refract_proto::tonic::Request<T> {
    let mut request = refract_proto::tonic::Request::new(message);
    request.set_timeout(std::time::Duration::from_secs(300));
    request
}

/// Python's `PortableRunner` subscribes before Run with its
/// `--job_server_timeout` as deadline and, when refused, subscribes again
/// after Run without one; the refusal is what lets a job outlive that
/// timeout. The retry must still see everything, here a failure's text.
#[tokio::test]
async fn a_subscription_with_a_deadline_before_run_is_refused_and_the_retry_after_run_misses_nothing(
) {
    let server = Server::start().await;
    let mut jobs = server.jobs().await;
    let id = prepare_impulse_job(&mut jobs, "fail").await;

    let state_request = || GetJobStateRequest { job_id: id.clone() };
    let refused = jobs
        .get_state_stream(with_deadline(state_request()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("subscribe after Run"),
        "{}",
        refused.message()
    );
    let refused = jobs
        .get_message_stream(with_deadline(JobMessagesRequest { job_id: id.clone() }))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);

    jobs.run(RunJobRequest {
        preparation_id: id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    // Let the job finish before the retry subscribes: a late subscriber.
    states_to_end(&mut jobs, GetJobStateRequest { job_id: id.clone() }).await;

    // After Run a deadline is the client's choice, and is served.
    assert_eq!(
        states_to_end(&mut jobs, with_deadline(state_request())).await,
        [State::Failed]
    );
    let messages = messages_to_end(&mut jobs, &id).await;
    assert!(
        messages.contains(&"JobMessageError: ValueError: boom [while running 'StageC']".to_owned()),
        "{messages:?}"
    );
    assert_eq!(messages.last().map(String::as_str), Some("state Failed"));
    server.shutdown().await.unwrap();
}

/// Beam's clients read a state stream until a terminal state and the
/// message stream to its end; Python's `TestPipeline` then waits on the job
/// again, reading the same state stream past the terminal state. Both
/// streams end right after it, and one opened after it answers at once.
#[tokio::test]
async fn streams_end_at_the_terminal_state_and_late_ones_answer_at_once() {
    let server = Server::start().await;
    let mut jobs = server.jobs().await;
    let id = prepare_impulse_job(&mut jobs, "done").await;
    let mut states = jobs
        .get_state_stream(GetJobStateRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    let mut messages = jobs
        .get_message_stream(JobMessagesRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    jobs.run(RunJobRequest {
        preparation_id: id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    // Up to the terminal state, as a first wait reads it ...
    let mut seen = Vec::new();
    while let Some(event) = states.message().await.unwrap() {
        seen.push(event.state());
        if event.state() == State::Done {
            break;
        }
    }
    assert_eq!(
        seen,
        [State::Stopped, State::Starting, State::Running, State::Done]
    );
    // ... and past it, as a second wait does: the stream has ended.
    let past = tokio::time::timeout(Duration::from_secs(2), states.message())
        .await
        .expect("the state stream ends after its terminal state");
    assert!(matches!(past, Ok(None)), "{past:?}");
    let messages = describe_messages(&drain(&mut messages).await.unwrap());
    assert_eq!(messages.last().map(String::as_str), Some("state Done"));

    // Opened after the end: the terminal state, then the end; the message
    // stream's history, then the end.
    let late = tokio::time::timeout(
        Duration::from_secs(2),
        states_to_end(&mut jobs, GetJobStateRequest { job_id: id.clone() }),
    )
    .await
    .expect("a late state stream answers at once");
    assert_eq!(late, [State::Done]);
    let late = tokio::time::timeout(Duration::from_secs(2), messages_to_end(&mut jobs, &id))
        .await
        .expect("a late message stream answers at once");
    assert_eq!(late, messages);
    server.shutdown().await.unwrap();
}

/// Python's client stops reading its state stream at the terminal state,
/// waits for the message stream to end, and exits; gRPC Python hangs that
/// exit when a stream's end reaches it meanwhile. So the job's state
/// streams end first: once a client has read the message stream to its
/// end, the rest of a state stream it never read is already in, end
/// included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_message_stream_ends_after_the_state_streams() {
    use futures::FutureExt;
    let server = Server::start().await;
    let mut jobs = server.jobs().await;
    for round in 0..20 {
        let id = prepare_impulse_job(&mut jobs, "done").await;
        // Opened in the order that would end the message stream first if
        // the streams were left to race.
        let mut messages = open_message_stream(&mut jobs, &id).await;
        let mut states = open_state_stream(&mut jobs, &id).await;
        run_prepared(&mut jobs, &id).await;
        drain(&mut messages).await.unwrap();
        let mut seen = Vec::new();
        loop {
            match states.message().now_or_never() {
                Some(Ok(Some(event))) => seen.push(event.state()),
                Some(Ok(None)) => break,
                other => panic!(
                    "round {round}: the state stream had not ended: {other:?} after {seen:?}"
                ),
            }
        }
        assert_eq!(seen.last(), Some(&State::Done), "round {round}");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn cancel_running_and_prepared_jobs() {
    let server = Server::start().await;
    let mut jobs = server.jobs().await;

    let id = prepare_impulse_job(&mut jobs, "cancel").await;
    let mut states = jobs
        .get_state_stream(GetJobStateRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    jobs.run(RunJobRequest {
        preparation_id: id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    // Wait until the runner reports RUNNING, then cancel.
    loop {
        let event = states.message().await.unwrap().unwrap();
        if event.state() == State::Running {
            break;
        }
    }
    let cancelled = jobs
        .cancel(CancelJobRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert!(
        matches!(cancelled.state(), State::Cancelling | State::Cancelled),
        "{:?}",
        cancelled.state()
    );
    let rest = read_states(&mut states).await;
    assert_eq!(rest, [State::Cancelling, State::Cancelled]);
    // Cancelling a finished job reports its final state.
    let again = jobs
        .cancel(CancelJobRequest { job_id: id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.state(), State::Cancelled);

    // A job that was never run is cancelled at once and cannot run later.
    let id = prepare_impulse_job(&mut jobs, "done").await;
    let cancelled = jobs
        .cancel(CancelJobRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.state(), State::Cancelled);
    let run = jobs
        .run(RunJobRequest {
            preparation_id: id,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(run.code(), Code::FailedPrecondition);

    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_ends_streams_of_running_jobs() {
    let server = Server::start().await;
    let mut jobs = server.jobs().await;
    let id = prepare_impulse_job(&mut jobs, "hang").await;
    let mut messages = jobs
        .get_message_stream(JobMessagesRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    jobs.run(RunJobRequest {
        preparation_id: id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let reader = tokio::spawn(async move { drain(&mut messages).await });
    // Let the stream reach the live part.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    server.shutdown().await.unwrap();
    let ended = reader.await.unwrap();
    assert_eq!(ended.unwrap_err().code(), Code::Unavailable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepares_beyond_the_bound_wait_and_past_the_queue_are_refused() {
    let server = Server::start_with(|config| {
        config.max_concurrent_prepares = 1;
        config.max_waiting_prepares = 1;
    })
    .await;
    let jobs = server.jobs().await;
    let mut calls = Vec::new();
    for _ in 0..3 {
        let mut jobs = jobs.clone();
        calls.push(tokio::spawn(async move {
            jobs.prepare(prepare_request(
                pipeline(vec![], SLOW_VALIDATION_URN),
                "done",
            ))
            .await
        }));
    }
    // One validates, one waits for it, and the third is refused at once.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    let refused = loop {
        if let Some(i) = calls.iter().position(|c| c.is_finished()) {
            break calls.remove(i);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Prepare was refused"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let status = refused.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("waiting to be prepared"),
        "{status:?}"
    );
    server.runner.validation.open();
    for call in calls {
        call.await
            .unwrap()
            .expect("prepared once validation went on");
    }
    use std::sync::atomic::Ordering::SeqCst;
    assert_eq!(server.runner.validation.most.load(SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_recovered_job_with_a_path_like_id_removes_nothing_outside_its_own() {
    // Ids of recovered jobs come from records on disk; `..` joined onto
    // the staging root used to name the state directory itself.
    let recovered = |id: &str| refract_jobservice::RecoveredJob {
        id: id.to_string(),
        name: "odd".to_string(),
        pipeline: Default::default(),
        options: Default::default(),
        staged: Vec::new(),
        failed: Some("its record cannot be read".to_string()),
    };
    let server = Server::start_with(|config| {
        config.recovered = vec![recovered(".."), recovered("../db")];
    })
    .await;
    let state_dir = server.staging_dir.parent().unwrap().to_path_buf();
    std::fs::create_dir_all(state_dir.join("db")).unwrap();
    std::fs::write(state_dir.join("db/CURRENT"), b"live").unwrap();
    let mut admin = refract_proto::admin::refract_admin_client::RefractAdminClient::connect(
        format!("http://{}", server.addr),
    )
    .await
    .unwrap();
    for id in ["..", "../db"] {
        admin
            .delete_job(refract_proto::admin::DeleteJobRequest {
                job_id: id.to_string(),
            })
            .await
            .unwrap_or_else(|e| panic!("deleting {id:?}: {e}"));
    }
    assert_eq!(
        std::fs::read(state_dir.join("db/CURRENT")).unwrap(),
        b"live"
    );
}

#[tokio::test]
async fn a_rescale_needs_a_running_job_and_a_runner_that_moves_it() {
    let server = Server::start().await;
    let mut jobs = server.jobs().await;
    let mut admin = refract_proto::admin::refract_admin_client::RefractAdminClient::connect(
        format!("http://{}", server.addr),
    )
    .await
    .unwrap();
    let rescale = |job_id: &str| refract_proto::admin::RescaleJobRequest {
        job_id: job_id.to_string(),
        shards: 2,
    };
    let unknown = admin.rescale_job(rescale("no-such-job")).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    let id = prepare_impulse_job(&mut jobs, "hang").await;
    let prepared = admin.rescale_job(rescale(&id)).await.unwrap_err();
    assert_eq!(prepared.code(), Code::FailedPrecondition, "{prepared:?}");
    assert!(
        prepared.message().contains("only a running job"),
        "{prepared:?}"
    );
    jobs.run(RunJobRequest {
        preparation_id: id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut state = State::Stopped;
    for _ in 0..100 {
        state = State::try_from(
            jobs.get_state(GetJobStateRequest { job_id: id.clone() })
                .await
                .unwrap()
                .into_inner()
                .state,
        )
        .unwrap();
        if state == State::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(state, State::Running);
    // This test's runner, like any by default, moves no job.
    let refused = admin.rescale_job(rescale(&id)).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("does not move jobs between shards"),
        "{refused:?}"
    );
}
