//! Which PCollections cross stage boundaries, and the coder rewrites that
//! make their bytes readable on both sides.
//!
//! Like Python's FnApiRunner, the rewrite changes `PCollection.coder_id`
//! itself, so the producing and the consuming bundle descriptors, the data
//! ports, residuals, state keys and side-input reads all use the same coder:
//! - every boundary PCollection gets its length-prefix-safe coder;
//! - a GroupByKey's output becomes `KV<K', Iterable<V'>>` of its rewritten
//!   input `KV<K', V'>`, since the runner writes those bytes;
//! - a Flatten's inputs take the output's coder, since the runner copies
//!   bytes unchanged (Prism does the same);
//! - a stateful stage's timer family coders become `timer[K', W']` with the
//!   key coder of its rewritten main input, so key bytes in data, state and
//!   timers are identical.

use std::collections::{HashMap, HashSet};

use refract_proto::pipeline as pb;
use refract_proto::prost::Message;
use refract_proto::urns::coder as c;

use crate::error::TranslateError;
use crate::fuse::Group;
use crate::graph::{Graph, NodeKind};
use crate::payloads::decode_pardo;

/// The PCollections of the plan and the sinks of each stage.
pub(crate) struct Boundaries {
    /// Every PCollection that crosses a stage boundary, in first-use order.
    pub pcolls: Vec<String>,
    /// Per group: the PCollections it must send to the runner (SDK groups only).
    pub sinks: Vec<Vec<String>>,
}

/// Finds the boundary PCollections of fused `groups`.
pub(crate) fn boundaries(graph: &Graph, groups: &[Group]) -> Boundaries {
    let mut group_of: HashMap<usize, usize> = HashMap::new();
    for (g, group) in groups.iter().enumerate() {
        match group {
            Group::Runner(i) => {
                group_of.insert(*i, g);
            }
            Group::Sdk(s) => {
                for &i in &s.nodes {
                    group_of.insert(i, g);
                }
            }
        }
    }
    // pcoll → groups that consume it (as main or side input).
    let mut consumer_groups: HashMap<&str, HashSet<usize>> = HashMap::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let g = group_of.get(&i).copied().unwrap_or(usize::MAX);
        for input in node
            .inputs
            .iter()
            .chain(node.side_inputs.iter().map(|s| &s.pcoll))
        {
            consumer_groups.entry(input.as_str()).or_default().insert(g);
        }
    }
    let mut pcolls = Vec::new();
    let mut seen = HashSet::new();
    let mut add = |p: &String, pcolls: &mut Vec<String>| {
        if seen.insert(p.clone()) {
            pcolls.push(p.clone());
        }
    };
    let mut sinks = Vec::with_capacity(groups.len());
    for (g, group) in groups.iter().enumerate() {
        let mut group_sinks = Vec::new();
        let mut sunk: HashSet<&str> = HashSet::new();
        match group {
            Group::Runner(i) => {
                let node = &graph.nodes[*i];
                for p in node.inputs.iter().chain(&node.outputs) {
                    add(p, &mut pcolls);
                }
            }
            Group::Sdk(s) => {
                if let Some(input) = &s.input {
                    add(input, &mut pcolls);
                }
                for &i in &s.nodes {
                    for side in &graph.nodes[i].side_inputs {
                        add(&side.pcoll, &mut pcolls);
                    }
                }
                for &i in &s.nodes {
                    for out in &graph.nodes[i].outputs {
                        let outside = consumer_groups
                            .get(out.as_str())
                            .is_some_and(|gs| gs.iter().any(|&other| other != g));
                        if outside && sunk.insert(out.as_str()) {
                            group_sinks.push(out.clone());
                            add(out, &mut pcolls);
                        }
                    }
                }
            }
        }
        sinks.push(group_sinks);
    }
    Boundaries { pcolls, sinks }
}

fn set_coder(graph: &mut Graph, pcoll: &str, coder: String) -> Result<(), TranslateError> {
    let pc = graph
        .components
        .pcollections
        .get_mut(pcoll)
        .ok_or_else(|| TranslateError::missing("PCollection", pcoll, "a coder rewrite"))?;
    pc.coder_id = coder;
    Ok(())
}

/// The coder id of PCollection `pcoll`.
pub(crate) fn coder_of(graph: &Graph, pcoll: &str) -> Result<String, TranslateError> {
    graph
        .components
        .pcollections
        .get(pcoll)
        .map(|p| p.coder_id.clone())
        .ok_or_else(|| TranslateError::missing("PCollection", pcoll, "the plan"))
}

/// The (key, values) coder ids of a GroupByKey output `pcoll` whose
/// (rewritten) coder is `KV<K, iterable<V>>`, as `runner_outputs` makes
/// it: the only one a state-backed iterable can replace; `None` for any
/// other.
pub(crate) fn grouped_values(graph: &Graph, pcoll: &str) -> Option<(String, String)> {
    let coder = coder_of(graph, pcoll).ok()?;
    let kv = graph.coders.components_of(&coder, c::KV, pcoll).ok()?;
    let values = graph
        .coders
        .components_of(&kv[1], c::ITERABLE, pcoll)
        .ok()?;
    match (kv.as_slice(), values.as_slice()) {
        ([key, _], [value]) => Some((key.clone(), value.clone())),
        _ => None,
    }
}

/// The (unrewritten) window coder id of PCollection `pcoll`'s windowing strategy.
pub(crate) fn window_coder_of(graph: &Graph, pcoll: &str) -> Result<String, TranslateError> {
    strategy_of(graph, pcoll).map(|ws| ws.window_coder_id.clone())
}

/// The windowing strategy of PCollection `pcoll`.
pub(crate) fn strategy_of<'g>(
    graph: &'g Graph,
    pcoll: &str,
) -> Result<&'g pb::WindowingStrategy, TranslateError> {
    let pc = graph
        .components
        .pcollections
        .get(pcoll)
        .ok_or_else(|| TranslateError::missing("PCollection", pcoll, "the plan"))?;
    graph
        .components
        .windowing_strategies
        .get(&pc.windowing_strategy_id)
        .ok_or_else(|| {
            TranslateError::missing(
                "windowing strategy",
                &pc.windowing_strategy_id,
                format!("PCollection '{pcoll}'"),
            )
        })
}

/// Rewrites the coders of boundary PCollections, runner-produced
/// PCollections and timer families (see the module docs).
pub(crate) fn rewrite(
    graph: &mut Graph,
    groups: &[Group],
    bounds: &Boundaries,
) -> Result<(), TranslateError> {
    for pcoll in &bounds.pcolls {
        let coder = coder_of(graph, pcoll)?;
        let safe = graph
            .coders
            .safe(&coder, &format!("PCollection '{pcoll}'"))?;
        set_coder(graph, pcoll, safe)?;
    }
    runner_outputs(graph)?;
    for group in groups {
        if let Group::Sdk(s) = group {
            if let (Some(&root), Some(input)) = (s.nodes.first(), &s.input) {
                if graph.nodes[root].stateful {
                    timer_coders(graph, root, input)?;
                }
            }
        }
    }
    Ok(())
}

/// Makes GroupByKey outputs and Flatten inputs consistent with what the
/// runner reads and writes, in topological order.
fn runner_outputs(graph: &mut Graph) -> Result<(), TranslateError> {
    // PCollections whose coder can no longer change.
    let mut fixed: HashSet<String> = HashSet::new();
    for i in 0..graph.nodes.len() {
        let node = graph.nodes[i].clone();
        let location = format!("transform '{}'", node.name);
        match node.kind {
            NodeKind::Sdk => {}
            NodeKind::Impulse => fixed.extend(node.outputs.iter().cloned()),
            NodeKind::TestStream => {
                // The scripted elements are encoded with the payload's coder,
                // which need not be the output PCollection's: consumers must
                // decode what the runner replays.
                let payload = crate::test_stream::payload(&node)?;
                let safe = graph.coders.safe(&payload.coder_id, &location)?;
                for output in &node.outputs {
                    set_coder(graph, output, safe.clone())?;
                }
                fixed.extend(node.outputs.iter().cloned());
            }
            NodeKind::GroupByKey => {
                let (Some(input), Some(output)) = (node.inputs.first(), node.outputs.first())
                else {
                    continue;
                };
                let in_coder = coder_of(graph, input)?;
                let kv = graph.coders.components_of(
                    &in_coder,
                    c::KV,
                    &format!("the input of GroupByKey {location}"),
                )?;
                let values = graph.coders.add(
                    &format!("{}_iterable", kv[1]),
                    c::ITERABLE,
                    vec![kv[1].clone()],
                );
                let grouped = graph.coders.add(
                    &format!("{in_coder}_grouped"),
                    c::KV,
                    vec![kv[0].clone(), values],
                );
                set_coder(graph, output, grouped)?;
                fixed.insert(input.clone());
                fixed.insert(output.clone());
            }
            NodeKind::Flatten => {
                let Some(output) = node.outputs.first() else {
                    continue;
                };
                let mut chosen: Option<(String, String)> = None; // (pcoll, coder)
                for input in node.inputs.iter().filter(|p| fixed.contains(*p)) {
                    let coder = coder_of(graph, input)?;
                    match &chosen {
                        None => chosen = Some((input.clone(), coder)),
                        Some((first, existing)) if *existing != coder => {
                            return Err(TranslateError::unsupported(
                                format!(
                                    "flattening PCollections '{first}' and '{input}', which the \
                                     runner must keep in different coders ('{existing}' and '{coder}')"
                                ),
                                location,
                            ));
                        }
                        Some(_) => {}
                    }
                }
                let coder = match chosen {
                    Some((_, coder)) => coder,
                    None => coder_of(graph, output)?,
                };
                set_coder(graph, output, coder.clone())?;
                for input in &node.inputs {
                    if !fixed.contains(input) {
                        set_coder(graph, input, coder.clone())?;
                        fixed.insert(input.clone());
                    }
                }
                fixed.insert(output.clone());
            }
        }
    }
    Ok(())
}

/// Points every timer family of stateful node `root` at `timer[K', W']`.
fn timer_coders(graph: &mut Graph, root: usize, input: &str) -> Result<(), TranslateError> {
    let name = graph.nodes[root].name.clone();
    let location = format!("the main input of stateful transform '{name}'");
    let in_coder = coder_of(graph, input)?;
    let kv = graph.coders.components_of(&in_coder, c::KV, &location)?;
    let window = window_coder_of(graph, input)?;
    let window = graph.coders.safe_window(&window, &location)?;
    let mut payload = decode_pardo(&graph.nodes[root].transform, &name)?;
    if payload.timer_family_specs.is_empty() {
        return Ok(());
    }
    let timer = graph.coders.add(
        &format!("{}_timer", kv[0]),
        c::TIMER,
        vec![kv[0].clone(), window],
    );
    if payload
        .timer_family_specs
        .values()
        .all(|spec| spec.timer_family_coder_id == timer)
    {
        // Keep the SDK's payload bytes when nothing changes.
        return Ok(());
    }
    for spec in payload.timer_family_specs.values_mut() {
        spec.timer_family_coder_id = timer.clone();
    }
    let spec = graph.nodes[root]
        .transform
        .spec
        .get_or_insert_with(pb::FunctionSpec::default);
    spec.payload = payload.encode_to_vec();
    Ok(())
}
