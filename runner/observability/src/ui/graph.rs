//! The pipeline as its author wrote it, for the UI's graph: every
//! transform under the name the user gave it, composites with their
//! parts, and for each the fused stages its work runs in.
//!
//! The engine runs fused stages named by their transforms' unique names
//! joined by `+`; transforms the runner adds (a lifted combine's
//! `Combine/Precombine`, a splittable DoFn's `Read/PairWithRestriction`)
//! are named under the transform they came from, so a stage maps to the
//! user's transforms by exact name, or else by the nearest enclosing one.

use std::collections::HashMap;

use refract_engine::plan::fused_transform_names;
use refract_proto::pipeline::Pipeline;
use serde_json::{json, Value};

/// One transform of the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphTransform {
    /// Its id in the pipeline.
    pub id: String,
    /// Its unique name (`Outer/Inner/Leaf`).
    pub name: String,
    /// The composite it is part of.
    pub parent: Option<String>,
    /// Its parts, in the pipeline's order (empty for a leaf).
    pub children: Vec<String>,
    /// PCollections it reads (main and side inputs).
    pub inputs: Vec<String>,
    /// PCollections it writes.
    pub outputs: Vec<String>,
    /// Its spec's URN (empty for a plain composite).
    pub urn: String,
    /// Indexes of the fused stages running it or any of its parts.
    pub stages: Vec<usize>,
}

/// Every transform reachable from the pipeline's roots, parents before
/// their parts, each once.
pub fn transforms(pipeline: &Pipeline, stage_names: &[String]) -> Vec<GraphTransform> {
    let Some(components) = pipeline.components.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    // Depth first, iteratively: a pipeline's nesting is its author's.
    let mut todo: Vec<(String, Option<String>)> = pipeline
        .root_transform_ids
        .iter()
        .rev()
        .map(|id| (id.clone(), None))
        .collect();
    while let Some((id, parent)) = todo.pop() {
        if index.contains_key(&id) {
            continue;
        }
        let Some(t) = components.transforms.get(&id) else {
            continue;
        };
        index.insert(id.clone(), out.len());
        let mut inputs: Vec<String> = t.inputs.values().cloned().collect();
        inputs.sort();
        let mut outputs: Vec<String> = t.outputs.values().cloned().collect();
        outputs.sort();
        out.push(GraphTransform {
            id: id.clone(),
            name: if t.unique_name.is_empty() {
                id.clone()
            } else {
                t.unique_name.clone()
            },
            parent,
            children: t.subtransforms.clone(),
            inputs,
            outputs,
            urn: t.spec.as_ref().map(|s| s.urn.clone()).unwrap_or_default(),
            stages: Vec::new(),
        });
        for child in t.subtransforms.iter().rev() {
            todo.push((child.clone(), Some(id.clone())));
        }
    }
    // A part listed under two composites (or under its own part) stays
    // with the one that reached it first; a part missing from the
    // pipeline is dropped.
    let parents: HashMap<String, Option<String>> = out
        .iter()
        .map(|t| (t.id.clone(), t.parent.clone()))
        .collect();
    for t in &mut out {
        let me = t.id.clone();
        t.children
            .retain(|c| parents.get(c).and_then(|p| p.as_deref()) == Some(me.as_str()));
    }
    let by_name: HashMap<String, usize> = out
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.clone(), i))
        .collect();
    for (stage, name) in stage_names.iter().enumerate() {
        for part in fused_transform_names(name) {
            let Some(mut at) = owner(&by_name, part) else {
                continue;
            };
            // The transform and every composite around it.
            loop {
                let t = &mut out[at];
                if t.stages.last() != Some(&stage) {
                    t.stages.push(stage);
                }
                match t.parent.as_ref().and_then(|p| index.get(p)) {
                    Some(&up) => at = up,
                    None => break,
                }
            }
        }
    }
    out
}

/// The transform named `name`, or the nearest one whose name encloses it
/// (`A/B` for `A/B/Precombine`).
fn owner(by_name: &HashMap<String, usize>, name: &str) -> Option<usize> {
    let mut name = name;
    loop {
        if let Some(&i) = by_name.get(name) {
            return Some(i);
        }
        name = &name[..name.rfind('/')?];
    }
}

/// The graph as `/api/jobs/{id}/graph` sends it: the transforms (see
/// [`transforms`]), the roots, and each PCollection's name.
pub fn graph_json(pipeline: &Pipeline, stage_names: &[String]) -> Value {
    let transforms = transforms(pipeline, stage_names);
    let roots: Vec<&str> = transforms
        .iter()
        .filter(|t| t.parent.is_none())
        .map(|t| t.id.as_str())
        .collect();
    let pcollections: serde_json::Map<String, Value> = pipeline
        .components
        .as_ref()
        .map(|c| {
            c.pcollections
                .iter()
                .map(|(id, p)| (id.clone(), json!(p.unique_name)))
                .collect()
        })
        .unwrap_or_default();
    json!({
        "roots": roots,
        "transforms": transforms.iter().map(|t| json!({
            "id": t.id,
            "name": t.name,
            "parent": t.parent,
            "children": t.children,
            "inputs": t.inputs,
            "outputs": t.outputs,
            "urn": t.urn,
            "stages": t.stages,
        })).collect::<Vec<_>>(),
        "pcollections": pcollections,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_proto::pipeline::{Components, FunctionSpec, PTransform};

    fn transform(name: &str, urn: &str, parts: &[&str], ins: &[&str], outs: &[&str]) -> PTransform {
        PTransform {
            unique_name: name.into(),
            spec: (!urn.is_empty()).then(|| FunctionSpec {
                urn: urn.into(),
                payload: Vec::new(),
            }),
            subtransforms: parts.iter().map(|s| s.to_string()).collect(),
            inputs: ins
                .iter()
                .enumerate()
                .map(|(i, p)| (i.to_string(), p.to_string()))
                .collect(),
            outputs: outs
                .iter()
                .enumerate()
                .map(|(i, p)| (i.to_string(), p.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    /// Read -> Count (a composite holding a lifted combine) -> Write.
    fn pipeline() -> Pipeline {
        let mut components = Components::default();
        let add = |c: &mut Components, id: &str, t: PTransform| {
            c.transforms.insert(id.into(), t);
        };
        add(
            &mut components,
            "r",
            transform("Read", "beam:transform:impulse:v1", &[], &[], &["p1"]),
        );
        add(
            &mut components,
            "c",
            transform("Count", "", &["c1", "c2"], &["p1"], &["p3"]),
        );
        add(
            &mut components,
            "c1",
            transform(
                "Count/Pair",
                "beam:transform:pardo:v1",
                &[],
                &["p1"],
                &["p2"],
            ),
        );
        add(
            &mut components,
            "c2",
            transform(
                "Count/Sum",
                "beam:transform:combine_per_key:v1",
                &[],
                &["p2"],
                &["p3"],
            ),
        );
        add(
            &mut components,
            "w",
            transform("Write", "beam:transform:pardo:v1", &[], &["p3"], &[]),
        );
        Pipeline {
            components: Some(components),
            root_transform_ids: vec!["r".into(), "c".into(), "w".into()],
            ..Default::default()
        }
    }

    #[test]
    fn transforms_keep_their_names_nesting_and_order() {
        let graph = transforms(&pipeline(), &[]);
        let names: Vec<&str> = graph.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["Read", "Count", "Count/Pair", "Count/Sum", "Write"]);
        assert_eq!(graph[1].children, ["c1", "c2"]);
        assert_eq!(graph[2].parent.as_deref(), Some("c"));
        assert_eq!(graph[3].inputs, ["p2"]);
    }

    #[test]
    fn stages_map_to_transforms_and_their_composites() {
        // The runner lifted the combine: its pieces are named under it.
        let stages = [
            "Read+Count/Pair+Count/Sum/Precombine".to_string(),
            "Count/Sum/Group".to_string(),
            "Count/Sum/Merge+Count/Sum/ExtractOutputs+Write".to_string(),
            "runner-only".to_string(),
        ];
        let graph = transforms(&pipeline(), &stages);
        let stages_of = |name: &str| {
            graph
                .iter()
                .find(|t| t.name == name)
                .map(|t| t.stages.clone())
                .unwrap_or_default()
        };
        assert_eq!(stages_of("Read"), [0]);
        assert_eq!(stages_of("Count/Pair"), [0]);
        assert_eq!(stages_of("Count/Sum"), [0, 1, 2]);
        assert_eq!(stages_of("Count"), [0, 1, 2]);
        assert_eq!(stages_of("Write"), [2]);
    }

    #[test]
    fn cycles_and_dangling_parts_end() {
        let mut p = pipeline();
        let components = p.components.as_mut().expect("components");
        components
            .transforms
            .get_mut("c1")
            .expect("c1")
            .subtransforms = vec!["c".into(), "missing".into()];
        let graph = transforms(&p, &[]);
        assert_eq!(graph.len(), 5);
        assert!(graph[2].children.is_empty(), "{:?}", graph[2]);
        p.root_transform_ids.push("missing".into());
        assert_eq!(transforms(&p, &[]).len(), 5);
    }
}
