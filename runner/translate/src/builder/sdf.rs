//! Splittable DoFn expansion.
//!
//! A ParDo with a restriction coder becomes three SDK transforms with the
//! same payload bytes and new URNs:
//! `pair_with_restriction` (I → KV<I, R>), `split_and_size_restrictions`
//! (KV<I, R> → KV<KV<I, R>, double>) and
//! `process_sized_element_and_restrictions` (→ the original outputs). The
//! first two fuse with the producer; the process step is forced to start its
//! own stage, so that runner-initiated splits and SDK checkpoints (residuals)
//! re-enter that stage's data source in its port format. Side inputs stay on
//! all three steps. A job that starts draining gets a fourth step,
//! `truncate_sized_restrictions`, between split and process.

use refract_proto::pipeline as pb;
use refract_proto::urns::{coder as c, transform as t};

use super::{name_of, Builder};
use crate::error::TranslateError;
use crate::graph::Node;

/// Expands the splittable ParDo `id` into its three steps' nodes.
pub(super) fn expand(
    b: &mut Builder,
    id: &str,
    transform: &pb::PTransform,
    payload: &pb::ParDoPayload,
) -> Result<Vec<Node>, TranslateError> {
    let name = name_of(id, transform);
    let referrer = format!("transform '{name}'");
    let main: Vec<(&String, &String)> = transform
        .inputs
        .iter()
        .filter(|(tag, _)| !payload.side_inputs.contains_key(*tag))
        .collect();
    let [(main_tag, main_pcoll)] = main.as_slice() else {
        return Err(TranslateError::Invalid(format!(
            "splittable transform '{name}' has {} main inputs; it needs exactly one",
            main.len()
        )));
    };
    let (main_tag, main_pcoll) = ((*main_tag).clone(), (*main_pcoll).clone());
    let input = b.pcollection(&main_pcoll, &referrer)?.clone();
    b.coders.get(&payload.restriction_coder_id, &referrer)?;

    let paired_coder = b.coders.add(
        &format!("{}_with_restriction", input.coder_id),
        c::KV,
        vec![input.coder_id.clone(), payload.restriction_coder_id.clone()],
    );
    let double = b.coders.add("double", c::DOUBLE, Vec::new());
    let sized_coder = b.coders.add(
        &format!("{paired_coder}_sized"),
        c::KV,
        vec![paired_coder.clone(), double],
    );

    let paired = b.add_pcollection(
        &format!("{main_pcoll}_paired"),
        pb::PCollection {
            unique_name: format!("{name}/PairWithRestriction.out"),
            coder_id: paired_coder,
            ..input.clone()
        },
    );
    let sized = b.add_pcollection(
        &format!("{main_pcoll}_split"),
        pb::PCollection {
            unique_name: format!("{name}/SplitAndSizeRestriction.out"),
            coder_id: sized_coder,
            ..input
        },
    );

    let step = |suffix: &str, urn: &str, main_input: &str, outputs| {
        let mut inputs = transform.inputs.clone();
        inputs.insert(main_tag.clone(), main_input.to_string());
        pb::PTransform {
            unique_name: format!("{name}/{suffix}"),
            spec: Some(pb::FunctionSpec {
                urn: urn.to_string(),
                payload: transform
                    .spec
                    .as_ref()
                    .map(|s| s.payload.clone())
                    .unwrap_or_default(),
            }),
            subtransforms: Vec::new(),
            inputs,
            outputs,
            display_data: transform.display_data.clone(),
            environment_id: transform.environment_id.clone(),
            annotations: transform.annotations.clone(),
        }
    };
    let out = |pcoll: &str| {
        [("out".to_string(), pcoll.to_string())]
            .into_iter()
            .collect()
    };

    let pair = step(
        "PairWithRestriction",
        t::SDF_PAIR_WITH_RESTRICTION,
        &main_pcoll,
        out(&paired),
    );
    let split = step(
        "SplitAndSizeRestriction",
        t::SDF_SPLIT_AND_SIZE_RESTRICTIONS,
        &paired,
        out(&sized),
    );
    let mut steps = vec![
        ("PairWithRestriction", pair),
        ("SplitAndSizeRestriction", split),
    ];
    let process_input = if b.drain {
        let truncated = b.add_pcollection(
            &format!("{main_pcoll}_truncated"),
            pb::PCollection {
                unique_name: format!("{name}/TruncateSizedRestriction.out"),
                ..b.pcollection(&sized, &referrer)?.clone()
            },
        );
        steps.push((
            "TruncateSizedRestriction",
            step(
                "TruncateSizedRestriction",
                t::SDF_TRUNCATE_SIZED_RESTRICTIONS,
                &sized,
                out(&truncated),
            ),
        ));
        truncated
    } else {
        sized
    };
    steps.push((
        "Process",
        step(
            "Process",
            t::SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS,
            &process_input,
            transform.outputs.clone(),
        ),
    ));

    let mut nodes = Vec::with_capacity(steps.len());
    for (suffix, step) in steps {
        let step_id = b.add_transform(&format!("{id}/{suffix}"), step.clone());
        nodes.push(b.sdk_node(&step_id, step)?);
    }
    Ok(nodes)
}
