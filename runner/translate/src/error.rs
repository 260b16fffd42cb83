//! Why a pipeline cannot be translated.
//!
//! Every error names what is unsupported or wrong and where (a transform's
//! unique name, a PCollection, coder or windowing strategy id), because the
//! text goes straight back to the user who submitted the job.

use thiserror::Error;

/// A pipeline that Refract rejects, with the reason in user terms.
#[derive(Debug, Error)]
pub enum TranslateError {
    /// A leaf transform whose URN Refract neither executes nor hands to an SDK.
    #[error("unsupported transform URN '{urn}' in transform '{transform}'")]
    UnsupportedTransform {
        /// The transform's URN.
        urn: String,
        /// The transform's unique name.
        transform: String,
    },
    /// A `Pipeline.requirements` entry Refract cannot honour.
    #[error("unsupported pipeline requirement '{0}'")]
    UnsupportedRequirement(String),
    /// An environment only Python's in-process runner can provide.
    #[error(
        "environment '{urn}' can only run inside Python's own FnApiRunner; \
         use LOOPBACK, EXTERNAL, PROCESS or DOCKER"
    )]
    EmbeddedEnvironment {
        /// The environment's URN.
        urn: String,
        /// The environment's id in the pipeline.
        id: String,
    },
    /// An environment URN Refract does not know how to start.
    #[error(
        "unsupported environment URN '{urn}' in environment '{id}'; \
         use LOOPBACK, EXTERNAL, PROCESS or DOCKER"
    )]
    UnsupportedEnvironment {
        /// The environment's URN.
        urn: String,
        /// The environment's id in the pipeline.
        id: String,
    },
    /// An AnyOf environment none of whose alternatives Refract can start.
    #[error(
        "environment '{id}' offers no alternative Refract can start (it offers: {offered}); \
         Refract starts EXTERNAL, PROCESS and DOCKER environments"
    )]
    NoStartableAlternative {
        /// The environment's id in the pipeline.
        id: String,
        /// The URNs it offers, in order.
        offered: String,
    },
    /// An AnyOf environment whose list of alternatives is unreadable.
    #[error("AnyOf environment '{id}' is invalid: {reason}")]
    InvalidAnyOf {
        /// The environment's id in the pipeline.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A feature of a component that Refract does not implement.
    #[error("unsupported {feature} in {location}")]
    Unsupported {
        /// What is unsupported (e.g. "accumulation mode RETRACTING").
        feature: String,
        /// Where it was found (e.g. "windowing strategy 'w1'").
        location: String,
    },
    /// A reference to a component the pipeline does not contain.
    #[error("{kind} '{id}' referenced by {referrer} is missing from the pipeline")]
    Missing {
        /// The kind of component ("PCollection", "coder", ...).
        kind: &'static str,
        /// The missing id.
        id: String,
        /// What referenced it.
        referrer: String,
    },
    /// A payload that does not decode as the proto its URN promises.
    #[error("cannot decode the {what} of {location}: {source}")]
    BadPayload {
        /// The payload's message type.
        what: &'static str,
        /// Where the payload was found.
        location: String,
        /// The decoder's complaint.
        #[source]
        source: prost::DecodeError,
    },
    /// A structurally malformed pipeline (e.g. a ParDo with two main inputs).
    #[error("invalid pipeline: {0}")]
    Invalid(String),
    /// A pipeline larger than the server accepts (the `limits` module).
    #[error("the pipeline has {count} {what}; this server accepts at most {limit}")]
    TooLarge {
        /// What was counted ("transforms", "coders", ...).
        what: String,
        /// How many the pipeline has.
        count: usize,
        /// The limit it passed.
        limit: usize,
    },
}

impl TranslateError {
    /// Shorthand for [`TranslateError::Unsupported`].
    pub(crate) fn unsupported(feature: impl Into<String>, location: impl Into<String>) -> Self {
        TranslateError::Unsupported {
            feature: feature.into(),
            location: location.into(),
        }
    }

    /// Shorthand for [`TranslateError::Missing`].
    pub(crate) fn missing(kind: &'static str, id: &str, referrer: impl Into<String>) -> Self {
        TranslateError::Missing {
            kind,
            id: id.to_string(),
            referrer: referrer.into(),
        }
    }

    /// Shorthand for [`TranslateError::BadPayload`].
    pub(crate) fn bad_payload(
        what: &'static str,
        location: impl Into<String>,
        source: prost::DecodeError,
    ) -> Self {
        TranslateError::BadPayload {
            what,
            location: location.into(),
            source,
        }
    }
}
