//! Building the [`Graph`]: the pipeline's transform hierarchy walked down
//! to its executed leaves.
//!
//! Composites are structure only and are walked through, with three
//! exceptions: Reshuffle and Redistribute become one
//! identity flatten (a fusion break) and their insides are skipped;
//! `combine_per_key` composites that the SDK did not pre-lift are lifted
//! (`combine`) when the trigger allows it; and splittable ParDos are
//! expanded into their pair / split / process steps (`sdf`).

mod combine;
mod sdf;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::rc::Rc;

use refract_proto::pipeline as pb;
use refract_proto::urns::transform as t;

use crate::coders::{unique_id, Coders};
use crate::error::TranslateError;
use crate::graph::{sorted_by_tag, values_by_tag, Graph, Node, NodeKind, RootTransform};
use crate::limits::Limits;
use crate::payloads::{self, decode_combine, decode_pardo, COMBINE_STEPS, PARDO_LIKE};

/// Other leaf URNs an SDK executes.
const OTHER_SDK_LEAVES: &[&str] = &[
    t::ASSIGN_WINDOWS,
    t::TO_STRING,
    t::MERGE_WINDOWS,
    t::MAP_WINDOWS,
    t::DATA_SOURCE,
    t::DATA_SINK,
];

/// Composites executed as an identity flatten.
const IDENTITY_COMPOSITES: &[&str] = &[
    t::RESHUFFLE,
    t::REDISTRIBUTE_BY_KEY,
    t::REDISTRIBUTE_ARBITRARILY,
];

/// Composite URNs that may legitimately arrive without subtransforms when
/// they only pass their input through.
const PASS_THROUGH_COMPOSITES: &[&str] =
    &[t::GENERIC_COMPOSITE, t::PICKLED_PYTHON, t::COMBINE_GLOBALLY];

/// A transform's URN, or "" when it has no spec.
fn urn_of(transform: &pb::PTransform) -> &str {
    transform.spec.as_ref().map_or("", |s| s.urn.as_str())
}

/// A transform's unique name, or its id when it has none.
fn name_of(id: &str, transform: &pb::PTransform) -> String {
    if transform.unique_name.is_empty() {
        id.to_string()
    } else {
        transform.unique_name.clone()
    }
}

/// Walks the pipeline's transforms into an executable graph.
pub(crate) fn build(
    pipeline: &pb::Pipeline,
    drain: bool,
    limits: &Limits,
) -> Result<Graph, TranslateError> {
    let mut components = pipeline
        .components
        .clone()
        .ok_or_else(|| TranslateError::Invalid("the pipeline has no components".into()))?;
    let coders = Coders::new(
        std::mem::take(&mut components.coders),
        &components.environments,
        limits.coder_depth,
    )?;
    let unique_names = components
        .transforms
        .iter()
        .map(|(id, tr)| (id.clone(), name_of(id, tr)))
        .collect();
    let mut builder = Builder {
        components,
        coders,
        nodes: Vec::new(),
        unique_names,
        visited: HashSet::new(),
        drain,
        root: RootTransform::default(),
    };
    builder.walk(&pipeline.root_transform_ids, limits.composite_depth)?;
    let nodes = topo_sort(builder.nodes)?;
    Ok(Graph {
        components: builder.components,
        coders: builder.coders,
        nodes,
        unique_names: builder.unique_names,
    })
}

/// Collects leaf nodes while walking composites. Combiner lifting and SDF
/// expansion (the child modules) add the transforms, PCollections and
/// coders they create through it.
struct Builder {
    /// The pipeline's components, plus what lifting and SDF expansion add.
    components: pb::Components,
    /// All coders, plus what lifting and SDF expansion add.
    coders: Coders,
    /// The leaf nodes found so far, in walk order.
    nodes: Vec<Node>,
    /// Transform id → unique name, for every transform.
    unique_names: HashMap<String, String>,
    /// Transforms already walked: one listed twice is an error.
    visited: HashSet<String>,
    /// The job starts draining: splittable DoFns truncate their restrictions.
    drain: bool,
    /// The root transform the walk is under: every node pushed gets it.
    root: RootTransform,
}

impl Builder {
    /// Visits `roots` and everything under them, parents before children
    /// and children in order, with an explicit stack: however deep the
    /// composites nest, the walk uses no call stack for it, and nesting
    /// past `max_depth` levels is refused.
    fn walk(&mut self, roots: &[String], max_depth: usize) -> Result<(), TranslateError> {
        // Each item's root transform, once known: the pipeline's root
        // transforms, or the children of its only one when that is a
        // composite (the Python SDK wraps the applied transforms in one).
        // A composite's children share one copy of its name (for errors
        // about them): a copy each would multiply a long name by the
        // number of children before anything checks them.
        let pipeline_roots: Rc<str> = Rc::from("the pipeline's root transforms");
        let mut todo: Vec<(String, Rc<str>, usize, Option<RootTransform>)> = roots
            .iter()
            .rev()
            .map(|id| (id.clone(), pipeline_roots.clone(), 1, None))
            .collect();
        let mut roots_seen = 0;
        while let Some((id, referrer, depth, root)) = todo.pop() {
            if depth > max_depth {
                return Err(TranslateError::TooLarge {
                    what: format!("levels of composite transforms above transform '{id}'"),
                    count: depth,
                    limit: max_depth,
                });
            }
            let root = match root {
                Some(root) => Some(root),
                None if depth == 1 && roots.len() == 1 && self.is_composite(&id) => None,
                None => {
                    roots_seen += 1;
                    Some(RootTransform(roots_seen - 1))
                }
            };
            self.root = root.unwrap_or_default();
            if let Some((name, children)) = self.visit(&id, &referrer)? {
                let referrer: Rc<str> = Rc::from(format!("transform '{name}'"));
                todo.extend(
                    children
                        .into_iter()
                        .rev()
                        .map(|child| (child, referrer.clone(), depth + 1, root)),
                );
            }
        }
        Ok(())
    }

    /// Whether transform `id` is a composite.
    fn is_composite(&self, id: &str) -> bool {
        self.components
            .transforms
            .get(id)
            .is_some_and(|t| !t.subtransforms.is_empty())
    }

    /// Takes in transform `id`: a leaf or an executed composite becomes
    /// nodes; any other composite returns its name and subtransforms, to be
    /// visited next.
    fn visit(
        &mut self,
        id: &str,
        referrer: &str,
    ) -> Result<Option<(String, Vec<String>)>, TranslateError> {
        if !self.visited.insert(id.to_string()) {
            return Err(TranslateError::Invalid(format!(
                "transform '{id}' appears more than once in the transform hierarchy"
            )));
        }
        let transform = self
            .components
            .transforms
            .get(id)
            .cloned()
            .ok_or_else(|| TranslateError::missing("transform", id, referrer))?;
        let name = name_of(id, &transform);
        let urn = urn_of(&transform).to_string();
        if IDENTITY_COMPOSITES.contains(&urn.as_str()) {
            return self.identity(id, &transform, &name).map(|()| None);
        }
        if urn == t::COMBINE_PER_KEY && !self.is_prelifted(&transform) {
            if let Some(nodes) = combine::lift(self, id, &transform)? {
                for node in nodes {
                    self.push(node)?;
                }
                return Ok(None);
            }
            if transform.subtransforms.is_empty() {
                return Err(TranslateError::unsupported(
                    "combine_per_key that cannot be lifted (its trigger, input coder or payload \
                     does not allow it) and has no subtransforms",
                    format!("transform '{name}'"),
                ));
            }
        }
        if !transform.subtransforms.is_empty() {
            return Ok(Some((name, transform.subtransforms)));
        }
        self.leaf(id, transform, &name, &urn).map(|()| None)
    }

    /// Whether a combine_per_key composite's subtransforms are already the
    /// lifted precombine / group / merge / extract steps.
    fn is_prelifted(&self, transform: &pb::PTransform) -> bool {
        let mut stack: Vec<&String> = transform.subtransforms.iter().collect();
        let mut seen = HashSet::new();
        while let Some(id) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            if let Some(sub) = self.components.transforms.get(id) {
                if urn_of(sub) == t::COMBINE_PER_KEY_PRECOMBINE {
                    return true;
                }
                stack.extend(sub.subtransforms.iter());
            }
        }
        false
    }

    fn identity(
        &mut self,
        id: &str,
        transform: &pb::PTransform,
        name: &str,
    ) -> Result<(), TranslateError> {
        if transform.inputs.len() != 1 || transform.outputs.len() != 1 {
            return Err(TranslateError::Invalid(format!(
                "'{}' transform '{name}' must have one input and one output, has {} and {}",
                urn_of(transform),
                transform.inputs.len(),
                transform.outputs.len()
            )));
        }
        let node = Node::runner(id, name, NodeKind::Flatten, transform.clone());
        self.push(node)
    }

    fn leaf(
        &mut self,
        id: &str,
        transform: pb::PTransform,
        name: &str,
        urn: &str,
    ) -> Result<(), TranslateError> {
        let runner_node = |kind, transform| Node::runner(id, name, kind, transform);
        let count_check = |inputs: Option<usize>, outputs: usize| -> Result<(), TranslateError> {
            if inputs.is_some_and(|n| n != transform.inputs.len())
                || transform.outputs.len() != outputs
            {
                return Err(TranslateError::Invalid(format!(
                    "'{urn}' transform '{name}' has {} inputs and {} outputs",
                    transform.inputs.len(),
                    transform.outputs.len()
                )));
            }
            Ok(())
        };
        match urn {
            t::IMPULSE => {
                count_check(Some(0), 1)?;
                self.push(runner_node(NodeKind::Impulse, transform))
            }
            t::FLATTEN => {
                count_check(None, 1)?;
                self.push(runner_node(NodeKind::Flatten, transform))
            }
            t::GROUP_BY_KEY => {
                count_check(Some(1), 1)?;
                self.push(runner_node(NodeKind::GroupByKey, transform))
            }
            t::TEST_STREAM => {
                count_check(Some(0), transform.outputs.len().max(1))?;
                // Python gives TestStream the SDK's environment; the runner
                // replays it itself.
                self.push(runner_node(NodeKind::TestStream, transform))
            }
            t::PAR_DO => {
                let payload = decode_pardo(&transform, name)?;
                if payload.restriction_coder_id.is_empty() {
                    let node = self.sdk_node(id, transform)?;
                    self.push(node)
                } else {
                    for node in sdf::expand(self, id, &transform, &payload)? {
                        self.push(node)?;
                    }
                    Ok(())
                }
            }
            u if PARDO_LIKE.contains(&u)
                || COMBINE_STEPS.contains(&u)
                || OTHER_SDK_LEAVES.contains(&u) =>
            {
                let node = self.sdk_node(id, transform)?;
                self.push(node)
            }
            "" if transform.spec.as_ref().is_none_or(|s| s.payload.is_empty()) => {
                // An empty composite: structure only, nothing to execute. If
                // something consumes its outputs, sorting reports that they
                // have no producer.
                Ok(())
            }
            "" => Err(TranslateError::Invalid(format!(
                "transform '{name}' has a payload but no URN and no subtransforms"
            ))),
            u if PASS_THROUGH_COMPOSITES.contains(&u) && passes_through(&transform) => Ok(()),
            other => Err(TranslateError::UnsupportedTransform {
                urn: other.to_string(),
                transform: name.to_string(),
            }),
        }
    }

    /// Builds the node of an SDK-executed transform (with its ParDo facts).
    fn sdk_node(&self, id: &str, transform: pb::PTransform) -> Result<Node, TranslateError> {
        let name = name_of(id, &transform);
        let urn = urn_of(&transform).to_string();
        let env = transform.environment_id.clone();
        if env.is_empty() {
            return Err(TranslateError::Invalid(format!(
                "transform '{name}' ('{urn}') must run in an SDK but has no environment"
            )));
        }
        if !self.components.environments.contains_key(&env) {
            return Err(TranslateError::missing(
                "environment",
                &env,
                format!("transform '{name}'"),
            ));
        }
        let mut side_inputs = Vec::new();
        let (mut stateful, mut finalization) = (false, false);
        let (mut window_expiration_family, mut time_sorted_input) = (None, false);
        let mut stable_input = false;
        if PARDO_LIKE.contains(&urn.as_str()) {
            let facts = payloads::pardo_facts(&transform, &name, &self.coders)?;
            side_inputs = facts.side_inputs;
            stateful = facts.keyed_state
                && (urn == t::PAR_DO || urn == t::SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS);
            finalization = facts.finalization;
            stable_input = facts.stable_input;
            if stateful {
                window_expiration_family = facts.window_expiration_family;
                time_sorted_input = facts.time_sorted_input;
            }
        } else if COMBINE_STEPS.contains(&urn.as_str()) {
            let payload = decode_combine(&transform, &name)?;
            self.coders.get(
                &payload.accumulator_coder_id,
                &format!("transform '{name}'"),
            )?;
        }
        let side_tags: HashSet<&str> = side_inputs.iter().map(|s| s.tag.as_str()).collect();
        let inputs: Vec<String> = sorted_by_tag(&transform.inputs)
            .into_iter()
            .filter(|(tag, _)| !side_tags.contains(tag.as_str()))
            .map(|(_, p)| p)
            .collect();
        if inputs.len() > 1 {
            return Err(TranslateError::Invalid(format!(
                "transform '{name}' ('{urn}') has {} main inputs; SDK transforms take at most one",
                inputs.len()
            )));
        }
        Ok(Node {
            id: id.to_string(),
            name,
            root: RootTransform::default(),
            kind: NodeKind::Sdk,
            inputs,
            side_inputs,
            outputs: values_by_tag(&transform.outputs),
            env,
            stateful,
            splittable: urn == t::SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS,
            finalization,
            window_expiration_family,
            time_sorted_input,
            stable_input,
            transform,
        })
    }

    /// Adds a PCollection under an id derived from `base`.
    fn add_pcollection(&mut self, base: &str, pcoll: pb::PCollection) -> String {
        let id = unique_id(base, |c| self.components.pcollections.contains_key(c));
        self.components.pcollections.insert(id.clone(), pcoll);
        id
    }

    /// Adds a transform under an id derived from `base`, recording its name.
    fn add_transform(&mut self, base: &str, transform: pb::PTransform) -> String {
        let id = unique_id(base, |c| self.components.transforms.contains_key(c));
        self.unique_names
            .insert(id.clone(), name_of(&id, &transform));
        self.components.transforms.insert(id.clone(), transform);
        id
    }

    /// A PCollection, or an error naming `referrer`.
    fn pcollection(&self, id: &str, referrer: &str) -> Result<&pb::PCollection, TranslateError> {
        self.components
            .pcollections
            .get(id)
            .ok_or_else(|| TranslateError::missing("PCollection", id, referrer))
    }

    fn push(&mut self, mut node: Node) -> Result<(), TranslateError> {
        node.root = self.root;
        let referrer = format!("transform '{}'", node.name);
        for pcoll in node
            .inputs
            .iter()
            .chain(node.outputs.iter())
            .chain(node.side_inputs.iter().map(|s| &s.pcoll))
        {
            let pc = self.pcollection(pcoll, &referrer)?;
            self.coders
                .get(&pc.coder_id, &format!("PCollection '{pcoll}'"))?;
            if !self
                .components
                .windowing_strategies
                .contains_key(&pc.windowing_strategy_id)
            {
                return Err(TranslateError::missing(
                    "windowing strategy",
                    &pc.windowing_strategy_id,
                    format!("PCollection '{pcoll}'"),
                ));
            }
        }
        self.nodes.push(node);
        Ok(())
    }
}

/// Whether every output of a transform is also one of its inputs.
fn passes_through(transform: &pb::PTransform) -> bool {
    let inputs: HashSet<&String> = transform.inputs.values().collect();
    transform.outputs.values().all(|o| inputs.contains(o))
}

/// Orders nodes so that every PCollection's producer comes before its
/// consumers, keeping the pipeline's own order where it is free.
fn topo_sort(nodes: Vec<Node>) -> Result<Vec<Node>, TranslateError> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        for out in &node.outputs {
            if let Some(other) = producer.insert(out.as_str(), i) {
                return Err(TranslateError::Invalid(format!(
                    "PCollection '{out}' is produced by both '{}' and '{}'",
                    nodes[other].name, node.name
                )));
            }
        }
    }
    let mut indegree = vec![0usize; nodes.len()];
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        for input in node
            .inputs
            .iter()
            .chain(node.side_inputs.iter().map(|s| &s.pcoll))
        {
            let Some(&p) = producer.get(input.as_str()) else {
                return Err(TranslateError::Invalid(format!(
                    "PCollection '{input}' consumed by '{}' has no producer",
                    node.name
                )));
            };
            indegree[i] += 1;
            consumers[p].push(i);
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> = indegree
        .iter()
        .enumerate()
        .filter(|(_, d)| **d == 0)
        .map(|(i, _)| Reverse(i))
        .collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        for &c in &consumers[i] {
            indegree[c] -= 1;
            if indegree[c] == 0 {
                ready.push(Reverse(c));
            }
        }
    }
    if order.len() != nodes.len() {
        return Err(TranslateError::Invalid(
            "the pipeline's transforms form a cycle".into(),
        ));
    }
    let mut slots: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
    Ok(order
        .into_iter()
        .filter_map(|i| slots.get_mut(i).and_then(Option::take))
        .collect())
}
