//! `JobService`: the Job API methods, translating between gRPC and [`Job`].

use std::sync::Arc;

use futures::stream::BoxStream;
use refract_proto::job_api::job_service_server::JobService;
use refract_proto::job_api::{
    CancelJobRequest, CancelJobResponse, DescribePipelineOptionsRequest,
    DescribePipelineOptionsResponse, DrainJobRequest, DrainJobResponse, GetJobMetricsRequest,
    GetJobMetricsResponse, GetJobPipelineRequest, GetJobPipelineResponse, GetJobStateRequest,
    GetJobsRequest, GetJobsResponse, JobInfo, JobMessagesRequest, JobMessagesResponse,
    JobStateEvent, PipelineOptionDescriptor, PrepareJobRequest, PrepareJobResponse, RunJobRequest,
    RunJobResponse,
};
use refract_proto::pipeline::ApiServiceDescriptor;
use refract_proto::prost::Message;
use refract_proto::tonic::{self, Request, Response, Status};
use tokio::sync::watch;

use crate::job::{Job, StagingStatus};
use crate::registry::JobRegistry;
use crate::streams::{message_stream, state_stream};
use crate::JobRunner;
use crate::JobState;

/// Job name used when a client sends none.
const DEFAULT_JOB_NAME: &str = "job";

/// Longest job name accepted, in bytes: names are shown in every list of
/// jobs (`GetJobs`, `refract jobs`, the UI), so one huge name would make
/// each of them fail or crawl.
const MAX_JOB_NAME_BYTES: usize = 1024;

/// The Job API implementation.
pub(crate) struct JobServiceImpl {
    registry: Arc<JobRegistry>,
    runner: Arc<dyn JobRunner>,
    /// `host:port` clients should stage artifacts to (this server).
    staging_endpoint: String,
    pipeline_options: Vec<PipelineOptionDescriptor>,
    shutdown: watch::Receiver<bool>,
}

impl JobServiceImpl {
    pub(crate) fn new(
        registry: Arc<JobRegistry>,
        runner: Arc<dyn JobRunner>,
        staging_endpoint: String,
        pipeline_options: Vec<PipelineOptionDescriptor>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            registry,
            runner,
            staging_endpoint,
            pipeline_options,
            shutdown,
        }
    }

    // Handlers must return `Status` by value (tonic's signature), so boxing
    // it here would only move the allocation.
    #[allow(clippy::result_large_err)]
    fn job(&self, method: &str, id: &str) -> Result<Arc<Job>, Status> {
        self.registry
            .get(id)
            .ok_or_else(|| reject(method, Status::not_found(format!("no job with id {id:?}"))))
    }

    /// The job a state or message subscription follows, refusing one that
    /// would end in the middle of the job.
    ///
    /// Python's `PortableRunner` opens both streams before `Run`, with its
    /// `--job_server_timeout` (300 s by default) as their deadline, and only
    /// if that fails opens them again after `Run` without one. Accepting the
    /// first pair would make every job longer than the timeout fail in the
    /// client with `DEADLINE_EXCEEDED` while it still runs here; refusing it
    /// costs one round trip and loses nothing, because the message stream
    /// replays the job's history and the state stream starts with the
    /// current state. A subscription without a deadline, or one opened after
    /// `Run`, is the client's own choice and is served. Beam's Python job
    /// server and Prism serve the deadlined one too, and so fail every job
    /// that outlives the timeout in the client (Beam issue 35867).
    #[allow(clippy::result_large_err)]
    fn subscribed_job<T: HasJobId>(
        &self,
        method: &str,
        request: Request<T>,
    ) -> Result<Arc<Job>, Status> {
        let has_deadline = request.metadata().contains_key(GRPC_TIMEOUT_HEADER);
        let job = self.job(method, request.get_ref().job_id())?;
        if has_deadline && job.state() == JobState::Stopped {
            // Every Python submission asks this: the normal path, so not
            // logged as a refusal.
            tracing::debug!(method, job_id = %job.id(), "deadlined subscription before Run refused");
            return Err(Status::failed_precondition(format!(
                "job {:?} has not been run yet: a subscription opened before Run with a \
                 deadline would end while the job runs; subscribe after Run",
                job.id()
            )));
        }
        Ok(job)
    }
}

/// Most bytes of jobs one `GetJobs` answer lists: under the 4 MiB that
/// gRPC clients accept by default.
const GET_JOBS_MAX_BYTES: usize = 3 << 20;

/// The header carrying a gRPC call's deadline (`grpc-timeout`), set by
/// clients that pass a timeout.
const GRPC_TIMEOUT_HEADER: &str = "grpc-timeout";

/// The two subscription requests, which name their job the same way.
trait HasJobId {
    fn job_id(&self) -> &str;
}

impl HasJobId for GetJobStateRequest {
    fn job_id(&self) -> &str {
        &self.job_id
    }
}

impl HasJobId for JobMessagesRequest {
    fn job_id(&self) -> &str {
        &self.job_id
    }
}

/// Logs a refused request and passes its status through.
fn reject(method: &str, status: Status) -> Status {
    tracing::info!(method, code = ?status.code(), message = status.message(), "rejected job service request");
    status
}

#[tonic::async_trait]
impl JobService for JobServiceImpl {
    async fn prepare(
        &self,
        request: Request<PrepareJobRequest>,
    ) -> Result<Response<PrepareJobResponse>, Status> {
        let request = request.into_inner();
        let Some(pipeline) = request.pipeline else {
            return Err(reject(
                "Prepare",
                Status::invalid_argument("PrepareJobRequest has no pipeline"),
            ));
        };
        if request.job_name.len() > MAX_JOB_NAME_BYTES {
            return Err(reject(
                "Prepare",
                Status::invalid_argument(format!(
                    "the job name is {} bytes long; at most {MAX_JOB_NAME_BYTES} are accepted",
                    request.job_name.len()
                )),
            ));
        }
        let options = request.pipeline_options.unwrap_or_default();
        let name = if request.job_name.is_empty() {
            DEFAULT_JOB_NAME.to_string()
        } else {
            request.job_name
        };

        // Validation may plan the whole pipeline: keep it off the reactor.
        // This call holds a planning turn, taken before its request was
        // read (`crate::decode_gate`), so only a few run at once.
        let runner = Arc::clone(&self.runner);
        let mut live = self.registry.all();
        live.retain(|j| !crate::is_terminal(j.state()));
        let (pipeline, options, verdict) = tokio::task::spawn_blocking(move || {
            let verdict = runner
                .validate(&pipeline, &options)
                .and_then(|()| runner.replaced_job(&live, &pipeline, &options));
            (pipeline, options, verdict)
        })
        .await
        .map_err(|e| {
            reject(
                "Prepare",
                Status::internal(format!("pipeline validation crashed: {e}")),
            )
        })?;
        let replaced = match verdict {
            Ok(replaced) => replaced,
            Err(text) => return Err(reject("Prepare", Status::invalid_argument(text))),
        };

        let job = self.registry.create(name, pipeline, options);
        tracing::info!(job_id = %job.id(), name = %job.name(), "prepared job");
        if let Some(old) = replaced {
            tracing::info!(job_id = %job.id(), replaces = %old.id(), "prepared an update");
            job.set_replaces(old);
        }
        Ok(Response::new(PrepareJobResponse {
            preparation_id: job.id().to_string(),
            artifact_staging_endpoint: Some(ApiServiceDescriptor {
                url: self.staging_endpoint.clone(),
                ..Default::default()
            }),
            staging_session_token: job.id().to_string(),
        }))
    }

    async fn run(
        &self,
        request: Request<RunJobRequest>,
    ) -> Result<Response<RunJobResponse>, Status> {
        let id = request.into_inner().preparation_id;
        let job = self.job("Run", &id)?;

        // A transfer still in flight finishes first, so the runner sees every
        // staged file.
        let mut staging = job.watch_staging();
        let status = staging
            .wait_for(|s| *s != StagingStatus::InProgress)
            .await
            .map(|s| s.clone())
            .unwrap_or(StagingStatus::NotStarted);
        match status {
            StagingStatus::Failed(text) => {
                return Err(reject("Run", Status::failed_precondition(text)))
            }
            StagingStatus::NotStarted if !job.artifacts().pending().is_empty() => {
                tracing::warn!(job_id = %id, "running a job whose dependencies were never staged");
            }
            _ => {}
        }

        if job.state() == JobState::Failed && self.runner.resumable(&job) {
            // Run of a failed durable job starts it again from its
            // checkpoint, as `refract resume` does.
            crate::admin::resume(&self.registry, &self.runner, &job)
                .map_err(|status| reject("Run", status))?;
            return Ok(Response::new(RunJobResponse { job_id: id }));
        }
        if let Err(state) = job.begin_run() {
            return Err(reject(
                "Run",
                Status::failed_precondition(format!(
                    "job {id} is {state:?}; only a prepared (STOPPED) job can be run"
                )),
            ));
        }
        let runner = Arc::clone(&self.runner);
        let started = Arc::clone(&job);
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || runner.start(started)))
            .is_err()
        {
            job.fail("the runner crashed while starting the job");
        }
        Ok(Response::new(RunJobResponse { job_id: id }))
    }

    /// Every job, oldest first — or, when they would not fit in a message
    /// a client takes by default (4 MiB), the newest that do (the rest is
    /// listed a page at a time by `RefractAdmin.ListJobs`).
    async fn get_jobs(
        &self,
        _request: Request<GetJobsRequest>,
    ) -> Result<Response<GetJobsResponse>, Status> {
        let mut job_info = Vec::new();
        let mut bytes = 0usize;
        let all = self.registry.all();
        for job in all.iter().rev() {
            let info = JobInfo {
                job_id: job.id().to_string(),
                job_name: job.name().to_string(),
                pipeline_options: Some(crate::redact::redact_options(job.options())),
                state: job.state() as i32,
            };
            bytes += info.encoded_len() + 8;
            if bytes > GET_JOBS_MAX_BYTES {
                tracing::info!(
                    listed = job_info.len(),
                    jobs = all.len(),
                    "GetJobs lists the newest jobs only: all would not fit in 4 MiB"
                );
                break;
            }
            job_info.push(info);
        }
        job_info.reverse();
        Ok(Response::new(GetJobsResponse { job_info }))
    }

    async fn get_state(
        &self,
        request: Request<GetJobStateRequest>,
    ) -> Result<Response<JobStateEvent>, Status> {
        let job = self.job("GetState", &request.into_inner().job_id)?;
        Ok(Response::new(job.state_event()))
    }

    async fn get_pipeline(
        &self,
        request: Request<GetJobPipelineRequest>,
    ) -> Result<Response<GetJobPipelineResponse>, Status> {
        let job = self.job("GetPipeline", &request.into_inner().job_id)?;
        Ok(Response::new(GetJobPipelineResponse {
            pipeline: Some(job.pipeline().clone()),
        }))
    }

    async fn cancel(
        &self,
        request: Request<CancelJobRequest>,
    ) -> Result<Response<CancelJobResponse>, Status> {
        let job = self.job("Cancel", &request.into_inner().job_id)?;
        let state = job.request_cancel();
        tracing::info!(job_id = %job.id(), ?state, "cancel requested");
        Ok(Response::new(CancelJobResponse {
            state: state as i32,
        }))
    }

    async fn drain(
        &self,
        request: Request<DrainJobRequest>,
    ) -> Result<Response<DrainJobResponse>, Status> {
        let job = self.job("Drain", &request.into_inner().job_id)?;
        let state = job.request_drain();
        if state != JobState::Draining {
            return Err(reject(
                "Drain",
                Status::failed_precondition(format!(
                    "job {} is {state:?}; only a starting or running job can be drained",
                    job.id()
                )),
            ));
        }
        tracing::info!(job_id = %job.id(), "drain requested");
        Ok(Response::new(DrainJobResponse {
            state: state as i32,
        }))
    }

    type GetStateStreamStream = BoxStream<'static, Result<JobStateEvent, Status>>;

    async fn get_state_stream(
        &self,
        request: Request<GetJobStateRequest>,
    ) -> Result<Response<Self::GetStateStreamStream>, Status> {
        let job = self.subscribed_job("GetStateStream", request)?;
        Ok(Response::new(state_stream(job, self.shutdown.clone())))
    }

    type GetMessageStreamStream = BoxStream<'static, Result<JobMessagesResponse, Status>>;

    async fn get_message_stream(
        &self,
        request: Request<JobMessagesRequest>,
    ) -> Result<Response<Self::GetMessageStreamStream>, Status> {
        let job = self.subscribed_job("GetMessageStream", request)?;
        Ok(Response::new(message_stream(job, self.shutdown.clone())))
    }

    async fn get_job_metrics(
        &self,
        request: Request<GetJobMetricsRequest>,
    ) -> Result<Response<GetJobMetricsResponse>, Status> {
        let job = self.job("GetJobMetrics", &request.into_inner().job_id)?;
        Ok(Response::new(GetJobMetricsResponse {
            metrics: Some(job.metrics().snapshot()),
        }))
    }

    async fn describe_pipeline_options(
        &self,
        _request: Request<DescribePipelineOptionsRequest>,
    ) -> Result<Response<DescribePipelineOptionsResponse>, Status> {
        Ok(Response::new(DescribePipelineOptionsResponse {
            options: self.pipeline_options.clone(),
        }))
    }
}
