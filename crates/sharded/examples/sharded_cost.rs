//! What the sharded allocator costs one thread: cache-hit alloc+free pairs of mixed sizes with
//! the single-lock allocator, the sharded one while one stream is all it has seen, and the
//! sharded one after a second stream (its shard bounded: checked against its ceilings, logged
//! only past them). Simulated device.
//! `cargo run --release -p cudamem-sharded --example sharded_cost` (`threads`: 1, 2, 4, 8 threads;
//! `paired ROUNDS`: 1 against 2 threads in alternated bursts, for machines whose speed drifts;
//! `mixed THREADS MS`: `gpu_bench`'s mixed loop, sharded, with the share of operations logged)

use std::sync::Arc;
use std::time::Instant;

use cudamem_alloc::{AllocatorConfig, CachingAllocator};
use cudamem_device::sim::SimDevice;
use cudamem_device::{Device, StreamId};
use cudamem_sharded::ShardedAllocator;

const MIX: [u64; 8] = [512, 4 << 10, 64 << 10, 512 << 10, 1 << 20, 4 << 20, 16 << 20, 2 << 10];
const PAIRS: usize = 400_000;

fn run(mut malloc: impl FnMut(u64) -> u64, mut free: impl FnMut(u64)) -> f64 {
    let mut live = Vec::with_capacity(4);
    for &s in &MIX {
        live.push(malloc(s));
    }
    for p in live.drain(..) {
        free(p);
    }
    let t = Instant::now();
    let mut i = 1usize;
    for _ in 0..PAIRS {
        live.push(malloc(MIX[i % MIX.len()]));
        if live.len() == 4 {
            free(live.swap_remove(i % 4));
        }
        i = i.wrapping_mul(5).wrapping_add(1) % 1_000_003;
    }
    let ns = t.elapsed().as_nanos() as f64 / PAIRS as f64;
    for p in live {
        free(p);
    }
    ns
}

fn main() {
    // `sharded_cost one|solo|two` runs only that case (for a profiler); no argument runs all.
    let only = std::env::args().nth(1);
    let dev = || -> Arc<dyn Device> { Arc::new(SimDevice::default()) };
    if only.as_deref() == Some("paired") {
        // `sharded_cost paired [ROUNDS]`: 1 vs 2 threads, alternated in short bursts.
        paired(std::env::args().nth(2).and_then(|r| r.parse().ok()).unwrap_or(40));
        return;
    }
    if only.as_deref() == Some("mixed") {
        // `sharded_cost mixed [THREADS] [MS] [RESET_MS]`: gpu_bench's mixed loop, sharded.
        let arg = |k: usize, d: u64| std::env::args().nth(k).and_then(|v| v.parse().ok()).unwrap_or(d);
        mixed(arg(2, 8) as usize, arg(3, 2000), arg(4, 0));
        return;
    }
    if only.as_deref() == Some("threads") {
        // `sharded_cost threads sharded`: the sharded allocator only (A/B runs).
        threads(std::env::args().nth(2).as_deref() == Some("sharded"));
        return;
    }
    if let Some(case) = only.as_deref() {
        let s = StreamId(7);
        match case {
            "one" => {
                let one = CachingAllocator::with_policy(dev(), AllocatorConfig::default(), "cudamem").unwrap();
                println!("{:.0}", run(|n| one.malloc(n, s).unwrap(), |p| one.free(p).unwrap()));
            }
            _ => {
                let sh = ShardedAllocator::new(dev(), AllocatorConfig::default(), "cudamem").unwrap();
                if case == "two" {
                    sh.free(sh.malloc(512, StreamId(8)).unwrap(), StreamId(8)).unwrap();
                }
                println!("{:.0}", run(|n| sh.malloc(n, s).unwrap(), |p| sh.free(p, s).unwrap()));
            }
        }
        return;
    }
    let one = CachingAllocator::with_policy(dev(), AllocatorConfig::default(), "cudamem").unwrap();
    let s = StreamId(7);
    let a = run(|n| one.malloc(n, s).unwrap(), |p| one.free(p).unwrap());
    let sh = ShardedAllocator::new(dev(), AllocatorConfig::default(), "cudamem").unwrap();
    let b = run(|n| sh.malloc(n, s).unwrap(), |p| sh.free(p, s).unwrap());
    sh.malloc(0, StreamId(8)).unwrap();
    sh.free(sh.malloc(512, StreamId(8)).unwrap(), StreamId(8)).unwrap(); // a second shard: shards bounded
    let c = run(|n| sh.malloc(n, s).unwrap(), |p| sh.free(p, s).unwrap());
    let (merges, replays) = sh.merge_counts();
    println!("ns per alloc+free pair (mixed sizes, cache hits, one thread):");
    println!("  single lock            {a:.0}");
    println!("  sharded, one stream    {b:.0}");
    println!(
        "  sharded, 2 streams     {c:.0}   ({merges} merges, {replays} replays; clock {} at {:.1} ns)",
        ShardedAllocator::clock_kind(),
        ShardedAllocator::clock_cost_ns()
    );
}

/// `sharded_cost threads`: 1, 2, 4 and 8 threads (as many as there are cores) on their own
/// streams, each doing cache-hit alloc+free pairs of 512 B–4 MiB with nothing else live (the
/// criterion `threads` group's loop), one lock vs sharded; pairs per second of all threads, and
/// the merges behind them; `sharded_only` skips the one-lock runs.
fn threads(sharded_only: bool) {
    const PER_THREAD: usize = 1_000_000;
    let dev = || -> Arc<dyn Device> { Arc::new(SimDevice::default()) };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for n in [1usize, 2, 4, 8].into_iter().filter(|&n| n == 1 || n <= cores) {
        for sharded in [false, true].into_iter().filter(|&s| s || !sharded_only) {
            let one = CachingAllocator::with_policy(dev(), AllocatorConfig::default(), "cudamem").unwrap();
            let sh = ShardedAllocator::new(dev(), AllocatorConfig::default(), "cudamem").unwrap();
            // Two streams seen, so that one thread logs as it would next to another.
            sh.free(sh.malloc(512, StreamId(99)).unwrap(), StreamId(99)).unwrap();
            let t = Instant::now();
            cudamem_sharded::workload::pairs_on_own_streams(&one, sharded.then_some(&sh), n, PER_THREAD);
            let rate = (n * PER_THREAD) as f64 / t.elapsed().as_secs_f64();
            let (merges, replays) = sh.merge_counts();
            println!(
                "{n} thread(s), {}: {:.2} M pairs/s{}",
                if sharded { "sharded" } else { "one lock" },
                rate / 1e6,
                if sharded {
                    format!(
                        " ({merges} merges, {replays} replaying, {:.1} ms replaying; {:.0}% of operations logged)",
                        sh.replay_time_ns() as f64 / 1e6,
                        100.0 * sh.logged_operations() as f64 / (2 * n * PER_THREAD) as f64
                    )
                } else {
                    String::new()
                }
            );
        }
    }
}

/// `sharded_cost paired ROUNDS`: on a machine whose speed drifts (a shared VM), compares 1 and 2
/// threads where they ran at the same time: each round runs bursts of 200,000 pairs per thread
/// (the `threads` loop) with one thread through the default one-lock allocator, one thread and
/// two threads through the sharded one, in an order that alternates between rounds; and reports,
/// per round, 2 threads sharded ÷ 1 thread of each allocator. Prints each round, then the
/// medians and how many rounds had 2 threads at least as fast.
fn paired(rounds: usize) {
    const BURST: usize = 200_000;
    let dev = || -> Arc<dyn Device> { Arc::new(SimDevice::default()) };
    let one = CachingAllocator::with_policy(dev(), AllocatorConfig::default(), "cudamem").unwrap();
    let sh = ShardedAllocator::new(dev(), AllocatorConfig::default(), "cudamem").unwrap();
    sh.free(sh.malloc(512, StreamId(99)).unwrap(), StreamId(99)).unwrap();
    let rate = |sharded: bool, n: usize| {
        let t = Instant::now();
        cudamem_sharded::workload::pairs_on_own_streams(&one, sharded.then_some(&sh), n, BURST);
        (n * BURST) as f64 / t.elapsed().as_secs_f64() / 1e6
    };
    // Warm both (segments made, shards bounded).
    rate(false, 1);
    rate(true, 2);
    println!("round  1 thread one lock  1 thread sharded  2 threads sharded  (M pairs/s)   2 sharded / 1 one-lock   2 sharded / 1 sharded");
    let (mut vs_one, mut vs_sh) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let (a, b, c) = if r % 2 == 0 {
            let a = rate(false, 1);
            let b = rate(true, 1);
            (a, b, rate(true, 2))
        } else {
            let c = rate(true, 2);
            let b = rate(true, 1);
            (rate(false, 1), b, c)
        };
        println!(
            "{r:>5}  {a:>17.2}  {b:>16.2}  {c:>17.2}  {:>38.2}  {:>22.2}",
            c / a,
            c / b
        );
        vs_one.push(c / a);
        vs_sh.push(c / b);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let at_least = |v: &[f64]| v.iter().filter(|&&x| x >= 1.0).count();
    let (n1, n2) = (at_least(&vs_one), at_least(&vs_sh));
    println!(
        "median 2 threads sharded / 1 thread one lock: {:.2} ({n1} of {rounds} rounds >= 1); / 1 thread sharded: {:.2} ({n2} of {rounds} >= 1)",
        median(&mut vs_one),
        median(&mut vs_sh)
    );
}

/// `sharded_cost mixed THREADS MS [RESET_MS]`: `THREADS` threads (any number: on a machine
/// with fewer cores they take turns, which drifts their phases apart as on a busy machine) on
/// their own streams run `gpu_bench`'s mixed loop through the sharded allocator for `MS` ms —
/// sizes of 512 B to 16 MiB, up to four live per thread, cache hits — and report pairs per
/// second of all threads, merges, and how many operations logged. With `RESET_MS`, the peaks
/// are reset that often (so the totals keep making new peaks: the worst case for logging).
fn mixed(threads: usize, ms: u64, reset_ms: u64) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dev: Arc<dyn Device> = Arc::new(SimDevice::default());
    let sh = ShardedAllocator::new(dev, AllocatorConfig::default(), "cudamem").unwrap();
    let stop = AtomicBool::new(false);
    let t = Instant::now();
    let pairs: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                let (sh, stop) = (&sh, &stop);
                s.spawn(move || {
                    let stream = StreamId(10 + k as u64);
                    let mut live: Vec<u64> = Vec::with_capacity(4);
                    for _ in 0..4 {
                        let warm: Vec<_> = MIX.iter().map(|&m| sh.malloc(m, stream).unwrap()).collect();
                        for p in warm {
                            sh.free(p, stream).unwrap();
                        }
                    }
                    let (mut i, mut pairs) = (k, 0u64);
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..64 {
                            live.push(sh.malloc(MIX[i % MIX.len()], stream).unwrap());
                            if live.len() == 4 {
                                sh.free(live.swap_remove(i % 4), stream).unwrap();
                            }
                            i = i.wrapping_mul(5).wrapping_add(1) % 1_000_003;
                            pairs += 1;
                        }
                    }
                    for p in live {
                        sh.free(p, stream).unwrap();
                    }
                    pairs
                })
            })
            .collect();
        if reset_ms == 0 {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        } else {
            while t.elapsed().as_millis() < ms as u128 {
                std::thread::sleep(std::time::Duration::from_millis(reset_ms));
                sh.reset_peak_memory_stats();
            }
        }
        stop.store(true, Ordering::Relaxed);
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let secs = t.elapsed().as_secs_f64();
    let (merges, replays) = sh.merge_counts();
    println!(
        "{threads} thread(s), mixed loop, sharded: {:.2} M pairs/s ({merges} merges, {replays} replaying; {:.0}% of operations logged)",
        pairs as f64 / secs / 1e6,
        100.0 * sh.logged_operations() as f64 / (2 * pairs).max(1) as f64
    );
}
