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

use refract_proto::pipeline as pb;
use refract_proto::urns::transform as t;

use crate::coders::unique_id;
use crate::graph::{sorted_by_tag, Graph, Node, NodeKind};

/// TestStream elements are encoded with the TestStream payload's coder,
/// which may differ from its output PCollection's coder (Python's untyped
/// TestStream uses a general-purpose coder while its consumers expect, for
/// instance, a KV). Where they differ, the TestStream writes a new
/// PCollection in its own coder and an SDK step transcodes it into the
/// original one, as for Flatten.
pub(crate) fn test_stream_outputs(graph: &mut Graph) {
    let mut i = 0;
    while i < graph.nodes.len() {
        if graph.nodes[i].kind != NodeKind::TestStream {
            i += 1;
            continue;
        }
        let node = graph.nodes[i].clone();
        let Ok(payload) = crate::test_stream::payload(&node) else {
            i += 1;
            continue;
        };
        let env = if node.transform.environment_id.is_empty() {
            graph.components.environments.keys().min().cloned()
        } else {
            Some(node.transform.environment_id.clone())
        };
        let Some(env) = env else {
            i += 1;
            continue;
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
            let base = format!("{}/Transcode/{tag}", node.id);
            let transform_id = unique_id(&base, |id| {
                graph.components.transforms.contains_key(id) || graph.unique_names.contains_key(id)
            });
            let name = format!("{}/Transcode/{tag}", node.name);
            graph
                .unique_names
                .insert(transform_id.clone(), name.clone());
            inserted.push(Node {
                id: transform_id,
                name: name.clone(),
                kind: NodeKind::Sdk,
                inputs: vec![raw.clone()],
                side_inputs: Vec::new(),
                outputs: vec![output.clone()],
                env: env.clone(),
                stateful: false,
                splittable: false,
                finalization: false,
                window_expiration_family: None,
                time_sorted_input: false,
                stable_input: false,
                transform: pb::PTransform {
                    unique_name: name,
                    spec: Some(pb::FunctionSpec {
                        urn: t::FLATTEN.to_string(),
                        payload: Vec::new(),
                    }),
                    inputs: [("0".to_string(), raw.clone())].into_iter().collect(),
                    outputs: [("out".to_string(), output.clone())].into_iter().collect(),
                    environment_id: env.clone(),
                    ..Default::default()
                },
            });
            let ts = &mut graph.nodes[i];
            ts.transform.outputs.insert(tag.clone(), raw.clone());
            for o in ts.outputs.iter_mut() {
                if *o == output {
                    *o = raw.clone();
                }
            }
        }
        let count = inserted.len();
        for (k, n) in inserted.into_iter().enumerate() {
            graph.nodes.insert(i + 1 + k, n);
        }
        i += count + 1;
    }
}

/// Insert transcoding steps before Flatten nodes where coders differ.
pub(crate) fn flatten_inputs(graph: &mut Graph) {
    let mut i = 0;
    while i < graph.nodes.len() {
        if graph.nodes[i].kind != NodeKind::Flatten {
            i += 1;
            continue;
        }
        let flatten = graph.nodes[i].clone();
        let Some(output) = flatten.outputs.first() else {
            i += 1;
            continue;
        };
        let Some(out_coder) = coder_id(graph, output) else {
            i += 1;
            continue;
        };
        let env = match flatten.transform.environment_id.as_str() {
            "" => producer_env(graph, &flatten.inputs),
            env => Some(env.to_string()),
        };
        let Some(env) = env else {
            i += 1;
            continue;
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
            let base = format!("{}/Transcode/{n}", flatten.id);
            let pcoll_id = unique_id(&format!("{base}/out"), |id| {
                graph.components.pcollections.contains_key(id)
            });
            let transform_id = unique_id(&base, |id| {
                graph.components.transforms.contains_key(id) || graph.unique_names.contains_key(id)
            });
            let name = format!("{}/Transcode/{n}", flatten.name);
            graph.components.pcollections.insert(
                pcoll_id.clone(),
                pb::PCollection {
                    unique_name: pcoll_id.clone(),
                    coder_id: out_coder.clone(),
                    ..template
                },
            );
            let transform = pb::PTransform {
                unique_name: name.clone(),
                spec: Some(pb::FunctionSpec {
                    urn: t::FLATTEN.to_string(),
                    payload: Vec::new(),
                }),
                inputs: [("0".to_string(), input.clone())].into_iter().collect(),
                outputs: [("out".to_string(), pcoll_id.clone())]
                    .into_iter()
                    .collect(),
                environment_id: env.clone(),
                ..Default::default()
            };
            graph
                .unique_names
                .insert(transform_id.clone(), name.clone());
            inserted.push(Node {
                id: transform_id,
                name,
                kind: NodeKind::Sdk,
                inputs: vec![input.clone()],
                side_inputs: Vec::new(),
                outputs: vec![pcoll_id.clone()],
                env: env.clone(),
                stateful: false,
                splittable: false,
                finalization: false,
                window_expiration_family: None,
                time_sorted_input: false,
                stable_input: false,
                transform,
            });
            done.insert(input.clone(), pcoll_id.clone());
            new_inputs[n] = pcoll_id;
        }
        if inserted.is_empty() {
            i += 1;
            continue;
        }
        // Point the Flatten (node and proto) at the transcoded PCollections.
        let node = &mut graph.nodes[i];
        let tagged = sorted_by_tag(&node.transform.inputs);
        for ((tag, _), new) in tagged.iter().zip(new_inputs.iter()) {
            node.transform.inputs.insert(tag.clone(), new.clone());
        }
        node.inputs = new_inputs;
        let count = inserted.len();
        for (k, n) in inserted.into_iter().enumerate() {
            graph.nodes.insert(i + k, n);
        }
        i += count + 1;
    }
}

fn coder_id(graph: &Graph, pcoll: &str) -> Option<String> {
    graph
        .components
        .pcollections
        .get(pcoll)
        .map(|p| p.coder_id.clone())
}

/// The environment of the first SDK node producing one of `inputs`.
fn producer_env(graph: &Graph, inputs: &[String]) -> Option<String> {
    graph
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::Sdk && !n.env.is_empty())
        .find(|n| n.outputs.iter().any(|o| inputs.contains(o)))
        .map(|n| n.env.clone())
}
