//! The order in which stages are visited: producers before consumers.

use super::*;

/// Stages ordered so every producer precedes its consumers (side inputs included).
pub(super) fn topological_order(
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
