//! Misuse of the allocator: one test per case, each asserting the exact outcome (the error and
//! its message, or the behaviour) and that the allocator is intact afterwards: the stats dict
//! is unchanged by a rejected call, every invariant holds, the device agrees, and allocations
//! still work. Every case runs under the three policies. docs/reliability.md tabulates them.
//! Bad configurations and memory fractions are in `misuse_settings.rs`.
//!
//! Regression tests for engine bugs found by the `allocator_ops` fuzz target (fuzz/) and the
//! fault-injection replays are in `fuzz_regressions.rs`; see docs/reliability.md.

use cudamem_alloc::AllocError;
use cudamem_device::Device;
use cudamem_trace::BlockState;

mod support;

use support::*;

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
