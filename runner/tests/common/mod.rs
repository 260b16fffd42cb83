//! Shared by the runner's gRPC tests: a real `refract` server (the same
//! code `refract serve` runs) on loopback ports, Job API calls against it,
//! and pipelines built by hand, including ones no SDK would send.

#![allow(dead_code)]

use std::collections::HashMap;
use std::time::Duration;

use clap::Parser;
use refract::cli::{Cli, Command, ServeArgs};
use refract::serve::{self, Server};
use refract_proto::job_api::job_messages_response::Response as MessageOrState;
use refract_proto::job_api::job_service_client::JobServiceClient;
use refract_proto::job_api::job_state::Enum as JobState;
use refract_proto::job_api::{
    GetJobStateRequest, GetJobsRequest, JobMessage, JobMessagesRequest, PrepareJobRequest,
    RunJobRequest,
};
use refract_proto::pipeline as pb;
use refract_proto::prost_types::{value::Kind, ListValue, Struct, Value};
use refract_proto::tonic::transport::Channel;
use refract_proto::tonic::{Code, Status};
use refract_proto::urns;

/// A server started in this process, and a client of its Job API.
pub struct TestServer {
    pub server: Server,
    pub client: JobServiceClient<Channel>,
}

/// The flags of `refract serve` plus `extra`, on any free ports, without
/// the web UI.
pub fn serve_args(extra: &[&str]) -> ServeArgs {
    let mut argv = vec!["refract", "serve", "--job_port", "0", "--serve_http=false"];
    argv.extend_from_slice(extra);
    match Cli::try_parse_from(argv).expect("valid flags").command {
        Some(Command::Serve(args)) => args,
        other => panic!("not serve flags: {other:?}"),
    }
}

impl TestServer {
    /// Starts a server with `refract serve`'s defaults.
    pub async fn start() -> TestServer {
        Self::start_with(serve_args(&[])).await
    }

    /// Starts a server with these flags.
    pub async fn start_with(args: ServeArgs) -> TestServer {
        let server = serve::start(&args, std::future::pending())
            .await
            .expect("the server starts");
        let client = JobServiceClient::connect(format!("http://{}", server.job_endpoint))
            .await
            .expect("a Job API connection")
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        TestServer { server, client }
    }

    /// `Prepare` of `pipeline`: the preparation id, or the refusal.
    pub async fn prepare(&self, pipeline: pb::Pipeline) -> Result<String, Status> {
        self.prepare_named("hostile", pipeline, Struct::default())
            .await
    }

    /// `Prepare` of job `name` running `pipeline` with `options`: the
    /// preparation id, or the refusal.
    pub async fn prepare_named(
        &self,
        name: &str,
        pipeline: pb::Pipeline,
        options: Struct,
    ) -> Result<String, Status> {
        self.client
            .clone()
            .prepare(PrepareJobRequest {
                pipeline: Some(pipeline),
                pipeline_options: Some(options),
                job_name: name.into(),
            })
            .await
            .map(|r| r.into_inner().preparation_id)
    }

    /// Prepares and runs job `name`, as an SDK submits one; its id.
    pub async fn submit(&self, name: &str, pipeline: pb::Pipeline, options: Struct) -> String {
        let id = self
            .prepare_named(name, pipeline, options)
            .await
            .expect("prepared");
        self.client
            .clone()
            .run(RunJobRequest {
                preparation_id: id.clone(),
                retrieval_token: String::new(),
            })
            .await
            .expect("run");
        id
    }

    /// Prepares and runs `pipeline`; the job's terminal state.
    pub async fn run_to_end(&self, pipeline: pb::Pipeline, within: Duration) -> JobState {
        let id = self.submit("hostile", pipeline, Struct::default()).await;
        let mut client = self.client.clone();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let state = client
                .get_state(GetJobStateRequest { job_id: id.clone() })
                .await
                .expect("state")
                .into_inner()
                .state();
            if matches!(
                state,
                JobState::Done | JobState::Failed | JobState::Cancelled
            ) {
                return state;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "job {id} still {state:?} after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Asserts that the server still answers and still accepts a small
    /// valid pipeline, after whatever was sent before.
    pub async fn assert_serving(&self, after: &str) {
        self.client
            .clone()
            .get_jobs(GetJobsRequest {})
            .await
            .unwrap_or_else(|e| panic!("GetJobs failed after {after}: {e}"));
        self.prepare(Pipe::chain(1).build())
            .await
            .unwrap_or_else(|e| panic!("a valid pipeline was refused after {after}: {e}"));
    }

    /// Asserts that `pipeline` is refused as invalid with a message
    /// containing `expected`, and that the server serves on.
    pub async fn assert_refused(&self, case: &str, pipeline: pb::Pipeline, expected: &str) {
        let status = self
            .prepare(pipeline)
            .await
            .err()
            .unwrap_or_else(|| panic!("{case}: Prepare accepted it"));
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{case}: {}",
            status.message()
        );
        assert!(
            status.message().contains(expected),
            "{case}: the refusal {:?} does not say {expected:?}",
            status.message()
        );
        self.assert_serving(case).await;
    }
}

/// Coder ids every [`Pipe`] has.
pub const BYTES: &str = "bytes";
/// `kv[bytes, bytes]`.
pub const KV_BYTES: &str = "kv_bytes";
/// The global window's coder.
pub const GLOBAL_WINDOW: &str = "global_window";
/// The windowing strategy every PCollection of a [`Pipe`] has unless told.
pub const GLOBAL: &str = "global";

/// A pipeline built by hand: components, then transforms.
pub struct Pipe {
    pub components: pb::Components,
    pub roots: Vec<String>,
}

/// A coder with this URN and these components.
pub fn coder(urn: &str, components: &[&str]) -> pb::Coder {
    pb::Coder {
        spec: Some(pb::FunctionSpec {
            urn: urn.to_string(),
            payload: Vec::new(),
        }),
        component_coder_ids: components.iter().map(|c| c.to_string()).collect(),
    }
}

fn ports(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Default for Pipe {
    fn default() -> Self {
        Self::new()
    }
}

impl Pipe {
    /// Standard coders and a global windowing strategy; no transforms.
    pub fn new() -> Pipe {
        let mut components = pb::Components::default();
        components
            .coders
            .insert(BYTES.into(), coder(urns::coder::BYTES, &[]));
        components
            .coders
            .insert(KV_BYTES.into(), coder(urns::coder::KV, &[BYTES, BYTES]));
        components
            .coders
            .insert(GLOBAL_WINDOW.into(), coder(urns::coder::GLOBAL_WINDOW, &[]));
        components.windowing_strategies.insert(
            GLOBAL.into(),
            pb::WindowingStrategy {
                window_fn: Some(pb::FunctionSpec {
                    urn: urns::window_fn::GLOBAL.into(),
                    payload: Vec::new(),
                }),
                merge_status: pb::merge_status::Enum::NonMerging as i32,
                window_coder_id: GLOBAL_WINDOW.into(),
                trigger: Some(pb::Trigger {
                    trigger: Some(pb::trigger::Trigger::Default(pb::trigger::Default {})),
                }),
                accumulation_mode: pb::accumulation_mode::Enum::Discarding as i32,
                output_time: pb::output_time::Enum::EndOfWindow as i32,
                closing_behavior: pb::closing_behavior::Enum::EmitIfNonempty as i32,
                on_time_behavior: pb::on_time_behavior::Enum::FireIfNonempty as i32,
                ..Default::default()
            },
        );
        Pipe {
            components,
            roots: Vec::new(),
        }
    }

    /// Impulse → `n` Flattens in a chain.
    pub fn chain(n: usize) -> Pipe {
        let mut p = Pipe::new();
        p.root_transform("impulse", urns::transform::IMPULSE, &[], &[("out", "p0")]);
        p.pcollection("p0", BYTES);
        for i in 1..=n {
            let (input, output) = (format!("p{}", i - 1), format!("p{i}"));
            p.pcollection(&output, BYTES);
            p.root_transform(
                &format!("flatten{i}"),
                urns::transform::FLATTEN,
                &[("0", &input)],
                &[("out", &output)],
            );
        }
        p
    }

    /// Adds a PCollection with this coder, globally windowed.
    pub fn pcollection(&mut self, id: &str, coder_id: &str) -> &mut Self {
        self.components.pcollections.insert(
            id.into(),
            pb::PCollection {
                unique_name: id.into(),
                coder_id: coder_id.into(),
                is_bounded: pb::is_bounded::Enum::Bounded as i32,
                windowing_strategy_id: GLOBAL.into(),
                display_data: Vec::new(),
            },
        );
        self
    }

    /// Adds a transform, not as a root.
    pub fn transform(
        &mut self,
        id: &str,
        urn: &str,
        inputs: &[(&str, &str)],
        outputs: &[(&str, &str)],
    ) -> &mut pb::PTransform {
        self.components.transforms.insert(
            id.into(),
            pb::PTransform {
                unique_name: id.into(),
                spec: (!urn.is_empty()).then(|| pb::FunctionSpec {
                    urn: urn.into(),
                    payload: Vec::new(),
                }),
                inputs: ports(inputs),
                outputs: ports(outputs),
                ..Default::default()
            },
        );
        self.components
            .transforms
            .get_mut(id)
            .expect("just inserted")
    }

    /// Adds a transform as a root.
    pub fn root_transform(
        &mut self,
        id: &str,
        urn: &str,
        inputs: &[(&str, &str)],
        outputs: &[(&str, &str)],
    ) -> &mut pb::PTransform {
        self.roots.push(id.into());
        self.transform(id, urn, inputs, outputs)
    }

    /// The pipeline proto.
    pub fn build(self) -> pb::Pipeline {
        pb::Pipeline {
            components: Some(self.components),
            root_transform_ids: self.roots,
            ..Default::default()
        }
    }
}

/// An EXTERNAL environment whose workers the worker pool at `url` starts.
pub fn external_environment(url: &str) -> pb::Environment {
    pb::Environment {
        urn: urns::env::EXTERNAL.into(),
        payload: refract_proto::prost::Message::encode_to_vec(&pb::ExternalPayload {
            endpoint: Some(pb::ApiServiceDescriptor {
                url: url.into(),
                authentication: None,
            }),
            params: Default::default(),
        }),
        ..Default::default()
    }
}

/// Impulse → a ParDo `map` in `environment` (its only environment, `env`):
/// a pipeline with one SDK stage.
pub fn pardo_in(environment: pb::Environment) -> Pipe {
    let mut p = Pipe::chain(0);
    p.components.environments.insert("env".into(), environment);
    p.pcollection("p1", BYTES);
    p.root_transform(
        "map",
        urns::transform::PAR_DO,
        &[("in", "p0")],
        &[("out", "p1")],
    )
    .environment_id = "env".into();
    p
}

/// Pipeline options: `streaming`, and these `--experiments`.
pub fn pipeline_options(streaming: bool, experiments: &[&str]) -> Struct {
    let mut fields = std::collections::BTreeMap::new();
    if streaming {
        fields.insert(
            "beam:option:streaming:v1".to_string(),
            Value {
                kind: Some(Kind::BoolValue(true)),
            },
        );
    }
    if !experiments.is_empty() {
        let values = experiments
            .iter()
            .map(|e| Value {
                kind: Some(Kind::StringValue(e.to_string())),
            })
            .collect();
        fields.insert(
            "beam:option:experiments:v1".to_string(),
            Value {
                kind: Some(Kind::ListValue(ListValue { values })),
            },
        );
    }
    Struct { fields }
}

/// Longest a test waits for a job to get somewhere.
pub const JOB_WAIT: Duration = Duration::from_secs(30);

/// Job `id`'s messages, in order, from the start until the job ended
/// (the stream's end), and the state it ended in.
pub async fn messages_to_end(
    mut jobs: JobServiceClient<Channel>,
    id: &str,
) -> (Vec<JobMessage>, JobState) {
    let mut stream = jobs
        .get_message_stream(JobMessagesRequest { job_id: id.into() })
        .await
        .expect("a message stream")
        .into_inner();
    let mut messages = Vec::new();
    let mut state = JobState::Unspecified;
    let read = async {
        while let Some(item) = stream.message().await.expect("the stream reads") {
            match item.response {
                Some(MessageOrState::MessageResponse(m)) => messages.push(m),
                Some(MessageOrState::StateResponse(s)) => state = s.state(),
                None => {}
            }
        }
    };
    if tokio::time::timeout(JOB_WAIT, read).await.is_err() {
        panic!("job {id} is still {state:?} after {JOB_WAIT:?}; its messages: {messages:?}");
    }
    (messages, state)
}

/// Waits until one of job `id`'s messages contains `text`.
pub async fn wait_for_message(mut jobs: JobServiceClient<Channel>, id: &str, text: &str) {
    let mut stream = jobs
        .get_message_stream(JobMessagesRequest { job_id: id.into() })
        .await
        .expect("a message stream")
        .into_inner();
    let found = tokio::time::timeout(JOB_WAIT, async {
        while let Ok(Some(item)) = stream.message().await {
            if let Some(MessageOrState::MessageResponse(m)) = item.response {
                if m.message_text.contains(text) {
                    return true;
                }
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "no message of job {id} says {text:?}");
}

/// Peak resident memory of this process so far (`VmHWM`), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    peak_rss_in("/proc/self/status")
}

/// Peak resident memory of process `pid` so far (`VmHWM`), in bytes.
pub fn peak_rss_bytes_of(pid: u32) -> Option<u64> {
    peak_rss_in(&format!("/proc/{pid}/status"))
}

/// `VmHWM` of a `/proc/*/status` file, in bytes.
fn peak_rss_in(status: &str) -> Option<u64> {
    let status = std::fs::read_to_string(status).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A `refract serve` process (the binary of this crate), for tests that
/// stop and start servers on one state directory.
pub struct ServerProcess {
    pub child: std::process::Child,
    pub endpoint: String,
}

impl ServerProcess {
    /// Starts `refract serve --job_port PORT --serve_http=false ARGS` and
    /// waits until its job port answers.
    pub async fn start(port: u16, args: &[&str]) -> ServerProcess {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_refract"))
            .args([
                "serve",
                "--job_port",
                &port.to_string(),
                "--serve_http=false",
            ])
            .args(args)
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("refract starts");
        let endpoint = format!("127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&endpoint).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "refract did not listen on {endpoint}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        ServerProcess { child, endpoint }
    }

    /// A Job API client.
    pub async fn jobs(&self) -> JobServiceClient<Channel> {
        JobServiceClient::connect(format!("http://{}", self.endpoint))
            .await
            .expect("a Job API connection")
    }

    /// An admin API client.
    pub async fn admin(
        &self,
    ) -> refract_proto::admin::refract_admin_client::RefractAdminClient<Channel> {
        refract_proto::admin::refract_admin_client::RefractAdminClient::connect(format!(
            "http://{}",
            self.endpoint
        ))
        .await
        .expect("an admin API connection")
    }

    /// Stops it as a crash would (SIGKILL) and waits for it.
    pub fn kill(self) {
        drop(self);
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects to `port` on loopback as `uid` (or as this user), writes
/// `request` (a printf format) and returns the first `bytes` bytes of the
/// answer: fewer, or none, when the server closed the connection.
pub async fn probe(uid: Option<u32>, port: u16, request: &str, bytes: usize) -> Vec<u8> {
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port} || exit 3\nprintf '{request}' >&3 2>/dev/null\nhead -c {bytes} <&3"
    );
    let mut command = tokio::process::Command::new("/bin/bash");
    command
        .args(["-c", &script])
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(uid) = uid {
        command.uid(uid).gid(uid);
    }
    let output = tokio::time::timeout(Duration::from_secs(10), command.output())
        .await
        .expect("the probe ends: the server answers or closes")
        .expect("bash runs");
    assert_ne!(
        output.status.code(),
        Some(3),
        "could not connect to port {port}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// A free port on 127.0.0.1 (nothing listens on it right now).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
