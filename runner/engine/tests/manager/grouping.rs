//! GroupByKey: groups under every bundle shape, GroupByKey into GroupByKey,
//! and the stage snapshots of a finished graph.

use super::fixtures::*;

#[tokio::test]
async fn groups_by_key_and_window_under_every_bundle_shape() {
    let mut results = Vec::new();
    for shape in [1, 2, 100_000] {
        let records = Arc::new(Mutex::new(Vec::new()));
        let (plan, exec) = gbk_pipeline(records.clone(), 0);
        run(plan, exec, config(shape)).await.unwrap();
        let mut r = records.lock().clone();
        r.sort();
        results.push(r);
    }
    let w = |s| Window::Interval {
        start: s,
        end: s + 10,
    };
    // a@0,a@8 in [0,10); b@4 in [0,10); c@12 in [10,20); a@16 in [10,20); b@20 in [20,30).
    assert_eq!(
        results[0],
        vec![
            ("a".to_string(), vec![0, 0, 0, 1, 4], w(10)),
            ("a".to_string(), vec![0, 0, 0, 2, 0, 2], w(0)),
            ("b".to_string(), vec![0, 0, 0, 1, 1], w(0)),
            ("b".to_string(), vec![0, 0, 0, 1, 5], w(20)),
            ("c".to_string(), vec![0, 0, 0, 1, 3], w(10)),
        ]
    );
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0], results[2]);
}

/// A GroupByKey whose output only another GroupByKey reads: the firing is
/// handed over as bytes (no elements made), and every group arrives,
/// grouped again, under every bundle shape.
#[tokio::test]
async fn a_groupbykey_feeding_only_a_groupbykey_hands_over_every_group() {
    let regrouped = Coder::Kv(
        Box::new(Coder::Bytes),
        Box::new(Coder::Iterable(Box::new(Coder::Iterable(Box::new(
            Coder::Varint,
        ))))),
    );
    for shape in [1, 100_000] {
        let (mut plan, mut exec) = gbk_pipeline(Arc::new(Mutex::new(Vec::new())), 0);
        let gbk = plan.stages[StageIdx::new(2)].clone();
        plan.pcollections
            .push(pc("regrouped", regrouped.clone(), Coder::IntervalWindow));
        plan.stages[StageIdx::new(3)] = Stage {
            name: "regroup".into(),
            inputs: vec![PCollectionIdx::new(2)],
            outputs: vec![PCollectionIdx::new(3)],
            ..gbk
        };
        plan.stages.push(sdk_stage("sink", vec![3], vec![]));
        let records: Records = Arc::new(Mutex::new(Vec::new()));
        let (seen, coder) = (records.clone(), regrouped.clone());
        let sink: StageFn = Arc::new(move |input| {
            for chunk in &input.elements {
                for e in decode_windowed_values(chunk, &coder, &Coder::IntervalWindow).unwrap() {
                    let key_len = coder.kv_key_len(e.value()).unwrap();
                    let key = String::from_utf8(e.value()[1..key_len].to_vec()).unwrap();
                    let window = e.header.windows[0].clone();
                    seen.lock()
                        .push((key, e.value()[key_len..].to_vec(), window));
                }
            }
            Ok(BundleOutput::default())
        });
        exec.stages.remove(&3);
        exec.stages.insert(4, sink);
        run(plan, exec, config(shape)).await.unwrap();
        let mut got = records.lock().clone();
        got.sort();
        let w = |s| Window::Interval {
            start: s,
            end: s + 10,
        };
        let group_of_one = |inner: &[u8]| [&[0, 0, 0, 1][..], inner].concat();
        assert_eq!(
            got,
            vec![
                ("a".to_string(), group_of_one(&[0, 0, 0, 1, 4]), w(10)),
                ("a".to_string(), group_of_one(&[0, 0, 0, 2, 0, 2]), w(0)),
                ("b".to_string(), group_of_one(&[0, 0, 0, 1, 1]), w(0)),
                ("b".to_string(), group_of_one(&[0, 0, 0, 1, 5]), w(20)),
                ("c".to_string(), group_of_one(&[0, 0, 0, 1, 3]), w(10)),
            ],
            "bundle shape {shape}"
        );
    }
}

#[tokio::test]
async fn stage_snapshots_show_the_finished_graph() {
    let records = Arc::new(Mutex::new(Vec::new()));
    let (plan, exec) = gbk_pipeline(records, 0);
    let names: Vec<String> = plan.stages.iter().map(|s| s.name.clone()).collect();
    let (tx, rx) = watch::channel(Vec::new());
    let (_cancel_tx, cancel) = watch::channel(false);
    Engine::builder(plan, Arc::new(exec), config(2), "test", Arc::new(|| 0))
        .stats(tx)
        .build()
        .unwrap()
        .run(cancel)
        .await
        .unwrap();
    let stats = rx.borrow().clone();
    assert_eq!(
        stats.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
        names
    );
    for (i, s) in stats.iter().enumerate() {
        assert_eq!(
            s.output_watermark,
            refract_engine::time::MAX_TIMESTAMP,
            "{s:?}"
        );
        assert_eq!((s.pending_elements, s.bundles_in_flight), (0, 0), "{s:?}");
        // Every stage but the first reads the one before it.
        let previous = if i == 0 {
            vec![]
        } else {
            vec![StageIdx::new(i - 1)]
        };
        assert_eq!(s.inputs, previous, "{s:?}");
    }
    let sdk: Vec<_> = stats.iter().filter(|s| s.kind == "sdk").collect();
    assert!(sdk.iter().all(|s| s.bundles_committed > 0), "{sdk:?}");
    // The source gets the impulse's one element; bundles of at most two.
    assert_eq!(sdk[0].elements_processed, 1, "{sdk:?}");
}
