//! Segment observers (PyTorch's trace trackers) on the simulated device: every segment change,
//! in order, with or without the history, and nothing else.

use std::sync::{Arc, Mutex};

use cudamem_alloc::engine::{SegmentChange, SegmentEvent};
use cudamem_alloc::{AllocatorConfig, CachingAllocator};
use cudamem_device::sim::SimDevice;
use cudamem_device::StreamId;

const MIB: u64 = 1 << 20;

fn observed(conf: &str) -> (CachingAllocator, Arc<Mutex<Vec<SegmentEvent>>>) {
    let dev = Arc::new(SimDevice::with_capacity(8 << 30));
    let a = CachingAllocator::with_policy(dev, AllocatorConfig::parse(conf).unwrap(), "pytorch").unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    a.lock()
        .set_segment_observer(Some(Arc::new(move |e: &SegmentEvent| s.lock().unwrap().push(*e))));
    (a, seen)
}

#[test]
fn whole_segments_are_heard_when_made_and_when_freed() {
    let (a, seen) = observed("");
    let p = a.malloc(30 * MIB, StreamId(7)).unwrap();
    let q = a.malloc(30 * MIB, StreamId(7)).unwrap();
    a.free(p).unwrap();
    let r = a.malloc(30 * MIB, StreamId(7)).unwrap(); // from the cache: no segment change
    assert_eq!(r, p);
    let made: Vec<_> = seen.lock().unwrap().clone();
    assert_eq!(made.len(), 2, "{made:?}");
    assert!(made
        .iter()
        .all(|e| e.change == SegmentChange::Alloc && e.size == 30 * MIB && e.stream == StreamId(7)));
    assert_eq!((made[0].addr, made[1].addr), (p, q));
    a.free(q).unwrap();
    a.free(r).unwrap();
    a.empty_cache().unwrap();
    let all = seen.lock().unwrap().clone();
    let freed: Vec<u64> = all[2..].iter().map(|e| e.addr).collect();
    assert!(all[2..].iter().all(|e| e.change == SegmentChange::Free), "{all:?}");
    assert_eq!(
        {
            let mut f = freed.clone();
            f.sort();
            f
        },
        {
            let mut m = vec![p, q];
            m.sort();
            m
        }
    );
}

#[test]
fn expandable_segments_are_heard_as_maps_and_unmaps() {
    let (a, seen) = observed("expandable_segments:True");
    let p = a.malloc(30 * MIB, StreamId(0)).unwrap();
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    let ev = seen.lock().unwrap().clone();
    let mapped: u64 = ev
        .iter()
        .filter(|e| e.change == SegmentChange::Map)
        .map(|e| e.size)
        .sum();
    let unmapped: u64 = ev
        .iter()
        .filter(|e| e.change == SegmentChange::Unmap)
        .map(|e| e.size)
        .sum();
    assert!(mapped >= 30 * MIB, "{ev:?}");
    assert_eq!(
        mapped, unmapped,
        "everything mapped was unmapped by empty_cache: {ev:?}"
    );
    let first_unmap = ev.iter().position(|e| e.change == SegmentChange::Unmap).unwrap();
    assert!(ev[..first_unmap].iter().all(|e| e.change != SegmentChange::Unmap));
}

#[test]
fn no_observer_hears_nothing_and_removing_it_stops_it() {
    let (a, seen) = observed("");
    a.lock().set_segment_observer(None);
    let p = a.malloc(30 * MIB, StreamId(0)).unwrap();
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    assert!(seen.lock().unwrap().is_empty());
}
