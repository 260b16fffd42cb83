//! Against the real Python SDK harness (apache_beam 2.77): a worker pool
//! (EXTERNAL environment) and a boot script (PROCESS environment) run a
//! hand-built bundle descriptor: two data sources → Flatten → ToString → sink.
//! Skipped, with a message, where `import apache_beam` fails.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod beam_python;
mod fake_sdk;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use beam_python::beam_python;
use bytes::Bytes;
use fake_sdk::CollectedLogs;
use prost::Message;
use refract_proto::fn_api::{ProcessBundleDescriptor, RemoteGrpcPort, StateRequest, StateResponse};
use refract_proto::pipeline::{
    accumulation_mode, closing_behavior, is_bounded, merge_status, on_time_behavior, output_time,
    trigger, ApiServiceDescriptor, Coder, Environment, ExternalPayload, FunctionSpec, PCollection,
    PTransform, ProcessPayload, Trigger, WindowingStrategy,
};
use refract_sdk_harness::{
    BundleError, BundleRequest, FnApiServer, NoArtifacts, StateHandler, Worker, WorkerConfig,
};
use tokio::process::{Child, Command};

/// Timestamp (the minimum), one window (global: no bytes), pane NO_FIRING.
const HEADER: [u8; 13] = [
    0x7f, 0xdf, 0x3b, 0x64, 0x5a, 0x1c, 0xac, 0x09, 0, 0, 0, 1, 0x0f,
];

fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn read_varint(bytes: &[u8], pos: &mut usize) -> u64 {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = bytes[*pos];
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return value;
        }
        shift += 7;
    }
}

/// A windowed KV<string, varint> in the global window.
fn element(key: &str, value: u64) -> Vec<u8> {
    let mut out = HEADER.to_vec();
    varint(key.len() as u64, &mut out);
    out.extend_from_slice(key.as_bytes());
    varint(value, &mut out);
    out
}

/// Decodes concatenated windowed KV<string, string>s.
fn decode_outputs(bytes: &[u8]) -> Vec<(String, String)> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < bytes.len() {
        assert_eq!(
            &bytes[pos..pos + HEADER.len()],
            HEADER,
            "windowed value header"
        );
        pos += HEADER.len();
        let mut field = || {
            let len = read_varint(bytes, &mut pos) as usize;
            let s = String::from_utf8(bytes[pos..pos + len].to_vec()).expect("utf8");
            pos += len;
            s
        };
        let key = field();
        let value = field();
        out.push((key, value));
    }
    out
}

fn coder(urn: &str, components: &[&str]) -> Coder {
    Coder {
        spec: Some(FunctionSpec {
            urn: urn.to_string(),
            payload: vec![],
        }),
        component_coder_ids: components.iter().map(|c| c.to_string()).collect(),
    }
}

fn pcollection(coder_id: &str) -> PCollection {
    PCollection {
        unique_name: coder_id.to_string(),
        coder_id: coder_id.to_string(),
        is_bounded: is_bounded::Enum::Bounded as i32,
        windowing_strategy_id: "ws".to_string(),
        display_data: vec![],
    }
}

fn transform(
    name: &str,
    urn: &str,
    payload: Vec<u8>,
    inputs: &[(&str, &str)],
    outputs: &[(&str, &str)],
) -> PTransform {
    let map = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    PTransform {
        unique_name: name.to_string(),
        spec: Some(FunctionSpec {
            urn: urn.to_string(),
            payload,
        }),
        inputs: map(inputs),
        outputs: map(outputs),
        ..Default::default()
    }
}

fn port(url: &str, coder_id: &str) -> Vec<u8> {
    RemoteGrpcPort {
        api_service_descriptor: Some(ApiServiceDescriptor {
            url: url.to_string(),
            authentication: None,
        }),
        coder_id: coder_id.to_string(),
    }
    .encode_to_vec()
}

/// src_a, src_b → Flatten → ToString → sink.
fn descriptor(id: &str, url: &str) -> ProcessBundleDescriptor {
    let coders = [
        ("c_str", coder("beam:coder:string_utf8:v1", &[])),
        ("c_varint", coder("beam:coder:varint:v1", &[])),
        ("c_kv_in", coder("beam:coder:kv:v1", &["c_str", "c_varint"])),
        ("c_kv_out", coder("beam:coder:kv:v1", &["c_str", "c_str"])),
        ("c_gw", coder("beam:coder:global_window:v1", &[])),
        (
            "c_wv_in",
            coder("beam:coder:windowed_value:v1", &["c_kv_in", "c_gw"]),
        ),
        (
            "c_wv_out",
            coder("beam:coder:windowed_value:v1", &["c_kv_out", "c_gw"]),
        ),
    ];
    let pcollections = [
        ("pc_a", pcollection("c_kv_in")),
        ("pc_b", pcollection("c_kv_in")),
        ("pc_flat", pcollection("c_kv_in")),
        ("pc_str", pcollection("c_kv_out")),
    ];
    let transforms = [
        (
            "src_a",
            transform(
                "src_a",
                "beam:runner:source:v1",
                port(url, "c_wv_in"),
                &[],
                &[("out", "pc_a")],
            ),
        ),
        (
            "src_b",
            transform(
                "src_b",
                "beam:runner:source:v1",
                port(url, "c_wv_in"),
                &[],
                &[("out", "pc_b")],
            ),
        ),
        (
            "flatten",
            transform(
                "Flatten",
                "beam:transform:flatten:v1",
                vec![],
                &[("0", "pc_a"), ("1", "pc_b")],
                &[("out", "pc_flat")],
            ),
        ),
        (
            "to_string",
            transform(
                "ToString",
                "beam:transform:to_string:v1",
                vec![],
                &[("in", "pc_flat")],
                &[("out", "pc_str")],
            ),
        ),
        (
            "sink",
            transform(
                "sink",
                "beam:runner:sink:v1",
                port(url, "c_wv_out"),
                &[("in", "pc_str")],
                &[],
            ),
        ),
    ];
    let windowing = WindowingStrategy {
        window_fn: Some(FunctionSpec {
            urn: "beam:window_fn:global_windows:v1".to_string(),
            payload: vec![],
        }),
        merge_status: merge_status::Enum::NonMerging as i32,
        window_coder_id: "c_gw".to_string(),
        trigger: Some(Trigger {
            trigger: Some(trigger::Trigger::Default(trigger::Default {})),
        }),
        accumulation_mode: accumulation_mode::Enum::Discarding as i32,
        output_time: output_time::Enum::EndOfWindow as i32,
        closing_behavior: closing_behavior::Enum::EmitAlways as i32,
        allowed_lateness: 0,
        on_time_behavior: on_time_behavior::Enum::FireAlways as i32,
        assigns_to_one_window: false,
        environment_id: String::new(),
    };
    ProcessBundleDescriptor {
        id: id.to_string(),
        transforms: transforms
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        pcollections: pcollections
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        windowing_strategies: [("ws".to_string(), windowing)].into(),
        coders: coders
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        ..Default::default()
    }
}

struct NoState;
impl StateHandler for NoState {
    fn handle(&self, _r: &StateRequest) -> StateResponse {
        StateResponse {
            error: "this test uses no state".to_string(),
            ..Default::default()
        }
    }
}

fn bundle(
    instruction_id: &str,
    descriptor_id: &str,
    a: Vec<Bytes>,
    b: Vec<Bytes>,
) -> BundleRequest {
    BundleRequest {
        instruction_id: instruction_id.to_string(),
        descriptor_id: descriptor_id.to_string(),
        inputs: vec![("src_a".to_string(), a), ("src_b".to_string(), b)],
        timers: vec![],
        expected_sinks: vec!["sink".to_string()],
        expected_timer_families: vec![],
        state: Arc::new(NoState),
        overflow: None,
    }
}

/// Runs the checks every real-harness test shares.
async fn exercise(worker: &Arc<Worker>, descriptor_id: &str, tag: &str) {
    // Two chunks on one source, one on the other, and the keys survive.
    let a1 = [element("a", 1), element("bb", 22)].concat();
    let a2 = element("ccc", 333);
    let b1 = element("d", 4_000_000);
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        worker.process_bundle(bundle(
            &format!("{tag}-1"),
            descriptor_id,
            vec![Bytes::from(a1), Bytes::from(a2)],
            vec![Bytes::from(b1)],
        )),
    )
    .await
    .expect("bundle finishes")
    .expect("bundle succeeds");
    let mut got = decode_outputs(&result.outputs["sink"].concat());
    got.sort();
    let want: Vec<(String, String)> = [("a", "1"), ("bb", "22"), ("ccc", "333"), ("d", "4000000")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(got, want);
    assert!(
        !result.response.monitoring_infos.is_empty(),
        "Python reports metrics"
    );

    // A source with no data still gets its is_last, and the bundle ends.
    let result = worker
        .process_bundle(bundle(&format!("{tag}-2"), descriptor_id, vec![], vec![]))
        .await
        .expect("empty bundle succeeds");
    assert!(result.outputs.get("sink").is_none_or(|b| b.is_empty()));

    // Garbage input fails the bundle with the SDK's traceback.
    let err = worker
        .process_bundle(bundle(
            &format!("{tag}-3"),
            descriptor_id,
            // A whole windowed value whose pane byte has an encoding type
            // (0xF_) that does not exist: every decoder must reject it. (A
            // merely truncated element is not enough: the compiled and the
            // pure-Python decoders differ on what they make of it.)
            vec![Bytes::from_static(&[
                0x7f, 0xdf, 0x3b, 0x64, 0x5a, 0x1c, 0xac, 0x09, 0, 0, 0, 1, 0xf0, 0,
            ])],
            vec![],
        ))
        .await
        .expect_err("garbage fails");
    match err {
        BundleError::Sdk(text) => assert!(text.contains("Traceback"), "{text}"),
        other => panic!("expected an SDK error, got {other:?}"),
    }

    // Concurrent bundles on the same worker afterwards.
    let runs: Vec<_> = (0..3)
        .map(|i| {
            let worker = Arc::clone(worker);
            let req = bundle(
                &format!("{tag}-c{i}"),
                descriptor_id,
                vec![Bytes::from(element(&format!("k{i}"), i))],
                vec![],
            );
            tokio::spawn(async move { worker.process_bundle(req).await })
        })
        .collect();
    for (i, run) in runs.into_iter().enumerate() {
        let result = run.await.expect("join").expect("concurrent bundle");
        assert_eq!(
            decode_outputs(&result.outputs["sink"].concat()),
            vec![(format!("k{i}"), i.to_string())]
        );
    }
}

/// Kills a process group when dropped, so Python children never outlive the test.
struct GroupGuard(Child);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self
            .0
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_worker_pool_runs_a_bundle() {
    let Some(python) = beam_python() else {
        return;
    };
    let port = free_port();
    let mut pool = Command::new(&python);
    // Beam's pool starts each worker as `python` from PATH: the
    // interpreter's own directory first, as in an activated virtualenv.
    if let Some(bin) = std::path::Path::new(&python).parent() {
        if !bin.as_os_str().is_empty() {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let dirs = std::iter::once(bin.to_path_buf()).chain(std::env::split_paths(&path));
            pool.env("PATH", std::env::join_paths(dirs).expect("PATH joins"));
        }
    }
    let pool = pool
        .args([
            "-m",
            "apache_beam.runners.worker.worker_pool_main",
            &format!("--service_port={port}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("start the worker pool");
    let _pool = GroupGuard(pool);
    let pool_url = format!("localhost:{port}");
    tokio::time::timeout(Duration::from_secs(60), async {
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the worker pool listens");

    let server = FnApiServer::start("127.0.0.1").await.expect("server");
    server.register_descriptor(descriptor("pbd-external", &server.url()));
    let worker = tokio::time::timeout(
        Duration::from_secs(120),
        server.start_worker(WorkerConfig {
            worker_id: "py-external-1".to_string(),
            environment: Environment {
                urn: "beam:env:external:v1".to_string(),
                payload: ExternalPayload {
                    endpoint: Some(ApiServiceDescriptor {
                        url: pool_url,
                        authentication: None,
                    }),
                    params: HashMap::new(),
                }
                .encode_to_vec(),
                ..Default::default()
            },
            provision: Default::default(),
            artifacts: Arc::new(NoArtifacts),
            logs: Arc::new(CollectedLogs::default()),
        }),
    )
    .await
    .expect("start_worker finishes")
    .expect("the Python worker connects");

    exercise(&worker, "pbd-external", "ext").await;
    worker.stop().await;
    assert!(worker.disconnected().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_environment_runs_a_bundle_and_forwards_logs() {
    let Some(python) = beam_python() else {
        return;
    };
    // A minimal boot program: what Beam's container boot does, minus
    // provisioning and artifacts.
    let dir = tempfile::tempdir().expect("temp dir");
    let boot = dir.path().join("boot.sh");
    std::fs::write(
        &boot,
        r#"#!/bin/sh
for arg in "$@"; do
  case "$arg" in
    --id=*) WORKER_ID="${arg#--id=}" ;;
    --control_endpoint=*) CONTROL="${arg#--control_endpoint=}" ;;
    --logging_endpoint=*) LOGGING="${arg#--logging_endpoint=}" ;;
  esac
done
export WORKER_ID
export CONTROL_API_SERVICE_DESCRIPTOR="url: '$CONTROL'"
export LOGGING_API_SERVICE_DESCRIPTOR="url: '$LOGGING'"
export PIPELINE_OPTIONS='{}'
exec "$BEAM_PYTHON" -m apache_beam.runners.worker.sdk_worker_main
"#,
    )
    .expect("write boot");
    std::fs::set_permissions(&boot, std::fs::Permissions::from_mode(0o755)).expect("chmod");

    let server = FnApiServer::start("127.0.0.1").await.expect("server");
    server.register_descriptor(descriptor("pbd-process", &server.url()));
    let logs = Arc::new(CollectedLogs::default());
    let worker = tokio::time::timeout(
        Duration::from_secs(120),
        server.start_worker(WorkerConfig {
            worker_id: "py-process-1".to_string(),
            environment: Environment {
                urn: "beam:env:process:v1".to_string(),
                payload: ProcessPayload {
                    command: boot.display().to_string(),
                    env: [("BEAM_PYTHON".to_string(), python)].into(),
                    ..Default::default()
                }
                .encode_to_vec(),
                ..Default::default()
            },
            provision: Default::default(),
            artifacts: Arc::new(NoArtifacts),
            logs: logs.clone(),
        }),
    )
    .await
    .expect("start_worker finishes")
    .expect("the Python worker connects");

    exercise(&worker, "pbd-process", "proc").await;
    {
        let entries = logs.entries.lock();
        assert!(
            !entries.is_empty(),
            "the harness logs over the Fn logging service"
        );
        assert!(entries.iter().all(|(id, _)| id == "py-process-1"));
    }
    worker.stop().await;
}
