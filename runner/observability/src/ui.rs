//! The web UI and `/metrics`, served by `refract serve` on its own port
//! (`--ui_port`, off with `--serve_http=false`).
//!
//! The UI is a client of the server's own Job API and admin API: it lists
//! jobs (a page at a time), shows a job's state and committed metrics, and
//! cancels or drains it through the same calls an SDK or `refract cancel`
//! makes, so it can never show what those APIs would not. `/metrics` renders
//! the same data for Prometheus.
//!
//! What the Job API cannot tell — each stage's watermarks, backlog and
//! progress, their last ten minutes, and the failed bundle attempts —
//! comes from the job's [`Insights`].
//!
//! Routes: `GET /` (the page), `GET /api/jobs?limit=&page_token=` (newest
//! first, a page at a time), `GET /api/jobs/{id}` (state, failure,
//! metrics, stages with their history, failed bundles by transform),
//! `GET /api/jobs/{id}/graph` (the user's transforms, see [`graph`]),
//! `GET /api/jobs/{id}/logs?after=&limit=&level=&q=` (a
//! page of the job's messages — runner events and harness log lines —
//! filtered here, so a job logging fast does not stall the page),
//! `POST /api/jobs/{id}/cancel`, `.../drain`, `.../resume`, `.../delete`,
//! `POST /api/jobs/{id}/savepoint[?stop=true]` (body: a file name in the
//! savepoint directory), `GET /metrics`. Every request passes
//! [`guard::check`] first.

pub mod graph;
pub mod guard;
pub mod prometheus;

use std::future::Future;
use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use refract_engine::manager::StageStats;
use refract_engine::time::{wall_clock_ms, MAX_TIMESTAMP, MIN_TIMESTAMP};
use refract_jobservice::JobEvent;
use refract_jobservice::{decode_int_metric as decode, IntMetric};
use refract_proto::admin::refract_admin_client::RefractAdminClient;
use refract_proto::admin::{
    DeleteJobRequest, DescribeJobRequest, ListJobsRequest, ResumeJobRequest,
};
use refract_proto::job_api::job_messages_response::Response as MessageOrState;
use refract_proto::job_api::job_service_client::JobServiceClient;
use refract_proto::job_api::{
    CancelJobRequest, DrainJobRequest, GetJobMetricsRequest, GetJobPipelineRequest,
    GetJobStateRequest, JobMessagesRequest,
};
use refract_proto::tonic::transport::{Channel, Endpoint};
use refract_store::SavepointDir;
use serde_json::{json, Value};

use crate::insights::{BundleDurations, CheckpointSummary, Insights};
use crate::job_api_text::state_name;
use guard::AllowedHosts;
use prometheus::JobSnapshot;

/// The page: a job list and a job view that poll the JSON routes.
const INDEX_HTML: &str = include_str!("ui/index.html");

/// How the UI is served, besides where.
#[derive(Debug, Clone)]
pub struct UiSettings {
    /// The host names it answers to (see [`guard`]).
    pub allowed_hosts: AllowedHosts,
    /// Where savepoints may be written; without it they are refused.
    pub savepoints: Option<Arc<SavepointDir>>,
    /// Which users of this host may use it (see [`guard`]).
    pub local_peers: refract_peercred::LocalPeers,
}

/// What the handlers share: a channel to the job service, the jobs'
/// stage snapshots, and where savepoints go.
#[derive(Clone)]
struct Ui {
    channel: Channel,
    insights: Insights,
    savepoints: Option<Arc<SavepointDir>>,
}

/// Serves the UI on `listener` until `shutdown` resolves, talking to the
/// job service at `job_endpoint` (`host:port`) and reading stage snapshots
/// from `insights`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    job_endpoint: &str,
    insights: Insights,
    settings: UiSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let channel = Endpoint::from_shared(format!("http://{job_endpoint}"))
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?
        .connect_lazy();
    let peers = guard::PeerCheck {
        gate: refract_peercred::PeerGate::new(settings.local_peers, "web UI"),
        port: listener.local_addr()?.port(),
    };
    let ui = Ui {
        channel,
        insights,
        savepoints: settings.savepoints,
    };
    let app = Router::new()
        .route("/", get(index))
        .route("/api/jobs", get(list_jobs))
        .route("/api/jobs/:id", get(job_details))
        .route("/api/jobs/:id/graph", get(job_graph))
        .route("/api/jobs/:id/logs", get(job_logs))
        .route("/api/jobs/:id/:action", post(act_on_job))
        .route("/metrics", get(metrics))
        .with_state(ui)
        .layer(axum::middleware::from_fn_with_state(
            settings.allowed_hosts,
            guard::check,
        ))
        .layer(axum::middleware::from_fn_with_state(
            peers,
            guard::check_peer,
        ));
    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
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

/// A page of jobs, newest first, from the admin API's `ListJobs`: up to
/// `limit`, after `token` (a previous page's), and the next page's token
/// when more are left.
async fn jobs_page(
    channel: &Channel,
    limit: u32,
    token: String,
) -> Result<(Vec<JobSnapshot>, Option<String>), ApiError> {
    let page = RefractAdminClient::new(channel.clone())
        .list_jobs(ListJobsRequest {
            page_size: limit,
            page_token: token,
        })
        .await
        .map_err(api_error("ListJobs"))?
        .into_inner();
    let jobs = page
        .jobs
        .into_iter()
        .map(|j| JobSnapshot {
            id: j.job_id,
            name: j.job_name,
            state: state_name(j.state),
            ..JobSnapshot::default()
        })
        .collect();
    Ok((jobs, Some(page.next_page_token).filter(|t| !t.is_empty())))
}

/// Every job the server keeps in memory (a page at a time).
async fn all_jobs(channel: &Channel) -> Result<Vec<JobSnapshot>, ApiError> {
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let (page, next) = jobs_page(channel, 1_000, token).await?;
        all.extend(page);
        match next {
            Some(next) => token = next,
            None => return Ok(all),
        }
    }
}

/// Jobs one `/api/jobs` answer lists unless it asks for fewer.
const DEFAULT_JOB_PAGE: u32 = 200;

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

/// A page of jobs, newest first (`?limit=N&page_token=T`); the header
/// `X-Refract-Next-Page` carries the token of the next page when more are
/// left.
async fn list_jobs(
    State(Ui { channel, .. }): State<Ui>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let (mut limit, mut token) = (DEFAULT_JOB_PAGE, String::new());
    for pair in query.as_deref().unwrap_or("").split('&') {
        match pair.split_once('=') {
            Some(("limit", n)) => limit = n.parse().unwrap_or(DEFAULT_JOB_PAGE),
            Some(("page_token", t)) => token = percent_decode(t),
            _ => {}
        }
    }
    let (jobs, next) = jobs_page(&channel, limit, token).await?;
    let mut response = json_response(Value::Array(
        jobs.iter()
            .map(|j| json!({"id": j.id, "name": j.name, "state": j.state}))
            .collect(),
    ));
    if let Some(next) = next.and_then(|n| header::HeaderValue::from_str(&n).ok()) {
        response.headers_mut().insert(NEXT_PAGE_HEADER, next);
    }
    Ok(response)
}

/// The header naming the next page of `/api/jobs`.
const NEXT_PAGE_HEADER: &str = "x-refract-next-page";

async fn job_details(
    State(Ui {
        channel, insights, ..
    }): State<Ui>,
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
    let latency: std::collections::HashMap<String, BundleDurations> = view
        .as_ref()
        .map(|v| v.bundle_latency().into_iter().collect())
        .unwrap_or_default();
    let history = view.as_ref().map(|v| v.stage_history()).unwrap_or_default();
    let stages: Vec<Value> = view
        .as_ref()
        .map(|v| v.stages())
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut stage = stage_json(s, latency.get(&s.name));
            stage["history"] = history_json(history.get(i).map(Vec::as_slice).unwrap_or_default());
            stage
        })
        .collect();
    let failed_bundles: Vec<Value> = view
        .as_ref()
        .map(|v| v.bundle_failures())
        .unwrap_or_default()
        .iter()
        .map(|g| {
            json!({
                "transform": g.transform,
                "stage": g.stage,
                "count": g.count,
                "last_at_ms": g.last_at_ms,
                "last_error": g.last_error,
            })
        })
        .collect();
    let stalled_bundles: Vec<Value> = view
        .as_ref()
        .map(|v| v.stalled_bundles().list())
        .unwrap_or_default()
        .iter()
        .map(|b| {
            json!({
                "stage": b.stage,
                "bundle_id": b.bundle_id,
                "worker": b.worker,
                "since_ms": b.since_ms,
                "transform": b.transform,
            })
        })
        .collect();
    // Why it failed: the SDK's text, as the job service keeps it (also for
    // a job that failed before it ran).
    let failure = RefractAdminClient::new(channel.clone())
        .describe_job(DescribeJobRequest { job_id: id.clone() })
        .await
        .map(|d| d.into_inner().error)
        .unwrap_or_default();
    Ok(json_response(json!({
        "id": id,
        "state": state_name(state),
        "failure": Some(failure).filter(|f| !f.is_empty()),
        "failed_bundles": failed_bundles,
        "stalled_bundles": stalled_bundles,
        "metrics": metrics,
        "stages": stages,
        "workers": view.as_ref().map_or(0, |v| v.live_workers()),
        "checkpoints": checkpoints_json(view.as_ref().map(|v| v.checkpoints()).unwrap_or_default()),
    })))
}

/// The user's transforms of job `id` (see [`graph`]), with the stages
/// running each once the engine has started.
async fn job_graph(
    State(Ui {
        channel, insights, ..
    }): State<Ui>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    // A pipeline may be as large as the job service's message limit, far
    // past tonic's 4 MiB default for what a client reads.
    let pipeline = JobServiceClient::new(channel.clone())
        .max_decoding_message_size(usize::MAX)
        .get_pipeline(GetJobPipelineRequest { job_id: id.clone() })
        .await
        .map_err(api_error("GetPipeline"))?
        .into_inner()
        .pipeline
        .unwrap_or_default();
    let stage_names: Vec<String> = insights
        .stages(&id)
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.name)
        .collect();
    Ok(json_response(graph::graph_json(&pipeline, &stage_names)))
}

/// A stage's recent past as the page charts it: one
/// `[ms since the epoch, elements/s, watermark lag in s or null, backlog]`
/// per sample.
fn history_json(points: &[crate::stage_history::SeriesPoint]) -> Value {
    Value::Array(
        points
            .iter()
            .map(|p| {
                json!([
                    p.at_ms,
                    (p.elements_per_second * 10.0).round() / 10.0,
                    p.watermark_lag_ms.map(|ms| ms as f64 / 1000.0),
                    p.backlog_elements,
                ])
            })
            .collect(),
    )
}

/// Log entries one `/logs` answer carries unless it asks for fewer.
const DEFAULT_LOG_ENTRIES: usize = 500;
/// Most log entries one `/logs` answer carries.
const MAX_LOG_ENTRIES: usize = 5_000;

/// What `/logs` was asked for.
#[derive(Debug, Default, PartialEq)]
struct LogQuery {
    /// Entries after this sequence number; the newest ones without it.
    after: Option<u64>,
    limit: usize,
    /// Only entries of this level (`ERROR`, ..., `STATE`).
    level: Option<String>,
    /// Only entries whose text contains this, in any case.
    text: Option<String>,
}

impl LogQuery {
    fn parse(query: Option<&str>) -> Result<LogQuery, String> {
        let mut parsed = LogQuery {
            limit: DEFAULT_LOG_ENTRIES,
            ..LogQuery::default()
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value);
            match key {
                "after" => {
                    parsed.after = Some(
                        value
                            .parse()
                            .map_err(|_| format!("after={value} is not a sequence number"))?,
                    )
                }
                "limit" => {
                    let limit: usize = value
                        .parse()
                        .map_err(|_| format!("limit={value} is not a number"))?;
                    parsed.limit = limit.clamp(1, MAX_LOG_ENTRIES);
                }
                "level" if !value.is_empty() => parsed.level = Some(value.to_ascii_uppercase()),
                "q" if !value.is_empty() => parsed.text = Some(value.to_lowercase()),
                _ => {}
            }
        }
        Ok(parsed)
    }

    fn keeps(&self, level: &str, text: &str) -> bool {
        self.level.as_deref().is_none_or(|l| l == level)
            && self
                .text
                .as_deref()
                .is_none_or(|q| text.to_lowercase().contains(q))
    }
}

/// `%XX` escapes and `+` of a query value decoded (invalid ones kept).
fn percent_decode(value: &str) -> String {
    let hex = |b: u8| char::from(b).to_digit(16);
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) => hex(h).zip(hex(l)).map(|(h, l)| (h * 16 + l) as u8),
            _ => None,
        };
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, b) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One history entry as the page shows it: level and text.
fn log_fields(event: &JobEvent) -> (String, String, String) {
    match event {
        JobEvent::Message(m) => (
            m.time.clone(),
            crate::job_api_text::message_level(m.importance),
            m.message_text.clone(),
        ),
        JobEvent::State(s) => (String::new(), "STATE".to_string(), state_name(s.state)),
    }
}

/// A page of the job's messages (see [`LogQuery`]), read from the job's
/// history in memory: the newest `limit` entries that pass the filters,
/// or the first ones after `after`; `next` is the cursor to poll with.
async fn job_logs(
    State(Ui {
        channel, insights, ..
    }): State<Ui>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let query = match LogQuery::parse(query.as_deref()) {
        Ok(query) => query,
        Err(why) => return Ok((StatusCode::BAD_REQUEST, why).into_response()),
    };
    let Some(view) = insights.job(&id) else {
        return never_run_job_logs(channel, &id, &query).await;
    };
    let page = view.history(query.after, query.limit, &|event| {
        let (_, level, text) = log_fields(event);
        query.keeps(&level, &text)
    });
    let entries: Vec<Value> = page
        .entries
        .iter()
        .map(|(seq, event)| {
            let (time, level, text) = log_fields(event);
            json!({"seq": seq, "time": time, "level": level, "text": text})
        })
        .collect();
    Ok(json_response(json!({
        "entries": entries,
        "next": page.next,
        "missed": page.missed,
    })))
}

/// The messages of a job that never ran (only the Job API knows it: a
/// staging failure, say). Such a job has few; they are read for at most a
/// second.
async fn never_run_job_logs(
    channel: Channel,
    id: &str,
    query: &LogQuery,
) -> Result<Response, ApiError> {
    let mut stream = JobServiceClient::new(channel)
        .get_message_stream(JobMessagesRequest {
            job_id: id.to_string(),
        })
        .await
        .map_err(api_error("GetMessageStream"))?
        .into_inner();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
    let mut entries = std::collections::VecDeque::new();
    while let Ok(Ok(Some(item))) = tokio::time::timeout_at(deadline, stream.message()).await {
        let (time, level, text) = match item.response {
            Some(MessageOrState::MessageResponse(m)) => (
                m.time,
                crate::job_api_text::message_level(m.importance),
                m.message_text,
            ),
            Some(MessageOrState::StateResponse(s)) => {
                (String::new(), "STATE".to_string(), state_name(s.state))
            }
            None => continue,
        };
        if !query.keeps(&level, &text) {
            continue;
        }
        if entries.len() == query.limit {
            entries.pop_front();
        }
        entries.push_back(json!({"time": time, "level": level, "text": text}));
    }
    Ok(json_response(json!({
        "entries": Vec::from(entries),
        "next": null,
        "missed": 0,
    })))
}

/// `cancel` or `drain`, as the Job API's calls of those names; `resume`
/// or `delete`, as the admin API's.
async fn act_on_job(
    State(Ui {
        channel,
        insights,
        savepoints,
    }): State<Ui>,
    Path((id, action)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    body: String,
) -> Result<Response, ApiError> {
    if action == "savepoint" {
        let stop = query.as_deref() == Some("stop=true");
        return Ok(savepoint(&insights, savepoints.as_deref(), &id, body.trim(), stop).await);
    }
    let mut client = JobServiceClient::new(channel.clone());
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
        "resume" => {
            RefractAdminClient::new(channel.clone())
                .resume_job(ResumeJobRequest { job_id: id.clone() })
                .await
                .map_err(api_error("ResumeJob"))?
                .into_inner()
                .state
        }
        "delete" => {
            RefractAdminClient::new(channel.clone())
                .delete_job(DeleteJobRequest { job_id: id.clone() })
                .await
                .map_err(api_error("DeleteJob"))?;
            return Ok(json_response(json!({"id": id, "deleted": true})));
        }
        other => {
            return Ok((
                StatusCode::NOT_FOUND,
                format!("no action '{other}': use cancel, drain, resume or delete"),
            )
                .into_response())
        }
    };
    Ok(json_response(json!({"id": id, "state": state_name(state)})))
}

/// Writes a savepoint of running job `id` to `name` in the savepoint
/// directory, and with `stop` ends the job right after it.
async fn savepoint(
    insights: &Insights,
    savepoints: Option<&SavepointDir>,
    id: &str,
    name: &str,
    stop: bool,
) -> Response {
    let Some(view) = insights.job(id) else {
        return (StatusCode::NOT_FOUND, format!("no job with id {id}")).into_response();
    };
    let Some(savepoints) = savepoints else {
        return (
            StatusCode::CONFLICT,
            "savepoints are off on this server: start it with --savepoint_dir DIR".to_string(),
        )
            .into_response();
    };
    let file = match savepoints.target(name) {
        Ok(file) => file,
        Err(why) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
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

async fn metrics(
    State(Ui {
        channel, insights, ..
    }): State<Ui>,
) -> Result<Response, ApiError> {
    let mut jobs = all_jobs(&channel).await?;
    for job in &mut jobs {
        job.metrics = committed_metrics(&channel, &job.id).await?;
        if let Some(view) = insights.job(&job.id) {
            job.stages = view.stages();
            job.bundle_latency = view
                .bundle_latency()
                .into_iter()
                .map(|(stage, d)| (stage, d.histogram))
                .collect();
            job.checkpoints = view.checkpoints();
        }
    }
    Ok((
        [(header::CONTENT_TYPE, prometheus::CONTENT_TYPE)],
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
    if c.failed > 0 {
        description.push_str(&format!(" {} could not be written", c.failed));
        match &c.last_error {
            Some(error) => description.push_str(&format!(
                "; the latest attempt failed: {error} (retried with backoff)."
            )),
            None => description.push('.'),
        }
    }
    let age = c.age().map(|a| a.as_secs_f64());
    json!({
        "enabled": c.enabled,
        "taken": c.taken,
        "failed": c.failed,
        "last_error": c.last_error,
        "age_seconds": age,
        "restored_from": c.restored_from,
        "last": last,
        "description": description,
    })
}

/// A stage as the page draws it: its fused transforms, the stages it reads,
/// watermarks (`"-inf"`/`"+inf"` at the ends of time), backlog, progress,
/// and its bundles' durations (count and sum, seconds).
fn stage_json(s: &StageStats, latency: Option<&BundleDurations>) -> Value {
    let mark = |t: i64| match t {
        t if t <= MIN_TIMESTAMP => json!("-inf"),
        t if t >= MAX_TIMESTAMP => json!("+inf"),
        t => json!(t),
    };
    json!({
        "name": s.name,
        "kind": s.kind,
        "transforms": refract_engine::plan::fused_transform_names(&s.name).collect::<Vec<_>>(),
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
        "bundle_latency": latency.map(|d| json!({"count": d.count, "sum": d.sum_seconds})),
    })
}
