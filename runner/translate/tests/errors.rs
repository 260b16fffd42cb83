//! What Refract rejects, and that the error names what and where.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

mod common;

use common::{load, opts};
use refract_proto::pipeline as pb;
use refract_proto::prost::Message;
use refract_proto::urns;
use refract_translate::{translate, validate, TranslateError};

fn rejected(pipeline: &pb::Pipeline) -> String {
    let from_validate = validate(pipeline)
        .expect_err("validate must reject")
        .to_string();
    let from_translate = translate(pipeline, &opts())
        .expect_err("translate must reject")
        .to_string();
    assert_eq!(from_validate, from_translate);
    from_validate
}

fn components(p: &mut pb::Pipeline) -> &mut pb::Components {
    p.components.as_mut().expect("components")
}

fn transform_named<'a>(p: &'a mut pb::Pipeline, name: &str) -> &'a mut pb::PTransform {
    components(p)
        .transforms
        .values_mut()
        .find(|t| t.unique_name == name)
        .unwrap_or_else(|| panic!("no transform '{name}'"))
}

fn edit_pardo(p: &mut pb::Pipeline, name: &str, edit: impl FnOnce(&mut pb::ParDoPayload)) {
    let t = transform_named(p, name);
    let spec = t.spec.as_mut().expect("spec");
    let mut payload = pb::ParDoPayload::decode(spec.payload.as_slice()).expect("ParDoPayload");
    edit(&mut payload);
    spec.payload = payload.encode_to_vec();
}

#[test]
fn unknown_transform_urn_is_named_with_its_transform() {
    assert_eq!(
        rejected(&load("unknown_urn")),
        "unsupported transform URN 'beam:transform:foo:v1' in transform 'KeyBy'"
    );
}

#[test]
fn unsupported_requirements_are_named() {
    for requirement in [
        "beam:requirement:pardo:something_new:v1",
        "beam:requirement:pardo:unknown:v2",
    ] {
        let mut p = load("create_map_gbk");
        p.requirements.push(requirement.to_string());
        assert_eq!(
            rejected(&p),
            format!("unsupported pipeline requirement '{requirement}'")
        );
    }
}

#[test]
fn supported_requirements_are_accepted() {
    let mut p = load("stateful_timers");
    for requirement in [
        urns::requirement::STATEFUL,
        urns::requirement::SPLITTABLE_DOFN,
        urns::requirement::FINALIZATION,
        urns::requirement::STABLE_INPUT,
        urns::requirement::TIME_SORTED_INPUT,
        urns::requirement::ON_WINDOW_EXPIRATION,
    ] {
        p.requirements.push(requirement.to_string());
    }
    validate(&p).expect("supported requirements");
}

#[test]
fn embedded_environments_are_rejected() {
    for urn in [
        urns::env::EMBEDDED_PYTHON,
        urns::env::EMBEDDED_PYTHON_GRPC,
        urns::env::EMBEDDED_PYTHON_LOOPBACK,
    ] {
        let mut p = load("create_map_gbk");
        for env in components(&mut p).environments.values_mut() {
            env.urn = urn.to_string();
        }
        assert_eq!(
            rejected(&p),
            format!(
                "environment '{urn}' can only run inside Python's own FnApiRunner; \
                 use LOOPBACK, EXTERNAL, PROCESS or DOCKER"
            )
        );
    }
}

#[test]
fn unknown_environments_are_rejected() {
    let mut p = load("create_map_gbk");
    for env in components(&mut p).environments.values_mut() {
        env.urn = "beam:env:kubernetes:v1".to_string();
    }
    let err = rejected(&p);
    assert!(
        err.starts_with("unsupported environment URN 'beam:env:kubernetes:v1'"),
        "{err}"
    );
}

/// The pipeline's environments wrapped, each, in an AnyOf list that offers
/// `before` first and the original after it.
fn offered_with(p: &mut pb::Pipeline, before: pb::Environment) {
    for env in components(p).environments.values_mut() {
        let original = env.clone();
        *env = pb::Environment {
            urn: "beam:env:anyof:v1".to_string(),
            payload: pb::AnyOfEnvironmentPayload {
                environments: vec![before.clone(), original],
            }
            .encode_to_vec(),
            ..Default::default()
        };
    }
}

#[test]
fn any_of_environments_run_their_preferred_alternative() {
    let mut p = load("create_map_gbk");
    let original = components(&mut p).environments.clone();
    let docker = pb::Environment {
        urn: urns::env::DOCKER.to_string(),
        payload: pb::DockerPayload {
            container_image: "apache/beam_java17_sdk:2.73.0".to_string(),
        }
        .encode_to_vec(),
        ..Default::default()
    };
    offered_with(&mut p, docker);
    let translated = translate(&p, &opts()).expect("translates");
    // The original environments are EXTERNAL (LOOPBACK): preferred to DOCKER.
    assert_eq!(translated.environments, original);
    for stage in translated.sdk_stages.values() {
        assert_eq!(
            stage.descriptor.environments.get(&stage.environment_id),
            original.get(&stage.environment_id)
        );
    }
}

#[test]
fn any_of_environments_without_a_startable_alternative_are_rejected() {
    let mut p = load("create_map_gbk");
    for env in components(&mut p).environments.values_mut() {
        env.urn = "beam:env:kubernetes:v1".to_string();
    }
    offered_with(
        &mut p,
        pb::Environment {
            urn: urns::env::EMBEDDED_PYTHON.to_string(),
            ..Default::default()
        },
    );
    let err = rejected(&p);
    assert!(
        err.contains("offers no alternative Refract can start")
            && err.contains("beam:env:embedded_python:v1, beam:env:kubernetes:v1"),
        "{err}"
    );
}

#[test]
fn time_sorted_input_on_a_stateful_pardo_is_accepted() {
    let mut p = load("stateful_timers");
    edit_pardo(&mut p, "Stateful", |payload| {
        payload.requires_time_sorted_input = true
    });
    validate(&p).expect("time-sorted input");
}

#[test]
fn a_stable_input_pardo_is_accepted_and_starts_a_gated_stage() {
    let mut p = load("create_map_gbk");
    edit_pardo(&mut p, "KeyBy", |payload| {
        payload.requires_stable_input = true
    });
    p.requirements
        .push(urns::requirement::STABLE_INPUT.to_string());
    validate(&p).expect("stable input is supported");
    let t = translate(&p, &opts()).expect("translates");
    let stages: Vec<(bool, Vec<&str>)> = t
        .sdk_stages
        .iter()
        .map(|(idx, d)| {
            let stable = matches!(
                &t.plan.stages[*idx].kind,
                refract_engine::plan::StageKind::Sdk(s) if s.stable_input
            );
            let mut names: Vec<&str> = d
                .descriptor
                .transforms
                .values()
                .map(|tr| tr.unique_name.as_str())
                .filter(|n| !n.is_empty())
                .collect();
            names.sort_unstable();
            (stable, names)
        })
        .collect();
    let keyed: Vec<&(bool, Vec<&str>)> = stages
        .iter()
        .filter(|(_, names)| names.contains(&"KeyBy"))
        .collect();
    assert_eq!(keyed.len(), 1, "{stages:?}");
    assert!(keyed[0].0, "KeyBy's stage is gated: {stages:?}");
    assert!(
        !keyed[0].1.iter().any(|n| n.starts_with("Create")),
        "KeyBy is not fused with what feeds it: {stages:?}"
    );
    assert_eq!(
        stages.iter().filter(|(stable, _)| *stable).count(),
        1,
        "{stages:?}"
    );
}

#[test]
fn window_expiration_needs_a_declared_event_time_family() {
    let mut p = load("stateful_timers");
    edit_pardo(&mut p, "Stateful", |payload| {
        payload.on_window_expiration_timer_family_spec = "no-such-family".to_string()
    });
    let err = rejected(&p);
    assert!(err.contains("'no-such-family'"), "{err}");
    assert!(
        err.contains(urns::requirement::ON_WINDOW_EXPIRATION),
        "{err}"
    );
    assert!(err.contains("transform 'Stateful'"), "{err}");
}

#[test]
fn unknown_user_state_protocol_is_rejected() {
    let mut p = load("stateful_timers");
    edit_pardo(&mut p, "Stateful", |payload| {
        for spec in payload.state_specs.values_mut() {
            spec.protocol = Some(pb::FunctionSpec {
                urn: "beam:user_state:fancy:v1".to_string(),
                payload: Vec::new(),
            });
        }
    });
    let err = rejected(&p);
    assert!(
        err.starts_with("unsupported user state protocol 'beam:user_state:fancy:v1'"),
        "{err}"
    );
    assert!(err.contains("of transform 'Stateful'"), "{err}");
}

#[test]
fn unknown_side_input_access_pattern_is_rejected() {
    let mut p = load("side_inputs");
    edit_pardo(&mut p, "UseSides", |payload| {
        for side in payload.side_inputs.values_mut() {
            side.access_pattern = Some(pb::FunctionSpec {
                urn: "beam:side_input:fancy:v1".to_string(),
                payload: Vec::new(),
            });
        }
    });
    let err = rejected(&p);
    assert!(
        err.starts_with("unsupported side input access pattern 'beam:side_input:fancy:v1'"),
        "{err}"
    );
}

#[test]
fn retracting_accumulation_is_rejected() {
    let mut p = load("create_map_gbk");
    for ws in components(&mut p).windowing_strategies.values_mut() {
        ws.accumulation_mode = pb::accumulation_mode::Enum::Retracting as i32;
    }
    let err = rejected(&p);
    assert!(
        err.starts_with("unsupported accumulation mode RETRACTING in windowing strategy"),
        "{err}"
    );
}

#[test]
fn bad_payloads_are_reported_with_their_transform() {
    let mut p = load("create_map_gbk");
    let t = transform_named(&mut p, "KeyBy");
    if let Some(spec) = t.spec.as_mut() {
        spec.payload = vec![0xff, 0xff, 0xff];
    }
    let err = translate(&p, &opts()).expect_err("a broken payload");
    assert!(matches!(err, TranslateError::BadPayload { .. }), "{err}");
    assert!(err.to_string().contains("transform 'KeyBy'"), "{err}");
}

#[test]
fn missing_coders_are_reported() {
    let mut p = load("create_map_gbk");
    let c = components(&mut p);
    let victim = c
        .pcollections
        .values()
        .map(|pc| pc.coder_id.clone())
        .find(|id| id.contains("VarInt"))
        .expect("a varint coder");
    c.coders.remove(&victim);
    let err = rejected(&p);
    assert!(err.contains(&format!("coder '{victim}'")), "{err}");
    assert!(err.contains("missing from the pipeline"), "{err}");
}

#[test]
fn group_by_key_needs_a_kv_input() {
    let mut p = load("create_map_gbk");
    // Make KeyBy's output (the GBK input) a plain varint PCollection.
    let out = transform_named(&mut p, "KeyBy")
        .outputs
        .values()
        .next()
        .cloned()
        .expect("an output");
    let c = components(&mut p);
    let varint = c
        .coders
        .iter()
        .find(|(_, coder)| {
            coder
                .spec
                .as_ref()
                .is_some_and(|s| s.urn == urns::coder::VARINT)
        })
        .map(|(id, _)| id.clone())
        .expect("varint");
    if let Some(pc) = c.pcollections.get_mut(&out) {
        pc.coder_id = varint.clone();
    }
    let err = rejected(&p);
    assert_eq!(
        err,
        format!(
            "unsupported coder '{varint}' ('beam:coder:varint:v1' with 0 components) where a \
             'beam:coder:kv:v1' coder is required in the input of GroupByKey transform 'Group'"
        )
    );
}

#[test]
fn empty_composites_are_ignored() {
    let mut p = load("create_map_gbk");
    let c = components(&mut p);
    let input = c
        .pcollections
        .keys()
        .next()
        .cloned()
        .expect("a PCollection");
    c.transforms.insert(
        "empty".to_string(),
        pb::PTransform {
            unique_name: "Empty".to_string(),
            inputs: [("in".to_string(), input.clone())].into_iter().collect(),
            outputs: [("out".to_string(), input)].into_iter().collect(),
            ..Default::default()
        },
    );
    p.root_transform_ids.push("empty".to_string());
    validate(&p).expect("an empty composite is structure only");
}
