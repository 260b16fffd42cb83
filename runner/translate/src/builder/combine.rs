//! Combiner lifting.
//!
//! Python pre-lifts `combine_per_key` in batch; streaming pipelines and Java
//! submit the composite unlifted. When the input's trigger allows it (it
//! must not need to observe every element), the composite becomes:
//! `Precombine` (SDK, fused with the producer: partial combining before the
//! shuffle) → `Group` (the runner's GroupByKey) → `Merge` and
//! `ExtractOutputs` (SDK, after the shuffle). All three SDK steps carry the
//! composite's CombinePayload. Otherwise the composite's own subtransforms
//! are executed.

use std::collections::HashMap;

use refract_proto::pipeline as pb;
use refract_proto::urns::{coder as c, transform as t};

use super::{name_of, Builder};
use crate::error::TranslateError;
use crate::graph::{Node, NodeKind};
use crate::payloads::decode_combine;
use crate::windowing;

/// The lifted nodes of combine_per_key `id`, or `None` when it must run
/// unlifted (incompatible trigger, non-KV input, or no environment).
pub(super) fn lift(
    b: &mut Builder,
    id: &str,
    transform: &pb::PTransform,
) -> Result<Option<Vec<Node>>, TranslateError> {
    let name = name_of(id, transform);
    let referrer = format!("transform '{name}'");
    let payload = decode_combine(transform, &name)?;
    let accumulator = payload.accumulator_coder_id;
    let Some(io) = liftable(b, transform, &accumulator, &referrer)? else {
        return Ok(None);
    };
    let pcolls = add_intermediates(b, id, &name, &accumulator, io);
    add_steps(b, id, &name, transform, &pcolls).map(Some)
}

/// The input and output of a combine_per_key that may be lifted, and its
/// key coder.
struct Liftable {
    /// The KV input PCollection.
    input: pb::PCollection,
    /// The output PCollection.
    output: pb::PCollection,
    /// The input's key coder.
    key: String,
}

/// What lifting `transform` needs, or `None` when it must run unlifted:
/// it has an environment, one input and one output, its input's trigger
/// allows lifting and its input is a KV. Errors when a PCollection, the
/// windowing strategy or the coder `accumulator` is missing.
fn liftable(
    b: &Builder,
    transform: &pb::PTransform,
    accumulator: &str,
    referrer: &str,
) -> Result<Option<Liftable>, TranslateError> {
    if transform.environment_id.is_empty()
        || transform.inputs.len() != 1
        || transform.outputs.len() != 1
    {
        return Ok(None);
    }
    let (Some(input_id), Some(output_id)) = (
        transform.inputs.values().next(),
        transform.outputs.values().next(),
    ) else {
        return Ok(None);
    };
    let input = b.pcollection(input_id, referrer)?.clone();
    let output = b.pcollection(output_id, referrer)?.clone();
    let ws = b
        .components
        .windowing_strategies
        .get(&input.windowing_strategy_id)
        .ok_or_else(|| {
            TranslateError::missing(
                "windowing strategy",
                &input.windowing_strategy_id,
                format!("PCollection '{input_id}'"),
            )
        })?;
    if !windowing::allows_combiner_lifting(ws.trigger.as_ref()) {
        return Ok(None);
    }
    if b.coders.urn(&input.coder_id, referrer)? != c::KV {
        return Ok(None);
    }
    let Ok(kv) = b.coders.components_of(&input.coder_id, c::KV, referrer) else {
        return Ok(None);
    };
    b.coders.get(accumulator, referrer)?;
    let key = kv[0].clone();
    Ok(Some(Liftable { input, output, key }))
}

/// The PCollections between the lifted steps.
struct Intermediates {
    /// Precombine → Group: `KV<key, accumulator>`.
    precombined: String,
    /// Group → Merge: `KV<key, iterable<accumulator>>`.
    grouped: String,
    /// Merge → ExtractOutputs: `KV<key, accumulator>`.
    merged: String,
}

/// Adds the coders and PCollections between the lifted steps of
/// combine_per_key `id` (unique name `name`): the Precombine output is
/// like the input, the others like the output, with the accumulator
/// coders.
fn add_intermediates(
    b: &mut Builder,
    id: &str,
    name: &str,
    accumulator: &str,
    io: Liftable,
) -> Intermediates {
    let Liftable { input, output, key } = io;
    let key_acc = b.coders.add(
        &format!("{accumulator}_keyed"),
        c::KV,
        vec![key.clone(), accumulator.to_string()],
    );
    let acc_iter = b.coders.add(
        &format!("{accumulator}_iterable"),
        c::ITERABLE,
        vec![accumulator.to_string()],
    );
    let key_acc_iter = b
        .coders
        .add(&format!("{acc_iter}_keyed"), c::KV, vec![key, acc_iter]);

    let pcoll = |suffix: &str, coder_id: &str, like: &pb::PCollection| pb::PCollection {
        unique_name: format!("{name}/{suffix}.out"),
        coder_id: coder_id.to_string(),
        ..like.clone()
    };
    let precombined = b.add_pcollection(
        &format!("{id}/Precombine.out"),
        pcoll("Precombine", &key_acc, &input),
    );
    let grouped = b.add_pcollection(
        &format!("{id}/Group.out"),
        pcoll("Group", &key_acc_iter, &output),
    );
    let merged = b.add_pcollection(
        &format!("{id}/Merge.out"),
        pcoll("Merge", &key_acc, &output),
    );
    Intermediates {
        precombined,
        grouped,
        merged,
    }
}

/// Adds the four lifted steps of combine_per_key `transform` (id `id`,
/// unique name `name`) joined by `pcolls`, and returns their nodes: the
/// SDK steps carry the composite's payload and environment, the Group
/// step is the runner's.
fn add_steps(
    b: &mut Builder,
    id: &str,
    name: &str,
    transform: &pb::PTransform,
    pcolls: &Intermediates,
) -> Result<Vec<Node>, TranslateError> {
    let single = |tag: &str, pcoll: &str| -> HashMap<String, String> {
        [(tag.to_string(), pcoll.to_string())].into_iter().collect()
    };
    let payload = transform
        .spec
        .as_ref()
        .map(|s| s.payload.clone())
        .unwrap_or_default();
    // (name suffix, URN, inputs, outputs); the Group step is the runner's.
    let steps = [
        (
            "Precombine",
            t::COMBINE_PER_KEY_PRECOMBINE,
            transform.inputs.clone(),
            single("out", &pcolls.precombined),
        ),
        (
            "Group",
            t::GROUP_BY_KEY,
            single("in", &pcolls.precombined),
            single("out", &pcolls.grouped),
        ),
        (
            "Merge",
            t::COMBINE_PER_KEY_MERGE_ACCUMULATORS,
            single("in", &pcolls.grouped),
            single("out", &pcolls.merged),
        ),
        (
            "ExtractOutputs",
            t::COMBINE_PER_KEY_EXTRACT_OUTPUTS,
            single("in", &pcolls.merged),
            transform.outputs.clone(),
        ),
    ];
    let mut nodes = Vec::with_capacity(steps.len());
    for (suffix, urn, inputs, outputs) in steps {
        let sdk = urn != t::GROUP_BY_KEY;
        let step = pb::PTransform {
            unique_name: format!("{name}/{suffix}"),
            spec: Some(pb::FunctionSpec {
                urn: urn.to_string(),
                payload: if sdk { payload.clone() } else { Vec::new() },
            }),
            subtransforms: Vec::new(),
            inputs,
            outputs,
            display_data: Vec::new(),
            environment_id: if sdk {
                transform.environment_id.clone()
            } else {
                String::new()
            },
            annotations: transform.annotations.clone(),
        };
        let step_id = b.add_transform(&format!("{id}/{suffix}"), step.clone());
        if sdk {
            nodes.push(b.sdk_node(&step_id, step)?);
        } else {
            let name = step.unique_name.clone();
            nodes.push(Node::runner(&step_id, &name, NodeKind::GroupByKey, step));
        }
    }
    Ok(nodes)
}
