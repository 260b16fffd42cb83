//! Answers the SDK's state requests for one bundle from the engine's state.
//!
//! The Fn API names state with proto `StateKey`s; the engine knows only its
//! own [`StateKey`]. This bridge is the one place that maps between them, so
//! that the engine stays proto-free and the harness crate stays engine-free.

use std::sync::Arc;

use bytes::Bytes;
use refract_engine::plan::SideInputId;
use refract_engine::state::{BundleState, CellId, SortKeyRange, StateError, StateKey};
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

/// Maps a proto `StateKey` to the engine's. Kinds Refract does not serve
/// (multimap keys-values side inputs) are a state error,
/// which the SDK raises in the DoFn (or, for keys-values side inputs, answers
/// by falling back to per-key lookups).
fn engine_key(key: &refract_proto::fn_api::StateKey) -> Result<StateKey, StateError> {
    let bytes = |b: &Vec<u8>| Bytes::copy_from_slice(b);
    let side_input = |transform_id: &str, tag: &str| SideInputId::new(transform_id, tag);
    let cell = |transform_id: &str, state_id: &str, window: &Vec<u8>, key: &Vec<u8>| {
        CellId::new(transform_id, state_id, bytes(window), bytes(key))
    };
    match &key.r#type {
        Some(state_key::Type::IterableSideInput(k)) => Ok(StateKey::IterableSideInput {
            side_input: side_input(&k.transform_id, &k.side_input_id),
            window: bytes(&k.window),
        }),
        Some(state_key::Type::MultimapSideInput(k)) => Ok(StateKey::MultimapSideInput {
            side_input: side_input(&k.transform_id, &k.side_input_id),
            window: bytes(&k.window),
            key: bytes(&k.key),
        }),
        Some(state_key::Type::MultimapKeysSideInput(k)) => Ok(StateKey::MultimapKeysSideInput {
            side_input: side_input(&k.transform_id, &k.side_input_id),
            window: bytes(&k.window),
        }),
        Some(state_key::Type::BagUserState(k)) => Ok(StateKey::BagUserState(cell(
            &k.transform_id,
            &k.user_state_id,
            &k.window,
            &k.key,
        ))),
        Some(state_key::Type::OrderedListUserState(k)) => Ok(StateKey::OrderedListUserState {
            cell: cell(&k.transform_id, &k.user_state_id, &k.window, &k.key),
            range: k.range.as_ref().map(|r| SortKeyRange {
                start: r.start,
                end: r.end,
            }),
        }),
        Some(state_key::Type::MultimapUserState(k)) => Ok(StateKey::MultimapUserState {
            cell: cell(&k.transform_id, &k.user_state_id, &k.window, &k.key),
            map_key: bytes(&k.map_key),
        }),
        Some(state_key::Type::MultimapKeysUserState(k)) => Ok(StateKey::MultimapKeysUserState(
            cell(&k.transform_id, &k.user_state_id, &k.window, &k.key),
        )),
        Some(state_key::Type::MultimapEntriesUserState(k)) => {
            Ok(StateKey::MultimapEntriesUserState(cell(
                &k.transform_id,
                &k.user_state_id,
                &k.window,
                &k.key,
            )))
        }
        Some(state_key::Type::Runner(k)) => Ok(StateKey::RunnerIterable {
            token: bytes(&k.key),
        }),
        Some(other @ state_key::Type::MultimapKeysValuesSideInput(_)) => Err(StateError(format!(
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

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use refract_engine::state::{decode_ordered_entries, encode_ordered_entry};
    use refract_engine::state::{BundleOverlay, SideInputTable, UserStateTable};
    use refract_proto::fn_api::{
        state_key, OrderedListRange, StateAppendRequest, StateClearRequest, StateGetRequest,
        StateKey as ProtoKey,
    };

    fn bridge() -> (StateBridge, Arc<BundleOverlay>) {
        let overlay = Arc::new(BundleOverlay::new(
            Arc::new(Mutex::new(SideInputTable::default())),
            Arc::new(Mutex::new(UserStateTable::default())),
        ));
        (StateBridge::new(overlay.clone()), overlay)
    }

    fn ordered(range: Option<(i64, i64)>) -> ProtoKey {
        ProtoKey {
            r#type: Some(state_key::Type::OrderedListUserState(
                state_key::OrderedListUserState {
                    transform_id: "t".into(),
                    user_state_id: "s".into(),
                    window: vec![],
                    key: b"\x01k".to_vec(),
                    range: range.map(|(start, end)| OrderedListRange { start, end }),
                },
            )),
        }
    }

    fn multimap(map_key: &[u8]) -> ProtoKey {
        ProtoKey {
            r#type: Some(state_key::Type::MultimapUserState(
                state_key::MultimapUserState {
                    transform_id: "t".into(),
                    user_state_id: "m".into(),
                    window: vec![],
                    key: b"\x01k".to_vec(),
                    map_key: map_key.to_vec(),
                },
            )),
        }
    }

    fn multimap_keys() -> ProtoKey {
        ProtoKey {
            r#type: Some(state_key::Type::MultimapKeysUserState(
                state_key::MultimapKeysUserState {
                    transform_id: "t".into(),
                    user_state_id: "m".into(),
                    window: vec![],
                    key: b"\x01k".to_vec(),
                },
            )),
        }
    }

    fn request(id: &str, key: ProtoKey, request: state_request::Request) -> StateRequest {
        StateRequest {
            id: id.into(),
            instruction_id: "b1".into(),
            state_key: Some(key),
            request: Some(request),
        }
    }

    fn get() -> state_request::Request {
        state_request::Request::Get(StateGetRequest {
            continuation_token: vec![],
        })
    }

    fn get_data(b: &StateBridge, id: &str, key: ProtoKey) -> Vec<u8> {
        let resp = b.handle(&request(id, key, get()));
        assert_eq!(resp.id, id);
        assert_eq!(resp.error, "");
        match resp.response {
            Some(state_response::Response::Get(g)) => {
                assert!(g.continuation_token.is_empty());
                g.data
            }
            other => panic!("expected a get response, got {other:?}"),
        }
    }

    #[test]
    fn ordered_list_requests_map_to_engine_state() {
        let (b, overlay) = bridge();
        let mut data = Vec::new();
        encode_ordered_entry(7, b"late", &mut data);
        encode_ordered_entry(-2, b"early", &mut data);
        let resp = b.handle(&request(
            "1",
            ordered(None),
            state_request::Request::Append(StateAppendRequest { data }),
        ));
        assert_eq!(resp.error, "");
        assert!(matches!(
            resp.response,
            Some(state_response::Response::Append(_))
        ));
        let page = get_data(&b, "2", ordered(Some((i64::MIN, i64::MAX))));
        let entries = decode_ordered_entries(&Bytes::from(page)).unwrap();
        assert_eq!(
            entries,
            vec![
                (-2, Bytes::from_static(b"early")),
                (7, Bytes::from_static(b"late"))
            ]
        );
        let resp = b.handle(&request(
            "3",
            ordered(Some((0, 10))),
            state_request::Request::Clear(StateClearRequest {}),
        ));
        assert_eq!(resp.error, "");
        let page = get_data(&b, "4", ordered(Some((i64::MIN, i64::MAX))));
        assert_eq!(
            decode_ordered_entries(&Bytes::from(page)).unwrap(),
            vec![(-2, Bytes::from_static(b"early"))]
        );
        assert_eq!(overlay.take_writes().ordered_lists.len(), 1);
    }

    #[test]
    fn errors_come_back_in_the_response_with_the_request_id() {
        let (b, _) = bridge();
        let resp = b.handle(&request(
            "9",
            ordered(None),
            state_request::Request::Append(StateAppendRequest {
                data: vec![0x02, 0x05, b'a'],
            }),
        ));
        assert_eq!(resp.id, "9");
        assert!(resp.error.contains("malformed ordered list entry"));
        assert!(resp.response.is_none());
        let resp = b.handle(&request("10", ordered(None), get()));
        assert!(resp.error.contains("range"), "{}", resp.error);
        let runner = ProtoKey {
            r#type: Some(state_key::Type::Runner(state_key::Runner { key: vec![1] })),
        };
        // A runner key reaches the engine, which was handed nothing to read.
        let resp = b.handle(&request("11", runner, get()));
        assert_eq!(resp.id, "11");
        assert!(
            resp.error.contains("state-backed iterable"),
            "{}",
            resp.error
        );
    }

    #[test]
    fn multimap_requests_map_to_engine_state() {
        let (b, _) = bridge();
        for (id, map_key, values) in [
            ("1", &b"\x01a"[..], &b"\x01x"[..]),
            ("2", b"\x01b", b"\x01y"),
        ] {
            let resp = b.handle(&request(
                id,
                multimap(map_key),
                state_request::Request::Append(StateAppendRequest {
                    data: values.to_vec(),
                }),
            ));
            assert_eq!(resp.error, "");
        }
        assert_eq!(get_data(&b, "3", multimap(b"\x01a")), b"\x01x");
        assert_eq!(get_data(&b, "4", multimap_keys()), b"\x01a\x01b");
        let resp = b.handle(&request(
            "5",
            multimap(b"\x01a"),
            state_request::Request::Clear(StateClearRequest {}),
        ));
        assert_eq!(resp.error, "");
        assert_eq!(get_data(&b, "6", multimap_keys()), b"\x01b");
        let resp = b.handle(&request(
            "7",
            multimap_keys(),
            state_request::Request::Clear(StateClearRequest {}),
        ));
        assert_eq!(resp.error, "");
        assert!(get_data(&b, "8", multimap_keys()).is_empty());
    }
}
