//! Translation of real Python SDK 2.77 pipelines (dumped by
//! `tests/data/gen_pipelines.py`): stage shapes, fusion, coders and
//! descriptors. Every translation is also checked against the invariants in
//! `common::check_invariants`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;

use common::{count, describe, port, sdk_transform_names, stage_with, transform, translated};
use refract_engine::coder::Coder;
use refract_engine::plan::{
    AccumulationMode, SideInputAccess, StageIdx, StageKind, TimeDomain, TransformId, Trigger,
    WindowFn,
};
use refract_proto::pipeline as pb;
use refract_proto::prost::Message;
use refract_proto::urns;
use refract_translate::{translate, validate, Fusion, Translated};

const ALL: &[&str] = &[
    "create_map_gbk",
    "side_inputs",
    "stateful_timers",
    "stateful_custom_key",
    "sdf",
    "read_text",
    "flatten_twice",
    "flatten_gbk_output",
    "combine_batch",
    "combine_streaming",
    "combine_after_count_streaming",
    "windowing",
    "custom_windows",
    "side_input_downstream",
];

fn is_impulse(s: &refract_engine::plan::Stage) -> bool {
    matches!(s.kind, StageKind::Impulse)
}
fn is_flatten(s: &refract_engine::plan::Stage) -> bool {
    matches!(s.kind, StageKind::Flatten)
}
fn is_gbk(s: &refract_engine::plan::Stage) -> bool {
    matches!(s.kind, StageKind::GroupByKey(_))
}
fn is_sdk(s: &refract_engine::plan::Stage) -> bool {
    matches!(s.kind, StageKind::Sdk(_))
}

fn urn(t: &pb::PTransform) -> &str {
    t.spec.as_ref().map_or("", |s| s.urn.as_str())
}

/// The stage (by index) whose name is exactly `name`.
fn stage_named(t: &Translated, name: &str) -> StageIdx {
    t.plan
        .stages
        .iter_enumerated()
        .find_map(|(at, s)| (s.name == name).then_some(at))
        .unwrap_or_else(|| panic!("no stage '{name}'\n{}", describe(t)))
}

#[test]
fn every_pipeline_validates_and_translates() {
    for name in ALL {
        validate(&common::load(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        translated(name);
    }
}

/// The pipeline root transform a transform of a Python pipeline belongs
/// to: the first part of its unique name.
fn root_of(name: &str) -> &str {
    name.split('/').next().unwrap_or(name)
}

#[test]
fn strict_fusion_keeps_each_stage_within_one_root_transform() {
    for name in ALL {
        let fused = translated(name);
        let opts = refract_translate::TranslateOptions {
            fusion: Fusion::WithinRootTransforms,
            ..common::opts()
        };
        let strict =
            translate(&common::load(name), &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        common::check_invariants(&strict);
        let mut strict_names = Vec::new();
        for d in strict.sdk_stages.values() {
            let names = sdk_transform_names(d);
            let roots: std::collections::BTreeSet<&str> =
                names.iter().map(|n| root_of(n)).collect();
            assert_eq!(
                roots.len(),
                1,
                "{name}: a stage of {names:?}\n{}",
                describe(&strict)
            );
            strict_names.extend(names);
        }
        // The same SDK transforms run, each once; every PCollection the
        // fused plan hands between stages is still handed between stages,
        // and a chain from one root transform to the next is cut.
        let mut fused_names: Vec<String> = fused
            .sdk_stages
            .values()
            .flat_map(sdk_transform_names)
            .collect();
        strict_names.sort();
        fused_names.sort();
        assert_eq!(strict_names, fused_names, "{name}");
        for pcoll in &fused.plan.pcollections {
            assert!(
                strict.plan.pcollections.iter().any(|p| p.id == pcoll.id),
                "{name}: {} crosses no stage boundary in strict mode",
                pcoll.id
            );
        }
        // Transforms of one root transform that were fused stay together.
        for d in fused.sdk_stages.values() {
            let names = sdk_transform_names(d);
            for root in names.iter().map(|n| root_of(n)) {
                let together: Vec<&String> = names.iter().filter(|n| root_of(n) == root).collect();
                let apart = strict.sdk_stages.values().filter(|s| {
                    let strict_names = sdk_transform_names(s);
                    together.iter().any(|n| strict_names.contains(n))
                });
                assert_eq!(apart.count(), 1, "{name}: {together:?} split apart");
            }
        }
        let spans_roots = fused.sdk_stages.values().any(|d| {
            let names = sdk_transform_names(d);
            names.iter().any(|n| root_of(n) != root_of(&names[0]))
        });
        assert_eq!(
            spans_roots,
            strict.plan.stages.len() > fused.plan.stages.len(),
            "{name}: {} fused stages, {} strict",
            fused.plan.stages.len(),
            strict.plan.stages.len()
        );
    }
}

#[test]
fn create_map_gbk_fuses_around_reshuffle_and_gbk() {
    let t = translated("create_map_gbk");
    // Impulse → FlatMap → Reshuffle → Map(decode)+KeyBy → GBK → Sum.
    assert_eq!(count(&t, is_impulse), 1, "{}", describe(&t));
    assert_eq!(count(&t, is_flatten), 1, "{}", describe(&t));
    assert_eq!(count(&t, is_gbk), 1, "{}", describe(&t));
    assert_eq!(count(&t, is_sdk), 3, "{}", describe(&t));
    assert_eq!(t.plan.stages.len(), 6);
    let keyed = stage_with(&t, "KeyBy");
    assert_eq!(stage_with(&t, "Create/Map(decode)"), keyed);
    assert_eq!(
        sdk_transform_names(&t.sdk_stages[&keyed]),
        vec!["Create/Map(decode)", "KeyBy"]
    );
    // The reshuffle is one identity flatten; its insides never run.
    let reshuffle = stage_named(&t, "Create/MaybeReshuffle/Reshuffle");
    assert!(is_flatten(&t.plan.stages[reshuffle]));
    assert_eq!(t.plan.stages[reshuffle].inputs.len(), 1);
    for d in t.sdk_stages.values() {
        for tr in d.descriptor.transforms.values() {
            assert!(
                !tr.unique_name.contains("AddRandomKeys"),
                "{}",
                tr.unique_name
            );
            assert!(
                !tr.unique_name.contains("ReshufflePerKey"),
                "{}",
                tr.unique_name
            );
        }
    }
    // The GBK reads the KeyBy stage's output and feeds the Sum stage.
    let gbk = stage_named(&t, "Group");
    let StageKind::GroupByKey(ws) = &t.plan.stages[gbk].kind else {
        unreachable!()
    };
    assert_eq!(ws.window_fn, WindowFn::Global);
    assert_eq!(ws.trigger, Trigger::Default);
    assert_eq!(t.plan.stages[keyed].outputs, t.plan.stages[gbk].inputs);
    let sum = stage_with(&t, "Sum");
    assert_eq!(t.plan.stages[sum].inputs, t.plan.stages[gbk].outputs);
    // Nothing consumes Sum's output: no sink.
    assert!(t.plan.stages[sum].outputs.is_empty());
    let input = &t.plan.pcollections[t.plan.stages[gbk].inputs[0]];
    let output = &t.plan.pcollections[t.plan.stages[gbk].outputs[0]];
    assert_eq!(
        input.value_coder,
        Coder::Kv(Box::new(Coder::Varint), Box::new(Coder::Varint))
    );
    assert_eq!(
        output.value_coder,
        Coder::Kv(
            Box::new(Coder::Varint),
            Box::new(Coder::Iterable(Box::new(Coder::Varint)))
        )
    );
    assert_eq!(input.window_coder, Coder::GlobalWindow);
    assert!(input.bounded);
    // The impulse's output is bytes in the global window.
    let impulse = &t.plan.stages[stage_named(&t, "Create/Impulse")];
    assert_eq!(
        t.plan.pcollections[impulse.outputs[0]].value_coder,
        Coder::Bytes
    );
}

/// The coder ids of `coder`'s components.
fn components<'a>(d: &'a refract_translate::SdkStageDescriptor, coder: &str) -> &'a [String] {
    &d.descriptor.coders[coder].component_coder_ids
}

fn coder_urn<'a>(d: &'a refract_translate::SdkStageDescriptor, coder: &str) -> &'a str {
    d.descriptor.coders[coder]
        .spec
        .as_ref()
        .map_or("", |s| s.urn.as_str())
}

#[test]
fn a_group_by_key_read_only_by_sdk_stages_is_read_through_a_state_backed_iterable() {
    let t = translated("create_map_gbk");
    let gbk = stage_named(&t, "Group");
    let grouped = t.plan.stages[gbk].outputs[0];
    assert_eq!(t.state_backed_outputs, vec![grouped]);
    // The Sum stage's data source: windowed_value[KV[K, state_backed_iterable[V]]].
    let sum = &t.sdk_stages[&stage_with(&t, "Sum")];
    let source = &sum.descriptor.transforms[sum.input_transform_id.as_ref().unwrap()];
    let port = port(source);
    let windowed = &port.coder_id;
    let kv = &components(sum, windowed)[0];
    assert_eq!(coder_urn(sum, kv), urns::coder::KV);
    let values = &components(sum, kv)[1];
    assert_eq!(coder_urn(sum, values), urns::coder::STATE_BACKED_ITERABLE);
    // The PCollection itself keeps its iterable coder.
    let pcoll = &sum.descriptor.pcollections[&t.plan.pcollections[grouped].id];
    let iterable = &components(sum, &pcoll.coder_id)[1];
    assert_eq!(coder_urn(sum, iterable), urns::coder::ITERABLE);
    // A GroupByKey output that a Flatten reads is not handed out.
    let t = translated("flatten_gbk_output");
    let grouped = t.plan.stages[stage_named(&t, "Group")].outputs[0];
    let transcode = stage_with(&t, "Flatten/Transcode/0");
    assert_eq!(t.plan.stages[transcode].inputs, vec![grouped]);
    assert_eq!(
        t.state_backed_outputs,
        vec![grouped],
        "an SDK stage transcodes it"
    );
}

#[test]
fn group_by_key_output_matches_its_input_in_every_pipeline() {
    for name in ALL {
        let t = translated(name);
        for stage in &t.plan.stages {
            if !is_gbk(stage) {
                continue;
            }
            let input = &t.plan.pcollections[stage.inputs[0]].value_coder;
            let output = &t.plan.pcollections[stage.outputs[0]].value_coder;
            let Coder::Kv(k, v) = input else {
                panic!("{name}: GBK input {input:?}")
            };
            assert_eq!(
                output,
                &Coder::Kv(k.clone(), Box::new(Coder::Iterable(v.clone()))),
                "{name}: {}",
                stage.name
            );
        }
    }
}

#[test]
fn side_inputs_are_read_through_state() {
    let t = translated("side_inputs");
    let s = stage_with(&t, "UseSides");
    // The side inputs come from other Creates, so the main input's decode fuses.
    assert_eq!(stage_with(&t, "Main/Map(decode)"), s);
    let stage = &t.plan.stages[s];
    let d = &t.sdk_stages[&s];
    let (use_id, _) = transform(d, "UseSides");
    let sides: Vec<(&str, SideInputAccess)> = stage
        .side_inputs
        .iter()
        .map(|si| (si.id.tag.as_str(), si.access))
        .collect();
    assert_eq!(
        sides,
        vec![
            ("python_side_input0", SideInputAccess::Iterable),
            ("python_side_input1", SideInputAccess::Multimap)
        ]
    );
    for side in &stage.side_inputs {
        assert_eq!(&side.id.transform_id, use_id);
        // Produced by another stage, which sends it to the runner.
        let producers: Vec<StageIdx> = t
            .plan
            .stages
            .iter_enumerated()
            .filter(|(_, st)| st.outputs.contains(&side.pcollection))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(producers.len(), 1);
        assert_ne!(producers[0], s);
        // In the consumer's descriptor, with no source.
        let id = &t.plan.pcollections[side.pcollection].id;
        assert!(d.descriptor.pcollections.contains_key(id));
        assert!(d
            .descriptor
            .transforms
            .values()
            .all(|tr| !tr.outputs.values().any(|p| p == id)));
    }
    assert!(d.descriptor.state_api_service_descriptor.is_some());
    assert!(d.descriptor.timer_api_service_descriptor.is_none());
    let multimap = &t.plan.pcollections[stage.side_inputs[1].pcollection];
    assert!(
        matches!(multimap.value_coder, Coder::Kv(_, _)),
        "{:?}",
        multimap.value_coder
    );
}

#[test]
fn side_input_producer_never_fuses_with_its_consumer() {
    let t = translated("side_input_downstream");
    // Share's main input comes from Square, but its side input is computed
    // from Square's output: fusing Share after Square would make the stage
    // wait for itself.
    let share = stage_with(&t, "Share");
    let square = stage_with(&t, "Square");
    assert_ne!(share, square, "{}", describe(&t));
    assert_eq!(t.plan.stages[share].inputs.len(), 1);
    assert!(t.plan.stages[square]
        .outputs
        .contains(&t.plan.stages[share].inputs[0]));
    assert_eq!(t.plan.stages[share].side_inputs.len(), 1);
    // The global combine's precombine still fuses with Square.
    assert_eq!(stage_with(&t, "Total/CombinePerKey/Precombine"), square);
}

#[test]
fn stateful_stage_is_a_root_with_its_timer_families() {
    let t = translated("stateful_timers");
    let s = stage_with(&t, "Stateful");
    let stage = &t.plan.stages[s];
    let StageKind::Sdk(sdk) = &stage.kind else {
        panic!("not an SDK stage")
    };
    assert!(sdk.stateful);
    assert!(!sdk.splittable);
    // The stateful ParDo starts the stage: its main input is the source's output.
    let d = &t.sdk_stages[&s];
    let (stateful_id, stateful) = transform(d, "Stateful");
    let source = &d.descriptor.transforms[d.input_transform_id.as_ref().expect("a source")];
    assert_eq!(
        source.outputs.values().next(),
        stateful.inputs.values().next()
    );
    // The producer (WindowInto) is in another stage; the downstream Map fuses.
    assert_ne!(stage_with(&t, "Window"), s);
    assert_eq!(stage_with(&t, "After"), s);

    let families: Vec<(&str, TimeDomain)> = sdk
        .timer_families
        .iter()
        .map(|f| (f.family_id.as_str(), f.domain))
        .collect();
    assert_eq!(
        families,
        vec![
            ("ts-flush", TimeDomain::EventTime),
            ("ts-stale", TimeDomain::ProcessingTime)
        ]
    );
    for family in &sdk.timer_families {
        assert_eq!(&family.transform_id, stateful_id);
        assert_eq!(family.key_coder, Coder::StringUtf8);
        assert_eq!(family.window_coder, Coder::IntervalWindow);
    }
    assert_eq!(
        d.timer_families,
        vec![
            (stateful_id.clone(), "ts-flush".to_string()),
            (stateful_id.clone(), "ts-stale".to_string())
        ]
    );
    assert!(d.descriptor.timer_api_service_descriptor.is_some());
    assert!(d.descriptor.state_api_service_descriptor.is_some());
    // A checkpoint knows the stage by the transform reading its input,
    // and its timers' transform by unique name.
    assert_eq!(t.plan.stage_heads(s), ["Stateful"]);
    assert_eq!(
        t.plan.names.transforms[&TransformId::new(stateful_id)],
        "Stateful"
    );
    assert_eq!(t.plan.stage_heads(stage_with(&t, "Window")).len(), 1);
}

#[test]
fn custom_key_coder_is_length_prefixed_in_data_state_and_timers() {
    // P15: key bytes must be identical in elements, state keys and timers.
    let t = translated("stateful_custom_key");
    let s = stage_with(&t, "Stateful");
    let d = &t.sdk_stages[&s];
    let coders = &d.descriptor.coders;
    let (_, stateful) = transform(d, "Stateful");
    let main = stateful.inputs.values().next().expect("main input");
    let kv = &coders[&d.descriptor.pcollections[main].coder_id];
    assert_eq!(
        kv.spec.as_ref().map(|s| s.urn.as_str()),
        Some(urns::coder::KV)
    );
    let key = &kv.component_coder_ids[0];
    let key_coder = &coders[key];
    assert_eq!(
        key_coder.spec.as_ref().map(|s| s.urn.as_str()),
        Some(urns::coder::LENGTH_PREFIX)
    );
    let inner = &coders[&key_coder.component_coder_ids[0]];
    assert_eq!(
        inner.spec.as_ref().map(|s| s.urn.as_str()),
        Some("beam:coder:pickled_python:v1")
    );
    let payload = pb::ParDoPayload::decode(
        stateful
            .spec
            .as_ref()
            .map(|s| s.payload.as_slice())
            .unwrap_or_default(),
    )
    .expect("ParDoPayload");
    assert_eq!(payload.timer_family_specs.len(), 2);
    for spec in payload.timer_family_specs.values() {
        let timer = &coders[&spec.timer_family_coder_id];
        assert_eq!(
            timer.spec.as_ref().map(|s| s.urn.as_str()),
            Some(urns::coder::TIMER)
        );
        assert_eq!(
            &timer.component_coder_ids[0], key,
            "timer key coder == main input key coder"
        );
    }
    let StageKind::Sdk(sdk) = &t.plan.stages[s].kind else {
        unreachable!()
    };
    assert!(sdk
        .timer_families
        .iter()
        .all(|f| f.key_coder == Coder::LengthPrefix));
    let input = &t.plan.pcollections[t.plan.stages[s].inputs[0]];
    assert_eq!(
        input.value_coder,
        Coder::Kv(Box::new(Coder::LengthPrefix), Box::new(Coder::Varint))
    );
}

#[test]
fn splittable_dofn_is_expanded_with_a_fusion_break_before_process() {
    let t = translated("sdf");
    let pair = stage_with(&t, "Count/PairWithRestriction");
    assert_eq!(stage_with(&t, "Count/SplitAndSizeRestriction"), pair);
    assert_eq!(stage_with(&t, "Double"), pair);
    let process = stage_with(&t, "Count/Process");
    assert_ne!(process, pair);
    assert_eq!(stage_with(&t, "Format"), process);

    let StageKind::Sdk(sdk) = &t.plan.stages[process].kind else {
        unreachable!()
    };
    assert!(sdk.splittable);
    assert!(!sdk.stateful);
    let StageKind::Sdk(sdk) = &t.plan.stages[pair].kind else {
        unreachable!()
    };
    assert!(!sdk.splittable);

    // Same payload bytes, new URNs.
    let original = common::load("sdf");
    let count = original
        .components
        .as_ref()
        .and_then(|c| c.transforms.values().find(|t| t.unique_name == "Count"))
        .expect("Count");
    let payload = count
        .spec
        .as_ref()
        .map(|s| s.payload.clone())
        .unwrap_or_default();
    for (stage, name, expected) in [
        (
            pair,
            "Count/PairWithRestriction",
            urns::transform::SDF_PAIR_WITH_RESTRICTION,
        ),
        (
            pair,
            "Count/SplitAndSizeRestriction",
            urns::transform::SDF_SPLIT_AND_SIZE_RESTRICTIONS,
        ),
        (
            process,
            "Count/Process",
            urns::transform::SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS,
        ),
    ] {
        let (_, tr) = transform(&t.sdk_stages[&stage], name);
        assert_eq!(urn(tr), expected);
        assert_eq!(tr.spec.as_ref().map(|s| &s.payload), Some(&payload));
        // Side inputs stay on every step.
        assert!(tr.inputs.contains_key("python_side_input0"), "{name}");
    }
    assert_eq!(t.plan.stages[pair].side_inputs.len(), 2);
    assert_eq!(t.plan.stages[process].side_inputs.len(), 1);

    // The process stage's main input is the sized PCollection:
    // KV<KV<element, restriction>, double>, with the pickled restriction parts
    // length-prefixed.
    let sized = &t.plan.pcollections[t.plan.stages[process].inputs[0]];
    assert_eq!(
        sized.value_coder,
        Coder::Kv(
            Box::new(Coder::Kv(
                Box::new(Coder::Varint),
                Box::new(Coder::Kv(
                    Box::new(Coder::LengthPrefix),
                    Box::new(Coder::LengthPrefix)
                ))
            )),
            Box::new(Coder::Double)
        )
    );
    assert_eq!(t.plan.stages[pair].outputs, t.plan.stages[process].inputs);
    let d = &t.sdk_stages[&process];
    let (_, process_tr) = transform(d, "Count/Process");
    let source = &d.descriptor.transforms[d.input_transform_id.as_ref().expect("a source")];
    assert_eq!(
        source.outputs.values().next(),
        process_tr.inputs.get("None")
    );
}

#[test]
fn read_from_text_is_a_splittable_read() {
    let t = translated("read_text");
    let process = stage_with(
        &t,
        "Read/Read/SDFBoundedSourceReader/ParDo(SDFBoundedSourceDoFn)/Process",
    );
    let StageKind::Sdk(sdk) = &t.plan.stages[process].kind else {
        unreachable!()
    };
    assert!(sdk.splittable);
    assert_eq!(stage_with(&t, "Upper"), process);
}

#[test]
fn flatten_keeps_duplicate_inputs_and_unifies_coders() {
    let t = translated("flatten_twice");
    let f = stage_named(&t, "Flatten");
    let stage = &t.plan.stages[f];
    assert!(is_flatten(stage));
    assert_eq!(stage.inputs.len(), 3, "{}", describe(&t));
    assert_eq!(
        stage.inputs[0], stage.inputs[1],
        "the same PCollection twice"
    );
    assert_ne!(stage.inputs[0], stage.inputs[2]);
    let out = &t.plan.pcollections[stage.outputs[0]];
    for &input in &stage.inputs {
        assert_eq!(t.plan.pcollections[input].value_coder, out.value_coder);
    }
    // The producers' descriptors write the output's coder (through an SDK
    // transcoding step where the element coders differ).
    let out_coder = &t.sdk_stages[&stage_with(&t, "Print")]
        .descriptor
        .pcollections[&out.id]
        .coder_id;
    for &input in &stage.inputs {
        let id = &t.plan.pcollections[input].id;
        let producer = t
            .sdk_stages
            .values()
            .find(|d| d.outputs.iter().any(|(_, p)| *p == input))
            .expect("a producer stage");
        assert_eq!(&producer.descriptor.pcollections[id].coder_id, out_coder);
    }
}

#[test]
fn flatten_of_a_group_by_key_output_is_transcoded_to_the_output_coder() {
    let t = translated("flatten_gbk_output");
    let f = stage_named(&t, "Flatten");
    let stage = &t.plan.stages[f];
    let gbk = stage_named(&t, "Group");
    let grouped = t.plan.stages[gbk].outputs[0];
    let expected = &t.plan.pcollections[stage.outputs[0]].value_coder;
    for &p in &stage.inputs {
        assert_eq!(&t.plan.pcollections[p].value_coder, expected);
    }
    // The grouped PCollection keeps the runner's KV<K, Iterable<V>> coder and
    // reaches the Flatten through an SDK transcoding stage.
    let grouped_coder = &t.plan.pcollections[grouped].value_coder;
    assert!(matches!(grouped_coder, Coder::Kv(_, v) if matches!(**v, Coder::Iterable(_))));
    let transcode = stage_with(&t, "Flatten/Transcode/0");
    assert_eq!(t.plan.stages[transcode].inputs, vec![grouped]);
    assert!(stage.inputs.contains(&t.plan.stages[transcode].outputs[0]));
}

#[test]
fn batch_combine_runs_the_prelifted_leaves() {
    let t = translated("combine_batch");
    assert_eq!(count(&t, is_gbk), 1, "{}", describe(&t));
    let pre = stage_with(&t, "Sum/Precombine");
    assert_eq!(stage_with(&t, "Create/Map(decode)"), pre);
    let gbk = stage_named(&t, "Sum/Group");
    let post = stage_with(&t, "Sum/Merge");
    assert_eq!(stage_with(&t, "Sum/ExtractOutputs"), post);
    assert_eq!(stage_with(&t, "Format"), post);
    assert_eq!(t.plan.stages[pre].outputs, t.plan.stages[gbk].inputs);
    assert_eq!(t.plan.stages[post].inputs, t.plan.stages[gbk].outputs);
    for d in t.sdk_stages.values() {
        assert!(d
            .descriptor
            .transforms
            .values()
            .all(|tr| urn(tr) != urns::transform::COMBINE_PER_KEY));
    }
    // The pickled accumulator is length-prefixed for the runner.
    let grouped = &t.plan.pcollections[t.plan.stages[gbk].outputs[0]];
    let Coder::Kv(key, values) = &grouped.value_coder else {
        panic!("{:?}", grouped.value_coder)
    };
    assert_eq!(**key, Coder::StringUtf8);
    assert_eq!(**values, Coder::Iterable(Box::new(Coder::LengthPrefix)));
}

#[test]
fn streaming_combine_is_lifted_by_the_runner() {
    let t = translated("combine_streaming");
    assert_eq!(count(&t, is_gbk), 1, "{}", describe(&t));
    let pre = stage_with(&t, "Sum/Precombine");
    assert_eq!(stage_with(&t, "Create/Map(decode)"), pre);
    let gbk = stage_named(&t, "Sum/Group");
    let post = stage_with(&t, "Sum/Merge");
    assert_eq!(stage_with(&t, "Sum/ExtractOutputs"), post);
    assert_eq!(t.plan.stages[pre].outputs, t.plan.stages[gbk].inputs);
    assert_eq!(t.plan.stages[post].inputs, t.plan.stages[gbk].outputs);
    // The composite's own GroupByKey and CombineValues do not run.
    assert!(t.plan.stages.iter().all(|s| s.name != "Sum/GroupByKey"));
    for d in t.sdk_stages.values() {
        assert!(d
            .descriptor
            .transforms
            .values()
            .all(|tr| !tr.unique_name.contains("CombineValuesDoFn")));
    }
    // All three SDK steps carry the composite's CombinePayload.
    let original = common::load("combine_streaming");
    let sum = original
        .components
        .as_ref()
        .and_then(|c| c.transforms.values().find(|t| t.unique_name == "Sum"))
        .expect("Sum");
    for (stage, name) in [
        (pre, "Sum/Precombine"),
        (post, "Sum/Merge"),
        (post, "Sum/ExtractOutputs"),
    ] {
        let (id, tr) = transform(&t.sdk_stages[&stage], name);
        assert_eq!(
            tr.spec.as_ref().map(|s| &s.payload),
            sum.spec.as_ref().map(|s| &s.payload)
        );
        assert_eq!(t.unique_names.get(id).map(String::as_str), Some(name));
    }
}

#[test]
fn combine_with_an_element_count_trigger_runs_unlifted() {
    let t = translated("combine_after_count_streaming");
    let gbk = stage_named(&t, "Sum/GroupByKey");
    let StageKind::GroupByKey(ws) = &t.plan.stages[gbk].kind else {
        unreachable!()
    };
    assert_eq!(
        ws.trigger,
        Trigger::Repeat(Box::new(Trigger::ElementCount(2)))
    );
    assert_eq!(ws.accumulation, AccumulationMode::Accumulating);
    assert_eq!(
        ws.window_fn,
        WindowFn::Fixed {
            size: 10_000,
            offset: 0
        }
    );
    stage_with(&t, "Sum/Combine/ParDo(CombineValuesDoFn)");
    assert!(t.plan.stages.iter().all(|s| !s.name.contains("Precombine")));
}

#[test]
fn windowing_strategies_reach_the_engine() {
    let t = translated("windowing");
    let kind = |name: &str| match &t.plan.stages[stage_named(&t, name)].kind {
        StageKind::GroupByKey(ws) => ws.clone(),
        other => panic!("{name}: {other:?}"),
    };
    let fixed = kind("GroupFixed");
    assert_eq!(
        fixed.window_fn,
        WindowFn::Fixed {
            size: 60_000,
            offset: 5_000
        }
    );
    assert_eq!(
        fixed.trigger,
        Trigger::AfterEndOfWindow {
            early: Some(Box::new(Trigger::AfterProcessingTime {
                delay_ms: 10_000,
                align: None
            })),
            late: Some(Box::new(Trigger::ElementCount(1))),
        }
    );
    assert_eq!(fixed.accumulation, AccumulationMode::Accumulating);
    assert_eq!(fixed.allowed_lateness, 30_000);

    let sliding = kind("GroupSliding");
    assert_eq!(
        sliding.window_fn,
        WindowFn::Sliding {
            size: 30_000,
            period: 10_000,
            offset: 0
        }
    );
    assert_eq!(sliding.trigger, Trigger::Default);

    let sessions = kind("GroupSessions");
    assert_eq!(sessions.window_fn, WindowFn::Sessions { gap: 15_000 });
    assert!(sessions.window_fn.is_merging());
    assert_eq!(
        sessions.trigger,
        Trigger::Repeat(Box::new(Trigger::AfterAny(vec![
            Trigger::ElementCount(3),
            Trigger::AfterProcessingTime {
                delay_ms: 5_000,
                align: None
            },
        ])))
    );
    assert_eq!(sessions.accumulation, AccumulationMode::Discarding);
    for name in ["GroupFixed", "GroupSliding", "GroupSessions"] {
        let input = t.plan.stages[stage_named(&t, name)].inputs[0];
        assert_eq!(
            t.plan.pcollections[input].window_coder,
            Coder::IntervalWindow
        );
    }
}

#[test]
fn custom_windows_are_timestamp_prefixed() {
    let t = translated("custom_windows");
    let custom = stage_named(&t, "GroupCustom");
    let StageKind::GroupByKey(ws) = &t.plan.stages[custom].kind else {
        unreachable!()
    };
    assert_eq!(ws.window_fn, WindowFn::Custom { merging: false });
    let input = &t.plan.pcollections[t.plan.stages[custom].inputs[0]];
    assert_eq!(input.window_coder, Coder::CustomWindow);
    assert_eq!(
        t.plan.pcollections[t.plan.stages[custom].outputs[0]].window_coder,
        Coder::CustomWindow
    );

    let merging = stage_named(&t, "GroupMerging");
    let StageKind::GroupByKey(ws) = &t.plan.stages[merging].kind else {
        unreachable!()
    };
    assert_eq!(ws.window_fn, WindowFn::Custom { merging: true });
    let input = &t.plan.pcollections[t.plan.stages[merging].inputs[0]];
    assert_eq!(input.window_coder, Coder::IntervalWindow);

    // The SDK writes custom_window[length_prefix(pickled window coder)].
    let d = &t.sdk_stages[&stage_with(&t, "Custom")];
    let sink = d
        .outputs
        .iter()
        .find(|(_, p)| *p == t.plan.stages[custom].inputs[0])
        .map(|(s, _)| s)
        .expect("a sink for the custom-windowed PCollection");
    let port = port(&d.descriptor.transforms[sink]);
    let coders = &d.descriptor.coders;
    let window = &coders[&coders[&port.coder_id].component_coder_ids[1]];
    assert_eq!(
        window.spec.as_ref().map(|s| s.urn.as_str()),
        Some(urns::coder::CUSTOM_WINDOW)
    );
    let lp = &coders[&window.component_coder_ids[0]];
    assert_eq!(
        lp.spec.as_ref().map(|s| s.urn.as_str()),
        Some(urns::coder::LENGTH_PREFIX)
    );
    let inner = &coders[&lp.component_coder_ids[0]];
    assert_eq!(
        inner.spec.as_ref().map(|s| s.urn.as_str()),
        Some("beam:coder:pickled_python:v1")
    );
}

#[test]
fn descriptors_keep_original_transform_ids() {
    let original = common::load("create_map_gbk");
    let components = original.components.as_ref().expect("components");
    let t = translated("create_map_gbk");
    for d in t.sdk_stages.values() {
        for (id, tr) in &d.descriptor.transforms {
            let u = urn(tr);
            if u == urns::transform::DATA_SOURCE || u == urns::transform::DATA_SINK {
                assert!(!components.transforms.contains_key(id));
            } else {
                assert_eq!(components.transforms[id].unique_name, tr.unique_name);
            }
        }
    }
}

#[test]
fn translation_is_deterministic() {
    for name in ALL {
        let a = translated(name);
        let b = translated(name);
        assert_eq!(format!("{:?}", a.plan), format!("{:?}", b.plan), "{name}");
        assert_eq!(a.sdk_stages.len(), b.sdk_stages.len());
        for (i, d) in &a.sdk_stages {
            // Re-encoded ParDo payloads may order their maps differently;
            // compare them decoded.
            let normalized = |d: &refract_translate::SdkStageDescriptor| {
                let mut pbd = d.descriptor.clone();
                let mut payloads = Vec::new();
                for (id, tr) in pbd.transforms.iter_mut() {
                    if let Some(spec) = tr.spec.as_mut() {
                        if let Ok(p) = pb::ParDoPayload::decode(spec.payload.as_slice()) {
                            if spec.urn.contains("pardo") || spec.urn.contains("sdf") {
                                payloads.push((id.clone(), p));
                                spec.payload.clear();
                            }
                        }
                    }
                }
                payloads.sort_by(|x, y| x.0.cmp(&y.0));
                (pbd, payloads)
            };
            assert_eq!(
                normalized(d),
                normalized(&b.sdk_stages[i]),
                "{name} stage {i}"
            );
            assert_eq!(d.outputs, b.sdk_stages[i].outputs);
        }
    }
}

#[test]
fn test_stream_is_replayed_by_the_runner_with_nested_elements() {
    use refract_engine::plan::TestStreamEvent;
    let t = translated("test_stream");
    let ts = stage_named(&t, "TestStream");
    let StageKind::TestStream(events) = &t.plan.stages[ts].kind else {
        panic!("not a TestStream stage: {}", describe(&t));
    };
    let out = t.plan.stages[ts].outputs[0];
    let coder = &t.plan.pcollections[out].value_coder;
    match &events[0] {
        TestStreamEvent::Elements { output, elements } => {
            assert_eq!(*output, out);
            assert_eq!(elements.len(), 2);
            for (value, _) in elements {
                assert_eq!(coder.nested_len(value).unwrap(), value.len());
            }
        }
        other => panic!("expected elements first, got {other:?}"),
    }
    assert_eq!(
        events.last(),
        Some(&TestStreamEvent::Watermark(9_223_372_036_854_775))
    );
    assert!(t.sdk_stages.contains_key(&stage_with(&t, "Print")));
}

/// The Python TestStream pipeline, made to look as Go writes it: the
/// payload in a bare `beam:go:coder:custom:v1` coder whose values carry
/// their own length prefix (`elements`), the output PCollection in
/// `length_prefix` of it.
fn go_style_test_stream(elements: &[&[u8]]) -> pb::Pipeline {
    use refract_proto::urns::coder as c;
    let mut p = common::load("test_stream");
    let comps = p.components.as_mut().expect("components");
    let coder = |urn: &str, components: Vec<String>| pb::Coder {
        spec: Some(pb::FunctionSpec {
            urn: urn.to_string(),
            payload: b"a Go type".to_vec(),
        }),
        component_coder_ids: components,
    };
    comps
        .coders
        .insert("go".into(), coder(c::GO_CUSTOM, Vec::new()));
    comps
        .coders
        .insert("lp_go".into(), coder(c::LENGTH_PREFIX, vec!["go".into()]));
    recode_test_stream(comps, "go", "lp_go", elements);
    p
}

/// Rewrites the TestStream of `comps`: its payload in coder `payload_coder`
/// with its first element event's elements replaced by `elements`, its
/// output in coder `output_coder`.
fn recode_test_stream(
    comps: &mut pb::Components,
    payload_coder: &str,
    output_coder: &str,
    elements: &[&[u8]],
) {
    let ts = comps
        .transforms
        .values_mut()
        .find(|t| {
            t.spec
                .as_ref()
                .is_some_and(|s| s.urn == "beam:transform:teststream:v1")
        })
        .expect("a TestStream");
    let spec = ts.spec.as_mut().expect("spec");
    let mut payload = pb::TestStreamPayload::decode(spec.payload.as_slice()).expect("payload");
    payload.coder_id = payload_coder.into();
    let add = payload
        .events
        .iter_mut()
        .find_map(|e| match &mut e.event {
            Some(pb::test_stream_payload::event::Event::ElementEvent(add)) => Some(add),
            _ => None,
        })
        .expect("an element event");
    for (element, bytes) in add.elements.iter_mut().zip(elements) {
        element.encoded_element = bytes.to_vec();
    }
    spec.payload = payload.encode_to_vec();
    let output = ts.outputs.values().next().expect("an output").clone();
    comps
        .pcollections
        .get_mut(&output)
        .expect("output")
        .coder_id = output_coder.into();
}

#[test]
fn go_test_stream_elements_keep_the_sdks_own_length_prefix() {
    use refract_engine::plan::TestStreamEvent;
    let t = refract_translate::translate(
        &go_style_test_stream(&[b"\x01\x54", b"\x02\x01\x02"]),
        &common::opts(),
    )
    .expect("a Go TestStream translates");
    common::check_invariants(&t);
    let ts = stage_named(&t, "TestStream");
    let StageKind::TestStream(events) = &t.plan.stages[ts].kind else {
        panic!("not a TestStream stage: {}", describe(&t));
    };
    // No transcoding step: the payload's coder and the output's agree.
    assert!(
        !describe(&t).contains("Transcode"),
        "a transcoding step: {}",
        describe(&t)
    );
    let TestStreamEvent::Elements { elements, .. } = &events[0] else {
        panic!("expected elements first, got {:?}", events[0]);
    };
    let values: Vec<&[u8]> = elements.iter().map(|(v, _)| v.as_ref()).collect();
    assert_eq!(values, vec![&b"\x01\x54"[..], &b"\x02\x01\x02"[..]]);

    // A value that is not exactly one length-prefixed blob is refused.
    let err = refract_translate::translate(
        &go_style_test_stream(&[b"\x01\x54\x00", b"\x01\x54"]),
        &common::opts(),
    )
    .expect_err("trailing bytes");
    assert!(err.to_string().contains("does not decode"), "{err}");
    let err = refract_translate::translate(
        &go_style_test_stream(&[b"\x05\x54", b"\x01\x54"]),
        &common::opts(),
    )
    .expect_err("a short value");
    assert!(err.to_string().contains("does not decode"), "{err}");
}

/// The `test_stream` pipeline with its TestStream's payload and output in
/// a coder of `urn`, the elements replaced by `elements`, and, when `go`,
/// every environment announcing the Go SDK.
fn coded_test_stream(urn: &str, elements: &[&[u8]], go: bool) -> pb::Pipeline {
    let mut p = common::load("test_stream");
    let comps = p.components.as_mut().expect("components");
    comps.coders.insert(
        "str".into(),
        pb::Coder {
            spec: Some(pb::FunctionSpec {
                urn: urn.to_string(),
                payload: Vec::new(),
            }),
            component_coder_ids: Vec::new(),
        },
    );
    if go {
        for env in comps.environments.values_mut() {
            env.capabilities
                .retain(|c| !c.starts_with("beam:version:sdk_base:"));
            env.capabilities
                .push("beam:version:sdk_base:go:apache/beam_go_sdk:2.77.0".into());
        }
    }
    recode_test_stream(comps, "str", "str", elements);
    p
}

/// The values of the first element event of `t`'s TestStream stage.
fn first_test_stream_values(t: &Translated) -> Vec<Vec<u8>> {
    use refract_engine::plan::TestStreamEvent;
    let ts = stage_named(t, "TestStream");
    let StageKind::TestStream(events) = &t.plan.stages[ts].kind else {
        panic!("not a TestStream stage: {}", describe(t));
    };
    events
        .iter()
        .find_map(|e| match e {
            TestStreamEvent::Elements { elements, .. } => {
                Some(elements.iter().map(|(v, _)| v.to_vec()).collect())
            }
            _ => None,
        })
        .expect("an element event")
}

#[test]
fn go_test_stream_strings_arrive_nested_and_others_outer() {
    let string_test_stream =
        |elements: &[&[u8]], go| coded_test_stream(urns::coder::STRING_UTF8, elements, go);
    // Go writes "a" as its nested form, length first; the engine keeps it.
    let go = refract_translate::translate(
        &string_test_stream(&[b"\x01a", b"\x02bc"], true),
        &common::opts(),
    )
    .expect("a Go TestStream of strings translates");
    assert_eq!(
        first_test_stream_values(&go),
        vec![b"\x01a".to_vec(), b"\x02bc".to_vec()]
    );
    // Python writes "a" in the outer context: the length is added.
    let python =
        refract_translate::translate(&string_test_stream(&[b"a", b"bc"], false), &common::opts())
            .expect("a Python TestStream of strings translates");
    assert_eq!(
        first_test_stream_values(&python),
        vec![b"\x01a".to_vec(), b"\x02bc".to_vec()]
    );
    // A Go element that is not one nested string is refused.
    let err = refract_translate::translate(
        &string_test_stream(&[b"\x05a", b"\x02bc"], true),
        &common::opts(),
    )
    .expect_err("a short string");
    assert!(err.to_string().contains("does not decode"), "{err}");
}

#[test]
fn go_test_stream_values_of_coders_the_runner_does_not_know_get_its_prefix() {
    // A Go schema row ("a", "b"): the runner holds it as an opaque,
    // length-prefixed blob.
    let row: &[u8] = b"\x02\x00\x01a\x01b";
    let t = refract_translate::translate(
        &coded_test_stream("beam:coder:row:v1", &[row, row], true),
        &common::opts(),
    )
    .expect("a Go TestStream of rows translates");
    let mut prefixed = vec![row.len() as u8];
    prefixed.extend_from_slice(row);
    assert_eq!(
        first_test_stream_values(&t),
        vec![prefixed.clone(), prefixed]
    );
}
