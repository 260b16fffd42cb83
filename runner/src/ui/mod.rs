//! The web UI and `/metrics`, served by `refract serve` on its own port
//! (`--ui_port`, off with `--serve_http=false`).
//!
//! The UI is a client of the server's own Job API: it lists jobs, shows a
//! job's state and committed metrics, and cancels or drains it through the
//! same calls an SDK or `refract cancel` makes, so it can never show what the
//! Job API would not. `/metrics` renders the same data for Prometheus.
//!
//! Routes: `GET /` (the page), `GET /api/jobs`, `GET /api/jobs/{id}`,
//! `POST /api/jobs/{id}/cancel`, `POST /api/jobs/{id}/drain`, `GET /metrics`.

pub mod prometheus;

use std::future::Future;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use refract_proto::job_api::job_service_client::JobServiceClient;
use refract_proto::job_api::{
    job_state, CancelJobRequest, DrainJobRequest, GetJobMetricsRequest, GetJobStateRequest,
    GetJobsRequest,
};
use refract_proto::tonic::transport::{Channel, Endpoint};
use serde_json::{json, Value};

use crate::metric_payload::{decode, IntMetric};
use prometheus::JobSnapshot;

/// The page: a job list and a job view that poll the JSON routes.
const INDEX_HTML: &str = include_str!("index.html");

/// Serves the UI on `listener` until `shutdown` resolves, talking to the
/// job service at `job_endpoint` (`host:port`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    job_endpoint: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let channel = Endpoint::from_shared(format!("http://{job_endpoint}"))
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?
        .connect_lazy();
    let app = Router::new()
        .route("/", get(index))
        .route("/api/jobs", get(list_jobs))
        .route("/api/jobs/:id", get(job_details))
        .route("/api/jobs/:id/:action", post(act_on_job))
        .route("/metrics", get(metrics))
        .with_state(channel);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// A failed Job API call, as an HTTP error naming it.
struct ApiError(String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (StatusCode::BAD_GATEWAY, self.0).into_response()
    }
}

fn api_error(call: &str) -> impl Fn(refract_proto::tonic::Status) -> ApiError + '_ {
    move |status| ApiError(format!("{call} failed: {}", status.message()))
}

fn json_response(value: Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

fn state_name(state: i32) -> String {
    job_state::Enum::try_from(state)
        .map(|s| s.as_str_name().to_string())
        .unwrap_or_else(|_| state.to_string())
}

async fn index() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        INDEX_HTML,
    )
        .into_response()
}

/// Every job with its state (`GetJobs`).
async fn jobs(channel: &Channel) -> Result<Vec<JobSnapshot>, ApiError> {
    let infos = JobServiceClient::new(channel.clone())
        .get_jobs(GetJobsRequest {})
        .await
        .map_err(api_error("GetJobs"))?
        .into_inner()
        .job_info;
    Ok(infos
        .into_iter()
        .map(|j| JobSnapshot {
            id: j.job_id,
            name: j.job_name,
            state: state_name(j.state),
            metrics: Vec::new(),
        })
        .collect())
}

/// A job's committed metrics (`GetJobMetrics`).
async fn committed_metrics(
    channel: &Channel,
    job_id: &str,
) -> Result<Vec<refract_proto::pipeline::MonitoringInfo>, ApiError> {
    Ok(JobServiceClient::new(channel.clone())
        .get_job_metrics(GetJobMetricsRequest {
            job_id: job_id.to_string(),
        })
        .await
        .map_err(api_error("GetJobMetrics"))?
        .into_inner()
        .metrics
        .map(|m| m.committed)
        .unwrap_or_default())
}

async fn list_jobs(State(channel): State<Channel>) -> Result<Response, ApiError> {
    let jobs = jobs(&channel).await?;
    Ok(json_response(Value::Array(
        jobs.iter()
            .map(|j| json!({"id": j.id, "name": j.name, "state": j.state}))
            .collect(),
    )))
}

async fn job_details(
    State(channel): State<Channel>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let state = JobServiceClient::new(channel.clone())
        .get_state(GetJobStateRequest { job_id: id.clone() })
        .await
        .map_err(api_error("GetState"))?
        .into_inner()
        .state;
    let metrics: Vec<Value> = committed_metrics(&channel, &id)
        .await?
        .iter()
        .map(|info| {
            let value = match decode(&info.r#type, &info.payload) {
                Some(IntMetric::Counter(v) | IntMetric::Gauge(v)) => json!(v),
                Some(IntMetric::Distribution {
                    count,
                    sum,
                    min,
                    max,
                }) => json!({"count": count, "sum": sum, "min": min, "max": max}),
                None => Value::Null,
            };
            json!({"urn": info.urn, "labels": info.labels, "value": value})
        })
        .collect();
    Ok(json_response(
        json!({"id": id, "state": state_name(state), "metrics": metrics}),
    ))
}

/// `cancel` or `drain`, as the Job API's calls of those names.
async fn act_on_job(
    State(channel): State<Channel>,
    Path((id, action)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let mut client = JobServiceClient::new(channel);
    let state = match action.as_str() {
        "cancel" => {
            client
                .cancel(CancelJobRequest { job_id: id.clone() })
                .await
                .map_err(api_error("Cancel"))?
                .into_inner()
                .state
        }
        "drain" => {
            client
                .drain(DrainJobRequest { job_id: id.clone() })
                .await
                .map_err(api_error("Drain"))?
                .into_inner()
                .state
        }
        other => {
            return Ok((
                StatusCode::NOT_FOUND,
                format!("no action '{other}': use cancel or drain"),
            )
                .into_response())
        }
    };
    Ok(json_response(json!({"id": id, "state": state_name(state)})))
}

async fn metrics(State(channel): State<Channel>) -> Result<Response, ApiError> {
    let mut jobs = jobs(&channel).await?;
    for job in &mut jobs {
        job.metrics = committed_metrics(&channel, &job.id).await?;
    }
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        prometheus::render(&jobs),
    )
        .into_response())
}
