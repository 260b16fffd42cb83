//! Greedy fusion of SDK nodes into stages (fn-api-notes §3.7).
//!
//! Walking nodes in topological order, an SDK node joins the stage in which
//! its main input is available — the stage that produces it, or a stage that
//! already reads it from the runner — when all of these hold (Python's
//! `Stage.can_fuse`):
//! - it is not a forced root (stateful ParDo, splittable process step), and
//!   the stage it would join does not read a shared source as a forced root;
//! - both run in the same environment;
//! - none of its side inputs is produced in, or downstream of, that stage
//!   (otherwise the stage would wait for itself).
//!
//! Runner nodes (impulse, flatten, reshuffle, group-by-key) are stages of
//! their own. Every SDK stage has at most one main input: the engine feeds
//! one data source per stage.

use std::collections::HashMap;

use crate::graph::{Node, NodeKind};

/// One stage before it is turned into engine and Fn API types.
#[derive(Debug, Clone)]
pub(crate) enum Group {
    /// A runner-executed node (index into the graph's nodes).
    Runner(usize),
    /// Fused SDK nodes.
    Sdk(SdkGroup),
}

/// Fused SDK nodes sharing one main input and one environment.
#[derive(Debug, Clone)]
pub(crate) struct SdkGroup {
    /// Node indices, in topological order; the first is the root.
    pub nodes: Vec<usize>,
    /// The PCollection the stage's data source reads, if any.
    pub input: Option<String>,
    /// The environment all nodes run in.
    pub env: String,
}

/// A set of node indices.
#[derive(Debug, Clone)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn get(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn union(&mut self, other: &Bits) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a |= b;
        }
    }
    fn intersects(&self, other: &Bits) -> bool {
        self.0.iter().zip(&other.0).any(|(a, b)| a & b != 0)
    }
}

/// Fuses `nodes` (topologically sorted) into stages.
pub(crate) fn fuse(nodes: &[Node]) -> Vec<Group> {
    let n = nodes.len();
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        for out in &node.outputs {
            producer.insert(out.as_str(), i);
        }
    }
    // ancestors[i]: every node that node i depends on, through main or side inputs.
    let mut ancestors: Vec<Bits> = Vec::with_capacity(n);
    for node in nodes {
        let mut bits = Bits::new(n);
        for input in node.inputs.iter().chain(node.side_inputs.iter().map(|s| &s.pcoll)) {
            if let Some(&p) = producer.get(input.as_str()) {
                bits.set(p);
                if let Some(a) = ancestors.get(p) {
                    bits.union(a);
                }
            }
        }
        ancestors.push(bits);
    }

    let mut groups: Vec<Group> = Vec::new();
    let mut members: Vec<Bits> = Vec::new(); // per group: its nodes
    let mut group_of: Vec<usize> = vec![usize::MAX; n];
    let mut readers: HashMap<&str, Vec<usize>> = HashMap::new(); // pcoll → groups sourcing it (not forced)

    for (i, node) in nodes.iter().enumerate() {
        if node.kind != NodeKind::Sdk {
            group_of[i] = groups.len();
            groups.push(Group::Runner(i));
            members.push(Bits::new(n));
            continue;
        }
        let main = node.inputs.first().map(String::as_str);
        let mut chosen = None;
        if let (Some(main), false) = (main, node.forced_root()) {
            let mut candidates = Vec::new();
            if let Some(&p) = producer.get(main) {
                if nodes[p].kind == NodeKind::Sdk {
                    candidates.push(group_of[p]);
                }
            }
            candidates.extend(readers.get(main).into_iter().flatten().copied());
            chosen = candidates.into_iter().find(|&g| {
                let Group::Sdk(group) = &groups[g] else { return false };
                group.env == node.env
                    && node.side_inputs.iter().all(|side| {
                        let Some(&p) = producer.get(side.pcoll.as_str()) else { return true };
                        !members[g].get(p) && !ancestors[p].intersects(&members[g])
                    })
            });
        }
        match chosen {
            Some(g) => {
                if let Group::Sdk(group) = &mut groups[g] {
                    group.nodes.push(i);
                }
                members[g].set(i);
                group_of[i] = g;
            }
            None => {
                let g = groups.len();
                if let (Some(main), false) = (main, node.forced_root()) {
                    readers.entry(main).or_default().push(g);
                }
                let mut bits = Bits::new(n);
                bits.set(i);
                members.push(bits);
                groups.push(Group::Sdk(SdkGroup {
                    nodes: vec![i],
                    input: main.map(str::to_string),
                    env: node.env.clone(),
                }));
                group_of[i] = g;
            }
        }
    }
    groups
}
