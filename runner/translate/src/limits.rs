//! How large a pipeline Refract accepts, checked before anything walks it.
//!
//! A pipeline arrives from whoever can reach the job port, so its size is
//! not to be trusted: every walk over it must be bounded before it starts.
//! Counts are checked here against [`Limits`]; the shapes that could make a
//! walk recurse without end or without bound — coders that contain
//! themselves or nest too deeply, composites nested too deeply — are checked
//! where those structures are read (`coders`, `graph`). Translation's own
//! work is linear in these counts, so within the limits its time and memory
//! are bounded too.

use refract_proto::pipeline as pb;

use crate::error::TranslateError;

/// The largest pipeline translation takes on. The defaults are far above
/// what SDKs produce for real pipelines (thousands of transforms for the
/// largest), and low enough that translating one at the limit takes
/// seconds and a bounded amount of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Transforms, composites included.
    pub(crate) transforms: usize,
    /// PCollections.
    pub(crate) pcollections: usize,
    /// Coders.
    pub(crate) coders: usize,
    /// Windowing strategies.
    pub(crate) windowing_strategies: usize,
    /// Environments.
    pub(crate) environments: usize,
    /// Inputs plus outputs of one transform (a Flatten of many files).
    pub(crate) ports_per_transform: usize,
    /// Composite nesting: root to deepest leaf.
    pub(crate) composite_depth: usize,
    /// Coder nesting: a coder to its deepest component.
    pub(crate) coder_depth: usize,
    /// Encoded bytes of all the bundle descriptors together. Each SDK
    /// stage's descriptor carries its own copy of its environment and of
    /// its coders' closure (the Fn API sends each whole), so a pipeline of
    /// a few megabytes could ask for that many times its stages;
    /// translation stops once the descriptors built so far pass this.
    pub(crate) descriptor_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            transforms: 100_000,
            pcollections: 100_000,
            coders: 100_000,
            windowing_strategies: 10_000,
            environments: 1_000,
            ports_per_transform: 10_000,
            composite_depth: 1_000,
            coder_depth: 100,
            descriptor_bytes: 512 << 20,
        }
    }
}

/// Adds a descriptor of `bytes` to the `total` built so far, refusing the
/// pipeline once they pass the limit.
pub(crate) fn count_descriptor_bytes(
    total: &mut usize,
    bytes: usize,
    limits: &Limits,
) -> Result<(), TranslateError> {
    *total = total.saturating_add(bytes);
    if *total > limits.descriptor_bytes {
        return Err(TranslateError::TooLarge {
            what: "bytes of bundle descriptors (each stage's transforms, coders and \
                   environment)"
                .to_string(),
            count: *total,
            limit: limits.descriptor_bytes,
        });
    }
    Ok(())
}

/// Refuses a pipeline with more components than `limits` allow, naming the
/// count that passed its limit.
pub(crate) fn check_counts(pipeline: &pb::Pipeline, limits: &Limits) -> Result<(), TranslateError> {
    let Some(c) = &pipeline.components else {
        return Ok(());
    };
    let counts = [
        ("transforms", c.transforms.len(), limits.transforms),
        ("PCollections", c.pcollections.len(), limits.pcollections),
        ("coders", c.coders.len(), limits.coders),
        (
            "windowing strategies",
            c.windowing_strategies.len(),
            limits.windowing_strategies,
        ),
        ("environments", c.environments.len(), limits.environments),
        (
            "root transforms",
            pipeline.root_transform_ids.len(),
            limits.transforms,
        ),
    ];
    for (what, count, limit) in counts {
        if count > limit {
            return Err(TranslateError::TooLarge {
                what: what.to_string(),
                count,
                limit,
            });
        }
    }
    let mut ids: Vec<&String> = c.transforms.keys().collect();
    ids.sort();
    for id in ids {
        let Some(t) = c.transforms.get(id) else {
            continue;
        };
        let ports = t.inputs.len() + t.outputs.len();
        if ports > limits.ports_per_transform {
            return Err(TranslateError::TooLarge {
                what: format!("inputs and outputs of transform '{id}'"),
                count: ports,
                limit: limits.ports_per_transform,
            });
        }
        if t.subtransforms.len() > limits.transforms {
            return Err(TranslateError::TooLarge {
                what: format!("subtransforms of transform '{id}'"),
                count: t.subtransforms.len(),
                limit: limits.transforms,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_that_passed_its_limit_is_named() {
        let mut components = pb::Components::default();
        for i in 0..3 {
            components
                .coders
                .insert(format!("c{i}"), pb::Coder::default());
        }
        let pipeline = pb::Pipeline {
            components: Some(components),
            ..Default::default()
        };
        let limits = Limits {
            coders: 2,
            ..Limits::default()
        };
        let error = check_counts(&pipeline, &limits).unwrap_err().to_string();
        assert_eq!(
            error,
            "the pipeline has 3 coders; this server accepts at most 2"
        );
        check_counts(&pipeline, &Limits::default()).unwrap();
    }
}
