//! The stores and the overlay, through the state API a bundle uses.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::coder::Coder;
use crate::plan::SideInputId;
use crate::state::{
    decode_ordered_entries, encode_ordered_entry, BundleState, CellId, SortKeyRange, StateKey,
};

use super::overlay::*;
use super::side_inputs::*;
use super::user_state::*;

fn bag(key: &str) -> StateKey {
    StateKey::BagUserState(CellId {
        transform_id: "t".into(),
        state_id: "s".into(),
        window: Bytes::new(),
        key: Bytes::copy_from_slice(key.as_bytes()),
    })
}

fn ordered(range: Option<(i64, i64)>) -> StateKey {
    StateKey::OrderedListUserState {
        cell: CellId {
            transform_id: "t".into(),
            state_id: "ol".into(),
            window: Bytes::from_static(b"w"),
            key: Bytes::from_static(b"k"),
        },
        range: range.map(|(start, end)| SortKeyRange { start, end }),
    }
}

fn all() -> StateKey {
    ordered(Some((i64::MIN, i64::MAX)))
}

fn mm_values(map_key: &str) -> StateKey {
    StateKey::MultimapUserState {
        cell: CellId {
            transform_id: "t".into(),
            state_id: "mm".into(),
            window: Bytes::from_static(b"w"),
            key: Bytes::from_static(b"k"),
        },
        map_key: nested(map_key),
    }
}

fn mm_keys() -> StateKey {
    StateKey::MultimapKeysUserState(CellId {
        transform_id: "t".into(),
        state_id: "mm".into(),
        window: Bytes::from_static(b"w"),
        key: Bytes::from_static(b"k"),
    })
}

fn mm_entries() -> StateKey {
    StateKey::MultimapEntriesUserState(CellId {
        transform_id: "t".into(),
        state_id: "mm".into(),
        window: Bytes::from_static(b"w"),
        key: Bytes::from_static(b"k"),
    })
}

/// A string as Beam's string coder nests it: varint length, bytes.
fn nested(s: &str) -> Bytes {
    let mut out = vec![s.len() as u8];
    out.extend_from_slice(s.as_bytes());
    Bytes::from(out)
}

fn nested_all(values: &[&str]) -> Bytes {
    Bytes::from(
        values
            .iter()
            .flat_map(|v| nested(v).to_vec())
            .collect::<Vec<u8>>(),
    )
}

fn entries(items: &[(i64, &str)]) -> Bytes {
    let mut out = Vec::new();
    for (k, v) in items {
        encode_ordered_entry(*k, v.as_bytes(), &mut out);
    }
    Bytes::from(out)
}

fn stores() -> (Arc<Mutex<SideInputTable>>, Arc<Mutex<UserStateTable>>) {
    (Arc::default(), Arc::default())
}

fn read(o: &BundleOverlay, key: &StateKey) -> Vec<u8> {
    let mut out = Vec::new();
    let mut token: Option<Bytes> = None;
    loop {
        let page = o.get(key, token.as_deref()).unwrap();
        out.extend_from_slice(&page.data);
        match page.continuation {
            Some(t) => token = Some(t),
            None => return out,
        }
    }
}

fn read_ordered(o: &BundleOverlay, key: &StateKey) -> Vec<(i64, String)> {
    decode_ordered_entries(&Bytes::from(read(o, key)))
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.to_vec()).unwrap()))
        .collect()
}

fn owned(items: &[(i64, &str)]) -> Vec<(i64, String)> {
    items.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

#[test]
fn overlay_reads_its_own_writes_and_commits_only_when_applied() {
    let (si, us) = stores();
    let o = BundleOverlay::new(si.clone(), us.clone());
    o.append(&bag("k"), Bytes::from_static(b"\x01a")).unwrap();
    assert_eq!(&o.get(&bag("k"), None).unwrap().data[..], b"\x01a");
    assert!(us.lock().is_empty());
    us.lock().apply(o.take_writes()).unwrap();
    let o2 = BundleOverlay::new(si.clone(), us.clone());
    o2.clear(&bag("k")).unwrap();
    o2.append(&bag("k"), Bytes::from_static(b"\x01b")).unwrap();
    assert_eq!(&o2.get(&bag("k"), None).unwrap().data[..], b"\x01b");
    // A failed bundle's overlay is dropped: committed state is unchanged.
    drop(o2);
    let o3 = BundleOverlay::new(si, us);
    assert_eq!(&o3.get(&bag("k"), None).unwrap().data[..], b"\x01a");
}

#[test]
fn side_inputs_must_be_ready() {
    let si = Arc::new(Mutex::new(SideInputTable::default()));
    si.lock().add_iterable(
        &SideInputId::new("t", "s"),
        Bytes::new(),
        Bytes::from_static(b"\x01"),
    );
    let o = BundleOverlay::new(si.clone(), Arc::default());
    let key = StateKey::IterableSideInput {
        side_input: SideInputId::new("t", "s"),
        window: Bytes::new(),
    };
    assert!(o.get(&key, None).is_err());
    si.lock().mark_ready(&SideInputId::new("t", "s"));
    assert_eq!(&o.get(&key, None).unwrap().data[..], b"\x01");
    assert!(o.append(&key, Bytes::new()).is_err());
    assert!(o.clear(&key).is_err());
}

#[test]
fn a_checkpoint_restored_under_new_transform_ids_reads_the_same_values() {
    let (si, us) = stores();
    let o = BundleOverlay::new(si.clone(), us.clone());
    o.append(&bag("k"), Bytes::from_static(b"\x01a")).unwrap();
    us.lock().apply(o.take_writes()).unwrap();
    si.lock().add_iterable(
        &SideInputId::new("t", "s"),
        Bytes::new(),
        Bytes::from_static(b"\x01"),
    );
    si.lock().mark_ready(&SideInputId::new("t", "s"));
    si.lock().mark_ready(&SideInputId::new("gone", "s"));
    let to_t9 = |id: &crate::plan::TransformId| (**id == *"t").then(|| "t9".into());
    let mut state = us.lock().snapshot().unwrap();
    // A cell whose transform is gone is named.
    assert_eq!(state.clone().rename_transforms(|_| None), Err("t".into()));
    state.rename_transforms(to_t9).unwrap();
    let mut sides = si.lock().snapshot();
    sides.rename_transforms(to_t9);
    let (si, us) = stores();
    us.lock().restore(state, None).unwrap();
    *si.lock() = SideInputTable::restore(sides);
    let o = BundleOverlay::new(si.clone(), us);
    let renamed = match bag("k") {
        StateKey::BagUserState(cell) => StateKey::BagUserState(CellId {
            transform_id: "t9".into(),
            ..cell
        }),
        _ => unreachable!(),
    };
    assert_eq!(&o.get(&renamed, None).unwrap().data[..], b"\x01a");
    let side = |t: &str| StateKey::IterableSideInput {
        side_input: SideInputId::new(t, "s"),
        window: Bytes::new(),
    };
    assert_eq!(&o.get(&side("t9"), None).unwrap().data[..], b"\x01");
    // The reader that is gone took its side input with it.
    assert!(o.get(&side("gone"), None).is_err());
}

#[test]
fn ordered_list_sorts_stably_reads_its_writes_and_commits_on_apply() {
    let (si, us) = stores();
    let o = BundleOverlay::new(si.clone(), us.clone());
    o.append(
        &ordered(None),
        entries(&[(5, "a"), (-3, "neg"), (5, "b"), (1, "one")]),
    )
    .unwrap();
    o.append(&ordered(None), entries(&[(5, "c"), (i64::MIN, "min")]))
        .unwrap();
    let expected = owned(&[
        (i64::MIN, "min"),
        (-3, "neg"),
        (1, "one"),
        (5, "a"),
        (5, "b"),
        (5, "c"),
    ]);
    assert_eq!(read_ordered(&o, &all()), expected);
    assert!(us.lock().is_empty(), "nothing is committed before apply");
    us.lock().apply(o.take_writes()).unwrap();
    assert_eq!(us.lock().len(), 1);

    // Committed entries come before a later bundle's equal sort keys.
    let o2 = BundleOverlay::new(si.clone(), us.clone());
    o2.append(&ordered(None), entries(&[(5, "d"), (0, "zero")]))
        .unwrap();
    assert_eq!(
        read_ordered(&o2, &ordered(Some((0, 6)))),
        owned(&[
            (0, "zero"),
            (1, "one"),
            (5, "a"),
            (5, "b"),
            (5, "c"),
            (5, "d")
        ])
    );
    drop(o2); // failed bundle
    let o3 = BundleOverlay::new(si, us);
    assert_eq!(read_ordered(&o3, &all()), expected);
}

#[test]
fn ordered_list_ranges_and_clears_follow_request_order() {
    let (si, us) = stores();
    let o = BundleOverlay::new(si.clone(), us.clone());
    o.append(
        &ordered(None),
        entries(&[(1, "a"), (2, "b"), (3, "c"), (4, "d"), (10, "e")]),
    )
    .unwrap();
    us.lock().apply(o.take_writes()).unwrap();

    let o = BundleOverlay::new(si.clone(), us.clone());
    assert_eq!(
        read_ordered(&o, &ordered(Some((2, 4)))),
        owned(&[(2, "b"), (3, "c")])
    );
    assert!(read_ordered(&o, &ordered(Some((4, 4)))).is_empty());
    assert!(read_ordered(&o, &ordered(Some((9, 2)))).is_empty());
    // Clear [2, 4), then re-add 3: the re-added entry survives the clear.
    o.clear(&ordered(Some((2, 4)))).unwrap();
    o.append(&ordered(None), entries(&[(3, "c2"), (2, "b2")]))
        .unwrap();
    o.clear(&ordered(Some((2, 3)))).unwrap();
    // An empty or inverted range clears nothing.
    o.clear(&ordered(Some((10, 10)))).unwrap();
    o.clear(&ordered(Some((11, 0)))).unwrap();
    let expected = owned(&[(1, "a"), (3, "c2"), (4, "d"), (10, "e")]);
    assert_eq!(read_ordered(&o, &all()), expected);
    assert_eq!(
        read_ordered(&o, &ordered(Some((3, 5)))),
        owned(&[(3, "c2"), (4, "d")])
    );
    us.lock().apply(o.take_writes()).unwrap();
    let o = BundleOverlay::new(si.clone(), us.clone());
    assert_eq!(read_ordered(&o, &all()), expected);

    // A full clear empties the list, and the store drops it on commit.
    o.clear(&all()).unwrap();
    assert!(read_ordered(&o, &all()).is_empty());
    us.lock().apply(o.take_writes()).unwrap();
    assert!(us.lock().is_empty());
}

#[test]
fn ordered_list_pages_never_split_an_entry() {
    let (si, us) = stores();
    let items: Vec<(i64, String)> = (0..50)
        .map(|i| ((i * 7919) % 101 - 50, format!("value-{i}")))
        .collect();
    let o = BundleOverlay::new(si, us).with_page_bytes(40);
    let refs: Vec<(i64, &str)> = items.iter().map(|(k, v)| (*k, v.as_str())).collect();
    o.append(&ordered(None), entries(&refs)).unwrap();
    let mut pages = 0;
    let mut got = Vec::new();
    let mut token: Option<Bytes> = None;
    loop {
        let page = o.get(&all(), token.as_deref()).unwrap();
        assert!(page.data.len() <= 40, "page of {} bytes", page.data.len());
        // Every page decodes on its own, as the SDK decodes it.
        got.extend(decode_ordered_entries(&page.data).unwrap());
        pages += 1;
        match page.continuation {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    assert!(pages > 10);
    let mut expected = items.clone();
    expected.sort_by_key(|(k, _)| *k); // stable, like the store
    let got: Vec<(i64, String)> = got
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.to_vec()).unwrap()))
        .collect();
    assert_eq!(got, expected);
    // A token past the end (the state shrank) reads as the end.
    let past = o.get(&all(), Some(b"999")).unwrap();
    assert!(past.data.is_empty() && past.continuation.is_none());
    assert!(o.get(&all(), Some(b"x")).is_err());
}

#[test]
fn malformed_ordered_list_requests_are_errors_and_write_nothing() {
    let (si, us) = stores();
    let o = BundleOverlay::new(si, us);
    o.append(&ordered(None), entries(&[(1, "a")])).unwrap();
    // The second entry claims more bytes than there are.
    let mut bad = entries(&[(2, "b")]).to_vec();
    bad.extend_from_slice(&[0x03, 0x09, b'x']);
    let err = o.append(&ordered(None), Bytes::from(bad)).unwrap_err();
    assert!(err.0.contains("malformed ordered list entry"), "{err}");
    assert_eq!(read_ordered(&o, &all()), owned(&[(1, "a")]));
    // Gets and clears must carry a range.
    assert!(o.get(&ordered(None), None).unwrap_err().0.contains("range"));
    assert!(o.clear(&ordered(None)).unwrap_err().0.contains("range"));
    // An empty append is a no-op.
    o.append(&ordered(None), Bytes::new()).unwrap();
    assert_eq!(o.take_writes().ordered_lists.len(), 1);
}

#[test]
fn multimap_values_keys_and_clears() {
    let (si, us) = stores();
    let o = BundleOverlay::new(si.clone(), us.clone());
    o.append(&mm_values("b"), nested_all(&["1", "2"])).unwrap();
    o.append(&mm_values("a"), nested_all(&["x"])).unwrap();
    o.append(&mm_values("b"), nested_all(&["3"])).unwrap();
    // A zero-byte value (Java's Void) still makes its key present.
    o.append(&mm_values("v"), Bytes::new()).unwrap();
    assert_eq!(read(&o, &mm_values("b")), nested_all(&["1", "2", "3"]));
    assert!(read(&o, &mm_values("zzz")).is_empty());
    assert_eq!(read(&o, &mm_keys()), nested_all(&["a", "b", "v"]));
    assert!(us.lock().is_empty());
    us.lock().apply(o.take_writes()).unwrap();
    assert_eq!(us.lock().len(), 1);

    let o = BundleOverlay::new(si.clone(), us.clone());
    assert_eq!(read(&o, &mm_values("b")), nested_all(&["1", "2", "3"]));
    o.clear(&mm_values("b")).unwrap();
    assert!(read(&o, &mm_values("b")).is_empty());
    assert_eq!(read(&o, &mm_keys()), nested_all(&["a", "v"]));
    o.append(&mm_values("b"), nested_all(&["4"])).unwrap();
    assert_eq!(read(&o, &mm_values("b")), nested_all(&["4"]));
    assert_eq!(read(&o, &mm_keys()), nested_all(&["a", "b", "v"]));
    drop(o); // failed bundle: nothing changes
    let o = BundleOverlay::new(si.clone(), us.clone());
    assert_eq!(read(&o, &mm_values("b")), nested_all(&["1", "2", "3"]));

    // Clearing the keys removes every map key; later appends survive.
    o.clear(&mm_keys()).unwrap();
    assert!(read(&o, &mm_keys()).is_empty());
    assert!(read(&o, &mm_values("a")).is_empty());
    o.append(&mm_values("c"), nested_all(&["5"])).unwrap();
    assert_eq!(read(&o, &mm_keys()), nested_all(&["c"]));
    us.lock().apply(o.take_writes()).unwrap();
    let o = BundleOverlay::new(si.clone(), us.clone());
    assert_eq!(read(&o, &mm_keys()), nested_all(&["c"]));
    assert_eq!(read(&o, &mm_values("c")), nested_all(&["5"]));
    o.clear(&mm_values("c")).unwrap();
    us.lock().apply(o.take_writes()).unwrap();
    assert!(us.lock().is_empty());

    // Keys and entries are get/clear only.
    let o = BundleOverlay::new(si, us);
    assert!(o.append(&mm_keys(), Bytes::new()).is_err());
    assert!(o.append(&mm_entries(), Bytes::new()).is_err());
}

#[test]
fn multimap_entries_are_kv_of_key_and_iterable_of_values() {
    let (si, us) = stores();
    let o = BundleOverlay::new(si.clone(), us.clone());
    o.append(&mm_values("a"), nested_all(&["1", "22"])).unwrap();
    o.append(&mm_values("b"), nested_all(&["333"])).unwrap();
    // Without the value coder the runner cannot count values.
    let err = o.get(&mm_entries(), None).unwrap_err();
    assert!(err.0.contains("value coder"), "{err}");
    us.lock()
        .set_multimap_value_coder("t", "mm", Coder::StringUtf8);
    o.append(&mm_values("a"), nested_all(&["4444"])).unwrap();
    let mut expected = nested("a").to_vec();
    expected.extend_from_slice(&3i32.to_be_bytes());
    expected.extend_from_slice(&nested_all(&["1", "22", "4444"]));
    expected.extend_from_slice(&nested("b"));
    expected.extend_from_slice(&1i32.to_be_bytes());
    expected.extend_from_slice(&nested_all(&["333"]));
    assert_eq!(read(&o, &mm_entries()), expected);

    // Clearing through the entries key clears the whole multimap.
    o.clear(&mm_entries()).unwrap();
    assert!(read(&o, &mm_entries()).is_empty());
    drop(o);

    // Values that do not walk with the coder are an error, not a panic.
    let o = BundleOverlay::new(si, us);
    o.append(&mm_values("a"), Bytes::from_static(b"\x05ab"))
        .unwrap();
    let err = o.get(&mm_entries(), None).unwrap_err();
    assert!(err.0.contains("do not decode"), "{err}");
}

#[test]
fn retain_windows_drops_every_kind_of_state() {
    let (si, us) = stores();
    let o = BundleOverlay::new(si.clone(), us.clone());
    let in_window = |w: &'static [u8]| {
        [
            StateKey::BagUserState(CellId {
                transform_id: "t".into(),
                state_id: "s".into(),
                window: Bytes::from_static(w),
                key: Bytes::new(),
            }),
            StateKey::OrderedListUserState {
                cell: CellId {
                    transform_id: "t".into(),
                    state_id: "ol".into(),
                    window: Bytes::from_static(w),
                    key: Bytes::new(),
                },
                range: None,
            },
            StateKey::MultimapUserState {
                cell: CellId {
                    transform_id: "t".into(),
                    state_id: "mm".into(),
                    window: Bytes::from_static(w),
                    key: Bytes::new(),
                },
                map_key: nested("m"),
            },
        ]
    };
    for w in [&b"old"[..], &b"new"[..]] {
        let [b, l, m] = in_window(w);
        o.append(&b, nested("x")).unwrap();
        o.append(&l, entries(&[(1, "x")])).unwrap();
        o.append(&m, nested("x")).unwrap();
    }
    us.lock().apply(o.take_writes()).unwrap();
    assert_eq!(us.lock().len(), 6);
    us.lock().retain_windows(|w| &w[..] != b"old").unwrap();
    assert_eq!(us.lock().len(), 3);
    us.lock().retain_windows(|_| false).unwrap();
    assert!(us.lock().is_empty());
}

/// Expiry asks about each window that has state, once, and only those:
/// a window whose cells were all cleared is not asked about, nor after
/// a checkpoint's restore.
#[test]
fn expiry_asks_only_about_windows_that_have_state() {
    let (si, us) = stores();
    let bag = |w: &'static [u8], key: &'static str| {
        StateKey::BagUserState(CellId {
            transform_id: "t".into(),
            state_id: "s".into(),
            window: Bytes::from_static(w),
            key: nested(key),
        })
    };
    let o = BundleOverlay::new(si.clone(), us.clone());
    for (w, key) in [(&b"a"[..], "k"), (b"a", "j"), (b"b", "k"), (b"b", "j")] {
        o.append(&bag(w, key), nested("x")).unwrap();
    }
    us.lock().apply(o.take_writes()).unwrap();
    let o = BundleOverlay::new(si.clone(), us.clone());
    o.clear(&bag(b"a", "k")).unwrap();
    o.clear(&bag(b"a", "j")).unwrap();
    us.lock().apply(o.take_writes()).unwrap();
    let asked = |us: &Mutex<UserStateTable>| {
        let mut asked = Vec::new();
        us.lock()
            .retain_windows(|w| {
                asked.push(w.clone());
                true
            })
            .unwrap();
        asked
    };
    assert_eq!(asked(&us), [Bytes::from_static(b"b")]);
    let snapshot = us.lock().snapshot().unwrap();
    let restored = Mutex::new(UserStateTable::default());
    restored.lock().restore(snapshot, None).unwrap();
    assert_eq!(asked(&restored), [Bytes::from_static(b"b")]);
    us.lock().retain_windows(|w| &w[..] != b"b").unwrap();
    assert!(us.lock().is_empty());
    assert!(asked(&us).is_empty());
}
