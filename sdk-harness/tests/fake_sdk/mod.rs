//! A scriptable, in-process fake SDK harness and worker pool, speaking the Fn
//! API over real gRPC through the generated tonic clients. It drives the
//! protocol from the SDK's side so the tests can check the runner's side; it
//! is not an SDK.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prost::Message;
use refract_proto::fn_api::beam_fn_control_client::BeamFnControlClient;
use refract_proto::fn_api::beam_fn_data_client::BeamFnDataClient;
use refract_proto::fn_api::beam_fn_external_worker_pool_server::{
    BeamFnExternalWorkerPool, BeamFnExternalWorkerPoolServer,
};
use refract_proto::fn_api::beam_fn_logging_client::BeamFnLoggingClient;
use refract_proto::fn_api::beam_fn_state_client::BeamFnStateClient;
use refract_proto::fn_api::{
    elements, instruction_response, log_entry, Elements, GetProcessBundleDescriptorRequest,
    InstructionRequest, InstructionResponse, LogEntry, ProcessBundleDescriptor,
    ProcessBundleResponse, StartWorkerRequest, StartWorkerResponse, StateRequest, StateResponse,
    StopWorkerRequest, StopWorkerResponse,
};
use refract_proto::pipeline::{ApiServiceDescriptor, Environment, ExternalPayload};
use refract_sdk_harness::{
    FnApiServer, LogSink, NoArtifacts, StateHandler, Worker, WorkerConfig, WORKER_ID_HEADER,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

/// Longest a test waits for anything.
pub const WAIT: Duration = Duration::from_secs(20);

/// Awaits `f` or panics after [`WAIT`].
pub async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Adds the worker id header, as the SDK's interceptor does.
pub fn with_worker_id<T>(worker_id: &str, message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        WORKER_ID_HEADER,
        worker_id.parse().expect("ascii worker id"),
    );
    request
}

/// A connected fake SDK harness.
pub struct FakeSdk {
    pub worker_id: String,
    channel: Channel,
    responses: Option<mpsc::UnboundedSender<InstructionResponse>>,
    instructions: Streaming<InstructionRequest>,
}

impl FakeSdk {
    /// Connects the Control stream, as an SDK does first.
    pub async fn connect(url: &str, worker_id: &str) -> Result<FakeSdk, Status> {
        let channel = Channel::from_shared(format!("http://{url}"))
            .map_err(|e| Status::internal(e.to_string()))?
            .connect()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let (responses, rx) = mpsc::unbounded_channel();
        let instructions = BeamFnControlClient::new(channel.clone())
            .control(with_worker_id(worker_id, UnboundedReceiverStream::new(rx)))
            .await?
            .into_inner();
        Ok(FakeSdk {
            worker_id: worker_id.to_string(),
            channel,
            responses: Some(responses),
            instructions,
        })
    }

    /// The next instruction from the runner.
    pub async fn next_instruction(&mut self) -> InstructionRequest {
        within("an instruction", self.instructions.message())
            .await
            .expect("control stream failed")
            .expect("control stream ended")
    }

    /// Whether the runner ended the control stream.
    pub async fn control_ended(&mut self) -> bool {
        matches!(
            within("the control stream to end", self.instructions.message()).await,
            Ok(None) | Err(_)
        )
    }

    /// Sends a response on the control stream.
    pub fn respond(&self, response: InstructionResponse) {
        self.responses
            .as_ref()
            .expect("control stream open")
            .send(response)
            .expect("control stream open");
    }

    /// Sends a successful process-bundle response.
    pub fn bundle_done(&self, instruction_id: &str, response: ProcessBundleResponse) {
        self.respond(InstructionResponse {
            instruction_id: instruction_id.to_string(),
            error: String::new(),
            response: Some(instruction_response::Response::ProcessBundle(response)),
        });
    }

    /// Fetches a descriptor, as the SDK does for an unknown id.
    pub async fn descriptor(&self, id: &str) -> Result<ProcessBundleDescriptor, Status> {
        BeamFnControlClient::new(self.channel.clone())
            .get_process_bundle_descriptor(with_worker_id(
                &self.worker_id,
                GetProcessBundleDescriptorRequest {
                    process_bundle_descriptor_id: id.to_string(),
                },
            ))
            .await
            .map(Response::into_inner)
    }

    /// Opens the Data stream (the SDK does so lazily, after a ProcessBundleRequest).
    pub async fn open_data(&self) -> FakeData {
        let (tx, rx) = mpsc::unbounded_channel();
        let incoming = BeamFnDataClient::new(self.channel.clone())
            .max_decoding_message_size(usize::MAX)
            .data(with_worker_id(
                &self.worker_id,
                UnboundedReceiverStream::new(rx),
            ))
            .await
            .expect("data stream")
            .into_inner();
        FakeData { tx, incoming }
    }

    /// Opens the State stream.
    pub async fn open_state(&self) -> FakeState {
        let (tx, rx) = mpsc::unbounded_channel();
        let incoming = BeamFnStateClient::new(self.channel.clone())
            .state(with_worker_id(
                &self.worker_id,
                UnboundedReceiverStream::new(rx),
            ))
            .await
            .expect("state stream")
            .into_inner();
        FakeState { tx, incoming }
    }

    /// Opens the Logging stream; send lists through the returned sender.
    pub async fn open_logging(&self) -> mpsc::UnboundedSender<log_entry::List> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut incoming = BeamFnLoggingClient::new(self.channel.clone())
            .logging(with_worker_id(
                &self.worker_id,
                UnboundedReceiverStream::new(rx),
            ))
            .await
            .expect("logging stream")
            .into_inner();
        tokio::spawn(async move { while let Ok(Some(_)) = incoming.message().await {} });
        tx
    }

    /// Drops the control stream, as a crashing SDK would.
    pub fn crash(mut self) {
        self.responses.take();
        drop(self);
    }
}

/// The SDK's end of a Data stream.
pub struct FakeData {
    tx: mpsc::UnboundedSender<Elements>,
    incoming: Streaming<Elements>,
}

impl FakeData {
    /// Sends one Elements message.
    pub fn send(&self, elements: Elements) {
        self.tx.send(elements).expect("data stream open");
    }

    /// Sends output bytes for a sink (not last).
    pub fn send_data(&self, instruction_id: &str, transform_id: &str, bytes: &[u8]) {
        self.send(Elements {
            data: vec![data(instruction_id, transform_id, bytes, false)],
            timers: vec![],
        });
    }

    /// Sends the separate, empty is_last for a sink.
    pub fn close_sink(&self, instruction_id: &str, transform_id: &str) {
        self.send(Elements {
            data: vec![data(instruction_id, transform_id, b"", true)],
            timers: vec![],
        });
    }

    /// The next message from the runner.
    pub async fn recv(&mut self) -> Elements {
        within("data from the runner", self.incoming.message())
            .await
            .expect("data stream failed")
            .expect("data stream ended")
    }

    /// Reads until every source of `instruction_id` in `sources` and every
    /// timer family in `families` got its is_last; returns all entries seen.
    pub async fn recv_input(
        &mut self,
        instruction_id: &str,
        sources: &[&str],
        families: &[(&str, &str)],
    ) -> (Vec<elements::Data>, Vec<elements::Timers>) {
        let mut open_sources: Vec<String> = sources.iter().map(|s| s.to_string()).collect();
        let mut open_families: Vec<(String, String)> = families
            .iter()
            .map(|(t, f)| (t.to_string(), f.to_string()))
            .collect();
        let mut data = Vec::new();
        let mut timers = Vec::new();
        while !open_sources.is_empty() || !open_families.is_empty() {
            let message = self.recv().await;
            for d in message.data {
                if d.instruction_id != instruction_id {
                    continue;
                }
                if d.is_last {
                    open_sources.retain(|s| *s != d.transform_id);
                }
                data.push(d);
            }
            for t in message.timers {
                if t.instruction_id != instruction_id {
                    continue;
                }
                if t.is_last {
                    open_families
                        .retain(|(tr, f)| !(*tr == t.transform_id && *f == t.timer_family_id));
                }
                timers.push(t);
            }
        }
        (data, timers)
    }
}

/// One Data entry.
pub fn data(
    instruction_id: &str,
    transform_id: &str,
    bytes: &[u8],
    is_last: bool,
) -> elements::Data {
    elements::Data {
        instruction_id: instruction_id.to_string(),
        transform_id: transform_id.to_string(),
        data: bytes.to_vec(),
        is_last,
    }
}

/// One Timers entry.
pub fn timers(
    instruction_id: &str,
    transform_id: &str,
    family: &str,
    bytes: &[u8],
    is_last: bool,
) -> elements::Timers {
    elements::Timers {
        instruction_id: instruction_id.to_string(),
        transform_id: transform_id.to_string(),
        timer_family_id: family.to_string(),
        timers: bytes.to_vec(),
        is_last,
    }
}

/// The SDK's end of a State stream.
pub struct FakeState {
    tx: mpsc::UnboundedSender<StateRequest>,
    incoming: Streaming<StateResponse>,
}

impl FakeState {
    /// Sends a request (pipelined; does not wait).
    pub fn send(&self, request: StateRequest) {
        self.tx.send(request).expect("state stream open");
    }

    /// Whether the runner ended the stream (within the test timeout), while
    /// this side keeps it open.
    pub async fn ended_by_runner(&mut self) -> bool {
        matches!(
            within("the state stream's end", self.incoming.message()).await,
            Ok(None) | Err(_)
        )
    }

    /// The next response.
    pub async fn recv(&mut self) -> StateResponse {
        within("a state response", self.incoming.message())
            .await
            .expect("state stream failed")
            .expect("state stream ended")
    }
}

/// How the fake pool answers StartWorker.
#[derive(Clone)]
pub enum PoolMode {
    /// Connect a fake SDK to the control endpoint, then answer OK.
    Connect,
    /// Answer with this error text, as Python's pool does on failure.
    Fail(String),
    /// Answer OK but never connect.
    Ignore,
}

struct PoolService {
    mode: PoolMode,
    sdks: mpsc::UnboundedSender<FakeSdk>,
    starts: mpsc::UnboundedSender<StartWorkerRequest>,
    stops: mpsc::UnboundedSender<String>,
}

#[tonic::async_trait]
impl BeamFnExternalWorkerPool for PoolService {
    async fn start_worker(
        &self,
        request: Request<StartWorkerRequest>,
    ) -> Result<Response<StartWorkerResponse>, Status> {
        let request = request.into_inner();
        let _ = self.starts.send(request.clone());
        match &self.mode {
            PoolMode::Connect => {
                let url = request
                    .control_endpoint
                    .as_ref()
                    .map(|e| e.url.clone())
                    .unwrap_or_default();
                let sdk = FakeSdk::connect(&url, &request.worker_id).await?;
                let _ = self.sdks.send(sdk);
                Ok(Response::new(StartWorkerResponse::default()))
            }
            PoolMode::Fail(error) => Ok(Response::new(StartWorkerResponse {
                error: error.clone(),
            })),
            PoolMode::Ignore => Ok(Response::new(StartWorkerResponse::default())),
        }
    }

    async fn stop_worker(
        &self,
        request: Request<StopWorkerRequest>,
    ) -> Result<Response<StopWorkerResponse>, Status> {
        let _ = self.stops.send(request.into_inner().worker_id);
        Ok(Response::new(StopWorkerResponse::default()))
    }
}

/// A fake BeamFnExternalWorkerPool.
pub struct FakePool {
    pub url: String,
    pub sdks: mpsc::UnboundedReceiver<FakeSdk>,
    pub starts: mpsc::UnboundedReceiver<StartWorkerRequest>,
    pub stops: mpsc::UnboundedReceiver<String>,
}

impl FakePool {
    /// Serves a pool on a free local port.
    pub async fn start(mode: PoolMode) -> FakePool {
        Self::start_at("127.0.0.1:0", mode).await
    }

    /// Serves a pool at `address`: a pool that comes up after a job
    /// pointing at it was submitted.
    pub async fn start_at(address: &str, mode: PoolMode) -> FakePool {
        let listener = TcpListener::bind(address).await.expect("bind pool");
        let url = listener.local_addr().expect("pool address").to_string();
        let (sdks_tx, sdks) = mpsc::unbounded_channel();
        let (starts_tx, starts) = mpsc::unbounded_channel();
        let (stops_tx, stops) = mpsc::unbounded_channel();
        let service = PoolService {
            mode,
            sdks: sdks_tx,
            starts: starts_tx,
            stops: stops_tx,
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(BeamFnExternalWorkerPoolServer::new(service))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        FakePool {
            url,
            sdks,
            starts,
            stops,
        }
    }

    /// An EXTERNAL environment pointing at this pool.
    pub fn environment(&self) -> Environment {
        Environment {
            urn: "beam:env:external:v1".to_string(),
            payload: ExternalPayload {
                endpoint: Some(ApiServiceDescriptor {
                    url: self.url.clone(),
                    authentication: None,
                }),
                params: [("mode".to_string(), "fake".to_string())].into(),
            }
            .encode_to_vec(),
            ..Default::default()
        }
    }
}

/// Collects log entries.
#[derive(Default)]
pub struct CollectedLogs {
    pub entries: Mutex<Vec<(String, LogEntry)>>,
}

impl LogSink for CollectedLogs {
    fn log(&self, worker_id: &str, entry: LogEntry) {
        self.entries.lock().push((worker_id.to_string(), entry));
    }
}

/// A state handler that records requests and answers gets with
/// `value-<state key's user_state_id>`; it leaves ids empty on appends so the
/// harness must fill them in.
#[derive(Default)]
pub struct RecordingState {
    pub seen: Mutex<Vec<StateRequest>>,
}

impl StateHandler for RecordingState {
    fn handle(&self, request: &StateRequest) -> StateResponse {
        use refract_proto::fn_api::{
            state_request, state_response, StateAppendResponse, StateClearResponse,
            StateGetResponse,
        };
        self.seen.lock().push(request.clone());
        let response = match &request.request {
            Some(state_request::Request::Get(_)) => {
                return StateResponse {
                    id: request.id.clone(),
                    error: String::new(),
                    response: Some(state_response::Response::Get(StateGetResponse {
                        continuation_token: vec![],
                        data: format!("value-for-{}", request.id).into_bytes(),
                    })),
                }
            }
            Some(state_request::Request::Append(_)) => {
                state_response::Response::Append(StateAppendResponse {})
            }
            Some(state_request::Request::Clear(_)) => {
                state_response::Response::Clear(StateClearResponse {})
            }
            None => {
                return StateResponse {
                    id: String::new(),
                    error: "empty request".to_string(),
                    response: None,
                }
            }
        };
        StateResponse {
            id: String::new(),
            error: String::new(),
            response: Some(response),
        }
    }
}

/// A server, a pool, one started worker and its fake SDK.
pub struct Setup {
    pub server: Arc<FnApiServer>,
    pub pool: FakePool,
    pub worker: Arc<Worker>,
    pub sdk: FakeSdk,
    pub logs: Arc<CollectedLogs>,
}

/// Starts everything with a connecting pool.
pub async fn setup(worker_id: &str) -> Setup {
    let server = FnApiServer::start("127.0.0.1").await.expect("server");
    let mut pool = FakePool::start(PoolMode::Connect).await;
    let logs = Arc::new(CollectedLogs::default());
    let worker = within(
        "start_worker",
        server.start_worker(WorkerConfig {
            worker_id: worker_id.to_string(),
            environment: pool.environment(),
            provision: Default::default(),
            artifacts: Arc::new(NoArtifacts),
            logs: logs.clone(),
        }),
    )
    .await
    .expect("worker starts");
    let sdk = within("the fake SDK", pool.sdks.recv())
        .await
        .expect("pool connected an SDK");
    Setup {
        server,
        pool,
        worker,
        sdk,
        logs,
    }
}
