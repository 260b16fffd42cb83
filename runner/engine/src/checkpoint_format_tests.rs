//! The bytes checkpoints hold of user state and timers, pinned: a
//! checkpoint written by an earlier build must restore in this one, so
//! changing how the engine names a state cell or a timer in memory must
//! not change what it writes. The hex vectors were printed by the build
//! before those identities became named structs (when they were tuples).

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::coder::{PaneInfo, TimerValue};
use crate::plan::{SideInputId, TimeDomain};
use crate::spill::MemorySpillSpace;
use crate::state::{encode_ordered_entry, BundleState, CellId, StateKey};
use crate::state::{BundleOverlay, SideInputTable, SpilledBags, UserStateSnapshot, UserStateTable};
use crate::timers::TimerStore;
use crate::window::Window;

/// Bytes from a hex literal (whitespace ignored).
fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|pair| {
            let pair = std::str::from_utf8(pair).expect("ascii");
            u8::from_str_radix(pair, 16).expect("a hex byte")
        })
        .collect()
}

/// Bytes as the hex a vector here is written in.
fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One bag (spilled to `spill` when it is set), one ordered list and one
/// multimap, in two windows and two keys.
fn user_state(spill: Option<Arc<MemorySpillSpace>>) -> Arc<Mutex<UserStateTable>> {
    let mut store = UserStateTable::default();
    if let Some(spill) = spill {
        store.enable_durable_bag_spill(spill, b"bags/".to_vec(), 0);
    }
    let store = Arc::new(Mutex::new(store));
    let overlay = BundleOverlay::new(Arc::default(), store.clone());
    let bag = StateKey::BagUserState(CellId {
        transform_id: "t".into(),
        state_id: "bag".into(),
        window: Bytes::from_static(b"w1"),
        key: Bytes::from_static(b"\x01a"),
    });
    overlay
        .append(&bag, Bytes::from_static(b"\x01x"))
        .expect("appends");
    let list = StateKey::OrderedListUserState {
        cell: CellId {
            transform_id: "t".into(),
            state_id: "list".into(),
            window: Bytes::from_static(b"w2"),
            key: Bytes::from_static(b"\x01b"),
        },
        range: None,
    };
    let mut entry = Vec::new();
    encode_ordered_entry(7, b"\x01y", &mut entry);
    overlay.append(&list, Bytes::from(entry)).expect("appends");
    let map = StateKey::MultimapUserState {
        cell: CellId {
            transform_id: "t".into(),
            state_id: "map".into(),
            window: Bytes::from_static(b"w1"),
            key: Bytes::from_static(b"\x01b"),
        },
        map_key: Bytes::from_static(b"\x01m"),
    };
    overlay
        .append(&map, Bytes::from_static(b"\x01z"))
        .expect("appends");
    store.lock().apply(overlay.take_writes()).expect("applies");
    store
}

/// Part `user_state/{i}` of the cells [`user_state`] writes.
const USER_STATE: &str = "0101740362616702773102016101020178010174046c69737402773202016201 \
    0e01020179010174036d61700277310201620102016d0102017a";

#[test]
fn user_state_checkpoints_keep_their_bytes() {
    let snapshot = user_state(None).lock().snapshot().expect("snapshot");
    let bytes = postcard::to_stdvec(&snapshot).expect("encodes");
    assert_eq!(to_hex(&bytes), to_hex(&hex(USER_STATE)));
    let mut restored = UserStateTable::default();
    let read: UserStateSnapshot = postcard::from_bytes(&hex(USER_STATE)).expect("decodes");
    restored.restore(read, None).expect("restores");
    assert_eq!(restored.len(), 3);
    let again = restored.snapshot().expect("snapshot");
    assert_eq!(postcard::to_stdvec(&again).expect("encodes"), bytes);
}

/// Part `user_state_spill/{i}` of the same cells, the bag on a durable
/// store.
const SPILLED_BAGS: &str = "010101017403626167027731020161000101000000";

#[test]
fn spilled_bag_checkpoints_keep_their_bytes() {
    let spill = MemorySpillSpace::shared();
    let store = user_state(Some(spill.clone()));
    let (_, spilled) = store.lock().checkpoint(1).expect("checkpoint");
    let spilled = spilled.expect("the bag is on the durable spill space");
    let bytes = postcard::to_stdvec(&spilled).expect("encodes");
    assert_eq!(to_hex(&bytes), to_hex(&hex(SPILLED_BAGS)));
    let read: SpilledBags = postcard::from_bytes(&hex(SPILLED_BAGS)).expect("decodes");
    assert_eq!(read, spilled);
}

/// A timer of `key` in `window` firing at `fire`.
fn timer(key: &'static [u8], window: Window, fire: i64) -> TimerValue {
    TimerValue {
        user_key: Bytes::from_static(key),
        dynamic_tag: "tag".into(),
        windows: smallvec::smallvec![window],
        clear: false,
        fire_timestamp: fire,
        hold_timestamp: fire - 1,
        pane: PaneInfo::NO_FIRING,
    }
}

/// The timers of a stage (in part `stage/{i}`): two event-time timers of
/// one family, a processing-time timer of another.
const TIMERS: &str = "030174056576656e740201620374616700000201620374616701000006040101 \
    0300000174056576656e74020161037461670100140002016103746167010100 \
    14000a08010103000001740a70726f63657373696e6702016103746167000102 \
    016103746167010000c801c6010101030000";

#[test]
fn timer_checkpoints_keep_their_bytes() {
    let mut store = TimerStore::default();
    let interval = Window::Interval { start: 0, end: 10 };
    let event = vec![
        timer(b"\x01a", interval, 5),
        timer(b"\x01b", Window::Global, 3),
    ];
    store.apply("t", "event", TimeDomain::EventTime, event);
    let processing = vec![timer(b"\x01a", Window::Global, 100)];
    store.apply("t", "processing", TimeDomain::ProcessingTime, processing);
    let bytes = postcard::to_stdvec(&store).expect("encodes");
    assert_eq!(to_hex(&bytes), to_hex(&hex(TIMERS)));
    let read: TimerStore = postcard::from_bytes(&hex(TIMERS)).expect("decodes");
    assert_eq!(postcard::to_stdvec(&read).expect("encodes"), bytes);
}

/// The side-input part as it was written while side inputs were named by
/// (transform, tag) tuples: the same fields, nested in tuples.
type TupleSideInputs = (
    Vec<((String, String, Bytes), Vec<Bytes>)>,
    Vec<(
        (String, String, Bytes),
        Vec<Bytes>,
        Vec<(Bytes, Vec<Bytes>)>,
    )>,
    Vec<(String, String)>,
);

#[test]
fn side_input_checkpoints_keep_their_bytes() {
    let mut store = SideInputTable::default();
    let iterable = SideInputId::new("t", "side0");
    let multimap = SideInputId::new("u", "side1");
    store.add_iterable(
        &iterable,
        Bytes::from_static(b"w"),
        Bytes::from_static(b"\x01x"),
    );
    store.add_multimap(
        &multimap,
        Bytes::from_static(b"w"),
        Bytes::from_static(b"\x01k"),
        Bytes::from_static(b"\x01v"),
    );
    store.mark_ready(&iterable);
    let bytes = postcard::to_stdvec(&store.snapshot()).expect("encodes");
    let s = |text: &str| text.to_string();
    let b = Bytes::from_static;
    let tuples: TupleSideInputs = (
        vec![((s("t"), s("side0"), b(b"w")), vec![b(b"\x01x")])],
        vec![(
            (s("u"), s("side1"), b(b"w")),
            vec![b(b"\x01k")],
            vec![(b(b"\x01k"), vec![b(b"\x01v")])],
        )],
        vec![(s("t"), s("side0"))],
    );
    assert_eq!(bytes, postcard::to_stdvec(&tuples).expect("encodes"));
    let read = SideInputTable::restore(postcard::from_bytes(&bytes).expect("decodes"));
    assert_eq!(
        postcard::to_stdvec(&read.snapshot()).expect("encodes"),
        bytes
    );
}
