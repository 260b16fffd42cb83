//! `RefractAdmin`: Refract's own calls beside Beam's Job API (the proto in
//! `proto/refract/admin/v1/admin.proto`): which server answers, jobs a page
//! at a time, one job's checkpoints and failure, resuming a failed durable
//! job, deleting an ended one; the remote worker pools.

use std::sync::Arc;

use refract_proto::admin::refract_admin_server::RefractAdmin;
use refract_proto::admin::{
    AddPoolRequest, AddPoolResponse, DeleteJobRequest, DeleteJobResponse, DescribeJobRequest,
    GetServerInfoRequest, JobDescription, JobSummary, ListJobsRequest, ListJobsResponse,
    ListPoolsRequest, ListPoolsResponse, RemovePoolRequest, RemovePoolResponse, RescaleJobRequest,
    RescaleJobResponse, ResumeJobRequest, ResumeJobResponse, ServerInfo,
};
use refract_proto::tonic::{self, Request, Response, Status};

use crate::registry::JobRegistry;
use crate::{is_terminal, JobRunner, JobState, RescaleError};

/// Jobs in one `ListJobs` page unless it asks for fewer.
const DEFAULT_PAGE: usize = 100;
/// Jobs in one `ListJobs` page at most.
const MAX_PAGE: usize = 1_000;

/// What `GetServerInfo` calls this server.
pub const SERVER_NAME: &str = "refract";

/// The admin service; shares the job table with the job service.
pub(crate) struct AdminService {
    registry: Arc<JobRegistry>,
    runner: Arc<dyn JobRunner>,
}

impl AdminService {
    pub(crate) fn new(registry: Arc<JobRegistry>, runner: Arc<dyn JobRunner>) -> Self {
        AdminService { registry, runner }
    }

    #[allow(clippy::result_large_err)]
    fn job(&self, id: &str) -> Result<Arc<crate::Job>, Status> {
        self.registry
            .get(id)
            .ok_or_else(|| Status::not_found(format!("no job with id {id:?}")))
    }
}

/// Starts failed durable job `id` again from its checkpoint, under its id.
/// Shared by `ResumeJob` and the Job API's `Run` of a failed job.
#[allow(clippy::result_large_err)]
pub(crate) fn resume(
    registry: &JobRegistry,
    runner: &Arc<dyn JobRunner>,
    job: &crate::Job,
) -> Result<Arc<crate::Job>, Status> {
    if job.state() != JobState::Failed {
        return Err(Status::failed_precondition(format!(
            "job {} is {:?}; only a failed job can be resumed",
            job.id(),
            job.state()
        )));
    }
    if !runner.resumable(job) {
        return Err(Status::failed_precondition(format!(
            "job {} cannot be resumed: it has no record and checkpoint in a state directory \
             (start the server with --state_dir to keep jobs durably)",
            job.id()
        )));
    }
    let Some(renewed) = registry.renew(job) else {
        return Err(Status::failed_precondition(format!(
            "job {} was resumed or deleted meanwhile",
            job.id()
        )));
    };
    if let Err(state) = renewed.begin_run() {
        return Err(Status::failed_precondition(format!(
            "job {} is {state:?} and cannot start",
            job.id()
        )));
    }
    tracing::info!(job_id = %renewed.id(), "resuming a failed job from its checkpoint");
    runner.start(Arc::clone(&renewed));
    Ok(renewed)
}

#[tonic::async_trait]
impl RefractAdmin for AdminService {
    async fn get_server_info(
        &self,
        _request: Request<GetServerInfoRequest>,
    ) -> Result<Response<ServerInfo>, Status> {
        Ok(Response::new(ServerInfo {
            name: SERVER_NAME.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            durable: self.runner.durable(),
        }))
    }

    async fn list_jobs(
        &self,
        request: Request<ListJobsRequest>,
    ) -> Result<Response<ListJobsResponse>, Status> {
        let request = request.into_inner();
        let size = match request.page_size {
            0 => DEFAULT_PAGE,
            n => usize::try_from(n).unwrap_or(MAX_PAGE).min(MAX_PAGE),
        };
        let before = if request.page_token.is_empty() {
            None
        } else {
            Some(request.page_token.parse::<u64>().map_err(|_| {
                Status::invalid_argument(format!(
                    "page_token {:?} is not one this server handed out",
                    request.page_token
                ))
            })?)
        };
        let (jobs, next) = self.registry.page(before, size);
        Ok(Response::new(ListJobsResponse {
            jobs: jobs
                .iter()
                .map(|job| JobSummary {
                    job_id: job.id().to_string(),
                    job_name: job.name().to_string(),
                    state: job.state() as i32,
                    replaces: job
                        .replaces()
                        .map(|j| j.id().to_string())
                        .unwrap_or_default(),
                    replaced_by: job.replaced_by().unwrap_or_default(),
                })
                .collect(),
            next_page_token: next.map(|n| n.to_string()).unwrap_or_default(),
        }))
    }

    async fn describe_job(
        &self,
        request: Request<DescribeJobRequest>,
    ) -> Result<Response<JobDescription>, Status> {
        let job = self.job(&request.into_inner().job_id)?;
        let mut description = JobDescription {
            job_id: job.id().to_string(),
            job_name: job.name().to_string(),
            state: job.state() as i32,
            error: job.failure().unwrap_or_default(),
            durable: job.is_durable(),
            replaces: job
                .replaces()
                .map(|j| j.id().to_string())
                .unwrap_or_default(),
            replaced_by: job.replaced_by().unwrap_or_default(),
            ..Default::default()
        };
        self.runner.describe(&job, &mut description);
        Ok(Response::new(description))
    }

    async fn resume_job(
        &self,
        request: Request<ResumeJobRequest>,
    ) -> Result<Response<ResumeJobResponse>, Status> {
        let job = self.job(&request.into_inner().job_id)?;
        let resumed = resume(&self.registry, &self.runner, &job)?;
        Ok(Response::new(ResumeJobResponse {
            state: resumed.state() as i32,
        }))
    }

    async fn delete_job(
        &self,
        request: Request<DeleteJobRequest>,
    ) -> Result<Response<DeleteJobResponse>, Status> {
        let job = self.job(&request.into_inner().job_id)?;
        let state = job.state();
        if !is_terminal(state) && state != JobState::Stopped {
            return Err(Status::failed_precondition(format!(
                "job {} is {state:?}; cancel it (or let it end) before deleting it",
                job.id()
            )));
        }
        if state == JobState::Stopped {
            job.request_cancel();
        }
        // Out of the table first: a resume racing with this finds nothing.
        if !self.registry.remove_exactly(&job) {
            return Err(Status::failed_precondition(format!(
                "job {} was resumed or deleted meanwhile",
                job.id()
            )));
        }
        let runner = Arc::clone(&self.runner);
        let forgotten = Arc::clone(&job);
        tokio::task::spawn_blocking(move || runner.delete(&forgotten))
            .await
            .map_err(|e| Status::internal(format!("deleting the job crashed: {e}")))?
            .map_err(Status::internal)?;
        job.remove_files();
        tracing::info!(job_id = %job.id(), "job deleted");
        Ok(Response::new(DeleteJobResponse {}))
    }

    async fn list_pools(
        &self,
        _request: Request<ListPoolsRequest>,
    ) -> Result<Response<ListPoolsResponse>, Status> {
        Ok(Response::new(ListPoolsResponse {
            pools: self.runner.pools(),
        }))
    }

    async fn add_pool(
        &self,
        request: Request<AddPoolRequest>,
    ) -> Result<Response<AddPoolResponse>, Status> {
        let spec = request.into_inner().spec;
        self.runner
            .add_pool(&spec)
            .map_err(Status::invalid_argument)?;
        Ok(Response::new(AddPoolResponse {}))
    }

    async fn remove_pool(
        &self,
        request: Request<RemovePoolRequest>,
    ) -> Result<Response<RemovePoolResponse>, Status> {
        let spec = request.into_inner().spec;
        if !self.runner.remove_pool(&spec) {
            return Err(Status::not_found(format!("no worker pool {spec:?}")));
        }
        Ok(Response::new(RemovePoolResponse {}))
    }

    async fn rescale_job(
        &self,
        request: Request<RescaleJobRequest>,
    ) -> Result<Response<RescaleJobResponse>, Status> {
        let request = request.into_inner();
        let job = self.job(&request.job_id)?;
        if job.state() != JobState::Running {
            return Err(Status::failed_precondition(format!(
                "job {} is {:?}; only a running job moves between shards",
                job.id(),
                job.state()
            )));
        }
        let before = self
            .runner
            .rescale(Arc::clone(&job), request.shards)
            .await
            .map_err(|e| match e {
                RescaleError::Invalid(text) => Status::invalid_argument(text),
                RescaleError::Refused(text) => Status::failed_precondition(text),
            })?;
        tracing::info!(job_id = %job.id(), from = before, to = request.shards, "job rescaled");
        Ok(Response::new(RescaleJobResponse {
            shards_before: before,
            shards: request.shards,
        }))
    }
}
