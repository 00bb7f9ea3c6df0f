//! The narrow handles of `cudamem::Allocator` that the Python package uses instead of the
//! engine: the pointer-level `raw()` (one lock per malloc or free, with the stack and the
//! profiler's usage), `inspect()`, `private_pools()`, `history()` and `sleep_tags()`, and that
//! each of them refuses a sharded allocator with a message that says why.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudamem::{Allocator, Frame, RecordContext, StreamId, TraceObserver, Usage};

fn frame(name: &str) -> Frame {
    Frame {
        name: name.into(),
        filename: "job.py".into(),
        line: 7,
    }
}

#[test]
fn raw_malloc_with_records_the_stack_and_reads_usage_only_when_asked() {
    let a = Allocator::with_config("sim:1GiB", "", "pytorch").unwrap();
    let raw = a.raw().unwrap();
    a.history()
        .unwrap()
        .record_memory_history(true, RecordContext::All, 100);
    let mut u = Usage::default();
    let p = raw
        .malloc_with(1000, StreamId(0), None, Some(vec![frame("step")]), Some(&mut u))
        .unwrap();
    assert_ne!(p, 0);
    assert_eq!(u.block, 1024, "the rounded size");
    assert_eq!((u.allocated, u.reserved), (a.memory_allocated(), a.memory_reserved()));
    assert!(a.inspect().unwrap().owns(p));
    assert_eq!(a.inspect().unwrap().allocation_size(p), Some(1024));
    // Without usage, nothing is read.
    let q = raw.malloc_with(4096, StreamId(0), None, None, None).unwrap();
    let snap = a.history().unwrap().snapshot();
    let events = &snap.devices[0].events;
    let first = events
        .iter()
        .find(|e| e.size == 1000)
        .expect("the first malloc's event");
    let second = events
        .iter()
        .find(|e| e.size == 4096)
        .expect("the second malloc's event");
    assert_eq!(second.stack, None, "the stack is cleared after its call: {events:?}");
    let stack = &snap.stacks[first.stack.expect("the first malloc's stack") as usize];
    assert_eq!(stack.frames[0].name, "step");

    let mut f = Usage::default();
    raw.free_with(p, None, Some(&mut f)).unwrap();
    assert_eq!(f.block, 1024, "the size of the block freed");
    assert_eq!(f.allocated, a.memory_allocated());
    raw.free_with(q, None, None).unwrap();
    assert_eq!(a.memory_allocated(), 0);
    let e = raw.free_with(q, None, None).unwrap_err();
    assert!(e.to_string().contains("invalid"), "{e}");
    assert!(!a.inspect().unwrap().owns(q));
}

#[test]
fn private_pools_take_allocations_and_empty_only_pools_that_exist() {
    let a = Allocator::with_config("sim:1GiB", "", "pytorch").unwrap();
    let pools = a.private_pools().unwrap();
    let id = (1, 2);
    pools.create_or_incref(id).unwrap();
    let slot = pools.begin_allocate_to_pool(id).unwrap();
    let p = a
        .raw()
        .unwrap()
        .malloc_with(1 << 20, StreamId(0), Some(slot), None, None)
        .unwrap();
    pools.end_allocate_to_pool(id).unwrap();
    assert!(pools.check_live_allocations(id, &HashSet::from([p])).unwrap());
    assert!(!pools.check_live_allocations(id, &HashSet::new()).unwrap());
    a.raw().unwrap().free_with(p, None, None).unwrap();
    assert!(a.memory_reserved() > 0);
    assert!(pools.empty_cache(id).unwrap(), "the pool exists here");
    assert!(!pools.empty_cache((9, 9)).unwrap(), "no such pool: nothing done");
    assert_eq!(pools.use_count(id), Some(2), "created, then taken by the capture");
    pools.release(id).unwrap();
    assert_eq!(pools.use_count(id), Some(1));
    assert!(!pools.release_deferred(p).unwrap(), "no block waits for other streams");
    assert_eq!(pools.deferred_streams(p), None);
}

#[test]
fn inspection_and_observer_follow_the_engine() {
    let a = Allocator::with_config("sim:1GiB", "", "pytorch").unwrap();
    let heard = Arc::new(AtomicUsize::new(0));
    let h = heard.clone();
    let observer: TraceObserver = Arc::new(move |_| {
        h.fetch_add(1, Ordering::Relaxed);
    });
    a.history().unwrap().set_trace_observer(Some(observer));
    a.set_per_process_memory_fraction(0.5).unwrap();
    let i = a.inspect().unwrap();
    assert_eq!(i.memory_fraction(), 0.5);
    let p = a
        .raw()
        .unwrap()
        .malloc_with(3 << 20, StreamId(0), None, None, None)
        .unwrap();
    let (base, size) = i.base_allocation(p + 4096).unwrap().expect("inside a segment");
    assert!(base <= p && p < base + size, "{base:#x}+{size} holds {p:#x}");
    assert_eq!(i.allocated_and_reserved(), (a.memory_allocated(), a.memory_reserved()));
    assert!(heard.load(Ordering::Relaxed) > 0, "the observer heard the allocation");
    a.history().unwrap().set_trace_observer(None);
    a.raw().unwrap().free_with(p, None, None).unwrap();
}

#[test]
fn a_sharded_allocator_refuses_every_handle_and_says_why() {
    let a = Allocator::with_config("sim:1GiB", "sharded:True", "pytorch").unwrap();
    let errors = [
        a.raw().err().map(|e| e.to_string()),
        a.inspect().err().map(|e| e.to_string()),
        a.private_pools().err().map(|e| e.to_string()),
        a.history().err().map(|e| e.to_string()),
        a.sleep_tags().err().map(|e| e.to_string()),
    ];
    for e in errors {
        let e = e.expect("a sharded allocator has no single engine to hand out");
        assert!(e.contains("sharded:True"), "{e}");
    }
    // Buffers still work there.
    let b = a.alloc(1 << 20, cudamem::Stream::DEFAULT).unwrap();
    assert_eq!(a.memory_allocated(), 1 << 20);
    drop(b);
}

#[test]
fn sleep_tags_keep_their_state() {
    let a = Allocator::with_config("sim:1GiB", "expandable_segments:True", "pytorch").unwrap();
    let t = a.sleep_tags().unwrap();
    assert_eq!(t.set(Some("weights")).unwrap(), None);
    assert_eq!(t.current().as_deref(), Some("weights"));
    let p = a
        .raw()
        .unwrap()
        .malloc_with(4 << 20, StreamId(0), None, None, None)
        .unwrap();
    t.set(None).unwrap();
    t.sleep(&["weights"], false).unwrap();
    assert_eq!(t.stats().sleeping_tags, 1);
    assert!(t.list().iter().any(|i| i.name == "weights" && i.asleep));
    t.wake(&[]).unwrap();
    assert_eq!(t.stats().sleeping_tags, 0);
    a.raw().unwrap().free_with(p, None, None).unwrap();
}
