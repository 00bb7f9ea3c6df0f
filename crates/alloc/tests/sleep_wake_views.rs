//! What sleep and wake look like from outside the engine, on the simulated device: the history
//! entries (the ranges unmapped and mapped again, bracketed by a `cudamem.sleep:<tag>`
//! annotation; nothing for a failed call), what a trace observer hears, and that the entries
//! survive a snapshot pickle's round trip.

use std::sync::{Arc, Mutex};

use cudamem_alloc::history::Action;
use cudamem_alloc::TraceEvent;
use cudamem_alloc::{sleep_annotation, AllocatorConfig, CachingAllocator, RecordContext};
use cudamem_device::sim::{FaultOp, FaultPlan, SimConfig, SimDevice};
use cudamem_device::{Device, StreamId};
use cudamem_trace::{read_pickle, write_snapshot_pickle, Trace, TraceEvent as Event};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId(0);

fn setup(policy: &str) -> (Arc<SimDevice>, CachingAllocator) {
    let sim = Arc::new(SimDevice::new(SimConfig {
        capacity: 8 << 30,
        ..SimConfig::default()
    }));
    let dev: Arc<dyn Device> = sim.clone();
    let a = CachingAllocator::with_policy(dev, AllocatorConfig::default(), policy).unwrap();
    a.record_memory_history(true, RecordContext::All, 1 << 20);
    (sim, a)
}

fn tagged(a: &CachingAllocator, tag: &str, sizes: &[u64]) -> Vec<u64> {
    a.with_tag(tag, || sizes.iter().map(|&s| a.malloc(s, S0).unwrap()).collect())
        .unwrap()
}

fn reserved_of(a: &CachingAllocator, tag: &str) -> u64 {
    a.tags().into_iter().find(|t| t.name == tag).unwrap().reserved_bytes
}

/// The events after the `n`th one.
fn events_after(t: &Trace, n: usize) -> Vec<Event> {
    t.devices[0].events[n..].to_vec()
}

fn sum(ev: &[Event], action: Action) -> u64 {
    ev.iter().filter(|e| e.action == action).map(|e| e.size).sum()
}

#[test]
fn sleep_and_wake_leave_unmaps_maps_and_a_bracketing_annotation() {
    for &policy in cudamem_alloc::policy::POLICY_NAMES {
        let (sim, a) = setup(policy);
        let plain = a.malloc(10 * MIB, S0).unwrap();
        let w = tagged(&a, "weights", &[5 * MIB, 300 << 10, 40 * MIB]);
        let bytes = reserved_of(&a, "weights");
        let before = a.snapshot().devices[0].events.len();

        a.sleep(&["weights"], true).unwrap();
        let t = a.snapshot();
        let ev = events_after(&t, before);
        // The sleep first releases the tag's cached pages (ordinary unmaps), then its annotation
        // and the ranges it slept.
        assert_eq!(
            sum(&ev, Action::SegmentUnmap),
            bytes,
            "{policy}: every byte of the tag is unmapped"
        );
        assert_eq!(sum(&ev, Action::SegmentMap), 0, "{policy}");
        let at = ev.iter().position(|e| e.action == Action::Annotate).unwrap();
        let unmaps: Vec<&Event> = ev[at..].iter().filter(|e| e.action == Action::SegmentUnmap).collect();
        let slept = a
            .tags()
            .into_iter()
            .find(|t| t.name == "weights")
            .unwrap()
            .sleeping_bytes;
        assert!(
            slept > 0 && unmaps.iter().map(|e| e.size).sum::<u64>() == slept,
            "{policy}"
        );
        assert_eq!(
            ev[at + 1].action,
            Action::SegmentUnmap,
            "{policy}: the annotation comes first"
        );
        for p in &w {
            assert!(
                unmaps.iter().any(|e| e.addr <= *p && *p < e.addr + e.size),
                "{policy}: {p:#x} lies in an unmapped range"
            );
        }
        assert!(unmaps.iter().all(|e| !(e.addr <= plain && plain < e.addr + e.size)));
        let ann = t.annotations.last().unwrap();
        assert_eq!(
            (ann.stage.as_str(), ann.name.as_str()),
            ("START", "cudamem.sleep:weights")
        );
        assert_eq!(sleep_annotation("weights"), ann.name);

        let before = t.devices[0].events.len();
        a.wake(&["weights"]).unwrap();
        let t = a.snapshot();
        let ev = events_after(&t, before);
        assert_eq!(
            sum(&ev, Action::SegmentMap),
            slept,
            "{policy}: every slept byte comes back"
        );
        let last_map = ev.iter().rposition(|e| e.action == Action::SegmentMap).unwrap();
        assert_eq!(
            ev[last_map + 1].action,
            Action::Annotate,
            "{policy}: the annotation comes last"
        );
        let maps: Vec<(u64, u64)> = ev
            .iter()
            .filter(|e| e.action == Action::SegmentMap)
            .map(|e| (e.addr, e.size))
            .collect();
        let unmapped: Vec<(u64, u64)> = unmaps.iter().map(|e| (e.addr, e.size)).collect();
        assert_eq!(maps, unmapped, "{policy}: the same ranges, in the same order");
        let ann = t.annotations.last().unwrap();
        assert_eq!(
            (ann.stage.as_str(), ann.name.as_str()),
            ("END", "cudamem.sleep:weights")
        );
        assert_eq!(t.annotations.iter().filter(|x| x.name == ann.name).count(), 2);

        // The entries survive the pickle both ways.
        let mut bytes_out = Vec::new();
        write_snapshot_pickle(&t, &mut bytes_out).unwrap();
        let back = read_pickle(&bytes_out, "s.pickle").unwrap();
        assert_eq!(back.devices[0].events, t.devices[0].events, "{policy}");
        assert_eq!(back.annotations, t.annotations, "{policy}");
        for p in w.into_iter().chain([plain]) {
            a.free(p).unwrap();
        }
        a.check_invariants().unwrap();
        sim.check().unwrap();
    }
}

#[test]
fn a_failed_sleep_or_wake_records_nothing_of_it() {
    let (sim, a) = setup("cudamem");
    tagged(&a, "w", &[6 * MIB, 6 * MIB]);
    let res = a.memory_reserved();
    let before = a.snapshot().devices[0].events.len();
    let anns = a.snapshot().annotations.len();
    sim.set_faults(FaultPlan::default().fail_nth(FaultOp::Copy, 2));
    assert!(a.sleep(&["w"], true).is_err());
    let t = a.snapshot();
    let ev = events_after(&t, before);
    // What it released of the cache before the copy failed is ordinary release; of the sleep
    // itself nothing is recorded.
    assert!(ev.iter().all(|e| e.action != Action::Annotate), "{ev:?}");
    assert_eq!(sum(&ev, Action::SegmentUnmap), res - a.memory_reserved(), "{ev:?}");
    assert!(!a.tags()[0].asleep);
    assert_eq!(t.annotations.len(), anns);

    sim.set_faults(FaultPlan::default());
    a.sleep(&["w"], true).unwrap();
    let before = a.snapshot().devices[0].events.len();
    let anns = a.snapshot().annotations.len();
    sim.set_faults(FaultPlan::default().fail_nth(FaultOp::Copy, 1));
    assert!(a.wake(&["w"]).is_err());
    let t = a.snapshot();
    let ev = events_after(&t, before);
    assert_eq!(sum(&ev, Action::SegmentMap), 0, "a failed wake maps nothing: {ev:?}");
    assert_eq!(t.annotations.len(), anns);
    sim.set_faults(FaultPlan::default());
    a.wake(&["w"]).unwrap();
    assert_eq!(a.snapshot().annotations.last().unwrap().stage, "END");
}

#[test]
fn an_observer_hears_the_ranges_go_and_come_back() {
    let (_sim, a) = setup("pytorch");
    a.record_memory_history(false, RecordContext::Never, 1);
    let heard = Arc::new(Mutex::new(Vec::<TraceEvent>::new()));
    let h = heard.clone();
    a.lock()
        .set_trace_observer(Some(Arc::new(move |e: &TraceEvent| h.lock().unwrap().push(*e))));
    let w = tagged(&a, "kv", &[30 * MIB]);
    let bytes = reserved_of(&a, "kv");
    heard.lock().unwrap().clear();
    a.sleep(&["kv"], false).unwrap();
    let got = |act| {
        heard
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.action == act)
            .map(|e| e.size)
            .sum::<u64>()
    };
    assert_eq!(got(Action::SegmentUnmap), bytes);
    a.wake(&[]).unwrap();
    assert_eq!(got(Action::SegmentMap), bytes);
    a.free(w[0]).unwrap();
}

#[test]
fn snapshots_name_each_segment_s_tag_and_whether_it_sleeps() {
    for &policy in cudamem_alloc::policy::POLICY_NAMES {
        let (_sim, a) = setup(policy);
        let plain = a.malloc(10 * MIB, S0).unwrap();
        let w = tagged(&a, "weights", &[5 * MIB, 300 << 10]);
        let kv = tagged(&a, "kv", &[8 * MIB]);
        let seg_of = |t: &Trace, p: u64| {
            (t.segments.iter())
                .find(|s| s.address <= p && p < s.address + s.total_size)
                .cloned()
                .unwrap_or_else(|| panic!("{policy}: no segment holds {p:#x}"))
        };
        let t = a.snapshot();
        assert_eq!(
            (seg_of(&t, plain).tag, seg_of(&t, plain).asleep),
            (None, false),
            "{policy}"
        );
        for &p in &w {
            assert_eq!(seg_of(&t, p).tag.as_deref(), Some("weights"), "{policy}");
            assert!(!seg_of(&t, p).asleep);
        }

        a.sleep(&["weights"], true).unwrap();
        let t = a.snapshot();
        let asleep: u64 = t.segments.iter().filter(|s| s.asleep).map(|s| s.total_size).sum();
        let info = a.tags().into_iter().find(|t| t.name == "weights").unwrap();
        assert_eq!(
            asleep, info.sleeping_bytes,
            "{policy}: the asleep segments are the slept ranges"
        );
        let mapped: u64 = t.segments.iter().filter(|s| !s.asleep).map(|s| s.total_size).sum();
        assert_eq!(mapped, a.memory_reserved(), "{policy}: the others are what is reserved");
        for &p in &w {
            let s = seg_of(&t, p);
            assert!(s.asleep && s.tag.as_deref() == Some("weights"), "{policy}: {s:?}");
            assert!(
                s.blocks.iter().any(|b| b.address == p),
                "{policy}: its live block stays listed"
            );
        }
        let k = seg_of(&t, kv[0]);
        assert!(!k.asleep && k.tag.as_deref() == Some("kv"), "{policy}");

        // Both formats keep the tags.
        let mut out = Vec::new();
        write_snapshot_pickle(&t, &mut out).unwrap();
        assert_eq!(read_pickle(&out, "s").unwrap().segments, t.segments, "{policy}: pickle");
        let mut out = Vec::new();
        cudamem_trace::write_compact(&t, &mut out).unwrap();
        assert_eq!(
            cudamem_trace::read_compact(&out, "s").unwrap().segments,
            t.segments,
            "{policy}: compact"
        );

        a.wake(&[]).unwrap();
        assert!(a.snapshot().segments.iter().all(|s| !s.asleep), "{policy}");
    }
}

#[test]
fn memory_summary_lists_each_tag_under_pytorch_s_table() {
    let (_sim, a) = setup("pytorch");
    let p = a.malloc(MIB, S0).unwrap();
    let plain = a.memory_summary(false);
    assert!(!plain.contains("cudamem tags"), "no tags, PyTorch's table alone");
    let w = tagged(&a, "weights", &[40 * MIB]);
    a.sleep(&["weights"], true).unwrap();
    let info = a.tags()[0].clone();
    let s = a.memory_summary(false);
    assert!(s.starts_with(&plain[..plain.find("Allocated memory").unwrap()]), "{s}");
    let row = s
        .lines()
        .find(|l| l.starts_with("| weights (asleep)"))
        .unwrap_or_else(|| panic!("{s}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).filter(|c| !c.is_empty()).collect();
    let mib = |b: u64| format!("{} MiB", b >> 20);
    let kib = |b: u64| format!("{} KiB", b >> 10);
    assert_eq!(cells[1], kib(info.allocated_bytes), "{row}");
    assert_eq!(cells[2], "0 B", "{row}");
    assert!(
        cells[3] == kib(info.sleeping_bytes) || cells[3] == mib(info.sleeping_bytes),
        "{row}"
    );
    assert_eq!(cells[3], cells[4], "offloaded as much as slept: {row}");
    a.wake(&[]).unwrap();
    assert!(!a.memory_summary(false).contains("(asleep)"));
    a.free(w[0]).unwrap();
    a.free(p).unwrap();
}
