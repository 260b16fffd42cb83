//! A job's strict mode, from its options: `--experiments=refract_strict`
//! turns it on (the engine's `Strictness`: bundles run twice, cut small and
//! reordered, as any runner may); `refract_strict=coders` also keeps the
//! pipeline's root transforms out of each other's stages, so every element
//! passing between them crosses its coder (each extra stage costs the SDK
//! a bundle processor per job: a small test runs about 45% longer);
//! `refract_strict=off` turns it off whatever else the list says (a test
//! harness that adds the first lets a user's own flag win), and
//! `refract_strict_seed=N` repeats a run's choices. `pytest --refract` and
//! `TestRefractRunner` turn it on.

use refract_engine::manager::Strictness;

use crate::options::{experiment_value, experiments};

/// The experiment that turns strict mode on (bare, or `=on`) or off
/// (`=off`).
pub const STRICT_EXPERIMENT: &str = "refract_strict";

/// The experiment fixing strict mode's seed: `refract_strict_seed=N`.
pub const STRICT_SEED_EXPERIMENT: &str = "refract_strict_seed";

/// The strict mode a job's options ask for, or why they cannot be read.
/// Without a seed, a fresh random one.
pub(crate) fn strictness(options: &prost_types::Struct) -> Result<Option<Strictness>, String> {
    let mut on = false;
    let mut coders = false;
    for entry in experiments(options) {
        let value = match entry.strip_prefix(STRICT_EXPERIMENT) {
            Some("") => "on",
            Some(rest) => match rest.strip_prefix('=') {
                Some(value) => value,
                None => continue, // another experiment (refract_strict_seed=...)
            },
            None => continue,
        };
        match value {
            "on" => on = true,
            "coders" => {
                on = true;
                coders = true;
            }
            "off" => return Ok(None),
            other => {
                return Err(format!(
                    "--experiments={STRICT_EXPERIMENT}={other}: expected 'on', 'coders' or 'off'"
                ))
            }
        }
    }
    let seed = match experiment_value(options, STRICT_SEED_EXPERIMENT) {
        Some(text) => text.parse::<u64>().map_err(|_| {
            format!("--experiments={STRICT_SEED_EXPERIMENT}={text}: expected a whole number")
        })?,
        None => fresh_seed(),
    };
    Ok(on.then_some(Strictness { seed, coders }))
}

/// A seed no other job is likely to have: std's per-process random hash
/// keys (which change with every hasher built), mixed with the time.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    hasher.write_u128(nanos);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::value::Kind;
    use prost_types::{ListValue, Struct, Value};

    fn with_experiments(list: &[&str]) -> Struct {
        let values = list
            .iter()
            .map(|e| Value {
                kind: Some(Kind::StringValue(e.to_string())),
            })
            .collect();
        Struct {
            fields: [(
                "beam:option:experiments:v1".to_string(),
                Value {
                    kind: Some(Kind::ListValue(ListValue { values })),
                },
            )]
            .into(),
        }
    }

    #[test]
    fn on_off_and_seed() {
        assert_eq!(strictness(&with_experiments(&[])), Ok(None));
        assert_eq!(
            strictness(&with_experiments(&[
                "refract_strict",
                "refract_strict_seed=42"
            ])),
            Ok(Some(Strictness {
                seed: 42,
                coders: false
            }))
        );
        assert_eq!(
            strictness(&with_experiments(&[
                "refract_strict=on",
                "refract_strict_seed=7"
            ])),
            Ok(Some(Strictness {
                seed: 7,
                coders: false
            }))
        );
        // Coders, beside on or alone, turn on both.
        assert_eq!(
            strictness(&with_experiments(&[
                "refract_strict",
                "refract_strict=coders",
                "refract_strict_seed=7"
            ])),
            Ok(Some(Strictness {
                seed: 7,
                coders: true
            }))
        );
        assert_eq!(
            strictness(&with_experiments(&[
                "refract_strict=coders",
                "refract_strict=off"
            ])),
            Ok(None)
        );
        // Off wins, wherever it is.
        assert_eq!(
            strictness(&with_experiments(&["refract_strict", "refract_strict=off"])),
            Ok(None)
        );
        assert_eq!(
            strictness(&with_experiments(&["refract_strict=off", "refract_strict"])),
            Ok(None)
        );
        // A seed alone does not turn it on.
        assert_eq!(
            strictness(&with_experiments(&["refract_strict_seed=3"])),
            Ok(None)
        );
        assert!(strictness(&with_experiments(&["refract_strict"])).is_ok_and(|s| s.is_some()));
    }

    #[test]
    fn a_bad_value_is_refused_naming_it() {
        let err = strictness(&with_experiments(&["refract_strict=maybe"])).unwrap_err();
        assert!(err.contains("refract_strict=maybe"), "{err}");
        let err = strictness(&with_experiments(&[
            "refract_strict",
            "refract_strict_seed=x",
        ]))
        .unwrap_err();
        assert!(err.contains("refract_strict_seed=x"), "{err}");
    }
}
