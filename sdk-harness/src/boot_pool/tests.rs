//! The boot-program pool over real gRPC, its "boot program" a shell script
//! that records its arguments and pid, then waits to be killed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use refract_proto::fn_api::beam_fn_external_worker_pool_client::BeamFnExternalWorkerPoolClient;
use refract_proto::fn_api::{StartWorkerRequest, StopWorkerRequest};
use refract_proto::pipeline::ApiServiceDescriptor;
use tokio::sync::oneshot;
use tonic::transport::Channel;

use super::{BootPool, BootPoolConfig};

/// A boot script writing `DIR/ID.args` (its arguments, one per line) and
/// `DIR/ID.pid`, then sleeping; with `exit` it ends at once instead.
fn boot_script(dir: &Path, exit: bool) -> PathBuf {
    let path = dir.join(if exit { "boot-exits.sh" } else { "boot.sh" });
    let body = format!(
        "#!/bin/sh\nid=''\nfor a in \"$@\"; do case \"$a\" in --id=*) id=${{a#--id=}};; esac; done\n\
         printf '%s\\n' \"$@\" > {dir}/$id.args\necho $$ > {dir}/$id.pid\n{rest}\n",
        dir = dir.display(),
        rest = if exit { "exit 3" } else { "exec sleep 600" }
    );
    std::fs::write(&path, body).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    path
}

struct Served {
    client: BeamFnExternalWorkerPoolClient<Channel>,
    /// The pool's own address: a gRPC server, so a runner that answers.
    addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    async fn shut_down(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.unwrap();
    }
}

async fn serve(boot: PathBuf, max_workers: usize) -> Served {
    serve_with(boot, max_workers, None, None).await
}

async fn serve_with(
    boot: PathBuf,
    max_workers: usize,
    callers: Option<crate::PoolCallers>,
    runner_timeout: Option<Duration>,
) -> Served {
    let pool = BootPool::new(BootPoolConfig {
        boot,
        max_workers,
        local_peers: refract_peercred::LocalPeers::SameUser,
        callers,
        runner_timeout,
    })
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        pool.serve(listener, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    let client = BeamFnExternalWorkerPoolClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    Served {
        client,
        addr,
        stop: Some(stop),
        task,
    }
}

fn request(id: &str) -> StartWorkerRequest {
    let endpoint = |port: u16| {
        Some(ApiServiceDescriptor {
            url: format!("runner.example:{port}"),
            ..Default::default()
        })
    };
    StartWorkerRequest {
        worker_id: id.to_string(),
        control_endpoint: endpoint(1),
        logging_endpoint: endpoint(2),
        artifact_endpoint: endpoint(3),
        provision_endpoint: endpoint(4),
        ..Default::default()
    }
}

async fn start(served: &mut Served, request: StartWorkerRequest) -> String {
    served
        .client
        .start_worker(request)
        .await
        .unwrap()
        .into_inner()
        .error
}

/// Starts worker `id` once the pool has room for it (a worker that ended
/// is forgotten soon after, not at once): the last error, empty on success.
async fn start_once_free(served: &mut Served, id: &str) -> String {
    let mut error = String::new();
    for _ in 0..200 {
        error = start(served, request(id)).await;
        if error.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    error
}

/// Waits for `path` to exist (the script writes it once it runs).
async fn read_when_written(path: &Path) -> String {
    for _ in 0..200 {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{} was not written", path.display());
}

fn alive(pid: &str) -> bool {
    Path::new(&format!("/proc/{}", pid.trim())).exists()
}

async fn wait_dead(pid: &str) {
    for _ in 0..200 {
        if !alive(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("process {pid} still alive");
}

#[tokio::test]
async fn start_runs_the_boot_program_with_the_endpoints_and_stop_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut served = serve(boot_script(dir.path(), false), 4).await;
    assert_eq!(start(&mut served, request("job-1-w1")).await, "");
    let args = read_when_written(&dir.path().join("job-1-w1.args")).await;
    let args: Vec<&str> = args.lines().collect();
    assert_eq!(
        &args[..5],
        [
            "--id=job-1-w1",
            "--provision_endpoint=runner.example:4",
            "--control_endpoint=runner.example:1",
            "--logging_endpoint=runner.example:2",
            "--artifact_endpoint=runner.example:3",
        ]
    );
    let scratch = args[5].strip_prefix("--semi_persist_dir=").unwrap();
    assert!(Path::new(scratch).is_dir(), "{scratch}");
    let pid = read_when_written(&dir.path().join("job-1-w1.pid")).await;
    assert!(alive(&pid));

    served
        .client
        .stop_worker(StopWorkerRequest {
            worker_id: "job-1-w1".into(),
        })
        .await
        .unwrap();
    wait_dead(&pid).await;
    // The worker's scratch directory goes with it.
    for _ in 0..200 {
        if !Path::new(scratch).exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(!Path::new(scratch).exists());
    served.shut_down().await;
}

#[tokio::test]
async fn malformed_requests_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut served = serve(boot_script(dir.path(), false), 4).await;
    assert!(start(&mut served, request(""))
        .await
        .contains("no worker id"));
    assert!(start(&mut served, request("../../etc"))
        .await
        .contains("characters other than"));
    assert!(start(&mut served, request(&"w".repeat(500)))
        .await
        .contains("at most"));
    let mut no_control = request("w1");
    no_control.control_endpoint = None;
    assert!(start(&mut served, no_control)
        .await
        .contains("no control endpoint"));
    let mut no_provision = request("w1");
    no_provision.provision_endpoint = None;
    assert!(start(&mut served, no_provision)
        .await
        .contains("no provision endpoint"));
    // Nothing was started.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    served.shut_down().await;
}

#[tokio::test]
async fn workers_beyond_the_maximum_are_refused_until_one_ends() {
    let dir = tempfile::tempdir().unwrap();
    let mut served = serve(boot_script(dir.path(), false), 2).await;
    assert_eq!(start(&mut served, request("w1")).await, "");
    assert_eq!(start(&mut served, request("w2")).await, "");
    assert!(start(&mut served, request("w3"))
        .await
        .contains("maximum of 2"));
    // A worker that ends by itself frees its place.
    let pid = read_when_written(&dir.path().join("w1.pid")).await;
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid.trim().parse().unwrap()).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    assert_eq!(start_once_free(&mut served, "w3").await, "");
    served.shut_down().await;
}

#[tokio::test]
async fn a_reused_id_replaces_the_running_worker() {
    let dir = tempfile::tempdir().unwrap();
    let mut served = serve(boot_script(dir.path(), false), 4).await;
    assert_eq!(start(&mut served, request("w1")).await, "");
    let first = read_when_written(&dir.path().join("w1.pid")).await;
    std::fs::remove_file(dir.path().join("w1.pid")).unwrap();
    assert_eq!(start(&mut served, request("w1")).await, "");
    let second = read_when_written(&dir.path().join("w1.pid")).await;
    assert_ne!(first, second);
    wait_dead(&first).await;
    assert!(alive(&second));
    served.shut_down().await;
    // Stopping the pool stops its workers.
    wait_dead(&second).await;
}

#[tokio::test]
async fn a_boot_program_that_exits_is_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let mut served = serve(boot_script(dir.path(), true), 1).await;
    assert_eq!(start(&mut served, request("w1")).await, "");
    read_when_written(&dir.path().join("w1.pid")).await;
    // Its place is free again once it has exited.
    assert_eq!(start_once_free(&mut served, "w2").await, "");
    served.shut_down().await;
}

#[test]
fn a_missing_or_non_executable_boot_program_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let missing = BootPool::new(BootPoolConfig {
        boot: dir.path().join("nope"),
        max_workers: 1,
        local_peers: refract_peercred::LocalPeers::SameUser,
        callers: None,
        runner_timeout: None,
    });
    assert!(missing.err().unwrap().to_string().contains("nope"));
    let plain = dir.path().join("plain.sh");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    let refused = BootPool::new(BootPoolConfig {
        boot: plain,
        max_workers: 1,
        local_peers: refract_peercred::LocalPeers::SameUser,
        callers: None,
        runner_timeout: None,
    });
    assert!(refused
        .err()
        .unwrap()
        .to_string()
        .contains("not executable"));
}

#[tokio::test]
async fn a_pool_with_a_token_serves_only_callers_that_carry_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "a-token-of-24-characters\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let token = crate::PoolToken::read_file(&file).unwrap();
    let callers = crate::PoolCallers::read_file(&file).unwrap();
    let mut served = serve_with(boot_script(dir.path(), false), 2, Some(callers), None).await;

    let refused = served
        .client
        .start_worker(request("w-anon"))
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert!(refused.message().contains("--token_file"), "{refused:?}");
    assert!(!dir.path().join("w-anon.pid").exists(), "nothing ran");

    let mut carrying = tonic::Request::new(request("w-token"));
    token.attach(&mut carrying);
    let started = served.client.start_worker(carrying).await.unwrap();
    assert_eq!(started.into_inner().error, "");
    read_when_written(&dir.path().join("w-token.pid")).await;

    let stop = StopWorkerRequest {
        worker_id: "w-token".to_string(),
    };
    let refused = served
        .client
        .stop_worker(stop.clone())
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let mut carrying = tonic::Request::new(stop);
    token.attach(&mut carrying);
    served.client.stop_worker(carrying).await.unwrap();
    served.shut_down().await;
}

/// `message` as a request carrying `token`.
fn with_token<T>(message: T, token: &crate::PoolToken) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    token.attach(&mut request);
    request
}

#[tokio::test]
async fn a_caller_stops_and_replaces_only_the_workers_it_started() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(
        &file,
        "token-of-caller-one-0001\ntoken-of-caller-two-0002\n",
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let callers = crate::PoolCallers::read_file(&file).unwrap();
    let token = |text: &str| {
        let path = dir.path().join("one-token");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        crate::PoolToken::read_file(&path).unwrap()
    };
    let (one, two) = (
        token("token-of-caller-one-0001"),
        token("token-of-caller-two-0002"),
    );
    let mut served = serve_with(boot_script(dir.path(), false), 4, Some(callers), None).await;
    let started = served
        .client
        .start_worker(with_token(request("w1"), &one))
        .await
        .unwrap();
    assert_eq!(started.into_inner().error, "");
    let pid = read_when_written(&dir.path().join("w1.pid")).await;

    // The other caller can neither stop it nor start another under its id.
    let stop = StopWorkerRequest {
        worker_id: "w1".to_string(),
    };
    let stopped = served
        .client
        .stop_worker(with_token(stop.clone(), &two))
        .await
        .unwrap();
    assert_eq!(stopped.into_inner().error, "", "as for an unknown id");
    let replaced = served
        .client
        .start_worker(with_token(request("w1"), &two))
        .await
        .unwrap()
        .into_inner()
        .error;
    assert!(replaced.contains("another caller"), "{replaced}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(alive(&pid), "the first caller's worker runs on");

    // Its own caller can.
    served
        .client
        .stop_worker(with_token(stop, &one))
        .await
        .unwrap();
    wait_dead(&pid).await;
    served.shut_down().await;
}

#[tokio::test]
async fn a_worker_whose_runner_stops_answering_is_stopped_and_its_place_freed() {
    let dir = tempfile::tempdir().unwrap();
    let mut served = serve_with(
        boot_script(dir.path(), false),
        2,
        None,
        Some(Duration::from_secs(1)),
    )
    .await;
    // A runner whose host accepts connections but whose server never
    // answers (the kernel completes the handshake of an unaccepted socket).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let for_runner = |id: &str, runner: String| {
        let mut request = request(id);
        request.provision_endpoint = Some(ApiServiceDescriptor {
            url: runner,
            ..Default::default()
        });
        request
    };
    let answering = served.addr.to_string();
    let gone = silent.local_addr().unwrap().to_string();
    assert_eq!(
        start(&mut served, for_runner("w-live", answering.clone())).await,
        ""
    );
    assert_eq!(start(&mut served, for_runner("w-gone", gone)).await, "");
    let live = read_when_written(&dir.path().join("w-live.pid")).await;
    let lost = read_when_written(&dir.path().join("w-gone.pid")).await;

    for _ in 0..400 {
        if !alive(&lost) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(!alive(&lost), "the silent runner's worker was stopped");
    // Several probe rounds later the answering runner's worker runs on.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(alive(&live));
    // The stopped worker's place is free: a second worker fits beside the
    // live one in a pool of two.
    assert_eq!(
        start(&mut served, for_runner("w-next", answering)).await,
        ""
    );
    served.shut_down().await;
    drop(silent);
}
