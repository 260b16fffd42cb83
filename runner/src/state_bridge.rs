//! Answers the SDK's state requests for one bundle from the engine's state.
//!
//! The Fn API names state with proto `StateKey`s; the engine knows only its
//! own [`StateKey`]. This bridge is the one place that maps between them, so
//! that the engine stays proto-free and the harness crate stays engine-free.

use std::sync::Arc;

use bytes::Bytes;
use refract_engine::state::{BundleState, StateError, StateKey};
use refract_proto::fn_api::{
    state_key, state_request, state_response, StateAppendResponse, StateClearResponse,
    StateGetResponse, StateRequest, StateResponse,
};
use refract_sdk_harness::StateHandler;

/// A [`StateHandler`] over one bundle's engine state.
pub struct StateBridge {
    state: Arc<dyn BundleState>,
}

impl StateBridge {
    /// Bridge the given bundle state.
    pub fn new(state: Arc<dyn BundleState>) -> Self {
        StateBridge { state }
    }
}

fn engine_key(key: &refract_proto::fn_api::StateKey) -> Result<StateKey, StateError> {
    let bytes = |b: &Vec<u8>| Bytes::copy_from_slice(b);
    match &key.r#type {
        Some(state_key::Type::IterableSideInput(k)) => Ok(StateKey::IterableSideInput {
            transform_id: k.transform_id.clone(),
            side_input_id: k.side_input_id.clone(),
            window: bytes(&k.window),
        }),
        Some(state_key::Type::MultimapSideInput(k)) => Ok(StateKey::MultimapSideInput {
            transform_id: k.transform_id.clone(),
            side_input_id: k.side_input_id.clone(),
            window: bytes(&k.window),
            key: bytes(&k.key),
        }),
        Some(state_key::Type::MultimapKeysSideInput(k)) => Ok(StateKey::MultimapKeysSideInput {
            transform_id: k.transform_id.clone(),
            side_input_id: k.side_input_id.clone(),
            window: bytes(&k.window),
        }),
        Some(state_key::Type::BagUserState(k)) => Ok(StateKey::BagUserState {
            transform_id: k.transform_id.clone(),
            state_id: k.user_state_id.clone(),
            window: bytes(&k.window),
            key: bytes(&k.key),
        }),
        Some(other) => Err(StateError(format!(
            "state key kind {} is not supported by Refract yet",
            kind_name(other)
        ))),
        None => Err(StateError("state request without a state key".into())),
    }
}

fn kind_name(t: &state_key::Type) -> &'static str {
    match t {
        state_key::Type::Runner(_) => "runner",
        state_key::Type::MultimapSideInput(_) => "multimap_side_input",
        state_key::Type::BagUserState(_) => "bag_user_state",
        state_key::Type::IterableSideInput(_) => "iterable_side_input",
        state_key::Type::MultimapKeysSideInput(_) => "multimap_keys_side_input",
        state_key::Type::MultimapKeysValuesSideInput(_) => "multimap_keys_values_side_input",
        state_key::Type::MultimapKeysUserState(_) => "multimap_keys_user_state",
        state_key::Type::MultimapUserState(_) => "multimap_user_state",
        state_key::Type::OrderedListUserState(_) => "ordered_list_user_state",
        state_key::Type::MultimapEntriesUserState(_) => "multimap_entries_user_state",
    }
}

impl StateHandler for StateBridge {
    fn handle(&self, req: &StateRequest) -> StateResponse {
        let result = (|| -> Result<state_response::Response, StateError> {
            let key = engine_key(
                req.state_key
                    .as_ref()
                    .ok_or_else(|| StateError("state request without a state key".into()))?,
            )?;
            match &req.request {
                Some(state_request::Request::Get(get)) => {
                    let token = (!get.continuation_token.is_empty())
                        .then_some(get.continuation_token.as_slice());
                    let page = self.state.get(&key, token)?;
                    Ok(state_response::Response::Get(StateGetResponse {
                        continuation_token: page
                            .continuation
                            .map(|b| b.to_vec())
                            .unwrap_or_default(),
                        data: page.data.to_vec(),
                    }))
                }
                Some(state_request::Request::Append(append)) => {
                    self.state
                        .append(&key, Bytes::copy_from_slice(&append.data))?;
                    Ok(state_response::Response::Append(StateAppendResponse {}))
                }
                Some(state_request::Request::Clear(_)) => {
                    self.state.clear(&key)?;
                    Ok(state_response::Response::Clear(StateClearResponse {}))
                }
                None => Err(StateError(
                    "state request without get, append or clear".into(),
                )),
            }
        })();
        match result {
            Ok(response) => StateResponse {
                id: req.id.clone(),
                error: String::new(),
                response: Some(response),
            },
            Err(e) => StateResponse {
                id: req.id.clone(),
                error: e.0,
                response: None,
            },
        }
    }
}
