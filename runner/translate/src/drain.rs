//! The drain variant of a splittable DoFn's process stage.
//!
//! Draining a running job stops its sources: every restriction still to
//! process goes through the DoFn's `truncate_sized_restrictions` step first,
//! which ends unbounded restrictions and may shorten bounded ones. The
//! process stage's normal descriptor reads sized restrictions straight into
//! the process step; its drain variant has a truncate step in between, with
//! the same data source and sinks, so the runner can switch a stage's
//! bundles to it the moment a drain is requested.

use refract_proto::fn_api;
use refract_proto::pipeline as pb;
use refract_proto::urns::transform as t;

/// The drain variant of `descriptor`, whose data source is `source`; `None`
/// when the stage has no splittable process step reading that source.
pub(crate) fn variant(
    descriptor: &fn_api::ProcessBundleDescriptor,
    source: &str,
) -> Option<fn_api::ProcessBundleDescriptor> {
    let sized = descriptor
        .transforms
        .get(source)?
        .outputs
        .values()
        .next()?
        .clone();
    let (process_id, process) = descriptor.transforms.iter().find(|(_, tr)| {
        tr.spec
            .as_ref()
            .is_some_and(|s| s.urn == t::SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS)
            && tr.inputs.values().any(|p| *p == sized)
    })?;
    let main_tag = process
        .inputs
        .iter()
        .find(|(_, p)| **p == sized)
        .map(|(tag, _)| tag.clone())?;
    let mut out = descriptor.clone();
    out.id = format!("{}-drain", descriptor.id);
    let truncated = format!("{sized}_truncated");
    let mut pcoll = descriptor.pcollections.get(&sized)?.clone();
    pcoll.unique_name = format!("{}_truncated", pcoll.unique_name);
    out.pcollections.insert(truncated.clone(), pcoll);
    let truncate_id = format!("{process_id}/TruncateSizedRestriction");
    let truncate = pb::PTransform {
        unique_name: format!("{}/TruncateSizedRestriction", process.unique_name),
        spec: Some(pb::FunctionSpec {
            urn: t::SDF_TRUNCATE_SIZED_RESTRICTIONS.to_string(),
            payload: process
                .spec
                .as_ref()
                .map(|s| s.payload.clone())
                .unwrap_or_default(),
        }),
        inputs: process.inputs.clone(),
        outputs: [("out".to_string(), truncated.clone())]
            .into_iter()
            .collect(),
        environment_id: process.environment_id.clone(),
        ..Default::default()
    };
    let mut process = process.clone();
    process.inputs.insert(main_tag, truncated);
    out.transforms.insert(process_id.clone(), process);
    out.transforms.insert(truncate_id, truncate);
    Some(out)
}
