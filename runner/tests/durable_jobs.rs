//! Jobs kept in a state directory across server restarts, against the
//! real `refract` binary: a record the server cannot read is listed as a
//! failed job with the reason (and can be deleted) while the other jobs
//! resume; a streaming job whose workers do not start tries again with
//! growing waits instead of failing; a cancelled job leaves no record.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;

use std::time::Duration;

use common::{
    external_environment, free_port, pardo_in, pipeline_options, wait_for_message, ServerProcess,
};
use refract_proto::admin::{DeleteJobRequest, DescribeJobRequest, ListJobsRequest};
use refract_proto::job_api::job_state::Enum as JobState;
use refract_proto::job_api::{
    CancelJobRequest, GetJobStateRequest, PrepareJobRequest, RunJobRequest,
};
use refract_proto::pipeline as pb;

/// Impulse → a ParDo whose EXTERNAL environment points at a port nothing
/// listens on: its worker never starts.
fn unstartable_pipeline() -> pb::Pipeline {
    let dead = format!("127.0.0.1:{}", free_port());
    pardo_in(external_environment(&dead)).build()
}

async fn state(server: &ServerProcess, id: &str) -> JobState {
    server
        .jobs()
        .await
        .get_state(GetJobStateRequest { job_id: id.into() })
        .await
        .expect("a state")
        .into_inner()
        .state()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_records_are_listed_failed_and_the_other_jobs_resume() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let state_dir = dir.path().join("state");
    let state_arg = state_dir.to_string_lossy().into_owned();
    let port = free_port();
    let args = ["--state_dir", state_arg.as_str()];

    let server = ServerProcess::start(port, &args).await;
    let mut jobs = server.jobs().await;
    let id = jobs
        .prepare(PrepareJobRequest {
            pipeline: Some(unstartable_pipeline()),
            pipeline_options: Some(pipeline_options(true, &[])),
            job_name: "unstartable".into(),
        })
        .await
        .expect("prepared")
        .into_inner()
        .preparation_id;
    jobs.run(RunJobRequest {
        preparation_id: id.clone(),
        retrieval_token: String::new(),
    })
    .await
    .expect("run");
    // Its worker cannot start: a streaming job tries again, and runs on.
    wait_for_message(server.jobs().await, &id, "a streaming job tries again").await;
    assert_eq!(state(&server, &id).await, JobState::Running);
    server.kill();

    // A record that is not one (a bug, a disk error, another version).
    {
        let store = refract_store::Store::open(&state_dir.join("db")).expect("the state db");
        store
            .put_job("broken-1", b"\xff\xff not a record")
            .expect("written");
    }

    let server = ServerProcess::start(port, &args).await;
    let mut admin = server.admin().await;
    let listed = admin
        .list_jobs(ListJobsRequest::default())
        .await
        .expect("listed")
        .into_inner()
        .jobs;
    let of = |id: &str| {
        listed
            .iter()
            .find(|j| j.job_id == id)
            .map(|j| JobState::try_from(j.state).unwrap_or(JobState::Unspecified))
    };
    assert_eq!(of("broken-1"), Some(JobState::Failed), "{listed:?}");
    assert!(
        matches!(of(&id), Some(JobState::Running | JobState::Starting)),
        "{listed:?}"
    );
    let broken = admin
        .describe_job(DescribeJobRequest {
            job_id: "broken-1".into(),
        })
        .await
        .expect("described")
        .into_inner();
    assert!(broken.error.contains("cannot be read"), "{}", broken.error);
    assert!(!broken.resumable);
    wait_for_message(server.jobs().await, &id, "a streaming job tries again").await;

    admin
        .delete_job(DeleteJobRequest {
            job_id: "broken-1".into(),
        })
        .await
        .expect("deleted");
    let refused = admin
        .delete_job(DeleteJobRequest { job_id: id.clone() })
        .await
        .expect_err("a running job is not deleted");
    assert!(refused.message().contains("cancel it"), "{refused:?}");
    server
        .jobs()
        .await
        .cancel(CancelJobRequest { job_id: id.clone() })
        .await
        .expect("cancelled");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while state(&server, &id).await != JobState::Cancelled {
        assert!(tokio::time::Instant::now() < deadline, "not cancelled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The cancelled job's record goes once it ended, before its history
    // file is written.
    let history = state_dir.join("history").join(format!("{id}.json"));
    while !history.is_file() {
        assert!(tokio::time::Instant::now() < deadline, "no history file");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.kill();

    let server = ServerProcess::start(port, &args).await;
    let listed = server
        .admin()
        .await
        .list_jobs(ListJobsRequest::default())
        .await
        .expect("listed")
        .into_inner()
        .jobs;
    assert!(listed.is_empty(), "{listed:?}");
    assert!(history.is_file(), "no history file for {id}");
}
