//! The environments a job's workers run in, as Refract starts them.
//!
//! A pipeline names an environment per transform. Most name one way to
//! start a worker (EXTERNAL, PROCESS, DOCKER; LOOPBACK arrives as EXTERNAL).
//! An expansion service answers with `beam:env:anyof:v1` instead: a list of
//! alternatives, any of which runs its transforms — Java's service, run
//! with `--alsoStartLoopbackWorker`, offers its Java container image and
//! its own worker pool. The runner picks one per environment before
//! anything else looks at the pipeline, so fusion, coders (which read
//! capabilities) and worker start see one concrete environment under the
//! original id.
//!
//! The pick follows an [`EnvironmentPreference`]: by default EXTERNAL, then
//! PROCESS, then DOCKER (the order Prism uses: a pool that is already
//! running beats a process to start, which beats a container), the first
//! alternative of the first kind present. Alternatives Refract cannot start
//! are never picked; an environment without any it can start is refused at
//! `Prepare`, naming what it offered.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use refract_proto::pipeline as pb;
use refract_proto::urns::env::{self, ANY_OF};

use crate::error::TranslateError;

/// A way of starting SDK workers that Refract implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvironmentKind {
    /// A worker pool already running (`beam:env:external:v1`).
    External,
    /// A boot command on this machine (`beam:env:process:v1`).
    Process,
    /// A container image (`beam:env:docker:v1`).
    Docker,
}

impl EnvironmentKind {
    /// The kind of environment `urn` names, if Refract can start it.
    pub fn of_urn(urn: &str) -> Option<Self> {
        match urn {
            env::EXTERNAL => Some(EnvironmentKind::External),
            env::PROCESS => Some(EnvironmentKind::Process),
            env::DOCKER => Some(EnvironmentKind::Docker),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            EnvironmentKind::External => "external",
            EnvironmentKind::Process => "process",
            EnvironmentKind::Docker => "docker",
        }
    }
}

/// Which alternative of an AnyOf environment to start: kinds in order of
/// preference. Kinds left out are picked only when no listed kind is
/// offered, so a preference never makes a pipeline unrunnable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentPreference(Vec<EnvironmentKind>);

impl Default for EnvironmentPreference {
    fn default() -> Self {
        EnvironmentPreference(vec![
            EnvironmentKind::External,
            EnvironmentKind::Process,
            EnvironmentKind::Docker,
        ])
    }
}

/// Why a preference could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PreferenceError {
    /// A word that is not an environment kind.
    #[error("unknown environment kind '{0}' (expected external, process or docker)")]
    UnknownKind(String),
    /// A kind listed twice.
    #[error("environment kind '{0}' is listed twice")]
    Repeated(String),
    /// Nothing listed.
    #[error("the preference lists no environment kind")]
    Empty,
}

impl FromStr for EnvironmentPreference {
    type Err = PreferenceError;

    /// Reads `external,process,docker` (any order, any subset, any case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut kinds = Vec::new();
        for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let kind = match word.to_ascii_lowercase().as_str() {
                "external" => EnvironmentKind::External,
                "process" => EnvironmentKind::Process,
                "docker" => EnvironmentKind::Docker,
                _ => return Err(PreferenceError::UnknownKind(word.to_string())),
            };
            if kinds.contains(&kind) {
                return Err(PreferenceError::Repeated(word.to_string()));
            }
            kinds.push(kind);
        }
        if kinds.is_empty() {
            return Err(PreferenceError::Empty);
        }
        Ok(EnvironmentPreference(kinds))
    }
}

impl fmt::Display for EnvironmentPreference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|k| k.name()).collect();
        f.write_str(&names.join(","))
    }
}

impl EnvironmentPreference {
    /// The rank of `kind`: listed kinds first, in order, then the rest.
    fn rank(&self, kind: EnvironmentKind) -> usize {
        self.0
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(self.0.len())
    }
}

/// `pipeline` with every environment one Refract starts as it is: AnyOf
/// environments replaced by their preferred alternative (borrowed when
/// there is none). Refuses environments Refract cannot start, naming them.
pub(crate) fn resolve<'p>(
    pipeline: &'p pb::Pipeline,
    preference: &EnvironmentPreference,
) -> Result<Cow<'p, pb::Pipeline>, TranslateError> {
    let Some(components) = &pipeline.components else {
        return Ok(Cow::Borrowed(pipeline));
    };
    let mut ids: Vec<&String> = components.environments.keys().collect();
    ids.sort();
    let mut picked = Vec::new();
    for id in ids {
        let Some(environment) = components.environments.get(id) else {
            continue;
        };
        match environment.urn.as_str() {
            urn if EnvironmentKind::of_urn(urn).is_some() => {}
            ANY_OF => picked.push((id.clone(), pick(id, environment, preference)?)),
            env::EMBEDDED_PYTHON | env::EMBEDDED_PYTHON_GRPC | env::EMBEDDED_PYTHON_LOOPBACK => {
                return Err(TranslateError::EmbeddedEnvironment {
                    urn: environment.urn.clone(),
                    id: id.clone(),
                })
            }
            other => {
                return Err(TranslateError::UnsupportedEnvironment {
                    urn: other.to_string(),
                    id: id.clone(),
                })
            }
        }
    }
    if picked.is_empty() {
        return Ok(Cow::Borrowed(pipeline));
    }
    let mut resolved = pipeline.clone();
    if let Some(components) = resolved.components.as_mut() {
        for (id, environment) in picked {
            tracing::info!(
                environment = %id,
                urn = %environment.urn,
                "picked an alternative of an AnyOf environment"
            );
            components.environments.insert(id, environment);
        }
    }
    Ok(Cow::Owned(resolved))
}

/// The alternative of AnyOf environment `outer` (id `id`) to start. What
/// the runner provisions for the environment (its dependencies, which the
/// client staged under the outer id) and what it may assume of it (its
/// capabilities) stay the outer environment's unless the alternative
/// states its own.
fn pick(
    id: &str,
    outer: &pb::Environment,
    preference: &EnvironmentPreference,
) -> Result<pb::Environment, TranslateError> {
    let alternatives =
        refract_proto::any_of::alternatives(outer).map_err(|e| TranslateError::InvalidAnyOf {
            id: id.to_string(),
            reason: e.to_string(),
        })?;
    let best = alternatives
        .iter()
        .filter_map(|e| EnvironmentKind::of_urn(&e.urn).map(|kind| (preference.rank(kind), e)))
        .min_by_key(|(rank, _)| *rank)
        .map(|(_, e)| e);
    let Some(best) = best else {
        let offered: Vec<&str> = alternatives.iter().map(|e| e.urn.as_str()).collect();
        return Err(TranslateError::NoStartableAlternative {
            id: id.to_string(),
            offered: offered.join(", "),
        });
    };
    let mut chosen = best.clone();
    if chosen.dependencies.is_empty() {
        chosen.dependencies = outer.dependencies.clone();
    }
    if chosen.capabilities.is_empty() {
        chosen.capabilities = outer.capabilities.clone();
    }
    if chosen.resource_hints.is_empty() {
        chosen.resource_hints = outer.resource_hints.clone();
    }
    if chosen.display_data.is_empty() {
        chosen.display_data = outer.display_data.clone();
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_proto::any_of::{MAX_ALTERNATIVES, MAX_DEPTH as MAX_ANY_OF_DEPTH};
    use refract_proto::prost::Message;

    fn environment(urn: &str, tag: &str) -> pb::Environment {
        pb::Environment {
            urn: urn.to_string(),
            payload: tag.as_bytes().to_vec(),
            ..Default::default()
        }
    }

    fn any_of(alternatives: Vec<pb::Environment>) -> pb::Environment {
        pb::Environment {
            urn: ANY_OF.to_string(),
            payload: pb::AnyOfEnvironmentPayload {
                environments: alternatives,
            }
            .encode_to_vec(),
            ..Default::default()
        }
    }

    fn pipeline_of(environments: Vec<(&str, pb::Environment)>) -> pb::Pipeline {
        pb::Pipeline {
            components: Some(pb::Components {
                environments: environments
                    .into_iter()
                    .map(|(id, e)| (id.to_string(), e))
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The (urn, payload tag) the pipeline's environment `id` resolves to.
    fn resolved(pipeline: &pb::Pipeline, preference: &str) -> (String, String) {
        let preference: EnvironmentPreference = preference.parse().expect("a preference");
        let resolved = resolve(pipeline, &preference).expect("resolves");
        let e = &resolved
            .components
            .as_ref()
            .expect("components")
            .environments["java"];
        (
            e.urn.clone(),
            String::from_utf8(e.payload.to_vec()).expect("a tag"),
        )
    }

    #[test]
    fn the_preferred_kind_wins_and_the_first_of_it_among_equals() {
        let p = pipeline_of(vec![(
            "java",
            any_of(vec![
                environment(env::DOCKER, "image"),
                environment(env::EXTERNAL, "pool-1"),
                environment(env::PROCESS, "boot"),
                environment(env::EXTERNAL, "pool-2"),
            ]),
        )]);
        let external = (env::EXTERNAL.to_string(), "pool-1".to_string());
        assert_eq!(resolved(&p, "external,process,docker"), external);
        assert_eq!(
            resolved(&p, "docker"),
            (env::DOCKER.to_string(), "image".to_string())
        );
        // Kinds left out still run when nothing listed is offered.
        let docker_only = pipeline_of(vec![(
            "java",
            any_of(vec![
                environment("beam:env:unknown:v1", "x"),
                environment(env::DOCKER, "image"),
            ]),
        )]);
        assert_eq!(
            resolved(&docker_only, "external,process"),
            (env::DOCKER.to_string(), "image".to_string())
        );
    }

    #[test]
    fn nested_lists_keep_their_order() {
        let p = pipeline_of(vec![(
            "java",
            any_of(vec![
                environment(env::DOCKER, "outer-image"),
                any_of(vec![
                    environment(env::PROCESS, "nested-boot"),
                    environment(env::EXTERNAL, "nested-pool"),
                ]),
                environment(env::EXTERNAL, "outer-pool"),
            ]),
        )]);
        assert_eq!(
            resolved(&p, "external"),
            (env::EXTERNAL.to_string(), "nested-pool".to_string())
        );
        assert_eq!(
            resolved(&p, "process"),
            (env::PROCESS.to_string(), "nested-boot".to_string())
        );
    }

    #[test]
    fn the_outer_dependencies_and_capabilities_stay_unless_the_pick_has_its_own() {
        let mut outer = any_of(vec![environment(env::EXTERNAL, "pool")]);
        outer.capabilities = vec!["beam:coder:bytes:v1".to_string()];
        outer.dependencies = vec![pb::ArtifactInformation {
            type_urn: "beam:artifact:type:file:v1".to_string(),
            ..Default::default()
        }];
        let p = pipeline_of(vec![("java", outer)]);
        let resolved = resolve(&p, &EnvironmentPreference::default()).expect("resolves");
        let e = &resolved
            .components
            .as_ref()
            .expect("components")
            .environments["java"];
        assert_eq!(e.urn, env::EXTERNAL);
        assert_eq!(e.capabilities, vec!["beam:coder:bytes:v1".to_string()]);
        assert_eq!(e.dependencies.len(), 1);
    }

    #[test]
    fn pipelines_without_any_of_are_borrowed() {
        let p = pipeline_of(vec![("py", environment(env::EXTERNAL, "pool"))]);
        assert!(matches!(
            resolve(&p, &EnvironmentPreference::default()),
            Ok(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn unstartable_and_malformed_alternatives_are_refused_by_name() {
        let p = pipeline_of(vec![(
            "java",
            any_of(vec![environment(env::EMBEDDED_PYTHON, "x")]),
        )]);
        let e = resolve(&p, &EnvironmentPreference::default()).expect_err("refused");
        let text = e.to_string();
        assert!(
            text.contains("'java'") && text.contains(env::EMBEDDED_PYTHON),
            "{text}"
        );

        let mut garbage = environment(ANY_OF, "");
        garbage.payload = vec![0xff, 0xff, 0xff];
        let p = pipeline_of(vec![("java", garbage)]);
        let e = resolve(&p, &EnvironmentPreference::default()).expect_err("refused");
        assert!(e.to_string().contains("does not decode"), "{e}");

        // Deeply nested lists are refused before they cost more decodes.
        let mut deep = environment(env::EXTERNAL, "pool");
        for _ in 0..(MAX_ANY_OF_DEPTH + 1) {
            deep = any_of(vec![deep]);
        }
        let p = pipeline_of(vec![("java", deep)]);
        let e = resolve(&p, &EnvironmentPreference::default()).expect_err("refused");
        assert!(e.to_string().contains("nest more than"), "{e}");

        let many = any_of(
            (0..=MAX_ALTERNATIVES)
                .map(|i| environment(env::EXTERNAL, &i.to_string()))
                .collect(),
        );
        let p = pipeline_of(vec![("java", many)]);
        let e = resolve(&p, &EnvironmentPreference::default()).expect_err("refused");
        assert!(e.to_string().contains("more than"), "{e}");
    }

    #[test]
    fn preferences_read_any_order_and_case_and_refuse_the_rest() {
        let p: EnvironmentPreference = "Docker, external".parse().expect("reads");
        assert_eq!(p.to_string(), "docker,external");
        assert_eq!(
            EnvironmentPreference::default().to_string(),
            "external,process,docker"
        );
        for bad in ["", "kubernetes", "docker,docker", " , "] {
            assert!(bad.parse::<EnvironmentPreference>().is_err(), "{bad}");
        }
    }
}
