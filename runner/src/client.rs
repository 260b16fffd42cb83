//! `refract jobs | status | logs | drain | cancel`: small Job API clients
//! for a person at a terminal, talking to a running `refract serve`.

use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use futures::StreamExt;
use refract_observability::job_api_text::{message_level, state_name};
use refract_proto::admin::refract_admin_client::RefractAdminClient;
use refract_proto::admin::{
    DeleteJobRequest, DescribeJobRequest, ListJobsRequest, RescaleJobRequest, ResumeJobRequest,
};
use refract_proto::job_api::job_service_client::JobServiceClient;
use refract_proto::job_api::{
    CancelJobRequest, DrainJobRequest, GetJobMetricsRequest, GetJobPipelineRequest,
    GetJobStateRequest, JobMessagesRequest,
};
use refract_proto::tonic::transport::Channel;

use crate::cli::{JobArgs, JobsArgs, LogsArgs, RescaleArgs, SavepointArgs};

/// A Job API client for `endpoint` (`host:port`, or a URL).
pub(crate) async fn connect(endpoint: &str) -> Result<JobServiceClient<Channel>> {
    JobServiceClient::connect(refract_proto::endpoint::endpoint_uri(endpoint))
        .await
        .with_context(|| format!("connecting to the job service at {endpoint}"))
}

/// A client of Refract's admin API at `endpoint` (the job port).
pub(crate) async fn connect_admin(endpoint: &str) -> Result<RefractAdminClient<Channel>> {
    RefractAdminClient::connect(refract_proto::endpoint::endpoint_uri(endpoint))
        .await
        .with_context(|| format!("connecting to the server at {endpoint}"))
}

/// Drain a job and print its new state.
pub async fn drain(args: JobArgs) -> Result<()> {
    let mut client = connect(&args.job_endpoint).await?;
    let state = client
        .drain(DrainJobRequest {
            job_id: args.job_id.clone(),
        })
        .await
        .map_err(|s| anyhow!("drain failed: {}", s.message()))?
        .into_inner()
        .state;
    println!("{}: {}", args.job_id, state_name(state));
    Ok(())
}

/// Cancel a job and print its new state.
pub async fn cancel(args: JobArgs) -> Result<()> {
    let mut client = connect(&args.job_endpoint).await?;
    let state = client
        .cancel(CancelJobRequest {
            job_id: args.job_id.clone(),
        })
        .await
        .map_err(|s| anyhow!("cancel failed: {}", s.message()))?
        .into_inner()
        .state;
    println!("{}: {}", args.job_id, state_name(state));
    Ok(())
}

/// List jobs, newest first: id, state, name; then, when more are left,
/// how to list them.
pub async fn jobs(args: JobsArgs) -> Result<()> {
    let mut admin = connect_admin(&args.server.job_endpoint).await?;
    let page = admin
        .list_jobs(ListJobsRequest {
            page_size: args.limit,
            page_token: args.page_token.unwrap_or_default(),
        })
        .await
        .map_err(|s| anyhow!("listing jobs failed: {}", s.message()))?
        .into_inner();
    for job in page.jobs {
        let mut line = format!(
            "{}\t{}\t{}",
            job.job_id,
            state_name(job.state),
            job.job_name
        );
        if !job.replaces.is_empty() {
            line.push_str(&format!("\treplaces {}", job.replaces));
        }
        if !job.replaced_by.is_empty() {
            line.push_str(&format!("\treplaced by {}", job.replaced_by));
        }
        println!("{line}");
    }
    if !page.next_page_token.is_empty() {
        println!(
            "(more: refract jobs --job_endpoint {} --page_token {})",
            args.server.job_endpoint, page.next_page_token
        );
    }
    Ok(())
}

/// Resume a failed job and print its new state.
pub async fn resume(args: JobArgs) -> Result<()> {
    let mut admin = connect_admin(&args.job_endpoint).await?;
    let state = admin
        .resume_job(ResumeJobRequest {
            job_id: args.job_id.clone(),
        })
        .await
        .map_err(|s| anyhow!("resume failed: {}", s.message()))?
        .into_inner()
        .state;
    println!("{}: {}", args.job_id, state_name(state));
    Ok(())
}

/// Move a running job onto another number of engine shards, under its id.
pub async fn rescale(args: RescaleArgs) -> Result<()> {
    let mut admin = connect_admin(&args.job.job_endpoint).await?;
    let moved = admin
        .rescale_job(RescaleJobRequest {
            job_id: args.job.job_id.clone(),
            shards: args.shards,
        })
        .await
        .map_err(|s| anyhow!("rescale failed: {}", s.message()))?
        .into_inner();
    println!(
        "{}: moved from {} to {} shards",
        args.job.job_id, moved.shards_before, moved.shards
    );
    Ok(())
}

/// Delete an ended job.
pub async fn delete(args: JobArgs) -> Result<()> {
    let mut admin = connect_admin(&args.job_endpoint).await?;
    admin
        .delete_job(DeleteJobRequest {
            job_id: args.job_id.clone(),
        })
        .await
        .map_err(|s| anyhow!("delete failed: {}", s.message()))?;
    println!("{}: deleted", args.job_id);
    Ok(())
}

/// The lines `refract status` prints of a job's failure and checkpoints,
/// from the admin API (nothing when the server has none to tell).
async fn describe_lines(endpoint: &str, job_id: &str) -> Vec<String> {
    let Ok(mut admin) = connect_admin(endpoint).await else {
        return Vec::new();
    };
    let Ok(description) = admin
        .describe_job(DescribeJobRequest {
            job_id: job_id.to_string(),
        })
        .await
        .map(|r| r.into_inner())
    else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    // An SDK's error ends with the exception itself, after its traceback.
    if let Some(last) = description
        .error
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
    {
        lines.push(format!("  failed: {}", last.trim()));
    }
    if description.resumable {
        lines.push(format!(
            "  resumable: `refract resume {job_id}` starts it again from its latest checkpoint"
        ));
    }
    if description.shards > 1 {
        lines.push(format!("  shards: {}", description.shards));
    }
    if !description.replaces.is_empty() {
        lines.push(format!("  replaces: {} (--update)", description.replaces));
    }
    if !description.replaced_by.is_empty() {
        lines.push(format!(
            "  replaced by: {} (--update)",
            description.replaced_by
        ));
    }
    if let Some(c) = description.checkpoints.filter(|c| c.enabled) {
        let mut line = format!(
            "  checkpoints: {} written, {} failed; latest #{} {:.1}s ago",
            c.written,
            c.failed,
            c.latest_id,
            c.age_ms as f64 / 1000.0
        );
        if !c.last_error.is_empty() {
            line.push_str(&format!("; last failure: {}", c.last_error));
        }
        lines.push(line);
    }
    lines
}

/// A job's state, then its committed metrics, one per line: elements per
/// PCollection, then user metrics.
pub async fn status(args: JobArgs) -> Result<()> {
    let mut client = connect(&args.job_endpoint).await?;
    let state = client
        .get_state(GetJobStateRequest {
            job_id: args.job_id.clone(),
        })
        .await
        .map_err(|s| anyhow!("status failed: {}", s.message()))?
        .into_inner()
        .state;
    println!("{}: {}", args.job_id, state_name(state));
    for line in describe_lines(&args.job_endpoint, &args.job_id).await {
        println!("{line}");
    }
    let metrics = client
        .get_job_metrics(GetJobMetricsRequest {
            job_id: args.job_id.clone(),
        })
        .await
        .map_err(|s| anyhow!("metrics failed: {}", s.message()))?
        .into_inner();
    let committed = metrics.metrics.map(|m| m.committed).unwrap_or_default();
    // PCollections by their names in the pipeline, where it can be had.
    let names: std::collections::HashMap<String, String> = client
        .get_pipeline(GetJobPipelineRequest {
            job_id: args.job_id.clone(),
        })
        .await
        .ok()
        .and_then(|r| r.into_inner().pipeline)
        .and_then(|p| p.components)
        .map(|c| {
            c.pcollections
                .into_iter()
                .map(|(id, p)| (id, p.unique_name))
                .collect()
        })
        .unwrap_or_default();
    // Element counts first, one per PCollection, then the user metrics.
    let mut counts: Vec<(String, String)> = committed
        .iter()
        .filter_map(|info| {
            let id = info.labels.get("PCOLLECTION")?;
            let name = names.get(id).filter(|n| !n.is_empty()).unwrap_or(id);
            Some((name.clone(), describe_payload(&info.r#type, &info.payload)))
        })
        .collect();
    counts.sort();
    for (name, count) in counts {
        println!("  elements in {name}: {count}");
    }
    for info in committed
        .iter()
        .filter(|i| !i.labels.contains_key("PCOLLECTION"))
    {
        let label = |k: &str| info.labels.get(k).cloned().unwrap_or_default();
        println!(
            "  {} {}:{} {} = {}",
            label("PTRANSFORM"),
            label("NAMESPACE"),
            label("NAME"),
            info.r#type.trim_start_matches("beam:metrics:"),
            describe_payload(&info.r#type, &info.payload)
        );
    }
    Ok(())
}

/// A readable value for the common metric payloads.
fn describe_payload(kind: &str, payload: &[u8]) -> String {
    use refract_jobservice::{decode_int_metric as decode, IntMetric};
    match decode(kind, payload) {
        Some(IntMetric::Counter(v) | IntMetric::Gauge(v)) => v.to_string(),
        Some(IntMetric::Distribution {
            count,
            sum,
            min,
            max,
        }) => format!("count {count}, sum {sum}, min {min}, max {max}"),
        None => format!("{} bytes", payload.len()),
    }
}

/// Print a job's messages; with `--follow`, until the job ends, otherwise
/// what has arrived so far.
pub async fn logs(args: LogsArgs) -> Result<()> {
    use refract_proto::job_api::job_messages_response::Response;
    let mut client = connect(&args.job.job_endpoint).await?;
    let mut stream = client
        .get_message_stream(JobMessagesRequest {
            job_id: args.job.job_id.clone(),
        })
        .await
        .map_err(|s| anyhow!("logs failed: {}", s.message()))?
        .into_inner();
    loop {
        let next = if args.follow {
            stream.next().await
        } else {
            match tokio::time::timeout(Duration::from_millis(300), stream.next()).await {
                Ok(next) => next,
                Err(_) => return Ok(()),
            }
        };
        let Some(item) = next else {
            return Ok(());
        };
        match item
            .map_err(|s| anyhow!("logs failed: {}", s.message()))?
            .response
        {
            Some(Response::MessageResponse(m)) => {
                println!(
                    "{} {} {}",
                    m.time,
                    message_level(m.importance),
                    m.message_text
                );
            }
            Some(Response::StateResponse(s)) => println!("state {}", state_name(s.state)),
            None => {}
        }
    }
}

/// Ask the server (on its web UI port) for a savepoint of a running job,
/// and print where it went.
pub async fn savepoint(args: SavepointArgs) -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = args.path.to_string_lossy().into_owned();
    let target = format!(
        "/api/jobs/{}/savepoint{}",
        args.job_id,
        if args.stop { "?stop=true" } else { "" }
    );
    let mut stream = tokio::net::TcpStream::connect(&args.ui_endpoint)
        .await
        .with_context(|| format!("connecting to the web UI at {}", args.ui_endpoint))?;
    let request = format!(
        "POST {target} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\n{}: 1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        args.ui_endpoint,
        refract_observability::ui::guard::ACTION_HEADER,
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, text) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(anyhow!(
            "savepoint of job {} failed ({status}): {text}",
            args.job_id
        ));
    }
    let answer: serde_json::Value =
        serde_json::from_str(text).with_context(|| format!("reading the answer: {text}"))?;
    println!(
        "savepoint of {} written to {} ({} bytes){}",
        args.job_id,
        answer["path"].as_str().unwrap_or_default(),
        answer["bytes"],
        if args.stop { "; job stopped" } else { "" }
    );
    Ok(())
}
