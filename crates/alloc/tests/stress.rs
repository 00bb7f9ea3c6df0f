//! Concurrent stress: 16 threads share one `CachingAllocator` over a `SimDevice` with manual
//! events and make at least 1,000,000 mixed operations in total (release builds, as CI runs
//! them: about 2-5 s per policy on 2 cores; debug builds make 100,000, since every operation
//! and above all the periodic invariant check, done under the allocator's lock while the other
//! 15 threads wait, is many times slower there) across 4 streams:
//!
//! * every thread allocates mixed sizes (0, small, around the 1 MiB and 10 MiB boundaries,
//!   large) on any of the 4 streams, frees only its own allocations, and `record_stream`s them
//!   onto other streams, so frees wait for events;
//! * thread 0 also completes streams now and then (the "GPU"), thread 1 calls `empty_cache`,
//!   thread 2 reads `memory_stats`, `memory_summary` and `snapshot`, thread 3 resets peaks;
//! * every thread checks every invariant (under the allocator's lock) every few thousand
//!   operations;
//! * a shared interval set of live allocations proves that no two live allocations ever
//!   overlap: an allocation is inserted after `malloc` returns and removed before `free`;
//! * the device is small (4 GiB) so that out-of-memory errors and the release-and-retry path
//!   (which synchronises every stream) run concurrently with everything else; every failure
//!   must be a typed out-of-memory error.
//!
//! At the end: the counts of the allocator match the threads' own counts, and freeing
//! everything and `empty_cache` returns every byte and every event to the device.
//! One test per policy (`pytorch`, `pytorch-expandable`, `cudamem`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

use cudamem_alloc::{AllocatorConfig, CachingAllocator};
use cudamem_device::sim::{EventMode, SimConfig, SimDevice};
use cudamem_device::{Device, StreamId};

const THREADS: usize = 16;
const STREAMS: u64 = 4;
const CAPACITY: u64 = 4 << 30;
const MAX_LIVE_PER_THREAD: usize = 48;
const CHECK_EVERY: usize = 4096;
const MIB: u64 = 1 << 20;

fn total_ops() -> usize {
    if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn size(rng: &mut Rng) -> u64 {
    match rng.below(100) {
        0..=1 => 0,
        2..=59 => 1 + rng.below(64 << 10),
        60..=64 => MIB - 1 + rng.below(3),
        65..=69 => 10 * MIB - 1 + rng.below(3),
        70..=89 => MIB + rng.below(11 * MIB),
        _ => 12 * MIB + rng.below(68 * MIB),
    }
}

/// Live allocations of all threads: start -> (end, thread).
type Intervals = Mutex<BTreeMap<u64, (u64, usize)>>;

fn insert(set: &Intervals, p: u64, size: u64, tid: usize) {
    let end = p + size;
    let mut s = set.lock().unwrap();
    if let Some((&q, &(qend, owner))) = s.range(..end).next_back() {
        assert!(
            qend <= p,
            "thread {tid}: [{p:#x}, {end:#x}) overlaps [{q:#x}, {qend:#x}) live in thread {owner}"
        );
    }
    s.insert(p, (end, tid));
}

fn remove(set: &Intervals, p: u64, tid: usize) {
    let (_, owner) = set.lock().unwrap().remove(&p).expect("a live allocation is in the set");
    assert_eq!(owner, tid);
}

#[derive(Default, Debug)]
struct Counts {
    ops: u64,
    mallocs: u64,
    frees: u64,
    ooms: u64,
    record_streams: u64,
    checks: u64,
    live: Vec<u64>,
}

fn worker(tid: usize, a: &CachingAllocator, sim: &SimDevice, set: &Intervals, ops: usize, stop: &AtomicBool) -> Counts {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (tid as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    let mut c = Counts::default();
    let mut live: Vec<(u64, u64)> = Vec::new(); // (ptr, size)
    for i in 0..ops {
        if stop.load(Ordering::Relaxed) {
            break; // another thread failed: let the test report it
        }
        c.ops += 1;
        let r = rng.below(100);
        let full = live.len() >= MAX_LIVE_PER_THREAD;
        if r < 45 && !full {
            let sz = size(&mut rng);
            let stream = StreamId(rng.below(STREAMS));
            match a.malloc(sz, stream) {
                Ok(0) => assert_eq!(sz, 0),
                Ok(p) => {
                    insert(set, p, sz, tid);
                    live.push((p, sz));
                    c.mallocs += 1;
                }
                Err(e) => {
                    assert!(e.is_out_of_memory(), "thread {tid}: malloc({sz}): {e:?}");
                    c.ooms += 1;
                }
            }
        } else if r < 85 || full {
            if !live.is_empty() {
                let (p, _) = live.swap_remove(rng.below(live.len() as u64) as usize);
                remove(set, p, tid);
                a.free(p).unwrap_or_else(|e| panic!("thread {tid}: free({p:#x}): {e}"));
                c.frees += 1;
            }
        } else if r < 93 {
            if !live.is_empty() {
                let (p, _) = live[rng.below(live.len() as u64) as usize];
                a.record_stream(p, StreamId(rng.below(STREAMS))).unwrap();
                c.record_streams += 1;
            }
        } else {
            // The thread's role.
            match tid {
                0 => {
                    if rng.below(8) == 0 {
                        sim.complete_all();
                    } else {
                        sim.complete_stream(StreamId(rng.below(STREAMS)));
                    }
                }
                1 if rng.below(16) == 0 => a.empty_cache().unwrap(),
                2 => match rng.below(16) {
                    0 => {
                        let snap = a.snapshot();
                        snap.validate().unwrap();
                    }
                    1 => assert!(a.memory_summary(true).contains("PyTorch CUDA memory summary")),
                    _ => assert_eq!(a.memory_stats().len(), 122),
                },
                3 if rng.below(32) == 0 => a.reset_peak_memory_stats(),
                _ => {
                    let _ = a.memory_allocated();
                }
            }
        }
        if i % CHECK_EVERY == CHECK_EVERY - 1 {
            a.check_invariants()
                .unwrap_or_else(|e| panic!("thread {tid}, op {i}: {e}"));
            sim.check()
                .unwrap_or_else(|e| panic!("thread {tid}, op {i}: device: {e}"));
            c.checks += 1;
        }
    }
    c.live = live.into_iter().map(|l| l.0).collect();
    c
}

fn stress(policy: &str) {
    let sim = Arc::new(SimDevice::new(SimConfig {
        capacity: CAPACITY,
        event_mode: EventMode::Manual,
        ..SimConfig::default()
    }));
    let dev: Arc<dyn Device> = sim.clone();
    let a = CachingAllocator::with_policy(dev, AllocatorConfig::default(), policy).unwrap();
    let set: Intervals = Mutex::new(BTreeMap::new());
    let stop = AtomicBool::new(false);
    let per_thread = total_ops().div_ceil(THREADS);
    let barrier = Barrier::new(THREADS);
    let t0 = Instant::now();
    let results: Vec<Counts> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|tid| {
                let (a, sim, set, stop, barrier) = (&a, &*sim, &set, &stop, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        worker(tid, a, sim, set, per_thread, stop)
                    }));
                    if r.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let elapsed = t0.elapsed();
    let sum = |f: fn(&Counts) -> u64| results.iter().map(f).sum::<u64>();
    let (ops, mallocs, frees, ooms) = (sum(|c| c.ops), sum(|c| c.mallocs), sum(|c| c.frees), sum(|c| c.ooms));
    assert!(ops as usize >= total_ops(), "{policy}: only {ops} operations");
    a.check_invariants().unwrap();
    sim.check().unwrap();
    let st = a.stats();
    assert_eq!(
        st.allocation.all().allocated as u64,
        mallocs,
        "{policy}: allocations counted"
    );
    assert_eq!(st.allocation.all().freed as u64, frees, "{policy}: frees counted");
    assert_eq!(st.num_ooms as u64, ooms, "{policy}: OOMs counted");
    let live: Vec<u64> = results.iter().flat_map(|c| c.live.iter().copied()).collect();
    assert_eq!(st.allocation.all().current as usize, live.len());
    assert_eq!(set.lock().unwrap().len(), live.len());
    for p in live {
        a.free(p).unwrap();
    }
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.memory_allocated(), 0);
    assert_eq!(a.memory_reserved(), 0, "{policy}: reserved after draining");
    assert_eq!(sim.used(), 0, "{policy}: device memory after draining");
    assert_eq!(sim.live_events(), 0, "{policy}: events after draining");
    println!(
        "stress {policy}: {THREADS} threads, {ops} ops ({mallocs} allocations, {frees} frees, {} record_streams, {ooms} OOMs, \
         {} invariant checks, {} retries, {} syncs of all streams) in {:.2} s ({:.0} ops/s){}",
        sum(|c| c.record_streams),
        sum(|c| c.checks),
        st.num_alloc_retries,
        st.num_sync_all_streams,
        elapsed.as_secs_f64(),
        ops as f64 / elapsed.as_secs_f64(),
        if cfg!(debug_assertions) { " [debug build: reduced op count]" } else { "" }
    );
}

#[test]
fn sixteen_threads_one_million_ops_pytorch() {
    stress("pytorch");
}

#[test]
fn sixteen_threads_one_million_ops_pytorch_expandable() {
    stress("pytorch-expandable");
}

#[test]
fn sixteen_threads_one_million_ops_cudamem() {
    stress("cudamem");
}
