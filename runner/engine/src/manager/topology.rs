//! The shape of a running job: its plan, who produces and who consumes
//! each PCollection, and the order in which stages are visited (producers
//! before consumers). Fixed once the engine is built; everything that
//! changes while the job runs lives in the stages' state.

use std::collections::VecDeque;

use super::EngineError;
use crate::plan::SideInputId;
use crate::plan::{PCollectionIdx, PCollectionVec, Plan, SideInputAccess, StageIdx, StageVec};
use crate::time::{Timestamp, MAX_TIMESTAMP};

/// Where elements of a PCollection go.
#[derive(Default, Clone)]
pub(super) struct Consumers {
    /// Stages reading it as a main input (with multiplicity).
    pub(super) stages: Vec<StageIdx>,
    /// Side inputs reading it, and how.
    pub(super) side_inputs: Vec<(SideInputId, SideInputAccess)>,
}

/// The plan and the graph read from it.
pub(super) struct Topology {
    /// What runs.
    pub(super) plan: Plan,
    /// Per PCollection, who reads it.
    pub(super) consumers: PCollectionVec<Consumers>,
    /// Per PCollection, the one stage writing it (none for a PCollection
    /// nothing in the plan writes).
    pub(super) producers: PCollectionVec<Option<StageIdx>>,
    /// Every stage, each after the stages it reads from.
    pub(super) order: Vec<StageIdx>,
}

impl Topology {
    /// Reads the graph of `plan`; an error names the stage or PCollection
    /// that makes it not executable (an unknown PCollection, two
    /// producers of one, a cycle).
    pub(super) fn new(plan: Plan) -> Result<Self, EngineError> {
        let mut consumers =
            PCollectionVec::from(vec![Consumers::default(); plan.pcollections.len()]);
        let mut producers = PCollectionVec::from(vec![None; plan.pcollections.len()]);
        for (idx, stage) in plan.stages.iter_enumerated() {
            let unknown = |what: &str, p: PCollectionIdx| {
                EngineError::InvalidPlan(format!("stage '{}' {what} {p}", stage.name))
            };
            for &p in &stage.inputs {
                let c = consumers
                    .get_mut(p)
                    .ok_or_else(|| unknown("reads unknown PCollection", p))?;
                c.stages.push(idx);
            }
            for si in &stage.side_inputs {
                let c = consumers.get_mut(si.pcollection).ok_or_else(|| {
                    unknown("reads unknown side input PCollection", si.pcollection)
                })?;
                c.side_inputs.push((si.id.clone(), si.access));
            }
            for &p in &stage.outputs {
                let slot = producers
                    .get_mut(p)
                    .ok_or_else(|| unknown("writes unknown PCollection", p))?;
                if slot.is_some() {
                    return Err(EngineError::InvalidPlan(format!(
                        "PCollection '{}' has two producers",
                        plan.pcollections[p].id
                    )));
                }
                *slot = Some(idx);
            }
        }
        let order = topological_order(&plan, &producers)?;
        Ok(Topology {
            plan,
            consumers,
            producers,
            order,
        })
    }

    /// Stage `idx`'s input watermark: the least output watermark (as
    /// `output_wm` tells it) of the stages producing its inputs, +∞ for a
    /// source.
    pub(super) fn input_watermark(
        &self,
        idx: StageIdx,
        output_wm: impl Fn(StageIdx) -> Timestamp,
    ) -> Timestamp {
        self.plan.stages[idx]
            .inputs
            .iter()
            .map(|&p| self.producers[p].map_or(MAX_TIMESTAMP, &output_wm))
            .min()
            .unwrap_or(MAX_TIMESTAMP)
    }
}

/// Stages ordered so every producer precedes its consumers (side inputs included).
fn topological_order(
    plan: &Plan,
    producers: &PCollectionVec<Option<StageIdx>>,
) -> Result<Vec<StageIdx>, EngineError> {
    let n = plan.stages.len();
    let mut indegree = StageVec::from(vec![0usize; n]);
    let mut edges: StageVec<Vec<StageIdx>> = StageVec::from(vec![Vec::new(); n]);
    for (idx, stage) in plan.stages.iter_enumerated() {
        let upstream = stage
            .inputs
            .iter()
            .copied()
            .chain(stage.side_inputs.iter().map(|s| s.pcollection));
        for p in upstream {
            if let Some(producer) = producers[p] {
                edges[producer].push(idx);
                indegree[idx] += 1;
            }
        }
    }
    let mut queue: VecDeque<StageIdx> = indegree.indices().filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = queue.pop_front() {
        order.push(i);
        for &j in &edges[i] {
            indegree[j] -= 1;
            if indegree[j] == 0 {
                queue.push_back(j);
            }
        }
    }
    if order.len() != n {
        return Err(EngineError::InvalidPlan(
            "the stage graph has a cycle".into(),
        ));
    }
    Ok(order)
}
