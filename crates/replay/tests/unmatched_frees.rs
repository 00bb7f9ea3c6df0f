//! A trace that frees addresses it never allocated (allocations made before recording started):
//! the replay skips those frees and counts them, per device.

use cudamem_replay::{replay, ReplayOptions};
use cudamem_trace::{Action, DeviceTrace, Trace, TraceEvent};

fn ev(action: Action, addr: u64) -> TraceEvent {
    TraceEvent {
        action,
        addr,
        size: 1 << 20,
        stream: 0,
        time_us: 0,
        stack: None,
    }
}

fn free(addr: u64) -> [TraceEvent; 2] {
    [ev(Action::FreeRequested, addr), ev(Action::FreeCompleted, addr)]
}

#[test]
fn frees_of_never_allocated_addresses_are_counted_per_device() {
    let mut d0 = vec![ev(Action::Alloc, 0x10_0000)];
    d0.extend(free(0xdead_0000)); // never allocated
    d0.extend(free(0x10_0000));
    d0.extend(free(0x10_0000)); // freed twice: the second free has nothing to free
    d0.extend(free(0xbeef_0000));
    let mut d1 = vec![ev(Action::Alloc, 0x20_0000)];
    d1.extend(free(0x20_0000));
    let t = Trace {
        source: "unmatched".into(),
        devices: vec![
            DeviceTrace { device: 0, events: d0 },
            DeviceTrace { device: 1, events: d1 },
        ],
        ..Default::default()
    };
    for policy in ["pytorch", "cudamem"] {
        let r = replay(
            &t,
            &ReplayOptions {
                policy: policy.into(),
                repeats: 0,
                ..ReplayOptions::default()
            },
        )
        .unwrap();
        assert_eq!(r.devices[0].unmatched_frees, 3, "{policy}");
        assert_eq!(r.devices[1].unmatched_frees, 0, "{policy}");
        assert_eq!(r.total(|d| d.unmatched_frees), 3);
        // The matched ones replay as usual.
        assert_eq!(r.devices[0].peak_requested_bytes, 1 << 20);
        assert_eq!(r.devices[0].stats_at_end.allocated_bytes.all().current, 0);
    }
}

#[test]
fn an_address_allocated_twice_is_reported_with_its_events() {
    let mut d0 = vec![ev(Action::Alloc, 0x10_0000), ev(Action::Alloc, 0x10_0000)];
    d0.extend(free(0x10_0000));
    let t = Trace {
        source: "double".into(),
        devices: vec![DeviceTrace { device: 0, events: d0 }],
        ..Default::default()
    };
    let opts = ReplayOptions {
        repeats: 0,
        ..ReplayOptions::default()
    };
    let r = replay(&t, &opts).unwrap();
    assert_eq!(r.devices[0].double_allocs.count, 1);
    assert_eq!(r.devices[0].double_allocs.first, Some((0x10_0000, 1, 0)));
}
