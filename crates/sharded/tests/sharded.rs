//! The sharded allocator against the single-mutex one: same decisions (addresses), same
//! 122 statistics after every step, exact device-wide peaks across threads, the out-of-memory
//! retry across shards, and a multi-threaded stress run with every invariant checked.

use std::sync::{Arc, Barrier};

use cudamem_alloc::{AllocatorConfig, CachingAllocator};
use cudamem_device::sim::{SimConfig, SimDevice};
use cudamem_device::{Device, StreamId};
use cudamem_sharded::ShardedAllocator;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Step {
    Alloc { size: u64, stream: u8 },
    Free { pick: usize },
    EmptyCache,
    ResetPeaks,
}

fn step() -> impl Strategy<Value = Step> {
    let size = prop_oneof![
        4 => 1u64..4096,
        4 => 4096u64..(1 << 20) + 1,
        3 => (1u64 << 20)..(12 << 20),
        1 => (12u64 << 20)..(90 << 20),
    ];
    prop_oneof![
        6 => (size, 0u8..4).prop_map(|(size, stream)| Step::Alloc { size, stream }),
        5 => any::<usize>().prop_map(|pick| Step::Free { pick }),
        1 => Just(Step::EmptyCache),
        1 => Just(Step::ResetPeaks),
    ]
}

fn sim(capacity: u64) -> Arc<dyn Device> {
    Arc::new(SimDevice::new(SimConfig {
        capacity,
        ..SimConfig::default()
    }))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// One thread, several streams: the sharded allocator hands out the same addresses and
    /// reports the same 122 statistics as the single engine, after every step — also under
    /// memory pressure small enough for the out-of-memory path.
    #[test]
    fn same_decisions_and_stats_as_one_engine(
        steps in prop::collection::vec(step(), 1..200),
        policy in prop_oneof![Just("pytorch"), Just("pytorch-expandable"), Just("cudamem")],
        small in any::<bool>(),
        check_every in prop_oneof![Just(1usize), 2usize..40],
    ) {
        let cap = if small { 256 << 20 } else { 8 << 30 };
        let one = CachingAllocator::with_policy(sim(cap), AllocatorConfig::default(), policy).unwrap();
        let many = ShardedAllocator::new(sim(cap), AllocatorConfig::default(), policy).unwrap();
        let mut live: Vec<(u64, StreamId)> = Vec::new();
        // Reading the stats closes the shards' log windows: checking after every step would
        // leave one operation per window, so the merges' replays of many operations are only
        // exercised when steps go unchecked for a while.
        let n = steps.len();
        for (k, s) in steps.into_iter().enumerate() {
            match s {
                Step::Alloc { size, stream } => {
                    let st = StreamId(stream as u64 * 7 + 1);
                    let a = one.malloc(size, st);
                    let b = many.malloc(size, st);
                    prop_assert_eq!(a.is_ok(), b.is_ok(), "{:?} vs {:?}", a, b);
                    if let (Ok(a), Ok(b)) = (a, b) {
                        prop_assert_eq!(a, b);
                        if a != 0 { live.push((a, st)); }
                    }
                }
                Step::Free { pick } => {
                    if !live.is_empty() {
                        let (p, st) = live.swap_remove(pick % live.len());
                        one.free(p).unwrap();
                        many.free(p, st).unwrap();
                    }
                }
                Step::EmptyCache => { one.empty_cache().unwrap(); many.empty_cache().unwrap(); }
                Step::ResetPeaks => { one.reset_peak_memory_stats(); many.reset_peak_memory_stats(); }
            }
            if (k + 1) % check_every == 0 || k + 1 == n {
                prop_assert_eq!(one.memory_stats(), many.memory_stats());
                many.check_invariants().map_err(TestCaseError::fail)?;
            }
        }
    }
}

/// A merge replays only the series that may have passed their peak. Here the small pool's
/// allocated bytes do (0.5 → 1 MiB) while the device total cannot (it first falls by 4 MiB):
/// the total must still be the small plus the large pool's value at each moment, not the
/// large pool's value from the start of the window (which would give a false peak of 5 MiB).
#[test]
fn a_replay_of_some_series_keeps_the_totals_exact() {
    const K: u64 = 512 << 10;
    // The scenario, on either allocator; `close` reads the stats (closing a log window).
    fn scenario(malloc: &dyn Fn(u64, StreamId) -> u64, free: &dyn Fn(u64, StreamId), close: &dyn Fn()) {
        const K: u64 = 512 << 10;
        let (a, b) = (StreamId(1), StreamId(2));
        free(malloc(512, a), a); // a second shard in use: logging on
        let large = malloc(8 * K, b); // 4 MiB, large pool
        free(malloc(K, b), b); // small pool's peak 0.5 MiB; the total's 4.5 MiB
        close();
        // One window: the large block goes, then 1 MiB of small blocks come.
        free(large, b);
        malloc(K, b);
        malloc(K, b);
    }
    let one = CachingAllocator::with_policy(sim(8 << 30), AllocatorConfig::default(), "pytorch").unwrap();
    let many = ShardedAllocator::new(sim(8 << 30), AllocatorConfig::default(), "pytorch").unwrap();
    scenario(&|n, s| one.malloc(n, s).unwrap(), &|p, _| one.free(p).unwrap(), &|| {});
    scenario(
        &|n, s| many.malloc(n, s).unwrap(),
        &|p, s| many.free(p, s).unwrap(),
        &|| {
            many.stats();
        },
    );
    let st = many.stats();
    assert_eq!(st.allocated_bytes.0[1].peak, 2 * K as i64, "small pool peak");
    assert_eq!(
        st.allocated_bytes.0[0].peak,
        9 * K as i64,
        "device total peak (4.5 MiB)"
    );
    assert_eq!(one.memory_stats(), many.memory_stats());
}

/// Thread A allocates and frees 64 MiB on its stream, then tells thread B, which allocates
/// 64 MiB on another stream and keeps it: at no time were both live, so the device-wide peak
/// is 64 MiB. (Merging the shards' logs shard by shard instead of in time order gives 128 MiB
/// when the persistent stream's shard comes first, so both shard orders are run.)
#[test]
fn peaks_follow_the_real_order_across_threads() {
    for persistent_first in [true, false] {
        let (transient, persistent) = (StreamId(1), StreamId(2));
        let many = Arc::new(ShardedAllocator::new(sim(8 << 30), AllocatorConfig::default(), "cudamem").unwrap());
        // Shards are handed out in the order streams are first seen.
        let order = if persistent_first {
            [persistent, transient]
        } else {
            [transient, persistent]
        };
        for s in order {
            assert_eq!(many.malloc(0, s).unwrap(), 0);
        }
        for round in 0..20 {
            let (tx, rx) = std::sync::mpsc::channel();
            let a = {
                let m = many.clone();
                std::thread::spawn(move || {
                    let p = m.malloc(64 << 20, transient).unwrap();
                    m.free(p, transient).unwrap();
                    tx.send(()).unwrap();
                })
            };
            let b = {
                let m = many.clone();
                std::thread::spawn(move || {
                    rx.recv().unwrap();
                    m.malloc(64 << 20, persistent).unwrap()
                })
            };
            a.join().unwrap();
            let kept = b.join().unwrap();
            let s = many.stats();
            assert_eq!(
                s.allocated_bytes.all().peak,
                64 << 20,
                "round {round}, persistent stream's shard first: {persistent_first}"
            );
            assert_eq!(s.allocation.all().peak, 1, "round {round}");
            assert_eq!(s.allocated_bytes.all().current, 64 << 20);
            many.free(kept, persistent).unwrap();
            many.reset_peak_memory_stats();
        }
    }
}

/// Stream 1's cached 160 MiB must be given back for stream 2's request on a 256 MiB device, as
/// the single engine's last resort does.
#[test]
fn out_of_memory_retry_releases_other_shards_caches() {
    let many = ShardedAllocator::new(sim(256 << 20), AllocatorConfig::default(), "pytorch").unwrap();
    let p = many.malloc(160 << 20, StreamId(1)).unwrap();
    many.free(p, StreamId(1)).unwrap();
    assert_eq!(many.stats().reserved_bytes.all().current, 160 << 20);
    let q = many
        .malloc(160 << 20, StreamId(2))
        .expect("the other stream's cache is released");
    let s = many.stats();
    assert_eq!(s.num_ooms, 0);
    assert_eq!(s.reserved_bytes.all().current, 160 << 20);
    assert_eq!(s.reserved_bytes.all().peak, 160 << 20);
    many.free(q, StreamId(2)).unwrap();
    // A request nothing can satisfy is one OOM, with the device's totals in the message.
    let r = many.malloc(300 << 20, StreamId(3)).unwrap_err();
    assert!(r.is_out_of_memory());
    assert_eq!(many.stats().num_ooms, 1);
    assert!(r.to_string().contains("Tried to allocate 300.00 MiB"), "{r}");
    many.check_invariants().unwrap();
}

/// A wrong stream at free time still frees the right block; an unknown address is an error
/// that names it, and changes nothing.
#[test]
fn free_with_a_wrong_stream_or_a_bad_address() {
    let many = ShardedAllocator::new(sim(8 << 30), AllocatorConfig::default(), "cudamem").unwrap();
    let p = many.malloc(1 << 20, StreamId(5)).unwrap();
    many.free(p, StreamId(9)).unwrap();
    assert_eq!(many.stats().allocated_bytes.all().current, 0);
    let e = many.free(p, StreamId(5)).unwrap_err();
    assert!(e.to_string().contains(&format!("{p:#x}")), "{e}");
    many.check_invariants().unwrap();
}

/// Eight threads on their own streams, random sizes, many merges of the logs: afterwards every
/// invariant holds, nothing is allocated, and the peaks are at least what one thread held.
#[test]
fn threads_on_their_own_streams() {
    let many = Arc::new(ShardedAllocator::new(sim(64 << 30), AllocatorConfig::default(), "cudamem").unwrap());
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let m = many.clone();
            let b = barrier.clone();
            std::thread::spawn(move || {
                b.wait();
                let stream = StreamId(100 + t as u64);
                let mut x = 0x9E37_79B9u64 ^ t as u64;
                let mut live = Vec::new();
                for i in 0..20_000u32 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if live.len() < 8 && (!x.is_multiple_of(3) || live.is_empty()) {
                        live.push(m.malloc(512 + x % (4 << 20), stream).unwrap());
                    } else {
                        let p = live.swap_remove((x as usize / 3) % live.len());
                        m.free(p, stream).unwrap();
                    }
                    if i.is_multiple_of(5000) {
                        let _ = m.stats(); // readers merge while others run
                    }
                }
                for p in live {
                    m.free(p, stream).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    many.check_invariants().unwrap();
    let s = many.stats();
    assert_eq!(s.allocated_bytes.all().current, 0);
    assert_eq!(s.allocation.all().current, 0);
    assert_eq!(s.allocation.all().allocated, s.allocation.all().freed);
    assert!(
        s.allocation.all().peak >= 8 && s.allocation.all().peak <= 64,
        "{:?}",
        s.allocation.all()
    );
    assert!(s.active_bytes.all().peak >= s.allocated_bytes.all().peak);
}

/// Eight threads in lock-step rounds: each allocates its size of the round, all wait, each
/// frees, all wait (then many small pairs). The device's true peak is the largest round's total, reached while all
/// waited — so a peak missed while shards ran unlogged under their ceilings reads low, and a
/// wrong order of logged operations reads high. Round totals rise and fall, and the thread
/// with the largest share changes, so shards pass their ceilings (and raise the alarm) many
/// times, while stats are read (settling the shards again) only now and then.
#[test]
fn lock_step_rounds_give_the_exact_peak() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 300;
    const PAIRS: usize = 200;
    // Size of thread t in round r: multiples of 512 (no rounding); even threads in the small
    // pool, odd ones in the large. Every thread's part of a round's total stays well below the
    // total: a new peak is made by all together, not by one shard alone above it.
    let size = |r: usize, t: usize| -> u64 {
        let mut x = (r as u64 * 31 + t as u64 * 7 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 29;
        let pool = if t % 2 == 1 { 1 << 20 } else { 0 };
        // A slow rise over the rounds (new peaks keep coming), led by a different thread each.
        pool + 512 * (1 + x % 64) + 2048 * (r as u64 % 97) * (1 + (t == r % THREADS) as u64)
    };
    let many = Arc::new(ShardedAllocator::new(sim(64 << 30), AllocatorConfig::default(), "pytorch").unwrap());
    let barrier = Arc::new(Barrier::new(THREADS));
    let hs: Vec<_> = (0..THREADS)
        .map(|t| {
            let (m, b) = (many.clone(), barrier.clone());
            std::thread::spawn(move || {
                let stream = StreamId(10 + t as u64);
                // Thread 0 reads the peak now and then (settling the shards again): (round, peak).
                let mut seen = Vec::new();
                // Cache a segment per pool first, so that rounds rarely need new ones (reserved
                // bytes are always at their peak: a new segment passes a ceiling, and logs).
                let warm = [
                    m.malloc((1 << 20) - 512, stream).unwrap(),
                    m.malloc(16 << 20, stream).unwrap(),
                ];
                for p in warm {
                    m.free(p, stream).unwrap();
                }
                b.wait();
                if t == 0 {
                    m.reset_peak_memory_stats(); // the rounds' peaks only
                }
                b.wait();
                for r in 0..ROUNDS {
                    let p = m.malloc(size(r, t), stream).unwrap();
                    b.wait();
                    if t == 0 && r % 50 == 7 {
                        // At the round's total: no headroom to share.
                        seen.push((r, m.stats().allocated_bytes.all().peak));
                    }
                    b.wait();
                    m.free(p, stream).unwrap();
                    b.wait();
                    // With nothing else held, many small pairs (8 × 512 B at most at once, far
                    // below any round): they cannot move a peak, but while shards log they fill
                    // logs, so windows are cut and replayed by the replayer threads meanwhile.
                    for _ in 0..PAIRS {
                        m.free(m.malloc(512, stream).unwrap(), stream).unwrap();
                    }
                    if t == 0 && r % 50 == 32 {
                        // Nothing held: much headroom to share.
                        seen.push((r, m.stats().allocated_bytes.all().peak));
                    }
                    b.wait();
                }
                seen
            })
        })
        .collect();
    let seen: Vec<_> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let total = |r: usize| (0..THREADS).map(|t| size(r, t) as i64).sum::<i64>();
    for &(r, peak) in &seen {
        assert_eq!(peak, (0..=r).map(total).max().unwrap(), "peak read after round {r}");
    }
    let want = (0..ROUNDS).map(total).max().unwrap();
    let s = many.stats();
    assert_eq!(s.allocated_bytes.all().peak, want, "allocated bytes peak");
    assert_eq!(s.requested_bytes.all().peak, want, "requested bytes peak");
    assert_eq!(s.allocation.all().peak, THREADS as i64, "allocations peak");
    assert_eq!(s.allocated_bytes.all().current, 0);
    many.check_invariants().unwrap();
    let (merges, replays) = many.merge_counts();
    assert!(replays > 0, "the rising totals were replayed ({merges} merges)");
    assert!(merges > 20, "logs filled and windows were cut: {merges} merges");
}
