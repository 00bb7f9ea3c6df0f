//! The caching allocator on a real GPU (`cuda:0`), through the public API. Each test first
//! checks for a CUDA device; without one it prints `SKIPPED: no CUDA device (<reason>)` to
//! stderr and returns, unless `CUDAMEM_REQUIRE_GPU=1` is set, which makes it fail instead (the
//! GPU run script sets it).
//!
//! The tests compare `cuMemGetInfo` before and after, so run them one at a time, with output:
//! `--test-threads=1 --nocapture`. `CUDAMEM_TEST_SLACK_MIB` widens the 2 MiB slack of those
//! comparisons (the run script sets it under compute-sanitizer, whose own allocations move
//! free memory). Checks that depend on the driver's accounting are *soft*: every violation is
//! printed, the test still cleans up, and fails at its end listing them.

#![warn(clippy::undocumented_unsafe_blocks)]

use std::sync::Arc;
use std::time::Instant;

use cudamem::cudarc::driver::{DevicePtr, DeviceSlice};
use cudamem::{AllocError, Allocator, Buffer, Device, Error, Stream};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

fn slack() -> u64 {
    let mib: Option<u64> = std::env::var("CUDAMEM_TEST_SLACK_MIB")
        .ok()
        .and_then(|v| v.parse().ok());
    mib.unwrap_or(2) * MIB as u64
}

/// An allocator on `cuda:0` with `config` and the policy of `CUDAMEM_TEST_POLICY` (default: the
/// Rust API's default, `cudamem`), or `None` (after saying why) without a GPU.
fn gpu_with(config: &str) -> Option<Allocator> {
    let policy = std::env::var("CUDAMEM_TEST_POLICY").unwrap_or_default();
    gpu_policy(config, &policy)
}

/// Device allocations of either kind: `cuMemAlloc` segments and mapped pages.
fn device_allocs(c: &cudamem::DeviceCounters) -> u64 {
    c.mallocs + c.maps
}

/// Like [`gpu_with`], with an explicit policy.
fn gpu_policy(config: &str, policy: &str) -> Option<Allocator> {
    if !cudamem_cuda::is_available() {
        let why = cudamem_cuda::unavailable_reason().unwrap_or_else(|| "unknown".into());
        if std::env::var_os("CUDAMEM_REQUIRE_GPU").is_some_and(|v| v != "0") {
            panic!("CUDAMEM_REQUIRE_GPU is set but there is no CUDA device: {why}");
        }
        eprintln!("SKIPPED: no CUDA device ({why})");
        return None;
    }
    let a = Allocator::with_config("cuda:0", config, policy).expect("allocator on cuda:0");
    eprintln!("  policy {}", a.caching_allocator().policy_name());
    assert!(a.is_cuda());
    Some(a)
}

fn gpu() -> Option<Allocator> {
    gpu_with("")
}

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

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 9) as u8 ^ (i >> 17) as u8 ^ seed)
        .collect()
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first mismatch at byte {i}: got {:#04x}, want {:#04x}",
            got[i], want[i]
        );
    }
}

fn free_bytes(a: &Allocator) -> u64 {
    a.mem_get_info().expect("cuMemGetInfo").0
}

fn mib(b: u64) -> f64 {
    b as f64 / MIB as f64
}

/// Queues `rounds` memsets of the whole buffer on `stream` (device work of some milliseconds
/// for a large buffer), without waiting.
fn busy(a: &Allocator, b: &Buffer, stream: Stream, rounds: usize) {
    let cuda = a.cuda_device().unwrap();
    for i in 0..rounds {
        // SAFETY: `b` is a live buffer of `a` of `b.len()` bytes; whoever calls this recorded
        // `stream` for it (or it is its own stream), so the allocator does not reuse it before
        // the work completes; `stream` comes from `create_stream` of this allocator.
        unsafe { cuda.memset_async(b.device_ptr(), i as u8, b.len() as u64, stream.id()) }.unwrap();
    }
}

#[test]
fn allocations_are_real_and_usable_from_1_byte_to_256_mib() {
    let Some(a) = gpu() else { return };
    let sizes = [
        1,
        7,
        511,
        512,
        513,
        4 * KIB,
        100 * KIB,
        MIB - 1,
        MIB,
        MIB + 1,
        2 * MIB,
        10 * MIB + 7,
        20 * MIB,
        64 * MIB,
        256 * MIB,
    ];
    // All alive at once, each with its own pattern: then every one is checked again, so that
    // overlapping blocks would show.
    let mut bufs = Vec::new();
    for (k, &size) in sizes.iter().enumerate() {
        let t = Instant::now();
        let mut b = a.alloc(size, Stream::DEFAULT).unwrap();
        let alloc_t = t.elapsed();
        assert_ne!(b.device_ptr(), 0);
        assert_eq!(b.device_ptr() % 512, 0, "blocks are 512-byte aligned");
        let want = pattern(size, k as u8);
        b.copy_from_host(0, &want).unwrap();
        assert_same(&b.to_vec().unwrap(), &want, &format!("{size} B read back"));
        eprintln!(
            "  {size:>10} B at {:#x}: alloc {alloc_t:?}, write+read ok",
            b.device_ptr()
        );
        bufs.push((b, want));
    }
    for (b, want) in &bufs {
        assert_same(&b.to_vec().unwrap(), want, &format!("{} B still intact", b.len()));
    }
    // fill (cuMemsetD8Async on the buffer's stream) and partial copies.
    for (b, _) in bufs.iter_mut() {
        b.fill(0x5a).unwrap();
    }
    for (b, _) in &bufs {
        assert!(
            b.to_vec().unwrap().iter().all(|&x| x == 0x5a),
            "{} B after fill",
            b.len()
        );
    }
    let (b, _) = bufs.last_mut().unwrap();
    b.copy_from_host(123_457, &[1, 2, 3]).unwrap();
    let mut got = [0u8; 5];
    b.copy_to_host(123_456, &mut got).unwrap();
    assert_eq!(got, [0x5a, 1, 2, 3, 0x5a]);
    assert!(
        b.copy_from_host(b.len() - 1, &[1, 2]).is_err(),
        "copies past the end are refused"
    );
    let stats = a.memory_stats();
    eprintln!(
        "  {} buffers: allocated {:.1} MiB, reserved {:.1} MiB in {} segments, {} cuMemAlloc calls",
        bufs.len(),
        mib(a.memory_allocated()),
        mib(a.memory_reserved()),
        stats["segment.all.current"],
        a.device_counters().mallocs
    );
    drop(bufs);
    assert_eq!(a.memory_allocated(), 0);
    a.check_invariants().unwrap();
}

#[test]
fn cache_hits_make_no_new_cuda_allocations() {
    let Some(a) = gpu() else { return };
    let sizes = [512, 64 * KIB, MIB, 16 * MIB, 64 * MIB];
    // Warm-up: one allocation of each size, dropped.
    drop(
        sizes
            .iter()
            .map(|&s| a.alloc(s, Stream::DEFAULT).unwrap())
            .collect::<Vec<_>>(),
    );
    let before = a.device_counters();
    let num_alloc = a.memory_stats()["num_device_alloc"];
    let rounds = 2_000;
    let t = Instant::now();
    for _ in 0..rounds {
        for &s in &sizes {
            let b = a.alloc(s, Stream::DEFAULT).unwrap();
            drop(b);
        }
    }
    let per_pair = t.elapsed() / (rounds * sizes.len()) as u32;
    let after = a.device_counters();
    eprintln!(
        "  {} alloc+free pairs: {per_pair:?} per pair; cuMemAlloc {} -> {}, cuMemFree {} -> {}",
        rounds * sizes.len(),
        before.mallocs,
        after.mallocs,
        before.frees,
        after.frees
    );
    assert_eq!(
        device_allocs(&after),
        device_allocs(&before),
        "every allocation after the warm-up is a cache hit"
    );
    assert_eq!(after.frees, before.frees, "nothing is returned to the device");
    assert_eq!(a.memory_stats()["num_device_alloc"], num_alloc);
    a.check_invariants().unwrap();
}

#[test]
fn empty_cache_returns_to_the_device_what_the_stats_say() {
    let Some(a) = gpu() else { return };
    let mut soft = Soft::default();
    let slack = slack();
    let bufs: Vec<Buffer> = [100 * MIB, 100 * MIB, 300 * MIB, 5 * MIB, 4 * KIB, 700 * KIB]
        .iter()
        .map(|&s| a.alloc(s, Stream::DEFAULT).unwrap())
        .collect();
    drop(bufs);
    a.synchronize().unwrap();
    let reserved0 = a.memory_reserved();
    let free0 = free_bytes(&a);
    let t = Instant::now();
    a.empty_cache().unwrap();
    let took = t.elapsed();
    let free1 = free_bytes(&a);
    let released = reserved0 - a.memory_reserved();
    let seen = free1 as i64 - free0 as i64;
    eprintln!(
        "  empty_cache in {took:?}: stats released {released} B ({:.1} MiB); cuMemGetInfo free rose by {seen} B ({:.1} MiB)",
        mib(released),
        seen as f64 / MIB as f64
    );
    soft.check(a.memory_reserved() == 0, "nothing stays reserved");
    soft.check(
        (seen - released as i64).unsigned_abs() <= slack,
        format!("used memory fell by what the stats released (±{} MiB)", slack >> 20),
    );
    a.check_invariants().unwrap();
    soft.finish();
}

#[test]
fn record_stream_defers_reuse_until_the_other_stream_is_done() {
    let Some(a) = gpu() else { return };
    let cuda = Arc::clone(a.cuda_device().unwrap());
    let sa = a.create_stream().unwrap();
    let sb = a.create_stream().unwrap();
    let len = GIB;
    let mut rounds = 32;
    loop {
        let buf = a.alloc(len, sa).unwrap();
        let p = buf.device_ptr();
        buf.record_stream(sb).unwrap();
        // Long work on stream B: `rounds` memsets of 1 GiB.
        busy(&a, &buf, sb, rounds);
        let marker = cuda.record_event(sb.id()).unwrap();
        drop(buf);
        let pending = a.caching_allocator().lock().pending_frees();
        let t = Instant::now();
        let other = a.alloc(len, sa).unwrap();
        let alloc_t = t.elapsed();
        let b_done = cuda.query_event(marker).unwrap();
        eprintln!(
            "  {rounds} x 1 GiB memset on B; after free: {pending} pending free(s); alloc on A took {alloc_t:?} → {:#x} (freed block {p:#x}); B done: {b_done}",
            other.device_ptr()
        );
        if b_done {
            // B finished before we could look: the check proves nothing; make B's work longer.
            cuda.synchronize_event(marker).unwrap();
            cuda.destroy_event(marker);
            drop(other);
            a.synchronize().unwrap();
            rounds *= 4;
            assert!(rounds <= 2048, "stream B's work always finished within microseconds");
            continue;
        }
        assert_eq!(pending, 1, "the freed block waits for stream B");
        assert_ne!(
            other.device_ptr(),
            p,
            "a block recorded on stream B was handed out while B still used it"
        );
        // After B completes, the block is reused (and no new cuMemAlloc happens for it).
        let t = Instant::now();
        a.synchronize_stream(sb).unwrap();
        let wait = t.elapsed();
        let mallocs = device_allocs(&a.device_counters());
        let again = a.alloc(len, sa).unwrap();
        eprintln!(
            "  B synchronised after {wait:?}; alloc on A → {:#x}; cuMemAlloc calls {} -> {}",
            again.device_ptr(),
            mallocs,
            device_allocs(&a.device_counters())
        );
        assert_eq!(again.device_ptr(), p, "reused once B finished");
        assert_eq!(device_allocs(&a.device_counters()), mallocs);
        assert!(cuda.query_event(marker).unwrap());
        cuda.destroy_event(marker);
        drop((other, again));
        break;
    }
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn out_of_memory_is_typed_and_the_allocator_keeps_working() {
    let Some(a) = gpu() else { return };
    let mut soft = Soft::default();
    let (free0, total) = a.mem_get_info().unwrap();
    // 1. One request larger than the device.
    let huge = total as usize + GIB;
    let t = Instant::now();
    let err = a.alloc(huge, Stream::DEFAULT).unwrap_err();
    eprintln!("  alloc({huge}) failed in {:?}:\n    {err}", t.elapsed());
    let Error::Alloc(AllocError::OutOfMemory(o)) = &err else {
        panic!("expected AllocError::OutOfMemory, got {err:?}")
    };
    let msg = o.pytorch_message();
    assert!(msg.starts_with("CUDA out of memory. Tried to allocate "), "{msg}");
    assert!(msg.contains("GPU 0 has a total capacity of "), "{msg}");
    assert_eq!(o.total, total);
    assert_eq!(a.memory_stats()["num_ooms"], 1);

    // 2. Fill the device with 1 GiB buffers until it refuses one.
    let mut held = Vec::new();
    let t = Instant::now();
    let fill_err = loop {
        match a.alloc(GIB, Stream::DEFAULT) {
            Ok(b) => held.push(b),
            Err(e) => break e,
        }
        assert!(
            held.len() as u64 <= total / GIB as u64 + 1,
            "more 1 GiB buffers than memory"
        );
    };
    let free_full = free_bytes(&a);
    eprintln!(
        "  filled with {} x 1 GiB in {:?} (free before {:.0} MiB, now {:.0} MiB); then:\n    {fill_err}",
        held.len(),
        t.elapsed(),
        mib(free0),
        mib(free_full)
    );
    let Some(o) = fill_err.out_of_memory() else {
        panic!("expected AllocError::OutOfMemory, got {fill_err:?}")
    };
    assert!(
        o.pytorch_message()
            .starts_with("CUDA out of memory. Tried to allocate 1024.00 MiB."),
        "{}",
        o.pytorch_message()
    );
    soft.check(
        free_full < GIB as u64,
        format!("less than 1 GiB free when it failed ({free_full} B)"),
    );
    soft.check(
        held.len() as u64 >= free0 / GIB as u64 - 1,
        format!(
            "got {} GiB of the {:.1} GiB free",
            held.len(),
            free0 as f64 / GIB as f64
        ),
    );
    assert_eq!(a.memory_stats()["num_ooms"], 2);

    // 3. Free half: allocations succeed again, and the memory is usable.
    let half = held.len() / 2;
    held.truncate(half);
    let mut b = a.alloc(GIB, Stream::DEFAULT).expect("allocation after freeing");
    b.fill(7).unwrap();
    let mut probe = [0u8; 16];
    b.copy_to_host(GIB - 16, &mut probe).unwrap();
    assert_eq!(probe, [7; 16]);
    drop(b);
    drop(held);
    a.empty_cache().unwrap();
    let free_end = free_bytes(&a);
    soft.check(
        free_end + slack() >= free0,
        format!("free memory is back after empty_cache: {free_end} vs {free0} at the start"),
    );
    a.check_invariants().unwrap();
    soft.finish();
}

#[test]
fn expandable_segments_map_and_unmap_real_pages() {
    let Some(a) = gpu_policy("expandable_segments:True", "pytorch") else {
        return;
    };
    let mut soft = Soft::default();
    let slack = slack();
    let cuda = Arc::clone(a.cuda_device().unwrap());
    let g = 2 * MIB;
    eprintln!("  granularity {} B", cuda.granularity());
    let free0 = free_bytes(&a);
    let c0 = a.device_counters();

    // 100 MiB: five 20 MiB pages of the large pool, each one cuMemCreate.
    let mut b1 = a.alloc(100 * MIB, Stream::DEFAULT).unwrap();
    let free1 = free_bytes(&a);
    let c1 = a.device_counters();
    let reserved1 = a.memory_reserved();
    eprintln!(
        "  alloc 100 MiB: reserved {:.0} MiB, {} map call(s) of {} pages of {} B; free memory fell {:.1} MiB; mappings {:?}",
        mib(reserved1),
        c1.maps - c0.maps,
        c1.pages_mapped - c0.pages_mapped,
        cuda.granularity(),
        (free0 as f64 - free1 as f64) / MIB as f64,
        cuda.mappings().iter().map(|(p, s)| format!("{p:#x}+{}MiB", s >> 20)).collect::<Vec<_>>()
    );
    assert_eq!(c1.mallocs, c0.mallocs, "no cuMemAlloc with expandable segments");
    assert!(c1.maps > c0.maps);
    soft.check(
        (free0 as i64 - free1 as i64 - reserved1 as i64).unsigned_abs() <= slack,
        format!(
            "free memory fell by the mapped amount ({:.0} MiB ±{} MiB)",
            mib(reserved1),
            slack >> 20
        ),
    );
    assert_eq!(cuda.mapped_bytes(), reserved1);

    // Data across page boundaries.
    let want1 = pattern(b1.len(), 3);
    b1.copy_from_host(0, &want1).unwrap();
    assert_same(&b1.to_vec().unwrap(), &want1, "100 MiB across 20 MiB pages");
    // Growing the segment maps more pages behind b1; b1 keeps its data.
    let mut b2 = a.alloc(50 * MIB, Stream::DEFAULT).unwrap();
    eprintln!(
        "  alloc 50 MiB at {:#x} (b1 at {:#x}, +{} MiB): reserved {:.0} MiB",
        b2.device_ptr(),
        b1.device_ptr(),
        (b2.device_ptr() - b1.device_ptr()) >> 20,
        mib(a.memory_reserved())
    );
    assert_eq!(
        b2.device_ptr(),
        b1.device_ptr() + 100 * MIB as u64,
        "the segment grows in place"
    );
    let want2 = pattern(b2.len(), 4);
    b2.copy_from_host(0, &want2).unwrap();
    assert_same(&b1.to_vec().unwrap(), &want1, "b1 intact after the segment grew");
    assert_same(&b2.to_vec().unwrap(), &want2, "b2 read back");
    // A copy spanning the boundary between b1's and b2's pages, read through raw memory.
    let mut edge = vec![0u8; 2 * g];
    {
        let start = b1.device_ptr() + 100 * MIB as u64 - g as u64;
        let cuda = a.cuda_device().unwrap();
        // SAFETY: `[start, +2g)` covers the last 2 MiB of b1 and the first 2 MiB of b2, both
        // live buffers with no work pending (the copies above synchronised their stream).
        unsafe { cuda.copy_from_device(&mut edge, start) }.unwrap();
    }
    assert_same(&edge[..g], &want1[100 * MIB - g..], "b1's tail through a raw copy");
    assert_same(&edge[g..], &want2[..g], "b2's head through a raw copy");

    // Small pool: 2 MiB pages.
    let c_small = a.device_counters();
    let small = a.alloc(4 * KIB, Stream::DEFAULT).unwrap();
    let c2 = a.device_counters();
    eprintln!(
        "  alloc 4 KiB: {} map call(s), {} page(s) of the small pool",
        c2.maps - c_small.maps,
        c2.pages_mapped - c_small.pages_mapped
    );
    assert_eq!((c2.maps - c_small.maps, c2.pages_mapped - c_small.pages_mapped), (1, 1));
    drop(small);

    // Free and release: pages are unmapped and the memory is back.
    let reserved_full = a.memory_reserved();
    drop((b1, b2));
    let free_before_empty = free_bytes(&a);
    a.empty_cache().unwrap();
    let free_after = free_bytes(&a);
    let c3 = a.device_counters();
    eprintln!(
        "  empty_cache: reserved {:.0} -> {:.0} MiB; {} unmap call(s), {} pages; free memory rose {:.1} MiB",
        mib(reserved_full),
        mib(a.memory_reserved()),
        c3.unmaps - c2.unmaps,
        c3.pages_unmapped - c2.pages_unmapped,
        (free_after as f64 - free_before_empty as f64) / MIB as f64
    );
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(cuda.mapped_bytes(), 0, "every mapping was unmapped");
    assert_eq!(c3.pages_unmapped - c0.pages_unmapped, c3.pages_mapped - c0.pages_mapped);
    soft.check(
        (free_after as i64 - free_before_empty as i64 - reserved_full as i64).unsigned_abs() <= slack,
        format!(
            "free memory rose by the unmapped amount ({:.0} MiB)",
            mib(reserved_full)
        ),
    );
    soft.check(
        (free_after as i64 - free0 as i64).unsigned_abs() <= slack,
        format!("free memory back to the start: {free_after} vs {free0}"),
    );
    a.check_invariants().unwrap();
    soft.finish();
}

#[test]
fn cudarc_views_use_the_buffer_in_place_and_are_stream_ordered() {
    let Some(a) = gpu() else { return };
    let ctx = a.cuda_context().unwrap();
    let stream = ctx.new_stream().unwrap();
    let s = a.stream_from_cudarc(&stream).unwrap();
    let n = 1 << 20;
    let mut buf = a.alloc(n * 4, s).unwrap();
    let ptr = buf.device_ptr();
    {
        let mut view = buf.cuda_slice_zeroed::<u32>(&stream).unwrap();
        assert_eq!(view.len(), n);
        assert!(stream.clone_dtoh(&view).unwrap().iter().all(|&x| x == 0), "zeroed");
        let host: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        stream.memcpy_htod(&host, &mut view).unwrap();
        let (p, sync) = view.device_ptr(&stream);
        assert_eq!(p, ptr, "the view is the buffer's memory, not a copy");
        drop(sync);
        assert_eq!(stream.clone_dtoh(&view).unwrap(), host);
    }
    // The data is in the cudamem buffer itself.
    let bytes = buf.to_vec().unwrap();
    assert_eq!(u32::from_le_bytes(bytes[4..8].try_into().unwrap()), 2_654_435_761);
    eprintln!("  cudarc memcpy_htod/clone_dtoh through a view of {:#x}: ok", ptr);

    // Stream ordering across streams: a view on another stream queues long work, then ends;
    // the buffer is dropped and its block handed out again on the buffer's stream A, where a
    // fill and a read must see none of the other stream's writes land afterwards.
    let other = ctx.new_stream().unwrap();
    let sa = a.create_stream().unwrap();
    let mut big = a.alloc(GIB, sa).unwrap();
    let p_big = big.device_ptr();
    {
        let mut view = big.cuda_slice_zeroed::<u8>(&other).unwrap();
        for _ in 0..32 {
            other.memset_zeros(&mut view).unwrap();
        }
    }
    drop(big);
    let mut again = a.alloc(GIB, sa).unwrap();
    assert_eq!(
        again.device_ptr(),
        p_big,
        "stream-ordered reuse on the buffer's own stream"
    );
    again.fill(9).unwrap();
    let t = Instant::now();
    let v = again.to_vec().unwrap();
    let zeros = v.iter().filter(|&&x| x != 9).count();
    eprintln!(
        "  reuse after a view on another stream: read back after {:?}, {zeros} stray bytes",
        t.elapsed()
    );
    assert_eq!(
        zeros, 0,
        "work queued through the view landed after the block's next owner wrote it"
    );
    drop(again);
    // A stream that was never vouched for is refused on CUDA (it could be a dangling handle).
    assert!(matches!(
        a.alloc(16, Stream::from_raw(0x1234)),
        Err(Error::InvalidStream { .. })
    ));
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn eight_threads_on_their_own_streams() {
    for config in ["", "sharded:True"] {
        let Some(a) = gpu_with(config) else { return };
        assert_eq!(a.is_sharded(), !config.is_empty());
        eight_threads(a, config);
    }
}

fn eight_threads(a: Allocator, config: &str) {
    let t = Instant::now();
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let a = a.clone();
            std::thread::spawn(move || {
                let s = a.create_stream().unwrap();
                let sizes = [512, 8 * KIB, 300 * KIB, 3 * MIB, 24 * MIB];
                let mut keep = Vec::new();
                for k in 0..500 {
                    let mut b = a.alloc(sizes[(i + k) % sizes.len()], s).unwrap();
                    if k % 50 == 0 {
                        b.fill(i as u8).unwrap();
                        let mut x = [0u8; 1];
                        b.copy_to_host(b.len() - 1, &mut x).unwrap();
                        assert_eq!(x[0], i as u8);
                    }
                    if k % 100 == 0 {
                        keep.push(b); // some live at once, on every thread
                    }
                }
                // The kept buffers still hold what this thread wrote (no other thread got them).
                for b in &keep {
                    let mut x = [0u8; 1];
                    b.copy_to_host(0, &mut x).unwrap();
                    assert_eq!(x[0], i as u8);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    eprintln!(
        "  [{config}] 8 threads x 500 alloc/free on own streams in {:?}; {} cuMemAlloc, {} maps",
        t.elapsed(),
        a.device_counters().mallocs,
        a.device_counters().maps
    );
    assert_eq!(a.memory_allocated(), 0);
    assert_eq!(a.stats().allocation.all().allocated, 8 * 500);
    a.check_invariants().unwrap();
    let before = free_bytes(&a);
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    assert!(free_bytes(&a) >= before, "empty_cache gave memory back");
}
