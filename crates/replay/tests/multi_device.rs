//! A trace that carries several devices replays them together, each on its own simulated GPU
//! with its own allocator: no memory moves between devices.

use cudamem_replay::{replay, ReplayOptions};
use cudamem_trace::{Action, DeviceTrace, Trace, TraceEvent};

fn ev(action: Action, addr: u64, size: u64) -> TraceEvent {
    TraceEvent {
        action,
        addr,
        size,
        stream: 0,
        time_us: 0,
        stack: None,
    }
}

/// Device `d` allocates `n` blocks of `size` bytes, then frees them.
fn device(d: i32, n: u64, size: u64) -> DeviceTrace {
    let mut events = Vec::new();
    for i in 0..n {
        events.push(ev(Action::Alloc, 0x1000_0000 * (d as u64 + 1) + i * size, size));
    }
    for i in 0..n {
        let a = 0x1000_0000 * (d as u64 + 1) + i * size;
        events.push(ev(Action::FreeRequested, a, size));
        events.push(ev(Action::FreeCompleted, a, size));
    }
    DeviceTrace { device: d, events }
}

#[test]
fn each_device_replays_on_its_own_gpu() {
    let t = Trace {
        source: "two-gpus".into(),
        devices: vec![device(0, 10, 30 << 20), device(1, 3, 100 << 20)],
        ..Default::default()
    };
    for policy in ["pytorch", "pytorch-expandable", "cudamem"] {
        let r = replay(
            &t,
            &ReplayOptions {
                policy: policy.into(),
                repeats: 0,
                ..ReplayOptions::default()
            },
        )
        .unwrap();
        assert_eq!(r.devices.len(), 2);
        assert_eq!(r.devices[0].device, 0);
        assert_eq!(r.devices[1].device, 1);
        assert_eq!(r.devices[0].peak_requested_bytes, 300 << 20, "{policy}");
        assert_eq!(r.devices[1].peak_requested_bytes, 300 << 20, "{policy}");
        assert_eq!(r.devices[0].ops, 20);
        assert_eq!(r.devices[1].ops, 6);
        // Each GPU only ever holds its own device's blocks.
        assert!(r.devices[0].peak_reserved_bytes < 2 * (300 << 20));
        assert!(r.devices[1].peak_reserved_bytes < 2 * (300 << 20));
    }
}

#[test]
fn a_device_that_does_not_fit_fails_alone() {
    let t = Trace {
        source: "two-gpus".into(),
        devices: vec![device(0, 2, 10 << 20), device(1, 4, 1 << 30)],
        ..Default::default()
    };
    let o = ReplayOptions {
        capacity: 2 << 30,
        repeats: 0,
        ..ReplayOptions::default()
    };
    let r = replay(&t, &o).unwrap();
    assert_eq!(r.devices[0].ooms, 0);
    assert_eq!(r.devices[1].ooms, 2, "the 3rd and 4th GiB do not fit on device 1");
}
