//! Remote worker pools against a server in this process: jobs whose
//! environment names Beam's Python SDK image run on the pools of
//! `--worker_pool`, which are fakes connecting a scripted SDK harness over
//! real gRPC. Each test plays the pools' and the SDK's part — a pool that
//! refuses, a worker that dies, a pool added and one removed mid-job — and
//! checks where the job's workers start and that it ends DONE. The last
//! test turns it round: Refract's own boot-program pool watching a real
//! server, whose workers it stops only once that server is gone.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;
#[path = "../../sdk-harness/tests/fake_sdk/mod.rs"]
mod fake_sdk;

use common::{messages_to_end, pardo_in, pipeline_options, serve_args, TestServer};
use fake_sdk::{within, FakePool, FakeSdk, PoolMode};
use refract_proto::admin::refract_admin_client::RefractAdminClient;
use refract_proto::admin::{AddPoolRequest, ListPoolsRequest, RemovePoolRequest, WorkerPool};
use refract_proto::fn_api::{instruction_request, ProcessBundleResponse};
use refract_proto::job_api::job_state::Enum as JobState;
use refract_proto::job_api::CancelJobRequest;
use refract_proto::pipeline::{self as pb, DockerPayload};
use refract_proto::tonic::transport::Channel;
use refract_proto::urns;

/// The DOCKER environment Python pipelines have by default.
fn python_image() -> pb::Environment {
    pb::Environment {
        urn: urns::env::DOCKER.into(),
        payload: refract_proto::prost::Message::encode_to_vec(&DockerPayload {
            container_image: "apache/beam_python3.11_sdk:2.60.0".into(),
        }),
        ..Default::default()
    }
}

/// A server with these pools, one worker per environment.
async fn server_with_pools(pools: &[&str]) -> TestServer {
    let mut args = vec!["--sdk_worker_parallelism", "1"];
    for p in pools {
        args.extend(["--worker_pool", p]);
    }
    TestServer::start_with(serve_args(&args)).await
}

async fn admin(server: &TestServer) -> RefractAdminClient<Channel> {
    RefractAdminClient::connect(format!("http://{}", server.server.job_endpoint))
        .await
        .unwrap()
}

async fn pools(server: &TestServer) -> Vec<WorkerPool> {
    admin(server)
        .await
        .list_pools(ListPoolsRequest {})
        .await
        .unwrap()
        .into_inner()
        .pools
}

/// Waits for `sdk`'s next bundle; the instruction id.
async fn next_bundle(sdk: &mut FakeSdk) -> String {
    loop {
        let request = within("a bundle", sdk.next_instruction()).await;
        if let Some(instruction_request::Request::ProcessBundle(_)) = &request.request {
            return request.instruction_id;
        }
    }
}

/// Runs the job's one bundle on `pool`'s next worker to its end.
async fn finish_on(pool: &mut FakePool) -> String {
    let start = within("StartWorker", pool.starts.recv()).await.unwrap();
    let mut sdk = within("the SDK to connect", pool.sdks.recv())
        .await
        .unwrap();
    let instruction = next_bundle(&mut sdk).await;
    sdk.bundle_done(&instruction, ProcessBundleResponse::default());
    // Keep the worker up until the job ends.
    std::mem::forget(sdk);
    start.worker_id
}

async fn ends_done(server: &TestServer, id: &str) {
    let (messages, state) = messages_to_end(server.client.clone(), id).await;
    assert_eq!(state, JobState::Done, "{messages:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_image_runs_on_the_python_pool_after_a_refusing_one_is_quarantined() {
    let refusing = FakePool::start(PoolMode::Fail("out of memory".into())).await;
    let mut good = FakePool::start(PoolMode::Connect).await;
    let java = FakePool::start(PoolMode::Connect).await;
    let server = server_with_pools(&[
        &format!("python={}", refusing.url),
        &format!("python={}", good.url),
        &format!("java={}", java.url),
    ])
    .await;
    let id = server
        .submit(
            "pooled",
            pardo_in(python_image()).build(),
            pipeline_options(false, &[]),
        )
        .await;
    let worker = finish_on(&mut good).await;
    ends_done(&server, &id).await;
    assert!(worker.starts_with(&format!("{id}-e0-w0")), "{worker}");
    let listed = pools(&server).await;
    let state_of = |url: &str| {
        listed
            .iter()
            .find(|p| p.address == url)
            .map(|p| (p.state.clone(), p.detail.clone()))
            .unwrap()
    };
    // The refusing pool was asked at most once (it is quarantined after
    // its refusal); the Java pool never.
    let (state, detail) = state_of(&refusing.url);
    if state == "quarantined" {
        assert!(detail.contains("out of memory"), "{detail}");
    }
    assert_eq!(state_of(&java.url).0, "live");
    assert!(java.starts.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lost_mid_bundle_is_replaced_on_the_pool_and_the_bundle_retried() {
    let mut pool = FakePool::start(PoolMode::Connect).await;
    let server = server_with_pools(&[&format!("python={}", pool.url)]).await;
    let id = server
        .submit(
            "lost-worker",
            pardo_in(python_image()).build(),
            pipeline_options(false, &[]),
        )
        .await;
    let first = within("StartWorker", pool.starts.recv()).await.unwrap();
    let mut sdk = within("the SDK to connect", pool.sdks.recv())
        .await
        .unwrap();
    next_bundle(&mut sdk).await;
    sdk.crash();
    // A replacement starts on the pool and runs the retried bundle.
    let replacement = finish_on(&mut pool).await;
    assert_ne!(replacement, first.worker_id);
    ends_done(&server, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_move_to_a_pool_added_mid_job_when_theirs_is_removed() {
    let mut old = FakePool::start(PoolMode::Connect).await;
    let mut new = FakePool::start(PoolMode::Connect).await;
    let old_spec = format!("python={}", old.url);
    let server = server_with_pools(&[&old_spec]).await;
    let id = server
        .submit(
            "moving",
            pardo_in(python_image()).build(),
            pipeline_options(false, &[]),
        )
        .await;
    let first = within("StartWorker", old.starts.recv()).await.unwrap();
    let mut sdk = within("the SDK to connect", old.sdks.recv()).await.unwrap();
    next_bundle(&mut sdk).await;

    let mut admin = admin(&server).await;
    admin
        .add_pool(AddPoolRequest {
            spec: format!("python={}", new.url),
        })
        .await
        .unwrap();
    let refused = admin
        .add_pool(AddPoolRequest {
            spec: "rust=h:1".into(),
        })
        .await
        .unwrap_err();
    assert!(refused.message().contains("unknown SDK"), "{refused:?}");
    admin
        .remove_pool(RemovePoolRequest { spec: old_spec })
        .await
        .unwrap();
    // The old pool's worker is stopped; the bundle it ran fails with it
    // and is retried on a replacement on the new pool.
    let stopped = within("StopWorker", old.stops.recv()).await.unwrap();
    assert_eq!(stopped, first.worker_id);
    sdk.crash();
    finish_on(&mut new).await;
    ends_done(&server, &id).await;
    let listed = pools(&server).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].address, new.url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_added_while_a_job_runs_gets_workers_of_it() {
    // No worker count asked: an environment gets its pools' capacity, a
    // pool named by address counting this host's cores.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut first = FakePool::start(PoolMode::Connect).await;
    let mut added = FakePool::start(PoolMode::Connect).await;
    let server = TestServer::start_with(serve_args(&[
        "--worker_pool",
        &format!("python={}", first.url),
    ]))
    .await;
    let id = server
        .submit(
            "growing",
            pardo_in(python_image()).build(),
            pipeline_options(false, &[]),
        )
        .await;
    let mut sdks = Vec::new();
    for _ in 0..cores {
        within("StartWorker", first.starts.recv()).await.unwrap();
        sdks.push(
            within("the SDK to connect", first.sdks.recv())
                .await
                .unwrap(),
        );
    }
    admin(&server)
        .await
        .add_pool(AddPoolRequest {
            spec: format!("python={}", added.url),
        })
        .await
        .unwrap();
    // The job's target grew with the pools: the new pool starts as many.
    for _ in 0..cores {
        let start = within("StartWorker on the added pool", added.starts.recv())
            .await
            .unwrap();
        assert!(
            start.worker_id.starts_with(&format!("{id}-e0-w")),
            "{start:?}"
        );
        sdks.push(
            within("the SDK to connect", added.sdks.recv())
                .await
                .unwrap(),
        );
    }
    assert!(first.starts.is_empty());
    // Each pool counts its workers once their starts returned.
    within("both pools to count their workers", async {
        loop {
            let listed = pools(&server).await;
            if listed.iter().all(|p| p.workers as usize == cores) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    server
        .client
        .clone()
        .cancel(CancelJobRequest { job_id: id.clone() })
        .await
        .unwrap();
    let (_, state) = messages_to_end(server.client.clone(), &id).await;
    assert_eq!(state, JobState::Cancelled);
}

/// `refract worker-pool`'s runner watch against a real server: a worker
/// whose server answers runs on past several timeouts, and is stopped once
/// the server has gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_pool_stops_a_worker_only_once_its_server_is_gone() {
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    use refract_proto::fn_api::beam_fn_external_worker_pool_client::BeamFnExternalWorkerPoolClient;
    use refract_proto::fn_api::StartWorkerRequest;
    use refract_sdk_harness::{BootPool, BootPoolConfig};

    let server = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let boot = dir.path().join("boot.sh");
    let pid_file = dir.path().join("pid");
    std::fs::write(
        &boot,
        format!(
            "#!/bin/sh\necho $$ > {}\nexec sleep 600\n",
            pid_file.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&boot, std::fs::Permissions::from_mode(0o755)).unwrap();
    let pool = BootPool::new(BootPoolConfig {
        boot,
        max_workers: 1,
        local_peers: refract_peercred::LocalPeers::SameUser,
        callers: None,
        runner_timeout: Some(Duration::from_secs(1)),
    })
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(pool.serve(listener, async {
        let _ = stopped.await;
    }));
    let mut client = BeamFnExternalWorkerPoolClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let endpoint = || {
        Some(pb::ApiServiceDescriptor {
            url: server.server.fn_api.clone(),
            ..Default::default()
        })
    };
    let started = client
        .start_worker(StartWorkerRequest {
            worker_id: "w-watched".into(),
            control_endpoint: endpoint(),
            provision_endpoint: endpoint(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(started.error, "");
    let pid = within("the boot program to start", async {
        loop {
            if let Ok(pid) = std::fs::read_to_string(&pid_file) {
                if pid.ends_with('\n') {
                    return pid.trim().to_string();
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
    let alive = |pid: &str| std::path::Path::new(&format!("/proc/{pid}")).exists();

    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(alive(&pid), "the server answers: its worker runs on");

    server.server.stop().await.unwrap();
    within("the worker to be stopped", async {
        while alive(&pid) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let _ = stop.send(());
    served.await.unwrap().unwrap();
}
