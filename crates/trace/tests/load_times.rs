//! Load times, printed (not asserted: they depend on the machine and on
//! the build profile; run with `cargo test --release -p cudamem-trace --test
//! load_times -- --nocapture` for meaningful numbers).

mod common;

use std::time::Instant;

use common::trace_path;
use cudamem_trace::{read_compact, read_path, write_compact, Action, DeviceTrace, Trace, TraceEvent};

#[test]
fn load_time_of_the_largest_shared_trace() {
    let path = trace_path("bert_varlen_infer");
    let t0 = Instant::now();
    let t = read_path(&path).unwrap();
    let pickle = t0.elapsed();
    let mut bytes = Vec::new();
    write_compact(&t, &mut bytes).unwrap();
    let t1 = Instant::now();
    let c = read_compact(&bytes, "bert").unwrap();
    let compact = t1.elapsed();
    assert_eq!(c.devices, t.devices);
    println!(
        "bert_varlen_infer: {} events; .pickle.gz ({} bytes) loads in {:?}; compact ({} bytes) in {:?}",
        t.num_events(),
        std::fs::metadata(&path).unwrap().len(),
        pickle,
        bytes.len(),
        compact
    );
}

/// A synthetic trace of `n` events: alloc/free pairs over a few streams and
/// stacks, with segment allocations now and then.
fn synthetic(n: usize) -> Trace {
    let mut t = Trace::new("synthetic");
    t.stacks = (0..64)
        .map(|i| cudamem_trace::Stack {
            frames: vec![cudamem_trace::Frame {
                name: format!("f{i}"),
                filename: "gen.py".into(),
                line: i,
            }],
        })
        .collect();
    let mut events = Vec::with_capacity(n);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let action = match i % 7 {
            0 => Action::SegmentAlloc,
            1 | 2 => Action::Alloc,
            3 | 4 => Action::FreeRequested,
            _ => Action::FreeCompleted,
        };
        events.push(TraceEvent {
            action,
            addr: 0x7f00_0000_0000 + (x & 0xffff_ffff) * 512,
            size: (x >> 40) * 512,
            stream: x % 3,
            time_us: 1_700_000_000_000_000 + i as i64,
            stack: if x % 5 == 0 { None } else { Some((x % 64) as u32) },
        });
    }
    t.devices.push(DeviceTrace { device: 0, events });
    t
}

#[test]
fn load_time_of_a_million_event_compact_file() {
    let t = synthetic(1_000_000);
    let mut bytes = Vec::new();
    let t0 = Instant::now();
    write_compact(&t, &mut bytes).unwrap();
    let write = t0.elapsed();
    let t1 = Instant::now();
    let back = read_compact(&bytes, "synthetic").unwrap();
    let read = t1.elapsed();
    assert_eq!(back, t);
    println!(
        "1M-event compact file: {} bytes; written in {:?}, loaded in {:?} ({} build)",
        bytes.len(),
        write,
        read,
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
}
