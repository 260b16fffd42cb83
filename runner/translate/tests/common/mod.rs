//! Helpers shared by the translation tests: loading the Python-generated
//! pipelines and checking invariants every translation must satisfy.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use refract_engine::plan::{Stage, StageIdx, StageKind};
use refract_proto::fn_api;
use refract_proto::pipeline as pb;
use refract_proto::prost::Message;
use refract_proto::urns;
use refract_translate::{translate, SdkStageDescriptor, TranslateOptions, Translated};

/// The Fn API URL the tests translate with.
pub const URL: &str = "localhost:12345";

/// Loads `tests/data/<name>.pb` (written by `tests/data/gen_pipelines.py`).
pub fn load(name: &str) -> pb::Pipeline {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(format!("{name}.pb"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    pb::Pipeline::decode(bytes.as_slice()).expect("a Pipeline proto")
}

/// Options used by every test.
pub fn opts() -> TranslateOptions {
    TranslateOptions {
        fn_api_url: URL.to_string(),
        descriptor_id_prefix: "job".to_string(),
        streaming: false,
        drain: false,
        environment_preference: Default::default(),
        fusion: Default::default(),
    }
}

/// Translates a stored pipeline and checks the invariants.
pub fn translated(name: &str) -> Translated {
    let t = translate(&load(name), &opts()).unwrap_or_else(|e| panic!("{name}: {e}"));
    check_invariants(&t);
    t
}

/// A one-line summary per stage, for failure messages.
pub fn describe(t: &Translated) -> String {
    let mut out = String::new();
    for (i, stage) in t.plan.stages.iter().enumerate() {
        let kind = match &stage.kind {
            StageKind::Impulse => "Impulse".to_string(),
            StageKind::Flatten => "Flatten".to_string(),
            StageKind::TestStream(events) => format!("TestStream({} events)", events.len()),
            StageKind::GroupByKey(ws) => format!("GroupByKey({:?})", ws.window_fn),
            StageKind::Sdk(s) => format!(
                "Sdk(stateful={}, splittable={}, timers={})",
                s.stateful,
                s.splittable,
                s.timer_families.len()
            ),
        };
        out.push_str(&format!(
            "{i}: {kind} in={:?} out={:?} side={} name={}\n",
            stage.inputs,
            stage.outputs,
            stage.side_inputs.len(),
            stage.name
        ));
    }
    out
}

/// The SDK transform unique names of a stage's descriptor, sorted (no ports).
pub fn sdk_transform_names(d: &SdkStageDescriptor) -> Vec<String> {
    let mut names: Vec<String> = d
        .descriptor
        .transforms
        .values()
        .filter(|t| !is_port(t))
        .map(|t| t.unique_name.clone())
        .collect();
    names.sort();
    names
}

/// The index of the SDK stage containing a transform with this unique name.
pub fn stage_with(t: &Translated, unique_name: &str) -> StageIdx {
    let found: Vec<StageIdx> = t
        .sdk_stages
        .iter()
        .filter(|(_, d)| {
            d.descriptor
                .transforms
                .values()
                .any(|tr| tr.unique_name == unique_name)
        })
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "'{unique_name}' in stages {found:?}\n{}",
        describe(t)
    );
    found[0]
}

/// The transform with this unique name in a descriptor.
pub fn transform<'a>(
    d: &'a SdkStageDescriptor,
    unique_name: &str,
) -> (&'a String, &'a pb::PTransform) {
    d.descriptor
        .transforms
        .iter()
        .find(|(_, t)| t.unique_name == unique_name)
        .unwrap_or_else(|| panic!("no transform '{unique_name}' in {}", d.descriptor.id))
}

/// Stages of a kind, by a predicate on the kind.
pub fn count(t: &Translated, pred: impl Fn(&Stage) -> bool) -> usize {
    t.plan.stages.iter().filter(|s| pred(s)).count()
}

fn is_port(t: &pb::PTransform) -> bool {
    let urn = t.spec.as_ref().map_or("", |s| s.urn.as_str());
    urn == urns::transform::DATA_SOURCE || urn == urns::transform::DATA_SINK
}

/// The RemoteGrpcPort of a source or sink transform.
pub fn port(t: &pb::PTransform) -> fn_api::RemoteGrpcPort {
    let payload = t
        .spec
        .as_ref()
        .map(|s| s.payload.as_slice())
        .unwrap_or_default();
    fn_api::RemoteGrpcPort::decode(payload).expect("a RemoteGrpcPort")
}

/// URNs the runner can walk; anything else must sit under a length prefix.
const RUNNER_READABLE: &[&str] = &[
    urns::coder::WINDOWED_VALUE,
    urns::coder::BYTES,
    urns::coder::STRING_UTF8,
    urns::coder::VARINT,
    urns::coder::BOOL,
    urns::coder::DOUBLE,
    urns::coder::KV,
    urns::coder::ITERABLE,
    // (Only GroupByKey outputs, which the runner writes.)
    urns::coder::STATE_BACKED_ITERABLE,
    urns::coder::GLOBAL_WINDOW,
    urns::coder::INTERVAL_WINDOW,
    urns::coder::CUSTOM_WINDOW,
    urns::coder::NULLABLE,
    urns::coder::TIMER,
    urns::coder::LENGTH_PREFIX,
];

fn urn_of(coders: &HashMap<String, pb::Coder>, id: &str) -> String {
    coders[id]
        .spec
        .as_ref()
        .map(|s| s.urn.clone())
        .unwrap_or_default()
}

/// Checks that everything the runner reads with `coder` is walkable: every
/// coder reachable without passing a length prefix is a runner-readable URN
/// (custom windows only look at their length-prefixed inner coder).
pub fn assert_runner_readable(coders: &HashMap<String, pb::Coder>, coder: &str, what: &str) {
    let urn = urn_of(coders, coder);
    assert!(
        RUNNER_READABLE.contains(&urn.as_str()),
        "{what}: coder '{coder}' has URN {urn}"
    );
    if urn == urns::coder::LENGTH_PREFIX {
        return;
    }
    if urn == urns::coder::CUSTOM_WINDOW {
        let inner = &coders[coder].component_coder_ids[0];
        assert_eq!(
            urn_of(coders, inner),
            urns::coder::LENGTH_PREFIX,
            "{what}: custom window inner"
        );
        return;
    }
    for c in &coders[coder].component_coder_ids {
        assert_runner_readable(coders, c, what);
    }
}

/// Invariants every translation must satisfy.
pub fn check_invariants(t: &Translated) {
    let plan = &t.plan;
    let mut ids = HashSet::new();
    for (i, stage) in plan.stages.iter_enumerated() {
        let StageKind::Sdk(sdk) = &stage.kind else {
            assert!(
                !t.sdk_stages.contains_key(&i),
                "runner stage {i} has a descriptor"
            );
            continue;
        };
        let d = t
            .sdk_stages
            .get(&i)
            .unwrap_or_else(|| panic!("SDK stage {i} has no descriptor"));
        let pbd = &d.descriptor;
        assert_eq!(pbd.id, format!("job-{i}"));
        assert!(ids.insert(pbd.id.clone()));
        assert!(t.environments.contains_key(&d.environment_id));
        assert!(pbd.environments.contains_key(&d.environment_id));

        // Coders are closed under components.
        for (id, coder) in &pbd.coders {
            for c in &coder.component_coder_ids {
                assert!(
                    pbd.coders.contains_key(c),
                    "{}: coder {id} needs missing {c}",
                    pbd.id
                );
            }
        }
        // PCollections, windowing strategies and their coders are present.
        for transform in pbd.transforms.values() {
            assert!(
                transform.subtransforms.is_empty(),
                "composite in {}",
                pbd.id
            );
            for p in transform.inputs.values().chain(transform.outputs.values()) {
                let pc = pbd
                    .pcollections
                    .get(p)
                    .unwrap_or_else(|| panic!("{}: missing pcoll {p}", pbd.id));
                assert!(pbd.coders.contains_key(&pc.coder_id));
                let ws = &pbd.windowing_strategies[&pc.windowing_strategy_id];
                assert!(pbd.coders.contains_key(&ws.window_coder_id));
            }
            if !transform.environment_id.is_empty() {
                assert!(pbd.environments.contains_key(&transform.environment_id));
            }
        }
        // Ports: windowed_value[pcoll coder, window], on our URL.
        let mut sources = 0;
        let mut sinks = Vec::new();
        for (id, transform) in &pbd.transforms {
            if !is_port(transform) {
                continue;
            }
            let port = port(transform);
            assert_eq!(
                port.api_service_descriptor.as_ref().map(|a| a.url.as_str()),
                Some(URL)
            );
            let wv = &pbd.coders[&port.coder_id];
            assert_eq!(
                urn_of(&pbd.coders, &port.coder_id),
                urns::coder::WINDOWED_VALUE,
                "{id}"
            );
            let pcoll = transform
                .inputs
                .values()
                .chain(transform.outputs.values())
                .next()
                .expect("a port has one PCollection");
            let (element, declared) = (
                &wv.component_coder_ids[0],
                &pbd.pcollections[pcoll].coder_id,
            );
            if element != declared {
                // A GroupByKey's output read through a state-backed
                // iterable: KV[K, iterable[V]] with only the iterable's
                // URN changed.
                let grouped = plan
                    .pcollections
                    .iter_enumerated()
                    .find_map(|(at, p)| (&p.id == pcoll).then_some(at));
                assert!(
                    grouped.is_some_and(|g| t.state_backed_outputs.contains(&g)),
                    "{id}: port element coder {element} is not the PCollection's {declared}"
                );
                let (got, want) = (&pbd.coders[element], &pbd.coders[declared]);
                assert_eq!(urn_of(&pbd.coders, element), urns::coder::KV, "{id}");
                assert_eq!(
                    got.component_coder_ids[0], want.component_coder_ids[0],
                    "{id}"
                );
                let (values, iterable) =
                    (&got.component_coder_ids[1], &want.component_coder_ids[1]);
                assert_eq!(
                    urn_of(&pbd.coders, values),
                    urns::coder::STATE_BACKED_ITERABLE,
                    "{id}"
                );
                assert_eq!(
                    pbd.coders[values].component_coder_ids,
                    pbd.coders[iterable].component_coder_ids,
                    "{id}"
                );
            }
            assert_runner_readable(&pbd.coders, &port.coder_id, id);
            let urn = transform.spec.as_ref().map_or("", |s| s.urn.as_str());
            if urn == urns::transform::DATA_SOURCE {
                sources += 1;
                assert_eq!(Some(id), d.input_transform_id.as_ref());
            } else {
                sinks.push(id.clone());
            }
        }
        assert_eq!(sources, stage.inputs.len(), "{}", pbd.id);
        let mut expected: Vec<String> = d.outputs.iter().map(|(s, _)| s.clone()).collect();
        expected.sort();
        sinks.sort();
        assert_eq!(sinks, expected, "{}", pbd.id);
        assert_eq!(
            d.outputs.iter().map(|(_, p)| *p).collect::<Vec<_>>(),
            stage.outputs
        );
        // Side inputs are in the descriptor, readable by the runner, and have no source.
        for side in &stage.side_inputs {
            let id = &plan.pcollections[side.pcollection].id;
            let pc = pbd
                .pcollections
                .get(id)
                .expect("side input PCollection in the descriptor");
            assert_runner_readable(&pbd.coders, &pc.coder_id, id);
            assert!(pbd.transforms.contains_key(side.id.transform_id.as_str()));
        }
        if !stage.side_inputs.is_empty() || sdk.stateful {
            assert!(
                pbd.state_api_service_descriptor.is_some(),
                "{}: no state endpoint",
                pbd.id
            );
        }
        // Timer families agree with the engine's list.
        let families: Vec<(String, String)> = sdk
            .timer_families
            .iter()
            .map(|f| (f.transform_id.to_string(), f.family_id.clone()))
            .collect();
        assert_eq!(families, d.timer_families);
        if !families.is_empty() {
            assert!(pbd.timer_api_service_descriptor.is_some());
        }
    }
    // Every PCollection index is in range.
    for stage in &plan.stages {
        for &p in stage.inputs.iter().chain(&stage.outputs) {
            assert!(plan.pcollections.get(p).is_some());
        }
    }
    // Every transform has a unique name.
    for d in t.sdk_stages.values() {
        for id in d.descriptor.transforms.keys() {
            assert!(t.unique_names.contains_key(id), "no unique name for {id}");
        }
    }
}
