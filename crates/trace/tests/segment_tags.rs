//! cudamem's `tag` and `asleep` keys of snapshot segments: written only on the segments they
//! describe (a PyTorch snapshot comes back without them), read back equal from both formats,
//! and a wrong type or a bad compact record is an error naming it.

use cudamem_trace::{read_compact, read_pickle, write_compact, write_snapshot_pickle, SegmentSnapshot, Trace};
use serde_pickle::{DeOptions, HashableValue, Value};

fn trace(segments: Vec<SegmentSnapshot>) -> Trace {
    Trace {
        source: "t".into(),
        segments,
        ..Default::default()
    }
}

fn seg(address: u64, tag: Option<&str>, asleep: bool) -> SegmentSnapshot {
    SegmentSnapshot {
        address,
        total_size: 2 << 20,
        tag: tag.map(str::to_string),
        asleep,
        ..Default::default()
    }
}

/// The keys of each segment dict of the pickle.
fn segment_keys(bytes: &[u8]) -> Vec<Vec<String>> {
    let Value::Dict(top) = serde_pickle::value_from_slice(bytes, DeOptions::new()).unwrap() else {
        panic!("not a dict");
    };
    let Some(Value::List(segs)) = top.get(&HashableValue::String("segments".into())) else {
        panic!("no segments");
    };
    segs.iter()
        .map(|s| match s {
            Value::Dict(d) => (d.keys())
                .map(|k| match k {
                    HashableValue::String(s) => s.clone(),
                    other => panic!("{other:?}"),
                })
                .collect(),
            other => panic!("{other:?}"),
        })
        .collect()
}

#[test]
fn tags_are_written_only_where_present_and_read_back_from_both_formats() {
    let t = trace(vec![
        seg(1 << 30, None, false),
        seg(2 << 30, Some("weights"), true),
        seg(3 << 30, Some("kv"), false),
    ]);
    let mut p = Vec::new();
    write_snapshot_pickle(&t, &mut p).unwrap();
    let keys = segment_keys(&p);
    assert!(!keys[0].iter().any(|k| k == "tag" || k == "asleep"), "{:?}", keys[0]);
    for k in &keys[1..] {
        assert!(k.iter().any(|k| k == "tag") && k.iter().any(|k| k == "asleep"), "{k:?}");
    }
    assert_eq!(read_pickle(&p, "t").unwrap().segments, t.segments);
    let mut c = Vec::new();
    write_compact(&t, &mut c).unwrap();
    assert_eq!(read_compact(&c, "t").unwrap().segments, t.segments);

    // Without tags the compact file has no STAG section at all.
    let plain = trace(vec![seg(1 << 30, None, false)]);
    let mut c = Vec::new();
    write_compact(&plain, &mut c).unwrap();
    assert!(!c.windows(4).any(|w| w == b"STAG"));
}

#[test]
fn a_tag_of_the_wrong_type_is_an_error_naming_the_segment() {
    let s = |k: &str| HashableValue::String(k.into());
    let seg = Value::Dict(
        [(s("address"), Value::I64(4096)), (s("tag"), Value::I64(3))]
            .into_iter()
            .collect(),
    );
    let top = Value::Dict([(s("segments"), Value::List(vec![seg]))].into_iter().collect());
    let bytes = serde_pickle::value_to_vec(&top, serde_pickle::SerOptions::new()).unwrap();
    let e = read_pickle(&bytes, "t").unwrap_err().to_string();
    assert_eq!(e, "t: segments[0]: field 'tag' is a int, expected str");
}
