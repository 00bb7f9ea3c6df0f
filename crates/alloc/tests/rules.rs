//! One test per rule of PyTorch's caching allocator that cudamem reproduces. The README's
//! "PyTorch rules and the tests that pin them" table points here.

use std::sync::Arc;

use cudamem_alloc::{AllocError, AllocatorConfig, CachingAllocator};
use cudamem_device::sim::{EventMode, FaultOp, FaultPlan, SimConfig, SimDevice};
use cudamem_device::{Device, StreamId};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);

fn setup_with(cfg: &str, capacity: u64, mode: EventMode) -> (Arc<SimDevice>, CachingAllocator) {
    let sim = Arc::new(SimDevice::new(SimConfig {
        capacity,
        event_mode: mode,
        ..SimConfig::default()
    }));
    let dev: Arc<dyn Device> = sim.clone();
    let a = CachingAllocator::with_policy(dev, AllocatorConfig::parse(cfg).unwrap(), "pytorch").unwrap();
    (sim, a)
}

fn setup(cfg: &str) -> (Arc<SimDevice>, CachingAllocator) {
    setup_with(cfg, 80 << 30, EventMode::Immediate)
}

fn checked(a: &CachingAllocator) {
    a.check_invariants().unwrap();
}

#[test]
fn sizes_round_to_512_and_small_requests_share_a_2mib_segment() {
    let (_, a) = setup("");
    let p = a.malloc(1, S0).unwrap();
    let q = a.malloc(513, S0).unwrap();
    let s = a.stats();
    assert_eq!(s.allocated_bytes.all().current, 512 + 1024);
    assert_eq!(s.requested_bytes.all().current, 514);
    assert_eq!(s.reserved_bytes.small_pool().current, 2 * MIB as i64);
    assert_eq!(s.segment.all().current, 1, "both come from one 2 MiB small segment");
    assert_eq!(q, p + 512, "the second block is split off right after the first");
    checked(&a);
}

#[test]
fn one_mib_is_small_and_one_byte_more_is_large() {
    let (_, a) = setup("");
    a.malloc(MIB, S0).unwrap();
    a.malloc(MIB + 1, S0).unwrap();
    let s = a.stats();
    assert_eq!(s.reserved_bytes.small_pool().current, 2 * MIB as i64);
    assert_eq!(
        s.reserved_bytes.large_pool().current,
        20 * MIB as i64,
        "1-10 MiB gets a 20 MiB segment"
    );
    checked(&a);
}

#[test]
fn requests_of_10mib_or_more_get_their_size_rounded_to_2mib() {
    let (_, a) = setup("");
    a.malloc(10 * MIB + 1, S0).unwrap();
    assert_eq!(a.memory_reserved(), 12 * MIB);
    a.malloc(10 * MIB - 512, S0).unwrap();
    assert_eq!(a.memory_reserved(), 12 * MIB + 20 * MIB);
    checked(&a);
}

#[test]
fn freed_blocks_are_reused_without_new_device_memory() {
    let (sim, a) = setup("");
    let p = a.malloc(4 * MIB, S0).unwrap();
    a.free(p).unwrap();
    assert_eq!(a.memory_allocated(), 0);
    assert_eq!(a.memory_reserved(), 20 * MIB, "freed memory stays cached");
    let q = a.malloc(4 * MIB, S0).unwrap();
    assert_eq!(p, q);
    assert_eq!(sim.counters().mallocs, 1);
    checked(&a);
}

#[test]
fn best_fit_takes_the_smallest_block_then_the_lowest_address() {
    let (_, a) = setup("");
    // Three separate 12, 14 and 12 MiB segments, all freed.
    let x = a.malloc(12 * MIB, S0).unwrap();
    let y = a.malloc(14 * MIB, S0).unwrap();
    let z = a.malloc(12 * MIB, S0).unwrap();
    for p in [x, y, z] {
        a.free(p).unwrap();
    }
    let got = a.malloc(11 * MIB, S0).unwrap();
    assert_eq!(got, x.min(z), "12 MiB beats 14 MiB; the lower address wins a tie");
    checked(&a);
}

#[test]
fn blocks_are_reused_only_on_their_own_stream() {
    let (sim, a) = setup("");
    let p = a.malloc(MIB, S0).unwrap();
    a.free(p).unwrap();
    let q = a.malloc(MIB, S1).unwrap();
    assert_ne!(p, q);
    assert_eq!(
        sim.counters().mallocs,
        2,
        "stream 1 cannot take stream 0's cached block"
    );
    checked(&a);
}

#[test]
fn small_blocks_split_when_512_bytes_remain() {
    let (_, a) = setup("");
    let p = a.malloc(MIB, S0).unwrap();
    let s = a.stats();
    assert_eq!(
        s.inactive_split.small_pool().current,
        1,
        "the other 1 MiB stays as a split free block"
    );
    assert_eq!(s.inactive_split_bytes.small_pool().current, MIB as i64);
    let q = a.malloc(MIB - 512, S0).unwrap();
    assert_eq!(
        a.stats().inactive_split.small_pool().current,
        1,
        "512 bytes remain: still split"
    );
    a.free(q).unwrap();
    a.free(p).unwrap();
    assert_eq!(
        a.stats().inactive_split.all().current,
        0,
        "freeing merges the parts back"
    );
    checked(&a);
}

#[test]
fn large_blocks_split_only_when_more_than_1mib_remains() {
    let (_, a) = setup("");
    // 20 MiB segment, 19 MiB request: 1 MiB remains, not more: no split.
    let p = a.malloc(19 * MIB, S0).unwrap();
    assert_eq!(a.memory_allocated(), 20 * MIB, "the whole 20 MiB block is handed out");
    a.free(p).unwrap();
    let _q = a.malloc(18 * MIB, S0).unwrap();
    assert_eq!(a.memory_allocated(), 18 * MIB, "2 MiB remain: split");
    assert_eq!(a.stats().inactive_split.large_pool().current, 1);
    checked(&a);
}

#[test]
fn freeing_coalesces_with_free_neighbours() {
    let (_, a) = setup("");
    let p: Vec<u64> = (0..4).map(|_| a.malloc(4 * MIB, S0).unwrap()).collect();
    a.free(p[1]).unwrap();
    a.free(p[2]).unwrap();
    let big = a.malloc(8 * MIB, S0).unwrap();
    assert_eq!(big, p[1], "blocks 1 and 2 merged into one 8 MiB block");
    checked(&a);
}

#[test]
fn oversize_blocks_serve_only_requests_within_max_non_split_rounding() {
    let (sim, a) = setup("max_split_size_mb:40");
    let big = a.malloc(100 * MIB, S0).unwrap();
    a.free(big).unwrap();
    assert_eq!(a.stats().oversize_segments.current, 1);
    // A normal request never takes an oversize block.
    a.malloc(30 * MIB, S0).unwrap();
    assert_eq!(sim.counters().mallocs, 2);
    // An oversize request takes it only if it wastes less than 20 MiB.
    a.malloc(70 * MIB, S0).unwrap();
    assert_eq!(
        sim.counters().mallocs,
        3,
        "100 MiB block wastes 30 MiB for 70 MiB: refused"
    );
    let p = a.malloc(90 * MIB, S0).unwrap();
    assert_eq!(p, big, "wastes 10 MiB: accepted, unsplit");
    assert_eq!(a.stats().oversize_allocations.current, 2);
    checked(&a);
}

#[test]
fn record_stream_delays_reuse_until_the_other_stream_finishes() {
    let (sim, a) = setup_with("", 80 << 30, EventMode::Manual);
    let p = a.malloc(MIB, S0).unwrap();
    a.record_stream(p, S1).unwrap();
    a.free(p).unwrap();
    assert_eq!(a.memory_allocated(), 0, "allocated drops at once");
    assert_eq!(
        a.stats().active_bytes.all().current,
        MIB as i64,
        "but the block stays active"
    );
    let q = a.malloc(MIB, S0).unwrap();
    assert_eq!(q, p + MIB, "the pending block is skipped; its free neighbour serves");
    a.malloc(MIB, S0).unwrap();
    assert_eq!(sim.counters().mallocs, 2, "still pending: a new segment was needed");
    sim.complete_stream(S1);
    assert_eq!(
        a.malloc(MIB, S0).unwrap(),
        p,
        "after the event completes the block is reused"
    );
    checked(&a);
}

#[test]
fn empty_cache_releases_unsplit_segments_only() {
    let (sim, a) = setup("");
    let keep = a.malloc(4 * MIB, S0).unwrap(); // its 20 MiB segment stays (split)
    let gone = a.malloc(30 * MIB, S0).unwrap();
    a.free(gone).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 20 * MIB);
    assert_eq!(sim.counters().frees, 1);
    assert_eq!(a.stats().num_sync_all_streams, 1);
    a.free(keep).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(sim.used(), 0);
    checked(&a);
}

#[test]
fn out_of_memory_releases_the_cache_retries_then_fails_with_pytorchs_message() {
    let (_, a) = setup_with("", 100 * MIB, EventMode::Immediate);
    let p = a.malloc(60 * MIB, S0).unwrap();
    a.free(p).unwrap(); // 60 MiB cached
    let q = a.malloc(70 * MIB, S0).unwrap(); // needs the cache released
    assert_eq!(a.stats().num_alloc_retries, 1);
    assert_eq!(a.stats().num_device_free, 1);
    let err = a.malloc(40 * MIB, S0).unwrap_err();
    let AllocError::OutOfMemory(o) = &err else {
        panic!("{err}")
    };
    assert_eq!(o.tried, 40 * MIB);
    assert_eq!(a.stats().num_ooms, 1);
    let msg = o.pytorch_message();
    assert!(msg.starts_with("CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total capacity of 100.00 MiB of which 30.00 MiB is free."), "{msg}");
    assert!(msg.contains("Of the allocated memory 70.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated."), "{msg}");
    assert!(err.to_string().contains("largest free cached block"));
    a.free(q).unwrap();
    a.malloc(40 * MIB, S0).expect("works again after the OOM");
    checked(&a);
}

#[test]
fn a_small_request_reports_its_2mib_segment_and_1eb_is_refused_outright() {
    let (_, a) = setup_with("", 100 * MIB, EventMode::Immediate);
    a.malloc(99 * MIB, S0).unwrap();
    let AllocError::OutOfMemory(o) = a.malloc(10, S0).unwrap_err() else {
        panic!()
    };
    assert!(o.pytorch_message().contains("Tried to allocate 2.00 MiB"));
    let e = a.malloc(1 << 60, S0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "CUDA out of memory. Tried to allocate more than 1EB memory."
    );
    let e = a.malloc(u64::MAX, S0).unwrap_err();
    assert!(e.is_out_of_memory());
    checked(&a);
}

#[test]
fn max_split_size_frees_just_enough_oversize_blocks_before_the_full_release() {
    let (sim, a) = setup_with("max_split_size_mb:20", 100 * MIB, EventMode::Immediate);
    let x = a.malloc(30 * MIB, S0).unwrap();
    let y = a.malloc(60 * MIB, S0).unwrap();
    a.free(x).unwrap();
    a.free(y).unwrap();
    // 35 MiB: the cached 60 MiB block would waste 25 MiB (> max_non_split_rounding), and
    // 90 + 36 MiB exceed the device, so the smallest oversize block covering 35 MiB is released.
    a.malloc(35 * MIB, S0).unwrap();
    assert_eq!(
        a.stats().num_alloc_retries,
        0,
        "release_available_cached_blocks sufficed"
    );
    assert_eq!(sim.counters().frees, 1, "only the 60 MiB block went");
    // 45 MiB: no single cached block covers it; the 30 MiB one is released but that is not
    // enough by that rule, so the full release and retry follows (and succeeds).
    a.malloc(45 * MIB, S0).unwrap();
    assert_eq!(sim.counters().frees, 2);
    assert_eq!(a.stats().num_alloc_retries, 1);
    checked(&a);
}

#[test]
fn memory_fraction_limits_reserved_memory_and_is_reported() {
    let (_, a) = setup_with("", 1000 * MIB, EventMode::Immediate);
    a.set_memory_fraction(0.1).unwrap();
    a.malloc(60 * MIB, S0).unwrap();
    let AllocError::OutOfMemory(o) = a.malloc(60 * MIB, S0).unwrap_err() else {
        panic!()
    };
    assert_eq!(o.allowed, Some(100 * MIB));
    assert!(o
        .pytorch_message()
        .contains("100.00 MiB allowed; Of the allocated memory"));
    assert!(a.set_memory_fraction(1.5).is_err());
    assert!(a.set_memory_fraction(f64::NAN).is_err());
    checked(&a);
}

#[test]
fn garbage_collection_frees_old_cached_blocks_without_synchronising() {
    let (sim, a) = setup_with("garbage_collection_threshold:0.5", 1000 * MIB, EventMode::Immediate);
    a.set_memory_fraction(0.5).unwrap(); // 500 MiB allowed, GC above 250 MiB
    let blocks: Vec<u64> = (0..3).map(|_| a.malloc(100 * MIB, S0).unwrap()).collect();
    for p in blocks {
        a.free(p).unwrap();
    }
    a.malloc(200 * MIB, S0).unwrap();
    assert!(sim.counters().frees >= 1, "GC released cached 100 MiB blocks");
    assert_eq!(a.stats().num_sync_all_streams, 0);
    assert_eq!(a.stats().num_alloc_retries, 0);
    checked(&a);
}

#[test]
fn garbage_collection_releases_the_blocks_cached_longest() {
    // A block's age is the number of large-pool lookups since it was cached; GC releases the
    // blocks at least as old as the average until it has freed enough.
    let (sim, a) = setup_with("garbage_collection_threshold:0.5", 1000 * MIB, EventMode::Immediate);
    a.set_memory_fraction(0.5).unwrap(); // 500 MiB allowed, GC above 250 MiB
    let (x, y) = (a.malloc(100 * MIB, S0).unwrap(), a.malloc(100 * MIB, S0).unwrap());
    // x is cached after 2 lookups; lookup 3 finds no fit for 120 MiB: a new segment (320 MiB
    // in use).
    a.free(x).unwrap();
    let z = a.malloc(120 * MIB, S0).unwrap();
    // y and z are cached after 3 lookups. Lookup 4 finds no fit for 150 MiB: ages 2, 1, 1
    // (average 1.33), and releasing x's 100 MiB covers the 70 MiB over the threshold.
    a.free(y).unwrap();
    a.free(z).unwrap();
    a.malloc(150 * MIB, S0).unwrap();
    assert_eq!(sim.counters().frees, 1, "only the oldest block is released");
    assert_eq!(a.memory_reserved(), 370 * MIB);
    assert!(a.malloc(100 * MIB, S0).unwrap() == y, "y stayed cached");
    checked(&a);
}

#[test]
fn expandable_segments_map_pages_and_unmap_free_pages_on_empty_cache() {
    let (sim, a) = setup("expandable_segments:True");
    let p = a.malloc(30 * MIB, S0).unwrap();
    let q = a.malloc(30 * MIB, S0).unwrap();
    assert_eq!(q, p + 30 * MIB, "blocks are packed back to back in one segment");
    assert_eq!(a.memory_reserved(), 60 * MIB, "three 20 MiB pages");
    assert_eq!(
        a.stats().segment.all().current,
        0,
        "mappings are not counted as segments"
    );
    assert_eq!(a.stats().num_device_alloc, 2);
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(
        a.memory_reserved(),
        40 * MIB,
        "the free page beyond p is unmapped; p's pages stay"
    );
    assert_eq!(a.stats().num_device_free, 1);
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(sim.used(), 0);
    checked(&a);
}

#[test]
fn zero_size_allocations_are_null_and_free_of_null_is_a_no_op() {
    let (_, a) = setup("");
    assert_eq!(a.malloc(0, S0).unwrap(), 0);
    a.free(0).unwrap();
    assert_eq!(a.stats().allocation.all().allocated, 0);
}

#[test]
fn bad_frees_are_errors_that_change_nothing() {
    let (_, a) = setup("");
    let p = a.malloc(4096, S0).unwrap();
    let before = a.memory_stats();
    let e = a.free(p + 512).unwrap_err();
    assert!(e.to_string().contains("inside the allocated block"), "{e}");
    let e = a.free(0xdead_beef).unwrap_err();
    assert!(e.to_string().contains("not allocated by this allocator"), "{e}");
    assert_eq!(a.memory_stats(), before);
    a.free(p).unwrap();
    let e = a.free(p).unwrap_err();
    assert!(e.to_string().contains("double free"), "{e}");
    assert!(a.record_stream(p, S1).is_err(), "record_stream on a freed block");
    checked(&a);
}

#[test]
fn injected_device_failures_take_the_retry_path_and_leak_nothing() {
    let (sim, a) = setup("");
    sim.set_faults(FaultPlan::default().fail_nth(FaultOp::Malloc, 1));
    let p = a.malloc(MIB, S0).unwrap();
    assert_eq!(a.stats().num_alloc_retries, 1, "first malloc failed, retry succeeded");
    sim.set_faults(
        FaultPlan::default()
            .fail_nth(FaultOp::Malloc, 1)
            .fail_nth(FaultOp::Malloc, 2),
    );
    assert!(a.malloc(30 * MIB, S0).unwrap_err().is_out_of_memory());
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(sim.used(), 0);
    checked(&a);
}

#[test]
fn peaks_and_accumulated_stats_reset_like_pytorch() {
    let (_, a) = setup("");
    let p = a.malloc(30 * MIB, S0).unwrap();
    a.free(p).unwrap();
    assert_eq!(a.max_memory_allocated(), 30 * MIB);
    a.reset_peak_memory_stats();
    assert_eq!(a.max_memory_allocated(), 0);
    assert_eq!(a.max_memory_reserved(), 30 * MIB, "reserved is still current");
    a.reset_accumulated_memory_stats();
    let d = a.memory_stats();
    assert_eq!(d["allocation.all.allocated"], 0);
    assert_eq!(d["num_device_alloc"], 0);
    assert_eq!(d.len(), 122);
}
