//! GPU pattern replay: proves on a real GPU that the allocator never hands out memory that is
//! still in use — no overlap of live allocations, no reuse before a stream is done with a block.
//!
//! The shared traces (`tests/data/*.pickle.gz`) are replayed again and again through the engine
//! on a [`CudaDevice`] (at least 1,000,000 trace operations in all, by default), with every
//! policy in turn and the traces' streams mapped onto several real CUDA streams (rotated between
//! passes, so single-stream traces use several real streams too):
//!
//! * every allocation gets a pattern derived from its allocation id, written into all of its
//!   bytes on its own stream (`cuMemsetD8Async`: a fill byte for the whole allocation, then the
//!   id's 8 bytes as a header);
//! * before every free the stream is synchronised and the pattern read back (`cuMemcpyDtoH`):
//!   the whole allocation when it is at most 4 KiB, else 256 bytes at its start, middle and end;
//! * a free that waited for other streams in the trace (`record_stream`) is replayed as one:
//!   the pattern is written once more on another real stream, without waiting, then
//!   `record_stream` and `free`. Reusing the block before that stream is done would let the late
//!   write clobber the next owner's pattern, which its own check then finds.
//!
//! Any mismatch means two live allocations overlapped or a block was reused too early: it is
//! printed and the program exits with status 1. At the end of each pass everything is freed and
//! the cache emptied, and the device must hold no memory and no events of ours.
//!
//! Usage: `gpu_pattern_replay [--device cuda:0|sim] [--traces DIR] [--min-ops N] [--streams N]
//! [--policies a,b,c]`. Defaults: `cuda:0`, `tests/data` (run from the repository root),
//! 1,000,000, 4, `pytorch,pytorch-expandable,cudamem`. Without a GPU it prints `SKIPPED: ...`
//! and exits 0, or 2 when `CUDAMEM_REQUIRE_GPU=1`. `--device sim` runs the same replay on the
//! simulated GPU with a host-side shadow of the patterns (to check the program itself anywhere).
//! scripts/gpu/pattern.sh builds it and runs it plainly and under compute-sanitizer.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use cudamem_alloc::CachingAllocator;
use cudamem_cuda::CudaDevice;
use cudamem_device::sim::{SimConfig, SimDevice};
use cudamem_device::{Device, DevicePtr, StreamId};
use cudamem_replay::{effective_config, Op, Program, ReplayOptions};

/// Bytes read back from each of the start, middle and end of a large allocation.
const SAMPLE: u64 = 256;
/// Allocations up to this size are read back whole.
const WHOLE: u64 = 4096;

/// 64 well-mixed bits of an allocation id (SplitMix64).
fn mix(id: u64) -> u64 {
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The byte every position of allocation `id` holds, except the header: never 0 (fresh
/// memory is often zero) and different for consecutive ids.
fn fill_byte(id: u64) -> u8 {
    (mix(id) % 255) as u8 + 1
}

/// The expected byte at offset `off` of allocation `id`: its header (the id's mixed bits) in
/// the first 8 bytes, the fill byte elsewhere.
fn expected(id: u64, off: u64) -> u8 {
    if off < 8 {
        (mix(id) >> (8 * off)) as u8
    } else {
        fill_byte(id)
    }
}

/// The ranges of an allocation of `len` bytes that are read back.
fn samples(len: u64) -> Vec<(u64, u64)> {
    if len <= WHOLE {
        return vec![(0, len)];
    }
    let mid = (len / 2).saturating_sub(SAMPLE / 2);
    vec![(0, SAMPLE), (mid, SAMPLE), (len - SAMPLE, SAMPLE)]
}

/// Where patterns are written and checked.
trait Memory {
    /// Writes allocation `id`'s pattern into `[ptr, ptr+len)`, ordered on `stream`.
    fn fill(&mut self, ptr: DevicePtr, len: u64, id: u64, stream: StreamId) -> Result<(), String>;
    /// Writes the fill part once more, ordered on `stream` (another stream), without waiting.
    fn touch(&mut self, ptr: DevicePtr, len: u64, id: u64, stream: StreamId) -> Result<(), String>;
    /// Waits for `stream` and reads the samples back: (bytes checked, first mismatch).
    fn verify(&mut self, ptr: DevicePtr, len: u64, id: u64, stream: StreamId) -> Result<(u64, Option<String>), String>;
    /// The allocation is about to be freed.
    fn forget(&mut self, _ptr: DevicePtr) {}
}

/// The real GPU.
struct Gpu {
    dev: Arc<CudaDevice>,
    buf: Vec<u8>,
}

impl Memory for Gpu {
    fn fill(&mut self, ptr: DevicePtr, len: u64, id: u64, stream: StreamId) -> Result<(), String> {
        // SAFETY: `[ptr, ptr+len)` is a live allocation the allocator just handed to us (it is
        // within a block of at least `len` bytes), no other work uses it, and `stream` is a
        // stream of this device's context (created by `create_stream`).
        unsafe {
            self.dev
                .memset_async(ptr, fill_byte(id), len, stream)
                .map_err(|e| e.to_string())?;
            for k in 0..len.min(8) {
                self.dev
                    .memset_async(ptr + k, expected(id, k), 1, stream)
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    fn touch(&mut self, ptr: DevicePtr, len: u64, id: u64, stream: StreamId) -> Result<(), String> {
        if len > 8 {
            // SAFETY: as in `fill`; the allocation is still live (it is freed right after, and
            // `record_stream` makes the allocator wait for this stream before reusing it).
            unsafe { self.dev.memset_async(ptr + 8, fill_byte(id), len - 8, stream) }.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn verify(&mut self, ptr: DevicePtr, len: u64, id: u64, stream: StreamId) -> Result<(u64, Option<String>), String> {
        self.dev.synchronize_stream(stream).map_err(|e| e.to_string())?;
        let mut checked = 0;
        for (off, n) in samples(len) {
            self.buf.resize(n as usize, 0);
            // SAFETY: `[ptr+off, +n)` lies inside the live allocation; its stream was just
            // synchronised, so every write to it has completed.
            unsafe { self.dev.copy_from_device(&mut self.buf, ptr + off) }.map_err(|e| e.to_string())?;
            checked += n;
            if let Some(i) = (0..n).find(|&i| self.buf[i as usize] != expected(id, off + i)) {
                let at = off + i;
                return Ok((
                    checked,
                    Some(format!(
                        "allocation #{id} [{ptr:#x}, +{len}) on stream {:#x}: byte {at} is {:#04x}, expected {:#04x} \
                     (another allocation's pattern: overlap or premature reuse)",
                        stream.0,
                        self.buf[i as usize],
                        expected(id, at)
                    )),
                ));
            }
        }
        Ok((checked, None))
    }
}

/// The simulated GPU: a host-side shadow of which allocation owns each written range.
#[derive(Default)]
struct Shadow {
    owner: BTreeMap<u64, (u64, u64)>, // start -> (end, id)
}

impl Memory for Shadow {
    fn fill(&mut self, ptr: DevicePtr, len: u64, id: u64, _stream: StreamId) -> Result<(), String> {
        let end = ptr + len;
        if let Some((&q, &(qend, qid))) = self.owner.range(..end).next_back() {
            if qend > ptr {
                return Err(format!(
                    "allocation #{id} [{ptr:#x}, +{len}) overlaps live #{qid} at {q:#x}"
                ));
            }
        }
        self.owner.insert(ptr, (end, id));
        Ok(())
    }
    fn touch(&mut self, _: DevicePtr, _: u64, _: u64, _: StreamId) -> Result<(), String> {
        Ok(())
    }
    fn verify(
        &mut self,
        ptr: DevicePtr,
        len: u64,
        id: u64,
        _stream: StreamId,
    ) -> Result<(u64, Option<String>), String> {
        let ok = self.owner.get(&ptr) == Some(&(ptr + len, id));
        let n = samples(len).iter().map(|s| s.1).sum();
        Ok((n, (!ok).then(|| format!("allocation #{id} at {ptr:#x}: shadow lost"))))
    }
    fn forget(&mut self, ptr: DevicePtr) {
        self.owner.remove(&ptr);
    }
}

struct Args {
    device: String,
    traces: PathBuf,
    min_ops: u64,
    streams: usize,
    policies: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        device: "cuda:0".into(),
        traces: PathBuf::from("tests/data"),
        min_ops: 1_000_000,
        streams: 4,
        policies: cudamem_alloc::policy::registry::default_policies()
            .split(',')
            .map(str::to_string)
            .collect(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--device" => a.device = val()?,
            "--traces" => a.traces = PathBuf::from(val()?),
            "--min-ops" => a.min_ops = val()?.parse().map_err(|e| format!("--min-ops: {e}"))?,
            "--streams" => a.streams = val()?.parse::<usize>().map_err(|e| format!("--streams: {e}"))?.max(1),
            "--policies" => a.policies = val()?.split(',').map(str::to_string).collect(),
            "-h" | "--help" => {
                println!("usage: gpu_pattern_replay [--device cuda:0|sim] [--traces DIR] [--min-ops N] [--streams N] [--policies a,b]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

#[derive(Default)]
struct Totals {
    ops: u64,
    allocations: u64,
    deferred_frees: u64,
    bytes_written: u64,
    bytes_verified: u64,
    mismatches: u64,
    ooms: u64,
    passes: u64,
}

struct Live {
    ptr: DevicePtr,
    len: u64,
    id: u64,
    stream: StreamId,
}

/// One replay of `p` with a fresh allocator. Returns an error for anything that is not a
/// pattern mismatch (those are counted and printed).
#[allow(clippy::too_many_arguments)]
fn pass(
    p: &Program,
    alloc: &CachingAllocator,
    mem: &mut dyn Memory,
    streams: &[StreamId],
    rotate: usize,
    next_id: &mut u64,
    t: &mut Totals,
) -> Result<(), String> {
    // Trace streams, in order of first use, onto the real streams, rotated per pass.
    let mut order: Vec<u64> = Vec::new();
    for op in &p.ops {
        if let Op::Malloc { stream, .. } = op {
            if !order.contains(stream) {
                order.push(*stream);
            }
        }
    }
    let map = |s: u64| streams[(order.iter().position(|&x| x == s).unwrap_or(0) + rotate) % streams.len()];
    let mut slots: Vec<Option<Live>> = (0..p.slots).map(|_| None).collect();
    let check = |live: &Live, mem: &mut dyn Memory, t: &mut Totals| -> Result<(), String> {
        let (n, bad) = mem.verify(live.ptr, live.len, live.id, live.stream)?;
        t.bytes_verified += n;
        if let Some(msg) = bad {
            t.mismatches += 1;
            eprintln!("MISMATCH: {msg}");
        }
        Ok(())
    };
    for op in &p.ops {
        match *op {
            Op::Malloc { size, stream, slot, .. } => {
                t.ops += 1;
                let s = map(stream);
                match alloc.malloc(size, s) {
                    Ok(0) => {}
                    Ok(ptr) => {
                        *next_id += 1;
                        mem.fill(ptr, size, *next_id, s)?;
                        t.allocations += 1;
                        t.bytes_written += size;
                        slots[slot as usize] = Some(Live {
                            ptr,
                            len: size,
                            id: *next_id,
                            stream: s,
                        });
                    }
                    Err(e) if e.is_out_of_memory() => t.ooms += 1,
                    Err(e) => return Err(format!("malloc({size}): {e}")),
                }
            }
            Op::Free { slot, deferred } => {
                t.ops += 1;
                let Some(live) = slots[slot as usize].take() else {
                    continue;
                };
                check(&live, mem, t)?;
                if deferred.is_some() && streams.len() > 1 {
                    let other =
                        streams[(streams.iter().position(|&x| x == live.stream).unwrap_or(0) + 1) % streams.len()];
                    mem.touch(live.ptr, live.len, live.id, other)?;
                    alloc
                        .record_stream(live.ptr, other)
                        .map_err(|e| format!("record_stream: {e}"))?;
                    t.deferred_frees += 1;
                }
                mem.forget(live.ptr);
                alloc.free(live.ptr).map_err(|e| format!("free: {e}"))?;
            }
            Op::Complete { .. } => {} // the real streams complete by themselves
            Op::EmptyCache => alloc.empty_cache().map_err(|e| format!("empty_cache: {e}"))?,
        }
    }
    for live in slots.into_iter().flatten() {
        check(&live, mem, t)?;
        mem.forget(live.ptr);
        alloc.free(live.ptr).map_err(|e| format!("free: {e}"))?;
    }
    alloc.empty_cache().map_err(|e| format!("empty_cache: {e}"))?;
    alloc.check_invariants().map_err(|e| format!("invariants: {e}"))?;
    if alloc.memory_reserved() != 0 {
        return Err(format!(
            "{} bytes still reserved after freeing everything",
            alloc.memory_reserved()
        ));
    }
    t.passes += 1;
    Ok(())
}

/// The device, its streams, where patterns go, and the CUDA device when there is one.
type Setup = (Arc<dyn Device>, Vec<StreamId>, Box<dyn Memory>, Option<Arc<CudaDevice>>);

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gpu_pattern_replay: {e}");
            return ExitCode::from(2);
        }
    };
    let require = std::env::var("CUDAMEM_REQUIRE_GPU").is_ok_and(|v| v == "1");
    // The device, its streams and the pattern memory.
    let (device, streams, mut mem, gpu): Setup = if args.device == "sim" {
        let sim: Arc<dyn Device> = Arc::new(SimDevice::new(SimConfig::default()));
        (
            sim,
            (1..=args.streams as u64).map(StreamId).collect(),
            Box::new(Shadow::default()),
            None,
        )
    } else {
        let ordinal: i32 = match args.device.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
            Some(n) => n,
            None => {
                eprintln!(
                    "gpu_pattern_replay: unknown device '{}' (use cuda:N or sim)",
                    args.device
                );
                return ExitCode::from(2);
            }
        };
        let dev = match CudaDevice::new(ordinal) {
            Ok(d) => Arc::new(d),
            Err(e) => {
                println!("SKIPPED: no CUDA device ({e})");
                return if require { ExitCode::from(2) } else { ExitCode::SUCCESS };
            }
        };
        let mut streams = Vec::new();
        for _ in 0..args.streams {
            match dev.create_stream(true) {
                Ok(s) => streams.push(s),
                Err(e) => {
                    eprintln!("gpu_pattern_replay: cuStreamCreate: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        let d: Arc<dyn Device> = dev.clone();
        (
            d,
            streams,
            Box::new(Gpu {
                dev: dev.clone(),
                buf: Vec::new(),
            }),
            Some(dev),
        )
    };
    println!(
        "gpu_pattern_replay on {} ({} bytes), {} streams, policies {}, at least {} ops",
        device.name(),
        device.total_memory(),
        streams.len(),
        args.policies.join(","),
        args.min_ops
    );

    // The traces, compiled once.
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&args.traces) {
        Ok(d) => d
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().ends_with(".pickle.gz"))
            .collect(),
        Err(e) => {
            eprintln!("gpu_pattern_replay: {}: {e}", args.traces.display());
            return ExitCode::from(2);
        }
    };
    files.sort();
    let mut programs = Vec::new();
    for f in &files {
        let trace = match cudamem_trace::read_path(f) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("gpu_pattern_replay: {e}");
                return ExitCode::FAILURE;
            }
        };
        for policy in &args.policies {
            let opts = ReplayOptions {
                policy: policy.clone(),
                repeats: 0,
                ..ReplayOptions::default()
            };
            let cfg = match effective_config(&trace, &opts) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("gpu_pattern_replay: {e}");
                    return ExitCode::FAILURE;
                }
            };
            for dt in &trace.devices {
                programs.push((trace.source.clone(), policy.clone(), cfg.clone(), Program::compile(dt)));
            }
        }
    }
    if programs.is_empty() {
        eprintln!("gpu_pattern_replay: no *.pickle.gz in {}", args.traces.display());
        return ExitCode::from(2);
    }

    let t0 = Instant::now();
    let mut t = Totals::default();
    let mut next_id = 0u64;
    let mut round = 0usize;
    'outer: while t.ops < args.min_ops {
        for (name, policy, cfg, p) in &programs {
            let alloc = match CachingAllocator::with_policy(device.clone(), cfg.clone(), policy) {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("gpu_pattern_replay: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let before = t.ops;
            let p0 = Instant::now();
            if let Err(e) = pass(p, &alloc, mem.as_mut(), &streams, round, &mut next_id, &mut t) {
                eprintln!("ERROR: {name} ({policy}): {e}");
                return ExitCode::FAILURE;
            }
            println!(
                "pass {:3}: {name} dev{} {policy:<18} {:7} ops in {:6.2} s; total {} ops, {} mismatches",
                t.passes,
                p.device,
                t.ops - before,
                p0.elapsed().as_secs_f64(),
                t.ops,
                t.mismatches
            );
            if t.ops >= args.min_ops {
                break 'outer;
            }
        }
        round += 1;
    }
    // Nothing of ours may be left on the device.
    let mut leaks = Vec::new();
    if let Some(dev) = &gpu {
        if dev.mapped_bytes() != 0 {
            leaks.push(format!("{} bytes still mapped", dev.mapped_bytes()));
        }
        if dev.live_events() != 0 {
            leaks.push(format!("{} events not returned", dev.live_events()));
        }
        let c = dev.counters();
        if c.mallocs != c.frees {
            leaks.push(format!("{} segments allocated, {} freed", c.mallocs, c.frees));
        }
        for &s in &streams {
            // SAFETY: the streams were created above and nothing uses them any more.
            let _ = unsafe { dev.destroy_stream(s) };
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "gpu_pattern_replay: {} ops ({} allocations, {} deferred frees on another stream) in {} passes, {:.1} s; \
         {} bytes written, {} bytes verified, {} mismatches, {} OOMs{}",
        t.ops,
        t.allocations,
        t.deferred_frees,
        t.passes,
        secs,
        t.bytes_written,
        t.bytes_verified,
        t.mismatches,
        t.ooms,
        if leaks.is_empty() {
            String::new()
        } else {
            format!("; LEAKS: {}", leaks.join(", "))
        }
    );
    if t.mismatches > 0 || !leaks.is_empty() {
        println!("FAIL");
        ExitCode::FAILURE
    } else {
        println!("PASS");
        ExitCode::SUCCESS
    }
}
