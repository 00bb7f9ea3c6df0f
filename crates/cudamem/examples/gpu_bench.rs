//! What a cache hit costs, against the driver, and how the allocator scales over threads.
//!
//! ```text
//! gpu_bench [--device cuda:0|sim|auto] [--iters N] [--duration-ms MS] [--rounds R]
//! ```
//!
//! 1. **Latency** of one allocation + free pair, for 512 B, 64 KiB, 1 MiB, 16 MiB and 64 MiB:
//!    * cudamem, cache hits (`Allocator::alloc` + drop of the `Buffer`, after a warm-up that
//!      put a block of that size in the cache), timed in batches of 64 pairs: the figure is
//!      the median batch's time per pair (the clock is read once per batch, so its own cost
//!      does not swamp a ~100 ns pair);
//!    * `cuMemAlloc` + `cuMemFree`, each pair timed on its own, median;
//!    * `cuMemAllocAsync` + `cuMemFreeAsync` on one non-blocking stream, from the device's
//!      default memory pool with its release threshold raised to `u64::MAX` (freed memory stays
//!      in the pool, the driver's own caching), each pair timed on its own, median.
//! 2. **Throughput** over threads: T = 1, 2, 4, 8 threads share one allocator; each allocates
//!    and frees on its own stream, mixed sizes (512 B to 16 MiB, up to four live at once), all
//!    cache hits after a warm-up, for a fixed time (`--duration-ms`, default 500). Reported:
//!    alloc+free pairs per second, all threads together, and the ratio to one thread — once
//!    with the default allocator (one mutex per device, as in PyTorch), once with
//!    `sharded:True` (one engine and mutex per group of streams, `cudamem_sharded`), whose
//!    cache-hit pair latency is also shown. The 1, 2, 4, 8 sequence is measured `--rounds`
//!    times (default 5): pairs/s is the median of the rounds, the ratio to one thread the
//!    median of each round's ratio (8 threads ÷ 1 thread of the same round, seconds apart),
//!    with the rounds' range. The GPU machine
//!    switches between two speeds about 1.5× apart within seconds, so one measurement of each
//!    thread count compared two moments as much as two thread counts.
//! 3. **Rounds.** Latency and throughput are measured in `--rounds` rounds: each round times
//!    the latency of every size (cudamem, then the driver beside it, then `sharded:True`), then
//!    the 1, 2, 4, 8 thread sequence of each throughput table. A latency cell is the median of
//!    the rounds' medians, with their range, and the ratios to the driver are the median of each
//!    round's own ratio (one measurement, in a window of a few milliseconds, would catch
//!    whichever speed the machine had then). From round 2 on, both
//!    allocators have seen the throughput threads' eight streams: the latency is that of an
//!    allocator with other streams' blocks cached, as in an application with several streams.
//!
//! Prints markdown tables (and the latency round by round), then one JSON line per figure.
//! Without a CUDA device (or with `--device sim`) the cudamem figures are measured on the
//! simulated device, which says so, and the driver columns are "n/a".

#![warn(clippy::undocumented_unsafe_blocks)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cudamem::cudarc::driver::sys::{self, CUmemPool_attribute, CUmemoryPool, CUstream};
use cudamem::{Allocator, Buffer, CudaDevice, Device, DeviceError, Stream};
use cudamem_cuda::{check, check_alloc};

const SIZES: [usize; 5] = [512, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
const BATCH: usize = 64;
const THREADS: [usize; 4] = [1, 2, 4, 8];

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The smallest and largest of `v`.
fn range(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Median and mean ns per cache-hit pair of `size` bytes.
fn cudamem_pairs(a: &Allocator, size: usize, iters: usize) -> Result<(f64, f64), cudamem::Error> {
    // Warm-up: the block is in the cache, the code and data are hot.
    for _ in 0..200 {
        drop(a.alloc(size, Stream::DEFAULT)?);
    }
    let batches = iters.div_ceil(BATCH).max(5);
    let mut per_pair = Vec::with_capacity(batches);
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..BATCH {
            let b = a.alloc(size, Stream::DEFAULT)?;
            std::hint::black_box(b.device_ptr());
            drop(b);
        }
        per_pair.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    let m = mean(&per_pair);
    Ok((median(per_pair), m))
}

/// Median ns per `cuMemAlloc` + `cuMemFree` pair (context current).
fn driver_sync_pairs(size: usize, iters: usize) -> Result<f64, DeviceError> {
    let mut ns = Vec::with_capacity(iters);
    for i in 0..10 + iters {
        let mut p: sys::CUdeviceptr = 0;
        let t = Instant::now();
        // SAFETY: the caller made the device's context current; `p` is a valid out-pointer; the
        // allocation is freed right away and never touched.
        unsafe {
            check_alloc(sys::cuMemAlloc_v2(&mut p, size), "cuMemAlloc", size as u64)?;
            check(sys::cuMemFree_v2(p), "cuMemFree")?;
        }
        if i >= 10 {
            ns.push(t.elapsed().as_nanos() as f64);
        }
    }
    Ok(median(ns))
}

/// Median ns per `cuMemAllocAsync` + `cuMemFreeAsync` pair on `stream` (context current).
fn driver_async_pairs(size: usize, iters: usize, stream: CUstream) -> Result<f64, DeviceError> {
    let mut ns = Vec::with_capacity(iters);
    for i in 0..10 + iters {
        let mut p: sys::CUdeviceptr = 0;
        let t = Instant::now();
        // SAFETY: as in `driver_sync_pairs`; both calls are ordered on the live `stream`.
        unsafe {
            check_alloc(
                sys::cuMemAllocAsync(&mut p, size, stream),
                "cuMemAllocAsync",
                size as u64,
            )?;
            check(sys::cuMemFreeAsync(p, stream), "cuMemFreeAsync")?;
        }
        if i >= 10 {
            ns.push(t.elapsed().as_nanos() as f64);
        }
    }
    // SAFETY: `stream` is a live stream of the current context.
    let r = unsafe { sys::cuStreamSynchronize(stream) };
    check(r, "cuStreamSynchronize")?;
    Ok(median(ns))
}

/// The driver's figures for every size: `(cuMemAlloc pair, cuMemAllocAsync pair)` medians.
fn driver_figures(d: &CudaDevice, stream: Stream, iters: usize) -> Result<Vec<(f64, f64)>, DeviceError> {
    let raw = stream.as_cu_stream();
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    let out = d.with_current(|| -> Result<Vec<(f64, f64)>, DeviceError> {
        let mut threshold: u64 = u64::MAX;
        // SAFETY: valid device and out-pointer; the attribute value is a u64 that outlives the
        // call.
        unsafe {
            check(
                sys::cuDeviceGetDefaultMemPool(&mut pool, d.cu_device()),
                "cuDeviceGetDefaultMemPool",
            )?;
            check(
                sys::cuMemPoolSetAttribute(
                    pool,
                    CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                ),
                "cuMemPoolSetAttribute",
            )?;
        }
        let mut v = Vec::new();
        for size in SIZES {
            v.push((driver_sync_pairs(size, iters)?, driver_async_pairs(size, iters, raw)?));
        }
        // SAFETY: `pool` is the device's default pool; trimming returns only idle memory.
        check(unsafe { sys::cuMemPoolTrimTo(pool, 0) }, "cuMemPoolTrimTo")?;
        Ok(v)
    })??;
    Ok(out)
}

/// Pairs per second of `threads` threads, each on its own stream, for `dur`; thread `t` uses
/// `allocs[t % allocs.len()]` (one shared allocator, or one each).
fn throughput(allocs: &[Allocator], streams: &[Stream], threads: usize, dur: Duration) -> f64 {
    const MIX: [usize; 8] = [512, 4 << 10, 64 << 10, 512 << 10, 1 << 20, 4 << 20, 16 << 20, 2 << 10];
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let a = allocs[t % allocs.len()].clone();
            let (stop, start, stream) = (stop.clone(), start.clone(), streams[t]);
            std::thread::spawn(move || {
                let mut live: Vec<Buffer> = Vec::with_capacity(4);
                // Warm-up: every size of the mix in this stream's cache.
                for _ in 0..4 {
                    let bufs: Vec<_> = MIX.iter().map(|&s| a.alloc(s, stream).unwrap()).collect();
                    drop(bufs);
                }
                start.wait();
                let mut pairs = 0u64;
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        live.push(a.alloc(MIX[i % MIX.len()], stream).unwrap());
                        if live.len() == 4 {
                            live.swap_remove(i % 4);
                        }
                        i = i.wrapping_mul(5).wrapping_add(1) % 1_000_003;
                        pairs += 1;
                    }
                }
                drop(live);
                pairs
            })
        })
        .collect();
    start.wait();
    let t = Instant::now();
    std::thread::sleep(dur);
    stop.store(true, Ordering::Relaxed);
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    total as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let mut device = "auto".to_string();
    let mut iters = 2000usize;
    let mut duration_ms = 500u64;
    let mut rounds = 5usize;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next();
        let ok = match flag.as_str() {
            "--device" => value.map(|v| device = v).is_some(),
            "--iters" => value.and_then(|v| v.parse().ok()).map(|v| iters = v).is_some(),
            "--duration-ms" => value
                .and_then(|v| v.parse().ok())
                .filter(|&v| v > 0)
                .map(|v| duration_ms = v)
                .is_some(),
            "--rounds" => value
                .and_then(|v| v.parse().ok())
                .filter(|&v| v > 0)
                .map(|v| rounds = v)
                .is_some(),
            _ => false,
        };
        if !ok {
            eprintln!(
                "usage: gpu_bench [--device cuda:0|sim|auto] [--iters N] [--duration-ms MS (1 or more)] [--rounds R (1 or more)]"
            );
            std::process::exit(2);
        }
    }
    let max_threads = *THREADS.iter().max().unwrap();
    let (a, b, own) = match (
        Allocator::new(&device),
        Allocator::with_config(&device, "sharded:True", ""),
        (0..max_threads)
            .map(|_| Allocator::new(&device))
            .collect::<Result<Vec<_>, _>>(),
    ) {
        (Ok(a), Ok(b), Ok(own)) => (a, b, own),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            eprintln!("gpu_bench: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = run(&a, &b, &own, iters, Duration::from_millis(duration_ms), rounds) {
        eprintln!("gpu_bench: {e}");
        std::process::exit(1);
    }
}

fn fmt_ns(x: Option<f64>) -> String {
    x.map_or("n/a".to_string(), |v| format!("{v:.0}"))
}

fn json_num(x: Option<f64>) -> String {
    x.map_or("null".to_string(), |v| format!("{v:.1}"))
}

/// `own`: one default allocator per thread, sharing nothing — the third throughput table, what
/// this machine's cores give this loop when nothing at all is shared (the ceiling for sharding).
fn run(
    a: &Allocator,
    sharded: &Allocator,
    own: &[Allocator],
    iters: usize,
    dur: Duration,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let dev = a.device_name();
    let (_, total) = a.mem_get_info()?;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("# gpu_bench on {dev}");
    if a.is_cuda() {
        let d = a.cuda_device().unwrap();
        println!(
            "device {dev}: {:.1} GiB, VMM granularity {} B; {cpus} CPU(s); policy {}",
            total as f64 / (1u64 << 30) as f64,
            d.granularity(),
            a.policy_name()
        );
    } else {
        let why = cudamem_cuda::unavailable_reason().unwrap_or_else(|| "--device sim".into());
        println!(
            "NOTE: no CUDA device used ({why}); cudamem figures are on the SIMULATED device, \
             driver columns are n/a. {cpus} CPU(s)."
        );
    }

    // Every round measures the latency of every size (cudamem, then the driver beside it),
    // then the 1, 2, 4, 8 thread sequence of each throughput table. A round lasts seconds, so
    // the rounds sample the machine at different moments: its slow stretches last from under a
    // second to several seconds, and one 2 ms latency window saw whichever speed it happened on.
    let shared = [a.clone()];
    let sharded_one = [sharded.clone()];
    let tables: [(&str, &[Allocator]); 3] = [
        ("one allocator lock (default)", &shared[..]),
        ("sharded:True", &sharded_one[..]),
        (
            "one default allocator per thread (nothing shared: the machine's ceiling)",
            own,
        ),
    ];
    let mut table_streams = Vec::new();
    for (_, allocs) in &tables {
        let streams: Vec<Stream> = (0..*THREADS.iter().max().unwrap())
            .map(|t| allocs[t % allocs.len()].create_stream())
            .collect::<Result<_, _>>()?;
        table_streams.push(streams);
    }
    let drv_stream = match a.cuda_device() {
        Some(_) => Some(a.create_stream()?),
        None => None,
    };
    let drv_iters = (iters / 10).clamp(50, 500);
    // ours[r][i], ours_sharded[r][i]: (median, mean) ns per pair of SIZES[i] in round r;
    // drv[r][i]: the driver's (cuMemAlloc, cuMemAllocAsync) pairs beside them.
    let mut ours: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut ours_sharded: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut drv: Vec<Vec<(Option<f64>, Option<f64>)>> = Vec::new();
    // by_round[k][r][i]: pairs/s of THREADS[i] threads in round r of table k.
    let mut by_round: Vec<Vec<Vec<f64>>> = vec![Vec::new(); tables.len()];
    for _ in 0..rounds {
        ours.push(
            SIZES
                .iter()
                .map(|&s| cudamem_pairs(a, s, iters))
                .collect::<Result<_, _>>()?,
        );
        drv.push(match (a.cuda_device(), drv_stream) {
            (Some(d), Some(s)) => driver_figures(d, s, drv_iters)?
                .into_iter()
                .map(|(x, y)| (Some(x), Some(y)))
                .collect(),
            _ => vec![(None, None); SIZES.len()],
        });
        ours_sharded.push(
            SIZES
                .iter()
                .map(|&s| cudamem_pairs(sharded, s, iters))
                .collect::<Result<_, _>>()?,
        );
        for (k, (_, allocs)) in tables.iter().enumerate() {
            by_round[k].push(
                THREADS
                    .iter()
                    .map(|&t| throughput(allocs, &table_streams[k], t, dur))
                    .collect(),
            );
        }
    }
    // The median over rounds of column i, and the rounds' range.
    let over_rounds = |v: &[Vec<(f64, f64)>], i: usize| -> (f64, f64, f64, f64) {
        let meds: Vec<f64> = v.iter().map(|r| r[i].0).collect();
        let (lo, hi) = range(&meds);
        let mean = mean(&v.iter().map(|r| r[i].1).collect::<Vec<_>>());
        (median(meds), lo, hi, mean)
    };
    let drv_median = |i: usize, async_: bool| -> Option<f64> {
        let v: Option<Vec<f64>> = drv.iter().map(|r| if async_ { r[i].1 } else { r[i].0 }).collect();
        v.map(median)
    };

    println!();
    println!(
        "## alloc+free pair latency, ns (median; cudamem: cache hits, batches of {BATCH}; each cell the median of {rounds} rounds)"
    );
    println!();
    println!(
        "| size | cudamem ({dev}) | cudamem, rounds' range | cuMemAlloc+cuMemFree | cuMemAllocAsync+cuMemFreeAsync (pool, threshold max) | cuMemAlloc / cudamem | cuMemAllocAsync / cudamem |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut json = Vec::new();
    for (i, size) in SIZES.iter().enumerate() {
        let (med, lo, hi, mean_ns) = over_rounds(&ours, i);
        let (sync, asy) = (drv_median(i, false), drv_median(i, true));
        // The median of each round's own ratio: within a round the driver is measured a
        // fraction of a second after cudamem, as a rule in the same state of the machine.
        let ratio = |async_: bool| -> String {
            let v: Option<Vec<f64>> = drv
                .iter()
                .zip(&ours)
                .map(|(d, o)| (if async_ { d[i].1 } else { d[i].0 }).map(|x| x / o[i].0))
                .collect();
            v.map_or("n/a".to_string(), |v| format!("{:.0}x", median(v)))
        };
        println!(
            "| {} | {med:.0} | {lo:.0}–{hi:.0} | {} | {} | {} | {} |",
            human(*size),
            fmt_ns(sync),
            fmt_ns(asy),
            ratio(false),
            ratio(true)
        );
        let rounds_ns: Vec<String> = ours.iter().map(|r| format!("{:.1}", r[i].0)).collect();
        json.push(format!(
            "{{\"bench\":\"gpu_bench\",\"figure\":\"pair_latency_ns\",\"device\":\"{dev}\",\"size\":{size},\
             \"cudamem_median_ns\":{med:.1},\"cudamem_mean_ns\":{mean_ns:.1},\"cudamem_rounds_ns\":[{}],\
             \"cuMemAlloc_cuMemFree_median_ns\":{},\"cuMemAllocAsync_cuMemFreeAsync_median_ns\":{},\"rounds\":{rounds}}}",
            rounds_ns.join(","),
            json_num(sync),
            json_num(asy)
        ));
    }
    println!();
    println!("rounds: cudamem ns / cuMemAllocAsync+cuMemFreeAsync ns per pair, round by round");
    println!();
    println!(
        "| size | {} |",
        (1..=rounds)
            .map(|r| format!("round {r}"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---|".repeat(rounds));
    for (i, size) in SIZES.iter().enumerate() {
        let cells: Vec<String> = ours
            .iter()
            .zip(&drv)
            .map(|(o, d)| format!("{:.0} / {}", o[i].0, fmt_ns(d[i].1)))
            .collect();
        println!("| {} | {} |", human(*size), cells.join(" | "));
    }

    // Throughput over threads, one mutex per device, then sharded, then one allocator each.
    let mut base_one = f64::NAN;
    for (k, (label, allocs)) in tables.iter().enumerate() {
        let al = &allocs[0];
        let independent = allocs.len() > 1;
        if al.is_sharded() {
            println!();
            println!(
                "## alloc+free pair latency with sharded:True, ns (median, cache hits, one thread; each cell the median of {rounds} rounds)"
            );
            println!();
            println!("| size | sharded:True | sharded:True, rounds' range | default |");
            println!("|---:|---:|---:|---:|");
            for (i, size) in SIZES.iter().enumerate() {
                let (med, lo, hi, _) = over_rounds(&ours_sharded, i);
                println!(
                    "| {} | {med:.0} | {lo:.0}–{hi:.0} | {:.0} |",
                    human(*size),
                    over_rounds(&ours, i).0
                );
                json.push(format!(
                    "{{\"bench\":\"gpu_bench\",\"figure\":\"pair_latency_ns_sharded\",\"device\":\"{dev}\",\
                     \"size\":{size},\"cudamem_median_ns\":{med:.1},\"rounds\":{rounds}}}"
                ));
            }
        }
        let rows: Vec<(usize, f64, Vec<f64>)> = THREADS
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                let ops: Vec<f64> = by_round[k].iter().map(|r| r[i]).collect();
                let ratios = by_round[k].iter().map(|r| r[i] / r[0]).collect();
                (t, median(ops), ratios)
            })
            .collect();
        let base = rows[0].1;
        if !al.is_sharded() && !independent {
            base_one = base;
        }
        println!();
        println!(
            "## throughput, {label}: threads on their own streams, mixed sizes, cache hits, {} ms each, {rounds} rounds",
            dur.as_millis()
        );
        println!();
        println!(
            "| threads | alloc+free pairs/s (all threads, median of rounds) | ratio to 1 thread (median of rounds' ratios) | rounds' ratios, range | ratio to 1 thread, default allocator |"
        );
        println!("|---:|---:|---:|---:|---:|");
        for (t, ops, ratios) in &rows {
            let (t, ops) = (*t, *ops);
            let (lo, hi) = range(ratios);
            let ratio = median(ratios.clone());
            println!(
                "| {t} | {ops:.0} | {ratio:.2} | {lo:.2}–{hi:.2} | {:.2} |",
                ops / base_one
            );
            json.push(format!(
                "{{\"bench\":\"gpu_bench\",\"figure\":\"throughput_pairs_per_s\",\"device\":\"{dev}\",\
                 \"sharded\":{},\"independent\":{independent},\"threads\":{t},\"pairs_per_s\":{ops:.0},\"ratio_to_1_thread\":{ratio:.3},\"duration_ms\":{},\"rounds\":{rounds}}}",
                al.is_sharded(),
                dur.as_millis()
            ));
        }
        if let Some(sh) = al.sharded_allocator() {
            let (merges, replays) = sh.merge_counts();
            println!();
            println!(
                "sharded: stats clock {} ({:.1} ns a read); {merges} merges of the stat logs, {replays} of them replaying operations one by one ({:.1} ms replaying in all); {} operations logged in all",
                cudamem::ShardedAllocator::clock_kind(),
                cudamem::ShardedAllocator::clock_cost_ns(),
                sh.replay_time_ns() as f64 / 1e6,
                sh.logged_operations()
            );
        }
        for al in allocs.iter() {
            al.check_invariants()?;
            let st = al.stats();
            if st.allocated_bytes.all().current != 0 {
                return Err(format!(
                    "{label}: {} bytes still allocated after the threads",
                    st.allocated_bytes.all().current
                )
                .into());
            }
        }
    }
    a.check_invariants()?;
    println!();
    for line in json {
        println!("{line}");
    }
    Ok(())
}

fn human(b: usize) -> String {
    match b {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
