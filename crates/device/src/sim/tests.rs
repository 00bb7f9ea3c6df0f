//! Unit tests of the simulated device: capacity, bad frees, planned addresses, mappings, stored
//! bytes, manual events and injected faults.

use super::vmm::VA_BASE;
use super::*;
use crate::{Device, DeviceError};

#[test]
fn capacity_is_enforced_and_returned() {
    let d = SimDevice::with_capacity(10 << 20);
    let a = d.malloc(6 << 20).unwrap();
    assert!(d.malloc(6 << 20).unwrap_err().is_out_of_memory());
    d.free(a, 6 << 20).unwrap();
    let b = d.malloc(6 << 20).unwrap();
    assert_eq!(a, b, "freed address range is reused first-fit");
    assert_eq!(d.mem_get_info().unwrap(), (4 << 20, 10 << 20));
    d.check().unwrap();
}

/// The addresses of `n` segments of 2 to 40 MiB on a device placing them `placement`.
fn placed(placement: Placement, n: u64) -> Vec<u64> {
    let d = SimDevice::new(SimConfig {
        placement,
        ..SimConfig::default()
    });
    let addrs: Vec<u64> = (0..n).map(|i| d.malloc((2 + i % 20 * 2) << 20).unwrap()).collect();
    d.check().unwrap();
    addrs
}

fn ascending(a: &[u64]) -> bool {
    a.windows(2).all(|w| w[0] < w[1])
}

#[test]
fn placements_order_segments_as_they_say() {
    assert!(ascending(&placed(Placement::LowestFree, 40)));
    let mut highest = placed(Placement::HighestFree, 40);
    highest.reverse();
    assert!(ascending(&highest), "highest first: each segment below the one before");
    let one = placed(Placement::Shuffled(7), 40);
    assert_eq!(
        one,
        placed(Placement::Shuffled(7), 40),
        "one seed, one sequence of addresses"
    );
    assert_ne!(one, placed(Placement::Shuffled(8), 40));
    assert!(!ascending(&one) && one.iter().all(|a| a % (2 << 20) == 0));
    // A shuffled device still reuses a freed range for a planned address and keeps capacity.
    let d = SimDevice::new(SimConfig {
        capacity: 10 << 20,
        placement: Placement::Shuffled(1),
        ..SimConfig::default()
    });
    let a = d.malloc(6 << 20).unwrap();
    assert!(d.malloc(6 << 20).unwrap_err().is_out_of_memory());
    d.free(a, 6 << 20).unwrap();
    d.plan_addresses([a]);
    assert_eq!(d.malloc(6 << 20).unwrap(), a);
}

#[test]
fn placements_parse_and_print() {
    for text in ["lowest", "highest", "shuffled:0", "shuffled:18446744073709551615"] {
        assert_eq!(text.parse::<Placement>().unwrap().to_string(), text);
    }
    for bad in [
        "",
        "random",
        "shuffled",
        "shuffled:",
        "shuffled:-1",
        "shuffled:x",
        "lowest:1",
    ] {
        let e = bad.parse::<Placement>().unwrap_err();
        assert!(e.contains("placement"), "{bad}: {e}");
    }
}

#[test]
fn bad_free_is_an_error_and_changes_nothing() {
    let d = SimDevice::default();
    let a = d.malloc(2 << 20).unwrap();
    assert!(d.free(a + 512, 2 << 20).is_err());
    assert!(d.free(a, 4 << 20).is_err());
    assert_eq!(d.used(), 2 << 20);
    d.free(a, 2 << 20).unwrap();
    assert_eq!(d.used(), 0);
}

#[test]
fn planned_addresses_are_used_in_order() {
    let d = SimDevice::default();
    let want = VA_BASE + (64 << 20);
    d.plan_addresses([want]);
    assert_eq!(d.malloc(2 << 20).unwrap(), want);
    assert_ne!(d.malloc(2 << 20).unwrap(), want);
}

#[test]
fn map_and_unmap_pages_inside_a_reservation() {
    let d = SimDevice::with_capacity(8 << 20);
    let g = d.granularity();
    let base = d.reserve(64 << 20).unwrap();
    d.map(base, 2 * g).unwrap();
    assert!(d.map(base + g, g).is_err(), "double map rejected");
    assert!(d.unmap(base, g).is_err(), "a mapping is unmapped whole");
    assert!(d.map(base + 2 * g, 4 * g).unwrap_err().is_out_of_memory());
    assert_eq!(d.used(), 2 * g);
    assert!(d.release_reservation(base, 64 << 20).is_err());
    d.unmap(base, 2 * g).unwrap();
    d.release_reservation(base, 64 << 20).unwrap();
    let c = d.counters();
    assert_eq!((c.maps, c.unmaps, c.pages_mapped, c.pages_unmapped), (1, 1, 2, 2));
    d.check().unwrap();
}

#[test]
fn bytes_round_trip_and_die_with_their_memory() {
    let d = SimDevice::default();
    let g = d.granularity();
    let base = d.reserve(8 * g).unwrap();
    assert!(d.write(base, b"x").is_err(), "unmapped memory holds no bytes");
    d.map(base, g).unwrap();
    d.map(base + g, g).unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let at = base + g - 5000; // straddles the two mappings
    d.write(at, &data).unwrap();
    assert_eq!(d.read(at, data.len() as u64).unwrap(), data);
    let mut out = vec![0; 100];
    d.copy_to_host(at, &mut out).unwrap();
    assert_eq!(out, data[..100]);
    assert_eq!(
        d.read(base + 2 * g - 8, 8).unwrap(),
        vec![0; 8],
        "unwritten bytes read as zero"
    );
    assert!(
        d.read(base + 2 * g - 8, 16).is_err(),
        "a read past the mappings is refused"
    );
    d.unmap(base + g, g).unwrap();
    d.map(base + g, g).unwrap();
    assert_eq!(d.read(base + g, 8).unwrap(), vec![0; 8], "new pages hold no old bytes");
    assert_eq!(d.read(at, 8).unwrap(), data[..8], "the other mapping keeps its bytes");
    let seg = d.malloc(1 << 20).unwrap();
    d.copy_from_host(seg + 7, b"abc").unwrap();
    assert_eq!(d.read(seg + 6, 5).unwrap(), b"\0abc\0");
    d.free(seg, 1 << 20).unwrap();
    d.unmap(base, 2 * g).unwrap();
    assert_eq!(d.stored_bytes(), 0);
    d.set_faults(FaultPlan::default().fail_nth(FaultOp::Copy, 1));
    d.map(base, g).unwrap();
    assert!(d.copy_from_host(base, b"a").is_err());
    d.copy_from_host(base, b"a").unwrap();
    d.check().unwrap();
}

#[test]
fn manual_events_complete_when_told() {
    let d = SimDevice::new(SimConfig {
        event_mode: EventMode::Manual,
        ..SimConfig::default()
    });
    let s1 = StreamId(7);
    let e1 = d.record_event(s1).unwrap();
    let e2 = d.record_event(StreamId(8)).unwrap();
    assert!(!d.query_event(e1).unwrap());
    d.complete_stream(s1);
    assert!(d.query_event(e1).unwrap());
    assert!(!d.query_event(e2).unwrap());
    d.synchronize_event(e2).unwrap();
    assert!(d.query_event(e2).unwrap());
}

#[test]
fn faults_fail_the_chosen_calls() {
    let d = SimDevice::default();
    d.set_faults(FaultPlan::default().fail_nth(FaultOp::Malloc, 2));
    assert!(d.malloc(2 << 20).is_ok());
    assert!(matches!(d.malloc(2 << 20), Err(DeviceError::Injected { .. })));
    assert!(d.malloc(2 << 20).is_ok());
    d.set_faults(FaultPlan::default().fail_fraction(&[FaultOp::Malloc], 0.5, 42));
    let fails = (0..200).filter(|_| d.malloc(512).is_err()).count();
    assert!((50..150).contains(&fails), "about half fail: {fails}");
}
