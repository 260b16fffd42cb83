//! `beam:env:anyof:v1` environments: a list of alternative environments,
//! any of which runs the transforms that name it (expansion services answer
//! with one). Translation picks an alternative; the job service stages the
//! dependencies of all of them, since which one runs is decided later.
//! Both read the list here, within bounds, since it comes from a client.

use prost::Message;

use crate::pipeline::{AnyOfEnvironmentPayload, Environment};
use crate::urns::env::ANY_OF;

/// How deep AnyOf lists may nest inside one another (each level is a
/// decode): Java flattens nested lists, so real pipelines have one level.
pub const MAX_DEPTH: usize = 8;
/// How many alternatives one environment may offer, nesting included.
pub const MAX_ALTERNATIVES: usize = 256;

/// Why an AnyOf environment's list cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnyOfError(pub String);

impl std::fmt::Display for AnyOfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AnyOfError {}

/// Every concrete alternative `environment` offers (itself, when it is not
/// an AnyOf list), nested lists flattened in the order offered, within
/// [`MAX_DEPTH`] and [`MAX_ALTERNATIVES`].
pub fn alternatives(environment: &Environment) -> Result<Vec<Environment>, AnyOfError> {
    if environment.urn != ANY_OF {
        return Ok(vec![environment.clone()]);
    }
    let open = |payload: &[u8]| {
        AnyOfEnvironmentPayload::decode(payload)
            .map(|list| list.environments.into_iter())
            .map_err(|e| AnyOfError(format!("its payload does not decode: {e}")))
    };
    let mut found = Vec::new();
    // The lists being read, outermost first: depth first keeps the order.
    let mut lists = vec![open(&environment.payload)?];
    while let Some(list) = lists.last_mut() {
        let Some(alternative) = list.next() else {
            lists.pop();
            continue;
        };
        if alternative.urn != ANY_OF {
            found.push(alternative);
            if found.len() > MAX_ALTERNATIVES {
                return Err(AnyOfError(format!(
                    "it offers more than {MAX_ALTERNATIVES} alternatives"
                )));
            }
        } else if lists.len() >= MAX_DEPTH {
            return Err(AnyOfError(format!(
                "its AnyOf lists nest more than {MAX_DEPTH} deep"
            )));
        } else {
            lists.push(open(&alternative.payload)?);
        }
    }
    Ok(found)
}
