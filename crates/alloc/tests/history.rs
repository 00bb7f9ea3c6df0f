//! Memory history and snapshots: what is recorded, in PyTorch's schema, and that a snapshot
//! written as a pickle reads back and replays to the same peak.

use std::sync::Arc;

use cudamem_alloc::history::Action;
use cudamem_alloc::{AllocatorConfig, CachingAllocator, Frame, RecordContext};
use cudamem_device::sim::SimDevice;
use cudamem_device::{Device, StreamId};
use cudamem_trace::BlockState;

fn alloc(policy: &str) -> CachingAllocator {
    let dev: Arc<dyn Device> = Arc::new(SimDevice::default());
    CachingAllocator::with_policy(dev, AllocatorConfig::default(), policy).unwrap()
}

#[test]
fn history_records_every_event_with_stacks_and_snapshot_shows_states() {
    let a = alloc("pytorch");
    a.record_memory_history(true, RecordContext::All, 100_000);
    let f = |line| {
        vec![Frame {
            name: "train".into(),
            filename: "model.py".into(),
            line,
        }]
    };
    let x = a.malloc_with_stack(3 << 20, StreamId(0), f(10)).unwrap();
    let y = a.malloc_with_stack(100, StreamId(0), f(11)).unwrap();
    a.free(x).unwrap();
    a.annotate("START", "step 1");
    let snap = a.snapshot();
    let actions: Vec<Action> = snap.devices[0].events.iter().map(|e| e.action).collect();
    assert_eq!(
        actions,
        [
            Action::SegmentAlloc,
            Action::Alloc,
            Action::SegmentAlloc,
            Action::Alloc,
            Action::FreeRequested,
            Action::FreeCompleted,
            Action::Annotate,
            Action::Snapshot
        ]
    );
    let alloc_ev = snap.devices[0].events[1];
    assert_eq!(
        (alloc_ev.addr, alloc_ev.size),
        (x, 3 << 20),
        "alloc entries carry the requested size"
    );
    let stack = &snap.stacks[alloc_ev.stack.unwrap() as usize];
    assert_eq!(stack.frames[0].line, 10);
    assert_eq!(snap.segments.len(), 2);
    let small = snap.segments.iter().find(|s| s.total_size == 2 << 20).unwrap();
    assert_eq!(small.blocks[0].state, BlockState::ActiveAllocated);
    assert_eq!(small.blocks[0].address, y);
    assert_eq!(small.allocated_size, 512);
    let large = snap.segments.iter().find(|s| s.total_size == 20 << 20).unwrap();
    assert!(large.blocks.iter().all(|b| b.state == BlockState::Inactive));
    assert_eq!(snap.annotations[0].name, "step 1");
    a.record_memory_history(false, RecordContext::Never, 1);
    assert!(a.snapshot().devices[0].events.is_empty(), "stopping clears the history");
}

#[test]
fn the_ring_keeps_the_newest_entries() {
    let a = alloc("pytorch");
    a.record_memory_history(true, RecordContext::Never, 3);
    for _ in 0..5 {
        let p = a.malloc(512, StreamId(0)).unwrap();
        a.free(p).unwrap();
    }
    let ev = &a.snapshot().devices[0].events;
    assert_eq!(ev.len(), 3);
    assert_eq!(ev[2].action, Action::Snapshot);
    assert!(ev.iter().all(|e| e.stack.is_none()), "context Never records no stacks");
}

#[test]
fn expandable_segments_appear_as_mapped_ranges_and_pending_blocks_as_pending() {
    let a = alloc("cudamem");
    a.record_memory_history(true, RecordContext::State, 1000);
    let p = a.malloc(5 << 20, StreamId(0)).unwrap();
    a.record_stream(p, StreamId(7)).unwrap();
    let q = a.malloc(1 << 20, StreamId(0)).unwrap();
    a.free(p).unwrap();
    let snap = a.snapshot();
    assert!(snap.segments.iter().all(|s| s.is_expandable));
    let states: Vec<BlockState> = snap
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter().map(|b| b.state))
        .collect();
    assert!(
        states.contains(&BlockState::ActivePendingFree),
        "freed but its event not yet processed: {states:?}"
    );
    assert!(snap.devices[0].events.iter().any(|e| e.action == Action::SegmentMap));
    let _ = q;
}

#[test]
fn a_snapshot_pickle_reads_back_and_replays_to_the_same_peak() {
    let a = alloc("pytorch");
    a.record_memory_history(true, RecordContext::All, usize::MAX);
    let mut live = Vec::new();
    for i in 0..200u64 {
        live.push(a.malloc((i * 7919) % (24 << 20) + 1, StreamId(0)).unwrap());
        if i % 3 == 0 {
            a.free(live.swap_remove((i as usize * 31) % live.len())).unwrap();
        }
    }
    let snap = a.snapshot();
    let mut bytes = Vec::new();
    cudamem_trace::write_snapshot_pickle(&snap, &mut bytes).unwrap();
    let back = cudamem_trace::read_bytes(&bytes, "snapshot.pickle").unwrap();
    assert_eq!(back.devices[0].events.len(), snap.devices[0].events.len());
    assert_eq!(back.segments, snap.segments);
    let r = cudamem_replay_peak(&back);
    assert_eq!(r, a.max_memory_reserved());
}

/// Peak reserved from the trace's own segment entries.
fn cudamem_replay_peak(t: &cudamem_trace::Trace) -> u64 {
    t.segment_history_peak(0).0
}

#[test]
fn an_inactive_block_shows_what_its_last_allocation_asked_for_as_torch_does() {
    // torch's free keeps a block's requested size, and a merge keeps the freed block's: after
    // x (65,000 B) and t are freed into one block, torch's snapshot shows 65,000 on it
    // (PyTorch's test_memory_plots looks for that size there once the trace is filtered).
    for policy in ["pytorch", "cudamem"] {
        let a = alloc(policy);
        let x = a.malloc(65_000, StreamId(0)).unwrap();
        let t = a.malloc(1_000, StreamId(0)).unwrap();
        a.free(t).unwrap();
        a.free(x).unwrap();
        let snap = a.snapshot();
        let blocks: Vec<_> = snap.segments.iter().flat_map(|s| s.blocks.iter()).collect();
        assert_eq!(blocks.len(), 1, "{policy}: x and t merged into one free block");
        assert_eq!(blocks[0].state, BlockState::Inactive, "{policy}");
        assert_eq!(blocks[0].requested_size, 65_000, "{policy}");
        assert_eq!(
            snap.segments[0].requested_size, 0,
            "{policy}: a segment sums its active blocks only"
        );
        assert_eq!(a.stats().requested_bytes.all().current, 0, "{policy}");
        a.check_invariants().unwrap();
    }
}
