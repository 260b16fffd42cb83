//! Bundles that fail or panic: the run fails with the SDK's text, and a
//! retried bundle's output is kept once.

use super::fixtures::*;

#[tokio::test]
async fn a_bundle_that_keeps_failing_fails_the_run_with_the_sdk_text() {
    let records = Arc::new(Mutex::new(Vec::new()));
    let (plan, exec) = gbk_pipeline(records.clone(), usize::MAX);
    let err = run(plan, exec, fast_retries(100_000)).await.unwrap_err();
    assert_eq!(err.to_string(), "Traceback: boom [while running 'sink']");
}

/// A bundle whose execution panics (a runner bug, not the SDK's error)
/// fails the job with the panic's message, at once: its task used to die
/// without reporting, and the engine waited for it forever.
#[tokio::test]
async fn a_bundle_that_panics_fails_the_run_instead_of_hanging_it() {
    let records = Arc::new(Mutex::new(Vec::new()));
    let (plan, mut exec) = gbk_pipeline(records.clone(), 0);
    let panicking: StageFn = Arc::new(|_input| panic!("the sink fell over"));
    exec.stages.insert(3, panicking);
    let run = run(plan, exec, fast_retries(100_000));
    let err = tokio::time::timeout(std::time::Duration::from_secs(60), run)
        .await
        .expect("the run ends")
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "runner error: bundle execution panicked: the sink fell over"
    );
    assert!(records.lock().is_empty());
}

#[tokio::test]
async fn a_bundle_failing_twice_then_succeeding_leaves_one_copy_of_its_output() {
    let records = Arc::new(Mutex::new(Vec::new()));
    // The sink's first two attempts fail after the executor saw the input;
    // the third succeeds. Only successful attempts record anything, as only
    // they are committed.
    let (plan, exec) = gbk_pipeline(records.clone(), 2);
    run(plan, exec, fast_retries(100_000)).await.unwrap();
    let mut r = records.lock().clone();
    r.sort();
    assert_eq!(r.len(), 5, "{r:?}");
    let mut keys: Vec<_> = r.iter().map(|(k, _, w)| (k.clone(), w.clone())).collect();
    keys.dedup();
    assert_eq!(keys.len(), 5, "no group twice: {r:?}");
}
