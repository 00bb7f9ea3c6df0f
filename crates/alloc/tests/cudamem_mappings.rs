//! How the `cudamem` policy maps a growth: one device mapping while at least
//! `WHOLE_GROWTH_HEADROOM` of the memory it may use stays unreserved after it (the device's, or
//! the memory fraction's limit), `MAP_CHUNK`-sized mappings below that, single pages below
//! `PAGE_MAPPING_HEADROOM`, and a growth of at least `LARGE_GROWTH` in pieces (of
//! `RECLAIM_CHUNK` while memory is plentiful), after reclaiming holes; `cudamem-compact` maps
//! page by page and `cudamem-compact16` in `MAP_CHUNK` pieces, whose reclaim unmaps only wholly
//! free mappings. Mappings are counted on the simulated device. (`cudamem_at_limit.rs`: what
//! happens when the device or the memory fraction refuses a growth.)

use cudamem_alloc::policy::{
    LARGE_GROWTH, MAP_CHUNK, PAGE, PAGE_MAPPING_HEADROOM, RECLAIM_CHUNK, WHOLE_GROWTH_HEADROOM,
};
use cudamem_alloc::CachingAllocator;
use cudamem_device::sim::SimDevice;
use cudamem_device::{Device, StreamId};

mod support;

const MIB: u64 = 1 << 20;
const GROWTH: u64 = 200 * MIB;

fn setup(policy: &str, capacity: u64) -> (std::sync::Arc<SimDevice>, CachingAllocator) {
    support::small(capacity, policy, "")
}

/// The mappings one allocation of `GROWTH` bytes makes, and the pages they hold.
fn maps_of_one_growth(sim: &SimDevice, a: &CachingAllocator) -> (u64, u64) {
    let before = sim.counters();
    let p = a.malloc(GROWTH, StreamId(0)).unwrap();
    let after = sim.counters();
    a.free(p).unwrap();
    a.check_invariants().unwrap();
    (after.maps - before.maps, after.pages_mapped - before.pages_mapped)
}

#[test]
fn a_growth_with_room_to_spare_is_one_mapping() {
    let capacity = 8 << 30; // 200 MiB leaves 97.6% free
    assert!((capacity - GROWTH) as f64 >= WHOLE_GROWTH_HEADROOM * capacity as f64);
    let (sim, a) = setup("cudamem", capacity);
    assert_eq!(maps_of_one_growth(&sim, &a), (1, GROWTH / PAGE));
    // Given back whole, as a chunked growth would be.
    a.empty_cache().unwrap();
    assert_eq!(sim.used(), 0);
}

#[test]
fn a_growth_near_the_limit_is_cut_into_map_chunk_mappings() {
    let capacity = 1 << 30; // 200 MiB leaves 80% free
    assert!(((capacity - GROWTH) as f64) < WHOLE_GROWTH_HEADROOM * capacity as f64);
    let (sim, a) = setup("cudamem", capacity);
    assert_eq!(
        maps_of_one_growth(&sim, &a),
        (GROWTH.div_ceil(MAP_CHUNK), GROWTH / PAGE)
    );
}

#[test]
fn a_growth_nearer_the_limit_is_mapped_page_by_page() {
    let capacity = 1 << 30;
    let (sim, a) = setup("cudamem", capacity);
    let first = a.malloc(GROWTH, StreamId(0)).unwrap(); // leaves 80% free: chunks
                                                        // The second leaves 61%: pages.
    assert!(((capacity - 2 * GROWTH) as f64) < PAGE_MAPPING_HEADROOM * capacity as f64);
    assert_eq!(maps_of_one_growth(&sim, &a), (GROWTH / PAGE, GROWTH / PAGE));
    a.free(first).unwrap();
}

#[test]
fn the_memory_fraction_is_the_limit_the_headroom_is_measured_against() {
    let (sim, a) = setup("cudamem", 8 << 30);
    a.set_memory_fraction(0.125).unwrap(); // a 1 GiB limit: as near as on a 1 GiB device
    assert_eq!(
        maps_of_one_growth(&sim, &a),
        (GROWTH.div_ceil(MAP_CHUNK), GROWTH / PAGE)
    );
    a.set_memory_fraction(1.0).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(maps_of_one_growth(&sim, &a), (1, GROWTH / PAGE));
}

#[test]
fn cudamem_compact_maps_page_by_page_whatever_the_room() {
    let (sim, a) = setup("cudamem-compact", 8 << 30);
    assert_eq!(maps_of_one_growth(&sim, &a), (GROWTH / PAGE, GROWTH / PAGE));
}

#[test]
fn cudamem_compact16_maps_in_chunks_whatever_the_room() {
    let (sim, a) = setup("cudamem-compact16", 8 << 30);
    assert_eq!(
        maps_of_one_growth(&sim, &a),
        (GROWTH.div_ceil(MAP_CHUNK), GROWTH / PAGE)
    );
}

/// A growth that would pass the high-water mark first unmaps the wholly free mappings of holes,
/// and only those: the live block's mapping stays.
#[test]
fn cudamem_compact16_reclaims_wholly_free_mappings_at_the_mark() {
    for (policy, reserved) in [("cudamem-compact16", 108 * MIB), ("cudamem", 172 * MIB)] {
        let (sim, a) = setup(policy, 8 << 30);
        let s = StreamId(0);
        let x = a.malloc(64 * MIB, s).unwrap(); // [0, 64): four 16 MiB mappings (compact16)
        let y = a.malloc(8 * MIB, s).unwrap(); // [64, 72)
        a.free(x).unwrap(); // a 64 MiB hole below a live block
        let before = sim.counters();
        let z = a.malloc(100 * MIB, s).unwrap(); // fits no hole: the range grows
        let d = sim.counters();
        a.check_invariants().unwrap();
        assert_eq!(sim.used(), reserved, "{policy}");
        assert_eq!(
            d.pages_unmapped - before.pages_unmapped,
            if policy == "cudamem" { 0 } else { 64 * MIB / PAGE },
            "{policy}: the hole's pages, not the live block's"
        );
        assert_eq!(
            a.lock().allocation_size(y),
            Some(8 * MIB),
            "{policy}: the live block is untouched"
        );
        a.free(y).unwrap();
        a.free(z).unwrap();
    }
}

/// A `LARGE_GROWTH` hole below a live 8 MiB block on stream 0, whose address is returned; the
/// next growth past the hole would pass the high-water mark.
fn large_hole_below_a_live_block(a: &CachingAllocator) -> u64 {
    let x = a.malloc(LARGE_GROWTH, StreamId(0)).unwrap(); // [0, 512 MiB)
    let y = a.malloc(8 * MIB, StreamId(0)).unwrap(); // one mapping above it
    a.free(x).unwrap();
    y
}

/// While memory is plentiful, a growth of at least `LARGE_GROWTH` is mapped in `RECLAIM_CHUNK`
/// pieces, and one that would pass the high-water mark first unmaps the wholly free mappings of
/// holes; nearer the limit (a memory fraction) it does the same, in smaller pieces.
#[test]
fn cudamem_reclaims_before_large_growths_at_any_distance_from_the_limit() {
    let s = StreamId(0);
    for fraction in [None, Some(0.05)] {
        let (sim, a) = setup("cudamem", 64 << 30);
        if let Some(f) = fraction {
            a.set_memory_fraction(f).unwrap(); // 3.2 GiB: less than the headroom is left
        }
        let before = sim.counters();
        let y = large_hole_below_a_live_block(&a);
        let d = sim.counters();
        let pieces = if fraction.is_none() { RECLAIM_CHUNK } else { MAP_CHUNK };
        assert_eq!(
            d.maps - before.maps,
            LARGE_GROWTH / pieces + 1,
            "{fraction:?}: a large growth in pieces, a small one whole"
        );
        let before = sim.counters();
        let z = a.malloc(LARGE_GROWTH + 64 * MIB, s).unwrap(); // fits no hole: a large growth
        let d = sim.counters();
        a.check_invariants().unwrap();
        assert_eq!(
            d.pages_unmapped - before.pages_unmapped,
            LARGE_GROWTH / PAGE,
            "{fraction:?}: the hole moved"
        );
        assert_eq!(sim.used(), 8 * MIB + LARGE_GROWTH + 64 * MIB, "{fraction:?}");
        a.free(y).unwrap();
        a.free(z).unwrap();
    }
}

/// While a private pool is being allocated to (a CUDA-graph capture), a large growth of the
/// default pools reclaims nothing: an unmap waits for its stream, which a capture forbids.
#[test]
fn no_reclaim_while_a_private_pool_is_allocated_to() {
    use cudamem_alloc::MempoolId;
    let (sim, a) = setup("cudamem", 64 << 30);
    let y = large_hole_below_a_live_block(&a);
    let pool: MempoolId = (1, 7);
    let mut e = a.lock();
    e.begin_allocate_to_pool(pool).unwrap();
    let before = sim.counters();
    let z = e.malloc(LARGE_GROWTH + 64 * MIB, StreamId(3)).unwrap(); // not the pool's stream
    assert_eq!(sim.counters().pages_unmapped, before.pages_unmapped, "nothing unmapped");
    e.end_allocate_to_pool(pool).unwrap();
    e.free(z).unwrap();
    drop(e);
    a.free(y).unwrap();
    a.check_invariants().unwrap();
}
