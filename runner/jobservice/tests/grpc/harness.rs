//! A job service on 127.0.0.1:0 with a scriptable test runner, plus client
//! helpers that speak real gRPC to it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use refract_jobservice::{serve, Job, JobRunner, JobServiceConfig, JobServiceError};
use refract_proto::job_api::artifact_request_wrapper::Request as ArtifactRequest;
use refract_proto::job_api::artifact_response_wrapper::Response as ArtifactResponse;
use refract_proto::job_api::artifact_staging_service_client::ArtifactStagingServiceClient;
use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::job_api::job_service_client::JobServiceClient;
use refract_proto::job_api::job_state::Enum as State;
use refract_proto::job_api::{
    ArtifactResponseWrapper, GetArtifactResponse, JobMessagesResponse, PrepareJobRequest,
};
use refract_proto::pipeline::{
    ArtifactFilePayload, ArtifactInformation, ArtifactStagingToRolePayload, Components,
    Environment, MonitoringInfo, PTransform, Pipeline,
};
use refract_proto::prost::Message;
use refract_proto::prost_types::{value::Kind, Struct, Value};
use refract_proto::tonic::transport::Channel;
use refract_proto::tonic::{Status, Streaming};
use refract_proto::urns;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

/// Option key that tells the test runner what to do with a job.
pub const OUTCOME_OPTION: &str = "beam:option:refract_test_outcome:v1";
/// Transform URN the test runner refuses in `validate`.
pub const UNSUPPORTED_URN: &str = "beam:transform:foo:v1";
/// The SDK-style error the "fail" outcome reports.
pub const FAILURE_TEXT: &str =
    "Traceback (most recent call last):\n  File \"x.py\", line 1, in first\nValueError: boom [while running 'StageC']";

/// What the test runner observed of a job's artifacts when it started, since
/// they are deleted once the job ends.
#[derive(Debug, Clone)]
pub struct StartSnapshot {
    pub resolved: HashMap<String, Vec<ArtifactInformation>>,
    pub contents: HashMap<PathBuf, Vec<u8>>,
    pub artifact_dir: PathBuf,
}

/// Transform URN whose pipelines the test runner validates only once
/// [`ValidationGate::open`] is called, to hold `Prepare`s in validation.
pub const SLOW_VALIDATION_URN: &str = "beam:transform:refract_test_slow_validation:v1";

/// Holds validations of [`SLOW_VALIDATION_URN`] pipelines, and counts them.
#[derive(Default)]
pub struct ValidationGate {
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
    /// Validations running now.
    pub running: std::sync::atomic::AtomicUsize,
    /// The most that ran at once.
    pub most: std::sync::atomic::AtomicUsize,
}

impl ValidationGate {
    /// Lets every held validation (and later ones) finish.
    pub fn open(&self) {
        if let Ok(mut open) = self.open.lock() {
            *open = true;
        }
        self.opened.notify_all();
    }

    fn pass(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        if let Ok(mut open) = self.open.lock() {
            while !*open {
                open = match self.opened.wait(open) {
                    Ok(open) => open,
                    Err(_) => break,
                };
            }
        }
        self.running.fetch_sub(1, SeqCst);
    }
}

/// Scripted by the `OUTCOME_OPTION` pipeline option: `done` (runs, posts a
/// message, commits two bundles of metrics, finishes), `fail`, `cancel`
/// (runs until cancelled) or `hang` (stays RUNNING).
#[derive(Default)]
pub struct TestRunner {
    pub started: Mutex<HashMap<String, StartSnapshot>>,
    pub validation: ValidationGate,
}

fn outcome(job: &Job) -> String {
    match job
        .options()
        .fields
        .get(OUTCOME_OPTION)
        .and_then(|v| v.kind.as_ref())
    {
        Some(Kind::StringValue(s)) => s.clone(),
        _ => "done".to_string(),
    }
}

impl JobRunner for TestRunner {
    fn validate(&self, pipeline: &Pipeline, _options: &Struct) -> Result<(), String> {
        let transforms = pipeline
            .components
            .as_ref()
            .map(|c| &c.transforms)
            .cloned()
            .unwrap_or_default();
        for (id, t) in transforms {
            let urn = t.spec.as_ref().map(|s| s.urn.as_str()).unwrap_or("");
            if urn == SLOW_VALIDATION_URN {
                self.validation.pass();
            }
            if urn == UNSUPPORTED_URN {
                return Err(format!(
                    "unsupported transform URN {urn} (transform '{}', id {id})",
                    t.unique_name
                ));
            }
        }
        Ok(())
    }

    fn start(&self, job: Arc<Job>) {
        assert_eq!(job.state(), State::Starting);
        let envs: Vec<String> = job
            .pipeline()
            .components
            .as_ref()
            .map(|c| c.environments.keys().cloned().collect())
            .unwrap_or_default();
        let mut snapshot = StartSnapshot {
            resolved: HashMap::new(),
            contents: HashMap::new(),
            artifact_dir: job.artifacts().dir().to_path_buf(),
        };
        for env in envs {
            let deps = job.artifacts().resolved_dependencies(&env);
            for dep in &deps {
                if dep.type_urn == urns::artifact::FILE {
                    let path = PathBuf::from(
                        ArtifactFilePayload::decode(dep.type_payload.as_slice())
                            .unwrap()
                            .path,
                    );
                    if let Ok(bytes) = std::fs::read(&path) {
                        snapshot.contents.insert(path, bytes);
                    }
                }
            }
            snapshot.resolved.insert(env, deps);
        }
        self.started.lock().insert(job.id().to_string(), snapshot);

        tokio::spawn(async move {
            job.set_state(State::Running);
            match outcome(&job).as_str() {
                "fail" => {
                    job.message(MessageImportance::JobMessageBasic, "about to fail");
                    job.fail(FAILURE_TEXT);
                }
                "cancel" => {
                    let mut cancel = job.cancel_requested();
                    let _ = cancel.wait_for(|c| *c).await;
                    job.message(MessageImportance::JobMessageWarning, "cancelling work");
                    job.set_state(State::Cancelled);
                }
                "hang" => {}
                _ => {
                    job.message(MessageImportance::JobMessageBasic, "hello from the runner");
                    job.metrics().set_transform_names(
                        [("ref_count1_5".to_string(), "count1".to_string())].into(),
                    );
                    job.metrics().commit(&bundle_metrics(1, &[3]));
                    job.metrics().commit(&bundle_metrics(2, &[1, 5]));
                    // Illegal: ignored.
                    job.set_state(State::Starting);
                    job.set_state(State::Done);
                }
            }
        });
    }
}

pub fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn labels(step: &str, name: &str) -> HashMap<String, String> {
    [
        ("PTRANSFORM".to_string(), step.to_string()),
        ("NAMESPACE".to_string(), "ns".to_string()),
        ("NAME".to_string(), name.to_string()),
    ]
    .into()
}

/// One bundle's MonitoringInfos: a user counter incremented by `count`, a
/// distribution of `values`, and a system counter that must not be
/// returned.
pub fn bundle_metrics(count: u64, values: &[u64]) -> Vec<MonitoringInfo> {
    let mut counter = Vec::new();
    varint(count, &mut counter);
    let mut dist = Vec::new();
    varint(values.len() as u64, &mut dist);
    varint(values.iter().sum(), &mut dist);
    varint(*values.iter().min().unwrap(), &mut dist);
    varint(*values.iter().max().unwrap(), &mut dist);
    vec![
        MonitoringInfo {
            urn: "beam:metric:user:sum_int64:v1".into(),
            r#type: "beam:metrics:sum_int64:v1".into(),
            payload: counter.clone(),
            labels: labels("ref_count1_5", "counter"),
            start_time: None,
        },
        MonitoringInfo {
            urn: "beam:metric:user:distribution_int64:v1".into(),
            r#type: "beam:metrics:distribution_int64:v1".into(),
            payload: dist,
            labels: labels("ref_dist_7", "distribution"),
            start_time: None,
        },
        MonitoringInfo {
            urn: "beam:metric:element_count:v1".into(),
            r#type: "beam:metrics:sum_int64:v1".into(),
            payload: counter,
            labels: [("PCOLLECTION".to_string(), "pc1".to_string())].into(),
            start_time: None,
        },
    ]
}

/// A running server.
pub struct Server {
    pub addr: SocketAddr,
    pub runner: Arc<TestRunner>,
    pub staging_dir: PathBuf,
    pub root: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<Result<(), JobServiceError>>>,
}

impl Server {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut JobServiceConfig)) -> Self {
        let root = tempfile::tempdir().unwrap();
        // Deep enough that `../../etc/x` from the staging dir would still be
        // inside the temp dir, where the test can look for it.
        let staging_dir = root.path().join("a").join("b").join("staging");
        let mut config = JobServiceConfig::new(&staging_dir);
        config.max_message_bytes = 64 * 1024 * 1024;
        tweak(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let runner = Arc::new(TestRunner::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(serve(
            listener,
            runner.clone() as Arc<dyn JobRunner>,
            config,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            addr,
            runner,
            staging_dir,
            root,
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    pub async fn jobs(&self) -> JobServiceClient<Channel> {
        JobServiceClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap()
    }

    pub async fn staging(&self, endpoint: &str) -> ArtifactStagingServiceClient<Channel> {
        ArtifactStagingServiceClient::connect(format!("http://{endpoint}"))
            .await
            .unwrap()
    }

    /// Stops the server and returns what `serve` returned.
    pub async fn shutdown(mut self) -> Result<(), JobServiceError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let handle = self.handle.take().unwrap();
        tokio::time::timeout(Duration::from_secs(10), handle)
            .await
            .expect("serve did not return after shutdown")
            .unwrap()
    }
}

pub fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

pub fn options(outcome: &str) -> Struct {
    Struct {
        fields: [
            (OUTCOME_OPTION.to_string(), string_value(outcome)),
            ("beam:option:job_name:v1".to_string(), string_value("test")),
        ]
        .into(),
    }
}

pub fn file_artifact(path: &str, staged_name: &str, sha256: &str) -> ArtifactInformation {
    ArtifactInformation {
        type_urn: urns::artifact::FILE.into(),
        type_payload: ArtifactFilePayload {
            path: path.into(),
            sha256: sha256.into(),
        }
        .encode_to_vec(),
        role_urn: urns::artifact::STAGING_TO.into(),
        role_payload: ArtifactStagingToRolePayload {
            staged_name: staged_name.into(),
        }
        .encode_to_vec(),
    }
}

/// A pipeline with one transform and the given environments' dependencies.
pub fn pipeline(envs: Vec<(&str, Vec<ArtifactInformation>)>, transform_urn: &str) -> Pipeline {
    let transform = PTransform {
        unique_name: "Outer/X".into(),
        spec: Some(refract_proto::pipeline::FunctionSpec {
            urn: transform_urn.into(),
            payload: vec![],
        }),
        ..Default::default()
    };
    Pipeline {
        components: Some(Components {
            transforms: [("ref_X_1".to_string(), transform)].into(),
            environments: envs
                .into_iter()
                .map(|(id, deps)| {
                    (
                        id.to_string(),
                        Environment {
                            urn: urns::env::EXTERNAL.into(),
                            dependencies: deps,
                            ..Default::default()
                        },
                    )
                })
                .collect(),
            ..Default::default()
        }),
        root_transform_ids: vec!["ref_X_1".into()],
        ..Default::default()
    }
}

pub fn prepare_request(pipeline: Pipeline, outcome: &str) -> PrepareJobRequest {
    PrepareJobRequest {
        pipeline: Some(pipeline),
        pipeline_options: Some(options(outcome)),
        job_name: "job".into(),
    }
}

/// What the client side of a staging session saw.
#[derive(Debug, Default)]
pub struct OfferLog {
    /// Paths of the artifacts the server asked for, in order.
    pub requested: Vec<String>,
}

/// The client side of the reverse retrieval protocol: answers the server's
/// `get_artifact` requests from `files` (path → bytes) in `chunk`-byte
/// pieces plus a separate `is_last` message, until the server closes the
/// stream. Fails the test if the server does not close it within 10 s.
pub async fn offer_artifacts(
    client: &mut ArtifactStagingServiceClient<Channel>,
    token: &str,
    files: &HashMap<String, Vec<u8>>,
    chunk: usize,
) -> Result<OfferLog, Status> {
    let (tx, rx) = mpsc::channel::<ArtifactResponseWrapper>(16);
    tx.send(ArtifactResponseWrapper {
        staging_token: token.to_string(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut requests: Streaming<_> = client
        .reverse_artifact_retrieval_service(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut log = OfferLog::default();
    let session = async {
        while let Some(request) = requests.message().await? {
            match request.request {
                Some(ArtifactRequest::GetArtifact(get)) => {
                    let artifact = get.artifact.unwrap();
                    let path = ArtifactFilePayload::decode(artifact.type_payload.as_slice())
                        .unwrap()
                        .path;
                    log.requested.push(path.clone());
                    let bytes = files
                        .get(&path)
                        .ok_or_else(|| Status::not_found(format!("no file {path}")))?;
                    for piece in bytes.chunks(chunk) {
                        let _ = tx
                            .send(ArtifactResponseWrapper {
                                response: Some(ArtifactResponse::GetArtifactResponse(
                                    GetArtifactResponse {
                                        data: piece.to_vec(),
                                    },
                                )),
                                ..Default::default()
                            })
                            .await;
                    }
                    let _ = tx
                        .send(ArtifactResponseWrapper {
                            is_last: true,
                            response: Some(ArtifactResponse::GetArtifactResponse(
                                GetArtifactResponse { data: vec![] },
                            )),
                            ..Default::default()
                        })
                        .await;
                }
                Some(ArtifactRequest::ResolveArtifact(resolve)) => {
                    let _ = tx
                        .send(ArtifactResponseWrapper {
                            response: Some(ArtifactResponse::ResolveArtifactResponse(
                                refract_proto::job_api::ResolveArtifactsResponse {
                                    replacements: resolve.artifacts,
                                },
                            )),
                            ..Default::default()
                        })
                        .await;
                }
                None => return Err(Status::internal("empty request from server")),
            }
        }
        Ok::<(), Status>(())
    };
    tokio::time::timeout(Duration::from_secs(10), session)
        .await
        .expect("the server did not close the staging stream")?;
    drop(tx);
    Ok(log)
}

/// Prepares a one-impulse job whose fake runner ends it with `outcome`
/// (see [`options`]) and returns its id.
pub async fn prepare_impulse_job(jobs: &mut JobServiceClient<Channel>, outcome: &str) -> String {
    jobs.prepare(prepare_request(
        pipeline(vec![], "beam:transform:impulse:v1"),
        outcome,
    ))
    .await
    .unwrap()
    .into_inner()
    .preparation_id
}

/// Runs a prepared job and returns the states it went through, up to the
/// terminal one.
pub async fn run_to_end(jobs: &mut JobServiceClient<Channel>, id: &str) -> Vec<State> {
    let mut states = open_state_stream(jobs, id).await;
    run_prepared(jobs, id).await;
    read_states(&mut states).await
}

/// Subscribes to a job's state stream (with no deadline).
pub async fn open_state_stream(
    jobs: &mut JobServiceClient<Channel>,
    id: &str,
) -> Streaming<refract_proto::job_api::JobStateEvent> {
    jobs.get_state_stream(refract_proto::job_api::GetJobStateRequest {
        job_id: id.to_string(),
    })
    .await
    .unwrap()
    .into_inner()
}

/// Subscribes to a job's message stream (with no deadline).
pub async fn open_message_stream(
    jobs: &mut JobServiceClient<Channel>,
    id: &str,
) -> Streaming<JobMessagesResponse> {
    jobs.get_message_stream(refract_proto::job_api::JobMessagesRequest {
        job_id: id.to_string(),
    })
    .await
    .unwrap()
    .into_inner()
}

/// Runs a prepared job.
pub async fn run_prepared(jobs: &mut JobServiceClient<Channel>, id: &str) {
    jobs.run(refract_proto::job_api::RunJobRequest {
        preparation_id: id.to_string(),
        ..Default::default()
    })
    .await
    .unwrap();
}

/// The states a state stream sends to its end, which must come right after
/// a terminal state (failing the test after 10 s).
pub async fn read_states(
    stream: &mut Streaming<refract_proto::job_api::JobStateEvent>,
) -> Vec<State> {
    let mut states = Vec::new();
    let read = async {
        while let Some(event) = stream.message().await.expect("a state event") {
            assert!(
                !states
                    .last()
                    .is_some_and(|s| refract_jobservice::is_terminal(*s)),
                "a state after the terminal one: {states:?} then {:?}",
                event.state()
            );
            states.push(event.state());
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the state stream did not end within 10 s");
    assert!(
        states
            .last()
            .is_some_and(|s| refract_jobservice::is_terminal(*s)),
        "the state stream ended before a terminal state: {states:?}"
    );
    states
}

/// Subscribes to a job's state stream and reads it to its end.
pub async fn states_to_end(
    jobs: &mut JobServiceClient<Channel>,
    request: impl refract_proto::tonic::IntoRequest<refract_proto::job_api::GetJobStateRequest>,
) -> Vec<State> {
    let mut states = jobs.get_state_stream(request).await.unwrap().into_inner();
    read_states(&mut states).await
}

/// Subscribes to a job's message stream and reads it to its end, rendered by
/// [`describe_messages`].
pub async fn messages_to_end(jobs: &mut JobServiceClient<Channel>, id: &str) -> Vec<String> {
    let mut messages = open_message_stream(jobs, id).await;
    describe_messages(&drain(&mut messages).await.unwrap())
}

/// Reads a stream to its end (failing the test after 10 s).
pub async fn drain<T>(stream: &mut Streaming<T>) -> Result<Vec<T>, Status>
where
    T: Message + Default,
{
    let mut out = Vec::new();
    let read = async {
        while let Some(item) = stream.message().await? {
            out.push(item);
        }
        Ok::<(), Status>(())
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("stream did not end")?;
    Ok(out)
}

/// A compact rendering of a message stream for assertions.
pub fn describe_messages(items: &[JobMessagesResponse]) -> Vec<String> {
    use refract_proto::job_api::job_messages_response::Response;
    items
        .iter()
        .map(|item| match item.response.as_ref().unwrap() {
            Response::MessageResponse(m) => format!(
                "{:?}: {}",
                m.importance(),
                m.message_text.lines().last().unwrap_or("")
            ),
            Response::StateResponse(s) => format!("state {:?}", s.state()),
        })
        .collect()
}
