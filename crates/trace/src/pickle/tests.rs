#[allow(unused_imports)]
use super::read::*;
#[allow(unused_imports)]
use super::write::*;
use super::*;
use serde_pickle::{HashableValue, Value};

fn pickle_of(v: &Value) -> Vec<u8> {
    serde_pickle::value_to_vec(v, SerOptions::new()).unwrap()
}

fn s(x: &str) -> HashableValue {
    HashableValue::String(x.into())
}

fn dict(items: Vec<(&str, Value)>) -> Value {
    Value::Dict(items.into_iter().map(|(k, v)| (s(k), v)).collect())
}

#[test]
fn wrong_type_names_the_entry() {
    let ev = |size: Value| {
        dict(vec![
            ("action", Value::String("alloc".into())),
            ("addr", Value::I64(4096)),
            ("size", size),
            ("stream", Value::I64(0)),
            ("time_us", Value::I64(1)),
        ])
    };
    let snap = dict(vec![(
        "device_traces",
        Value::List(vec![Value::List(vec![
            ev(Value::I64(512)),
            ev(Value::String("big".into())),
        ])]),
    )]);
    let e = read_pickle(&pickle_of(&snap), "t.pickle").unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.pickle: device_traces[0][1]: field 'size' is a str, expected int"
    );
    assert_eq!(e.kind, ErrorKind::Schema);
}

#[test]
fn missing_optional_keys_take_defaults() {
    let snap = dict(vec![(
        "device_traces",
        Value::List(vec![
            Value::List(vec![]),
            Value::List(vec![dict(vec![
                ("action", Value::String("oom".into())),
                ("device_free", Value::I64(77)),
                ("size", Value::I64(1 << 40)),
            ])]),
        ]),
    )]);
    let t = read_pickle(&pickle_of(&snap), "t").unwrap();
    assert_eq!(t.devices.len(), 1);
    assert_eq!(t.devices[0].device, 1);
    let e = t.devices[0].events[0];
    assert_eq!(
        (e.action, e.addr, e.size, e.stream, e.time_us, e.stack),
        (Action::Oom, 77, 1 << 40, 0, 0, None)
    );
    assert_eq!(t.settings, AllocatorSettings::default());
    assert!(t.segments.is_empty());
}

#[test]
fn block_addresses_and_sizes_are_computed_when_missing() {
    let blk = |size: i64, state: &str| dict(vec![("size", Value::I64(size)), ("state", Value::String(state.into()))]);
    let seg = dict(vec![
        ("address", Value::I64(1 << 20)),
        (
            "blocks",
            Value::List(vec![blk(512, "active_allocated"), blk(1536, "inactive")]),
        ),
    ]);
    let t = read_pickle(&pickle_of(&Value::List(vec![seg])), "segs").unwrap();
    let g = &t.segments[0];
    assert_eq!(g.blocks[1].address, (1 << 20) + 512);
    assert_eq!(
        (g.total_size, g.allocated_size, g.active_size, g.requested_size),
        (2048, 512, 512, 512)
    );
}

#[test]
fn unknown_action_and_bad_top_level() {
    let snap = dict(vec![(
        "device_traces",
        Value::List(vec![Value::List(vec![dict(vec![
            ("action", Value::String("teleport".into())),
            ("addr", Value::I64(0)),
            ("size", Value::I64(0)),
        ])])]),
    )]);
    let e = read_pickle(&pickle_of(&snap), "t").unwrap_err();
    assert!(
        e.to_string().contains("device_traces[0][0]: unknown action 'teleport'"),
        "{e}"
    );
    let e = read_pickle(&pickle_of(&Value::I64(3)), "t").unwrap_err();
    assert!(e.to_string().contains("snapshot is a int, expected dict"), "{e}");
    let e = read_pickle(b"\x80\x04\x95", "t").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Pickle);
}

#[test]
fn frame_errors_have_a_path() {
    let snap = dict(vec![(
        "segments",
        Value::List(vec![dict(vec![
            ("address", Value::I64(0)),
            (
                "frames",
                Value::List(vec![dict(vec![("line", Value::String("x".into()))])]),
            ),
        ])]),
    )]);
    let e = read_pickle(&pickle_of(&snap), "t").unwrap_err();
    assert_eq!(
        e.to_string(),
        "t: segments[0].frames[0]: field 'line' is a str, expected int"
    );
}
