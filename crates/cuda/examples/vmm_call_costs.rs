//! What each virtual-memory driver call costs on its own, the figures a mapping policy is chosen
//! by: `cuMemCreate` (with no shareable handle, and exportable as a POSIX descriptor as cudamem
//! and PyTorch's expandable segments request), `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`,
//! `cuMemRelease`, against `cuMemAlloc`+`cuMemFree` of the same size; then a growth of 256 MiB
//! made of 16 MiB allocations with one `cuMemSetAccess` per allocation against one for the
//! whole range (access may be set on a range spanning several mappings).
//!
//! ```text
//! vmm_call_costs [--iters N] [--device ORDINAL]
//! ```
//!
//! Prints median microseconds per call (each call timed on its own) as a table, then one JSON
//! line per row. Without a CUDA device it says it cannot run and exits 0.

#![warn(clippy::undocumented_unsafe_blocks)]

use std::ptr;
use std::time::Instant;

use cudamem_cuda::cudarc::driver::sys::{
    self, CUmemAccessDesc, CUmemAccess_flags, CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType,
    CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType,
};
use cudamem_cuda::{check, check_alloc, CudaDevice, Device, DeviceError};

const SIZES: [u64; 4] = [2 << 20, 16 << 20, 256 << 20, 2 << 30];

fn median_us(mut ns: Vec<u64>) -> f64 {
    ns.sort_unstable();
    ns.get(ns.len() / 2).copied().unwrap_or(0) as f64 / 1e3
}

fn prop(ordinal: i32, exportable: bool) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: if exportable {
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        } else {
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        },
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        win32HandleMetaData: ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

fn access(ordinal: i32) -> CUmemAccessDesc {
    CUmemAccessDesc {
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

/// Per-call timings of one size: create, map, set access, unmap, release (context current,
/// `va` a reservation of at least `size` bytes with nothing mapped).
fn vmm_calls(ordinal: i32, va: u64, size: u64, exportable: bool, iters: usize) -> Result<[f64; 5], DeviceError> {
    let mut t: [Vec<u64>; 5] = Default::default();
    let p = prop(ordinal, exportable);
    let a = access(ordinal);
    for _ in 0..iters {
        let mut h: CUmemGenericAllocationHandle = 0;
        let s = Instant::now();
        // SAFETY: the context is current; `p` is a valid property struct and `size` a multiple
        // of the granularity (every size here is a multiple of 2 MiB); flags must be 0.
        let r = unsafe { sys::cuMemCreate(&mut h, size as usize, &p, 0) };
        check_alloc(r, "cuMemCreate", size)?;
        t[0].push(s.elapsed().as_nanos() as u64);
        let s = Instant::now();
        // SAFETY: `[va, +size)` lies in a reservation of ours with nothing mapped; `h` holds
        // exactly `size` bytes, mapped from offset 0.
        check(unsafe { sys::cuMemMap(va, size as usize, 0, h, 0) }, "cuMemMap")?;
        t[1].push(s.elapsed().as_nanos() as u64);
        let s = Instant::now();
        // SAFETY: `[va, +size)` is exactly the mapping just made; one valid descriptor.
        let r = unsafe { sys::cuMemSetAccess(va, size as usize, &a, 1) };
        check(r, "cuMemSetAccess")?;
        t[2].push(s.elapsed().as_nanos() as u64);
        let s = Instant::now();
        // SAFETY: `[va, +size)` is one whole mapping of ours, never used by any work.
        check(unsafe { sys::cuMemUnmap(va, size as usize) }, "cuMemUnmap")?;
        t[3].push(s.elapsed().as_nanos() as u64);
        let s = Instant::now();
        // SAFETY: `h` was created above and is no longer mapped.
        check(unsafe { sys::cuMemRelease(h) }, "cuMemRelease")?;
        t[4].push(s.elapsed().as_nanos() as u64);
    }
    Ok(t.map(median_us))
}

/// `cuMemAlloc`, then `cuMemFree`, of `size` bytes, each timed (context current).
fn malloc_calls(size: u64, iters: usize) -> Result<[f64; 2], DeviceError> {
    let (mut a, mut f) = (Vec::new(), Vec::new());
    for _ in 0..iters {
        let mut p: sys::CUdeviceptr = 0;
        let s = Instant::now();
        // SAFETY: the context is current; `p` is a valid out-pointer.
        check_alloc(unsafe { sys::cuMemAlloc_v2(&mut p, size as usize) }, "cuMemAlloc", size)?;
        a.push(s.elapsed().as_nanos() as u64);
        let s = Instant::now();
        // SAFETY: `p` was allocated just above and never used.
        check(unsafe { sys::cuMemFree_v2(p) }, "cuMemFree")?;
        f.push(s.elapsed().as_nanos() as u64);
    }
    Ok([median_us(a), median_us(f)])
}

/// A growth of `n` allocations of `chunk` bytes at `va`: create+map each, then access set per
/// allocation (`one_access` false) or once over the range; returns the growth's microseconds
/// (median over `iters`), the unmap and release of it untimed.
fn growth(ordinal: i32, va: u64, chunk: u64, n: u64, one_access: bool, iters: usize) -> Result<f64, DeviceError> {
    let p = prop(ordinal, true);
    let a = access(ordinal);
    let mut ns = Vec::new();
    for _ in 0..iters {
        let mut hs = Vec::new();
        let s = Instant::now();
        for i in 0..n {
            let mut h: CUmemGenericAllocationHandle = 0;
            let at = va + i * chunk;
            // SAFETY: as in `vmm_calls`, for `[at, +chunk)` inside the reservation at `va`.
            unsafe {
                check_alloc(sys::cuMemCreate(&mut h, chunk as usize, &p, 0), "cuMemCreate", chunk)?;
                check(sys::cuMemMap(at, chunk as usize, 0, h, 0), "cuMemMap")?;
                if !one_access {
                    check(sys::cuMemSetAccess(at, chunk as usize, &a, 1), "cuMemSetAccess")?;
                }
            }
            hs.push(h);
        }
        if one_access {
            // SAFETY: `[va, +n*chunk)` is covered by the `n` contiguous mappings just made.
            let r = unsafe { sys::cuMemSetAccess(va, (n * chunk) as usize, &a, 1) };
            check(r, "cuMemSetAccess")?;
        }
        ns.push(s.elapsed().as_nanos() as u64);
        for (i, h) in hs.into_iter().enumerate() {
            // SAFETY: each range is one whole mapping made above, unused; `h` is its handle.
            unsafe {
                check(sys::cuMemUnmap(va + i as u64 * chunk, chunk as usize), "cuMemUnmap")?;
                check(sys::cuMemRelease(h), "cuMemRelease")?;
            }
        }
    }
    Ok(median_us(ns))
}

fn run(dev: &CudaDevice, ordinal: i32, iters: usize) -> Result<(), DeviceError> {
    let va = dev.reserve(4 << 30)?;
    let mut json = Vec::new();
    dev.with_current(|| -> Result<(), DeviceError> {
        println!("median µs per call, {iters} calls each");
        println!("| size | handle | cuMemCreate | cuMemMap | cuMemSetAccess | cuMemUnmap | cuMemRelease | all five | cuMemAlloc | cuMemFree |");
        println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for size in SIZES {
            let [ma, mf] = malloc_calls(size, iters)?;
            for exportable in [false, true] {
                let c = vmm_calls(ordinal, va, size, exportable, iters)?;
                let handle = if exportable { "posix-fd" } else { "none" };
                println!(
                    "| {} MiB | {handle} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {ma:.1} | {mf:.1} |",
                    size >> 20,
                    c[0],
                    c[1],
                    c[2],
                    c[3],
                    c[4],
                    c.iter().sum::<f64>()
                );
                json.push(format!(
                    "{{\"size\":{size},\"handle\":\"{handle}\",\"create_us\":{:.2},\"map_us\":{:.2},\"set_access_us\":{:.2},\"unmap_us\":{:.2},\"release_us\":{:.2},\"cu_mem_alloc_us\":{ma:.2},\"cu_mem_free_us\":{mf:.2}}}",
                    c[0], c[1], c[2], c[3], c[4]
                ));
            }
        }
        println!();
        println!("a 256 MiB growth of sixteen 16 MiB allocations (posix-fd), median µs:");
        let per = growth(ordinal, va, 16 << 20, 16, false, iters)?;
        let one = growth(ordinal, va, 16 << 20, 16, true, iters)?;
        println!("| access set per allocation | access set once for the range |");
        println!("|---:|---:|");
        println!("| {per:.1} | {one:.1} |");
        json.push(format!("{{\"growth_256mib_of_16mib\":{{\"access_per_allocation_us\":{per:.2},\"access_once_us\":{one:.2}}}}}"));
        Ok(())
    })??;
    dev.release_reservation(va, 4 << 30)?;
    println!();
    for j in json {
        println!("{j}");
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: usize| -> usize {
        match args.iter().position(|a| a == name) {
            None => default,
            Some(i) => match args.get(i + 1).and_then(|v| v.parse().ok()) {
                Some(v) => v,
                None => {
                    eprintln!("vmm_call_costs: {name} needs a non-negative integer");
                    std::process::exit(2)
                }
            },
        }
    };
    let iters = flag("--iters", 30).max(1);
    let ordinal = flag("--device", 0) as i32;
    if !cudamem_cuda::is_available() {
        println!(
            "vmm_call_costs cannot run: no CUDA device ({})",
            cudamem_cuda::unavailable_reason().unwrap_or_default()
        );
        return;
    }
    let dev = match CudaDevice::new(ordinal) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("vmm_call_costs: cuda:{ordinal}: {e}");
            std::process::exit(1)
        }
    };
    if let Err(e) = run(&dev, ordinal, iters) {
        eprintln!("vmm_call_costs: {e}");
        std::process::exit(1);
    }
}
