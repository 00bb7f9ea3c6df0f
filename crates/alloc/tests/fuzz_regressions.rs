//! Regression tests for engine bugs found by the `allocator_ops` fuzz target (fuzz/,
//! scripts/fuzz.sh) and the fault-injection replays, each named for the rule it pins; the bug
//! and its fix are described beside each. docs/reliability.md lists them.

use std::sync::Arc;

use cudamem_alloc::{AllocatorConfig, CachingAllocator};
use cudamem_device::sim::{EventMode, SimConfig, SimDevice};
use cudamem_device::{Device, StreamId};

mod support;

use support::*;

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
