//! Submission-time checks: what a pipeline asks of the runner that Refract
//! cannot give is rejected at `Prepare`, with the URN and the place named,
//! instead of failing (or silently misbehaving) mid-job.
//!
//! Transform URNs, ParDo state and timer specs, side-input access patterns
//! and payloads are checked while the executable graph is built
//! ([`crate::builder::build`]) and environments as they are resolved
//! ([`crate::environments::resolve`]); this module checks the rest.

use std::collections::HashSet;

use refract_proto::pipeline as pb;
use refract_proto::urns::requirement;

use crate::error::TranslateError;
use crate::graph::Graph;
use crate::windowing;

/// Requirements Refract honours. Stable input holds because a bundle's input
/// stays committed until the bundle succeeds and is replayed on retry.
const SUPPORTED_REQUIREMENTS: &[&str] = &[
    requirement::STATEFUL,
    requirement::SPLITTABLE_DOFN,
    requirement::FINALIZATION,
    requirement::STABLE_INPUT,
    requirement::TIME_SORTED_INPUT,
    requirement::ON_WINDOW_EXPIRATION,
];

/// Rejects `Pipeline.requirements` entries Refract cannot honour.
pub(crate) fn requirements(pipeline: &pb::Pipeline) -> Result<(), TranslateError> {
    match pipeline
        .requirements
        .iter()
        .find(|r| !SUPPORTED_REQUIREMENTS.contains(&r.as_str()))
    {
        Some(unsupported) => Err(TranslateError::UnsupportedRequirement(unsupported.clone())),
        None => Ok(()),
    }
}

/// Checks the windowing strategy of every PCollection an executed transform
/// reads or writes converts for the engine (window function, merge status,
/// trigger tree, accumulation and timing enums).
pub(crate) fn windowing_strategies(graph: &Graph) -> Result<(), TranslateError> {
    let mut checked = HashSet::new();
    for node in &graph.nodes {
        for pcoll in node
            .inputs
            .iter()
            .chain(&node.outputs)
            .chain(node.side_inputs.iter().map(|s| &s.pcoll))
        {
            let Some(pc) = graph.components.pcollections.get(pcoll) else {
                return Err(TranslateError::missing(
                    "PCollection",
                    pcoll,
                    format!("transform '{}'", node.name),
                ));
            };
            if checked.insert(pc.windowing_strategy_id.clone()) {
                windowing::convert(
                    &graph.components,
                    &pc.windowing_strategy_id,
                    &format!("PCollection '{pcoll}'"),
                )?;
                if let Some(ws) = graph
                    .components
                    .windowing_strategies
                    .get(&pc.windowing_strategy_id)
                {
                    graph.coders.get(
                        &ws.window_coder_id,
                        &format!("windowing strategy '{}'", pc.windowing_strategy_id),
                    )?;
                }
            }
        }
    }
    Ok(())
}
