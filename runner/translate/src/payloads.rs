//! ParDo and combine payloads: decoding them, rejecting what Refract does
//! not implement, and extracting the facts fusion needs (side inputs, keyed
//! state, finalization).

use refract_engine::plan::SideInputAccess;
use refract_proto::pipeline as pb;
use refract_proto::prost::Message;
use refract_proto::urns::{self, transform as t};

use crate::coders::Coders;
use crate::error::TranslateError;
use crate::graph::SideIn;

/// URNs whose ParDoPayload carries side inputs, state and timers.
pub(crate) const PARDO_LIKE: &[&str] = &[
    t::PAR_DO,
    t::SDF_PAIR_WITH_RESTRICTION,
    t::SDF_SPLIT_AND_SIZE_RESTRICTIONS,
    t::SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS,
    t::SDF_TRUNCATE_SIZED_RESTRICTIONS,
];

/// Combine steps whose payload is a CombinePayload.
pub(crate) const COMBINE_STEPS: &[&str] = &[
    t::COMBINE_PER_KEY_PRECOMBINE,
    t::COMBINE_PER_KEY_MERGE_ACCUMULATORS,
    t::COMBINE_PER_KEY_EXTRACT_OUTPUTS,
    t::COMBINE_PER_KEY_CONVERT_TO_ACCUMULATORS,
    t::COMBINE_GROUPED_VALUES,
];

/// What fusion and the engine need to know about a ParDo-like transform.
pub(crate) struct ParDoFacts {
    /// Its side inputs, sorted by tag.
    pub side_inputs: Vec<SideIn>,
    /// It declares user state or timers.
    pub keyed_state: bool,
    /// It requests bundle finalization.
    pub finalization: bool,
    /// The timer family the runner fires for each key and window when the
    /// window expires (Java's `@OnWindowExpiration`).
    pub window_expiration_family: Option<String>,
    /// Its input must arrive sorted by event time (`@RequiresTimeSortedInput`).
    pub time_sorted_input: bool,
    /// Its input must be durable before it sees it (`@RequiresStableInput`).
    pub stable_input: bool,
}

/// Decodes and checks a ParDo-like transform's payload.
pub(crate) fn pardo_facts(
    transform: &pb::PTransform,
    name: &str,
    coders: &Coders,
) -> Result<ParDoFacts, TranslateError> {
    let payload = decode_pardo(transform, name)?;
    check_pardo(&payload, name, coders)?;
    let mut side_inputs = Vec::new();
    for (tag, spec) in sorted_side_inputs(&payload) {
        let pcoll = transform.inputs.get(&tag).cloned().ok_or_else(|| {
            TranslateError::Invalid(format!(
                "transform '{name}' declares side input '{tag}' but has no such input"
            ))
        })?;
        let access_urn = spec.access_pattern.as_ref().map_or("", |a| a.urn.as_str());
        let access = match access_urn {
            urns::side_input::ITERABLE => SideInputAccess::Iterable,
            urns::side_input::MULTIMAP => SideInputAccess::Multimap,
            other => {
                return Err(TranslateError::unsupported(
                    format!("side input access pattern '{other}'"),
                    format!("side input '{tag}' of transform '{name}'"),
                ))
            }
        };
        side_inputs.push(SideIn { tag, pcoll, access });
    }
    let window_expiration_family =
        Some(payload.on_window_expiration_timer_family_spec.clone()).filter(|f| !f.is_empty());
    Ok(ParDoFacts {
        side_inputs,
        keyed_state: !payload.state_specs.is_empty()
            || !payload.timer_family_specs.is_empty()
            || window_expiration_family.is_some()
            || payload.requires_time_sorted_input,
        finalization: payload.requests_finalization,
        window_expiration_family,
        time_sorted_input: payload.requires_time_sorted_input,
        stable_input: payload.requires_stable_input,
    })
}

/// Rejects ParDo features Refract does not implement, and dangling coder ids.
fn check_pardo(
    payload: &pb::ParDoPayload,
    name: &str,
    coders: &Coders,
) -> Result<(), TranslateError> {
    let expiration = &payload.on_window_expiration_timer_family_spec;
    if !expiration.is_empty() {
        // The runner fires this family itself, so it must be an event-time
        // family the transform declares.
        let declared = payload
            .timer_family_specs
            .get(expiration)
            .is_some_and(|spec| spec.time_domain == pb::time_domain::Enum::EventTime as i32);
        if !declared {
            return Err(TranslateError::Invalid(format!(
                "transform '{name}' names '{expiration}' as its window-expiration timer family \
                 ('{}') but declares no event-time timer family of that name",
                urns::requirement::ON_WINDOW_EXPIRATION
            )));
        }
    }
    let mut states: Vec<(&String, &pb::StateSpec)> = payload.state_specs.iter().collect();
    states.sort_by(|a, b| a.0.cmp(b.0));
    for (state_id, spec) in states {
        let spec_location = format!("state '{state_id}' of transform '{name}'");
        let protocol = spec.protocol.as_ref().map_or("", |p| p.urn.as_str());
        if !matches!(
            protocol,
            "" | urns::user_state::BAG
                | urns::user_state::MULTIMAP
                | urns::user_state::ORDERED_LIST
        ) {
            return Err(TranslateError::unsupported(
                format!("user state protocol '{protocol}'"),
                spec_location,
            ));
        }
        let Some(kind) = &spec.spec else {
            return Err(TranslateError::Invalid(format!(
                "{spec_location} has no spec"
            )));
        };
        for coder in state_coders(kind) {
            coders.get(coder, &spec_location)?;
        }
    }
    let mut families: Vec<(&String, &pb::TimerFamilySpec)> =
        payload.timer_family_specs.iter().collect();
    families.sort_by(|a, b| a.0.cmp(b.0));
    for (family, spec) in families {
        let spec_location = format!("timer family '{family}' of transform '{name}'");
        match pb::time_domain::Enum::try_from(spec.time_domain) {
            Ok(pb::time_domain::Enum::EventTime | pb::time_domain::Enum::ProcessingTime) => {}
            _ => {
                return Err(TranslateError::unsupported(
                    format!("timer time domain {}", spec.time_domain),
                    spec_location,
                ))
            }
        }
        coders.components_of(
            &spec.timer_family_coder_id,
            urns::coder::TIMER,
            &spec_location,
        )?;
    }
    if !payload.restriction_coder_id.is_empty() {
        coders.get(
            &payload.restriction_coder_id,
            &format!("transform '{name}'"),
        )?;
    }
    Ok(())
}

/// Decodes a ParDo-like transform's payload.
pub(crate) fn decode_pardo(
    transform: &pb::PTransform,
    name: &str,
) -> Result<pb::ParDoPayload, TranslateError> {
    let bytes = transform
        .spec
        .as_ref()
        .map_or(&[][..], |s| s.payload.as_slice());
    pb::ParDoPayload::decode(bytes)
        .map_err(|e| TranslateError::bad_payload("ParDoPayload", format!("transform '{name}'"), e))
}

/// Decodes a combine step's payload.
pub(crate) fn decode_combine(
    transform: &pb::PTransform,
    name: &str,
) -> Result<pb::CombinePayload, TranslateError> {
    let bytes = transform
        .spec
        .as_ref()
        .map_or(&[][..], |s| s.payload.as_slice());
    pb::CombinePayload::decode(bytes).map_err(|e| {
        TranslateError::bad_payload("CombinePayload", format!("transform '{name}'"), e)
    })
}

/// Side inputs sorted by tag, for a deterministic plan.
fn sorted_side_inputs(payload: &pb::ParDoPayload) -> Vec<(String, pb::SideInput)> {
    let mut entries: Vec<(String, pb::SideInput)> = payload
        .side_inputs
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries
}

/// The coder ids a state spec refers to.
pub(crate) fn state_coders(spec: &pb::state_spec::Spec) -> Vec<&String> {
    use pb::state_spec::Spec;
    match spec {
        Spec::ReadModifyWriteSpec(s) => vec![&s.coder_id],
        Spec::BagSpec(s) => vec![&s.element_coder_id],
        Spec::CombiningSpec(s) => vec![&s.accumulator_coder_id],
        Spec::MapSpec(s) => vec![&s.key_coder_id, &s.value_coder_id],
        Spec::SetSpec(s) => vec![&s.element_coder_id],
        Spec::OrderedListSpec(s) => vec![&s.element_coder_id],
        Spec::MultimapSpec(s) => vec![&s.key_coder_id, &s.value_coder_id],
    }
}
