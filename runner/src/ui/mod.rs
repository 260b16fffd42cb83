//! The web UI and `/metrics`, served by `refract serve` on its own port
//! (`--ui_port`, off with `--serve_http=false`).
//!
//! The UI is a client of the server's own Job API: it lists jobs, shows a
//! job's state and committed metrics, and cancels or drains it through the
//! same calls an SDK or `refract cancel` makes, so it can never show what the
//! Job API would not. `/metrics` renders the same data for Prometheus.
//!
//! What the Job API cannot tell — each stage's watermarks, backlog and
//! progress — comes from the engine's stage snapshots ([`Insights`]).
//!
//! Routes: `GET /` (the page), `GET /api/jobs`, `GET /api/jobs/{id}` (state,
//! metrics, stages), `GET /api/jobs/{id}/logs` (the job's messages: runner
//! events and harness log lines), `POST /api/jobs/{id}/cancel`,
//! `POST /api/jobs/{id}/drain`, `POST /api/jobs/{id}/savepoint[?stop=true]`
//! (body: an absolute file path), `GET /metrics`.

pub mod prometheus;

use std::future::Future;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use refract_proto::job_api::job_messages_response::Response as MessageOrState;
use refract_proto::job_api::job_service_client::JobServiceClient;
use refract_proto::job_api::{
    CancelJobRequest, DrainJobRequest, GetJobMetricsRequest, GetJobStateRequest, GetJobsRequest,
    JobMessagesRequest,
};
use refract_proto::tonic::transport::{Channel, Endpoint};
use serde_json::{json, Value};

use crate::client::state_name;
use crate::insights::{CheckpointSummary, Insights};
use crate::telemetry::histogram::LatencyHistogram;
use prometheus::JobSnapshot;
use refract_engine::manager::StageStats;
use refract_engine::time::{wall_clock_ms, MAX_TIMESTAMP, MIN_TIMESTAMP};
use refract_jobservice::{decode_int_metric as decode, IntMetric};

/// The page: a job list and a job view that poll the JSON routes.
const INDEX_HTML: &str = include_str!("index.html");

/// What the handlers share: a channel to the job service and the jobs'
/// stage snapshots.
#[derive(Clone)]
struct Ui {
    channel: Channel,
    insights: Insights,
}

/// Serves the UI on `listener` until `shutdown` resolves, talking to the
/// job service at `job_endpoint` (`host:port`) and reading stage snapshots
/// from `insights`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    job_endpoint: &str,
    insights: Insights,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let channel = Endpoint::from_shared(format!("http://{job_endpoint}"))
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?
        .connect_lazy();
    let ui = Ui { channel, insights };
    let app = Router::new()
        .route("/", get(index))
        .route("/api/jobs", get(list_jobs))
        .route("/api/jobs/:id", get(job_details))
        .route("/api/jobs/:id/logs", get(job_logs))
        .route("/api/jobs/:id/:action", post(act_on_job))
        .route("/metrics", get(metrics))
        .with_state(ui);
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
            ..JobSnapshot::default()
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

async fn list_jobs(State(Ui { channel, .. }): State<Ui>) -> Result<Response, ApiError> {
    let jobs = jobs(&channel).await?;
    Ok(json_response(Value::Array(
        jobs.iter()
            .map(|j| json!({"id": j.id, "name": j.name, "state": j.state}))
            .collect(),
    )))
}

async fn job_details(
    State(Ui { channel, insights }): State<Ui>,
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
    let view = insights.job(&id);
    let latency: std::collections::HashMap<String, LatencyHistogram> = view
        .as_ref()
        .map(|v| v.bundle_latency().into_iter().collect())
        .unwrap_or_default();
    let stages: Vec<Value> = view
        .as_ref()
        .map(|v| v.stages())
        .unwrap_or_default()
        .iter()
        .map(|s| stage_json(s, latency.get(&s.name)))
        .collect();
    Ok(json_response(json!({
        "id": id,
        "state": state_name(state),
        "metrics": metrics,
        "stages": stages,
        "workers": view.as_ref().map_or(0, |v| v.live_workers()),
        "checkpoints": checkpoints_json(view.as_ref().map(|v| v.checkpoints()).unwrap_or_default()),
    })))
}

/// Most log entries one `/logs` answer carries (the latest ones).
const MAX_LOG_ENTRIES: usize = 2_000;

/// The job's messages so far (`GetMessageStream` replays them, then waits
/// for more: what arrives within a short pause is taken, no more).
async fn job_logs(
    State(Ui { channel, .. }): State<Ui>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let mut stream = JobServiceClient::new(channel)
        .get_message_stream(JobMessagesRequest { job_id: id.clone() })
        .await
        .map_err(api_error("GetMessageStream"))?
        .into_inner();
    let mut entries = std::collections::VecDeque::new();
    while let Ok(Ok(Some(item))) =
        tokio::time::timeout(std::time::Duration::from_millis(200), stream.message()).await
    {
        let entry = match item.response {
            Some(MessageOrState::MessageResponse(m)) => json!({
                "time": m.time,
                "level": crate::client::message_level(m.importance),
                "text": m.message_text,
            }),
            Some(MessageOrState::StateResponse(s)) => {
                json!({"time": "", "level": "STATE", "text": state_name(s.state)})
            }
            None => continue,
        };
        if entries.len() == MAX_LOG_ENTRIES {
            entries.pop_front();
        }
        entries.push_back(entry);
    }
    Ok(json_response(Value::Array(entries.into())))
}

/// `cancel` or `drain`, as the Job API's calls of those names.
async fn act_on_job(
    State(Ui { channel, insights }): State<Ui>,
    Path((id, action)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    body: String,
) -> Result<Response, ApiError> {
    if action == "savepoint" {
        let stop = query.as_deref() == Some("stop=true");
        return Ok(savepoint(&insights, &id, body.trim(), stop).await);
    }
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

/// Writes a savepoint of running job `id` to `path` (absolute), and with
/// `stop` ends the job right after it.
async fn savepoint(insights: &Insights, id: &str, path: &str, stop: bool) -> Response {
    let Some(view) = insights.job(id) else {
        return (StatusCode::NOT_FOUND, format!("no job with id {id}")).into_response();
    };
    let file = std::path::PathBuf::from(path);
    if !file.is_absolute() {
        return (
            StatusCode::BAD_REQUEST,
            format!("the savepoint path must be absolute, not '{path}'"),
        )
            .into_response();
    }
    let parts = match view.savepoint(stop).await {
        Ok(parts) => parts,
        Err(why) => return (StatusCode::CONFLICT, why).into_response(),
    };
    let count = parts.len();
    let target = file.clone();
    match tokio::task::spawn_blocking(move || refract_store::write_savepoint(&target, &parts)).await
    {
        Ok(Ok(bytes)) => json_response(json!({
            "id": id,
            "path": file.display().to_string(),
            "bytes": bytes,
            "parts": count,
            "stopped": stop,
        })),
        Ok(Err(error)) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

async fn metrics(State(Ui { channel, insights }): State<Ui>) -> Result<Response, ApiError> {
    let mut jobs = jobs(&channel).await?;
    for job in &mut jobs {
        job.metrics = committed_metrics(&channel, &job.id).await?;
        if let Some(view) = insights.job(&job.id) {
            job.stages = view.stages();
            job.bundle_latency = view.bundle_latency();
            job.checkpoints = view.checkpoints();
        }
    }
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        prometheus::render(&jobs, insights.live_workers(), wall_clock_ms()),
    )
        .into_response())
}

/// A job's checkpoints as the page shows them, with a sentence saying it.
fn checkpoints_json(c: CheckpointSummary) -> Value {
    let last = c.last.map(|s| {
        json!({
            "id": s.id,
            "duration_ms": s.duration.as_secs_f64() * 1000.0,
            "parts": s.parts,
            "parts_written": s.parts_written,
            "bytes_written": s.bytes_written,
            "total_bytes": s.total_bytes,
        })
    });
    let mut description = match (&c.enabled, &c.last) {
        (false, _) => "None: this server keeps state in memory (start it with --state_dir to checkpoint).".to_string(),
        (true, None) => "None yet: the first one is taken after --checkpoint_interval.".to_string(),
        (true, Some(s)) => format!(
            "{} taken; the latest, #{}, holds {} bytes of state in {} parts, of which {} changed ({} bytes written with its manifest, in {:.1} ms).",
            c.taken,
            s.id,
            s.total_bytes,
            s.parts,
            s.parts_written,
            s.bytes_written,
            s.duration.as_secs_f64() * 1000.0
        ),
    };
    if let Some(id) = c.restored_from {
        description.push_str(&format!(" Resumed from checkpoint #{id} after a restart."));
    }
    json!({
        "enabled": c.enabled,
        "taken": c.taken,
        "restored_from": c.restored_from,
        "last": last,
        "description": description,
    })
}

/// A stage as the page draws it: its fused transforms, the stages it reads,
/// watermarks (`"-inf"`/`"+inf"` at the ends of time), backlog, progress,
/// and its bundles' durations (count and sum, seconds).
fn stage_json(s: &StageStats, latency: Option<&LatencyHistogram>) -> Value {
    let mark = |t: i64| match t {
        t if t <= MIN_TIMESTAMP => json!("-inf"),
        t if t >= MAX_TIMESTAMP => json!("+inf"),
        t => json!(t),
    };
    json!({
        "name": s.name,
        "kind": s.kind,
        "transforms": s.name.split('+').collect::<Vec<_>>(),
        "inputs": s.inputs,
        "input_watermark": mark(s.input_watermark),
        "output_watermark": mark(s.output_watermark),
        "pending_elements": s.pending_elements,
        "pending_bytes": s.pending_bytes,
        "bundles_in_flight": s.bundles_in_flight,
        "bundles_committed": s.bundles_committed,
        "elements_processed": s.elements_processed,
        "bytes_processed": s.bytes_processed,
        "elements_out": s.elements_out,
        "bytes_out": s.bytes_out,
        "throttled_ms": s.throttled_ms,
        "spilled_bytes": s.spilled_bytes,
        "bundle_latency": latency.map(|h| json!({"count": h.count(), "sum": h.sum()})),
    })
}
