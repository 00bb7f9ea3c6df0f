//! Allocations named in `ReplayOptions::shrink_on_oom` ask for half as much, down to nothing,
//! when they do not fit, instead of failing (a caller that catches the out-of-memory error);
//! every other allocation still fails.

use cudamem_replay::{replay, ReplayOptions};
use cudamem_trace::{Action, DeviceTrace, Frame, Stack, Trace, TraceEvent};

const MIB: u64 = 1 << 20;

fn ev(action: Action, addr: u64, size: u64, stack: Option<u32>) -> TraceEvent {
    TraceEvent {
        action,
        addr,
        size,
        stream: 0,
        time_us: 0,
        stack,
    }
}

/// `live` MiB held, then a `workspace` MiB allocation with stack 0 ("workspace"), freed, then
/// `after` MiB with stack 1 ("activation").
fn trace(live: u64, workspace: u64, after: u64) -> Trace {
    let mut events = vec![ev(Action::Alloc, 0x1000_0000, live * MIB, Some(1))];
    events.push(ev(Action::Alloc, 0x2000_0000, workspace * MIB, Some(0)));
    events.push(ev(Action::FreeRequested, 0x2000_0000, workspace * MIB, Some(0)));
    events.push(ev(Action::FreeCompleted, 0x2000_0000, workspace * MIB, Some(0)));
    events.push(ev(Action::Alloc, 0x3000_0000, after * MIB, Some(1)));
    let stack = |name: &str| Stack {
        frames: vec![Frame {
            name: name.into(),
            ..Frame::default()
        }],
    };
    Trace {
        source: "shrink".into(),
        devices: vec![DeviceTrace { device: 0, events }],
        stacks: vec![stack("workspace"), stack("activation")],
        ..Default::default()
    }
}

fn run(t: &Trace, shrink: &[&str]) -> (u64, u64) {
    let r = replay(
        t,
        &ReplayOptions {
            capacity: 100 * MIB,
            repeats: 0,
            shrink_on_oom: shrink.iter().map(|s| s.to_string()).collect(),
            ..ReplayOptions::default()
        },
    )
    .unwrap();
    (r.devices[0].ooms, r.devices[0].peak_reserved_bytes)
}

#[test]
fn a_shrinking_allocation_takes_what_fits_and_others_still_fail() {
    // 60 MiB live; a 64 MiB workspace does not fit in 100 MiB, its half (32 MiB) does.
    let t = trace(60, 64, 30);
    assert_eq!(run(&t, &[]), (1, 90 * MIB), "without shrinking the workspace fails");
    assert_eq!(run(&t, &["workspace"]), (0, 92 * MIB), "60 + 32 MiB: the half fits");
    // Only the named frames shrink: the activation that does not fit still fails.
    assert_eq!(run(&trace(60, 64, 50), &["workspace"]).0, 1);
    assert_eq!(run(&t, &["activation"]).0, 1);
    // Nothing fits at all: the workspace goes without, and the job goes on.
    assert_eq!(run(&trace(100, 8, 0), &["workspace"]).0, 0);
}
