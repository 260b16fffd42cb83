//! The installed Python SDK's own client code against this server: if
//! Python with `apache_beam` is available (`BEAM_PYTHON`, else
//! `python3`), `submit.py` submits real pipelines through `PortableRunner`
//! (with `--save_main_session`, so an artifact is staged) and the outcomes
//! are checked; otherwise the test says so and passes, unless
//! `REFRACT_REQUIRE_PYTHON=1` (CI sets it), where that is a failure.

use std::time::Duration;

use refract_proto::job_api::pipeline_option_type::Enum as OptionType;
use refract_proto::job_api::PipelineOptionDescriptor;

use crate::beam_python::beam_python;
use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_portable_runner_submits_stages_and_reads_results() {
    let Some(python) = beam_python() else {
        return;
    };
    let server = Server::start_with(|config| {
        config.pipeline_options = vec![PipelineOptionDescriptor {
            name: "refract_test_outcome".into(),
            r#type: OptionType::String as i32,
            description: "What the test runner does with the job.".into(),
            default_value: String::new(),
            group: "refract".into(),
        }];
    })
    .await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/grpc/submit.py");
    let run = tokio::process::Command::new(&python)
        .arg(script)
        .arg(server.addr.to_string())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the Python client did not finish")
        .expect("cannot run Python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let results: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .collect();
    assert_eq!(results.len(), 4, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(results[0], "state DONE");
    assert_eq!(results[1], "counters [('count1', 3, 3)]");
    assert_eq!(results[2], "distributions [(3, 9, 1, 5)]");
    assert!(
        results[3].contains("failed in state FAILED")
            && results[3].contains("ValueError: boom [while running")
            && results[3].contains("StageC"),
        "{}",
        results[3]
    );

    // The first job staged the pickled main session.
    let started = server.runner.started.lock().clone();
    assert_eq!(started.len(), 2);
    assert!(
        started
            .values()
            .all(|s| s.contents.values().any(|bytes| !bytes.is_empty())),
        "{started:?}"
    );
    server.shutdown().await.unwrap();
}
