//! Side inputs complete before their consumers run, and a Flatten of one
//! PCollection twice.

use super::fixtures::*;

#[tokio::test]
async fn side_input_is_complete_before_its_consumer_runs() {
    // impulse -> main (emits 1 element) ; impulse -> side (emits 3 values) ; consumer reads side.
    let plan = Plan {
        pcollections: vec![
            pc("impulse", Coder::Bytes, Coder::GlobalWindow),
            pc("main", Coder::Varint, Coder::GlobalWindow),
            pc("side", Coder::Varint, Coder::GlobalWindow),
        ]
        .into(),
        stages: vec![
            impulse_stage(),
            sdk_stage("main", vec![0], vec![1]),
            sdk_stage("side", vec![0], vec![2]),
            Stage {
                side_inputs: vec![SideInput {
                    id: SideInputId::new("consumer", "s"),
                    pcollection: PCollectionIdx::new(2),
                    access: SideInputAccess::Iterable,
                    fires_early: false,
                }],
                ..sdk_stage("consumer", vec![1], vec![])
            },
        ]
        .into(),
        names: Default::default(),
    };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let consumer: StageFn = Arc::new(move |input| {
        seen2.lock().push(read_side_input(input)?.to_vec());
        Ok(BundleOutput::default())
    });
    let exec = FakeExecutor {
        stages: [
            (1, emit_varints(1, vec![7])),
            (2, emit_varints(2, vec![1, 2, 3])),
            (3, consumer),
        ]
        .into_iter()
        .collect(),
        bundles: AtomicUsize::new(0),
    };
    run(plan, exec, config(10)).await.unwrap();
    assert_eq!(*seen.lock(), vec![vec![1, 2, 3]]);
}

#[tokio::test]
async fn flatten_of_the_same_pcollection_twice_duplicates_elements() {
    let plan = Plan {
        pcollections: vec![
            pc("impulse", Coder::Bytes, Coder::GlobalWindow),
            pc("flat", Coder::Bytes, Coder::GlobalWindow),
        ]
        .into(),
        stages: vec![
            impulse_stage(),
            Stage {
                name: "flatten".into(),
                kind: StageKind::Flatten,
                inputs: vec![PCollectionIdx::new(0), PCollectionIdx::new(0)],
                side_inputs: vec![],
                outputs: vec![PCollectionIdx::new(1)],
            },
            sdk_stage("count", vec![1], vec![]),
        ]
        .into(),
        names: Default::default(),
    };
    let count = Arc::new(AtomicUsize::new(0));
    let c2 = count.clone();
    let counter: StageFn = Arc::new(move |input| {
        for chunk in &input.elements {
            let n = decode_windowed_values(chunk, &Coder::Bytes, &Coder::GlobalWindow)
                .unwrap()
                .len();
            c2.fetch_add(n, Ordering::SeqCst);
        }
        Ok(BundleOutput::default())
    });
    let exec = FakeExecutor {
        stages: [(2, counter)].into_iter().collect(),
        bundles: AtomicUsize::new(0),
    };
    run(plan, exec, config(10)).await.unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 2);
}
