//! The `cudamem` policy at the limit: when the device's capacity, its free memory (another
//! process's use) or the memory fraction refuses a growth, the free pages inside holes are
//! unmapped, only as many bytes as the request lacks, and the request is mapped again — before
//! PyTorch's ladder, so no retry is counted and the rest of the cache stays. During a CUDA-graph
//! capture nothing moves, and the out-of-memory error says why.

use std::sync::Arc;

use cudamem_alloc::MempoolId;
use cudamem_alloc::{AllocError, AllocatorConfig, CachingAllocator};
use cudamem_device::sim::SimDevice;
use cudamem_device::{Device, StreamId};

mod support;

const MIB: u64 = 1 << 20;
const PAGE: u64 = cudamem_alloc::policy::PAGE;
const S: StreamId = StreamId(0);
const HOLE: u64 = 400 * MIB;
const LIVE: u64 = 8 * MIB;
/// A second live block, so that the request finds too little room on a 1 GiB device.
const FILL: u64 = 300 * MIB;
/// Fits no hole, and is not a large growth (no reclaim at the high-water mark).
const REQUEST: u64 = 500 * MIB;

/// A `HOLE` below two live blocks (`LIVE` and `FILL` bytes): returns the live blocks.
fn hole_below_live_blocks(a: &CachingAllocator) -> [u64; 2] {
    let x = a.malloc(HOLE, S).unwrap();
    let live = [a.malloc(LIVE, S).unwrap(), a.malloc(FILL, S).unwrap()];
    a.free(x).unwrap();
    live
}

/// Requests `REQUEST`, which the device or the limit refuses as things stand by `short` bytes,
/// and checks that exactly `short` bytes of the hole moved, with no retry and no live byte
/// touched.
fn request_at_the_limit(sim: &SimDevice, a: &CachingAllocator, live: &[u64], short: u64, what: &str) {
    let before = sim.counters();
    let z = a.malloc(REQUEST, S).unwrap_or_else(|e| panic!("{what}: {e}"));
    let d = sim.counters();
    a.check_invariants().unwrap();
    assert_eq!(
        d.pages_unmapped - before.pages_unmapped,
        short / PAGE,
        "{what}: only what it lacked"
    );
    assert_eq!(
        d.pages_mapped - before.pages_mapped,
        REQUEST / PAGE,
        "{what}: no refused attempt"
    );
    assert_eq!(a.stats().num_alloc_retries, 0, "{what}: PyTorch's retry was not needed");
    assert_eq!(a.stats().num_ooms, 0, "{what}");
    for (&p, size) in live.iter().zip([LIVE, FILL]) {
        assert_eq!(
            a.lock().allocation_size(p),
            Some(size),
            "{what}: a live block is untouched"
        );
    }
    a.free(z).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn at_the_devices_capacity_the_hole_moves_to_the_request() {
    let (sim, a) = support::small(1 << 30, "cudamem", "");
    let live = hole_below_live_blocks(&a);
    let used = sim.used();
    request_at_the_limit(&sim, &a, &live, used + REQUEST - (1 << 30), "capacity");
}

#[test]
fn under_a_memory_fraction_the_hole_moves_to_the_request() {
    let (sim, a) = support::small(8 << 30, "cudamem", "");
    a.set_memory_fraction(0.125).unwrap(); // a 1 GiB limit on an 8 GiB device
    let live = hole_below_live_blocks(&a);
    let used = sim.used();
    request_at_the_limit(&sim, &a, &live, used + REQUEST - (1 << 30), "memory fraction");
}

#[test]
fn when_another_process_holds_memory_the_hole_moves_to_the_request() {
    let (sim, a) = support::small(1 << 30, "cudamem", "");
    let dev: Arc<dyn Device> = sim.clone();
    let other = CachingAllocator::with_policy(dev, AllocatorConfig::default(), "pytorch").unwrap();
    let held = other.malloc(200 * MIB, S).unwrap(); // what this allocator's own count misses
    let live = hole_below_live_blocks(&a);
    let short = sim.used() + REQUEST - (1 << 30);
    request_at_the_limit(&sim, &a, &live, short, "device's free memory");
    other.free(held).unwrap();
}

/// PyTorch's expandable segments, on the same layout, reach the request through the ladder's
/// retry (release every free page, then map again).
#[test]
fn pytorchs_expandable_segments_retry_instead() {
    let (sim, a) = support::small(1 << 30, "pytorch-expandable", "");
    let _live = hole_below_live_blocks(&a);
    let z = a.malloc(REQUEST, S).unwrap();
    assert_eq!(a.stats().num_alloc_retries, 1);
    a.free(z).unwrap();
    assert!(sim.used() < 1 << 30);
}

/// During a capture (a private pool being allocated to), nothing moves: the request is out of
/// memory, and the error says that free pages stayed because of the capture. After it, the same
/// request succeeds.
#[test]
fn a_capture_is_never_disturbed_and_the_error_says_so() {
    let (sim, a) = support::small(1 << 30, "cudamem", "");
    let live = hole_below_live_blocks(&a);
    let pool: MempoolId = (1, 7);
    {
        let mut e = a.lock();
        e.begin_allocate_to_pool(pool).unwrap();
        let used = sim.used();
        let r = e.malloc(REQUEST, StreamId(3)); // not the pool's stream: the default pools
                                                // (The refused growth's own pages were undone; the hole's stayed.)
        assert_eq!(sim.used(), used, "the hole stays mapped");
        match r {
            Err(AllocError::OutOfMemory(o)) => {
                assert!(o.not_moved_during_capture);
                let msg = AllocError::OutOfMemory(o).to_string();
                assert!(msg.contains("not moved") && msg.contains("capture"), "{msg}");
            }
            other => panic!("expected out of memory during the capture, got {other:?}"),
        }
        e.end_allocate_to_pool(pool).unwrap();
    }
    let z = a.malloc(REQUEST, S).unwrap();
    assert_eq!(a.stats().num_alloc_retries, 0);
    a.free(z).unwrap();
    for p in live {
        a.free(p).unwrap();
    }
    a.check_invariants().unwrap();
}

/// Outside a capture, an out-of-memory error does not claim that a capture kept pages.
#[test]
fn a_plain_out_of_memory_error_does_not_mention_a_capture() {
    let (_sim, a) = support::small(1 << 30, "cudamem", "");
    match a.malloc(2 << 30, S) {
        Err(AllocError::OutOfMemory(o)) => {
            assert!(!o.not_moved_during_capture);
            assert!(!AllocError::OutOfMemory(o).to_string().contains("capture"));
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
}
