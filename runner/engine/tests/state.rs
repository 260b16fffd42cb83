//! Model-based checks of user state transactions: random bundles of ordered
//! list and multimap requests, some of which fail, must leave the store
//! exactly as a naive model says, and every read inside a bundle must see
//! the committed state plus that bundle's own writes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers, not only #[test] fns

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use proptest::prelude::*;
use refract_engine::state::{
    decode_ordered_entries, encode_ordered_entry, BundleState, CellId, SortKeyRange, StateKey,
};
use refract_engine::state::{BundleOverlay, SideInputTable, UserStateTable};

/// Sort keys drawn from a small set so that equal keys and range edges are
/// common, plus the extremes.
fn sort_key() -> impl Strategy<Value = i64> {
    prop_oneof![
        8 => -4i64..4,
        1 => Just(i64::MIN),
        1 => Just(i64::MAX - 1),
    ]
}

#[derive(Debug, Clone)]
enum ListOp {
    Append(Vec<(i64, u8)>),
    Clear(i64, i64),
    Read(i64, i64),
}

fn list_op() -> impl Strategy<Value = ListOp> {
    prop_oneof![
        3 => proptest::collection::vec((sort_key(), any::<u8>()), 0..5).prop_map(ListOp::Append),
        1 => (sort_key(), sort_key()).prop_map(|(a, b)| ListOp::Clear(a, b)),
        2 => (sort_key(), sort_key()).prop_map(|(a, b)| ListOp::Read(a, b)),
    ]
}

fn list_key(range: Option<(i64, i64)>) -> StateKey {
    StateKey::OrderedListUserState {
        cell: CellId {
            transform_id: "t".into(),
            state_id: "list".into(),
            window: Bytes::new(),
            key: Bytes::from_static(b"k"),
        },
        range: range.map(|(start, end)| SortKeyRange { start, end }),
    }
}

fn read_all(o: &BundleOverlay, key: &StateKey) -> Vec<u8> {
    let mut out = Vec::new();
    let mut token: Option<Bytes> = None;
    loop {
        let page = o.get(key, token.as_deref()).expect("get");
        out.extend_from_slice(&page.data);
        match page.continuation {
            Some(t) => token = Some(t),
            None => return out,
        }
    }
}

/// The model: entries in insertion order; reads sort stably by key.
fn model_read(model: &[(i64, u8)], start: i64, end: i64) -> Vec<(i64, u8)> {
    let mut out: Vec<(i64, u8)> = model
        .iter()
        .copied()
        .filter(|(k, _)| start <= *k && *k < end)
        .collect();
    out.sort_by_key(|(k, _)| *k);
    out
}

#[derive(Debug, Clone)]
enum MapOp {
    Put(u8, Vec<u8>),
    Remove(u8),
    ClearAll,
    Read(u8),
    Keys,
}

fn map_op() -> impl Strategy<Value = MapOp> {
    prop_oneof![
        3 => (0u8..4, proptest::collection::vec(any::<u8>(), 0..3))
            .prop_map(|(k, v)| MapOp::Put(k, v)),
        1 => (0u8..4).prop_map(MapOp::Remove),
        1 => Just(MapOp::ClearAll),
        2 => (0u8..4).prop_map(MapOp::Read),
        1 => Just(MapOp::Keys),
    ]
}

fn map_key(k: u8) -> Bytes {
    Bytes::from(vec![1, b'a' + k])
}

fn values_key(k: u8) -> StateKey {
    StateKey::MultimapUserState {
        cell: CellId {
            transform_id: "t".into(),
            state_id: "map".into(),
            window: Bytes::new(),
            key: Bytes::from_static(b"k"),
        },
        map_key: map_key(k),
    }
}

fn keys_key() -> StateKey {
    StateKey::MultimapKeysUserState(CellId {
        transform_id: "t".into(),
        state_id: "map".into(),
        window: Bytes::new(),
        key: Bytes::from_static(b"k"),
    })
}

proptest! {
    #[test]
    fn ordered_list_bundles_match_the_model(
        bundles in proptest::collection::vec(
            (proptest::collection::vec(list_op(), 0..8), any::<bool>(), 1usize..64),
            1..6,
        )
    ) {
        let side_inputs = Arc::new(Mutex::new(SideInputTable::default()));
        let user_state = Arc::new(Mutex::new(UserStateTable::default()));
        let mut committed: Vec<(i64, u8)> = Vec::new();
        for (ops, succeeds, page_bytes) in bundles {
            let o = BundleOverlay::new(side_inputs.clone(), user_state.clone())
                .with_page_bytes(page_bytes);
            let mut model = committed.clone();
            for op in ops {
                match op {
                    ListOp::Append(items) => {
                        let mut data = Vec::new();
                        for (k, v) in &items {
                            encode_ordered_entry(*k, &[*v], &mut data);
                        }
                        o.append(&list_key(None), Bytes::from(data)).expect("append");
                        model.extend(items);
                    }
                    ListOp::Clear(a, b) => {
                        o.clear(&list_key(Some((a, b)))).expect("clear");
                        model.retain(|(k, _)| !(a <= *k && *k < b));
                    }
                    ListOp::Read(a, b) => {
                        let data = Bytes::from(read_all(&o, &list_key(Some((a, b)))));
                        let got: Vec<(i64, u8)> = decode_ordered_entries(&data)
                            .expect("decodes")
                            .into_iter()
                            .map(|(k, v)| (k, v[0]))
                            .collect();
                        prop_assert_eq!(got, model_read(&model, a, b));
                    }
                }
            }
            if succeeds {
                user_state.lock().apply(o.take_writes()).unwrap();
                committed = model;
            }
            let check = BundleOverlay::new(side_inputs.clone(), user_state.clone());
            let data = Bytes::from(read_all(&check, &list_key(Some((i64::MIN, i64::MAX)))));
            let got: Vec<(i64, u8)> = decode_ordered_entries(&data)
                .expect("decodes")
                .into_iter()
                .map(|(k, v)| (k, v[0]))
                .collect();
            prop_assert_eq!(got, model_read(&committed, i64::MIN, i64::MAX));
            prop_assert_eq!(user_state.lock().is_empty(), committed.is_empty());
        }
    }

    #[test]
    fn multimap_bundles_match_the_model(
        bundles in proptest::collection::vec(
            (proptest::collection::vec(map_op(), 0..8), any::<bool>()),
            1..6,
        )
    ) {
        let side_inputs = Arc::new(Mutex::new(SideInputTable::default()));
        let user_state = Arc::new(Mutex::new(UserStateTable::default()));
        // map key -> concatenated values (present even when empty).
        let mut committed: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
        for (ops, succeeds) in bundles {
            let o = BundleOverlay::new(side_inputs.clone(), user_state.clone());
            let mut model = committed.clone();
            for op in ops {
                match op {
                    MapOp::Put(k, v) => {
                        o.append(&values_key(k), Bytes::from(v.clone())).expect("append");
                        model.entry(k).or_default().extend(v);
                    }
                    MapOp::Remove(k) => {
                        o.clear(&values_key(k)).expect("clear");
                        model.remove(&k);
                    }
                    MapOp::ClearAll => {
                        o.clear(&keys_key()).expect("clear");
                        model.clear();
                    }
                    MapOp::Read(k) => {
                        let got = read_all(&o, &values_key(k));
                        prop_assert_eq!(got, model.get(&k).cloned().unwrap_or_default());
                    }
                    MapOp::Keys => {
                        let got = read_all(&o, &keys_key());
                        let want: Vec<u8> =
                            model.keys().flat_map(|k| map_key(*k).to_vec()).collect();
                        prop_assert_eq!(got, want);
                    }
                }
            }
            if succeeds {
                user_state.lock().apply(o.take_writes()).unwrap();
                committed = model;
            }
            let check = BundleOverlay::new(side_inputs.clone(), user_state.clone());
            let want: Vec<u8> = committed.keys().flat_map(|k| map_key(*k).to_vec()).collect();
            prop_assert_eq!(read_all(&check, &keys_key()), want);
            prop_assert_eq!(user_state.lock().is_empty(), committed.is_empty());
        }
    }
}
