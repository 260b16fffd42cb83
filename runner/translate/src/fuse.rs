//! Greedy fusion of SDK nodes into stages, by the rules of Beam's reference
//! runners.
//!
//! Walking nodes in topological order, an SDK node joins the stage in which
//! its main input is available — the stage that produces it, or a stage that
//! already reads it from the runner — when all of these hold (Python's
//! `Stage.can_fuse`):
//! - it is not a forced root (stateful ParDo, splittable process step,
//!   `@RequiresStableInput` ParDo), and
//!   the stage it would join does not read a shared source as a forced root;
//! - both run in the same environment;
//! - none of its side inputs is produced in, or downstream of, that stage
//!   (otherwise the stage would wait for itself).
//!
//! Runner nodes (impulse, flatten, reshuffle, group-by-key) are stages of
//! their own. Every SDK stage has at most one main input: the engine feeds
//! one data source per stage.
//!
//! With [`Fusion::WithinRootTransforms`] a node joins only a stage of its
//! own root transform (one the pipeline applies itself, `p | Create |
//! MyTransform | assert_that`). Inside a fused stage an SDK hands elements
//! from one transform to the next as objects, never encoded; a runner that
//! fuses differently encodes them where its stages meet, so a coder that
//! loses data only fails there. Strict mode so makes every element that
//! passes from one of the pipeline's transforms to the next cross its
//! coder, while the steps inside a transform (Beam's own composites among
//! them) stay fused: each extra stage costs the SDK a bundle processor per
//! job.

use std::collections::{HashMap, HashSet};

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

/// How SDK transforms are put into stages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Fusion {
    /// Fused greedily by the rules above: fewer, larger stages.
    #[default]
    Greedy,
    /// Fused greedily, but never across two of the pipeline's root
    /// transforms: every element passing from one to the next is encoded by
    /// its producer and decoded by its consumer.
    WithinRootTransforms,
}

/// Candidate stages looked at for one node: fusing is an optimisation,
/// and a node that joins none of the first few starts a stage of its own.
const MAX_CANDIDATES: usize = 8;

/// Nodes the side-input checks of one fusion may visit in all, a few per
/// node: a check that would go past it answers "may depend", which only
/// costs a fusion.
const ANCESTOR_VISITS_PER_NODE: usize = 64;

/// Fuses `nodes` (topologically sorted) into stages, in time and memory
/// linear in the number of nodes and their inputs.
pub(crate) fn fuse(nodes: &[Node], fusion: Fusion) -> Vec<Group> {
    let n = nodes.len();
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        for out in &node.outputs {
            producer.insert(out.as_str(), i);
        }
    }
    let mut ancestry = Ancestry {
        nodes,
        producer: &producer,
        budget: n.saturating_mul(ANCESTOR_VISITS_PER_NODE).max(1 << 16),
    };

    let mut groups: Vec<Group> = Vec::new();
    // The earliest node (in topological order) of each group.
    let mut first_member: Vec<usize> = Vec::new();
    let mut group_of: Vec<usize> = vec![usize::MAX; n];
    let mut readers: HashMap<&str, Vec<usize>> = HashMap::new(); // pcoll → groups sourcing it (not forced)

    for (i, node) in nodes.iter().enumerate() {
        if node.kind != NodeKind::Sdk {
            group_of[i] = groups.len();
            groups.push(Group::Runner(i));
            first_member.push(i);
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
            chosen = candidates.into_iter().take(MAX_CANDIDATES).find(|&g| {
                let Group::Sdk(group) = &groups[g] else {
                    return false;
                };
                group.env == node.env
                    && (fusion == Fusion::Greedy || nodes[group.nodes[0]].root == node.root)
                    && node.side_inputs.iter().all(|side| {
                        let Some(&p) = producer.get(side.pcoll.as_str()) else {
                            return true;
                        };
                        !ancestry.reaches_group(p, g, first_member[g], &group_of)
                    })
            });
        }
        match chosen {
            Some(g) => {
                if let Group::Sdk(group) = &mut groups[g] {
                    group.nodes.push(i);
                }
                group_of[i] = g;
            }
            None => {
                let g = groups.len();
                if let (Some(main), false) = (main, node.forced_root()) {
                    readers.entry(main).or_default().push(g);
                }
                first_member.push(i);
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

/// Answers "is node `p`, or anything it depends on, in group `g`?" by
/// walking `p`'s inputs backwards on demand, instead of keeping every
/// node's ancestors (which takes memory quadratic in the nodes).
struct Ancestry<'a> {
    nodes: &'a [Node],
    producer: &'a HashMap<&'a str, usize>,
    /// Visits left for all checks together.
    budget: usize,
}

impl Ancestry<'_> {
    /// Whether `p` or one of its ancestors (through main or side inputs) is
    /// a member of group `g`, whose earliest member is `first`. Nodes are in
    /// topological order, so nothing before `first` can be in `g` or lead
    /// to it, and the walk stops there. Past the visit budget the answer is
    /// `true`: the caller then does not fuse, which is always correct.
    fn reaches_group(&mut self, p: usize, g: usize, first: usize, group_of: &[usize]) -> bool {
        let mut seen: HashSet<usize> = HashSet::new();
        let mut todo = vec![p];
        while let Some(i) = todo.pop() {
            if i < first || !seen.insert(i) {
                continue;
            }
            if group_of.get(i) == Some(&g) {
                return true;
            }
            if self.budget == 0 {
                return true;
            }
            self.budget -= 1;
            let Some(node) = self.nodes.get(i) else {
                continue;
            };
            for input in node
                .inputs
                .iter()
                .chain(node.side_inputs.iter().map(|s| &s.pcoll))
            {
                if let Some(&q) = self.producer.get(input.as_str()) {
                    todo.push(q);
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use refract_engine::plan::SideInputAccess;
    use refract_proto::pipeline as pb;

    use super::*;
    use crate::graph::{RootTransform, SideIn};

    fn node(id: &str, kind: NodeKind, env: &str, inputs: &[&str], outputs: &[&str]) -> Node {
        Node {
            id: id.to_string(),
            name: id.to_string(),
            root: RootTransform::default(),
            kind,
            transform: pb::PTransform::default(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            side_inputs: Vec::new(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            env: env.to_string(),
            stateful: false,
            splittable: false,
            finalization: false,
            window_expiration_family: None,
            time_sorted_input: false,
            stable_input: false,
        }
    }

    fn sdk_groups(groups: &[Group]) -> Vec<(Vec<usize>, Option<String>)> {
        groups
            .iter()
            .filter_map(|g| match g {
                Group::Sdk(s) => Some((s.nodes.clone(), s.input.clone())),
                Group::Runner(_) => None,
            })
            .collect()
    }

    #[test]
    fn chains_fuse_and_environments_split() {
        let nodes = vec![
            node("impulse", NodeKind::Impulse, "", &[], &["p0"]),
            node("a", NodeKind::Sdk, "py", &["p0"], &["p1"]),
            node("b", NodeKind::Sdk, "py", &["p1"], &["p2"]),
            node("c", NodeKind::Sdk, "java", &["p2"], &["p3"]),
        ];
        let groups = fuse(&nodes, Fusion::Greedy);
        assert_eq!(
            sdk_groups(&groups),
            vec![
                (vec![1, 2], Some("p0".into())),
                (vec![3], Some("p2".into()))
            ]
        );
    }

    #[test]
    fn within_root_transforms_a_node_joins_only_its_own_root_transforms_stage() {
        let under = |root: usize, mut node: Node| {
            node.root = RootTransform(root);
            node
        };
        let nodes = vec![
            node("impulse", NodeKind::Impulse, "", &[], &["p0"]),
            under(0, node("create", NodeKind::Sdk, "py", &["p0"], &["p1"])),
            under(0, node("decode", NodeKind::Sdk, "py", &["p1"], &["p2"])),
            under(1, node("label", NodeKind::Sdk, "py", &["p2"], &["p3"])),
            under(2, node("read", NodeKind::Sdk, "py", &["p3"], &["p4"])),
            under(2, node("check", NodeKind::Sdk, "py", &["p4"], &["p5"])),
            under(3, node("other", NodeKind::Sdk, "py", &["p0"], &["p6"])),
        ];
        assert_eq!(
            sdk_groups(&fuse(&nodes, Fusion::WithinRootTransforms)),
            vec![
                (vec![1, 2], Some("p0".into())),
                (vec![3], Some("p2".into())),
                (vec![4, 5], Some("p3".into())),
                (vec![6], Some("p0".into())),
            ]
        );
        // Greedy fusion makes one stage of the chain.
        assert_eq!(
            sdk_groups(&fuse(&nodes, Fusion::Greedy)),
            vec![(vec![1, 2, 3, 4, 5, 6], Some("p0".into()))]
        );
    }

    #[test]
    fn consumers_of_a_runner_output_share_one_source() {
        let nodes = vec![
            node("impulse", NodeKind::Impulse, "", &[], &["p0"]),
            node("a", NodeKind::Sdk, "py", &["p0"], &["p1"]),
            node("b", NodeKind::Sdk, "py", &["p0"], &["p2"]),
        ];
        assert_eq!(
            sdk_groups(&fuse(&nodes, Fusion::Greedy)),
            vec![(vec![1, 2], Some("p0".into()))]
        );
    }

    #[test]
    fn a_stable_input_pardo_reads_its_input_from_the_runner() {
        let mut stable = node("s", NodeKind::Sdk, "py", &["p1"], &["p2"]);
        stable.stable_input = true;
        let nodes = vec![
            node("impulse", NodeKind::Impulse, "", &[], &["p0"]),
            node("a", NodeKind::Sdk, "py", &["p0"], &["p1"]),
            stable,
            node("after", NodeKind::Sdk, "py", &["p2"], &["p3"]),
        ];
        assert_eq!(
            sdk_groups(&fuse(&nodes, Fusion::Greedy)),
            vec![
                (vec![1], Some("p0".into())),
                (vec![2, 3], Some("p1".into()))
            ]
        );
    }

    #[test]
    fn forced_roots_start_their_own_stage() {
        let mut stateful = node("s", NodeKind::Sdk, "py", &["p1"], &["p2"]);
        stateful.stateful = true;
        let nodes = vec![
            node("impulse", NodeKind::Impulse, "", &[], &["p0"]),
            node("a", NodeKind::Sdk, "py", &["p0"], &["p1"]),
            stateful,
            node("after", NodeKind::Sdk, "py", &["p2"], &["p3"]),
            node("other", NodeKind::Sdk, "py", &["p1"], &["p4"]),
        ];
        assert_eq!(
            sdk_groups(&fuse(&nodes, Fusion::Greedy)),
            vec![
                (vec![1, 4], Some("p0".into())),
                (vec![2, 3], Some("p1".into()))
            ]
        );
    }

    #[test]
    fn a_side_input_computed_downstream_breaks_fusion() {
        // a → p1 → b(main p1, side p3) where p3 = c(p1).
        let mut b = node("b", NodeKind::Sdk, "py", &["p1"], &["p2"]);
        b.side_inputs.push(SideIn {
            tag: "side".into(),
            pcoll: "p3".into(),
            access: SideInputAccess::Iterable,
        });
        let nodes = vec![
            node("impulse", NodeKind::Impulse, "", &[], &["p0"]),
            node("a", NodeKind::Sdk, "py", &["p0"], &["p1"]),
            node("c", NodeKind::Sdk, "py", &["p1"], &["p3"]),
            b,
        ];
        assert_eq!(
            sdk_groups(&fuse(&nodes, Fusion::Greedy)),
            vec![
                (vec![1, 2], Some("p0".into())),
                (vec![3], Some("p1".into()))
            ]
        );
    }
}
