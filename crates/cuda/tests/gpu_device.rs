//! GPU tests of [`CudaDevice`]: they run on a machine with a CUDA device and skip elsewhere.
//!
//! Each test first opens `cuda:0`. Without a CUDA driver or device it prints
//! `SKIPPED: no CUDA device (<reason>)` to stderr and returns, so a run without a GPU passes and
//! says so. With `CUDAMEM_REQUIRE_GPU=1` in the environment a missing device fails the test
//! instead (the GPU run script sets it, so a broken GPU machine cannot pass silently).
//!
//! The tests compare `cuMemGetInfo` free memory before and after, so run them one at a time:
//! `--test-threads=1` (and `--nocapture` to see the figures they print).
//!
//! Memory-accounting checks that depend on the driver's bookkeeping are *soft*: a violation is
//! collected, the rest of the test still runs (and cleans up), and the test fails at its end
//! listing every violation with its numbers.

#![warn(clippy::undocumented_unsafe_blocks)]

use std::sync::Arc;
use std::time::Instant;

use cudamem_cuda::cudarc::driver::sys;
use cudamem_cuda::{check, device_count, CudaDevice, Device, DeviceError, DevicePtr, EventId, StreamId};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Slack allowed between a mapping's size and the change of free memory it causes: 2 MiB, or
/// `CUDAMEM_TEST_SLACK_MIB` MiB (the run script widens it under compute-sanitizer, whose own
/// device allocations move free memory).
fn slack() -> u64 {
    let mib = std::env::var("CUDAMEM_TEST_SLACK_MIB")
        .ok()
        .and_then(|v| v.parse().ok());
    mib.unwrap_or(2) * MIB
}

/// Opens `cuda:0`, or says why the test is skipped.
fn gpu() -> Option<CudaDevice> {
    match CudaDevice::new(0) {
        Ok(d) => Some(d),
        Err(e) => {
            let why = match &e {
                DeviceError::Unavailable(m) => m.clone(),
                other => other.to_string(),
            };
            if std::env::var_os("CUDAMEM_REQUIRE_GPU").is_some_and(|v| v != "0") {
                panic!("CUDAMEM_REQUIRE_GPU is set but no CUDA device could be opened: {why}");
            }
            eprintln!("SKIPPED: no CUDA device ({why})");
            None
        }
    }
}

/// Checks whose failure is reported at the end of the test, after cleanup.
#[derive(Default)]
struct Soft(Vec<String>);

impl Soft {
    fn check(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        eprintln!("  {} {what}", if ok { "ok:  " } else { "FAIL:" });
        if !ok {
            self.0.push(what);
        }
    }
    fn finish(self) {
        assert!(self.0.is_empty(), "soft checks failed:\n  {}", self.0.join("\n  "));
    }
}

fn free_bytes(d: &CudaDevice) -> u64 {
    d.mem_get_info().expect("cuMemGetInfo").0
}

fn near(a: u64, b: u64, slack: u64) -> bool {
    a.abs_diff(b) <= slack
}

fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 9) as u8 ^ seed)
        .collect()
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len());
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first mismatch at byte {i}: got {:#04x}, want {:#04x}",
            got[i], want[i]
        );
    }
}

fn write(d: &CudaDevice, ptr: DevicePtr, bytes: &[u8]) {
    // SAFETY: every caller passes memory it allocated or mapped on `d`, of at least this length,
    // with no work pending on it.
    unsafe { d.copy_to_device(ptr, bytes) }.expect("cuMemcpyHtoD");
}

fn read(d: &CudaDevice, ptr: DevicePtr, len: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    // SAFETY: as in `write`.
    unsafe { d.copy_from_device(&mut v, ptr) }.expect("cuMemcpyDtoH");
    v
}

fn memset(d: &CudaDevice, ptr: DevicePtr, value: u8, len: u64) {
    let set = || {
        // SAFETY: as in `write`; the context is current (inside `with_current`). cuMemsetD8 runs
        // on the legacy default stream, which orders it before the synchronous copies that follow.
        unsafe { sys::cuMemsetD8_v2(ptr, value, len as usize) }
    };
    let r = d.with_current(set).expect("context");
    check(r, "cuMemsetD8").expect("cuMemsetD8");
}

fn is_invalid(r: Result<impl std::fmt::Debug, DeviceError>) -> bool {
    matches!(r, Err(DeviceError::InvalidArgument(_)))
}

#[test]
fn device_identity_and_every_ordinal_opens() {
    let Some(d) = gpu() else { return };
    let n = device_count();
    assert!(n >= 1);
    let (free, total) = d.mem_get_info().unwrap();
    eprintln!(
        "{}: total_memory {} B (cuMemGetInfo total {total}, free {free}), granularity {} B, vmm {}, devices {n}",
        d.name(),
        d.total_memory(),
        d.granularity(),
        d.vmm_supported()
    );
    assert_eq!(d.name(), "cuda:0");
    assert_eq!(d.index(), 0);
    assert!(d.total_memory() > 0 && free <= total);
    assert!(d.vmm_supported(), "VMM is needed for expandable segments");
    assert!(d.granularity().is_power_of_two() && d.granularity() >= 64 << 10);
    drop(d);
    for i in 0..n {
        let di = CudaDevice::new(i).unwrap();
        assert_eq!((di.index(), di.name()), (i, format!("cuda:{i}")));
    }
    match CudaDevice::new(n) {
        Err(DeviceError::Unavailable(m)) => {
            eprintln!("cuda:{n} → Unavailable({m})");
            assert!(m.contains(&format!("cuda:{n}")), "{m}");
        }
        other => panic!("expected Unavailable for cuda:{n}, got {other:?}"),
    }
}

#[test]
fn malloc_returns_usable_memory_and_free_works() {
    let Some(d) = gpu() else { return };
    let sizes = [512u64, MIB, 64 * MIB + 3];
    for (k, &size) in sizes.iter().enumerate() {
        let p = d.malloc(size).unwrap();
        assert!(p != 0 && p % 256 == 0, "cuMemAlloc address {p:#x} is 256-byte aligned");
        let want = pattern(size, k as u8);
        write(&d, p, &want);
        assert_same(&read(&d, p, size), &want, "copy back after cuMemcpyHtoD");
        memset(&d, p, 0x5a, size);
        assert!(
            read(&d, p, size).iter().all(|&b| b == 0x5a),
            "cuMemsetD8 result read back"
        );
        assert!(is_invalid(d.free(p, size + 1)), "free with the wrong size is refused");
        assert!(is_invalid(d.free(p + 256, size)), "free of an inner address is refused");
        d.free(p, size).unwrap();
        assert!(
            is_invalid(d.free(p, size)),
            "double free is refused, not passed to the driver"
        );
        eprintln!("  malloc/write/read/free of {size} B at {p:#x}: ok");
    }
    assert!(is_invalid(d.malloc(0)));
    let c = d.counters();
    assert_eq!((c.mallocs, c.frees), (3, 3));
}

#[test]
fn huge_malloc_is_out_of_memory_and_the_device_keeps_working() {
    let Some(d) = gpu() else { return };
    let huge = 2 * d.total_memory();
    let t = Instant::now();
    match d.malloc(huge) {
        Err(e @ DeviceError::OutOfMemory { requested }) => {
            assert_eq!(requested, huge);
            assert!(e.is_out_of_memory());
            eprintln!("  malloc({huge}) → {e} in {:?}", t.elapsed());
        }
        other => panic!("expected OutOfMemory for {huge} bytes, got {other:?}"),
    }
    let p = d.malloc(MIB).unwrap();
    let want = pattern(MIB, 3);
    write(&d, p, &want);
    assert_same(&read(&d, p, MIB), &want, "memory after an OOM");
    d.free(p, MIB).unwrap();
    d.synchronize().unwrap();
    assert_eq!(d.counters().mallocs, 1, "the failed malloc is not counted");
}

#[test]
fn reserve_map_write_read_unmap_release() {
    let Some(d) = gpu() else { return };
    let mut soft = Soft::default();
    let slack = slack();
    let g = d.granularity();
    let res_size = 40 * g;
    let base = d.reserve(res_size).unwrap();
    assert_eq!(base % g, 0, "reservation is granularity-aligned");
    eprintln!("  granularity {g} B; reserved [{base:#x}, +{res_size})");

    // Map 32 pages in the middle of the reservation as one allocation: free memory drops by
    // their size.
    let pages = 32;
    let (ptr, size) = (base + 4 * g, pages * g);
    let free0 = free_bytes(&d);
    let t = Instant::now();
    d.map(ptr, size).unwrap();
    let map_time = t.elapsed();
    let free1 = free_bytes(&d);
    soft.check(
        near(free0 - free1.min(free0), size, slack),
        format!(
            "mapping {size} B lowered free memory by {} B (±{slack})",
            free0 as i64 - free1 as i64
        ),
    );
    eprintln!("  map of {pages} pages took {map_time:?}");
    assert_eq!(d.mapped_bytes(), size);

    // The whole range is readable and writable, across page boundaries.
    let want = pattern(size, 9);
    write(&d, ptr, &want);
    assert_same(&read(&d, ptr, size), &want, "mapped range read back");
    memset(&d, ptr + g - 100, 0xee, 200);
    let edge = read(&d, ptr + g - 200, 400);
    assert_same(
        &edge[..100],
        &want[(g - 200) as usize..(g - 100) as usize],
        "before the memset",
    );
    assert!(
        edge[100..300].iter().all(|&b| b == 0xee),
        "memset across a page boundary"
    );
    assert_same(
        &edge[300..],
        &want[(g + 100) as usize..(g + 200) as usize],
        "after the memset",
    );

    // Misuse is refused without reaching the driver, and changes nothing.
    assert!(is_invalid(d.map(ptr + g, g)), "mapping inside a mapping");
    assert!(is_invalid(d.map(ptr - g, 2 * g)), "mapping over the start of a mapping");
    assert!(is_invalid(d.map(base + res_size, g)), "mapping outside the reservation");
    assert!(is_invalid(d.map(ptr + 1, g)), "unaligned map");
    assert!(is_invalid(d.unmap(base, g)), "unmapping a page never mapped");
    assert!(is_invalid(d.unmap(ptr, size + g)), "unmapping past the mapping");
    assert!(
        is_invalid(d.unmap(ptr, size - g)),
        "unmapping the front of a mapping (it is one cuMemCreate allocation)"
    );
    assert!(
        is_invalid(d.unmap(ptr + g, size - g)),
        "unmapping the tail of a mapping"
    );
    assert!(
        is_invalid(d.release_reservation(base, res_size)),
        "releasing a reservation with a mapping"
    );
    assert!(
        is_invalid(d.release_reservation(base, res_size - g)),
        "releasing with the wrong size"
    );
    assert_eq!(d.mapped_bytes(), size);
    assert_eq!(d.mappings(), vec![(ptr, size)], "one map call, one mapping");

    d.unmap(ptr, size).unwrap();
    let free2 = free_bytes(&d);
    soft.check(
        near(free2, free0, slack),
        format!("after unmap free memory is back: {free2} vs {free0} before the map (±{slack})"),
    );

    // Several mappings side by side: [base, +g), [base+g, +2g), [base+3g, +g), [base+4g, +2g).
    // A run of whole mappings is unmapped with one call; half a mapping is refused; the
    // neighbours keep their contents; the hole can be mapped again as one mapping.
    let layout = [(0, 1), (1, 2), (3, 1), (4, 2)];
    for &(at, n) in &layout {
        d.map(base + at * g, n * g).unwrap();
    }
    let want6 = pattern(6 * g, 21);
    write(&d, base, &want6);
    assert_same(&read(&d, base, 6 * g), &want6, "data across four mappings");
    assert!(is_invalid(d.unmap(base + g, g)), "unmapping half of the 2-page mapping");
    assert!(
        is_invalid(d.unmap(base + 2 * g, 2 * g)),
        "a run starting inside a mapping"
    );
    assert!(is_invalid(d.unmap(base + g, 4 * g)), "a run ending inside a mapping");
    assert_eq!(d.mapped_bytes(), 6 * g, "refused unmaps change nothing");
    let before = d.counters();
    d.unmap(base + g, 3 * g).unwrap(); // the 2-page and the 1-page mapping after it
    let after = d.counters();
    soft.check(
        (
            after.unmaps - before.unmaps,
            after.pages_unmapped - before.pages_unmapped,
        ) == (1, 3),
        format!("one unmap call of two mappings counts 1 call, 3 pages: {before:?} → {after:?}"),
    );
    assert_eq!(d.mappings(), vec![(base, g), (base + 4 * g, 2 * g)]);
    assert_same(
        &read(&d, base, g),
        &want6[..g as usize],
        "mapping 0 kept across a neighbour's unmap",
    );
    assert_same(
        &read(&d, base + 4 * g, 2 * g),
        &want6[4 * g as usize..],
        "mapping 3 kept",
    );
    d.map(base + g, 3 * g).unwrap();
    write(&d, base + g, &want6[g as usize..4 * g as usize]);
    assert_same(&read(&d, base, 6 * g), &want6, "remapped hole is usable");
    d.unmap(base, 6 * g).unwrap(); // three mappings in one call
    assert_eq!(d.mapped_bytes(), 0);

    d.release_reservation(base, res_size).unwrap();
    assert!(
        is_invalid(d.release_reservation(base, res_size)),
        "double release is refused"
    );
    let c = d.counters();
    soft.check(
        (c.maps, c.unmaps, c.pages_mapped, c.pages_unmapped) == (6, 3, pages + 9, pages + 9),
        format!("counters {c:?}"),
    );
    let free3 = free_bytes(&d);
    soft.check(
        near(free3, free0, slack),
        format!("free memory at the end {free3} vs {free0}"),
    );
    soft.finish();
}

#[test]
fn map_out_of_memory_rolls_back() {
    let Some(d) = gpu() else { return };
    let mut soft = Soft::default();
    let slack = slack();
    let g = d.granularity();
    // Take most of the free memory with one segment, so that a modest map runs out midway.
    let free0 = free_bytes(&d);
    let mut want = free0.saturating_sub(512 * MIB) / g * g;
    let mut hog = None;
    while want >= GIB {
        match d.malloc(want) {
            Ok(p) => {
                hog = Some((p, want));
                break;
            }
            Err(DeviceError::OutOfMemory { .. }) => want -= 256 * MIB,
            Err(e) => panic!("malloc({want}): {e}"),
        }
    }
    let Some((hp, hs)) = hog else {
        eprintln!("  note: could not take most of the memory (free {free0}); map OOM not tested");
        return;
    };
    let free1 = free_bytes(&d);
    let try_size = (free1 + GIB).div_ceil(g) * g;
    eprintln!("  holding {hs} B; free now {free1} B; mapping {try_size} B");
    let res = d.reserve(try_size).unwrap();
    let before = d.counters();
    let t = Instant::now();
    match d.map(res, try_size) {
        Err(DeviceError::OutOfMemory { requested }) => {
            assert_eq!(requested, try_size);
            eprintln!("  map → OutOfMemory after {:?}", t.elapsed());
        }
        other => {
            panic!("expected OutOfMemory mapping {try_size} B with {free1} B free, got {other:?}")
        }
    }
    assert_eq!(d.mapped_bytes(), 0, "no page stays mapped after a failed map");
    assert_eq!(d.counters(), before, "a failed map is not counted");
    let free2 = free_bytes(&d);
    soft.check(
        near(free2, free1, slack),
        format!("free memory after the failed map {free2} vs {free1}"),
    );
    d.free(hp, hs).unwrap();
    // The reservation is intact: a small map in it works.
    d.map(res, 4 * g).unwrap();
    let want4 = pattern(4 * g, 5);
    write(&d, res, &want4);
    assert_same(&read(&d, res, 4 * g), &want4, "map after a failed map");
    d.unmap(res, 4 * g).unwrap();
    d.release_reservation(res, try_size).unwrap();
    soft.check(
        near(free_bytes(&d), free0, slack),
        "free memory back to the start".to_string(),
    );
    soft.finish();
}

#[test]
fn events_complete_after_stream_work() {
    let Some(d) = gpu() else { return };
    let s = d.create_stream(true).unwrap();
    let len = GIB;
    let buf = d.malloc(len).unwrap();
    // Queue ~16 GiB of memset on the stream: several milliseconds of device work.
    let t = Instant::now();
    for i in 0..16u8 {
        // SAFETY: `buf` is a live allocation of `len` bytes; `s` is a stream of this device; the
        // buffer is freed only after the stream is synchronised below.
        unsafe { d.memset_async(buf, i, len, s) }.unwrap();
    }
    let e = d.record_event(s).unwrap();
    let early = d.query_event(e).unwrap();
    let queued = t.elapsed();
    d.synchronize_event(e).unwrap();
    let done = t.elapsed();
    eprintln!("  query right after record: {early} (false expected); queued in {queued:?}, complete after {done:?}");
    assert!(d.query_event(e).unwrap(), "complete after synchronize_event");
    assert!(
        read(&d, buf, 4096).iter().all(|&b| b == 15),
        "the last memset is visible"
    );

    d.destroy_event(e);
    assert!(is_invalid(d.query_event(e)), "a destroyed event is unknown");
    assert!(
        is_invalid(d.synchronize_event(EventId(12345))),
        "an invented event is unknown"
    );
    // The pool hands the same event out again; the legacy default stream works.
    let e2 = d.record_event(StreamId(0)).unwrap();
    assert_eq!(e2, e, "pooled event reused");
    d.synchronize_stream(StreamId(0)).unwrap();
    assert!(d.query_event(e2).unwrap());
    d.destroy_event(e2);
    assert_eq!(d.live_events(), 0);

    d.synchronize_stream(s).unwrap();
    d.synchronize().unwrap();
    let c = d.counters();
    assert_eq!((c.events_recorded, c.synchronizes), (2, 1));
    d.free(buf, len).unwrap();
    // SAFETY: `s` was created above and is idle; it is not used afterwards.
    unsafe { d.destroy_stream(s) }.unwrap();
}

#[test]
fn driver_errors_carry_cuda_names() {
    let Some(d) = gpu() else { return };
    let g = d.granularity();
    // An address range far larger than any GPU's virtual address space.
    let huge = (1u64 << 62) / g * g;
    match d.reserve(huge) {
        Err(DeviceError::Driver { call, name }) => {
            eprintln!("  reserve({huge}) → {call}: {name}");
            assert_eq!(call, "cuMemAddressReserve");
            assert!(name.starts_with("CUDA_ERROR_"), "{name}");
        }
        other => panic!("expected a driver error, got {other:?}"),
    }
    // A copy to address 0 is refused by the driver.
    // SAFETY: the driver validates the destination and writes nothing to an invalid address.
    match unsafe { d.copy_to_device(0, &[1, 2, 3]) } {
        Err(DeviceError::Driver { call, name }) => {
            eprintln!("  copy to 0 → {call}: {name}");
            assert!(name.starts_with("CUDA_ERROR_"), "{name}");
        }
        other => panic!("expected a driver error, got {other:?}"),
    }
    // Unmapping a range never mapped is refused before the driver (so a wrong address can never
    // unmap memory that PyTorch or other code mapped in the shared context).
    let base = d.reserve(4 * g).unwrap();
    match d.unmap(base, 2 * g) {
        Err(DeviceError::InvalidArgument(m)) => eprintln!("  unmap of a never-mapped range → {m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    d.release_reservation(base, 4 * g).unwrap();
    // The device keeps working after the errors.
    let p = d.malloc(MIB).unwrap();
    memset(&d, p, 1, MIB);
    assert!(read(&d, p, MIB).iter().all(|&b| b == 1));
    d.free(p, MIB).unwrap();
    d.synchronize().unwrap();
}

#[test]
fn any_thread_works_and_the_primary_context_is_shared() {
    let Some(d) = gpu() else { return };
    let d = Arc::new(d);
    let current = || {
        let mut c: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the driver is initialised (a CudaDevice exists); `c` is a valid out-pointer.
        let r = unsafe { sys::cuCtxGetCurrent(&mut c) };
        check(r, "cuCtxGetCurrent").unwrap();
        c as usize
    };
    // A fresh thread has no current context; after using the device it still has none.
    let d2 = Arc::clone(&d);
    let (p, before, after) = std::thread::spawn(move || {
        let before = current();
        let p = d2.malloc(4096).unwrap();
        write(&d2, p, &[7u8; 4096]);
        (p, before, current())
    })
    .join()
    .unwrap();
    assert_eq!((before, after), (0, 0), "the calling thread's context is restored");

    // The context is the device's primary context, so a second CudaDevice (like PyTorch) sees
    // the same memory.
    let mut primary: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid device and out-pointer; released right below.
    unsafe {
        check(sys::cuDevicePrimaryCtxRetain(&mut primary, d.cu_device()), "retain").unwrap();
        check(sys::cuDevicePrimaryCtxRelease_v2(d.cu_device()), "release").unwrap();
    }
    assert_eq!(primary, d.context());
    let other = CudaDevice::new(0).unwrap();
    assert_eq!(other.context(), d.context());
    assert!(
        read(&other, p, 4096).iter().all(|&b| b == 7),
        "memory shared through the primary context"
    );
    assert!(is_invalid(other.free(p, 4096)), "a device frees only what it allocated");
    d.free(p, 4096).unwrap();

    // Many threads at once.
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let d = Arc::clone(&d);
            std::thread::spawn(move || {
                for i in 0..50u64 {
                    let size = (1 + (t * 50 + i) % 7) * 64 * 1024;
                    let p = d.malloc(size).unwrap();
                    let e = d.record_event(StreamId(0)).unwrap();
                    d.synchronize_event(e).unwrap();
                    d.destroy_event(e);
                    d.free(p, size).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let c = d.counters();
    assert_eq!((c.mallocs, c.frees, c.events_recorded), (401, 401, 400));
    assert_eq!(d.live_events(), 0);
}
