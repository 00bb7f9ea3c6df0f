//! What one allocation costs the driver: times `cuMemAlloc`+`cuMemFree` pairs and
//! `cuMemAllocAsync`+`cuMemFreeAsync` pairs (the device's default memory pool with its release
//! threshold raised to `u64::MAX`, so freed memory stays in the pool, on one non-blocking
//! stream) for 512 B, 64 KiB, 1 MiB, 16 MiB and 64 MiB.
//!
//! ```text
//! driver_pairs [--iters N] [--device ORDINAL]
//! ```
//!
//! Prints a table of nanoseconds per pair, then one JSON line per size. Each pair is timed on
//! its own; "median" is the median pair, "mean" the mean. For the asynchronous pairs the time is
//! that of queueing them; "async mean+sync" also counts the final `cuStreamSynchronize`.
//! Without a CUDA device it says it cannot run and exits 0.

#![warn(clippy::undocumented_unsafe_blocks)]

use std::time::Instant;

use cudamem_cuda::cudarc::driver::sys::{self, CUmemPool_attribute, CUmemoryPool, CUstream};
use cudamem_cuda::{check, check_alloc, CudaDevice, Device, DeviceError};

const SIZES: [u64; 5] = [512, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
const WARMUP: usize = 10;

struct Stats {
    median_ns: f64,
    mean_ns: f64,
}

fn stats(mut ns: Vec<u64>) -> Stats {
    ns.sort_unstable();
    let n = ns.len().max(1);
    let median_ns = if ns.is_empty() { 0.0 } else { ns[ns.len() / 2] as f64 };
    Stats {
        median_ns,
        mean_ns: ns.iter().sum::<u64>() as f64 / n as f64,
    }
}

/// `iters` timed `cuMemAlloc`+`cuMemFree` pairs of `size` bytes (context current).
fn sync_pairs(size: u64, iters: usize) -> Result<Stats, DeviceError> {
    let mut ns = Vec::with_capacity(iters);
    for i in 0..WARMUP + iters {
        let mut p: sys::CUdeviceptr = 0;
        let t = Instant::now();
        // SAFETY: the caller made the device's context current; `p` is a valid out-pointer and
        // the allocation is freed right after, never touched.
        unsafe {
            check_alloc(sys::cuMemAlloc_v2(&mut p, size as usize), "cuMemAlloc", size)?;
            check(sys::cuMemFree_v2(p), "cuMemFree")?;
        }
        if i >= WARMUP {
            ns.push(t.elapsed().as_nanos() as u64);
        }
    }
    Ok(stats(ns))
}

/// `iters` timed `cuMemAllocAsync`+`cuMemFreeAsync` pairs on `stream`, and the mean per pair
/// including the final stream synchronisation (context current).
fn async_pairs(size: u64, iters: usize, stream: CUstream) -> Result<(Stats, f64), DeviceError> {
    let mut ns = Vec::with_capacity(iters);
    let mut start = Instant::now();
    for i in 0..WARMUP + iters {
        if i == WARMUP {
            // SAFETY: `stream` is a live stream of the current context.
            let r = unsafe { sys::cuStreamSynchronize(stream) };
            check(r, "cuStreamSynchronize")?;
            start = Instant::now();
        }
        let mut p: sys::CUdeviceptr = 0;
        let t = Instant::now();
        // SAFETY: as in `sync_pairs`; both calls are ordered on the live `stream`.
        unsafe {
            check_alloc(
                sys::cuMemAllocAsync(&mut p, size as usize, stream),
                "cuMemAllocAsync",
                size,
            )?;
            check(sys::cuMemFreeAsync(p, stream), "cuMemFreeAsync")?;
        }
        if i >= WARMUP {
            ns.push(t.elapsed().as_nanos() as u64);
        }
    }
    // SAFETY: as above.
    let r = unsafe { sys::cuStreamSynchronize(stream) };
    check(r, "cuStreamSynchronize")?;
    let with_sync = start.elapsed().as_nanos() as f64 / iters.max(1) as f64;
    Ok((stats(ns), with_sync))
}

fn run(d: &CudaDevice, iters: usize) -> Result<(), DeviceError> {
    let stream = d.create_stream(true)?;
    let raw_stream = stream.0 as CUstream;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    d.with_current(|| -> Result<(), DeviceError> {
        let mut threshold: u64 = u64::MAX;
        // SAFETY: valid device and out-pointer; the attribute takes a pointer to a u64 that lives
        // across the call.
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
        Ok(())
    })??;

    println!(
        "driver_pairs on {} ({} iterations per size after {WARMUP} warm-up pairs)",
        d.name(),
        iters
    );
    println!(
        "{:>10} | {:>14} {:>14} | {:>15} {:>16}",
        "size", "sync median ns", "sync mean ns", "async median ns", "async mean+sync"
    );
    let mut json = Vec::new();
    for size in SIZES {
        let (s, (a, a_sync)) = d.with_current(|| -> Result<_, DeviceError> {
            Ok((sync_pairs(size, iters)?, async_pairs(size, iters, raw_stream)?))
        })??;
        println!(
            "{size:>10} | {:>14.0} {:>14.0} | {:>15.0} {:>16.0}",
            s.median_ns, s.mean_ns, a.median_ns, a_sync
        );
        json.push(format!(
            "{{\"bench\":\"driver_pairs\",\"device\":\"{}\",\"size\":{size},\"iters\":{iters},\
             \"sync_median_ns\":{:.0},\"sync_mean_ns\":{:.0},\"async_median_ns\":{:.0},\
             \"async_mean_ns\":{:.0},\"async_mean_incl_sync_ns\":{:.0}}}",
            d.name(),
            s.median_ns,
            s.mean_ns,
            a.median_ns,
            a.mean_ns,
            a_sync
        ));
    }
    for line in json {
        println!("{line}");
    }

    d.with_current(|| {
        // SAFETY: `pool` is the device's default pool; trimming only returns idle memory.
        check(unsafe { sys::cuMemPoolTrimTo(pool, 0) }, "cuMemPoolTrimTo")
    })??;
    // SAFETY: the stream was created above, is idle (synchronised) and not used afterwards.
    unsafe { d.destroy_stream(stream) }?;
    Ok(())
}

fn main() {
    let mut iters = 200usize;
    let mut ordinal = 0i32;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = args.next();
        let parsed = match a.as_str() {
            "--iters" => value.and_then(|v| v.parse().ok()).map(|v| iters = v),
            "--device" => value.and_then(|v| v.parse().ok()).map(|v| ordinal = v),
            _ => None,
        };
        if parsed.is_none() {
            eprintln!("usage: driver_pairs [--iters N] [--device ORDINAL]");
            std::process::exit(2);
        }
    }
    let d = match CudaDevice::new(ordinal) {
        Ok(d) => d,
        Err(e) => {
            println!("driver_pairs: cannot run: no CUDA device ({e})");
            return;
        }
    };
    if let Err(e) = run(&d, iters) {
        eprintln!("driver_pairs: {e}");
        std::process::exit(1);
    }
}
