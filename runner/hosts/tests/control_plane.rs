//! The control plane over real gRPC: a coordinator's listener and hosts
//! attaching to it, proving the secret both ways, reporting on a run,
//! fetching its staged files, and being noticed when they go.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use refract_hosts::{attach, ClusterSecret, CoordinatorServer, HostsError, RunEvent};
use refract_proto::hosts::{host_command, run_report, JobMessage, RunShards};
use sha2::{Digest, Sha256};

fn secret(text: &str) -> ClusterSecret {
    ClusterSecret::new(text).expect("a long enough secret")
}

async fn coordinator() -> CoordinatorServer {
    CoordinatorServer::bind("127.0.0.1:0", secret("the-cluster-secret-0123"))
        .await
        .expect("listening")
}

async fn wait_for_hosts(server: &CoordinatorServer, count: usize) {
    for _ in 0..200 {
        if server.directory().hosts().len() == count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{count} hosts did not attach");
}

#[tokio::test]
async fn a_host_attaches_runs_reports_and_is_noticed_when_it_goes() {
    let server = coordinator().await;
    let address = server.addr().to_string();
    let (attachment, mut commands) = attach(
        &address,
        &secret("the-cluster-secret-0123"),
        "host-a",
        "127.0.0.1:1",
    )
    .await
    .expect("attached");
    wait_for_hosts(&server, 1).await;
    let hosts = server.directory().hosts();
    assert_eq!(hosts[0].name, "host-a");
    assert_eq!(hosts[0].exchange_address, "127.0.0.1:1");
    assert_eq!(hosts[0].id.number(), attachment.host);

    // A staged file the run offers, fetched by its hash.
    let dir = tempfile::tempdir().unwrap();
    let staged = dir.path().join("staged");
    let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&staged, &bytes).unwrap();
    let sha = hex::encode(Sha256::digest(&bytes));
    let mut handle = server.directory().open_run(
        "run-1",
        &[hosts[0].id],
        HashMap::from([(sha.clone(), staged.clone())]),
    );
    handle
        .send(
            hosts[0].id,
            host_command::Body::Run(RunShards {
                run: "run-1".into(),
                ..RunShards::default()
            }),
        )
        .await
        .expect("sent");
    let command = commands.message().await.expect("a command").expect("open");
    let Some(host_command::Body::Run(run)) = command.body else {
        panic!("not a run: {command:?}");
    };
    assert_eq!(run.run, "run-1");
    let fetched = dir.path().join("fetched");
    attachment
        .fetch("run-1", &sha, bytes.len() as u64, &fetched)
        .await
        .expect("fetched");
    assert_eq!(std::fs::read(&fetched).unwrap(), bytes);
    // A wrong length or an unknown hash is refused.
    let short = attachment
        .fetch("run-1", &sha, 10, &dir.path().join("short"))
        .await
        .expect_err("longer than said");
    assert!(matches!(short, HostsError::Fetch { .. }), "{short}");
    let unknown = attachment
        .fetch("run-1", &"0".repeat(64), 1, &dir.path().join("unknown"))
        .await
        .expect_err("not staged");
    assert!(
        unknown.to_string().contains("no such staged file"),
        "{unknown}"
    );

    // Reports reach the run.
    let reporter = attachment.reporter("run-1");
    assert!(
        reporter
            .send(run_report::Body::Message(JobMessage {
                importance: 2,
                text: "hello from a host".into(),
            }))
            .await
    );
    match tokio::time::timeout(Duration::from_secs(10), handle.events.recv())
        .await
        .expect("in time")
    {
        Some(RunEvent::Report {
            body: run_report::Body::Message(m),
            ..
        }) => assert_eq!(m.text, "hello from a host"),
        other => panic!("not the message: {other:?}"),
    }
    // The host goes: the run hears it at once.
    drop((reporter, attachment, commands));
    match tokio::time::timeout(Duration::from_secs(10), handle.events.recv())
        .await
        .expect("in time")
    {
        Some(RunEvent::HostLost(id)) => assert_eq!(id, hosts[0].id),
        other => panic!("not a lost host: {other:?}"),
    }
    wait_for_hosts(&server, 0).await;
}

#[tokio::test]
async fn the_secret_is_proved_both_ways() {
    let server = coordinator().await;
    let address = server.addr().to_string();
    let refused = attach(
        &address,
        &secret("not-the-cluster-secret"),
        "stranger",
        "127.0.0.1:1",
    )
    .await
    .expect_err("the wrong secret");
    assert!(refused.to_string().contains("does not match"), "{refused}");
    assert!(server.directory().hosts().is_empty());

    // A coordinator with another secret cannot give a host work, even
    // though it lets the host in.
    let stranger = CoordinatorServer::bind("127.0.0.1:0", secret("not-the-cluster-secret"))
        .await
        .unwrap();
    let refused = attach(
        &stranger.addr().to_string(),
        &secret("not-the-cluster-secret-either"),
        "careful",
        "127.0.0.1:1",
    )
    .await
    .expect_err("the stranger refuses it");
    assert!(refused.to_string().contains("does not match"), "{refused}");
}

#[tokio::test]
async fn a_stream_without_hello_is_refused_and_harms_nothing() {
    use refract_proto::hosts::shard_hosts_client::ShardHostsClient;
    use refract_proto::hosts::{host_message, HostMessage, RunReport};
    let server = coordinator().await;
    let mut client = ShardHostsClient::connect(format!("http://{}", server.addr()))
        .await
        .unwrap();
    let report = HostMessage {
        body: Some(host_message::Body::Report(RunReport {
            run: "run-x".into(),
            body: None,
        })),
    };
    let refused = client
        .attach(tokio_stream::iter(vec![report]))
        .await
        .expect_err("no Hello first");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    // The server still takes a proper host.
    attach(
        &server.addr().to_string(),
        &secret("the-cluster-secret-0123"),
        "host-b",
        "127.0.0.1:2",
    )
    .await
    .expect("attached");
}
