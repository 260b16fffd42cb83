//! Worker start-up per environment, and its failures.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod fake_sdk;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use fake_sdk::{within, FakePool, PoolMode};
use prost::Message;
use refract_proto::pipeline::{DockerPayload, Environment, ProcessPayload};
use refract_sdk_harness::{
    FnApiServer, HarnessError, HostHarnesses, NoArtifacts, TracingLogSink, WorkerConfig,
};

fn config(worker_id: &str, environment: Environment) -> WorkerConfig {
    WorkerConfig {
        worker_id: worker_id.to_string(),
        environment,
        provision: Default::default(),
        artifacts: Arc::new(NoArtifacts),
        logs: Arc::new(TracingLogSink),
    }
}

fn env(urn: &str, payload: Vec<u8>) -> Environment {
    Environment {
        urn: urn.to_string(),
        payload,
        ..Default::default()
    }
}

#[tokio::test]
async fn unsupported_and_embedded_environments_name_their_urn() {
    let server = FnApiServer::start("127.0.0.1").await.expect("server");
    for urn in [
        "beam:env:embedded_python:v1",
        "beam:env:embedded_python_grpc:v1",
    ] {
        let err = server
            .start_worker(config("w-embedded", env(urn, vec![])))
            .await
            .err()
            .expect("embedded environments are rejected");
        assert!(matches!(err, HarnessError::EmbeddedEnvironment { .. }));
        assert!(err.to_string().contains(urn), "{err}");
    }
    let err = server
        .start_worker(config("w-unknown", env("beam:env:martian:v1", vec![])))
        .await
        .err()
        .expect("unknown environments are rejected");
    assert!(err.to_string().contains("beam:env:martian:v1"), "{err}");
    // A failed start frees the id.
    let err = server
        .start_worker(config("w-unknown", env("beam:env:martian:v1", vec![])))
        .await
        .err()
        .expect("still rejected");
    assert!(matches!(err, HarnessError::UnsupportedEnvironment { .. }));
}

#[tokio::test]
async fn docker_without_an_engine_says_so() {
    let engine = tokio::process::Command::new("docker")
        .arg("info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .map(|s| s.success())
        .unwrap_or(false);
    if engine {
        println!(
            "skipped: a Docker engine is reachable here, so the no-engine error cannot be shown"
        );
        return;
    }
    let server = FnApiServer::start("127.0.0.1").await.expect("server");
    let docker = |image: &str| {
        let payload = DockerPayload {
            container_image: image.to_string(),
        }
        .encode_to_vec();
        env("beam:env:docker:v1", payload)
    };
    let no_engine = "DOCKER environments need a Docker engine, and none is reachable here; use --environment_type=LOOPBACK, EXTERNAL or PROCESS";
    // An image that is not one of Beam's SDK images needs Docker.
    let err = server
        .start_worker(config("w-docker", docker("example.com/custom:1")))
        .await
        .err()
        .expect("no engine");
    assert_eq!(err.to_string(), no_engine);
    // Beam's Python image, with no interpreter to run its harness: says
    // what was looked for and found.
    server.set_host_harnesses(HostHarnesses {
        python: Some("/nonexistent/python".into()),
        ..HostHarnesses::default()
    });
    let err = server
        .start_worker(config(
            "w-python-image",
            docker("apache/beam_python3.11_sdk:2.77.0"),
        ))
        .await
        .err()
        .expect("no interpreter");
    let text = err.to_string();
    assert!(
        text.starts_with("no Docker engine is reachable, and Beam 2.77.0's Python 3.11 SDK image cannot run as a process here: no Python 3.11 interpreter with apache-beam 2.77.0 found (/nonexistent/python:"),
        "{text}"
    );
    assert!(text.contains("--sdk_python"), "{text}");
    // With the mapping off, Beam's images need Docker too.
    server.set_host_harnesses(HostHarnesses {
        enabled: false,
        ..HostHarnesses::default()
    });
    let err = server
        .start_worker(config(
            "w-python-off",
            docker("apache/beam_python3.11_sdk:2.77.0"),
        ))
        .await
        .err()
        .expect("no engine");
    assert_eq!(err.to_string(), no_engine);
}

#[tokio::test]
async fn process_that_exits_early_reports_status_and_stderr() {
    let server = FnApiServer::start("127.0.0.1").await.expect("server");
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("boot.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho \"boot got $1 and $MY_VAR\" >&2\necho 'cannot install requirements' >&2\nexit 3\n",
    )
    .expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let payload = ProcessPayload {
        command: script.display().to_string(),
        env: [("MY_VAR".to_string(), "from-payload".to_string())].into(),
        ..Default::default()
    }
    .encode_to_vec();
    let err = within(
        "the early exit",
        server.start_worker(config("w-proc", env("beam:env:process:v1", payload))),
    )
    .await
    .err()
    .expect("the process exits");
    let text = err.to_string();
    assert!(matches!(err, HarnessError::WorkerExited { .. }), "{text}");
    assert!(text.contains("exit status: 3"), "{text}");
    assert!(
        text.contains("boot got --id=w-proc and from-payload"),
        "{text}"
    );
    assert!(text.contains("cannot install requirements"), "{text}");
}

#[tokio::test]
async fn process_scratch_directory_is_private_and_removed_after_exit() {
    let server = FnApiServer::start("127.0.0.1").await.expect("server");
    let dir = tempfile::tempdir().expect("temp dir");
    let seen = dir.path().join("seen");
    let script = dir.path().join("boot.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nmkdir \"$SEMI_PERSISTENT_DIRECTORY/staged\" || exit 9\necho \"$SEMI_PERSISTENT_DIRECTORY\" > {}\nexit 3\n",
            seen.display()
        ),
    )
    .expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let start = |payload: ProcessPayload| {
        server.start_worker(config(
            "w-scratch",
            env("beam:env:process:v1", payload.encode_to_vec()),
        ))
    };
    let command = script.display().to_string();
    let err = within(
        "the exit",
        start(ProcessPayload {
            command: command.clone(),
            ..Default::default()
        }),
    )
    .await
    .err()
    .expect("the process exits");
    assert!(err.to_string().contains("exit status: 3"), "{err}");
    let scratch = std::fs::read_to_string(&seen).expect("the script ran");
    let scratch = std::path::Path::new(scratch.trim());
    assert!(
        scratch.starts_with(std::env::temp_dir()),
        "{}",
        scratch.display()
    );
    assert!(!scratch.exists(), "{} was left behind", scratch.display());

    // A directory the payload names is the user's: kept.
    let own = dir.path().join("own");
    std::fs::create_dir(&own).expect("mkdir");
    within(
        "the exit",
        start(ProcessPayload {
            command,
            env: [(
                "SEMI_PERSISTENT_DIRECTORY".to_string(),
                own.display().to_string(),
            )]
            .into(),
            ..Default::default()
        }),
    )
    .await
    .err()
    .expect("the process exits");
    assert!(own.join("staged").is_dir());
}

/// Whether a process is alive (zombies, which an init that does not reap may
/// leave behind, count as dead).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
        .map(|stat| {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z')
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn process_that_never_connects_times_out_and_is_killed_with_its_children() {
    let server = FnApiServer::start("127.0.0.1").await.expect("server");
    server.set_connect_timeout(Duration::from_secs(2));
    let dir = tempfile::tempdir().expect("temp dir");
    let pid_file = dir.path().join("pid");
    let child_pid_file = dir.path().join("child_pid");
    let script = dir.path().join("boot.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho $$ > {}\nsleep 60 &\necho $! > {}\nwait\n",
            pid_file.display(),
            child_pid_file.display()
        ),
    )
    .expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let payload = ProcessPayload {
        command: script.display().to_string(),
        ..Default::default()
    }
    .encode_to_vec();
    let err = within(
        "the timeout",
        server.start_worker(config("w-slow", env("beam:env:process:v1", payload))),
    )
    .await
    .err()
    .expect("times out");
    assert!(matches!(err, HarnessError::ConnectTimeout { .. }), "{err}");
    let pid = std::fs::read_to_string(&pid_file).expect("pid written");
    let child_pid = std::fs::read_to_string(&child_pid_file).expect("child pid written");
    assert!(!running(&pid), "the worker process was killed");
    within("the grandchild to die", async {
        while running(&child_pid) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn pool_errors_and_silent_pools_are_reported() {
    let server = FnApiServer::start("127.0.0.1").await.expect("server");
    let failing = FakePool::start(PoolMode::Fail(
        "Traceback ...\nOSError: no python".to_string(),
    ))
    .await;
    let err = within(
        "StartWorker",
        server.start_worker(config("w-pool-fail", failing.environment())),
    )
    .await
    .err()
    .expect("pool error");
    assert!(matches!(err, HarnessError::WorkerStart { .. }));
    assert!(err.to_string().contains("OSError: no python"), "{err}");

    server.set_connect_timeout(Duration::from_millis(300));
    let silent = FakePool::start(PoolMode::Ignore).await;
    let err = within(
        "the timeout",
        server.start_worker(config("w-pool-silent", silent.environment())),
    )
    .await
    .err()
    .expect("never connects");
    assert!(matches!(err, HarnessError::ConnectTimeout { .. }), "{err}");

    let err = server
        .start_worker(config(
            "w-no-pool",
            env(
                "beam:env:external:v1",
                refract_proto::pipeline::ExternalPayload::default().encode_to_vec(),
            ),
        ))
        .await
        .err()
        .expect("no endpoint");
    assert!(matches!(err, HarnessError::InvalidPayload { .. }), "{err}");
}

#[tokio::test]
async fn duplicate_worker_ids_are_rejected() {
    let server = FnApiServer::start("127.0.0.1").await.expect("server");
    let mut pool = FakePool::start(PoolMode::Connect).await;
    let worker = within(
        "start",
        server.start_worker(config("w-dup", pool.environment())),
    )
    .await
    .expect("first");
    let _sdk = pool.sdks.recv().await;
    let err = server
        .start_worker(config("w-dup", pool.environment()))
        .await
        .err()
        .expect("duplicate");
    assert!(matches!(err, HarnessError::DuplicateWorker(_)), "{err}");
    worker.stop().await;
}
