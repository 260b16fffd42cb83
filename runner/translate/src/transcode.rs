//! Flatten inputs whose coder differs from the output's.
//!
//! The runner executes Flatten by copying bytes, so every input must be
//! encoded the way the output's consumers will decode it. When an input's
//! coder differs (Python's `(kvs, strings) | Flatten()` gives the output a
//! general-purpose coder), a one-input `beam:transform:flatten:v1` is added
//! in the SDK between the producer and the Flatten: the SDK decodes with
//! the input's coder and re-encodes with the output's. Coders that differ
//! only in their ids are not transcoded: translation gives such inputs the
//! output's coder instead. Every SDK harness
//! implements Flatten, so this works for Python and Java alike. The
//! original PCollection keeps its coder for its other consumers.

use std::collections::HashMap;

use refract_proto::pipeline as pb;
use refract_proto::urns::transform as t;

use crate::coders::unique_id;
use crate::graph::{sorted_by_tag, Graph, Node, NodeKind, RootTransform};

/// TestStream elements are encoded with the TestStream payload's coder,
/// which may differ from its output PCollection's coder (Python's untyped
/// TestStream uses a general-purpose coder while its consumers expect, for
/// instance, a KV). Where they differ, the TestStream writes a new
/// PCollection in its own coder and an SDK step transcodes it into the
/// original one, as for Flatten.
pub(crate) fn test_stream_outputs(graph: &mut Graph) {
    let nodes = std::mem::take(&mut graph.nodes);
    let mut out = Vec::with_capacity(nodes.len());
    for mut node in nodes {
        if node.kind != NodeKind::TestStream {
            out.push(node);
            continue;
        }
        let inserted = transcode_test_stream(graph, &mut node);
        out.push(node);
        out.extend(inserted);
    }
    graph.nodes = out;
}

/// The transcoding steps TestStream `ts` needs (pointing it at their
/// inputs), to follow it in the graph.
fn transcode_test_stream(graph: &mut Graph, ts: &mut Node) -> Vec<Node> {
    let node = ts.clone();
    let Ok(payload) = crate::test_stream::payload(&node) else {
        return Vec::new();
    };
    let env = if node.transform.environment_id.is_empty() {
        graph.components.environments.keys().min().cloned()
    } else {
        Some(node.transform.environment_id.clone())
    };
    let Some(env) = env else {
        return Vec::new();
    };
    let mut inserted = Vec::new();
    for (tag, output) in sorted_by_tag(&node.transform.outputs) {
        let same = coder_id(graph, &output)
            .is_none_or(|c| graph.coders.same_encoding(&c, &payload.coder_id));
        if same {
            continue;
        }
        let Some(template) = graph.components.pcollections.get(&output).cloned() else {
            continue;
        };
        let raw = unique_id(&format!("{output}/raw"), |id| {
            graph.components.pcollections.contains_key(id)
        });
        graph.components.pcollections.insert(
            raw.clone(),
            pb::PCollection {
                unique_name: raw.clone(),
                coder_id: payload.coder_id.clone(),
                ..template
            },
        );
        inserted.push(transcoder(
            graph,
            (&node.id, &node.name, node.root, &tag),
            &raw,
            &output,
            &env,
        ));
        ts.transform.outputs.insert(tag.clone(), raw.clone());
        for o in ts.outputs.iter_mut() {
            if *o == output {
                *o = raw.clone();
            }
        }
    }
    inserted
}

/// Insert transcoding steps before Flatten nodes where coders differ.
pub(crate) fn flatten_inputs(graph: &mut Graph) {
    let producers = sdk_producers(&graph.nodes);
    let nodes = std::mem::take(&mut graph.nodes);
    let mut out = Vec::with_capacity(nodes.len());
    for mut node in nodes {
        if node.kind == NodeKind::Flatten {
            out.extend(transcode_flatten(graph, &producers, &mut node));
        }
        out.push(node);
    }
    graph.nodes = out;
}

/// The transcoding steps Flatten `node` needs (pointing it at their
/// outputs), to precede it in the graph.
fn transcode_flatten(
    graph: &mut Graph,
    producers: &HashMap<String, (usize, String)>,
    node: &mut Node,
) -> Vec<Node> {
    let flatten = node.clone();
    let Some(output) = flatten.outputs.first() else {
        return Vec::new();
    };
    let Some(out_coder) = coder_id(graph, output) else {
        return Vec::new();
    };
    let env = match flatten.transform.environment_id.as_str() {
        "" => flatten
            .inputs
            .iter()
            .filter_map(|input| producers.get(input))
            .min_by_key(|(order, _)| *order)
            .map(|(_, env)| env.clone()),
        env => Some(env.to_string()),
    };
    let Some(env) = env else {
        return Vec::new();
    };
    let mut inserted = Vec::new();
    let mut new_inputs = flatten.inputs.clone();
    let mut done: std::collections::HashMap<String, String> = Default::default();
    for (n, input) in flatten.inputs.iter().enumerate() {
        if let Some(transcoded) = done.get(input) {
            // The same PCollection listed twice is transcoded once.
            new_inputs[n] = transcoded.clone();
            continue;
        }
        let same =
            coder_id(graph, input).is_none_or(|c| graph.coders.same_encoding(&c, &out_coder));
        if same {
            continue;
        }
        let Some(template) = graph.components.pcollections.get(input).cloned() else {
            continue;
        };
        let pcoll_id = unique_id(&format!("{}/Transcode/{n}/out", flatten.id), |id| {
            graph.components.pcollections.contains_key(id)
        });
        graph.components.pcollections.insert(
            pcoll_id.clone(),
            pb::PCollection {
                unique_name: pcoll_id.clone(),
                coder_id: out_coder.clone(),
                ..template
            },
        );
        inserted.push(transcoder(
            graph,
            (&flatten.id, &flatten.name, flatten.root, &n.to_string()),
            input,
            &pcoll_id,
            &env,
        ));
        done.insert(input.clone(), pcoll_id.clone());
        new_inputs[n] = pcoll_id;
    }
    if inserted.is_empty() {
        return inserted;
    }
    // Point the Flatten (node and proto) at the transcoded PCollections.
    let tagged = sorted_by_tag(&node.transform.inputs);
    for ((tag, _), new) in tagged.iter().zip(new_inputs.iter()) {
        node.transform.inputs.insert(tag.clone(), new.clone());
    }
    node.inputs = new_inputs;
    inserted
}

/// An SDK step that decodes `input` with its coder and writes `output`
/// in its own: a one-input `beam:transform:flatten:v1` in `env`, named
/// `<name>/Transcode/<tag>` after the transform (`id`, `name`, under
/// `root`) it serves.
fn transcoder(
    graph: &mut Graph,
    (id, name, root, tag): (&str, &str, RootTransform, &str),
    input: &str,
    output: &str,
    env: &str,
) -> Node {
    let transform_id = unique_id(&format!("{id}/Transcode/{tag}"), |id| {
        graph.components.transforms.contains_key(id) || graph.unique_names.contains_key(id)
    });
    let name = format!("{name}/Transcode/{tag}");
    graph
        .unique_names
        .insert(transform_id.clone(), name.clone());
    let transform = pb::PTransform {
        unique_name: name.clone(),
        spec: Some(pb::FunctionSpec {
            urn: t::FLATTEN.to_string(),
            payload: Vec::new(),
        }),
        inputs: [("0".to_string(), input.to_string())].into_iter().collect(),
        outputs: [("out".to_string(), output.to_string())]
            .into_iter()
            .collect(),
        environment_id: env.to_string(),
        ..Default::default()
    };
    Node {
        env: env.to_string(),
        root,
        ..Node::runner(&transform_id, &name, NodeKind::Sdk, transform)
    }
}

fn coder_id(graph: &Graph, pcoll: &str) -> Option<String> {
    graph
        .components
        .pcollections
        .get(pcoll)
        .map(|p| p.coder_id.clone())
}

/// For each PCollection an SDK node produces: that node's position and
/// environment. A Flatten without an environment transcodes in the
/// environment of the first SDK node producing one of its inputs.
fn sdk_producers(nodes: &[Node]) -> HashMap<String, (usize, String)> {
    let mut producers = HashMap::new();
    for (order, n) in nodes.iter().enumerate() {
        if n.kind != NodeKind::Sdk || n.env.is_empty() {
            continue;
        }
        for output in &n.outputs {
            producers
                .entry(output.clone())
                .or_insert_with(|| (order, n.env.clone()));
        }
    }
    producers
}
