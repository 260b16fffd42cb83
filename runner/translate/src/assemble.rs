//! Puts the pieces together: fused groups become the engine's stages and
//! PCollections, and SDK groups get their bundle descriptors.

use std::collections::{HashMap, HashSet};

use refract_engine::plan::{
    ClosingBehavior, FinishedTrigger, PCollection, PCollectionIdx, Plan, SideInput, SideInputId,
    Stage, StageIdx, StageKind,
};
use refract_proto::pipeline as pb;
use refract_proto::prost::Message;
use refract_proto::urns;

use crate::error::TranslateError;
use crate::fuse::{self, Group};
use crate::graph::{Graph, NodeKind};
use crate::limits::{count_descriptor_bytes, Limits};
use crate::rewrite::{self, grouped_values, window_coder_of};
use crate::{descriptor, merge, test_stream, windowing, TranslateOptions, Translated};

/// Fuses `graph`, rewrites its coders and builds the plan and descriptors.
pub(crate) fn assemble(
    mut graph: Graph,
    opts: &TranslateOptions,
    limits: &Limits,
) -> Result<Translated, TranslateError> {
    let groups = fuse::fuse(&graph.nodes, opts.fusion);
    let bounds = rewrite::boundaries(&graph, &groups);
    rewrite::rewrite(&mut graph, &groups, &bounds)?;

    let mut plan = Plan::default();
    let mut descriptor_bytes = 0;
    let mut index: HashMap<String, PCollectionIdx> = HashMap::new();
    for pcoll in &bounds.pcolls {
        let referrer = format!("PCollection '{pcoll}'");
        let pc = graph
            .components
            .pcollections
            .get(pcoll)
            .ok_or_else(|| TranslateError::missing("PCollection", pcoll, "the plan"))?;
        let value_coder = graph.coders.engine(&pc.coder_id, &referrer)?;
        let bounded = pc.is_bounded != pb::is_bounded::Enum::Unbounded as i32;
        let window = window_coder_of(&graph, pcoll)?;
        let window = graph.coders.safe_window(&window, &referrer)?;
        let window_coder = graph.coders.engine(&window, &referrer)?;
        let at = plan.pcollections.push(PCollection {
            id: pcoll.clone(),
            value_coder,
            window_coder,
            bounded,
        });
        index.insert(pcoll.clone(), at);
    }
    let lookup = |index: &HashMap<String, PCollectionIdx>, pcoll: &String| {
        index
            .get(pcoll)
            .copied()
            .ok_or_else(|| TranslateError::missing("PCollection", pcoll, "the plan"))
    };

    let python_only = !graph.components.environments.is_empty()
        && graph
            .components
            .environments
            .values()
            .all(|env| runs_sdk(env, urns::sdk_base::PYTHON));
    let state_backed = state_backed_outputs(&graph, &groups);
    let mut sdk_stages = HashMap::new();
    let mut window_mergers = HashMap::new();
    for (g, group) in groups.iter().enumerate() {
        // Groups become stages in order: group `g` is stage `g`.
        let stage_idx = StageIdx::new(g);
        let stage = match group {
            Group::Runner(i) => {
                let node = graph.nodes[*i].clone();
                let kind = match node.kind {
                    NodeKind::Impulse => StageKind::Impulse,
                    NodeKind::TestStream => StageKind::TestStream(test_stream::events(
                        &node,
                        &plan,
                        &index,
                        &graph.coders,
                        read_by_go(&graph, &node),
                    )?),
                    NodeKind::Flatten => StageKind::Flatten,
                    NodeKind::GroupByKey => {
                        let input = node.inputs.first().ok_or_else(|| {
                            TranslateError::Invalid(format!(
                                "GroupByKey '{}' has no input",
                                node.name
                            ))
                        })?;
                        let pc = graph.components.pcollections.get(input).ok_or_else(|| {
                            TranslateError::missing(
                                "PCollection",
                                input,
                                format!("transform '{}'", node.name),
                            )
                        })?;
                        let mut strategy = windowing::convert(
                            &graph.components,
                            &pc.windowing_strategy_id,
                            &format!("PCollection '{input}'"),
                        )?;
                        if python_only {
                            // The Python SDK writes EMIT_ALWAYS into every
                            // windowing strategy, but its own runners never
                            // emit an empty closing pane; users expect those
                            // results.
                            strategy.closing_behavior = ClosingBehavior::EmitIfNonEmpty;
                            // Python's suite for local runners expects
                            // Prism's rule for data after a finished
                            // trigger (see `FinishedTrigger`); Go's and
                            // Java's expect Beam's.
                            strategy.finished_trigger = FinishedTrigger::Restarts;
                        }
                        if let Some(m) = merge::window_merger(&mut graph, &node, stage_idx, opts)? {
                            window_mergers.insert(stage_idx, m);
                        }
                        StageKind::GroupByKey(strategy)
                    }
                    NodeKind::Sdk => {
                        return Err(TranslateError::Invalid(format!(
                            "SDK transform '{}' was not fused into a stage",
                            node.name
                        )))
                    }
                };
                Stage {
                    name: node.name.clone(),
                    kind,
                    inputs: node
                        .inputs
                        .iter()
                        .map(|p| lookup(&index, p))
                        .collect::<Result<_, _>>()?,
                    side_inputs: Vec::new(),
                    outputs: node
                        .outputs
                        .iter()
                        .map(|p| lookup(&index, p))
                        .collect::<Result<_, _>>()?,
                }
            }
            Group::Sdk(s) => {
                let sinks = bounds.sinks.get(g).map(Vec::as_slice).unwrap_or_default();
                let built = descriptor::build(
                    &mut graph,
                    s,
                    stage_idx,
                    sinks,
                    &index,
                    &state_backed,
                    opts,
                )?;
                count_descriptor_bytes(
                    &mut descriptor_bytes,
                    built.descriptor.descriptor.encoded_len(),
                    limits,
                )?;
                let name = s
                    .nodes
                    .iter()
                    .map(|&i| graph.nodes[i].name.as_str())
                    .collect::<Vec<_>>()
                    .join(&refract_engine::plan::FUSED_NAME_SEPARATOR.to_string());
                let side_inputs = built
                    .side_inputs
                    .into_iter()
                    .map(|(transform_id, tag, pcoll, access)| {
                        let fires_early = side_input_fires_early(&graph.components, &pcoll)?;
                        Ok(SideInput {
                            id: SideInputId::new(transform_id, tag),
                            pcollection: lookup(&index, &pcoll)?,
                            access,
                            fires_early,
                        })
                    })
                    .collect::<Result<_, TranslateError>>()?;
                let inputs = match &s.input {
                    Some(p) => vec![lookup(&index, p)?],
                    None => Vec::new(),
                };
                let outputs = built
                    .descriptor
                    .outputs
                    .iter()
                    .map(|(_, idx)| *idx)
                    .collect();
                graph.unique_names.extend(built.synthetic_names);
                sdk_stages.insert(stage_idx, built.descriptor);
                Stage {
                    name,
                    kind: StageKind::Sdk(built.stage),
                    inputs,
                    side_inputs,
                    outputs,
                }
            }
        };
        plan.stages.push(stage);
    }
    tracing::debug!(
        stages = plan.stages.len(),
        sdk_stages = sdk_stages.len(),
        pcollections = plan.pcollections.len(),
        streaming = opts.streaming,
        "translated pipeline"
    );
    let mut state_backed_outputs: Vec<PCollectionIdx> = state_backed
        .iter()
        .filter_map(|p| index.get(p).copied())
        .collect();
    state_backed_outputs.sort_unstable();
    Ok(Translated {
        state_backed_outputs,
        plan,
        sdk_stages,
        window_mergers,
        unique_names: graph.unique_names,
        environments: graph.components.environments,
    })
}

/// The GroupByKey outputs whose every consumer is an SDK stage reading
/// it as its main input, in an environment that declares
/// `beam:coder:state_backed_iterable:v1`: those stages get it through that
/// coder, so the GroupByKey may hand them a key too large for memory
/// behind a token. (A side input, a Flatten or any other runner-side
/// consumer needs every value in the element, so one of them rules it
/// out; so does an environment that does not declare the coder.)
fn state_backed_outputs(graph: &Graph, groups: &[Group]) -> HashSet<String> {
    let capable = |env: &str| {
        graph.components.environments.get(env).is_some_and(|e| {
            e.capabilities
                .iter()
                .any(|c| c == refract_proto::urns::coder::STATE_BACKED_ITERABLE)
        })
    };
    let mut outputs: HashSet<String> = HashSet::new();
    for group in groups {
        if let Group::Runner(i) = group {
            let node = &graph.nodes[*i];
            if matches!(node.kind, NodeKind::GroupByKey) {
                outputs.extend(
                    node.outputs
                        .iter()
                        .filter(|p| grouped_values(graph, p).is_some())
                        .cloned(),
                );
            }
        }
    }
    for group in groups {
        match group {
            Group::Runner(i) => {
                for input in &graph.nodes[*i].inputs {
                    outputs.remove(input);
                }
            }
            Group::Sdk(s) => {
                if let Some(input) = &s.input {
                    if !capable(&s.env) {
                        outputs.remove(input);
                    }
                }
                for &n in &s.nodes {
                    let node = &graph.nodes[n];
                    for side in &node.side_inputs {
                        outputs.remove(&side.pcoll);
                    }
                    for input in &node.inputs {
                        if s.input.as_ref() != Some(input) {
                            outputs.remove(input);
                        }
                    }
                }
            }
        }
    }
    outputs
}

/// Whether the trigger of side-input PCollection `pcoll` can fire before
/// its windows end (see `SideInput::fires_early`).
fn side_input_fires_early(
    components: &pb::Components,
    pcoll: &str,
) -> Result<bool, TranslateError> {
    let pc = components
        .pcollections
        .get(pcoll)
        .ok_or_else(|| TranslateError::missing("PCollection", pcoll, "a side input"))?;
    let strategy = windowing::convert(
        components,
        &pc.windowing_strategy_id,
        &format!("PCollection '{pcoll}'"),
    )?;
    Ok(strategy.trigger.fires_before_window_end())
}

/// Whether SDK transforms of the Go SDK read the outputs of runner node
/// `node` (a TestStream is the SDK's that consumes it: no other SDK
/// builds one for a foreign pipeline).
fn read_by_go(graph: &Graph, node: &crate::graph::Node) -> bool {
    graph
        .nodes
        .iter()
        .filter(|n| n.inputs.iter().any(|i| node.outputs.contains(i)))
        .filter_map(|n| graph.components.environments.get(&n.env))
        .any(|env| runs_sdk(env, urns::sdk_base::GO))
}

/// Whether environment `env` announces the SDK whose base-version
/// capability starts with `sdk_base` (see `urns::sdk_base`).
fn runs_sdk(env: &pb::Environment, sdk_base: &str) -> bool {
    env.capabilities.iter().any(|c| c.starts_with(sdk_base))
}
