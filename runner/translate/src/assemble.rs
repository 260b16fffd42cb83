//! Puts the pieces together: fused groups become the engine's stages and
//! PCollections, and SDK groups get their bundle descriptors.

use std::collections::{HashMap, HashSet};

use refract_engine::plan::{
    ClosingBehavior, FinishedTrigger, PCollection, PCollectionIdx, Plan, SideInput, SideInputId,
    Stage, StageIdx, StageKind, TransformId, WindowingStrategy,
};
use refract_proto::pipeline as pb;
use refract_proto::prost::Message;
use refract_proto::urns;

use crate::error::TranslateError;
use crate::fuse::{self, Group, SdkGroup};
use crate::graph::{Graph, Node, NodeKind};
use crate::limits::{count_descriptor_bytes, Limits};
use crate::rewrite::{self, grouped_values, window_coder_of};
use crate::{
    descriptor, merge, test_stream, windowing, SdkStageDescriptor, TranslateOptions, Translated,
    WindowMerger,
};

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
    let index = plan_pcollections(&mut graph, &bounds.pcolls, &mut plan)?;
    let python_only = !graph.components.environments.is_empty()
        && graph
            .components
            .environments
            .values()
            .all(|env| runs_sdk(env, urns::sdk_base::PYTHON));
    let state_backed = state_backed_outputs(&graph, &groups);
    let mut builder = PlanBuilder {
        graph,
        opts,
        limits,
        plan,
        index,
        python_only,
        state_backed,
        descriptor_bytes: 0,
        sdk_stages: HashMap::new(),
        window_mergers: HashMap::new(),
    };
    for (g, group) in groups.iter().enumerate() {
        // Groups become stages in order: group `g` is stage `g`.
        let stage_idx = StageIdx::new(g);
        let stage = match group {
            Group::Runner(i) => builder.runner_stage(*i, stage_idx)?,
            Group::Sdk(s) => {
                let sinks = bounds.sinks.get(g).map(Vec::as_slice).unwrap_or_default();
                builder.sdk_stage(s, sinks, stage_idx)?
            }
        };
        let heads = builder.stage_heads(group);
        builder.plan.stages.push(stage);
        builder.plan.names.stage_heads.push(heads);
    }
    Ok(builder.finish())
}

/// Adds the engine's PCollection for each of the boundary PCollections
/// `pcolls` to `plan`, in order, with its engine value and window coders.
/// Returns each one's index in the plan.
fn plan_pcollections(
    graph: &mut Graph,
    pcolls: &[String],
    plan: &mut Plan,
) -> Result<HashMap<String, PCollectionIdx>, TranslateError> {
    let mut index: HashMap<String, PCollectionIdx> = HashMap::new();
    for pcoll in pcolls {
        let referrer = format!("PCollection '{pcoll}'");
        let pc = graph
            .components
            .pcollections
            .get(pcoll)
            .ok_or_else(|| TranslateError::missing("PCollection", pcoll, "the plan"))?;
        let value_coder = graph.coders.engine(&pc.coder_id, &referrer)?;
        let bounded = pc.is_bounded != pb::is_bounded::Enum::Unbounded as i32;
        let window = window_coder_of(graph, pcoll)?;
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
    Ok(index)
}

/// The plan index of boundary PCollection `pcoll`.
fn plan_index(
    index: &HashMap<String, PCollectionIdx>,
    pcoll: &str,
) -> Result<PCollectionIdx, TranslateError> {
    index
        .get(pcoll)
        .copied()
        .ok_or_else(|| TranslateError::missing("PCollection", pcoll, "the plan"))
}

/// The plan indices of boundary PCollections `pcolls`, in order.
fn plan_indices(
    index: &HashMap<String, PCollectionIdx>,
    pcolls: &[String],
) -> Result<Vec<PCollectionIdx>, TranslateError> {
    pcolls.iter().map(|p| plan_index(index, p)).collect()
}

/// The plan and descriptors as the fused groups become stages, one after
/// another, with what building a stage needs from the earlier ones.
struct PlanBuilder<'a> {
    /// The rewritten pipeline (descriptors add coders and unique names).
    graph: Graph,
    /// Translation options.
    opts: &'a TranslateOptions,
    /// Size limits (the descriptors' total bytes).
    limits: &'a Limits,
    /// The plan: all its PCollections, and the stages built so far.
    plan: Plan,
    /// Boundary PCollection id → its index in the plan.
    index: HashMap<String, PCollectionIdx>,
    /// Whether every environment runs the Python SDK.
    python_only: bool,
    /// GroupByKey outputs read through a state-backed iterable coder.
    state_backed: HashSet<String>,
    /// The encoded size of the descriptors built so far.
    descriptor_bytes: usize,
    /// The descriptors of the SDK stages built so far.
    sdk_stages: HashMap<StageIdx, SdkStageDescriptor>,
    /// The window mergers of the GroupByKey stages built so far.
    window_mergers: HashMap<StageIdx, WindowMerger>,
}

impl PlanBuilder<'_> {
    /// The unique names of the transforms reading `group`'s main input,
    /// sorted (see `PipelineNames::stage_heads`); records the unique name
    /// of each of its SDK transforms by id.
    fn stage_heads(&mut self, group: &Group) -> Vec<String> {
        let mut heads: Vec<String> = match group {
            Group::Runner(i) => vec![self.graph.nodes[*i].name.clone()],
            Group::Sdk(s) => {
                for &n in &s.nodes {
                    let node = &self.graph.nodes[n];
                    self.plan
                        .names
                        .transforms
                        .insert(TransformId::new(&node.id), node.name.clone());
                }
                s.nodes
                    .iter()
                    .map(|&n| &self.graph.nodes[n])
                    .filter(|node| s.input.as_ref().is_some_and(|i| node.inputs.contains(i)))
                    .map(|node| node.name.clone())
                    .collect()
            }
        };
        heads.sort();
        heads.dedup();
        heads
    }

    /// The stage of runner-executed node `i` (plan stage `stage_idx`).
    fn runner_stage(&mut self, i: usize, stage_idx: StageIdx) -> Result<Stage, TranslateError> {
        let node = self.graph.nodes[i].clone();
        let kind = match node.kind {
            NodeKind::Impulse => StageKind::Impulse,
            NodeKind::TestStream => StageKind::TestStream(test_stream::events(
                &node,
                &self.plan,
                &self.index,
                &self.graph.coders,
                read_by_go(&self.graph, &node),
            )?),
            NodeKind::Flatten => StageKind::Flatten,
            NodeKind::GroupByKey => StageKind::GroupByKey(self.group_by_key(&node, stage_idx)?),
            NodeKind::Sdk => {
                return Err(TranslateError::Invalid(format!(
                    "SDK transform '{}' was not fused into a stage",
                    node.name
                )))
            }
        };
        Ok(Stage {
            name: node.name.clone(),
            kind,
            inputs: plan_indices(&self.index, &node.inputs)?,
            side_inputs: Vec::new(),
            outputs: plan_indices(&self.index, &node.outputs)?,
        })
    }

    /// The windowing strategy GroupByKey `node` groups by (its input's),
    /// adjusted for Python-only pipelines; registers the stage's window
    /// merger if its windows are merged by an SDK.
    fn group_by_key(
        &mut self,
        node: &Node,
        stage_idx: StageIdx,
    ) -> Result<WindowingStrategy, TranslateError> {
        let input = node.inputs.first().ok_or_else(|| {
            TranslateError::Invalid(format!("GroupByKey '{}' has no input", node.name))
        })?;
        let pc = self
            .graph
            .components
            .pcollections
            .get(input)
            .ok_or_else(|| {
                TranslateError::missing("PCollection", input, format!("transform '{}'", node.name))
            })?;
        let mut strategy = windowing::convert(
            &self.graph.components,
            &pc.windowing_strategy_id,
            &format!("PCollection '{input}'"),
        )?;
        if self.python_only {
            // The Python SDK writes EMIT_ALWAYS into every windowing
            // strategy, but its own runners never emit an empty closing
            // pane; users expect those results.
            strategy.closing_behavior = ClosingBehavior::EmitIfNonEmpty;
            // Python's suite for local runners expects Prism's rule for
            // data after a finished trigger (see `FinishedTrigger`); Go's
            // and Java's expect Beam's.
            strategy.finished_trigger = FinishedTrigger::Restarts;
        }
        if let Some(m) = merge::window_merger(&mut self.graph, node, stage_idx, self.opts)? {
            self.window_mergers.insert(stage_idx, m);
        }
        Ok(strategy)
    }

    /// The stage of SDK group `s` (plan stage `stage_idx`), which sends
    /// `sinks` to the runner; builds its descriptor, counts its bytes
    /// against the limit and records it.
    fn sdk_stage(
        &mut self,
        s: &SdkGroup,
        sinks: &[String],
        stage_idx: StageIdx,
    ) -> Result<Stage, TranslateError> {
        let built = descriptor::build(
            &mut self.graph,
            s,
            stage_idx,
            sinks,
            &self.index,
            &self.state_backed,
            self.opts,
        )?;
        count_descriptor_bytes(
            &mut self.descriptor_bytes,
            built.descriptor.descriptor.encoded_len(),
            self.limits,
        )?;
        let name = s
            .nodes
            .iter()
            .map(|&i| self.graph.nodes[i].name.as_str())
            .collect::<Vec<_>>()
            .join(&refract_engine::plan::FUSED_NAME_SEPARATOR.to_string());
        let side_inputs = built
            .side_inputs
            .into_iter()
            .map(|(transform_id, tag, pcoll, access)| {
                let fires_early = side_input_fires_early(&self.graph.components, &pcoll)?;
                Ok(SideInput {
                    id: SideInputId::new(transform_id, tag),
                    pcollection: plan_index(&self.index, &pcoll)?,
                    access,
                    fires_early,
                })
            })
            .collect::<Result<_, TranslateError>>()?;
        let inputs = match &s.input {
            Some(p) => vec![plan_index(&self.index, p)?],
            None => Vec::new(),
        };
        let outputs = built
            .descriptor
            .outputs
            .iter()
            .map(|(_, idx)| *idx)
            .collect();
        self.graph.unique_names.extend(built.synthetic_names);
        self.sdk_stages.insert(stage_idx, built.descriptor);
        Ok(Stage {
            name,
            kind: StageKind::Sdk(built.stage),
            inputs,
            side_inputs,
            outputs,
        })
    }

    /// The translation, once every stage is in the plan.
    fn finish(self) -> Translated {
        tracing::debug!(
            stages = self.plan.stages.len(),
            sdk_stages = self.sdk_stages.len(),
            pcollections = self.plan.pcollections.len(),
            streaming = self.opts.streaming,
            "translated pipeline"
        );
        let mut state_backed_outputs: Vec<PCollectionIdx> = self
            .state_backed
            .iter()
            .filter_map(|p| self.index.get(p).copied())
            .collect();
        state_backed_outputs.sort_unstable();
        Translated {
            state_backed_outputs,
            plan: self.plan,
            sdk_stages: self.sdk_stages,
            window_mergers: self.window_mergers,
            unique_names: self.graph.unique_names,
            environments: self.graph.components.environments,
        }
    }
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
fn read_by_go(graph: &Graph, node: &Node) -> bool {
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
