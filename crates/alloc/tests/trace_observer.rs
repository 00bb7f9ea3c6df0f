//! Trace observers (PyTorch's trace trackers, and the history torch keeps itself) on the
//! simulated device: every event, in order, with what the history would record, whether or not
//! the engine records its own history.

use std::sync::{Arc, Mutex};

use cudamem_alloc::history::Action;
use cudamem_alloc::TraceEvent;
use cudamem_alloc::{AllocatorConfig, CachingAllocator};
use cudamem_device::sim::SimDevice;
use cudamem_device::StreamId;

const MIB: u64 = 1 << 20;

type Seen = Arc<Mutex<Vec<TraceEvent>>>;

fn observed(conf: &str) -> (CachingAllocator, Seen) {
    let dev = Arc::new(SimDevice::with_capacity(8 << 30));
    let a = CachingAllocator::with_policy(dev, AllocatorConfig::parse(conf).unwrap(), "pytorch").unwrap();
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    a.lock()
        .set_trace_observer(Some(Arc::new(move |e: &TraceEvent| s.lock().unwrap().push(*e))));
    (a, seen)
}

fn segment_events(seen: &Seen) -> Vec<TraceEvent> {
    let segment = [
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
    ];
    seen.lock()
        .unwrap()
        .iter()
        .filter(|e| segment.contains(&e.action))
        .copied()
        .collect()
}

#[test]
fn whole_segments_are_heard_when_made_and_when_freed() {
    let (a, seen) = observed("");
    let p = a.malloc(30 * MIB, StreamId(7)).unwrap();
    let q = a.malloc(30 * MIB, StreamId(7)).unwrap();
    a.free(p).unwrap();
    let r = a.malloc(30 * MIB, StreamId(7)).unwrap(); // from the cache: no segment event
    assert_eq!(r, p);
    let made = segment_events(&seen);
    assert_eq!(made.len(), 2, "{made:?}");
    for e in &made {
        assert_eq!(
            (e.action, e.size, e.stream),
            (Action::SegmentAlloc, 30 * MIB, StreamId(7))
        );
    }
    assert_eq!((made[0].addr, made[1].addr), (p, q));
    a.free(q).unwrap();
    a.free(r).unwrap();
    a.empty_cache().unwrap();
    let all = segment_events(&seen);
    assert!(all[2..].iter().all(|e| e.action == Action::SegmentFree), "{all:?}");
    let mut freed: Vec<u64> = all[2..].iter().map(|e| e.addr).collect();
    freed.sort();
    let mut want = vec![p, q];
    want.sort();
    assert_eq!(freed, want);
}

#[test]
fn expandable_segments_are_heard_as_maps_and_unmaps() {
    let (a, seen) = observed("expandable_segments:True");
    let p = a.malloc(30 * MIB, StreamId(0)).unwrap();
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    let ev = segment_events(&seen);
    let sum = |act: Action| -> u64 { ev.iter().filter(|e| e.action == act).map(|e| e.size).sum() };
    assert!(sum(Action::SegmentMap) >= 30 * MIB, "{ev:?}");
    assert_eq!(
        sum(Action::SegmentMap),
        sum(Action::SegmentUnmap),
        "empty_cache unmapped all: {ev:?}"
    );
    let first_unmap = ev.iter().position(|e| e.action == Action::SegmentUnmap).unwrap();
    assert!(ev[..first_unmap].iter().all(|e| e.action != Action::SegmentUnmap));
}

#[test]
fn allocations_frees_and_ooms_are_heard_with_requested_sizes_in_order() {
    let (a, seen) = observed("");
    let p = a.malloc(1000, StreamId(3)).unwrap();
    a.free(p).unwrap();
    let ev = seen.lock().unwrap().clone();
    let actions: Vec<Action> = ev.iter().map(|e| e.action).collect();
    let want = [
        Action::SegmentAlloc,
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
    ];
    assert_eq!(actions, want, "{ev:?}");
    assert!(ev[1..]
        .iter()
        .all(|e| e.addr == p && e.size == 1000 && e.stream == StreamId(3)));
    assert!(a.malloc(1 << 40, StreamId(3)).is_err());
    assert_eq!(seen.lock().unwrap().last().unwrap().action, Action::Oom);
}

#[test]
fn a_removed_observer_hears_nothing() {
    let (a, seen) = observed("");
    a.lock().set_trace_observer(None);
    let p = a.malloc(30 * MIB, StreamId(0)).unwrap();
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    assert!(seen.lock().unwrap().is_empty());
}
