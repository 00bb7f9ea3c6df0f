//! Regressions found by the `pickle` fuzz target (fuzz/, scripts/fuzz.sh).
//!
//! **Device ordinals are unbounded.** Every reader accepts any non-negative `i32` as the
//! device of a segment (and the compact reader as the device of an event list), and
//! `write_snapshot_pickle` writes one `device_traces` list for every ordinal up to the largest
//! one among the events *and the segments*. A 633-byte snapshot whose second segment says
//! `device: 1761607680` therefore reads fine, and writing it back produces a 1.7 GB pickle in
//! 38 s, which `read_pickle` then needs about 20 GB to read (the fuzzer's inputs were killed
//! by the out-of-memory limit). The same holds for any conversion to a pickle (e.g. the CLI
//! converting a compact trace).
//!
//! Proposed fix (in `crates/trace`): reject device ordinals above a bound that no machine
//! reaches (e.g. 1024 — CUDA has no API for more devices in a process than fit in a few
//! hundred) in `Trace::validate`, which every reader and writer already calls, with an error
//! naming the entry (`segments[1]: device ordinal 1761607680 is out of range`), and/or have
//! the writer size `device_traces` by the devices that have events only (segments carry their
//! own `device` field). These tests fail until then; each checks the bound before writing
//! anything, so a failure is quick and small.

use cudamem_trace::{
    read_compact, read_pickle, write_compact, write_snapshot_pickle, DeviceTrace, SegmentSnapshot, Trace,
};
use serde_pickle::value::{HashableValue, Value};
use serde_pickle::SerOptions;

/// The bound the fix is expected to enforce (any value up to a few thousand would do).
const MAX_ORDINAL: i32 = 1024;

fn key(s: &str) -> HashableValue {
    HashableValue::String(s.into())
}

fn dict(entries: Vec<(&str, Value)>) -> Value {
    Value::Dict(entries.into_iter().map(|(k, v)| (key(k), v)).collect())
}

/// A PyTorch-style snapshot with one event on device 0 and a second segment on `device`.
fn snapshot_with_segment_on(device: i64) -> Vec<u8> {
    let segment = |device: i64, address: i64| {
        dict(vec![
            ("device", Value::I64(device)),
            ("address", Value::I64(address)),
            ("total_size", Value::I64(20 << 20)),
            ("stream", Value::I64(0)),
            ("segment_type", Value::String("large".into())),
            (
                "blocks",
                Value::List(vec![dict(vec![
                    ("size", Value::I64(20 << 20)),
                    ("requested_size", Value::I64(20 << 20)),
                    ("state", Value::String("active_allocated".into())),
                ])]),
            ),
        ])
    };
    let event = dict(vec![
        ("action", Value::String("alloc".into())),
        ("addr", Value::I64(0x7f65_8600_0000)),
        ("size", Value::I64(20 << 20)),
        ("stream", Value::I64(0)),
        ("time_us", Value::I64(1)),
    ]);
    let top = dict(vec![
        (
            "segments",
            Value::List(vec![segment(0, 0x7f65_8600_0000), segment(device, 0x7f65_8b40_0000)]),
        ),
        ("device_traces", Value::List(vec![Value::List(vec![event])])),
    ]);
    serde_pickle::value_to_vec(&top, SerOptions::new()).unwrap()
}

fn ordinals(t: &Trace) -> impl Iterator<Item = i32> + '_ {
    t.devices
        .iter()
        .map(|d| d.device)
        .chain(t.segments.iter().map(|s| s.device))
        .chain(t.annotations.iter().map(|a| a.device))
}

/// Either the reader rejects the trace, or every ordinal in it is small and the pickle written
/// back is small too.
fn check_bounded(r: Result<Trace, cudamem_trace::TraceError>, what: &str) {
    match r {
        Err(e) => assert!(
            e.to_string().contains("device"),
            "{what}: rejected, but the message does not say why: {e}"
        ),
        Ok(t) => {
            let max = ordinals(&t).max().unwrap_or(0);
            assert!(
                max <= MAX_ORDINAL,
                "{what}: accepted a trace with device ordinal {max}; write_snapshot_pickle would write {max} \
                 device_traces lists (about {} MB)",
                max / 1_000_000
            );
            let mut out = Vec::new();
            if write_snapshot_pickle(&t, &mut out).is_ok() {
                assert!(out.len() < 1 << 20, "{what}: {} bytes written", out.len());
            }
        }
    }
}

#[test]
fn snapshot_pickle_with_a_segment_on_device_1761607680_is_rejected_or_bounded() {
    let bytes = snapshot_with_segment_on(1_761_607_680);
    assert!(bytes.len() < 1024);
    check_bounded(read_pickle(&bytes, "fuzz.pickle"), "read_pickle");
}

#[test]
fn compact_trace_with_huge_device_ordinals_is_rejected_or_bounded() {
    let t = Trace {
        source: "fuzz".into(),
        devices: vec![DeviceTrace {
            device: i32::MAX,
            events: Vec::new(),
        }],
        segments: vec![SegmentSnapshot {
            device: i32::MAX - 1,
            address: 0x7f00_0000_0000,
            total_size: 2 << 20,
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut bytes = Vec::new();
    if write_compact(&t, &mut bytes).is_ok() {
        check_bounded(read_compact(&bytes, "fuzz.cmt"), "read_compact");
    }
}

#[test]
fn snapshot_pickle_writer_output_stays_proportional_to_the_trace() {
    // A trace as the readers accept it today: one segment on device 3,000,000.
    let t = Trace {
        source: "fuzz".into(),
        segments: vec![SegmentSnapshot {
            device: 3_000_000,
            address: 0x7f00_0000_0000,
            total_size: 2 << 20,
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut out = Vec::new();
    if write_snapshot_pickle(&t, &mut out).is_ok() {
        assert!(out.len() < 64 << 10, "one segment became a {} byte pickle", out.len());
    }
}
