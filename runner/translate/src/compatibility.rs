//! Whether a new version of a pipeline reads the state an old version
//! kept: the coders and windowing of each stateful transform and
//! GroupByKey the two share (by unique name, after a rename).
//!
//! State, timers and GroupByKey buffers are kept encoded, in the coders
//! the pipeline declared: a key encoded by the old key coder must be the
//! same bytes under the new one, or the new job would find none of its
//! keys' state (or, worse, another key's). So a pipeline update (and a
//! start from a savepoint) is refused when a transform both versions have
//! changed its key coder, the coder of a state it keeps, a GroupByKey's
//! value coder, or its input's windowing. Coders are compared as trees of
//! URNs, payloads and components, whatever ids the SDK gave them.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};

use refract_engine::manager::renamed_name;
use refract_proto::pipeline as pb;
use refract_proto::urns;

use crate::coders::MAX_ENGINE_CODER_NODES;
use crate::payloads::{decode_pardo, state_coders};

/// Every reason the state the transforms of `old` keep could not be read
/// by those of `new` (`renamed`: old unique name or prefix → new, `""`:
/// removed, read by [`renamed_name`]), each naming its transform; empty
/// when it can.
pub fn state_compatibility(
    old: &pb::Pipeline,
    new: &pb::Pipeline,
    renamed: &BTreeMap<String, String>,
) -> Vec<String> {
    let (old_side, new_side) = (Side::of(old), Side::of(new));
    let mut refusals = Vec::new();
    for (name, transform) in &old_side.by_name {
        let Some(now_named) = renamed_name(renamed, name) else {
            continue;
        };
        let Some(now) = new_side.by_name.get(now_named.as_str()) else {
            continue;
        };
        refusals.extend(transform_changes(
            name,
            (&old_side, transform),
            (&new_side, now),
        ));
    }
    refusals.sort();
    refusals
}

/// One version of the pipeline, indexed.
struct Side<'a> {
    components: Option<&'a pb::Components>,
    /// Stateful ParDos and GroupByKeys by unique name.
    by_name: HashMap<&'a str, Keeper<'a>>,
    /// A coder tree unfolded past its bounds since this was last reset
    /// (see [`Side::coder_tree`]).
    too_large: Cell<bool>,
}

/// A transform that keeps state by key: a GroupByKey, or a ParDo with
/// state or timers (with its payload, decoded once).
struct Keeper<'a> {
    transform: &'a pb::PTransform,
    /// A ParDo's payload; `None` for a GroupByKey.
    pardo: Option<pb::ParDoPayload>,
}

impl<'a> Keeper<'a> {
    /// `transform`, if it keeps state by key.
    fn of(transform: &'a pb::PTransform) -> Option<Self> {
        let pardo = match urn(transform) {
            urns::transform::GROUP_BY_KEY => None,
            urns::transform::PAR_DO => {
                let payload = decode_pardo(transform, &transform.unique_name).ok()?;
                if payload.state_specs.is_empty() && payload.timer_family_specs.is_empty() {
                    return None;
                }
                Some(payload)
            }
            _ => return None,
        };
        Some(Keeper { transform, pardo })
    }
}

impl<'a> Side<'a> {
    fn of(pipeline: &'a pb::Pipeline) -> Self {
        let components = pipeline.components.as_ref();
        let by_name = components
            .iter()
            .flat_map(|c| c.transforms.values())
            .filter_map(Keeper::of)
            .map(|k| (k.transform.unique_name.as_str(), k))
            .collect();
        Side {
            components,
            by_name,
            too_large: Cell::new(false),
        }
    }

    /// The main input PCollection of `keeper` (its one input that is not
    /// a side input).
    fn main_input(&self, keeper: &Keeper<'_>) -> Option<&'a pb::PCollection> {
        let is_side = |local: &String| {
            (keeper.pardo.as_ref()).is_some_and(|p| p.side_inputs.contains_key(local))
        };
        let (_, id) = keeper
            .transform
            .inputs
            .iter()
            .find(|(local, _)| !is_side(local))?;
        self.components?.pcollections.get(id)
    }

    /// Coder `id` as a tree of URNs, payloads and components (`?` for a
    /// coder the pipeline does not define). Components may share coders,
    /// so a tree can unfold into far more nodes than the pipeline has
    /// coders: past [`MAX_ENGINE_CODER_NODES`] nodes or [`MAX_CODER_DEPTH`]
    /// levels it stops, and says so in `too_large`.
    fn coder_tree(&self, id: &str) -> String {
        let mut budget = MAX_ENGINE_CODER_NODES;
        self.coder_tree_within(id, 0, &mut budget)
    }

    fn coder_tree_within(&self, id: &str, depth: usize, budget: &mut usize) -> String {
        if depth > MAX_CODER_DEPTH || *budget == 0 {
            self.too_large.set(true);
            return "...".into();
        }
        *budget -= 1;
        let Some(coder) = self.components.and_then(|c| c.coders.get(id)) else {
            return "?".into();
        };
        let spec = coder.spec.as_ref();
        let mut tree = spec.map_or("?", |s| s.urn.as_str()).to_string();
        if let Some(spec) = spec.filter(|s| !s.payload.is_empty() && payload_is_stable(&s.urn)) {
            tree.push_str(&format!("#{:x}", hash(&spec.payload)));
        }
        if !coder.component_coder_ids.is_empty() {
            let parts: Vec<String> = coder
                .component_coder_ids
                .iter()
                .map(|c| self.coder_tree_within(c, depth + 1, budget))
                .collect();
            tree.push_str(&format!("({})", parts.join(", ")));
        }
        tree
    }

    /// The key coder (first component of the KV coder) of `pcollection`.
    fn key_coder(&self, pcollection: &pb::PCollection) -> Option<String> {
        self.kv_component(pcollection, 0)
    }

    fn kv_component(&self, pcollection: &pb::PCollection, at: usize) -> Option<String> {
        let coder = self.components?.coders.get(&pcollection.coder_id)?;
        let is_kv = coder
            .spec
            .as_ref()
            .is_some_and(|s| s.urn == urns::coder::KV);
        if !is_kv {
            return None;
        }
        Some(self.coder_tree(coder.component_coder_ids.get(at)?))
    }

    /// `pcollection`'s window function, as URN and payload.
    fn window_fn(&self, pcollection: &pb::PCollection) -> Option<String> {
        let strategy = self
            .components?
            .windowing_strategies
            .get(&pcollection.windowing_strategy_id)?;
        let f = strategy.window_fn.as_ref()?;
        Some(format!("{}#{:x}", f.urn, hash(&f.payload)))
    }

    /// A stateful ParDo's state ids, each with its kind and coders.
    fn states(&self, keeper: &Keeper<'_>) -> BTreeMap<String, String> {
        let Some(payload) = &keeper.pardo else {
            return BTreeMap::new();
        };
        payload
            .state_specs
            .iter()
            .filter_map(|(id, spec)| {
                let spec = spec.spec.as_ref()?;
                let coders: Vec<String> = state_coders(spec)
                    .into_iter()
                    .map(|c| self.coder_tree(c))
                    .collect();
                Some((
                    id.clone(),
                    format!("{} {}", state_kind(spec), coders.join(", ")),
                ))
            })
            .collect()
    }
}

/// Whether a coder's payload says the same thing in the same bytes each
/// time a pipeline is built: Beam's standard coders, whose payloads are
/// protos. An SDK's own coders (Python's pickled ones, Java's serialized
/// ones) pickle or serialize an object whose bytes change between builds
/// of one pipeline; for them only the URN and components are compared.
fn payload_is_stable(urn: &str) -> bool {
    urn.starts_with("beam:coder:") && urn != PICKLED_PYTHON
}

/// The Python SDK's coder of pickled objects (its payload is a pickle).
const PICKLED_PYTHON: &str = "beam:coder:pickled_python:v1";

/// Nesting past which coder trees are not compared (as the engine's own
/// coders nest at most so deep).
const MAX_CODER_DEPTH: usize = 64;

/// What changed between `old` and `new`, two versions of transform
/// `name`, that the old one's state could not be read through.
fn transform_changes(
    name: &str,
    (old_side, old): (&Side<'_>, &Keeper<'_>),
    (new_side, new): (&Side<'_>, &Keeper<'_>),
) -> Vec<String> {
    old_side.too_large.set(false);
    new_side.too_large.set(false);
    let mut changes = Vec::new();
    let (Some(old_input), Some(new_input)) = (old_side.main_input(old), new_side.main_input(new))
    else {
        return changes;
    };
    let mut compare = |what: &str, before: Option<String>, after: Option<String>| {
        if before != after {
            changes.push(format!(
                "'{name}': {what} changed ({} -> {})",
                before.as_deref().unwrap_or("none"),
                after.as_deref().unwrap_or("none")
            ));
        }
    };
    compare(
        "its key coder",
        old_side.key_coder(old_input),
        new_side.key_coder(new_input),
    );
    compare(
        "its input's windowing",
        old_side.window_fn(old_input),
        new_side.window_fn(new_input),
    );
    // A GroupByKey keeps its values too.
    if old.pardo.is_none() {
        compare(
            "its value coder",
            old_side.kv_component(old_input, 1),
            new_side.kv_component(new_input, 1),
        );
    }
    let now = new_side.states(new);
    for (id, kept) in old_side.states(old) {
        if let Some(read) = now.get(&id) {
            compare(&format!("state '{id}'"), Some(kept), Some(read.clone()));
        }
    }
    if old_side.too_large.get() || new_side.too_large.get() {
        // A cut-off tree could hide a change: refuse rather than guess.
        return vec![format!(
            "'{name}': its coders unfold into more than {MAX_ENGINE_CODER_NODES} coders or nest \
             deeper than {MAX_CODER_DEPTH}, too many to compare"
        )];
    }
    changes
}

fn urn(transform: &pb::PTransform) -> &str {
    transform.spec.as_ref().map_or("", |s| s.urn.as_str())
}

/// The kind of state a spec declares.
fn state_kind(spec: &pb::state_spec::Spec) -> &'static str {
    use pb::state_spec::Spec;
    match spec {
        Spec::ReadModifyWriteSpec(_) => "value",
        Spec::BagSpec(_) => "bag",
        Spec::CombiningSpec(_) => "combining",
        Spec::MapSpec(_) => "map",
        Spec::SetSpec(_) => "set",
        Spec::OrderedListSpec(_) => "ordered list",
        Spec::MultimapSpec(_) => "multimap",
    }
}

/// A short, stable hash of payload bytes, to tell payloads apart in a
/// message without printing them.
fn hash(bytes: &[u8]) -> u64 {
    // FNV-1a: stable across builds, unlike the standard library's hasher.
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_proto::prost::Message;

    fn coder(urn: &str, components: &[&str]) -> pb::Coder {
        pb::Coder {
            spec: Some(pb::FunctionSpec {
                urn: urn.into(),
                payload: Vec::new(),
            }),
            component_coder_ids: components.iter().map(|c| c.to_string()).collect(),
        }
    }

    /// A pipeline with one stateful ParDo named `name`, keyed by coder
    /// `key`, keeping a bag of `element`.
    fn pipeline(name: &str, key: &str, element: &str) -> pb::Pipeline {
        let payload = pb::ParDoPayload {
            state_specs: [(
                "seen".to_string(),
                pb::StateSpec {
                    spec: Some(pb::state_spec::Spec::BagSpec(pb::BagStateSpec {
                        element_coder_id: "element".into(),
                    })),
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        };
        let transform = pb::PTransform {
            unique_name: name.into(),
            spec: Some(pb::FunctionSpec {
                urn: urns::transform::PAR_DO.into(),
                payload: payload.encode_to_vec(),
            }),
            inputs: [("in".to_string(), "kvs".to_string())].into(),
            ..Default::default()
        };
        pb::Pipeline {
            components: Some(pb::Components {
                transforms: [("t1".to_string(), transform)].into(),
                pcollections: [(
                    "kvs".to_string(),
                    pb::PCollection {
                        coder_id: "kv".into(),
                        windowing_strategy_id: "w".into(),
                        ..Default::default()
                    },
                )]
                .into(),
                coders: [
                    ("kv".to_string(), coder(urns::coder::KV, &["key", "value"])),
                    ("key".to_string(), coder(key, &[])),
                    ("value".to_string(), coder(urns::coder::BYTES, &[])),
                    ("element".to_string(), coder(element, &[])),
                ]
                .into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_coder_that_unfolds_without_end_is_refused_not_unfolded() {
        // Each coder's two components are the next one: 2^40 nodes.
        let mut old = pipeline("Count", urns::coder::STRING_UTF8, urns::coder::BYTES);
        let coders = &mut old.components.as_mut().expect("components").coders;
        coders.insert("key".into(), coder(urns::coder::KV, &["n0", "n0"]));
        for i in 0..40 {
            let next = format!("n{}", i + 1);
            coders.insert(format!("n{i}"), coder(urns::coder::KV, &[&next, &next]));
        }
        coders.insert("n40".into(), coder(urns::coder::BYTES, &[]));
        let refused = state_compatibility(&old, &old, &BTreeMap::new());
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(refused[0].contains("too many to compare"), "{refused:?}");
    }

    #[test]
    fn a_changed_key_or_state_coder_is_named_and_a_rename_is_followed() {
        let varint = "beam:coder:varint:v1";
        let old = pipeline("Count", urns::coder::STRING_UTF8, varint);
        let none = BTreeMap::new();
        assert!(state_compatibility(&old, &old, &none).is_empty());
        let rekeyed = pipeline("Count", urns::coder::BYTES, varint);
        let refused = state_compatibility(&old, &rekeyed, &none);
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0].starts_with("'Count': its key coder changed"),
            "{refused:?}"
        );
        let restated = pipeline("Counted", urns::coder::STRING_UTF8, urns::coder::BYTES);
        // Another name is another transform, unless the mapping says so.
        assert!(state_compatibility(&old, &restated, &none).is_empty());
        let renamed: BTreeMap<String, String> = [("Count".into(), "Counted".into())].into();
        let refused = state_compatibility(&old, &restated, &renamed);
        assert!(
            refused[0].starts_with("'Count': state 'seen' changed"),
            "{refused:?}"
        );
    }
}
