//! `refract jobs | status | logs | drain | cancel`: small Job API clients
//! for a person at a terminal, talking to a running `refract serve`.

use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use futures::StreamExt;
use refract_proto::job_api::job_message::MessageImportance;
use refract_proto::job_api::job_service_client::JobServiceClient;
use refract_proto::job_api::{
    job_state, CancelJobRequest, DrainJobRequest, GetJobMetricsRequest, GetJobPipelineRequest,
    GetJobStateRequest, GetJobsRequest, JobMessagesRequest,
};
use refract_proto::tonic::transport::Channel;

use crate::cli::{JobArgs, LogsArgs, SavepointArgs, ServerArgs};

/// A Job API client for `endpoint` (`host:port`, or a URL).
pub(crate) async fn connect(endpoint: &str) -> Result<JobServiceClient<Channel>> {
    let url = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    };
    JobServiceClient::connect(url)
        .await
        .with_context(|| format!("connecting to the job service at {endpoint}"))
}

/// A job state's name as the Job API spells it (`RUNNING`, `DONE`, ...).
pub(crate) fn state_name(state: i32) -> String {
    job_state::Enum::try_from(state)
        .map(|s| s.as_str_name().to_string())
        .unwrap_or_else(|_| state.to_string())
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

/// List jobs: id, state, name.
pub async fn jobs(args: ServerArgs) -> Result<()> {
    let mut client = connect(&args.job_endpoint).await?;
    let jobs = client
        .get_jobs(GetJobsRequest {})
        .await
        .map_err(|s| anyhow!("listing jobs failed: {}", s.message()))?
        .into_inner()
        .job_info;
    for job in jobs {
        println!(
            "{}\t{}\t{}",
            job.job_id,
            state_name(job.state),
            job.job_name
        );
    }
    Ok(())
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

/// A job message's importance as people read it (`ERROR`, `WARNING`,
/// `BASIC`, ...).
pub fn message_level(importance: i32) -> String {
    MessageImportance::try_from(importance)
        .map(|i| {
            i.as_str_name()
                .trim_start_matches("JOB_MESSAGE_")
                .to_string()
        })
        .unwrap_or_default()
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
    let path = std::path::absolute(&args.path)
        .with_context(|| format!("resolving {}", args.path.display()))?;
    let body = path.to_string_lossy().into_owned();
    let target = format!(
        "/api/jobs/{}/savepoint{}",
        args.job_id,
        if args.stop { "?stop=true" } else { "" }
    );
    let mut stream = tokio::net::TcpStream::connect(&args.ui_endpoint)
        .await
        .with_context(|| format!("connecting to the web UI at {}", args.ui_endpoint))?;
    let request = format!(
        "POST {target} HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        args.ui_endpoint,
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
