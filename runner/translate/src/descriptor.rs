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
use crate::graph::{Graph, Node};
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
    let mut parts = StageParts::collect(graph, group)?;
    parts.set_root_facts(graph, group);
    let ports = PortSettings {
        endpoint: &endpoint,
        state_backed,
    };
    let DataPorts {
        input: input_transform_id,
        outputs,
    } = parts.add_ports(
        graph,
        &ports,
        group.input.as_deref(),
        sinks,
        pcoll_index,
        &location,
    )?;
    let referenced =
        Referenced::collect(graph, &parts.transforms, &mut parts.coder_roots, &location)?;
    let coders = graph.coders.closure(&parts.coder_roots, &location)?;

    let StageParts {
        transforms,
        uses_timers,
        stage,
        timer_ids,
        side_inputs,
        synthetic_names,
        ..
    } = parts;
    let descriptor = fn_api::ProcessBundleDescriptor {
        id,
        transforms,
        pcollections: referenced.pcollections,
        windowing_strategies: referenced.windowing_strategies,
        coders,
        environments: referenced.environments,
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

/// What a stage's transforms contribute to its descriptor and to the
/// engine's facts, gathered as the descriptor is built: the leaf
/// transforms and data ports under their ids, the coders they need, and
/// the stage's timer families, side inputs and root facts.
struct StageParts {
    /// Transforms of the descriptor, leaf transforms and data ports, by id.
    transforms: HashMap<String, pb::PTransform>,
    /// Coders the descriptor must hold (closed over their components later).
    coder_roots: BTreeSet<String>,
    /// Whether any transform has a timer family (then the timer API is set).
    uses_timers: bool,
    /// Engine facts (state, timers, splitting).
    stage: SdkStage,
    /// (transform id, timer family id) of every timer family, in order.
    timer_ids: Vec<(String, String)>,
    /// Side inputs, with PCollection ids still to be mapped to plan indices.
    side_inputs: Vec<(TransformId, String, String, SideInputAccess)>,
    /// The interned id of the stage's first transform.
    root_id: Option<TransformId>,
    /// Data source and sink ids → their unique names.
    synthetic_names: Vec<(String, String)>,
}

impl StageParts {
    /// One pass over the group's nodes, in order: their transforms, the
    /// coders their payloads name, their timer families and side inputs.
    /// Each transform's id is interned once: its timer families, side
    /// inputs and window expiration share it.
    fn collect(graph: &Graph, group: &SdkGroup) -> Result<StageParts, TranslateError> {
        let mut parts = StageParts {
            transforms: HashMap::new(),
            coder_roots: BTreeSet::new(),
            uses_timers: false,
            stage: SdkStage::default(),
            timer_ids: Vec::new(),
            side_inputs: Vec::new(),
            root_id: None,
            synthetic_names: Vec::new(),
        };
        for &i in &group.nodes {
            let node = &graph.nodes[i];
            let transform_id = TransformId::new(&node.id);
            parts.root_id.get_or_insert_with(|| transform_id.clone());
            let urn = node.transform.spec.as_ref().map_or("", |s| s.urn.as_str());
            if PARDO_LIKE.contains(&urn) {
                parts.add_pardo(graph, node, &transform_id)?;
            } else if COMBINE_STEPS.contains(&urn) {
                parts
                    .coder_roots
                    .insert(decode_combine(&node.transform, &node.name)?.accumulator_coder_id);
            }
            for side in &node.side_inputs {
                parts.side_inputs.push((
                    transform_id.clone(),
                    side.tag.clone(),
                    side.pcoll.clone(),
                    side.access,
                ));
            }
            parts.stage.requires_finalization |= node.finalization;
            parts
                .transforms
                .insert(node.id.clone(), node.transform.clone());
        }
        Ok(parts)
    }

    /// A ParDo-like node's restriction and state coders, and its timer
    /// families (sorted by id, so the engine's order is stable), each with
    /// the key and window coders the engine fires it with.
    fn add_pardo(
        &mut self,
        graph: &Graph,
        node: &Node,
        transform_id: &TransformId,
    ) -> Result<(), TranslateError> {
        let payload = decode_pardo(&node.transform, &node.name)?;
        if !payload.restriction_coder_id.is_empty() {
            self.coder_roots
                .insert(payload.restriction_coder_id.clone());
        }
        for spec in payload.state_specs.values() {
            if let Some(kind) = &spec.spec {
                self.coder_roots
                    .extend(state_coders(kind).into_iter().cloned());
            }
        }
        let mut families: Vec<(&String, &pb::TimerFamilySpec)> =
            payload.timer_family_specs.iter().collect();
        families.sort_by(|a, b| a.0.cmp(b.0));
        for (family, spec) in families {
            self.uses_timers = true;
            let (key, window) = timer_parts(graph, &spec.timer_family_coder_id, &node.name)?;
            self.coder_roots.insert(spec.timer_family_coder_id.clone());
            self.stage.timer_families.push(TimerFamily {
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
            self.timer_ids.push((node.id.clone(), family.clone()));
        }
        Ok(())
    }

    /// The stage's facts that come from its first transform. Only the first
    /// transform of a stage may be stateful or splittable: keyed routing and
    /// splits happen at the stage's input.
    fn set_root_facts(&mut self, graph: &Graph, group: &SdkGroup) {
        let Some(&root) = group.nodes.first() else {
            return;
        };
        let root = &graph.nodes[root];
        let stage = &mut self.stage;
        stage.stateful = root.stateful;
        stage.splittable = root.splittable;
        stage.stable_input = root.stable_input;
        if root.stateful {
            stage.window_expiration =
                root.window_expiration_family
                    .as_ref()
                    .map(|family_id| WindowExpiration {
                        transform_id: self
                            .root_id
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

    /// The stage's data ports: a source for its main `input`, if any, then a
    /// sink for each of `sinks` paired with its engine index. Returns the
    /// source's transform id and the sinks'.
    fn add_ports(
        &mut self,
        graph: &mut Graph,
        ports: &PortSettings,
        input: Option<&str>,
        sinks: &[String],
        pcoll_index: &HashMap<String, PCollectionIdx>,
        location: &str,
    ) -> Result<DataPorts, TranslateError> {
        let input_transform_id = match input {
            Some(pcoll) => Some(self.add_port(graph, ports, pcoll, true)?),
            None => None,
        };
        let mut outputs = Vec::with_capacity(sinks.len());
        for pcoll in sinks {
            let sink = self.add_port(graph, ports, pcoll, false)?;
            let idx = *pcoll_index
                .get(pcoll)
                .ok_or_else(|| TranslateError::missing("PCollection", pcoll, location))?;
            outputs.push((sink, idx));
        }
        Ok(DataPorts {
            input: input_transform_id,
            outputs,
        })
    }

    /// Adds a data source (`source`) or sink transform for `pcoll`, under an
    /// id unused in the stage and the pipeline, with an explicit
    /// `windowed_value[element, window]` port coder. Returns its id.
    fn add_port(
        &mut self,
        graph: &mut Graph,
        ports: &PortSettings,
        pcoll: &str,
        source: bool,
    ) -> Result<String, TranslateError> {
        let mut elem = coder_of(graph, pcoll)?;
        if source && ports.state_backed.contains(pcoll) {
            elem = state_backed_grouped(graph, pcoll)?;
        }
        let window = window_coder_of(graph, pcoll)?;
        let window = graph
            .coders
            .safe_window(&window, &format!("PCollection '{pcoll}'"))?;
        let port_coder = graph.coders.windowed(&elem, &window);
        self.coder_roots.insert(port_coder.clone());
        let base = format!("{pcoll}/{}", if source { "Source" } else { "Sink" });
        let port_id = unique_id(&base, |c| {
            self.transforms.contains_key(c) || graph.components.transforms.contains_key(c)
        });
        let port = fn_api::RemoteGrpcPort {
            api_service_descriptor: Some(ports.endpoint.clone()),
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
        self.transforms.insert(
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
        self.synthetic_names
            .push((port_id.clone(), port_id.clone()));
        Ok(port_id)
    }
}

/// The transform ids of a stage's data ports.
struct DataPorts {
    /// The data source of the stage's main input, if any.
    input: Option<String>,
    /// Each data sink, with the plan index of the PCollection it sends.
    outputs: Vec<(String, PCollectionIdx)>,
}

/// Where a stage's data ports point and how their coders are chosen.
struct PortSettings<'a> {
    /// The runner's Fn API endpoint, named by every port.
    endpoint: &'a pb::ApiServiceDescriptor,
    /// Main inputs read through a state-backed iterable coder.
    state_backed: &'a HashSet<String>,
}

/// The components a descriptor's transforms refer to, besides coders.
struct Referenced {
    /// Every PCollection a transform reads or writes.
    pcollections: HashMap<String, pb::PCollection>,
    /// Their windowing strategies.
    windowing_strategies: HashMap<String, pb::WindowingStrategy>,
    /// The environments of the transforms and windowing strategies.
    environments: HashMap<String, pb::Environment>,
}

impl Referenced {
    /// Looks up what `transforms` refer to, adding the PCollections' element
    /// and window coders to `coder_roots`.
    fn collect(
        graph: &Graph,
        transforms: &HashMap<String, pb::PTransform>,
        coder_roots: &mut BTreeSet<String>,
        location: &str,
    ) -> Result<Referenced, TranslateError> {
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
                let pc = graph
                    .components
                    .pcollections
                    .get(pcoll)
                    .ok_or_else(|| TranslateError::missing("PCollection", pcoll, location))?;
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
                .ok_or_else(|| TranslateError::missing("environment", &env, location))?;
            environments.insert(env, environment.clone());
        }
        Ok(Referenced {
            pcollections,
            windowing_strategies,
            environments,
        })
    }
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
