//! ProcessBundleDescriptors for fused SDK stages.
//!
//! A descriptor holds the stage's leaf transforms under their original ids
//! (the SDK's metrics labels, state keys and residuals use them), a data
//! source for the stage's main input, a data sink for every PCollection the
//! runner must receive, and everything those refer to: PCollections (with
//! their rewritten coders), windowing strategies, the transitively closed
//! coders and the environments. Ports carry explicit
//! `windowed_value[element, window]` coders.

use std::collections::{BTreeSet, HashMap, HashSet};

use refract_engine::plan::{
    PCollectionIdx, SdkStage, SideInputAccess, StageIdx, TimeDomain, TimerFamily, TransformId,
    WindowExpiration,
};
use refract_proto::fn_api;
use refract_proto::pipeline as pb;
use refract_proto::prost::Message;
use refract_proto::urns::transform as t;

use crate::coders::unique_id;
use crate::error::TranslateError;
use crate::fuse::SdkGroup;
use crate::graph::Graph;
use crate::payloads::{decode_combine, decode_pardo, state_coders, COMBINE_STEPS, PARDO_LIKE};
use crate::rewrite::{coder_of, grouped_values, strategy_of, window_coder_of};
use crate::{SdkStageDescriptor, TranslateOptions};

/// A built SDK stage: its descriptor and the engine's facts about it.
pub(crate) struct BuiltStage {
    /// The descriptor and its port ids.
    pub descriptor: SdkStageDescriptor,
    /// Engine facts (state, timers, splitting).
    pub stage: SdkStage,
    /// Side inputs, with PCollection ids still to be mapped to plan indices.
    pub side_inputs: Vec<(TransformId, String, String, SideInputAccess)>,
    /// Data source and sink ids → their unique names.
    pub synthetic_names: Vec<(String, String)>,
}

/// Builds the descriptor of `group` (stage `stage_idx`). `sinks` are the
/// PCollections the stage must send to the runner, and `pcoll_index` maps
/// plan PCollections to their engine index. A main input in
/// `state_backed` (a GroupByKey's output) is read through a state-backed
/// iterable coder.
pub(crate) fn build(
    graph: &mut Graph,
    group: &SdkGroup,
    stage_idx: StageIdx,
    sinks: &[String],
    pcoll_index: &HashMap<String, PCollectionIdx>,
    state_backed: &HashSet<String>,
    opts: &TranslateOptions,
) -> Result<BuiltStage, TranslateError> {
    let id = format!("{}-{}", opts.descriptor_id_prefix, stage_idx);
    let location = format!("stage {id}");
    let endpoint = pb::ApiServiceDescriptor {
        url: opts.fn_api_url.clone(),
        ..Default::default()
    };
    let mut transforms: HashMap<String, pb::PTransform> = HashMap::new();
    let mut coder_roots: BTreeSet<String> = BTreeSet::new();
    let mut uses_timers = false;
    let mut stage = SdkStage::default();
    let mut timer_ids = Vec::new();
    let mut side_inputs = Vec::new();

    // Each transform's id is interned once: its timer families, side
    // inputs and window expiration share it.
    let mut root_id: Option<TransformId> = None;
    for &i in &group.nodes {
        let node = &graph.nodes[i];
        let transform_id = TransformId::new(&node.id);
        root_id.get_or_insert_with(|| transform_id.clone());
        let urn = node.transform.spec.as_ref().map_or("", |s| s.urn.as_str());
        if PARDO_LIKE.contains(&urn) {
            let payload = decode_pardo(&node.transform, &node.name)?;
            if !payload.restriction_coder_id.is_empty() {
                coder_roots.insert(payload.restriction_coder_id.clone());
            }
            for spec in payload.state_specs.values() {
                if let Some(kind) = &spec.spec {
                    coder_roots.extend(state_coders(kind).into_iter().cloned());
                }
            }
            let mut families: Vec<(&String, &pb::TimerFamilySpec)> =
                payload.timer_family_specs.iter().collect();
            families.sort_by(|a, b| a.0.cmp(b.0));
            for (family, spec) in families {
                uses_timers = true;
                let (key, window) = timer_parts(graph, &spec.timer_family_coder_id, &node.name)?;
                coder_roots.insert(spec.timer_family_coder_id.clone());
                stage.timer_families.push(TimerFamily {
                    transform_id: transform_id.clone(),
                    family_id: family.clone(),
                    domain: if spec.time_domain == pb::time_domain::Enum::ProcessingTime as i32 {
                        TimeDomain::ProcessingTime
                    } else {
                        TimeDomain::EventTime
                    },
                    key_coder: key,
                    window_coder: window,
                });
                timer_ids.push((node.id.clone(), family.clone()));
            }
        } else if COMBINE_STEPS.contains(&urn) {
            coder_roots.insert(decode_combine(&node.transform, &node.name)?.accumulator_coder_id);
        }
        for side in &node.side_inputs {
            side_inputs.push((
                transform_id.clone(),
                side.tag.clone(),
                side.pcoll.clone(),
                side.access,
            ));
        }
        stage.requires_finalization |= node.finalization;
        transforms.insert(node.id.clone(), node.transform.clone());
    }
    if let Some(&root) = group.nodes.first() {
        // Only the first transform of a stage may be stateful or splittable:
        // keyed routing and splits happen at the stage's input.
        let root = &graph.nodes[root];
        stage.stateful = root.stateful;
        stage.splittable = root.splittable;
        stage.stable_input = root.stable_input;
        if root.stateful {
            stage.window_expiration =
                root.window_expiration_family
                    .as_ref()
                    .map(|family_id| WindowExpiration {
                        transform_id: root_id
                            .clone()
                            .unwrap_or_else(|| TransformId::new(&root.id)),
                        family_id: family_id.clone(),
                    });
            stage.time_sorted_input = root.time_sorted_input;
            // User state lives until the end of its window plus this.
            stage.allowed_lateness = group
                .input
                .as_ref()
                .and_then(|p| strategy_of(graph, p).ok())
                .map_or(0, |ws| ws.allowed_lateness);
        }
    }

    let mut synthetic_names = Vec::new();
    let mut port_transform = |graph: &mut Graph,
                              transforms: &mut HashMap<String, pb::PTransform>,
                              coder_roots: &mut BTreeSet<String>,
                              pcoll: &str,
                              source: bool|
     -> Result<String, TranslateError> {
        let mut elem = coder_of(graph, pcoll)?;
        if source && state_backed.contains(pcoll) {
            elem = state_backed_grouped(graph, pcoll)?;
        }
        let window = window_coder_of(graph, pcoll)?;
        let window = graph
            .coders
            .safe_window(&window, &format!("PCollection '{pcoll}'"))?;
        let port_coder = graph.coders.windowed(&elem, &window);
        coder_roots.insert(port_coder.clone());
        let base = format!("{pcoll}/{}", if source { "Source" } else { "Sink" });
        let port_id = unique_id(&base, |c| {
            transforms.contains_key(c) || graph.components.transforms.contains_key(c)
        });
        let port = fn_api::RemoteGrpcPort {
            api_service_descriptor: Some(endpoint.clone()),
            coder_id: port_coder,
        };
        let local = [(
            if source { "out" } else { "in" }.to_string(),
            pcoll.to_string(),
        )]
        .into_iter()
        .collect();
        let (inputs, outputs) = if source {
            (HashMap::new(), local)
        } else {
            (local, HashMap::new())
        };
        transforms.insert(
            port_id.clone(),
            pb::PTransform {
                unique_name: port_id.clone(),
                spec: Some(pb::FunctionSpec {
                    urn: if source { t::DATA_SOURCE } else { t::DATA_SINK }.to_string(),
                    payload: port.encode_to_vec(),
                }),
                inputs,
                outputs,
                ..Default::default()
            },
        );
        synthetic_names.push((port_id.clone(), port_id.clone()));
        Ok(port_id)
    };

    let input_transform_id = match &group.input {
        Some(pcoll) => Some(port_transform(
            graph,
            &mut transforms,
            &mut coder_roots,
            pcoll,
            true,
        )?),
        None => None,
    };
    let mut outputs = Vec::with_capacity(sinks.len());
    for pcoll in sinks {
        let sink = port_transform(graph, &mut transforms, &mut coder_roots, pcoll, false)?;
        let idx = *pcoll_index
            .get(pcoll)
            .ok_or_else(|| TranslateError::missing("PCollection", pcoll, location.clone()))?;
        outputs.push((sink, idx));
    }

    let mut pcollections = HashMap::new();
    let mut windowing_strategies = HashMap::new();
    let mut environments = HashMap::new();
    let mut env_ids: BTreeSet<String> = BTreeSet::new();
    for transform in transforms.values() {
        if !transform.environment_id.is_empty() {
            env_ids.insert(transform.environment_id.clone());
        }
        for pcoll in transform.inputs.values().chain(transform.outputs.values()) {
            if pcollections.contains_key(pcoll) {
                continue;
            }
            let pc =
                graph.components.pcollections.get(pcoll).ok_or_else(|| {
                    TranslateError::missing("PCollection", pcoll, location.clone())
                })?;
            coder_roots.insert(pc.coder_id.clone());
            let ws = strategy_of(graph, pcoll)?;
            coder_roots.insert(ws.window_coder_id.clone());
            if !ws.environment_id.is_empty() {
                env_ids.insert(ws.environment_id.clone());
            }
            windowing_strategies.insert(pc.windowing_strategy_id.clone(), ws.clone());
            pcollections.insert(pcoll.clone(), pc.clone());
        }
    }
    for env in env_ids {
        let environment = graph
            .components
            .environments
            .get(&env)
            .ok_or_else(|| TranslateError::missing("environment", &env, location.clone()))?;
        environments.insert(env, environment.clone());
    }
    let coders = graph.coders.closure(&coder_roots, &location)?;

    let descriptor = fn_api::ProcessBundleDescriptor {
        id,
        transforms,
        pcollections,
        windowing_strategies,
        coders,
        environments,
        // Always set: the Python harness dials whatever is here, even when unused.
        state_api_service_descriptor: Some(endpoint.clone()),
        timer_api_service_descriptor: uses_timers.then(|| endpoint.clone()),
    };
    let drain_descriptor = match (&input_transform_id, stage.splittable && !opts.drain) {
        (Some(source), true) => crate::drain::variant(&descriptor, source),
        _ => None,
    };
    Ok(BuiltStage {
        descriptor: SdkStageDescriptor {
            drain_descriptor,
            splittable: stage.splittable,
            stateful: stage.stateful,
            descriptor,
            environment_id: group.env.clone(),
            input_transform_id,
            outputs,
            timer_families: timer_ids,
        },
        stage,
        side_inputs,
        synthetic_names,
    })
}

/// `KV<K, state_backed_iterable<V>>` for a GroupByKey's (rewritten)
/// output `pcoll` of coder `KV<K, iterable<V>>`: the same bytes for an
/// iterable written in full, and lets the runner end one with a token
/// instead.
fn state_backed_grouped(graph: &mut Graph, pcoll: &str) -> Result<String, TranslateError> {
    use refract_proto::urns::coder as c;
    let grouped = coder_of(graph, pcoll)?;
    let (key, value) = grouped_values(graph, pcoll).ok_or_else(|| {
        TranslateError::Invalid(format!(
            "the GroupByKey output '{pcoll}' has no KV<K, iterable<V>> coder"
        ))
    })?;
    let iterable = graph.coders.add(
        &format!("{grouped}_values_state_backed"),
        c::STATE_BACKED_ITERABLE,
        vec![value],
    );
    Ok(graph.coders.add(
        &format!("{grouped}_state_backed"),
        c::KV,
        vec![key, iterable],
    ))
}

/// The engine's key and window coders of a (rewritten) timer family coder.
fn timer_parts(
    graph: &Graph,
    timer_coder: &str,
    transform: &str,
) -> Result<(refract_engine::coder::Coder, refract_engine::coder::Coder), TranslateError> {
    let location = format!("timer coder of transform '{transform}'");
    let parts =
        graph
            .coders
            .components_of(timer_coder, refract_proto::urns::coder::TIMER, &location)?;
    Ok((
        graph.coders.engine(&parts[0], &location)?,
        graph.coders.engine(&parts[1], &location)?,
    ))
}
