//! Tests of the reports on the shared H200 traces (`tests/data`) and on allocator states built
//! with `CachingAllocator` on a simulated device.

use std::path::PathBuf;
use std::sync::Arc;

use cudamem_alloc::summary::memory_summary;
use cudamem_alloc::{AllocatorConfig, CachingAllocator, Frame};
use cudamem_device::sim::SimDevice;
use cudamem_device::{Device, StreamId};
use cudamem_replay::{replay, ReplayOptions};
use cudamem_report::replay::{run, RunOptions};
use cudamem_report::{leaks, summary, viz, why, At, Reason};
use cudamem_trace::Trace;

const MIB: u64 = 1 << 20;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(name)
}

fn load(name: &str) -> Trace {
    cudamem_trace::read_path(&data(name)).unwrap_or_else(|e| panic!("{e}"))
}

const SHARED: [&str; 5] = [
    "seed_example.pickle.gz",
    "gpt2_train.pickle.gz",
    "resnet50_train.pickle.gz",
    "bert_varlen_infer.pickle.gz",
    "multistream_prefetch.pickle.gz",
];

// ---------------------------------------------------------------------------------------------
// leaks
// ---------------------------------------------------------------------------------------------

/// The seeds' examples end with `del` of the first Linear's output and `empty_cache()`; what
/// stays live is the second Linear's weight-sized outputs. Expected values computed
/// independently with Python from the pickle:
///
/// ```text
/// d = pickle.load(gzip.open("tests/data/seed_example.pickle.gz"))
/// # active_allocated blocks of d["segments"], grouped by their frames, by requested_size:
/// #   6 frames (forward linear.py:134 ...): 2 blocks, 34603008 bytes, largest at 140074104651776
/// #   no frames:                            1 block,  33554432 bytes, at 140074215800832
/// # pairing alloc/free_requested in d["device_traces"][0] gives the same two groups.
/// ```
#[test]
fn leaks_at_the_end_of_seed_example() {
    let t = load("seed_example.pickle.gz");
    let r = leaks(&t, &At::End).unwrap();
    assert_eq!(r.basis, "snapshot segments");
    assert_eq!((r.count, r.bytes), (3, 34_603_008 + 33_554_432));
    assert_eq!(r.groups.len(), 2);
    let g = &r.groups[0];
    assert_eq!(
        (g.count, g.bytes, g.example_address, g.example_size),
        (2, 34_603_008, 140_074_104_651_776, 32 * MIB)
    );
    assert_eq!(g.frames.len(), 6);
    assert_eq!((g.frames[0].name.as_str(), g.frames[0].line), ("forward", 134));
    assert!(g.frames[0].filename.ends_with("torch/nn/modules/linear.py"));
    let g = &r.groups[1];
    assert_eq!(
        (g.count, g.bytes, g.example_address),
        (1, 33_554_432, 140_074_215_800_832)
    );
    assert!(g.frames.is_empty() && g.stack.is_none());

    let text = r.to_text(10, 12);
    assert!(text.contains("3 live allocations (65.0 MiB)"), "{text}");
    assert!(text.contains("forward  torch/nn/modules/linear.py:134"), "{text}");
    assert!(text.contains("<no stack recorded>"), "{text}");
    assert!(text.contains("0x7f658b400000"), "{text}");
    let j = r.to_json();
    assert_eq!(j["groups"][0]["bytes"], 34_603_008);
    assert_eq!(j["groups"][1]["frames"].as_array().unwrap().len(), 0);
}

/// Python: pairing alloc/free_requested over `device_traces[0][:21]` leaves 9 allocations of
/// 46607516 requested bytes.
#[test]
fn leaks_after_an_event_index() {
    let t = load("seed_example.pickle.gz");
    let r = leaks(&t, &At::Event(20)).unwrap();
    assert_eq!(r.basis, "trace events");
    assert_eq!((r.count, r.bytes), (9, 46_607_516));
    assert_eq!(r.point, "after event 20");
    assert!(leaks(&t, &At::Event(49))
        .unwrap_err()
        .contains("past the last event (48)"));
}

/// Python: the first `Optimizer.step#SGD.step` annotation (START) of resnet50_train is at a
/// time when events with `time_us <= t` leave 487 allocations of 311362284 bytes live; the
/// last one (END) 648 allocations of 413590412 bytes.
#[test]
fn leaks_at_an_annotation() {
    let t = load("resnet50_train.pickle.gz");
    let r = leaks(&t, &At::parse("Optimizer.step#SGD.step")).unwrap();
    assert_eq!((r.count, r.bytes), (487, 311_362_284));
    let r = leaks(&t, &At::parse("Optimizer.step#SGD.step@last")).unwrap();
    assert_eq!((r.count, r.bytes), (648, 413_590_412));
    let e = leaks(&t, &At::parse("nope")).unwrap_err();
    assert!(
        e.starts_with("resnet50_train.pickle.gz: no annotation named 'nope'"),
        "{e}"
    );
    assert!(e.contains("Optimizer.step#SGD.step"), "{e}");
    assert!(leaks(&t, &At::parse("Optimizer.step#SGD.step@9"))
        .unwrap_err()
        .contains("occurs 8 times"));
}

/// Groups are sorted by bytes and sum to the totals, on every shared trace; at the end of a
/// snapshot the live set agrees with the events' alloc/free pairing.
#[test]
fn leak_groups_are_consistent_on_every_shared_trace() {
    for name in SHARED {
        let t = load(name);
        let r = leaks(&t, &At::End).unwrap();
        assert!(r.groups.windows(2).all(|w| w[0].bytes >= w[1].bytes), "{name}");
        assert_eq!(r.groups.iter().map(|g| g.count).sum::<u64>(), r.count);
        let last = t.devices[0].events.len() - 1;
        let by_events = leaks(&t, &At::Event(last)).unwrap();
        assert_eq!((by_events.count, by_events.bytes), (r.count, r.bytes), "{name}");
    }
}

// ---------------------------------------------------------------------------------------------
// why
// ---------------------------------------------------------------------------------------------

/// Python: the snapshot's segments hold 90177536 reserved and 68157440 allocated bytes; the
/// 20 MiB segment has no allocated block (releasable), the 2 MiB small segment keeps 1 MiB
/// free because of one live 1 MiB block.
#[test]
fn why_on_seed_example() {
    let t = load("seed_example.pickle.gz");
    let r = why(&t).unwrap();
    assert_eq!(
        (r.reserved, r.allocated, r.releasable, r.pinned),
        (90_177_536, 68_157_440, 20 * MIB, MIB)
    );
    let pinned = r.pinned_segments();
    assert_eq!(pinned.len(), 1);
    assert_eq!(pinned[0].pinned_by.len(), 1);
    assert_eq!(pinned[0].pinned_by[0].size, MIB);
    assert_eq!(pinned[0].pinned_by[0].frames[0].name, "forward");
    assert_eq!(
        r.headline(),
        "empty_cache() would release 20.0 MiB now (1 segment); 66.0 MiB stays reserved: 65.0 MiB allocated and 1.0 MiB free that 1 live block pins in 1 segment"
    );
}

fn sim_allocator(policy: &str) -> CachingAllocator {
    let dev: Arc<dyn Device> = Arc::new(SimDevice::with_capacity(8 << 30));
    CachingAllocator::with_policy(dev, AllocatorConfig::default(), policy).unwrap()
}

fn frames(name: &str) -> Vec<Frame> {
    vec![Frame {
        name: name.into(),
        filename: "model.py".into(),
        line: 7,
    }]
}

/// A 20 MiB segment pinned by one small live block, and a 30 MiB segment with nothing live:
/// exactly the free one is releasable, and `empty_cache()` releases exactly that.
#[test]
fn why_on_a_synthetic_snapshot() {
    let a = sim_allocator("pytorch");
    let s = StreamId(0);
    let big = a.malloc(8 * MIB, s).unwrap(); // a 20 MiB segment
    let small = a.malloc_with_stack(2 * MIB, s, frames("keep_me")).unwrap(); // split from it
    a.free(big).unwrap();
    let lone = a.malloc(30 * MIB, s).unwrap(); // its own 30 MiB segment
    a.free(lone).unwrap();
    let mut t = a.snapshot();
    t.source = "synthetic".into();
    let r = why(&t).unwrap();
    assert_eq!(r.basis, "the snapshot's segments");
    assert_eq!(
        (r.reserved, r.allocated, r.releasable, r.pinned),
        (50 * MIB, 2 * MIB, 30 * MIB, 18 * MIB)
    );
    assert_eq!(r.reserved, r.allocated + r.releasable + r.pinned);
    let releasable: Vec<_> = r.segments.iter().filter(|s| s.releasable > 0).collect();
    assert_eq!(releasable.len(), 1);
    assert_eq!((releasable[0].address, releasable[0].total_size), (lone, 30 * MIB));
    let pinned = r.pinned_segments();
    assert_eq!(pinned.len(), 1);
    assert_eq!(pinned[0].reason, Reason::LiveBlocks);
    assert_eq!(pinned[0].pinned_by.len(), 1);
    assert_eq!(
        (pinned[0].pinned_by[0].address, pinned[0].pinned_by[0].size),
        (small, 2 * MIB)
    );
    assert_eq!(pinned[0].pinned_by[0].frames[0].name, "keep_me");
    let text = r.to_string();
    assert!(text.contains("empty_cache() would release 30.0 MiB now (1 segment); 20.0 MiB stays reserved: 2.0 MiB allocated and 18.0 MiB free that 1 live block pins in 1 segment"), "{text}");
    assert!(text.contains("keep_me  model.py:7"), "{text}");
    // The allocator agrees.
    let before = a.memory_reserved();
    a.empty_cache().unwrap();
    assert_eq!(before - a.memory_reserved(), r.releasable);
}

/// Expandable segments: only whole free pages are releasable; the free bytes of the page that
/// a live block shares stay mapped, pinned by that block.
#[test]
fn why_counts_whole_pages_of_expandable_segments() {
    let a = sim_allocator("pytorch-expandable");
    let s = StreamId(0);
    let x = a.malloc(30 * MIB, s).unwrap(); // maps two 20 MiB pages: [0, 40) MiB
    let y = a.malloc(4 * MIB, s).unwrap(); // [30, 34) MiB
    a.free(x).unwrap(); // free run [0, 30): page 0 whole, page 1 shared with y
    let t = a.snapshot();
    let r = why(&t).unwrap();
    assert_eq!((r.reserved, r.allocated), (40 * MIB, 4 * MIB));
    assert_eq!((r.releasable, r.pinned), (20 * MIB, 16 * MIB));
    let p = r.pinned_segments();
    assert_eq!(p.len(), 1);
    assert!(p[0].is_expandable);
    assert_eq!(p[0].pinned_by.iter().map(|b| b.address).collect::<Vec<_>>(), vec![y]);
    let before = a.memory_reserved();
    a.empty_cache().unwrap();
    assert_eq!(before - a.memory_reserved(), r.releasable);
}

/// A trace without segments is replayed: the reconstructed final state of seed_example is the
/// recorded one.
#[test]
fn why_without_segments_replays() {
    let mut t = load("seed_example.pickle.gz");
    let with = why(&t).unwrap();
    t.segments.clear();
    let without = why(&t).unwrap();
    assert!(without.basis.contains("replay"), "{}", without.basis);
    assert_eq!(
        (without.reserved, without.allocated, without.releasable, without.pinned),
        (with.reserved, with.allocated, with.releasable, with.pinned)
    );
    // The trace's stacks reach the replayed blocks.
    assert_eq!(without.pinned_segments()[0].pinned_by[0].frames[0].name, "forward");
}

#[test]
fn why_totals_add_up_on_every_shared_trace() {
    for name in SHARED {
        let r = why(&load(name)).unwrap();
        assert_eq!(r.reserved, r.allocated + r.releasable + r.pinned, "{name}");
        for s in &r.segments {
            assert_eq!(
                s.total_size,
                s.allocated + s.releasable + s.pinned,
                "{name} {:#x}",
                s.address
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// summary and the event-by-event replay
// ---------------------------------------------------------------------------------------------

#[test]
fn summary_of_resnet50_is_memory_summary_of_the_replay() {
    let t = load("resnet50_train.pickle.gz");
    let s = summary(&t).unwrap();
    let r = replay(
        &t,
        &ReplayOptions {
            policy: "pytorch".into(),
            repeats: 0,
            ..ReplayOptions::default()
        },
    )
    .unwrap();
    assert_eq!(s.devices.len(), r.devices.len());
    let (sd, rd) = (&s.devices[0], &r.devices[0]);
    assert_eq!(
        sd.table_at_end,
        memory_summary(&rd.stats_at_end.to_dict(), rd.device, false)
    );
    assert_eq!(
        sd.table_at_peak,
        memory_summary(&rd.stats_at_peak.to_dict(), rd.device, false)
    );
    let text = s.to_string();
    assert!(text.contains(&sd.table_at_end) && text.contains(&sd.table_at_peak));
    assert!(text.contains("PyTorch CUDA memory summary, device ID 0"));
    // The recorded allocator's peak, reproduced.
    assert_eq!(
        sd.stats_at_end.reserved_bytes.all().peak as u64,
        t.segment_history_peak(0).0
    );
}

/// The reports' event-by-event replay and `cudamem_replay::replay` agree (the single-stream
/// traces and the one with deferred frees).
#[test]
fn event_replay_matches_the_replay_crate() {
    for name in ["resnet50_train.pickle.gz", "multistream_prefetch.pickle.gz"] {
        let t = load(name);
        for policy in ["pytorch", "pytorch-expandable", "cudamem"] {
            let mine = run(
                &t,
                &RunOptions {
                    policy: policy.into(),
                    ..RunOptions::default()
                },
            )
            .unwrap();
            let theirs = replay(
                &t,
                &ReplayOptions {
                    policy: policy.into(),
                    repeats: 0,
                    ..ReplayOptions::default()
                },
            )
            .unwrap();
            assert_eq!(
                mine.devices[0].stats_at_end, theirs.devices[0].stats_at_end,
                "{name} {policy}"
            );
            assert_eq!(
                mine.devices[0].stats_at_peak, theirs.devices[0].stats_at_peak,
                "{name} {policy}"
            );
            let allocs = t.devices[0]
                .events
                .iter()
                .filter(|e| e.action == cudamem_trace::Action::Alloc)
                .count();
            assert_eq!(mine.devices[0].block_sizes.len(), allocs);
        }
    }
}

/// With history recorded, the replay is a trace of its own whose final state is the
/// allocator's, and whose alloc events are the replayed allocations.
#[test]
fn recorded_replay_is_a_trace() {
    let t = load("seed_example.pickle.gz");
    let r = run(
        &t,
        &RunOptions {
            record_history: true,
            ..RunOptions::default()
        },
    )
    .unwrap();
    let snap = cudamem_report::replay::snapshot(&t, &r);
    let count = |tr: &Trace, a| tr.devices[0].events.iter().filter(|e| e.action == a).count();
    use cudamem_trace::Action::*;
    for a in [Alloc, FreeRequested, SegmentAlloc] {
        assert_eq!(count(&snap, a), count(&t, a), "{a}");
    }
    assert_eq!(snap.segments.len(), t.segments.len());
    assert_eq!(leaks(&snap, &At::End).unwrap().groups[0].frames[0].name, "forward");
}

// ---------------------------------------------------------------------------------------------
// viz
// ---------------------------------------------------------------------------------------------

/// Every shared trace gives one self-contained page under a size bound: 100 bytes per event
/// plus 128 KiB of code and tables (bert_varlen_infer: 44,619 events, about 0.9 MiB).
#[test]
fn viz_of_every_shared_trace_is_bounded_and_self_contained() {
    for name in SHARED {
        let t = load(name);
        let html = viz(&t, name);
        let events: usize = t.devices.iter().map(|d| d.events.len()).sum();
        let bound = 100 * events + (128 << 10);
        assert!(html.len() <= bound, "{name}: {} bytes > {bound}", html.len());
        assert!(!html.contains("http://") && !html.contains("https://"), "{name}");
        assert!(
            html.contains("id=\"cudamem-data\"") && html.contains("data-render-ok"),
            "{name}"
        );
        assert!(html.contains("PyTorch CUDA memory summary"), "{name}: summary tables");
    }
}

#[test]
fn viz_of_a_replay_with_another_policy() {
    let t = load("seed_example.pickle.gz");
    let html = cudamem_report::viz_replay(&t, "pytorch-expandable", None, "seed").unwrap();
    assert!(html.contains("replay with policy pytorch-expandable"));
    // Expandable segments appear as mapped ranges.
    assert!(html.contains("\"spans\":[["), "expandable spans embedded");
    assert!(cudamem_report::viz_replay(&t, "nope", None, "seed").is_err());
}
