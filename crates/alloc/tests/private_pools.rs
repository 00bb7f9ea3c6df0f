//! Private pools (CUDA-graph captures, `torch.cuda.MemPool`): isolation, use counts, release,
//! capture-safe frees, live-allocation checks and checkpoints, on the simulated device.

use std::collections::HashSet;
use std::sync::Arc;

use cudamem_alloc::{AllocError, AllocatorConfig, CachingAllocator};
use cudamem_alloc::{Engine, MempoolId, PoolCheckpoint};
use cudamem_device::sim::{EventMode, SimConfig, SimDevice};
use cudamem_device::{Device, StreamId};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);
const G1: MempoolId = (1, 0);
const G2: MempoolId = (2, 0);

fn setup(policy: &str, mode: EventMode) -> (Arc<SimDevice>, CachingAllocator) {
    setup_with(policy, mode, AllocatorConfig::default())
}

fn setup_with(policy: &str, mode: EventMode, config: AllocatorConfig) -> (Arc<SimDevice>, CachingAllocator) {
    let sim = Arc::new(SimDevice::new(SimConfig {
        capacity: 8 << 30,
        event_mode: mode,
        ..SimConfig::default()
    }));
    let dev: Arc<dyn Device> = sim.clone();
    let a = CachingAllocator::with_policy(dev, config, policy).unwrap();
    (sim, a)
}

const POLICIES: &[&str] = cudamem_alloc::policy::POLICY_NAMES;

/// One allocation of `size` bytes on stream 0 in pool `id`, as a capture of one tensor makes it.
fn one_in_pool(e: &mut Engine, id: MempoolId, size: u64) -> u64 {
    let slot = e.begin_allocate_to_pool(id).unwrap();
    let p = e.malloc_in_pool(size, S0, slot).unwrap();
    e.end_allocate_to_pool(id).unwrap();
    p
}

#[test]
fn a_private_pool_never_hands_its_blocks_elsewhere() {
    for &policy in POLICIES {
        let (_, a) = setup(policy, EventMode::Immediate);
        let mut e = a.lock();
        let slot = e.begin_allocate_to_pool(G1).unwrap();
        let g = e.malloc_in_pool(4 * MIB, S0, slot).unwrap();
        e.end_allocate_to_pool(G1).unwrap();
        e.free(g).unwrap();
        // The freed graph block is cached in the graph's pool: a default allocation of the same
        // size gets other memory, and a second graph gets other memory too.
        let d = e.malloc(4 * MIB, S0).unwrap();
        assert_ne!(d, g, "{policy}: a default allocation reused a graph's block");
        let g2 = one_in_pool(&mut e, G2, 4 * MIB);
        assert_ne!(g2, g, "{policy}: a second graph reused the first graph's block");
        // The same pool shared: its cached block is reused.
        let slot1 = e.begin_allocate_to_pool(G1).unwrap();
        assert_eq!(slot1, slot);
        assert_eq!(
            e.malloc_in_pool(4 * MIB, S0, slot1).unwrap(),
            g,
            "{policy}: a shared pool reuses"
        );
        e.end_allocate_to_pool(G1).unwrap();
        assert_eq!(e.pool_use_count(G1), Some(2));
        drop(e);
        a.check_invariants().unwrap();
    }
}

#[test]
fn private_pools_take_whole_segments_as_pytorch_does() {
    // Two small and one large allocation: one 2 MiB small segment and one 20 MiB large one,
    // whatever the policy (expandable segments do not apply to private pools).
    for &policy in POLICIES {
        let (_, a) = setup(policy, EventMode::Immediate);
        let mut e = a.lock();
        let slot = e.begin_allocate_to_pool(G1).unwrap();
        e.malloc_in_pool(1000, S0, slot).unwrap();
        e.malloc_in_pool(2000, S0, slot).unwrap();
        e.malloc_in_pool(3 * MIB, S0, slot).unwrap();
        e.end_allocate_to_pool(G1).unwrap();
        let s = e.stats();
        assert_eq!(s.segment.all().current, 2, "{policy}");
        assert_eq!(s.reserved_bytes.all().current, 22 * MIB as i64, "{policy}");
    }
}

#[test]
fn a_released_pool_returns_its_memory_at_empty_cache_and_repeated_captures_stay_flat() {
    let (sim, a) = setup("cudamem", EventMode::Immediate);
    for i in 1..=100u64 {
        let mut e = a.lock();
        e.empty_cache().unwrap();
        let id = (i, 0);
        let slot = e.begin_allocate_to_pool(id).unwrap();
        let p = e.malloc_in_pool(8 * MIB, S0, slot).unwrap();
        let q = e.malloc_in_pool(100, S0, slot).unwrap();
        e.end_allocate_to_pool(id).unwrap();
        e.free(p).unwrap();
        e.free(q).unwrap();
        e.release_pool(id).unwrap(); // the graph is destroyed
        assert_eq!(e.pool_use_count(id), Some(0));
    }
    a.empty_cache().unwrap();
    assert_eq!(sim.used(), 0, "every released pool's segments went back to the device");
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
    assert_eq!(
        a.lock().pool_use_count((100, 0)),
        None,
        "an empty released pool is gone"
    );
    a.check_invariants().unwrap();
}

#[test]
fn a_pool_in_use_keeps_its_cache_through_empty_cache() {
    let (_, a) = setup("pytorch", EventMode::Immediate);
    let mut e = a.lock();
    let p = one_in_pool(&mut e, G1, 30 * MIB);
    e.free(p).unwrap();
    e.empty_cache().unwrap();
    assert_eq!(
        e.stats().reserved_bytes.all().current,
        30 * MIB as i64,
        "the graph still owns it"
    );
    e.empty_pool_cache(G1).unwrap();
    assert_eq!(
        e.stats().reserved_bytes.all().current,
        0,
        "emptyCache(mempool_id) releases it"
    );
    assert_eq!(e.pool_use_count(G1), Some(1), "the pool itself stays while in use");
}

#[test]
fn a_freed_pool_keeps_segments_with_live_blocks_until_they_are_freed() {
    let (_, a) = setup("pytorch", EventMode::Immediate);
    let mut e = a.lock();
    let p = one_in_pool(&mut e, G1, 30 * MIB);
    e.release_pool(G1).unwrap();
    e.empty_cache().unwrap();
    assert_eq!(e.pool_use_count(G1), Some(0), "a live output keeps the pool");
    e.free(p).unwrap();
    e.empty_cache().unwrap();
    assert_eq!(e.pool_use_count(G1), None);
    assert_eq!(e.stats().reserved_bytes.all().current, 0);
}

#[test]
fn nothing_queries_records_or_releases_while_allocating_to_a_pool() {
    let (sim, a) = setup("pytorch", EventMode::Manual);
    let mut e = a.lock();
    let slot = e.begin_allocate_to_pool(G1).unwrap();
    let p = e.malloc_in_pool(MIB, S0, slot).unwrap();
    e.record_stream(p, S1).unwrap();
    e.free(p).unwrap();
    assert_eq!(sim.live_events(), 0, "no event is recorded during a capture");
    assert!(e.allocating_to_pool());
    let err = e.empty_cache().unwrap_err();
    assert!(
        matches!(err, AllocError::InvalidArgument(ref m) if m.contains("capture")),
        "{err}"
    );
    // The deferred block is not reused by the capture.
    let q = e.malloc_in_pool(MIB, S0, slot).unwrap();
    assert_ne!(q, p);
    e.end_allocate_to_pool(G1).unwrap();
    assert_eq!(
        sim.live_events(),
        1,
        "the deferred free records its event after the capture"
    );
    drop(e);
    sim.complete_all();
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn with_record_stream_reuse_a_deferred_block_is_released_when_the_caller_says_so() {
    for &policy in POLICIES {
        let config = AllocatorConfig {
            graph_capture_record_stream_reuse: true,
            ..AllocatorConfig::default()
        };
        let (sim, a) = setup_with(policy, EventMode::Manual, config);
        let mut e = a.lock();
        let slot = e.begin_allocate_to_pool(G1).unwrap();
        let p = e.malloc_in_pool(MIB, S0, slot).unwrap();
        let plain = e.malloc_in_pool(MIB, S0, slot).unwrap();
        e.record_stream(p, S1).unwrap();
        e.free(p).unwrap();
        e.free(plain).unwrap();
        assert_eq!(e.deferred_streams(p), Some(vec![S0, S1]), "{policy}");
        assert_eq!(
            e.deferred_streams(plain),
            None,
            "{policy}: a block without other uses is free already"
        );
        e.release_deferred(p).unwrap();
        assert_eq!(e.deferred_streams(p), None, "{policy}");
        assert!(e.release_deferred(p).is_err(), "{policy}: released twice");
        assert_eq!(sim.live_events(), 0, "{policy}: no event during the capture");
        // Released, the block serves the capture's next allocation of its size.
        let q = e.malloc_in_pool(MIB, S0, slot).unwrap();
        assert!(q == p || q == plain, "{policy}: {q:#x} is neither freed block");
        let r = e.malloc_in_pool(MIB, S0, slot).unwrap();
        assert!(
            HashSet::from([q, r]) == HashSet::from([p, plain]),
            "{policy}: both blocks reused"
        );
        e.end_allocate_to_pool(G1).unwrap();
        assert_eq!(
            sim.live_events(),
            0,
            "{policy}: nothing left to record after the capture"
        );
        e.free(q).unwrap();
        e.free(r).unwrap();
        drop(e);
        a.check_invariants().unwrap();
    }
}

#[test]
fn without_record_stream_reuse_no_deferred_block_is_offered() {
    let (_, a) = setup("cudamem", EventMode::Manual);
    let mut e = a.lock();
    let slot = e.begin_allocate_to_pool(G1).unwrap();
    let p = e.malloc_in_pool(MIB, S0, slot).unwrap();
    e.record_stream(p, S1).unwrap();
    e.free(p).unwrap();
    assert_eq!(e.deferred_streams(p), None);
    e.end_allocate_to_pool(G1).unwrap();
}

#[test]
fn pool_calls_that_make_no_sense_are_errors() {
    let (_, a) = setup("pytorch", EventMode::Immediate);
    let mut e = a.lock();
    assert!(e.create_or_incref_pool((0, 0)).is_err(), "(0, 0) is the default pool");
    assert!(e.end_allocate_to_pool(G1).is_err(), "end without begin");
    assert!(e.release_pool(G1).is_err(), "release of an unknown pool");
    e.begin_allocate_to_pool(G1).unwrap();
    let twice = e.begin_allocate_to_pool(G1).unwrap_err();
    assert!(twice.to_string().contains("already allocating"), "{twice}");
    e.end_allocate_to_pool(G1).unwrap();
    e.release_pool(G1).unwrap();
    assert!(e.release_pool(G1).is_err(), "released more often than used");
}

#[test]
fn live_allocations_of_a_pool_are_checked_exactly() {
    let (_, a) = setup("cudamem", EventMode::Immediate);
    let mut e = a.lock();
    let slot = e.begin_allocate_to_pool(G1).unwrap();
    let p = e.malloc_in_pool(MIB, S0, slot).unwrap();
    let q = e.malloc_in_pool(3 * MIB, S0, slot).unwrap();
    e.end_allocate_to_pool(G1).unwrap();
    let other = e.malloc(MIB, S0).unwrap();
    let set = |v: &[u64]| v.iter().copied().collect::<HashSet<u64>>();
    assert!(e.check_pool_live_allocations(G1, &set(&[p, q])).unwrap());
    assert!(!e.check_pool_live_allocations(G1, &set(&[p])).unwrap());
    assert!(!e.check_pool_live_allocations(G1, &set(&[p, q, other])).unwrap());
    e.free(q).unwrap();
    assert!(e.check_pool_live_allocations(G1, &set(&[p])).unwrap());
    assert!(e.check_pool_live_allocations(G2, &set(&[])).is_err(), "unknown pool");
}

#[test]
fn a_checkpoint_restores_the_pools_allocations_at_their_addresses() {
    let (_, a) = setup("pytorch", EventMode::Immediate);
    let mut e = a.lock();
    let slot = e.begin_allocate_to_pool(G1).unwrap();
    let x = e.malloc_in_pool(2 * MIB, S0, slot).unwrap();
    let y = e.malloc_in_pool(3 * MIB, S0, slot).unwrap();
    let z = e.malloc_in_pool(1000, S0, slot).unwrap();
    e.free(x).unwrap();
    let cp: PoolCheckpoint = e.pool_checkpoint(G1).unwrap();
    let before = e.stats();
    // Later work changes the pool: y freed, new blocks allocated.
    e.free(y).unwrap();
    let w = e.malloc_in_pool(4 * MIB, S0, slot).unwrap();
    let v = e.malloc_in_pool(2000, S0, slot).unwrap();
    e.end_allocate_to_pool(G1).unwrap();
    let delta = e.restore_pool_checkpoint(&cp).unwrap();
    let freed: HashSet<u64> = delta.freed.iter().copied().collect();
    assert_eq!(
        freed,
        [z, w, v].into_iter().collect(),
        "every live allocation was freed"
    );
    let mut made: Vec<u64> = delta.allocated.iter().map(|a| a.0).collect();
    made.sort_unstable();
    let mut want = vec![y, z];
    want.sort_unstable();
    assert_eq!(made, want, "the checkpoint's allocations are back at their addresses");
    assert_eq!(
        e.pool_checkpoint(G1).unwrap(),
        cp,
        "the same layout as at the checkpoint"
    );
    let after = e.stats();
    assert_eq!(
        after.allocated_bytes.all().current,
        before.allocated_bytes.all().current
    );
    assert_eq!(after.allocation.all().current, before.allocation.all().current);
    assert_eq!(
        after.requested_bytes.all().current,
        before.requested_bytes.all().current
    );
    drop(e);
    a.check_invariants().unwrap();
    // The restored allocations free normally.
    a.free(y).unwrap();
    a.free(z).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn a_pool_with_its_own_segment_source_takes_and_returns_segments_there() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy, EventMode::Immediate);
        let ext = Arc::new(SimDevice::new(SimConfig {
            index: 1, // another address range
            capacity: 1 << 30,
            ..SimConfig::default()
        }));
        let mut e = a.lock();
        e.create_or_incref_pool_with(G1, Some(ext.clone())).unwrap();
        let p = one_in_pool(&mut e, G1, 4 * MIB);
        assert_eq!((ext.counters().mallocs, sim.counters().mallocs), (1, 0), "{policy}");
        assert!(
            e.stats().reserved_bytes.all().current > 0,
            "{policy}: its segments count as reserved"
        );
        let q = e.malloc(4 * MIB, S0).unwrap(); // the default pools still use the engine's device
        let main = |c: cudamem_device::DeviceCounters| c.mallocs + c.maps;
        assert_eq!(ext.counters().mallocs, 1, "{policy}");
        assert!(main(sim.counters()) >= 1, "{policy}");
        // The pool object and the caller's allocator may go first; the tensor keeps the pool.
        e.release_pool(G1).unwrap();
        e.release_pool(G1).unwrap();
        e.empty_cache().unwrap();
        assert_eq!(ext.counters().frees, 0, "{policy}: a live block keeps its segment");
        e.free(p).unwrap();
        e.free(q).unwrap();
        e.empty_cache().unwrap();
        assert_eq!(ext.counters().frees, 1, "{policy}");
        assert_eq!(e.stats().reserved_bytes.all().current, 0, "{policy}");
        drop(e);
        a.check_invariants().unwrap();
    }
}

#[test]
fn use_on_oom_pools_serve_default_allocations_that_would_fail() {
    let small = || {
        Arc::new(SimDevice::new(SimConfig {
            capacity: 100 * MIB,
            ..SimConfig::default()
        }))
    };
    for use_on_oom in [true, false] {
        let sim = small();
        let a = CachingAllocator::with_policy(sim.clone(), AllocatorConfig::default(), "pytorch").unwrap();
        let mut e = a.lock();
        let b = one_in_pool(&mut e, G2, 40 * MIB);
        e.set_use_on_oom(G2, use_on_oom).unwrap();
        e.free(b).unwrap(); // cached in the pool
        let d = e.malloc(60 * MIB, S0).unwrap(); // the device is full now
        let c = e.malloc(30 * MIB, S0);
        if use_on_oom {
            let c = c.unwrap();
            assert_eq!(c, b, "the pool's cached block serves it");
            e.free(c).unwrap();
            // Back in the pool: the next default allocation finds it again, a pool allocation too.
            let slot = e.begin_allocate_to_pool(G2).unwrap();
            assert_eq!(e.malloc_in_pool(20 * MIB, S0, slot).unwrap(), b);
            e.end_allocate_to_pool(G2).unwrap();
        } else {
            assert!(matches!(c, Err(AllocError::OutOfMemory(_))), "{c:?}");
        }
        e.free(d).unwrap();
        drop(e);
        a.check_invariants().unwrap();
    }
}

#[test]
fn a_no_split_pool_hands_out_whole_blocks_and_other_pools_still_split() {
    for &policy in POLICIES {
        let (_, a) = setup(policy, EventMode::Immediate);
        let mut e = a.lock();
        e.create_or_incref_pool(G1).unwrap();
        e.set_no_split(G1).unwrap();
        e.set_no_split(G1).unwrap(); // marking twice is marking once
                                     // A small request in the no-split pool takes its whole 2 MiB block; the next one needs
                                     // another block, where a splitting pool packs both into one.
        let (x, y) = (one_in_pool(&mut e, G1, 1024), one_in_pool(&mut e, G1, 1024));
        assert_eq!(e.allocation_size(x), Some(2 * MIB), "{policy}");
        assert!(
            y.abs_diff(x) >= 2 * MIB,
            "{policy}: the second request split the first's block"
        );
        let (u, v) = (one_in_pool(&mut e, G2, 1024), one_in_pool(&mut e, G2, 1024));
        assert_eq!(e.allocation_size(u), Some(1024), "{policy}");
        assert_eq!(v.abs_diff(u), 1024, "{policy}: pool G2 no longer splits");
        let d = e.malloc(1024, S0).unwrap();
        assert_eq!(
            e.allocation_size(d),
            Some(1024),
            "{policy}: the default pools no longer split"
        );
        for p in [x, y, u, v, d] {
            e.free(p).unwrap();
        }
        assert!(matches!(e.set_no_split((0, 0)), Err(AllocError::InvalidArgument(_))));
        drop(e);
        a.check_invariants().unwrap();
    }
}

/// PyTorch's `test_deleted_mempool_not_used_on_oom`: pools with their own segment source and
/// `use_on_oom`, made, used and deleted in turn under a 40 MiB memory fraction; then default
/// allocations that do not fit fall back to the one pool still alive, never a deleted one.
#[test]
fn deleted_use_on_oom_pools_are_not_used_on_oom() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy, EventMode::Immediate);
        let ext = Arc::new(SimDevice::new(SimConfig {
            index: 1,
            capacity: 1 << 30,
            ..SimConfig::default()
        }));
        let mut e = a.lock();
        e.set_memory_fraction((40 * MIB) as f64 / sim.total_memory() as f64)
            .unwrap();
        let pool_tensor = |e: &mut Engine, id: MempoolId| {
            e.create_or_incref_pool_with(id, Some(ext.clone())).unwrap();
            e.set_use_on_oom(id, true).unwrap();
            // `use_mem_pool`: begin, the allocation, end, then releasePool of the context's use.
            let t = one_in_pool(e, id, 40 * MIB);
            e.release_pool(id).unwrap();
            e.free(t).unwrap();
        };
        for k in 0..10 {
            let id = (100 + k, 0);
            pool_tensor(&mut e, id);
            // `~MemPool`: releasePool, then emptyCache of that pool.
            e.release_pool(id).unwrap();
            e.empty_pool_cache(id).unwrap();
            assert_eq!(e.pool_use_count(id), None, "{policy}: a deleted pool is gone");
        }
        let live = (200, 0);
        pool_tensor(&mut e, live);
        let b = e.malloc(20 * MIB, S0).unwrap();
        let c = e.malloc(20 * MIB, S0).unwrap();
        e.free(b).unwrap();
        e.free(c).unwrap();
        e.release_pool(live).unwrap();
        e.empty_pool_cache(live).unwrap();
        e.empty_cache().unwrap();
        e.set_memory_fraction(1.0).unwrap();
        assert_eq!(e.stats().reserved_bytes.all().current, 0, "{policy}");
        assert_eq!(ext.counters().mallocs, ext.counters().frees, "{policy}");
        drop(e);
        a.check_invariants().unwrap();
    }
}
