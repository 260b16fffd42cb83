//! The pipeline as Refract executes it: a topologically sorted list of leaf
//! nodes, each either runner-executed (impulse, flatten, group-by-key) or an
//! SDK transform.
//!
//! This is the data every later step shares: `builder` makes it from the
//! pipeline proto, and transcoding, fusion, the coder rewrites and the
//! descriptors read and rewrite it.

use std::collections::HashMap;

use refract_engine::plan::SideInputAccess;
use refract_proto::pipeline as pb;

use crate::coders::Coders;

/// Who executes a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeKind {
    /// The runner emits the impulse element.
    Impulse,
    /// The runner copies its inputs to its output (Flatten, Reshuffle).
    Flatten,
    /// The runner groups by key and window.
    GroupByKey,
    /// The runner replays a TestStream's scripted events.
    TestStream,
    /// An SDK harness runs it, fused with its neighbours.
    Sdk,
}

/// A side input of an SDK node.
#[derive(Debug, Clone)]
pub(crate) struct SideIn {
    /// Local input tag.
    pub tag: String,
    /// PCollection id.
    pub pcoll: String,
    /// Access pattern.
    pub access: SideInputAccess,
}

/// Which of the pipeline's root transforms a node descends from, numbered
/// in the order they are walked: the transforms applied to the pipeline
/// itself (`p | Create | MyTransform | assert_that`), which strict mode
/// does not fuse with each other. They are the pipeline's
/// `root_transform_ids`, or the children of the only one when it is a
/// composite (as the Python SDK sends).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RootTransform(pub usize);

/// One executed leaf transform.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    /// Transform id (kept in bundle descriptors).
    pub id: String,
    /// Unique name, for stage names and errors.
    pub name: String,
    /// The root transform it descends from (set as the walk adds it).
    pub root: RootTransform,
    /// Who executes it.
    pub kind: NodeKind,
    /// The transform as it goes into a bundle descriptor (SDK nodes).
    pub transform: pb::PTransform,
    /// Main-input PCollections, in local-name order (a flatten may list one twice).
    pub inputs: Vec<String>,
    /// Side inputs (SDK nodes).
    pub side_inputs: Vec<SideIn>,
    /// Output PCollections, in local-name order.
    pub outputs: Vec<String>,
    /// Environment id (SDK nodes).
    pub env: String,
    /// Has user state or timers: must be the first transform of its stage.
    pub stateful: bool,
    /// A splittable DoFn's process step: must be the first transform of its stage.
    pub splittable: bool,
    /// Requests bundle finalization.
    pub finalization: bool,
    /// Stateful nodes: the timer family fired for each key and window as the
    /// window expires.
    pub window_expiration_family: Option<String>,
    /// Stateful nodes: input is delivered sorted by event time.
    pub time_sorted_input: bool,
    /// `@RequiresStableInput`: must be the first transform of its stage, so
    /// that its input is a stage input the engine can make durable first.
    pub stable_input: bool,
}

impl Node {
    /// A runner-executed node for `transform`.
    pub(crate) fn runner(id: &str, name: &str, kind: NodeKind, transform: pb::PTransform) -> Node {
        Node {
            id: id.to_string(),
            name: name.to_string(),
            root: RootTransform::default(),
            kind,
            inputs: values_by_tag(&transform.inputs),
            side_inputs: Vec::new(),
            outputs: values_by_tag(&transform.outputs),
            env: String::new(),
            stateful: false,
            splittable: false,
            finalization: false,
            window_expiration_family: None,
            time_sorted_input: false,
            stable_input: false,
            transform,
        }
    }

    /// Whether the node must start its own stage.
    pub(crate) fn forced_root(&self) -> bool {
        self.stateful || self.splittable || self.stable_input
    }
}

/// The executable graph, with the (mutable) components it refers to.
pub(crate) struct Graph {
    /// The pipeline's components, plus what lifting and SDF expansion added.
    /// Coders live in `coders` instead.
    pub components: pb::Components,
    /// All coders.
    pub coders: Coders,
    /// Leaf nodes in topological order.
    pub nodes: Vec<Node>,
    /// Transform id → unique name, for every transform.
    pub unique_names: HashMap<String, String>,
}

/// Sorts `(local name, value)` pairs by local name, numerically when the
/// names are numbers (Flatten's "0", "1", ..., "10").
pub(crate) fn sorted_by_tag(map: &HashMap<String, String>) -> Vec<(String, String)> {
    let mut entries: Vec<(String, String)> =
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    entries.sort_by(|a, b| match (a.0.parse::<u64>(), b.0.parse::<u64>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        _ => a.0.cmp(&b.0),
    });
    entries
}

/// The values of a local-name map, in [`sorted_by_tag`] order.
pub(crate) fn values_by_tag(map: &HashMap<String, String>) -> Vec<String> {
    sorted_by_tag(map).into_iter().map(|(_, v)| v).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_sort_numerically_when_numeric() {
        let map: HashMap<String, String> = [("10", "c"), ("2", "b"), ("1", "a")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let values: Vec<String> = sorted_by_tag(&map).into_iter().map(|(_, v)| v).collect();
        assert_eq!(values, vec!["a", "b", "c"]);
    }
}
