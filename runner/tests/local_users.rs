//! Another user of the machine cannot use a server's ports: the job port,
//! the Fn API, the web UI and a worker pool close their connections unread
//! (or, for the UI, refuse their requests), while this user's own
//! connections are served.
//!
//! The other user is a uid made up by the test, which has no account: the
//! kernel tells sockets apart by uid alone. Switching to it needs root, so
//! the test says so and passes trivially when not run as root (CI runs it
//! as root).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;

use clap::Parser;
use common::{probe, TestServer};
use refract::cli::{Cli, Command};
use refract_peercred::{current_uid, LocalPeers};
use refract_sdk_harness::{BootPool, BootPoolConfig};

/// A uid no account has: the "other user".
const OTHER_UID: u32 = 40_123;
/// What an HTTP/2 client says first; a server answers with a SETTINGS frame.
const HTTP2_PREFACE: &str = "PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n";

fn port_of(host_port: &str) -> u16 {
    host_port.rsplit_once(':').unwrap().1.parse().unwrap()
}

fn running_as_root() -> bool {
    if current_uid() == Some(0) {
        return true;
    }
    eprintln!("skipped: switching to another uid needs root");
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_users_cannot_use_the_job_port_the_fn_api_or_the_ui() {
    if !running_as_root() {
        return;
    }
    let argv = ["refract", "serve", "--job_port", "0", "--ui_port", "0"];
    let args = match Cli::try_parse_from(argv).unwrap().command {
        Some(Command::Serve(args)) => args,
        other => panic!("not serve flags: {other:?}"),
    };
    let server = TestServer::start_with(args).await;
    let job_port = server.server.job_endpoint.port();
    let fn_port = port_of(&server.server.fn_api);
    let ui_port = server.server.ui_address.expect("the UI is served").port();

    for (name, port) in [("job API", job_port), ("Fn API", fn_port)] {
        let own = probe(None, port, HTTP2_PREFACE, 9).await;
        assert!(own.len() >= 9, "{name}: this user gets HTTP/2 SETTINGS");
        let other = probe(Some(OTHER_UID), port, HTTP2_PREFACE, 9).await;
        assert!(
            other.is_empty(),
            "{name}: another user's connection is closed unread, got {other:?}"
        );
    }

    let get = "GET /api/jobs HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n";
    let own = String::from_utf8_lossy(&probe(None, ui_port, get, 12).await).into_owned();
    assert!(own.starts_with("HTTP/1.0 200"), "this user: {own}");
    let other =
        String::from_utf8_lossy(&probe(Some(OTHER_UID), ui_port, get, 12).await).into_owned();
    assert!(other.starts_with("HTTP/1.0 403"), "another user: {other}");

    // The server serves on for its own user.
    let own = probe(None, job_port, HTTP2_PREFACE, 9).await;
    assert!(own.len() >= 9);
    server.server.stop().await.expect("stops");

    // A server shared on purpose serves the other user too: the probe
    // itself reaches servers as that user.
    let shared = TestServer::start_with(common::serve_args(&["--local_peers", "anyone"])).await;
    let port = shared.server.job_endpoint.port();
    assert!(probe(Some(OTHER_UID), port, HTTP2_PREFACE, 9).await.len() >= 9);
    shared.server.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_users_cannot_ask_a_worker_pool_for_workers() {
    if !running_as_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let boot = dir.path().join("boot.sh");
    std::fs::write(&boot, "#!/bin/sh\nsleep 60\n").unwrap();
    std::fs::set_permissions(&boot, std::fs::Permissions::from_mode(0o755)).unwrap();
    let pool = BootPool::new(BootPoolConfig {
        boot,
        max_workers: 1,
        local_peers: LocalPeers::SameUser,
        callers: None,
        runner_timeout: None,
    })
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(pool.serve(listener, async {
        let _ = stopped.await;
    }));
    assert!(probe(None, port, HTTP2_PREFACE, 9).await.len() >= 9);
    assert!(probe(Some(OTHER_UID), port, HTTP2_PREFACE, 9)
        .await
        .is_empty());
    let _ = stop.send(());
    served.await.unwrap().unwrap();
}
