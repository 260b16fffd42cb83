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

use std::collections::HashMap;

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
    let (main_tag, main_pcoll) = main_input(transform, payload, &name)?;
    let sdf = Splittable {
        name,
        transform,
        main_tag,
        main_pcoll,
    };
    let (paired, sized) = sdf.add_restriction_pcollections(b, payload, &referrer)?;
    let steps = sdf.steps(b, paired, sized, &referrer)?;
    let mut nodes = Vec::with_capacity(steps.len());
    for (suffix, step) in steps {
        let step_id = b.add_transform(&format!("{id}/{suffix}"), step.clone());
        nodes.push(b.sdk_node(&step_id, step)?);
    }
    Ok(nodes)
}

/// The (tag, PCollection) of the one main input (the inputs that are not
/// side inputs) of splittable `transform`, named `name`; an error unless
/// there is exactly one.
fn main_input(
    transform: &pb::PTransform,
    payload: &pb::ParDoPayload,
    name: &str,
) -> Result<(String, String), TranslateError> {
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
    Ok(((*main_tag).clone(), (*main_pcoll).clone()))
}

/// The outputs of a step that writes `pcoll`.
fn out(pcoll: &str) -> HashMap<String, String> {
    [("out".to_string(), pcoll.to_string())]
        .into_iter()
        .collect()
}

/// A splittable ParDo being expanded: what its steps take from it.
struct Splittable<'a> {
    /// Its unique name, the prefix of its steps' names.
    name: String,
    /// The ParDo, whose payload, side inputs, display data, environment and
    /// annotations every step keeps.
    transform: &'a pb::PTransform,
    /// The local tag of its main input.
    main_tag: String,
    /// Its main input PCollection.
    main_pcoll: String,
}

impl Splittable<'_> {
    /// Adds the PCollections between pairing and splitting (`KV<I, R>`)
    /// and between splitting and processing (`KV<KV<I, R>, double>`), like
    /// the main input but for their coders. Returns their ids.
    fn add_restriction_pcollections(
        &self,
        b: &mut Builder,
        payload: &pb::ParDoPayload,
        referrer: &str,
    ) -> Result<(String, String), TranslateError> {
        let name = &self.name;
        let main_pcoll = &self.main_pcoll;
        let input = b.pcollection(main_pcoll, referrer)?.clone();
        b.coders.get(&payload.restriction_coder_id, referrer)?;

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
        Ok((paired, sized))
    }

    /// The steps (id suffix, transform) in order: pair, split and size,
    /// truncate (only when the job drains, with its output PCollection
    /// added here) and process, joined by `paired` and `sized`.
    fn steps(
        &self,
        b: &mut Builder,
        paired: String,
        sized: String,
        referrer: &str,
    ) -> Result<Vec<(&'static str, pb::PTransform)>, TranslateError> {
        let pair = self.step(
            "PairWithRestriction",
            t::SDF_PAIR_WITH_RESTRICTION,
            &self.main_pcoll,
            out(&paired),
        );
        let split = self.step(
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
                &format!("{}_truncated", self.main_pcoll),
                pb::PCollection {
                    unique_name: format!("{}/TruncateSizedRestriction.out", self.name),
                    ..b.pcollection(&sized, referrer)?.clone()
                },
            );
            steps.push((
                "TruncateSizedRestriction",
                self.step(
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
            self.step(
                "Process",
                t::SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS,
                &process_input,
                self.transform.outputs.clone(),
            ),
        ));
        Ok(steps)
    }

    /// Step `suffix` of URN `urn`: the ParDo with its main input replaced
    /// by `main_input` and its outputs by `outputs`.
    fn step(
        &self,
        suffix: &str,
        urn: &str,
        main_input: &str,
        outputs: HashMap<String, String>,
    ) -> pb::PTransform {
        let transform = self.transform;
        let mut inputs = transform.inputs.clone();
        inputs.insert(self.main_tag.clone(), main_input.to_string());
        pb::PTransform {
            unique_name: format!("{}/{suffix}", self.name),
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
    }
}
