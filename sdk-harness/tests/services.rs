//! Logging, provisioning, artifact retrieval and header routing, over real gRPC.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod fake_sdk;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use fake_sdk::{with_worker_id, within, CollectedLogs, FakePool, PoolMode};
use refract_proto::fn_api::provision_service_client::ProvisionServiceClient;
use refract_proto::fn_api::{log_entry, GetProvisionInfoRequest, LogEntry, ProvisionInfo};
use refract_proto::job_api::artifact_retrieval_service_client::ArtifactRetrievalServiceClient;
use refract_proto::job_api::{GetArtifactRequest, ResolveArtifactsRequest};
use refract_proto::pipeline::ArtifactInformation;
use refract_sdk_harness::{ArtifactSource, FnApiServer, WorkerConfig};
use tonic::transport::Channel;
use tonic::Request;

struct OneFile {
    payload: Vec<u8>,
    path: PathBuf,
}

impl ArtifactSource for OneFile {
    fn open(&self, a: &ArtifactInformation) -> Option<PathBuf> {
        (a.type_payload == self.payload).then(|| self.path.clone())
    }
}

async fn channel(url: &str) -> Channel {
    Channel::from_shared(format!("http://{url}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logging_provisioning_and_artifacts_route_by_worker_id() {
    let server = FnApiServer::start("127.0.0.1").await.expect("server");
    let mut pool = FakePool::start(PoolMode::Connect).await;

    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    let content: Vec<u8> = (0..5 * 1024 * 1024 + 17).map(|i| (i % 251) as u8).collect();
    file.write_all(&content).expect("write");
    let logs = Arc::new(CollectedLogs::default());
    let provision = ProvisionInfo {
        retrieval_token: "token-1".to_string(),
        runner_capabilities: vec!["beam:protocol:monitoring_info_short_ids:v1".to_string()],
        metadata: [("job_id".to_string(), "job-7".to_string())].into(),
        ..Default::default()
    };
    let worker = within(
        "start_worker",
        server.start_worker(WorkerConfig {
            worker_id: "w-svc".to_string(),
            environment: pool.environment(),
            provision,
            artifacts: Arc::new(OneFile {
                payload: b"dep-1".to_vec(),
                path: file.path().to_path_buf(),
            }),
            logs: logs.clone(),
        }),
    )
    .await
    .expect("worker");
    let sdk = within("the fake SDK", pool.sdks.recv()).await.expect("sdk");
    assert_eq!(worker.id(), "w-svc");

    // StartWorker carried our endpoints and the payload's params.
    let start = pool.starts.recv().await.expect("start request");
    assert_eq!(start.worker_id, "w-svc");
    for endpoint in [
        &start.control_endpoint,
        &start.logging_endpoint,
        &start.artifact_endpoint,
        &start.provision_endpoint,
    ] {
        assert_eq!(endpoint.as_ref().map(|e| e.url.clone()), Some(server.url()));
    }
    assert_eq!(start.params.get("mode").map(String::as_str), Some("fake"));

    // Logging goes to the worker's sink.
    let log = sdk.open_logging().await;
    log.send(log_entry::List {
        log_entries: vec![
            LogEntry {
                message: "hello from the SDK".to_string(),
                severity: 5,
                ..Default::default()
            },
            LogEntry {
                message: "second".to_string(),
                ..Default::default()
            },
        ],
    })
    .expect("send logs");
    within("the logs", async {
        while logs.entries.lock().len() < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    {
        let entries = logs.entries.lock();
        assert_eq!(entries[0].0, "w-svc");
        assert_eq!(entries[0].1.message, "hello from the SDK");
        assert_eq!(entries[1].1.message, "second");
    }

    let ch = channel(&server.url()).await;

    // Provisioning: the caller's fields, our endpoints.
    let info = ProvisionServiceClient::new(ch.clone())
        .get_provision_info(with_worker_id("w-svc", GetProvisionInfoRequest {}))
        .await
        .expect("provision")
        .into_inner()
        .info
        .expect("info");
    assert_eq!(info.retrieval_token, "token-1");
    assert_eq!(
        info.metadata.get("job_id").map(String::as_str),
        Some("job-7")
    );
    for endpoint in [
        &info.control_endpoint,
        &info.logging_endpoint,
        &info.artifact_endpoint,
    ] {
        assert_eq!(endpoint.as_ref().map(|e| e.url.clone()), Some(server.url()));
    }
    let missing = ProvisionServiceClient::new(ch.clone())
        .get_provision_info(Request::new(GetProvisionInfoRequest {}))
        .await
        .expect_err("no header");
    assert_eq!(missing.code(), tonic::Code::InvalidArgument);
    let unknown = ProvisionServiceClient::new(ch.clone())
        .get_provision_info(with_worker_id("w-other", GetProvisionInfoRequest {}))
        .await
        .expect_err("unknown worker");
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    // Artifacts: resolve echoes, get streams the file in chunks of at most 2 MiB.
    let artifact = ArtifactInformation {
        type_urn: "beam:artifact:type:file:v1".to_string(),
        type_payload: b"dep-1".to_vec(),
        role_urn: "beam:artifact:role:staging_to:v1".to_string(),
        role_payload: vec![],
    };
    let mut artifacts = ArtifactRetrievalServiceClient::new(ch.clone());
    let resolved = artifacts
        .resolve_artifacts(with_worker_id(
            "w-svc",
            ResolveArtifactsRequest {
                artifacts: vec![artifact.clone()],
                preferred_urns: vec![],
            },
        ))
        .await
        .expect("resolve")
        .into_inner();
    assert_eq!(resolved.replacements, vec![artifact.clone()]);
    let mut stream = artifacts
        .get_artifact(with_worker_id(
            "w-svc",
            GetArtifactRequest {
                artifact: Some(artifact.clone()),
            },
        ))
        .await
        .expect("get artifact")
        .into_inner();
    let mut received = Vec::new();
    let mut chunks = 0;
    while let Some(chunk) = stream.message().await.expect("chunk") {
        assert!(chunk.data.len() <= 2 << 20);
        received.extend_from_slice(&chunk.data);
        chunks += 1;
    }
    assert!(chunks >= 3);
    assert_eq!(received, content);
    let unknown_artifact = artifacts
        .get_artifact(with_worker_id(
            "w-svc",
            GetArtifactRequest {
                artifact: Some(ArtifactInformation {
                    type_payload: b"other".to_vec(),
                    ..artifact
                }),
            },
        ))
        .await
        .expect_err("unknown artifact");
    assert_eq!(unknown_artifact.code(), tonic::Code::NotFound);

    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_are_served_by_id_with_or_without_a_worker_header() {
    use refract_proto::fn_api::beam_fn_control_client::BeamFnControlClient;
    use refract_proto::fn_api::{GetProcessBundleDescriptorRequest, ProcessBundleDescriptor};
    let server = FnApiServer::start("127.0.0.1").await.expect("server");
    server.register_descriptor(ProcessBundleDescriptor {
        id: "job-1f3a-0".to_string(),
        ..Default::default()
    });
    let mut control = BeamFnControlClient::new(channel(&server.url()).await);
    let request = || GetProcessBundleDescriptorRequest {
        process_bundle_descriptor_id: "job-1f3a-0".to_string(),
    };
    // The TypeScript SDK sends no `worker_id` header with this call.
    let found = control
        .get_process_bundle_descriptor(Request::new(request()))
        .await
        .expect("a descriptor by its id alone")
        .into_inner();
    assert_eq!(found.id, "job-1f3a-0");
    // A header that is there must name a worker this server started.
    let unknown = control
        .get_process_bundle_descriptor(with_worker_id("w-none", request()))
        .await
        .expect_err("an unknown worker");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    let missing = control
        .get_process_bundle_descriptor(Request::new(GetProcessBundleDescriptorRequest {
            process_bundle_descriptor_id: "job-other".to_string(),
        }))
        .await
        .expect_err("an unknown descriptor");
    assert_eq!(missing.code(), tonic::Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_are_checked_before_their_requests_are_read() {
    use refract_proto::fn_api::beam_fn_data_client::BeamFnDataClient;
    let server = FnApiServer::start("127.0.0.1").await.expect("server");
    let mut pool = FakePool::start(PoolMode::Connect).await;
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let worker = within(
        "start_worker",
        server.start_worker(WorkerConfig {
            worker_id: "w-own".to_string(),
            environment: pool.environment(),
            provision: ProvisionInfo::default(),
            artifacts: Arc::new(OneFile {
                payload: b"dep-own".to_vec(),
                path: file.path().to_path_buf(),
            }),
            logs: Arc::new(CollectedLogs::default()),
        }),
    )
    .await
    .expect("worker");
    let _sdk = within("the fake SDK", pool.sdks.recv()).await.expect("sdk");
    let ch = channel(&server.url()).await;
    let mut artifacts = ArtifactRetrievalServiceClient::new(ch.clone());
    let artifact = |payload: Vec<u8>| ArtifactInformation {
        type_urn: "beam:artifact:type:file:v1".to_string(),
        type_payload: payload,
        ..Default::default()
    };
    let resolve = |payload: Vec<u8>| ResolveArtifactsRequest {
        artifacts: vec![artifact(payload)],
        preferred_urns: vec![],
    };

    // 24 MiB from a caller naming no worker of this server, or none at
    // all: refused for who is calling, which is known before the body is
    // read (a read body would be refused for its size).
    let big = || resolve(vec![7; 24 << 20]);
    let stranger = artifacts
        .resolve_artifacts(with_worker_id("w-own-guessed", big()))
        .await
        .expect_err("an unknown worker");
    assert_eq!(stranger.code(), tonic::Code::NotFound, "{stranger:?}");
    let anonymous = artifacts
        .resolve_artifacts(Request::new(big()))
        .await
        .expect_err("no worker header");
    assert_eq!(anonymous.code(), tonic::Code::InvalidArgument);
    // The worker itself may not send that much in a unary call either.
    let too_big = artifacts
        .resolve_artifacts(with_worker_id("w-own", big()))
        .await
        .expect_err("over the unary limit");
    assert_eq!(too_big.code(), tonic::Code::OutOfRange, "{too_big:?}");

    // A worker resolves its own artifacts only.
    let own = artifacts
        .resolve_artifacts(with_worker_id("w-own", resolve(b"dep-own".to_vec())))
        .await
        .expect("its own artifact")
        .into_inner();
    assert_eq!(own.replacements, vec![artifact(b"dep-own".to_vec())]);
    let other = artifacts
        .resolve_artifacts(with_worker_id(
            "w-own",
            resolve(b"dep-of-another-job".to_vec()),
        ))
        .await
        .expect_err("another job's artifact");
    assert_eq!(other.code(), tonic::Code::NotFound);
    assert!(other.message().contains("has no artifact"), "{other:?}");

    // Streams are refused the same way before their first message.
    let data = BeamFnDataClient::new(ch.clone())
        .data(with_worker_id("w-own-guessed", futures::stream::pending()))
        .await
        .expect_err("an unknown worker's data stream");
    assert_eq!(data.code(), tonic::Code::NotFound);

    // The server still serves its worker.
    let info = ProvisionServiceClient::new(ch)
        .get_provision_info(with_worker_id("w-own", GetProvisionInfoRequest {}))
        .await;
    assert!(info.is_ok(), "{info:?}");
    worker.stop().await;
}
