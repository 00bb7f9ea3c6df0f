//! Tags, sleep and wake on the simulated device: the state machine (tag, allocate, sleep, the
//! device's memory returns, wake at the same addresses, bytes equal when offloaded), the
//! defined errors, faults during sleep and wake, the counters, and that untagged allocations
//! are unaffected. The invariants are checked after every step.

use std::sync::Arc;

use cudamem_alloc::{AllocError, AllocatorConfig, CachingAllocator};
use cudamem_device::sim::{EventMode, FaultOp, FaultPlan, SimConfig, SimDevice};
use cudamem_device::{Device, StreamId};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);
const POLICIES: &[&str] = cudamem_alloc::policy::POLICY_NAMES;

fn setup_with(policy: &str, capacity: u64, mode: EventMode) -> (Arc<SimDevice>, CachingAllocator) {
    let sim = Arc::new(SimDevice::new(SimConfig {
        capacity,
        event_mode: mode,
        ..SimConfig::default()
    }));
    let dev: Arc<dyn Device> = sim.clone();
    let a = CachingAllocator::with_policy(dev, AllocatorConfig::default(), policy).unwrap();
    (sim, a)
}

fn setup(policy: &str) -> (Arc<SimDevice>, CachingAllocator) {
    setup_with(policy, 8 << 30, EventMode::Immediate)
}

fn check(sim: &SimDevice, a: &CachingAllocator) {
    a.check_invariants().unwrap();
    sim.check().unwrap();
}

/// A pattern of `len` bytes that differs with `seed` and contains no zero byte.
fn pattern(len: u64, seed: u64) -> Vec<u8> {
    (0..len).map(|i| ((i * 7 + seed * 13) % 255 + 1) as u8).collect()
}

/// Tagged allocations of `sizes` under `tag`, each written with its pattern.
fn fill(sim: &SimDevice, a: &CachingAllocator, tag: &str, sizes: &[u64]) -> Vec<(u64, u64)> {
    let v: Vec<(u64, u64)> = a
        .with_tag(tag, || sizes.iter().map(|&s| (a.malloc(s, S0).unwrap(), s)).collect())
        .unwrap();
    for (i, &(p, s)) in v.iter().enumerate() {
        sim.write(p, &pattern(s, i as u64)).unwrap();
    }
    v
}

fn assert_bytes(sim: &SimDevice, blocks: &[(u64, u64)], what: &str) {
    for (i, &(p, s)) in blocks.iter().enumerate() {
        assert!(
            sim.read(p, s).unwrap() == pattern(s, i as u64),
            "{what}: bytes of {p:#x} changed"
        );
    }
}

/// The message of a failed call ("" if it succeeded).
fn err<T>(r: Result<T, AllocError>) -> String {
    r.err().map(|e| e.to_string()).unwrap_or_default()
}

fn reserved(a: &CachingAllocator) -> u64 {
    a.memory_reserved()
}

fn tag_info(a: &CachingAllocator, name: &str) -> cudamem_alloc::TagInfo {
    a.tags().into_iter().find(|t| t.name == name).unwrap()
}

#[test]
fn sleep_returns_the_pages_and_wake_restores_them_at_the_same_addresses() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let plain = a.malloc(10 * MIB, S0).unwrap();
        sim.write(plain, b"untagged").unwrap();
        let w = fill(&sim, &a, "weights", &[5 * MIB, 300 << 10, 40 * MIB, 512]);
        check(&sim, &a);
        let info = tag_info(&a, "weights");
        assert!(!info.asleep && info.reserved_bytes >= 45 * MIB, "{policy}: {info:?}");
        let (used, res, allocated) = (sim.used(), reserved(&a), a.memory_allocated());

        a.sleep(&["weights"], true).unwrap();
        check(&sim, &a);
        assert_eq!(
            sim.used(),
            used - info.reserved_bytes,
            "{policy}: the device got the tag's pages"
        );
        assert_eq!(
            reserved(&a),
            res - info.reserved_bytes,
            "{policy}: reserved fell by them"
        );
        assert_eq!(a.memory_allocated(), allocated, "{policy}: the blocks stay allocated");
        let st = a.sleep_stats();
        assert_eq!(st.sleeping_bytes, info.reserved_bytes);
        assert_eq!(st.offloaded_bytes, info.reserved_bytes);
        assert_eq!(st.sleeping_allocated_bytes, info.allocated_bytes);
        assert_eq!((st.sleeping_tags, st.tags, st.num_sleeps, st.num_wakes), (1, 1, 1, 0));
        assert!(sim.read(w[0].0, 1).is_err(), "{policy}: a sleeping block has no pages");
        assert_eq!(
            sim.read(plain, 8).unwrap(),
            b"untagged",
            "{policy}: untagged memory stays"
        );
        let asleep = tag_info(&a, "weights");
        assert!(asleep.asleep && asleep.reserved_bytes == 0 && asleep.sleeping_bytes == info.reserved_bytes);

        a.wake(&["weights"]).unwrap();
        check(&sim, &a);
        assert_eq!((sim.used(), reserved(&a)), (used, res), "{policy}: the pages came back");
        assert_bytes(&sim, &w, policy);
        let st = a.sleep_stats();
        assert_eq!((st.sleeping_bytes, st.offloaded_bytes, st.sleeping_tags), (0, 0, 0));
        assert_eq!((st.peak_sleeping_bytes, st.num_wakes), (info.reserved_bytes, 1));
        assert_eq!(tag_info(&a, "weights"), info, "{policy}: the tag is as before");

        // Awake again: the tag allocates, frees and releases as any pool does.
        let more = a.malloc_tagged(3 * MIB, S0, "weights").unwrap();
        for &(p, _) in &w {
            a.free(p).unwrap();
        }
        a.free(more).unwrap();
        a.empty_cache().unwrap();
        check(&sim, &a);
        assert_eq!(
            tag_info(&a, "weights").reserved_bytes,
            0,
            "{policy}: empty_cache releases awake tags"
        );
        a.free(plain).unwrap();
    }
}

#[test]
fn tagged_pages_hold_nothing_else() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let t = a.malloc_tagged(MIB, S0, "kv").unwrap();
        a.free(t).unwrap();
        // The freed tagged block is the tag's cache: an untagged allocation gets other memory.
        let u = a.malloc(MIB, S0).unwrap();
        assert_ne!(u, t, "{policy}: an untagged allocation reused a tagged block");
        let t2 = a.malloc_tagged(MIB, S0, "kv").unwrap();
        assert_eq!(t2, t, "{policy}: the tag reuses its own cache");
        let other = a.malloc_tagged(MIB, S0, "other").unwrap();
        assert_ne!(other, t, "{policy}: two tags share no block");
        a.sleep(&["kv"], false).unwrap();
        assert!(
            sim.read(other, 8).is_ok() && sim.read(u, 8).is_ok(),
            "{policy}: others stay mapped"
        );
        a.wake(&[]).unwrap();
        check(&sim, &a);
    }
}

#[test]
fn without_offload_the_bytes_are_discarded() {
    let (sim, a) = setup("pytorch");
    let w = fill(&sim, &a, "cache", &[4 * MIB]);
    a.sleep(&["cache"], false).unwrap();
    assert_eq!(a.sleep_stats().offloaded_bytes, 0);
    a.wake(&["cache"]).unwrap();
    check(&sim, &a);
    assert_eq!(
        sim.read(w[0].0, 64).unwrap(),
        vec![0; 64],
        "new pages hold none of the old bytes"
    );
}

#[test]
fn misuse_is_an_error_that_names_the_tag_and_changes_nothing() {
    let (sim, a) = setup("cudamem");
    let w = fill(&sim, &a, "weights", &[2 * MIB]);
    a.set_tag(Some("weights")).unwrap();
    a.set_tag(None).unwrap();
    a.malloc_tagged(MIB, S0, "awake").unwrap();
    a.sleep(&["weights"], true).unwrap();
    let (used, st) = (sim.used(), a.sleep_stats());

    a.set_tag(Some("weights")).unwrap();
    let e = err(a.malloc(MIB, S0));
    assert!(e.contains("\"weights\"") && e.contains("asleep"), "{e}");
    a.set_tag(None).unwrap();
    assert!(err(a.malloc_tagged(MIB, S0, "weights")).contains("weights"));
    assert!(err(a.sleep(&["weights"], true)).contains("asleep already"));
    assert!(err(a.sleep(&["nope"], true)).contains("no tag named \"nope\""));
    assert!(err(a.wake(&["nope"])).contains("no tag named \"nope\""));
    let e = err(a.wake(&["weights", "nope"]));
    assert!(e.contains("nope"), "{e}");
    assert!(tag_info(&a, "weights").asleep, "a refused wake wakes nothing");
    for bad in ["", "a\nb", &"x".repeat(65)] {
        assert!(err(a.set_tag(Some(bad))).contains("invalid tag name"), "{bad:?}");
    }
    // The tags' private-pool ids and slots are not the callers'.
    {
        let mut e = a.lock();
        assert!(e.create_or_incref_pool((u64::MAX, 0)).is_err());
        assert!(e.release_pool((u64::MAX, 0)).is_err());
        assert!(e.empty_pool_cache((u64::MAX, 0)).is_err());
        assert!(e.malloc_in_pool(MIB, S0, cudamem_alloc::PoolSlot(0)).is_err());
    }
    assert!(err(a.wake(&["awake"])).contains("not asleep"));
    assert_eq!((sim.used(), a.sleep_stats()), (used, st), "the errors changed nothing");
    check(&sim, &a);
    a.wake(&["weights"]).unwrap();
    assert_bytes(&sim, &w, "after the errors");
    check(&sim, &a);
}

#[test]
fn sleep_and_wake_are_refused_while_a_capture_is_open() {
    let (sim, a) = setup("pytorch");
    fill(&sim, &a, "w", &[MIB]);
    let mut e = a.lock();
    e.begin_allocate_to_pool((1, 0)).unwrap();
    assert!(e.sleep(&["w"], true).unwrap_err().to_string().contains("capture"));
    e.end_allocate_to_pool((1, 0)).unwrap();
    e.sleep(&["w"], true).unwrap();
    e.begin_allocate_to_pool((1, 0)).unwrap();
    assert!(e.wake(&["w"]).is_err());
    e.end_allocate_to_pool((1, 0)).unwrap();
    e.wake(&["w"]).unwrap();
    drop(e);
    check(&sim, &a);
}

#[test]
fn freeing_a_sleeping_block_is_allowed_and_its_pages_go_at_wake() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let w = fill(&sim, &a, "w", &[8 * MIB, 8 * MIB, 8 * MIB]);
        let before = tag_info(&a, "w").reserved_bytes;
        a.sleep(&["w"], true).unwrap();
        a.free(w[1].0).unwrap();
        check(&sim, &a);
        a.empty_cache().unwrap(); // leaves the sleeping tag alone
        check(&sim, &a);
        let allocated = tag_info(&a, "w").allocated_bytes;
        assert_eq!(a.sleep_stats().sleeping_allocated_bytes, allocated);
        a.wake(&["w"]).unwrap();
        check(&sim, &a);
        let after = tag_info(&a, "w").reserved_bytes;
        assert!(
            after < before,
            "{policy}: the freed block's pages were released ({after} < {before})"
        );
        assert_bytes(&sim, &w[..1], policy);
        assert_eq!(sim.read(w[2].0, w[2].1).unwrap(), pattern(w[2].1, 2), "{policy}");
        // Everything freed while asleep: the wake leaves the tag with nothing mapped.
        a.sleep(&["w"], false).unwrap();
        a.free(w[0].0).unwrap();
        a.free(w[2].0).unwrap();
        a.wake(&["w"]).unwrap();
        check(&sim, &a);
        assert_eq!(tag_info(&a, "w").reserved_bytes, 0, "{policy}");
        assert_eq!(sim.used(), 0, "{policy}");
    }
}

#[test]
fn a_wake_without_memory_leaves_everything_asleep_and_intact() {
    for &policy in POLICIES {
        let (sim, a) = setup_with(policy, 64 * MIB, EventMode::Immediate);
        let w = fill(&sim, &a, "w", &[10 * MIB, 10 * MIB]);
        a.sleep(&["w"], true).unwrap();
        let (used, res, st) = (sim.used(), reserved(&a), a.sleep_stats());
        let big = a.malloc(50 * MIB, S0).unwrap(); // the memory the tag gave back, in use
        let used_big = sim.used();
        let e = a.wake(&["w"]).unwrap_err();
        assert!(e.is_out_of_memory(), "{policy}: {e}");
        check(&sim, &a);
        assert_eq!(sim.used(), used_big, "{policy}: the failed wake holds no pages");
        assert_eq!(a.sleep_stats().num_wake_ooms, 1);
        assert!(tag_info(&a, "w").asleep);
        // Freed, the big block is cache: the wake releases it and succeeds.
        a.free(big).unwrap();
        a.wake(&["w"]).unwrap();
        check(&sim, &a);
        assert_bytes(&sim, &w, policy);
        assert_eq!(a.sleep_stats().sleeping_bytes, 0);
        assert!(reserved(&a) >= res + st.sleeping_bytes && used + st.sleeping_bytes <= sim.used());
    }
}

#[test]
fn map_faults_during_wake() {
    let (sim, a) = setup("pytorch");
    let w = fill(&sim, &a, "w", &[6 * MIB, 200 << 10]);
    a.sleep(&["w"], true).unwrap();
    let (used, st) = (sim.used(), a.sleep_stats());
    // Every map fails: the wake and its retry fail, and nothing changes.
    sim.set_faults(FaultPlan::default().fail_fraction(&[FaultOp::Map], 1.0, 7));
    assert!(a.wake(&[]).unwrap_err().is_out_of_memory());
    check(&sim, &a);
    assert_eq!((sim.used(), a.sleep_stats().sleeping_bytes), (used, st.sleeping_bytes));
    // The second map fails: the first attempt is undone, the retry succeeds.
    sim.set_faults(FaultPlan::default().fail_nth(FaultOp::Map, 2));
    a.wake(&[]).unwrap();
    check(&sim, &a);
    assert_bytes(&sim, &w, "after a retried wake");
}

#[test]
fn copy_faults_during_sleep_and_wake() {
    let (sim, a) = setup("cudamem");
    let w = fill(&sim, &a, "w", &[6 * MIB, 6 * MIB]);
    let used = sim.used();
    // A failing offload copy: the tag stays awake, nothing is unmapped.
    sim.set_faults(FaultPlan::default().fail_nth(FaultOp::Copy, 2));
    assert!(a.sleep(&["w"], true).is_err());
    check(&sim, &a);
    assert!(!tag_info(&a, "w").asleep);
    assert_eq!((sim.used(), a.sleep_stats().sleeping_bytes), (used, 0));
    assert_bytes(&sim, &w, "after a failed sleep");
    // A failing restore copy: the wake is undone, the host copies stay.
    sim.set_faults(FaultPlan::default());
    a.sleep(&["w"], true).unwrap();
    let st = a.sleep_stats();
    sim.set_faults(FaultPlan::default().fail_nth(FaultOp::Copy, 1));
    let e = a.wake(&["w"]).unwrap_err();
    assert!(!e.is_out_of_memory(), "{e}");
    check(&sim, &a);
    assert_eq!(a.sleep_stats(), st, "a failed wake changes no counter");
    assert_eq!(sim.used(), used - st.sleeping_bytes);
    a.wake(&["w"]).unwrap();
    check(&sim, &a);
    assert_bytes(&sim, &w, "after a failed wake");
}

#[test]
fn sleep_waits_for_work_on_other_streams() {
    let (sim, a) = setup_with("pytorch", 8 << 30, EventMode::Manual);
    let w = fill(&sim, &a, "w", &[4 * MIB, 4 * MIB]);
    a.record_stream(w[0].0, S1).unwrap();
    a.free(w[0].0).unwrap();
    assert_eq!(a.lock().pending_frees(), 1);
    a.sleep(&["w"], true).unwrap();
    assert_eq!(
        a.lock().pending_frees(),
        0,
        "the pending free completed before the pages went"
    );
    check(&sim, &a);
    a.wake(&["w"]).unwrap();
    check(&sim, &a);
    assert_eq!(sim.read(w[1].0, w[1].1).unwrap(), pattern(w[1].1, 1));
}

#[test]
fn several_tags_sleep_and_wake_apart_or_together() {
    let (sim, a) = setup("pytorch-expandable");
    let w = fill(&sim, &a, "weights", &[12 * MIB]);
    let kv = fill(&sim, &a, "kv", &[20 * MIB, 2 * MIB]);
    let base = sim.used();
    a.sleep(&[], true).unwrap(); // every awake tag
    check(&sim, &a);
    assert_eq!(a.sleep_stats().sleeping_tags, 2);
    let slept = a.sleep_stats().sleeping_bytes;
    assert_eq!(sim.used(), base - slept);
    a.wake(&["kv"]).unwrap();
    check(&sim, &a);
    assert!(tag_info(&a, "weights").asleep && !tag_info(&a, "kv").asleep);
    assert_bytes(&sim, &kv, "kv");
    a.wake(&["weights"]).unwrap();
    assert_bytes(&sim, &w, "weights");
    assert_eq!(sim.used(), base);
    let st = a.sleep_stats();
    assert_eq!((st.num_sleeps, st.num_wakes, st.peak_sleeping_bytes), (2, 2, slept));
    check(&sim, &a);
}

#[test]
fn the_current_tag_is_set_and_restored() {
    let (sim, a) = setup("pytorch");
    assert_eq!(a.current_tag(), None);
    assert_eq!(a.set_tag(Some("a")).unwrap(), None);
    let inner = a
        .with_tag("b", || {
            assert_eq!(a.current_tag().as_deref(), Some("b"));
            a.malloc(MIB, S0).unwrap()
        })
        .unwrap();
    assert_eq!(
        a.current_tag().as_deref(),
        Some("a"),
        "with_tag restores the tag before it"
    );
    let outer = a.malloc(MIB, S0).unwrap();
    assert_eq!(a.set_tag(None).unwrap().as_deref(), Some("a"));
    let plain = a.malloc(MIB, S0).unwrap();
    assert_eq!(
        tag_info(&a, "a").allocated_bytes,
        a.lock().allocation_size(outer).unwrap()
    );
    assert_eq!(
        tag_info(&a, "b").allocated_bytes,
        a.lock().allocation_size(inner).unwrap()
    );
    a.sleep(&["a", "b"], false).unwrap();
    assert!(sim.read(plain, 1).is_ok() && sim.read(inner, 1).is_err() && sim.read(outer, 1).is_err());
    a.wake(&["b", "a", "b"]).unwrap();
    check(&sim, &a);
}

#[test]
fn untagged_stats_are_unchanged_by_tags_that_hold_nothing() {
    let (sim, a) = setup("pytorch");
    let p = a.malloc(3 * MIB, S0).unwrap();
    let mut before = a.stats();
    a.set_tag(Some("empty")).unwrap();
    a.set_tag(None).unwrap();
    a.sleep(&["empty"], true).unwrap();
    a.wake(&["empty"]).unwrap();
    before.num_sync_all_streams += 1; // the sleep synchronised
    assert_eq!(a.stats(), before);
    a.free(p).unwrap();
    check(&sim, &a);
}

#[test]
fn a_memory_fraction_limits_a_wake() {
    let (sim, a) = setup_with("pytorch", 64 * MIB, EventMode::Immediate);
    a.set_memory_fraction(0.5).unwrap();
    let w = fill(&sim, &a, "w", &[20 * MIB]);
    a.sleep(&["w"], true).unwrap();
    let p = a.malloc(20 * MIB, S0).unwrap();
    assert!(
        a.wake(&["w"]).unwrap_err().is_out_of_memory(),
        "40 MiB would pass the 32 MiB allowed"
    );
    check(&sim, &a);
    a.free(p).unwrap();
    a.wake(&["w"]).unwrap();
    check(&sim, &a);
    assert_bytes(&sim, &w, "after the limited wake");
}
