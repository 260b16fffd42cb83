//! Placement and quarantine, with pools that need no host: what is decided
//! here is which pool is asked, not what it answers.

use std::sync::Arc;
use std::time::Duration;

use super::*;

fn spec(text: &str) -> PoolSpec {
    text.parse().unwrap()
}

fn pool(address: &str, capacity: usize) -> Discovered {
    Discovered {
        address: address.to_string(),
        capacity,
        node: None,
    }
}

fn any() -> PoolNeed {
    PoolNeed { sdk: None }
}

fn python() -> PoolNeed {
    PoolNeed {
        sdk: Some(BeamSdk::Python),
    }
}

fn directory_with(specs: &[(&str, Vec<Discovered>)]) -> Arc<PoolDirectory> {
    let d = Arc::new(PoolDirectory::new(2));
    for (text, pools) in specs {
        let s = spec(text);
        let _stop = d.insert(s.clone()).unwrap();
        d.set_pools(&s, pools.clone());
    }
    d
}

#[tokio::test]
async fn new_workers_go_where_the_load_per_core_is_lowest() {
    let d = directory_with(&[("h:1", vec![pool("10.0.0.1:1", 1), pool("10.0.0.2:1", 3)])]);
    assert_eq!(d.capacity(any()), 4);
    for _round in 0..2 {
        let mut held = Vec::new();
        let mut on = Vec::new();
        for _ in 0..4 {
            let p = d.acquire(any(), Duration::ZERO).await.unwrap();
            on.push(p.address().to_string());
            held.push(p);
        }
        let small = on.iter().filter(|a| a.as_str() == "10.0.0.1:1").count();
        assert_eq!((small, on.len() - small), (1, 3), "{on:?}");
        // Starts given up free their places: the next round is the same.
        drop(held);
    }
}

#[tokio::test]
async fn labelled_pools_take_only_their_sdk() {
    let d = directory_with(&[
        ("java=j:1", vec![pool("10.0.0.9:1", 8)]),
        ("python=p:1", vec![pool("10.0.0.1:1", 1)]),
    ]);
    assert!(!d.serves(any()));
    assert!(d.serves(python()));
    assert_eq!(d.capacity(python()), 1);
    for _ in 0..3 {
        let p = d.acquire(python(), Duration::ZERO).await.unwrap();
        assert_eq!(p.address(), "10.0.0.1:1");
    }
    assert!(matches!(
        d.acquire(any(), Duration::ZERO).await,
        Err(PoolError::NoLivePool { .. })
    ));
}

#[tokio::test]
async fn a_failing_pool_is_skipped_then_tried_again() {
    let d = directory_with(&[("h:1", vec![pool("10.0.0.1:1", 1), pool("10.0.0.2:1", 1)])]);
    let first = d.acquire(any(), Duration::ZERO).await.unwrap();
    let bad = first.address().to_string();
    first.failed("connection refused");
    assert_eq!(d.capacity(any()), 1);
    // While quarantined, every worker goes to the other pool.
    for _ in 0..3 {
        let p = d.acquire(any(), Duration::ZERO).await.unwrap();
        assert_ne!(p.address(), bad);
    }
    let listed = d.statuses();
    let quarantined = listed.iter().find(|s| s.address == bad).unwrap();
    assert_eq!(quarantined.state, "quarantined");
    assert!(
        quarantined.detail.contains("connection refused"),
        "{quarantined:?}"
    );
    assert_eq!(quarantine_for(1), Duration::from_secs(1));
    assert_eq!(quarantine_for(3), Duration::from_secs(4));
    assert_eq!(quarantine_for(40), MAX_QUARANTINE);
}

#[tokio::test]
async fn with_every_pool_quarantined_a_start_waits_for_the_first_retry() {
    let d = directory_with(&[("h:1", vec![pool("10.0.0.1:1", 1)])]);
    d.acquire(any(), Duration::ZERO)
        .await
        .unwrap()
        .failed("refused");
    let waited = std::time::Instant::now();
    let retry = d.acquire(any(), Duration::from_secs(10)).await.unwrap();
    assert_eq!(retry.address(), "10.0.0.1:1");
    assert!(waited.elapsed() >= Duration::from_millis(900));
}

#[tokio::test]
async fn a_start_waits_for_a_pool_to_appear() {
    let d = directory_with(&[]);
    let s = spec("python=ray://head:1");
    let _stop = d.insert(s.clone()).unwrap();
    let waiting = {
        let d = d.clone();
        tokio::spawn(async move { d.acquire(python(), Duration::from_secs(30)).await })
    };
    tokio::task::yield_now().await;
    d.set_pools(&s, vec![pool("10.0.0.7:5", 4)]);
    let placement = waiting.await.unwrap().unwrap();
    assert_eq!(placement.address(), "10.0.0.7:5");
}

#[tokio::test]
async fn no_pool_in_time_names_what_is_known() {
    let d = directory_with(&[("python=p:1", vec![])]);
    d.set_trouble(&spec("python=p:1"), "cannot resolve p".to_string());
    let error = d
        .acquire(python(), Duration::from_millis(10))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("the python SDK"), "{error}");
    assert!(error.contains("cannot resolve p"), "{error}");
}

#[test]
fn specs_are_added_once_and_removed_by_their_text() {
    let d = PoolDirectory::new(1);
    let stop = d.insert(spec("python=10.0.0.1:5")).unwrap();
    assert!(matches!(
        d.insert(spec("python=10.0.0.1:5")),
        Err(PoolError::Duplicate(_))
    ));
    assert!(d.need_of_address("10.0.0.1:5").is_some());
    assert!(!d.remove("10.0.0.1:5"));
    assert!(d.remove("python=10.0.0.1:5"));
    assert!(*stop.borrow());
    assert!(d.specs().is_empty());
}

#[test]
fn pools_found_again_keep_their_state() {
    let d = directory_with(&[("h:1", vec![pool("10.0.0.1:1", 1)])]);
    let s = spec("h:1");
    let placement = d.try_acquire(any()).unwrap();
    placement.failed("down");
    d.set_pools(&s, vec![pool("10.0.0.1:1", 1), pool("10.0.0.2:1", 1)]);
    let states: Vec<(String, String)> = d
        .statuses()
        .into_iter()
        .map(|p| (p.address, p.state))
        .collect();
    assert_eq!(
        states,
        vec![
            ("10.0.0.1:1".to_string(), "quarantined".to_string()),
            ("10.0.0.2:1".to_string(), "live".to_string())
        ]
    );
    d.set_pools(&s, vec![]);
    assert_eq!(d.statuses()[0].state, "none found");
}
