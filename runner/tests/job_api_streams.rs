//! The Job API's state and message streams as Beam's clients read them,
//! checked against `refract serve` and, in the same test, against Beam's own
//! Python job server (`local_job_service_main`), so that Refract is shown
//! to keep the reference server's semantics, and its one deliberate
//! difference is pinned.
//!
//! The pipelines are built by the installed Python SDK and run by real SDK
//! workers (`job_api_peer.py`, a worker pool like a LOOPBACK client's). What
//! every client relies on, on both servers:
//! - a state stream answers at once with the current state, also on a
//!   preparation id before `Run`;
//! - it ends right after the terminal state, so a client reading past it
//!   (Python's `TestPipeline` waits twice) is not kept waiting; one opened
//!   after the end answers with the terminal state and ends;
//! - the message stream ends at the terminal state, a failure's error text
//!   coming before `FAILED`, and replays the history to a late reader;
//! - a cancelled job's streams end at `CANCELLED`.
//!
//! The difference: Python's `PortableRunner` subscribes before `Run` with
//! its `--job_server_timeout` as the call's deadline. Beam's server serves
//! that subscription, so a job longer than the timeout fails in the client
//! while it still runs (Beam issue 35867); Refract refuses it, and the
//! client subscribes again after `Run` with no deadline.
//!
//! Without a Python that has `apache_beam` (`BEAM_PYTHON`, else `python3`)
//! the test says so and passes, unless `REFRACT_REQUIRE_PYTHON=1` (CI).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

#[path = "../../sdk-harness/tests/beam_python/mod.rs"]
mod beam_python;
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use beam_python::beam_python;
use common::{free_port, ServerProcess};
use refract_proto::job_api::job_messages_response::Response as MessageOrState;
use refract_proto::job_api::job_service_client::JobServiceClient;
use refract_proto::job_api::job_state::Enum as State;
use refract_proto::job_api::{
    CancelJobRequest, GetJobStateRequest, JobMessagesRequest, JobMessagesResponse, JobStateEvent,
    PrepareJobRequest, RunJobRequest,
};
use refract_proto::pipeline::Pipeline;
use refract_proto::prost::Message;
use refract_proto::prost_types::Struct;
use refract_proto::tonic::transport::Channel;
use refract_proto::tonic::{Code, Request, Streaming};

/// How soon a stream must end once its job is terminal: Beam's server ends
/// it at once; anything near a second would show in every test suite.
const PROMPTLY: Duration = Duration::from_secs(2);
/// Longest a job may take to get where a case needs it.
const JOB_WAIT: Duration = Duration::from_secs(60);

/// The pipelines and options `job_api_peer.py` wrote, and the process
/// serving their workers.
struct Submissions {
    done: Pipeline,
    fail: Pipeline,
    slow: Pipeline,
    options: Struct,
    _workers: KillOnDrop,
    _dir: tempfile::TempDir,
}

impl Submissions {
    fn build(python: &str) -> Submissions {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/job_api_peer.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("job_api_peer.py starts");
        let stdout = child.stdout.take().expect("its stdout");
        let workers = KillOnDrop(child);
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("job_api_peer.py writes a line");
        assert_eq!(line.trim(), "READY", "job_api_peer.py failed");
        let read = |name: &str| std::fs::read(dir.path().join(name)).expect(name);
        Submissions {
            done: Pipeline::decode(read("done.pb").as_slice()).expect("done.pb"),
            fail: Pipeline::decode(read("fail.pb").as_slice()).expect("fail.pb"),
            slow: Pipeline::decode(read("slow.pb").as_slice()).expect("slow.pb"),
            options: Struct::decode(read("options.pb").as_slice()).expect("options.pb"),
            _workers: workers,
            _dir: dir,
        }
    }
}

/// A child process killed when the test lets go of it.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Which job server a case runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    Refract,
    BeamPythonJobServer,
}

/// Beam's Python job server on a free port, once it answers.
async fn python_job_server(python: &str) -> (KillOnDrop, String) {
    let port = free_port();
    let child = Command::new(python)
        .args([
            "-m",
            "apache_beam.runners.portability.local_job_service_main",
            "--port",
            &port.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("Beam's Python job server starts");
    let endpoint = format!("127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(&endpoint).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "Beam's Python job server did not listen on {endpoint}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (KillOnDrop(child), endpoint)
}

async fn connect(endpoint: &str) -> JobServiceClient<Channel> {
    JobServiceClient::connect(format!("http://{endpoint}"))
        .await
        .expect("a Job API connection")
}

async fn prepare(
    jobs: &mut JobServiceClient<Channel>,
    pipeline: &Pipeline,
    options: &Struct,
) -> String {
    jobs.prepare(PrepareJobRequest {
        pipeline: Some(pipeline.clone()),
        pipeline_options: Some(options.clone()),
        job_name: "job".into(),
    })
    .await
    .expect("Prepare")
    .into_inner()
    .preparation_id
}

async fn run(jobs: &mut JobServiceClient<Channel>, id: &str) {
    jobs.run(RunJobRequest {
        preparation_id: id.to_string(),
        ..Default::default()
    })
    .await
    .expect("Run");
}

async fn state_stream(
    jobs: &mut JobServiceClient<Channel>,
    request: impl refract_proto::tonic::IntoRequest<GetJobStateRequest>,
) -> Result<Streaming<JobStateEvent>, refract_proto::tonic::Status> {
    Ok(jobs.get_state_stream(request).await?.into_inner())
}

async fn message_stream(
    jobs: &mut JobServiceClient<Channel>,
    id: &str,
) -> Streaming<JobMessagesResponse> {
    jobs.get_message_stream(JobMessagesRequest {
        job_id: id.to_string(),
    })
    .await
    .expect("GetMessageStream")
    .into_inner()
}

/// Where a state sits in a job's life, for checking that a stream never
/// goes back.
fn stage_of_life(state: State) -> u8 {
    match state {
        State::Stopped => 0,
        State::Starting => 1,
        State::Running => 2,
        State::Cancelling | State::Draining => 3,
        _ => 4,
    }
}

/// Reads states until a terminal one, within `within`; they must move
/// only forward.
async fn states_until_terminal(
    stream: &mut Streaming<JobStateEvent>,
    within: Duration,
) -> Vec<State> {
    let mut states = Vec::new();
    let read = async {
        while let Some(event) = stream.message().await.expect("a state event") {
            states.push(event.state());
            if refract_jobservice::is_terminal(event.state()) {
                break;
            }
        }
    };
    tokio::time::timeout(within, read)
        .await
        .unwrap_or_else(|_| panic!("no terminal state within {within:?}"));
    assert!(
        states
            .windows(2)
            .all(|w| stage_of_life(w[0]) <= stage_of_life(w[1])),
        "states went back: {states:?}"
    );
    states
}

/// The stream, read past its terminal state as a second wait reads it,
/// has ended.
async fn assert_ended<T: Message + Default + std::fmt::Debug>(
    stream: &mut Streaming<T>,
    what: &str,
) {
    let Ok(next) = tokio::time::timeout(PROMPTLY, stream.message()).await else {
        panic!("{what} is still open {PROMPTLY:?} after its terminal state");
    };
    assert!(matches!(next, Ok(None)), "{what} went on: {next:?}");
}

/// A message stream read to its end, which must come promptly once the
/// job is terminal: its messages' texts and its last state.
async fn messages_to_end(
    stream: &mut Streaming<JobMessagesResponse>,
    within: Duration,
) -> (Vec<(i32, String)>, State) {
    let mut texts = Vec::new();
    let mut last = State::Unspecified;
    let read = async {
        while let Some(item) = stream.message().await.expect("a message") {
            match item.response {
                Some(MessageOrState::MessageResponse(m)) => {
                    texts.push((m.importance, m.message_text))
                }
                Some(MessageOrState::StateResponse(s)) => last = s.state(),
                None => {}
            }
        }
    };
    tokio::time::timeout(within, read)
        .await
        .unwrap_or_else(|_| {
            panic!("the message stream did not end within {within:?}; last state {last:?}")
        });
    (texts, last)
}

/// The state stream of a done job, opened on the preparation id before
/// `Run` without a deadline, read to the terminal state and past it; then
/// late readers of both streams.
async fn a_done_job(jobs: &mut JobServiceClient<Channel>, s: &Submissions) {
    let id = prepare(jobs, &s.done, &s.options).await;
    let mut states = state_stream(jobs, GetJobStateRequest { job_id: id.clone() })
        .await
        .expect("a state stream on a preparation id");
    let first = tokio::time::timeout(PROMPTLY, states.message())
        .await
        .expect("the current state at once")
        .expect("a state")
        .expect("a state");
    assert_eq!(first.state(), State::Stopped);
    let mut messages = message_stream(jobs, &id).await;
    run(jobs, &id).await;
    let seen = states_until_terminal(&mut states, JOB_WAIT).await;
    assert_eq!(seen.last(), Some(&State::Done), "{seen:?}");
    assert_ended(&mut states, "the state stream").await;
    let (_, last) = messages_to_end(&mut messages, PROMPTLY).await;
    assert_eq!(last, State::Done);

    let mut late = state_stream(jobs, GetJobStateRequest { job_id: id.clone() })
        .await
        .expect("a late state stream");
    let seen = states_until_terminal(&mut late, PROMPTLY).await;
    assert_eq!(seen.last(), Some(&State::Done), "{seen:?}");
    assert_ended(&mut late, "a late state stream").await;
    let mut late = message_stream(jobs, &id).await;
    let (_, last) = messages_to_end(&mut late, PROMPTLY).await;
    assert_eq!(last, State::Done);
}

/// A failing job followed as Go's and Java's clients do, after `Run`,
/// message stream first: the SDK's error text comes before `FAILED`.
async fn a_failing_job(jobs: &mut JobServiceClient<Channel>, s: &Submissions) {
    let id = prepare(jobs, &s.fail, &s.options).await;
    run(jobs, &id).await;
    let mut messages = message_stream(jobs, &id).await;
    let mut states = state_stream(jobs, GetJobStateRequest { job_id: id.clone() })
        .await
        .expect("a state stream");
    let (texts, last) = messages_to_end(&mut messages, JOB_WAIT).await;
    assert_eq!(last, State::Failed);
    let error = 5; // JOB_MESSAGE_ERROR
    assert!(
        texts
            .iter()
            .any(|(importance, text)| *importance == error && text.contains("boom from the DoFn")),
        "no ERROR message with the SDK's error text: {texts:?}"
    );
    let seen = states_until_terminal(&mut states, PROMPTLY).await;
    assert_eq!(seen.last(), Some(&State::Failed), "{seen:?}");
    assert_ended(&mut states, "the state stream").await;
}

/// A running job cancelled: both streams end at `CANCELLED`.
async fn a_cancelled_job(jobs: &mut JobServiceClient<Channel>, s: &Submissions) {
    let id = prepare(jobs, &s.slow, &s.options).await;
    run(jobs, &id).await;
    let mut states = state_stream(jobs, GetJobStateRequest { job_id: id.clone() })
        .await
        .expect("a state stream");
    let mut messages = message_stream(jobs, &id).await;
    let running = async {
        while let Some(event) = states.message().await.expect("a state event") {
            if event.state() == State::Running {
                return;
            }
        }
        panic!("the state stream ended before RUNNING");
    };
    tokio::time::timeout(JOB_WAIT, running)
        .await
        .expect("RUNNING within the wait");
    jobs.cancel(CancelJobRequest { job_id: id.clone() })
        .await
        .expect("Cancel");
    let seen = states_until_terminal(&mut states, Duration::from_secs(15)).await;
    assert_eq!(seen.last(), Some(&State::Cancelled), "{seen:?}");
    assert_ended(&mut states, "the state stream").await;
    let (_, last) = messages_to_end(&mut messages, PROMPTLY).await;
    assert_eq!(last, State::Cancelled);
}

/// Python's `PortableRunner` subscription before `Run`, with its
/// `--job_server_timeout` (300 s by default) as deadline.
async fn a_deadlined_subscription_before_run(
    peer: Peer,
    jobs: &mut JobServiceClient<Channel>,
    s: &Submissions,
) {
    let id = prepare(jobs, &s.done, &s.options).await;
    let mut request = Request::new(GetJobStateRequest { job_id: id.clone() });
    request.set_timeout(Duration::from_secs(300));
    let opened = state_stream(jobs, request).await;
    match peer {
        Peer::BeamPythonJobServer => {
            let mut stream = opened.expect("served");
            let first = stream.message().await.expect("a state").expect("a state");
            assert_eq!(first.state(), State::Stopped);
        }
        Peer::Refract => {
            let refused = opened.expect_err("refused");
            assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
        }
    }
    // Either way the client's subscription after Run sees the whole job.
    run(jobs, &id).await;
    let mut states = state_stream(jobs, GetJobStateRequest { job_id: id.clone() })
        .await
        .expect("a state stream after Run");
    let seen = states_until_terminal(&mut states, JOB_WAIT).await;
    assert_eq!(seen.last(), Some(&State::Done), "{seen:?}");
}

async fn check(peer: Peer, endpoint: &str, submissions: &Submissions) {
    let mut jobs = connect(endpoint).await;
    eprintln!("{peer:?}: a done job");
    a_done_job(&mut jobs, submissions).await;
    eprintln!("{peer:?}: a failing job");
    a_failing_job(&mut jobs, submissions).await;
    eprintln!("{peer:?}: a cancelled job");
    a_cancelled_job(&mut jobs, submissions).await;
    eprintln!("{peer:?}: a deadlined subscription before Run");
    a_deadlined_subscription_before_run(peer, &mut jobs, submissions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_and_message_streams_behave_as_on_beams_python_job_server() {
    let Some(python) = beam_python() else {
        return;
    };
    let submissions = Submissions::build(&python);

    let (_beam, endpoint) = python_job_server(&python).await;
    check(Peer::BeamPythonJobServer, &endpoint, &submissions).await;

    let refract = ServerProcess::start(free_port(), &[]).await;
    check(Peer::Refract, &refract.endpoint, &submissions).await;
}
