//! The real PyTorch snapshots in `tests/data` load with the right contents,
//! and survive the round trips through cudamem's writers.

mod common;

use common::{shared, stat, TRACES};
use cudamem_trace::{
    read_bytes, read_compact, read_pickle, write_compact, write_snapshot_pickle, Action, BlockState, SegmentType,
};

/// What Python says about each shared trace. Obtained with Python 3.11 on
/// the `.pickle.gz` files:
///
/// ```text
/// d = pickle.loads(gzip.open(f).read())
/// c = Counter(e['action'] for dt in d['device_traces'] for e in dt)   # counts
/// distinct non-empty tuple((fr['name'], fr['filename'], fr['line']) ...) over
///     events, segments and blocks                                      # stacks
/// len(d['segments']), sum(len(s['blocks']) ...), len(d['external_annotations'])
/// sum(1 for e in d['device_traces'][0] if e.get('frames'))            # events_with_stack
/// d['device_traces'][0][0]['time_us'], [-1]['time_us']
/// sorted({e['stream'] ...}), first three segment_alloc addrs, count of 'small' segments
/// ```
struct Expected {
    name: &'static str,
    /// alloc, free_requested, free_completed, segment_alloc, segment_free,
    /// segment_map, segment_unmap, oom, snapshot, annotate
    counts: [usize; 10],
    stacks: usize,
    segments: usize,
    blocks: usize,
    annotations: usize,
    events_with_stack: usize,
    first_time_us: i64,
    last_time_us: i64,
    streams: &'static [u64],
    first_segment_addrs: [u64; 3],
    small_segments: usize,
}

const EXPECTED: [Expected; 5] = [
    Expected {
        name: "seed_example",
        counts: [17, 14, 14, 4, 0, 0, 0, 0, 0, 0],
        stacks: 12,
        segments: 4,
        blocks: 6,
        annotations: 0,
        events_with_stack: 42,
        first_time_us: 1795958364635434,
        last_time_us: 1795958364879910,
        streams: &[0],
        first_segment_addrs: [140074450681856, 140074016571392, 140074104651776],
        small_segments: 1,
    },
    Expected {
        name: "resnet50_train",
        counts: [3552, 3549, 3549, 104, 0, 0, 0, 0, 0, 0],
        stacks: 0,
        segments: 104,
        blocks: 105,
        annotations: 16,
        events_with_stack: 0,
        first_time_us: 1795958422467345,
        last_time_us: 1795958423525892,
        streams: &[0],
        first_segment_addrs: [139929327763456, 139929405358080, 139929407455232],
        small_segments: 28,
    },
    Expected {
        name: "gpt2_train",
        counts: [6179, 6176, 6176, 154, 0, 0, 0, 0, 0, 0],
        stacks: 0,
        segments: 154,
        blocks: 158,
        annotations: 16,
        events_with_stack: 0,
        first_time_us: 1795958407335336,
        last_time_us: 1795958409921360,
        streams: &[0],
        first_segment_addrs: [140665950306304, 140666629783552, 140666105495552],
        small_segments: 5,
    },
    Expected {
        name: "multistream_prefetch",
        counts: [8436, 8432, 8430, 49, 0, 0, 0, 0, 0, 0],
        stacks: 45,
        segments: 49,
        blocks: 52,
        annotations: 120,
        events_with_stack: 9551,
        first_time_us: 1795958795604896,
        last_time_us: 1795958797422210,
        streams: &[0, 1168939696, 1173002352],
        first_segment_addrs: [139658241507328, 139658319101952, 139658321199104],
        small_segments: 5,
    },
    Expected {
        name: "bert_varlen_infer",
        counts: [14861, 14859, 14859, 40, 0, 0, 0, 0, 0, 0],
        stacks: 44,
        segments: 40,
        blocks: 42,
        annotations: 0,
        events_with_stack: 44619,
        first_time_us: 1795958383832178,
        last_time_us: 1795958389396893,
        streams: &[0],
        first_segment_addrs: [139800514396160, 139801126764544, 139800608768000],
        small_segments: 4,
    },
];

#[test]
fn shared_traces_load_with_python_verified_counts() {
    for x in &EXPECTED {
        let t = shared(x.name);
        let what = x.name;
        assert_eq!(t.source, format!("{what}.pickle.gz"));
        assert_eq!(t.devices.len(), 1, "{what}");
        assert_eq!(t.devices[0].device, 0, "{what}");
        for (a, n) in Action::ALL.iter().zip(x.counts) {
            assert_eq!(t.count(*a), n, "{what}: {a}");
        }
        assert_eq!(t.num_events(), x.counts.iter().sum::<usize>(), "{what}");
        assert_eq!(t.stacks.len(), x.stacks, "{what}: stacks");
        assert_eq!(t.segments.len(), x.segments, "{what}: segments");
        assert_eq!(
            t.segments.iter().map(|s| s.blocks.len()).sum::<usize>(),
            x.blocks,
            "{what}: blocks"
        );
        assert_eq!(t.annotations.len(), x.annotations, "{what}: annotations");
        let ev = &t.devices[0].events;
        assert_eq!(
            ev.iter().filter(|e| e.stack.is_some()).count(),
            x.events_with_stack,
            "{what}"
        );
        assert_eq!(ev.first().unwrap().time_us, x.first_time_us, "{what}");
        assert_eq!(ev.last().unwrap().time_us, x.last_time_us, "{what}");
        assert!(
            ev.windows(2).all(|w| w[0].time_us <= w[1].time_us),
            "{what}: time order"
        );
        assert_eq!(t.streams(0), x.streams, "{what}");
        assert_eq!(t.segment_alloc_addresses(0)[..3], x.first_segment_addrs, "{what}");
        assert_eq!(
            t.segments
                .iter()
                .filter(|s| s.segment_type == SegmentType::Small)
                .count(),
            x.small_segments
        );
        // Every stack id is valid; interning stored each stack once.
        t.validate().unwrap();
        let mut distinct = t.stacks.clone();
        distinct.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        distinct.dedup();
        assert_eq!(distinct.len(), t.stacks.len(), "{what}: stacks interned once");
        // Settings: PyTorch defaults in all five.
        let s = &t.settings;
        assert_eq!(
            (s.conf.as_str(), s.max_split_size, s.expandable_segments),
            ("", -1, false),
            "{what}"
        );
        assert_eq!(s.roundup_power2_divisions.len(), 16, "{what}");
        assert_eq!(s.roundup_power2_divisions[0], (1, 0));
        assert_eq!(s.roundup_power2_divisions[15], (32768, 0));
        assert_eq!(s.pinned_num_register_threads, 1);
        println!("{}", t.summary());
    }
}

#[test]
fn segment_history_peak_matches_native_stats() {
    for name in TRACES {
        let t = shared(name);
        let (peak, allocs) = t.segment_history_peak(0);
        assert_eq!(peak, stat(name, "reserved_bytes.all.peak"), "{name}: peak");
        assert_eq!(allocs, stat(name, "num_device_alloc"), "{name}: segment allocs");
        assert_eq!(t.segment_alloc_addresses(0).len() as u64, allocs, "{name}");
        // No segment is ever released in these traces, so what the snapshot
        // holds at the end is the peak.
        assert_eq!(
            t.segments.iter().map(|s| s.total_size).sum::<u64>(),
            stat(name, "reserved_bytes.all.current")
        );
    }
}

#[test]
fn snapshot_state_agrees_with_the_event_history() {
    // Facts a replay relies on: the blocks active in the final snapshot are
    // exactly the allocations never freed (active_allocated) or whose free
    // was requested but not completed (active_pending_free).
    for name in TRACES {
        let t = shared(name);
        let mut live = std::collections::BTreeMap::new();
        let mut pending = std::collections::BTreeSet::new();
        for e in &t.devices[0].events {
            match e.action {
                Action::Alloc => assert!(live.insert(e.addr, e.size).is_none(), "{name}: double alloc"),
                Action::FreeRequested => {
                    assert!(live.remove(&e.addr).is_some(), "{name}: free of unknown block");
                    pending.insert(e.addr);
                }
                Action::FreeCompleted => assert!(pending.remove(&e.addr), "{name}: completion without request"),
                _ => {}
            }
        }
        let blocks: Vec<_> = t.segments.iter().flat_map(|s| s.blocks.iter()).collect();
        let allocated: std::collections::BTreeSet<u64> = blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.address)
            .collect();
        let pend: std::collections::BTreeSet<u64> = blocks
            .iter()
            .filter(|b| b.state == BlockState::ActivePendingFree)
            .map(|b| b.address)
            .collect();
        assert_eq!(allocated, live.keys().copied().collect(), "{name}");
        assert_eq!(pend, pending, "{name}");
        // Blocks tile their segments.
        for s in &t.segments {
            assert_eq!(s.blocks[0].address, s.address);
            assert_eq!(s.blocks.iter().map(|b| b.size).sum::<u64>(), s.total_size, "{name}");
        }
    }
}

#[test]
fn pickle_to_compact_round_trip_is_lossless() {
    for name in TRACES {
        let t = shared(name);
        let mut bytes = Vec::new();
        write_compact(t, &mut bytes).unwrap();
        assert!(bytes.starts_with(b"CUDAMEMT"));
        let back = read_compact(&bytes, &t.source).unwrap();
        assert_eq!(&back, t, "{name}");
        // And the content sniffing finds it.
        assert_eq!(&read_bytes(&bytes, &t.source).unwrap(), t, "{name}");
    }
}

#[test]
fn pickle_to_snapshot_pickle_round_trip_is_lossless() {
    for name in TRACES {
        let t = shared(name);
        let mut bytes = Vec::new();
        write_snapshot_pickle(t, &mut bytes).unwrap();
        assert_eq!(bytes[0], 0x80, "pickle PROTO opcode");
        let back = read_pickle(&bytes, &t.source).unwrap();
        assert_eq!(&back, t, "{name}");
    }
}

#[test]
fn compact_then_snapshot_then_compact() {
    // Chain both writers on the trace with frames and multiple streams.
    let t = shared("multistream_prefetch");
    let mut c1 = Vec::new();
    write_compact(t, &mut c1).unwrap();
    let a = read_compact(&c1, "a").unwrap();
    let mut p = Vec::new();
    write_snapshot_pickle(&a, &mut p).unwrap();
    let b = read_pickle(&p, "a").unwrap();
    let mut c2 = Vec::new();
    write_compact(&b, &mut c2).unwrap();
    assert_eq!(c1, c2, "compact output is deterministic");
}

#[test]
fn read_path_sniffs_content_not_names() {
    let dir = std::env::temp_dir().join(format!("cudamem-trace-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = shared("seed_example");
    // A compact file named .pickle, a plain pickle named .csv, a CSV named .bin.
    let compact = dir.join("looks_like.pickle");
    write_compact(t, std::fs::File::create(&compact).unwrap()).unwrap();
    let plain = dir.join("looks_like.csv");
    write_snapshot_pickle(t, std::fs::File::create(&plain).unwrap()).unwrap();
    let csv = dir.join("looks_like.bin");
    std::fs::write(
        &csv,
        "Thread,Time,Action,Pointer,Size,Stream\n1,1.0,allocate,0x10,512,0x0\n",
    )
    .unwrap();
    let a = cudamem_trace::read_path(&compact).unwrap();
    assert_eq!(a.source, "looks_like.pickle");
    assert_eq!(a.devices, t.devices);
    let b = cudamem_trace::read_path(&plain).unwrap();
    assert_eq!(b.segments, t.segments);
    let c = cudamem_trace::read_path(&csv).unwrap();
    assert_eq!(c.count(Action::Alloc), 1);
    let missing = cudamem_trace::read_path(&dir.join("nope")).unwrap_err();
    assert_eq!(missing.kind, cudamem_trace::ErrorKind::Io);
    assert!(missing.to_string().starts_with("nope: "), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}
