//! What slows the GPU machine down: the allocator's own figures beside four probes of the core,
//! sampled together many times, so that the probes that move with the allocator name the
//! resource it loses in the slow state.
//!
//! Usage: `slow_state [SECONDS] [TRACE]` (default 20 s, tests/data/gpt2_train.pickle.gz). Runs on
//! any machine (simulated device only; the allocator's operations never reach the device when
//! the cache is warm, so this is the CPU side of `gpu_bench` and `replay_gpu`).
//!
//! A sample is, back to back (about 5 ms):
//! * `pair ns`: 20,000 cache-hit alloc+free pairs of mixed sizes through one engine;
//! * `replay ns/op`: one warm pass of TRACE (`pytorch` policy);
//! * `clock GHz`: a chain of dependent `imul` (latency-bound: the core's clock);
//! * `ALU adds/ns`: eight independent chains of `add` (throughput-bound: the issue slots the core
//!   gives this thread, which a busy sibling hyperthread on the host takes a share of);
//! * `L1 ns/load`, `L2 ns/load`: a random pointer chase through 16 KiB and 512 KiB (latency of a
//!   cache the host may share with other tenants' threads).
//!
//! The samples are split by the pair figure into its fastest and slowest thirds; for every
//! column the median of each third and their ratio are printed, then the rank correlation
//! (Spearman) of each probe with the pair and replay figures. A probe whose ratio matches the
//! allocator's names the contended resource; one that stays at 1.00 is ruled out.

#[path = "common/clock.rs"]
mod clock;

use std::time::Instant;

use cudamem_replay::{effective_config, free_leftovers, new_allocator, run_once, Program, ReplayOptions};

const COLUMNS: [&str; 6] = [
    "pair ns",
    "replay ns/op",
    "clock GHz",
    "ALU adds/ns",
    "L1 ns/load",
    "L2 ns/load",
];

fn main() {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().map_or(20.0, |s| s.parse().expect("SECONDS: a number"));
    let path = args.next().unwrap_or_else(|| "tests/data/gpt2_train.pickle.gz".into());

    let trace = cudamem_trace::read_path(std::path::Path::new(&path)).expect("trace loads");
    let p = Program::compile(&trace.devices[0]);
    let opts = ReplayOptions {
        policy: "pytorch".into(),
        ..ReplayOptions::default()
    };
    let cfg = effective_config(&trace, &opts).expect("trace settings");
    let (target, replay_alloc) = new_allocator(&p, &cfg, &opts, true).expect("allocator");
    let mut slots = vec![0u64; p.slots as usize];

    let pair_alloc = cudamem_alloc::CachingAllocator::with_policy(
        std::sync::Arc::new(cudamem_device::sim::SimDevice::default()),
        cudamem_alloc::AllocatorConfig::default(),
        "cudamem",
    )
    .expect("allocator");

    let l1 = Chase::new(16 << 10, 1);
    let l2 = Chase::new(512 << 10, 2);

    // Warm everything once.
    pair_ns(&pair_alloc);
    {
        let mut e = replay_alloc.lock();
        run_once(&p, &mut e, &target, &mut slots, false);
    }

    let mut samples: Vec<[f64; 6]> = Vec::new();
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        let pair = pair_ns(&pair_alloc);
        let replay = {
            let mut e = replay_alloc.lock();
            free_leftovers(&mut e, &target, &mut slots);
            run_once(&p, &mut e, &target, &mut slots, false).0 as f64 / p.trace_ops as f64
        };
        samples.push([
            pair,
            replay,
            clock::clock_ghz(20),
            alu_adds_per_ns(),
            l1.ns_per_load(),
            l2.ns_per_load(),
        ]);
    }

    println!(
        "slow_state: {} samples in {seconds} s, trace {} ({} ops)",
        samples.len(),
        path,
        p.trace_ops
    );
    let mut by_pair: Vec<usize> = (0..samples.len()).collect();
    by_pair.sort_by(|&a, &b| samples[a][0].total_cmp(&samples[b][0]));
    let third = samples.len() / 3;
    let (fast, slow) = (&by_pair[..third], &by_pair[samples.len() - third..]);
    println!("| column | all, median | fastest third of pairs | slowest third | slow / fast |");
    println!("|---|---|---|---|---|");
    for (c, name) in COLUMNS.iter().enumerate() {
        let col = |ix: &[usize]| median(ix.iter().map(|&i| samples[i][c]).collect());
        let (f, s) = (col(fast), col(slow));
        let all = median(samples.iter().map(|x| x[c]).collect());
        println!("| {name} | {all:.2} | {f:.2} | {s:.2} | {:.2} |", s / f);
    }
    println!();
    println!("| probe | rank correlation with pair ns | with replay ns/op |");
    println!("|---|---|---|");
    let ranks: Vec<Vec<f64>> = (0..COLUMNS.len())
        .map(|c| rank(&samples.iter().map(|x| x[c]).collect::<Vec<_>>()))
        .collect();
    for c in 1..COLUMNS.len() {
        println!(
            "| {} | {:+.2} | {:+.2} |",
            COLUMNS[c],
            pearson(&ranks[c], &ranks[0]),
            pearson(&ranks[c], &ranks[1])
        );
    }
}

/// ns per cache-hit alloc+free pair over 20,000 pairs of `gpu_bench`'s mixed sizes.
fn pair_ns(a: &cudamem_alloc::CachingAllocator) -> f64 {
    const SIZES: [u64; 8] = [512, 4 << 10, 64 << 10, 512 << 10, 1 << 20, 4 << 20, 16 << 20, 2 << 10];
    const N: usize = 20_000;
    let stream = cudamem_device::StreamId(0);
    let mut e = a.lock();
    let t = Instant::now();
    for i in 0..N {
        let p = e.malloc(SIZES[i % SIZES.len()], stream).expect("cache hit");
        e.free(std::hint::black_box(p)).expect("free");
    }
    t.elapsed().as_nanos() as f64 / N as f64
}

/// Independent `add`s per ns: eight chains, so the core can issue as many per cycle as it has
/// integer ports for this thread.
#[cfg(target_arch = "x86_64")]
fn alu_adds_per_ns() -> f64 {
    const ROUNDS: u64 = 1 << 17; // 16 adds each
    let t = Instant::now();
    let (mut a, mut b, mut c, mut d) = (1u64, 2u64, 3u64, 4u64);
    let (mut e, mut f, mut g, mut h) = (5u64, 6u64, 7u64, 8u64);
    for _ in 0..ROUNDS {
        // SAFETY: register arithmetic only.
        unsafe {
            std::arch::asm!(
                "add {a}, 1", "add {b}, 1", "add {c}, 1", "add {d}, 1",
                "add {e}, 1", "add {f}, 1", "add {g}, 1", "add {h}, 1",
                "add {a}, 1", "add {b}, 1", "add {c}, 1", "add {d}, 1",
                "add {e}, 1", "add {f}, 1", "add {g}, 1", "add {h}, 1",
                a = inout(reg) a, b = inout(reg) b, c = inout(reg) c, d = inout(reg) d,
                e = inout(reg) e, f = inout(reg) f, g = inout(reg) g, h = inout(reg) h,
                options(nomem, nostack, pure),
            );
        }
    }
    std::hint::black_box((a, b, c, d, e, f, g, h));
    (16 * ROUNDS) as f64 / t.elapsed().as_nanos() as f64
}

#[cfg(not(target_arch = "x86_64"))]
fn alu_adds_per_ns() -> f64 {
    f64::NAN
}

/// A random cyclic walk through the cache lines of a buffer: each load's address is the last
/// load's value, so the loads cannot overlap and each costs the latency of the level that holds
/// the buffer.
struct Chase {
    next: Vec<usize>, // one entry per 64-byte line, indexed in units of 8 entries
}

impl Chase {
    fn new(bytes: usize, seed: u64) -> Chase {
        let lines = bytes / 64;
        // A random order of the lines (xorshift Fisher-Yates), linked into one cycle.
        let mut order: Vec<usize> = (0..lines).collect();
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for i in (1..lines).rev() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            order.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let mut next = vec![0usize; lines * 8];
        for k in 0..lines {
            next[order[k] * 8] = order[(k + 1) % lines] * 8;
        }
        Chase { next }
    }

    fn ns_per_load(&self) -> f64 {
        const LOADS: usize = 1 << 16;
        let mut i = 0usize;
        for _ in 0..self.next.len() / 8 {
            i = self.next[i]; // warm: the buffer into its cache level
        }
        let t = Instant::now();
        for _ in 0..LOADS {
            i = self.next[std::hint::black_box(i)];
        }
        std::hint::black_box(i);
        t.elapsed().as_nanos() as f64 / LOADS as f64
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Ranks (0-based, ties in input order): Spearman's correlation is Pearson's of the ranks.
fn rank(v: &[f64]) -> Vec<f64> {
    let mut ix: Vec<usize> = (0..v.len()).collect();
    ix.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut r = vec![0.0; v.len()];
    for (k, &i) in ix.iter().enumerate() {
        r[i] = k as f64;
    }
    r
}

fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    sxy / (sxx * syy).sqrt()
}
