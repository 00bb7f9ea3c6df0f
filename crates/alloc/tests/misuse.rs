//! Misuse of the allocator: one test per case, each asserting the exact outcome (the error and
//! its message, or the behaviour) and that the allocator is intact afterwards: the stats dict
//! is unchanged by a rejected call, every invariant holds, the device agrees, and allocations
//! still work. Every case runs under the three policies. docs/reliability.md tabulates them.
//!
//! The end of the file holds regression tests for engine bugs found by the `allocator_ops`
//! fuzz target (fuzz/) and the fault-injection replays; see docs/reliability.md.

use std::sync::Arc;

use cudamem_alloc::{AllocError, AllocatorConfig, CachingAllocator, StatsDict};
use cudamem_device::sim::{EventMode, SimConfig, SimDevice};
use cudamem_device::{Device, StreamId};
use cudamem_trace::BlockState;

/// Every registered policy: misuse must be caught whichever decides.
const POLICIES: &[&str] = cudamem_alloc::policy::POLICY_NAMES;
const MIB: u64 = 1 << 20;
/// A multiple of 20 MiB (PyTorch's expandable large page), so that `capacity` itself fits.
const CAPACITY: u64 = 1000 * MIB;
const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);

fn device(index: i32) -> Arc<SimDevice> {
    Arc::new(SimDevice::new(SimConfig {
        index,
        capacity: CAPACITY,
        event_mode: EventMode::Manual,
        ..SimConfig::default()
    }))
}

fn allocator(sim: &Arc<SimDevice>, policy: &str) -> CachingAllocator {
    let dev: Arc<dyn Device> = sim.clone();
    CachingAllocator::with_policy(dev, AllocatorConfig::default(), policy).unwrap()
}

fn setup(policy: &str) -> (Arc<SimDevice>, CachingAllocator) {
    let sim = device(0);
    let a = allocator(&sim, policy);
    (sim, a)
}

/// The allocator is consistent and still serves: invariants, device check, reserved == device
/// used, and a small and a large allocation can be made and freed.
fn assert_usable(a: &CachingAllocator, sim: &SimDevice, what: &str) {
    a.check_invariants().unwrap_or_else(|e| panic!("{what}: {e}"));
    sim.check().unwrap_or_else(|e| panic!("{what}: device: {e}"));
    assert_eq!(a.memory_reserved(), sim.used(), "{what}: reserved vs device used");
    let p = a
        .malloc(4096, S0)
        .unwrap_or_else(|e| panic!("{what}: small allocation afterwards: {e}"));
    let q = a
        .malloc(3 * MIB, S0)
        .unwrap_or_else(|e| panic!("{what}: large allocation afterwards: {e}"));
    a.free(q).unwrap();
    a.free(p).unwrap();
    a.check_invariants()
        .unwrap_or_else(|e| panic!("{what}: after the extra allocations: {e}"));
}

/// A rejected call: the stats are exactly as before it, and the allocator still works.
fn assert_intact(a: &CachingAllocator, sim: &SimDevice, before: &StatsDict, what: &str) {
    assert_eq!(&a.memory_stats(), before, "{what}: a rejected call changed the stats");
    assert_usable(a, sim, what);
}

fn invalid_pointer(r: Result<(), AllocError>) -> (u64, String) {
    match r {
        Err(AllocError::InvalidPointer { ptr, reason }) => (ptr, reason),
        other => panic!("expected InvalidPointer, got {other:?}"),
    }
}

/// Frees everything given, empties the cache and checks that every byte went back.
fn drain(a: &CachingAllocator, sim: &SimDevice, live: &[u64]) {
    for &p in live {
        a.free(p).unwrap();
    }
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(sim.used(), 0);
    assert_eq!(sim.live_events(), 0);
}

const FREED: &str = "not allocated: freed already (double free?) or never handed out";

// ------------------------------------------------------------------------------------------
// frees of what is not a live allocation
// ------------------------------------------------------------------------------------------

#[test]
fn double_free_is_rejected_and_changes_nothing() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let keep = a.malloc(4096, S0).unwrap();
        let p = a.malloc(4096, S0).unwrap();
        a.free(p).unwrap();
        let before = a.memory_stats();
        let (ptr, reason) = invalid_pointer(a.free(p));
        assert_eq!((ptr, reason.as_str()), (p, FREED), "{policy}");
        assert_eq!(
            a.free(p).unwrap_err().to_string(),
            format!("invalid device pointer: {p:#x} ({FREED})"),
            "{policy}"
        );
        assert_intact(&a, &sim, &before, policy);
        drain(&a, &sim, &[keep]);
    }
}

#[test]
fn double_free_of_a_block_still_waiting_for_its_stream_is_rejected() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let p = a.malloc(3 * MIB, S0).unwrap();
        a.record_stream(p, S1).unwrap();
        a.free(p).unwrap(); // pending: an event on stream 1 is outstanding
        assert_eq!(sim.live_events(), 1, "{policy}");
        let before = a.memory_stats();
        assert_eq!(invalid_pointer(a.free(p)), (p, FREED.to_string()), "{policy}");
        assert_eq!(sim.live_events(), 1, "{policy}: the rejected free recorded no event");
        assert_intact(&a, &sim, &before, policy);
        sim.complete_stream(S1);
        drain(&a, &sim, &[]);
    }
}

#[test]
fn free_of_a_foreign_pointer_is_rejected() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let keep = a.malloc(4096, S0).unwrap();
        // Memory of the same device that another user obtained directly.
        let other = sim.malloc(2 * MIB).unwrap();
        let before = a.memory_stats();
        for ptr in [0xdead_beef_0000, 1, u64::MAX, other] {
            let (got, reason) = invalid_pointer(a.free(ptr));
            assert_eq!(got, ptr);
            assert_eq!(
                reason, "not allocated by this allocator (device sim)",
                "{policy}: {ptr:#x}"
            );
        }
        assert_eq!(
            sim.used(),
            a.memory_reserved() + 2 * MIB,
            "{policy}: the foreign segment is untouched"
        );
        sim.free(other, 2 * MIB).unwrap();
        assert_intact(&a, &sim, &before, policy);
        drain(&a, &sim, &[keep]);
    }
}

#[test]
fn free_of_null_is_a_no_op() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let before = a.memory_stats();
        a.free(0).unwrap();
        assert_intact(&a, &sim, &before, policy);
    }
}

#[test]
fn free_of_an_interior_pointer_is_rejected() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let p = a.malloc(MIB + 1, S0).unwrap(); // block of 1 MiB + 512
        let before = a.memory_stats();
        for off in [1u64, 512, MIB, MIB + 511] {
            let (ptr, reason) = invalid_pointer(a.free(p + off));
            assert_eq!(ptr, p + off);
            assert_eq!(
                reason,
                format!(
                    "inside the allocated block at {p:#x} (+{off} bytes); only the start of an allocation can be freed"
                ),
                "{policy}"
            );
        }
        // Just past the block: inside the free rest of its segment.
        let past = p + MIB + 512;
        let (_, reason) = invalid_pointer(a.free(past + 8));
        assert_eq!(
            reason,
            format!("inside the free block at {past:#x} (+8 bytes); only the start of an allocation can be freed"),
            "{policy}"
        );
        assert_intact(&a, &sim, &before, policy);
        drain(&a, &sim, &[p]);
    }
}

#[test]
fn free_on_the_wrong_device_is_rejected() {
    for &policy in POLICIES {
        let (sim0, sim1) = (device(0), device(1));
        let (a0, a1) = (allocator(&sim0, policy), allocator(&sim1, policy));
        let p0 = a0.malloc(4096, S0).unwrap();
        let before1 = a1.memory_stats();
        let (ptr, reason) = invalid_pointer(a1.free(p0));
        assert_eq!(
            (ptr, reason.as_str()),
            (p0, "not allocated by this allocator (device sim)"),
            "{policy}"
        );
        assert_intact(&a1, &sim1, &before1, policy);
        // Device 0's allocation is still live and frees normally.
        assert_eq!(a0.memory_allocated(), 4096);
        drain(&a0, &sim0, &[p0]);
        drain(&a1, &sim1, &[]);
    }
}

/// Under CUDA's unified addressing, pointers of two devices never coincide, so a wrong-device
/// free always misses. The simulated devices used to give every device the same address range,
/// so device 1's allocator found its *own* block at device 0's address and freed it (fixed in
/// commit 44c526c: each ordinal has its own range).
#[test]
fn wrong_device_free_cannot_hit_an_allocation_of_the_other_device() {
    for &policy in POLICIES {
        let (sim0, sim1) = (device(0), device(1));
        let (a0, a1) = (allocator(&sim0, policy), allocator(&sim1, policy));
        let p0 = a0.malloc(4096, S0).unwrap();
        let p1 = a1.malloc(4096, S0).unwrap();
        assert_ne!(p0, p1, "{policy}: two devices handed out the same address");
        let before1 = a1.memory_stats();
        invalid_pointer(a1.free(p0));
        assert_intact(&a1, &sim1, &before1, policy);
        drain(&a0, &sim0, &[p0]);
        drain(&a1, &sim1, &[p1]);
    }
}

// ------------------------------------------------------------------------------------------
// record_stream
// ------------------------------------------------------------------------------------------

#[test]
fn record_stream_on_a_freed_block_is_rejected() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let keep = a.malloc(4096, S0).unwrap();
        let p = a.malloc(4096, S0).unwrap();
        a.free(p).unwrap();
        let before = a.memory_stats();
        let events = sim.counters().events_recorded;
        assert_eq!(
            invalid_pointer(a.record_stream(p, S1)),
            (p, FREED.to_string()),
            "{policy}"
        );
        assert_eq!(
            sim.counters().events_recorded,
            events,
            "{policy}: no event for the rejected record_stream"
        );
        assert_intact(&a, &sim, &before, policy);
        // Freeing the other block needs no event either: nothing was attached to stream 1.
        a.free(keep).unwrap();
        assert_eq!(sim.counters().events_recorded, events, "{policy}");
        assert_eq!(a.lock().pending_frees(), 0);
        drain(&a, &sim, &[]);
    }
}

#[test]
fn record_stream_with_the_blocks_own_stream_is_a_no_op() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let p = a.malloc(3 * MIB, S1).unwrap();
        let before = a.memory_stats();
        a.record_stream(p, S1).unwrap();
        assert_eq!(a.memory_stats(), before, "{policy}");
        let events = sim.counters().events_recorded;
        a.free(p).unwrap();
        assert_eq!(sim.counters().events_recorded, events, "{policy}: no event recorded");
        assert_eq!(a.lock().pending_frees(), 0, "{policy}: the free is not deferred");
        // Reusable at once, on its stream: the same block comes back.
        assert_eq!(a.malloc(3 * MIB, S1).unwrap(), p, "{policy}");
        assert_usable(&a, &sim, policy);
        drain(&a, &sim, &[p]);
    }
}

#[test]
fn record_stream_on_another_stream_defers_reuse_until_that_stream_completes() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let p = a.malloc(3 * MIB, S0).unwrap();
        a.record_stream(p, S1).unwrap();
        a.record_stream(p, S1).unwrap(); // twice: one use
        a.free(p).unwrap();
        assert_eq!(sim.live_events(), 1, "{policy}");
        let q = a.malloc(3 * MIB, S0).unwrap();
        assert_ne!(q, p, "{policy}: reused before stream 1 completed");
        sim.complete_stream(S1);
        let r = a.malloc(3 * MIB, S0).unwrap();
        assert_eq!(r, p, "{policy}: reusable once stream 1 completed");
        assert_usable(&a, &sim, policy);
        drain(&a, &sim, &[q, r]);
    }
}

// ------------------------------------------------------------------------------------------
// empty_cache with live blocks
// ------------------------------------------------------------------------------------------

#[test]
fn empty_cache_keeps_live_blocks_intact() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let sizes = [
            4096u64,
            700,
            4096,
            3 * MIB,
            5 * MIB,
            3 * MIB,
            30 * MIB,
            12 * MIB,
            30 * MIB,
            MIB,
        ];
        let ptrs: Vec<u64> = sizes.iter().map(|&s| a.malloc(s, S0).unwrap()).collect();
        // Free every other one: segments are partly free, some wholly.
        let (live, dead): (Vec<_>, Vec<_>) = ptrs.iter().zip(sizes).enumerate().partition(|(i, _)| i % 2 == 0);
        let live: Vec<(u64, u64)> = live.into_iter().map(|(_, (&p, s))| (p, s)).collect();
        for (_, (&p, _)) in dead {
            a.free(p).unwrap();
        }
        let allocated = a.memory_allocated();
        let stats_before = a.stats();
        a.empty_cache().unwrap();
        let stats = a.stats();
        assert_eq!(
            a.memory_allocated(),
            allocated,
            "{policy}: empty_cache changed allocated bytes"
        );
        assert_eq!(stats.allocation, stats_before.allocation, "{policy}");
        assert_eq!(
            stats.requested_bytes.all().current,
            stats_before.requested_bytes.all().current,
            "{policy}"
        );
        assert!(a.memory_reserved() >= allocated, "{policy}");
        a.check_invariants().unwrap();
        sim.check().unwrap();
        assert_eq!(a.memory_reserved(), sim.used(), "{policy}");
        // Every live allocation is still an allocated block of its address in the snapshot, and
        // every segment left holds something live (nothing wholly free survives empty_cache).
        let snap = a.snapshot();
        for &(p, s) in &live {
            let b = snap
                .segments
                .iter()
                .flat_map(|seg| seg.blocks.iter())
                .find(|b| b.address == p)
                .unwrap_or_else(|| panic!("{policy}: live block {p:#x} vanished"));
            assert_eq!(b.state, BlockState::ActiveAllocated, "{policy}");
            assert_eq!(b.requested_size, s, "{policy}");
        }
        for seg in &snap.segments {
            assert!(
                seg.allocated_size > 0,
                "{policy}: a free segment at {:#x} survived empty_cache",
                seg.address
            );
        }
        // New allocations never overlap the live ones.
        let fresh: Vec<u64> = sizes.iter().map(|&s| a.malloc(s, S0).unwrap()).collect();
        for (&q, &qs) in fresh.iter().zip(&sizes) {
            for &(p, s) in &live {
                assert!(
                    q + qs <= p || p + s <= q,
                    "{policy}: new block {q:#x} overlaps live {p:#x}"
                );
            }
        }
        // The live pointers are still valid: they free without error.
        let mut all: Vec<u64> = live.iter().map(|l| l.0).collect();
        all.extend(fresh);
        drain(&a, &sim, &all);
    }
}

#[test]
fn empty_cache_with_pending_frees_waits_for_them_and_keeps_live_blocks() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let live = a.malloc(3 * MIB, S0).unwrap();
        let pending = a.malloc(3 * MIB, S0).unwrap();
        a.record_stream(pending, S1).unwrap();
        a.free(pending).unwrap();
        a.empty_cache().unwrap(); // synchronises stream 1's event, then releases
        assert_eq!(a.lock().pending_frees(), 0, "{policy}");
        assert_eq!(sim.live_events(), 0, "{policy}");
        assert_eq!(a.memory_allocated(), 3 * MIB, "{policy}");
        assert_usable(&a, &sim, policy);
        drain(&a, &sim, &[live]);
    }
}

// ------------------------------------------------------------------------------------------
// request sizes
// ------------------------------------------------------------------------------------------

/// `(size, allocated bytes)` for sizes that succeed on every policy.
const OK_SIZES: [(u64, u64); 10] = [
    (1, 512),
    (511, 512),
    (512, 512),
    (513, 1024),
    (MIB - 1, MIB),
    (MIB, MIB),
    (MIB + 1, MIB + 512),
    (10 * MIB - 1, 10 * MIB),
    (10 * MIB, 10 * MIB),
    (CAPACITY - 1, CAPACITY),
];

#[test]
fn size_zero_returns_null_and_changes_nothing() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let before = a.memory_stats();
        assert_eq!(a.malloc(0, S0).unwrap(), 0, "{policy}");
        assert_eq!(a.malloc(0, S1).unwrap(), 0, "{policy}");
        a.free(0).unwrap();
        assert_intact(&a, &sim, &before, policy);
    }
}

#[test]
fn sizes_at_every_boundary_are_served_with_pytorchs_rounding() {
    for &policy in POLICIES {
        for (size, rounded) in OK_SIZES.into_iter().chain([(CAPACITY, CAPACITY)]) {
            let (sim, a) = setup(policy);
            let p = a
                .malloc(size, S0)
                .unwrap_or_else(|e| panic!("{policy}: malloc({size}): {e}"));
            assert_ne!(p, 0);
            assert_eq!(p % 512, 0);
            assert_eq!(a.memory_allocated(), rounded, "{policy}: malloc({size})");
            let st = a.stats();
            let small = st.allocated_bytes.small_pool().current as u64;
            assert_eq!(
                small,
                if rounded <= MIB { rounded } else { 0 },
                "{policy}: malloc({size}): pool"
            );
            assert_eq!(st.requested_bytes.all().current as u64, size);
            a.check_invariants().unwrap();
            assert_eq!(a.memory_reserved(), sim.used());
            drain(&a, &sim, &[p]);
        }
    }
}

#[test]
fn segment_sizes_follow_pytorch_for_the_native_policy() {
    // (size, segment bytes) under `pytorch`: 2 MiB for small requests, 20 MiB when the
    // *rounded* size is below 10 MiB (so 10 MiB - 1, rounded to 10 MiB, gets its own 10 MiB
    // segment, as in PyTorch's get_allocation_size), else the rounded size up to 2 MiB.
    let cases = [
        (1, 2 * MIB),
        (MIB, 2 * MIB),
        (MIB + 1, 20 * MIB),
        (10 * MIB - 1, 10 * MIB),
        (10 * MIB, 10 * MIB),
        (10 * MIB + 1, 12 * MIB),
        (CAPACITY - 1, CAPACITY),
    ];
    for (size, seg) in cases {
        let (sim, a) = setup("pytorch");
        let p = a.malloc(size, S0).unwrap();
        assert_eq!(a.memory_reserved(), seg, "malloc({size})");
        drain(&a, &sim, &[p]);
    }
}

fn oom(r: Result<u64, AllocError>) -> Box<cudamem_alloc::OutOfMemory> {
    match r {
        Err(AllocError::OutOfMemory(o)) => o,
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
}

#[test]
fn one_byte_more_than_the_device_is_out_of_memory() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let before = a.memory_stats();
        let o = oom(a.malloc(CAPACITY + 1, S0));
        assert_eq!(
            o.pytorch_message(),
            "CUDA out of memory. Tried to allocate 1002.00 MiB. GPU 0 has a total capacity of 1000.00 MiB of which \
             1000.00 MiB is free. Including non-PyTorch memory, this process has 0 bytes memory in use. Of the \
             allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. \
             If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
             to avoid fragmentation.  See documentation for Memory Management  \
             (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
            "{policy}"
        );
        assert_eq!((o.requested, o.total, o.free), (CAPACITY + 1, CAPACITY, CAPACITY));
        let after = a.memory_stats();
        assert_eq!(after["num_ooms"], 1, "{policy}");
        assert_eq!(after["num_alloc_retries"], 1, "{policy}");
        for (k, v) in &before {
            if !["num_ooms", "num_alloc_retries", "num_sync_all_streams"].contains(&k.as_str()) {
                assert_eq!(after[k], *v, "{policy}: {k}");
            }
        }
        assert_usable(&a, &sim, policy);
    }
}

#[test]
fn just_below_one_exabyte_is_an_ordinary_out_of_memory() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let o = oom(a.malloc((1 << 60) - 1, S0));
        assert!(!o.over_one_exabyte);
        assert_eq!(o.tried, 1 << 60, "{policy}");
        assert!(
            o.pytorch_message()
                .starts_with("CUDA out of memory. Tried to allocate 1073741824.00 GiB. GPU 0"),
            "{policy}"
        );
        assert_eq!(a.memory_stats()["num_ooms"], 1);
        assert_usable(&a, &sim, policy);
    }
}

#[test]
fn one_exabyte_and_more_is_refused_without_trying() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let before = a.memory_stats();
        for size in [1u64 << 60, 1 << 63, u64::MAX] {
            let o = oom(a.malloc(size, S0));
            assert!(o.over_one_exabyte, "{policy}: {size}");
            assert_eq!(o.requested, size);
            assert_eq!(
                o.pytorch_message(),
                "CUDA out of memory. Tried to allocate more than 1EB memory."
            );
            assert_eq!(
                AllocError::OutOfMemory(o).to_string(),
                "CUDA out of memory. Tried to allocate more than 1EB memory."
            );
        }
        assert_eq!(
            sim.counters().mallocs + sim.counters().maps,
            0,
            "{policy}: no device call was made"
        );
        assert_intact(&a, &sim, &before, policy);
    }
}

// ------------------------------------------------------------------------------------------
// bad configurations
// ------------------------------------------------------------------------------------------

/// `(settings, key, message)`: each rejected by `parse` and by `set_settings`, naming the key.
const BAD_CONFIGS: &[(&str, &str, &str)] = &[
    (
        "max_split_size_mb:abc",
        "max_split_size_mb",
        "max_split_size_mb: expected a non-negative integer, got 'abc'",
    ),
    (
        "max_split_size_mb:-1",
        "max_split_size_mb",
        "max_split_size_mb: expected a non-negative integer, got '-1'",
    ),
    (
        "max_split_size_mb:5",
        "max_split_size_mb",
        "max_split_size_mb: '5' is below the minimum of 20 MiB",
    ),
    (
        "max_split_size_mb:99999999999999999999",
        "max_split_size_mb",
        "max_split_size_mb: '99999999999999999999' is too large (the maximum is 18446744073709551615)",
    ),
    (
        "max_non_split_rounding_mb:1",
        "max_non_split_rounding_mb",
        "max_non_split_rounding_mb: '1' is below the minimum of 20 MiB",
    ),
    (
        "garbage_collection_threshold:1.5",
        "garbage_collection_threshold",
        "garbage_collection_threshold: '1.5' must be greater than 0.0 and less than 1.0",
    ),
    (
        "garbage_collection_threshold:nan",
        "garbage_collection_threshold",
        "garbage_collection_threshold: 'nan' must be greater than 0.0 and less than 1.0",
    ),
    (
        "garbage_collection_threshold:x",
        "garbage_collection_threshold",
        "garbage_collection_threshold: expected a number, got 'x'",
    ),
    (
        "roundup_power2_divisions:3",
        "roundup_power2_divisions",
        "roundup_power2_divisions: '3' must be a power of two",
    ),
    (
        "roundup_power2_divisions:[3:4]",
        "roundup_power2_divisions",
        "roundup_power2_divisions: interval '3' must be a power of two (a size in MiB) or '>'",
    ),
    (
        "roundup_power2_divisions:[1:3]",
        "roundup_power2_divisions",
        "roundup_power2_divisions: divisions '3' for interval '1' must be a power of two or 0",
    ),
    (
        "expandable_segments:yes",
        "expandable_segments",
        "expandable_segments: expected True or False, got 'yes'",
    ),
    (
        "expandable_segments:true",
        "expandable_segments",
        "expandable_segments: expected True or False, got 'true'",
    ),
    (
        "release_lock_on_cudamalloc:1",
        "release_lock_on_cudamalloc",
        "release_lock_on_cudamalloc: expected True or False, got '1'",
    ),
    (
        "pinned_num_register_threads:3",
        "pinned_num_register_threads",
        "pinned_num_register_threads: '3' must be a power of two",
    ),
    (
        "pinned_num_register_threads:256",
        "pinned_num_register_threads",
        "pinned_num_register_threads: '256' exceeds the maximum of 128",
    ),
    (
        "pinned_reserve_segment_size_mb:0",
        "pinned_reserve_segment_size_mb",
        "pinned_reserve_segment_size_mb: '0' must be greater than 0",
    ),
    (
        "large_segment_size_mb:10",
        "large_segment_size_mb",
        "large_segment_size_mb: '10' must be greater than 10 MiB",
    ),
    (
        "per_process_memory_fraction:1.5",
        "per_process_memory_fraction",
        "per_process_memory_fraction: '1.5' must be between 0.0 and 1.0",
    ),
    (
        "backend:foo",
        "backend",
        "backend: unknown backend 'foo', expected native or cudaMallocAsync",
    ),
    (
        "bogus_key:1",
        "bogus_key",
        "unrecognized key 'bogus_key' in allocator config 'bogus_key:1'",
    ),
    (
        "expandable_segments:True,max_split_size_mb:1",
        "max_split_size_mb",
        "max_split_size_mb: '1' is below the minimum of 20 MiB",
    ),
];

#[test]
fn bad_configs_are_rejected_naming_the_key() {
    for &(s, key, msg) in BAD_CONFIGS {
        let e = AllocatorConfig::parse(s).unwrap_err();
        assert_eq!(e.key(), key, "{s}");
        assert_eq!(e.to_string(), msg, "{s}");
        assert!(e.to_string().contains(key));
    }
}

#[test]
fn bad_configs_at_runtime_change_nothing() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        a.set_settings("max_split_size_mb:64,garbage_collection_threshold:0.5")
            .unwrap();
        let live = a.malloc(3 * MIB, S0).unwrap();
        for &(s, key, msg) in BAD_CONFIGS.iter().chain(&[(
            "backend:cudaMallocAsync",
            "backend",
            "backend: 'cudaMallocAsync' differs from the backend chosen at startup, 'native'; the backend cannot change at runtime",
        )]) {
            let config = a.config();
            let before = a.memory_stats();
            match a.set_settings(s) {
                Err(AllocError::Config(e)) => {
                    assert_eq!((e.key(), e.to_string().as_str()), (key, msg), "{policy}: {s}");
                }
                other => panic!("{policy}: set_settings({s}): expected a config error, got {other:?}"),
            }
            assert_eq!(a.config(), config, "{policy}: {s} changed the config");
            assert_eq!(a.memory_stats(), before, "{policy}: {s} changed the stats");
            a.check_invariants().unwrap();
        }
        assert_eq!(a.config().max_split_size, 64 * MIB);
        assert_usable(&a, &sim, policy);
        drain(&a, &sim, &[live]);
    }
}

#[test]
fn an_unknown_policy_is_rejected_naming_the_known_ones() {
    let sim = device(0);
    let e = CachingAllocator::with_policy(sim, AllocatorConfig::default(), "fastest").unwrap_err();
    let m = e.to_string();
    assert!(m.starts_with("unknown policy 'fastest' (known: "), "{m}");
    for p in POLICIES {
        assert!(m.contains(p), "{m}");
    }
}

// ------------------------------------------------------------------------------------------
// memory fraction
// ------------------------------------------------------------------------------------------

#[test]
fn invalid_memory_fractions_are_rejected_and_keep_the_limit() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        a.set_memory_fraction(0.5).unwrap();
        for (f, text) in [
            (-0.1, "-0.1"),
            (1.1, "1.1"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
            (-0.0001, "-0.0001"),
        ] {
            let before = a.memory_stats();
            match a.set_memory_fraction(f) {
                Err(AllocError::InvalidArgument(m)) => {
                    assert_eq!(
                        m,
                        format!("invalid memory fraction {text}: set it within [0, 1]"),
                        "{policy}"
                    )
                }
                other => panic!("{policy}: fraction {f}: expected InvalidArgument, got {other:?}"),
            }
            assert_eq!(a.memory_stats(), before);
        }
        // The limit of 0.5 is still in force.
        let o = oom(a.malloc(600 * MIB, S0));
        assert_eq!(o.allowed, Some(500 * MIB), "{policy}");
        assert!(o.pytorch_message().contains("500.00 MiB allowed; "), "{policy}");
        assert_usable(&a, &sim, policy);
    }
}

#[test]
fn memory_fraction_zero_allows_no_new_device_memory() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        a.set_memory_fraction(0.0).unwrap();
        for size in [1u64, 512, MIB, 30 * MIB] {
            let o = oom(a.malloc(size, S0));
            assert_eq!(o.allowed, Some(0), "{policy}");
            assert!(o
                .pytorch_message()
                .contains("this process has 0 bytes memory in use. 0 bytes allowed; Of the allocated"));
        }
        assert_eq!(a.malloc(0, S0).unwrap(), 0, "size 0 needs no memory");
        assert_eq!(sim.used(), 0);
        assert_eq!(a.memory_stats()["num_ooms"], 4);
        a.check_invariants().unwrap();
        // Raising it again serves as before.
        a.set_memory_fraction(1.0).unwrap();
        assert_usable(&a, &sim, policy);
    }
}

#[test]
fn memory_fraction_zero_still_serves_from_the_cache() {
    // As in PyTorch, the limit applies to new device memory: cached blocks stay usable.
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let p = a.malloc(3 * MIB, S0).unwrap();
        a.free(p).unwrap();
        a.set_memory_fraction(0.0).unwrap();
        assert_eq!(a.malloc(3 * MIB, S0).unwrap(), p, "{policy}");
        a.free(p).unwrap();
        a.set_memory_fraction(1.0).unwrap();
        drain(&a, &sim, &[]);
    }
}

#[test]
fn memory_fraction_one_allows_the_whole_device() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        a.set_memory_fraction(1.0).unwrap();
        let p = a.malloc(CAPACITY, S0).unwrap();
        assert_eq!(sim.used(), CAPACITY, "{policy}");
        let o = oom(a.malloc(1, S0));
        assert_eq!(o.allowed, Some(CAPACITY));
        drain(&a, &sim, &[p]);
    }
}

// ------------------------------------------------------------------------------------------
// regressions found by the allocator_ops fuzz target (fuzz/, scripts/fuzz.sh)
// ------------------------------------------------------------------------------------------

/// A small device, Manual events.
fn small(capacity: u64, policy: &str, settings: &str) -> (Arc<SimDevice>, CachingAllocator) {
    let sim = Arc::new(SimDevice::new(SimConfig {
        capacity,
        event_mode: EventMode::Manual,
        ..SimConfig::default()
    }));
    let dev: Arc<dyn Device> = sim.clone();
    let a = CachingAllocator::with_policy(dev, AllocatorConfig::parse(settings).unwrap(), policy).unwrap();
    (sim, a)
}

/// The allocation ends in success or a typed out-of-memory error, never another error.
fn ok_or_oom(r: Result<u64, AllocError>, what: &str) -> Option<u64> {
    match r {
        Ok(p) => Some(p),
        Err(e) if e.is_out_of_memory() => None,
        Err(e) => panic!("{what}: expected success or OutOfMemory, got {e:?}"),
    }
}

/// With `max_split_size_mb` set, the out-of-memory retry `release_available_cached_blocks`
/// releases cached blocks of at least `max_split_size` as if they were whole `malloc`
/// segments. A free block of an expandable segment is not one: debug builds trip the
/// `!b.expandable && !b.is_split()` assertion in `release_block`; release builds call the
/// device's `free` on an address that no `malloc` returned and the allocation fails with
/// `CUDA error: invalid argument: free of unknown 0x…` instead of OOM or success.
/// (Found by the fuzzer with policy `cudamem` and `max_split_size_mb:24`.)
/// Fixed in commit 44c526c.
#[test]
fn oom_retry_with_max_split_size_never_releases_an_expandable_block_as_a_segment() {
    for policy in ["pytorch-expandable", "cudamem"] {
        let (sim, a) = small(64 * MIB, policy, "max_split_size_mb:24");
        let x = a.malloc(30 * MIB, S0).unwrap();
        let y = a.malloc(10 * MIB, S0).unwrap();
        a.free(x).unwrap(); // a free expandable block of 30 MiB >= max_split_size
        let z = ok_or_oom(a.malloc(40 * MIB, S0), policy);
        a.check_invariants().unwrap();
        sim.check().unwrap();
        let mut live = vec![y];
        live.extend(z);
        drain(&a, &sim, &live);
    }
}

/// The same retry with a *split* cached block of at least `max_split_size`, which exists when
/// `max_split_size_mb` is lowered at run time (`set_settings`) after a large cached block was
/// split: `release_block` is asked to free part of a segment (debug: assertion; release: the
/// device rejects `free` of the block's address and the allocation fails with a device error).
/// Fixed in commit 44c526c.
#[test]
fn oom_retry_never_releases_a_split_block_after_max_split_size_is_lowered() {
    let (sim, a) = small(64 * MIB, "pytorch", "");
    let big = a.malloc(60 * MIB, S0).unwrap();
    a.free(big).unwrap();
    let x = a.malloc(10 * MIB, S0).unwrap(); // splits the cached 60 MiB segment: 10 + 50 free
    a.set_settings("max_split_size_mb:20").unwrap();
    let y = ok_or_oom(a.malloc(30 * MIB, S0), "pytorch");
    a.check_invariants().unwrap();
    sim.check().unwrap();
    let mut live = vec![x];
    live.extend(y);
    drain(&a, &sim, &live);
}

/// `oversize_allocations` / `oversize_segments` are counted against the `max_split_size` in
/// force at each event, so lowering it at run time (`set_settings`) between the allocation and
/// the free of a large block decrements a count that was never incremented: debug builds panic
/// in `Stat::decrease` ("negative stat"), release builds report -1.
/// Fixed in commit 44c526c.
#[test]
fn lowering_max_split_size_at_run_time_keeps_the_oversize_counts_consistent() {
    for &policy in POLICIES {
        let (sim, a) = small(256 * MIB, policy, "");
        let p = a.malloc(60 * MIB, S0).unwrap();
        a.set_settings("max_split_size_mb:20").unwrap();
        a.free(p).unwrap();
        a.empty_cache().unwrap();
        let st = a.memory_stats();
        for k in ["oversize_allocations.current", "oversize_segments.current"] {
            assert!(st[k] >= 0, "{policy}: {k} = {}", st[k]);
        }
        a.check_invariants().unwrap();
        drain(&a, &sim, &[]);
    }
}

/// Counts the address-space reservations a device makes and releases (expandable segments).
#[derive(Debug)]
struct Reservations {
    sim: Arc<SimDevice>,
    made: std::sync::atomic::AtomicU64,
    released: std::sync::atomic::AtomicU64,
}

impl Reservations {
    fn outstanding(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        self.made.load(Relaxed) - self.released.load(Relaxed)
    }
}

impl Device for Reservations {
    fn index(&self) -> i32 {
        self.sim.index()
    }
    fn name(&self) -> String {
        self.sim.name()
    }
    fn total_memory(&self) -> u64 {
        self.sim.total_memory()
    }
    fn mem_get_info(&self) -> Result<(u64, u64), cudamem_device::DeviceError> {
        self.sim.mem_get_info()
    }
    fn malloc(&self, size: u64) -> Result<u64, cudamem_device::DeviceError> {
        self.sim.malloc(size)
    }
    fn free(&self, ptr: u64, size: u64) -> Result<(), cudamem_device::DeviceError> {
        self.sim.free(ptr, size)
    }
    fn granularity(&self) -> u64 {
        self.sim.granularity()
    }
    fn reserve(&self, size: u64) -> Result<u64, cudamem_device::DeviceError> {
        let r = self.sim.reserve(size);
        if r.is_ok() {
            self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }
    fn release_reservation(&self, ptr: u64, size: u64) -> Result<(), cudamem_device::DeviceError> {
        let r = self.sim.release_reservation(ptr, size);
        if r.is_ok() {
            self.released.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }
    fn map(&self, ptr: u64, size: u64) -> Result<(), cudamem_device::DeviceError> {
        self.sim.map(ptr, size)
    }
    fn unmap(&self, ptr: u64, size: u64) -> Result<(), cudamem_device::DeviceError> {
        self.sim.unmap(ptr, size)
    }
    fn record_event(&self, stream: StreamId) -> Result<cudamem_device::EventId, cudamem_device::DeviceError> {
        self.sim.record_event(stream)
    }
    fn query_event(&self, event: cudamem_device::EventId) -> Result<bool, cudamem_device::DeviceError> {
        self.sim.query_event(event)
    }
    fn synchronize_event(&self, event: cudamem_device::EventId) -> Result<(), cudamem_device::DeviceError> {
        self.sim.synchronize_event(event)
    }
    fn destroy_event(&self, event: cudamem_device::EventId) {
        self.sim.destroy_event(event)
    }
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), cudamem_device::DeviceError> {
        self.sim.synchronize_stream(stream)
    }
    fn synchronize(&self) -> Result<(), cudamem_device::DeviceError> {
        self.sim.synchronize()
    }
    fn counters(&self) -> cudamem_device::DeviceCounters {
        self.sim.counters()
    }
}

/// An expandable segment whose first growth could not be mapped (out of memory, here injected)
/// keeps its address-space reservation after `empty_cache`: `release_blocks` only visits mapped
/// free blocks, and a segment that is one unmapped free block has none, so
/// `release_expandable_segment` is never reached. No physical memory is lost (reserved and
/// device used are 0), but the reservation (1⅛ of the device's memory of address space) stays
/// until the allocator reuses it for the same stream and pool; with many streams they pile up.
/// Found by crates/replay/tests/faults.rs (multistream_prefetch, 50% injected map failures).
/// Fixed in commit 44c526c.
#[test]
fn empty_cache_releases_expandable_segments_that_were_never_mapped() {
    use cudamem_device::sim::{FaultOp, FaultPlan};
    for policy in ["pytorch-expandable", "cudamem"] {
        let sim = device(0);
        let dev = Arc::new(Reservations {
            sim: sim.clone(),
            made: Default::default(),
            released: Default::default(),
        });
        let a = CachingAllocator::with_policy(dev.clone(), AllocatorConfig::default(), policy).unwrap();
        // The first map and the map of the retry fail: the allocation is out of memory.
        sim.set_faults(FaultPlan::default().fail_nth(FaultOp::Map, 1).fail_nth(FaultOp::Map, 2));
        oom(a.malloc(3 * MIB, S1));
        sim.set_faults(FaultPlan::default());
        a.empty_cache().unwrap();
        a.check_invariants().unwrap();
        assert_eq!((a.memory_reserved(), sim.used()), (0, 0), "{policy}");
        assert_eq!(
            dev.outstanding(),
            0,
            "{policy}: address-space reservations left after empty_cache"
        );
    }
}

/// Expandable segments reserve 1⅛ of the device's memory of address space each, one per stream
/// and pool. On an H200-sized simulated device with 8 TiB of address space per device (as
/// after commit 44c526c) only 52 fit, so an allocation on the 27th stream (both pools in use)
/// failed with a *device* error (`cuMemAddressReserve failed: CUDA_ERROR_OUT_OF_MEMORY`), not
/// an out-of-memory error. A real H200 has far more address space (PyTorch reserves the same
/// per segment), so traces with many streams replay there. Fixed in commit b9f3425.
#[test]
fn expandable_segments_on_many_streams_fit_the_simulated_address_space() {
    for policy in ["pytorch-expandable", "cudamem"] {
        let sim = Arc::new(SimDevice::new(SimConfig {
            event_mode: EventMode::Manual,
            ..SimConfig::default()
        }));
        let a = allocator(&sim, policy);
        let mut live = Vec::new();
        for s in 0..64u64 {
            for size in [4096, 3 * MIB] {
                match a.malloc(size, StreamId(s)) {
                    Ok(p) => live.push(p),
                    Err(e) => panic!("{policy}: malloc({size}) on stream {s}: {e}"),
                }
            }
        }
        a.check_invariants().unwrap();
        drain(&a, &sim, &live);
    }
}
