//! Helpers shared by the misuse tests (`misuse.rs`, `misuse_settings.rs`) and the fuzz-found
//! regression tests (`fuzz_regressions.rs`): small simulated devices with manual events,
//! allocators on them, and the checks that an allocator is intact after a rejected call.

#![allow(dead_code)] // each test file uses a different part

use std::sync::Arc;

use cudamem_alloc::{AllocError, AllocatorConfig, CachingAllocator, StatsDict};
use cudamem_device::sim::{EventMode, SimConfig, SimDevice};
use cudamem_device::{Device, StreamId};

/// Every registered policy: misuse must be caught whichever decides.
pub const POLICIES: &[&str] = cudamem_alloc::policy::POLICY_NAMES;
pub const MIB: u64 = 1 << 20;
/// A multiple of 20 MiB (PyTorch's expandable large page), so that `capacity` itself fits.
pub const CAPACITY: u64 = 1000 * MIB;
pub const S0: StreamId = StreamId(0);
pub const S1: StreamId = StreamId(1);

pub fn device(index: i32) -> Arc<SimDevice> {
    Arc::new(SimDevice::new(SimConfig {
        index,
        capacity: CAPACITY,
        event_mode: EventMode::Manual,
        ..SimConfig::default()
    }))
}

pub fn allocator(sim: &Arc<SimDevice>, policy: &str) -> CachingAllocator {
    let dev: Arc<dyn Device> = sim.clone();
    CachingAllocator::with_policy(dev, AllocatorConfig::default(), policy).unwrap()
}

pub fn setup(policy: &str) -> (Arc<SimDevice>, CachingAllocator) {
    let sim = device(0);
    let a = allocator(&sim, policy);
    (sim, a)
}

/// The allocator is consistent and still serves: invariants, device check, reserved == device
/// used, and a small and a large allocation can be made and freed.
pub fn assert_usable(a: &CachingAllocator, sim: &SimDevice, what: &str) {
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
pub fn assert_intact(a: &CachingAllocator, sim: &SimDevice, before: &StatsDict, what: &str) {
    assert_eq!(&a.memory_stats(), before, "{what}: a rejected call changed the stats");
    assert_usable(a, sim, what);
}

pub fn invalid_pointer(r: Result<(), AllocError>) -> (u64, String) {
    match r {
        Err(AllocError::InvalidPointer { ptr, reason }) => (ptr, reason),
        other => panic!("expected InvalidPointer, got {other:?}"),
    }
}

/// Frees everything given, empties the cache and checks that every byte went back.
pub fn drain(a: &CachingAllocator, sim: &SimDevice, live: &[u64]) {
    for &p in live {
        a.free(p).unwrap();
    }
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(sim.used(), 0);
    assert_eq!(sim.live_events(), 0);
}

pub fn oom(r: Result<u64, AllocError>) -> Box<cudamem_alloc::OutOfMemory> {
    match r {
        Err(AllocError::OutOfMemory(o)) => o,
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
}

/// A small device, Manual events.
pub fn small(capacity: u64, policy: &str, settings: &str) -> (Arc<SimDevice>, CachingAllocator) {
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
pub fn ok_or_oom(r: Result<u64, AllocError>, what: &str) -> Option<u64> {
    match r {
        Ok(p) => Some(p),
        Err(e) if e.is_out_of_memory() => None,
        Err(e) => panic!("{what}: expected success or OutOfMemory, got {e:?}"),
    }
}
