//! A stateful stage runs several bundles at once, but never one key in
//! two of them: bundles hold key groups, and the next bundle takes only
//! elements of groups no bundle in flight holds.
//!
//! Plan: impulse → source (many keys) → stateful counter. The fake
//! counter marks each key busy while its bundle runs (a key already busy
//! is a violation), sleeps so that bundles overlap, appends one value per
//! element to the key's bag and reads the bag back. Afterwards: no
//! violation, at least two bundles overlapped, and the last read of every
//! key's bag holds exactly its number of elements (two bundles of one key
//! at once would each have read the other's writes as missing).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use refract_engine::coder::{decode_windowed_values, Coder};
use refract_engine::executor::{BundleInput, BundleOutput, ExecError, StageExecutor};
use refract_engine::manager::{Engine, EngineConfig};
use refract_engine::plan::{PCollectionIdx, StageIdx};
use refract_engine::state::{CellId, StateKey};
use tokio::sync::watch;

const KEYS: usize = 40;
const ELEMENTS: usize = 2_000;

#[derive(Default)]
struct Counter {
    busy: Mutex<HashSet<Vec<u8>>>,
    violations: AtomicUsize,
    running: AtomicUsize,
    most_running: AtomicUsize,
    /// Key -> the most values a read of its bag returned.
    counted: Mutex<BTreeMap<String, usize>>,
}

fn bag(key: &[u8]) -> StateKey {
    StateKey::BagUserState(CellId {
        transform_id: "count".into(),
        state_id: "seen".into(),
        window: Bytes::new(),
        key: Bytes::copy_from_slice(key),
    })
}

/// The executor: the shared counter.
struct Counting(Arc<Counter>);

impl StageExecutor for Counting {
    fn execute(&self, input: BundleInput) -> BoxFuture<'static, Result<BundleOutput, ExecError>> {
        let me = self.0.clone();
        async move {
            if input.stage == StageIdx::new(1) {
                return Ok(BundleOutput {
                    outputs: vec![(
                        PCollectionIdx::new(1),
                        common::keyed_elements(ELEMENTS, KEYS),
                    )],
                    ..Default::default()
                });
            }
            let mut keys: Vec<Vec<u8>> = Vec::new();
            for chunk in &input.elements {
                for e in
                    decode_windowed_values(chunk, &common::kv_bytes_coder(), &Coder::GlobalWindow)
                        .expect("decodes")
                {
                    // The nested key: its length byte and its bytes.
                    let n = e.value()[0] as usize;
                    keys.push(e.value()[..1 + n].to_vec());
                }
            }
            let distinct: HashSet<Vec<u8>> = keys.iter().cloned().collect();
            {
                let mut busy = me.busy.lock();
                for k in &distinct {
                    if !busy.insert(k.clone()) {
                        me.violations.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            let now = me.running.fetch_add(1, Ordering::SeqCst) + 1;
            me.most_running.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            let sdk = |e: refract_engine::state::StateError| ExecError::Sdk(e.to_string());
            for k in &keys {
                input
                    .state
                    .append(&bag(k), Bytes::from_static(&[1, b'1']))
                    .map_err(sdk)?;
            }
            for k in &distinct {
                let page = input.state.get(&bag(k), None).map_err(sdk)?;
                assert!(page.continuation.is_none(), "one page");
                let name = String::from_utf8_lossy(&k[1..]).into_owned();
                let mut counted = me.counted.lock();
                let seen = counted.entry(name).or_default();
                *seen = (*seen).max(page.data.len() / 2);
            }
            me.running.fetch_sub(1, Ordering::SeqCst);
            let mut busy = me.busy.lock();
            for k in &distinct {
                busy.remove(k);
            }
            Ok(BundleOutput::default())
        }
        .boxed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bundles_of_a_stateful_stage_overlap_on_disjoint_keys_only() {
    let counter = Arc::new(Counter::default());
    let config = EngineConfig {
        // Small bundles, so that several are taken while others run.
        max_bundle_elements: 100,
        max_bundles_per_stage: 4,
        ..EngineConfig::default()
    };
    let engine = Engine::new(
        common::keyed_source_plan(&[("count", true)]),
        Arc::new(Counting(counter.clone())),
        config,
        "kg",
        Arc::new(|| 0),
    )
    .expect("a valid plan");
    let (_cancel, cancelled) = watch::channel(false);
    engine.run(cancelled).await.expect("the run succeeds");

    assert_eq!(
        counter.violations.load(Ordering::SeqCst),
        0,
        "a key in two bundles at once"
    );
    assert!(
        counter.most_running.load(Ordering::SeqCst) >= 2,
        "bundles of the stateful stage never overlapped"
    );
    let counts = counter.counted.lock().clone();
    let want: BTreeMap<String, usize> = (0..KEYS)
        .map(|i| (format!("k{i:03}"), ELEMENTS / KEYS))
        .collect();
    assert_eq!(counts, want, "every element counted once, under its key");
}
