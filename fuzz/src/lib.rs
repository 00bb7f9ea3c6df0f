//! Shared code of cudamem's fuzz targets (see `fuzz_targets/` and docs/reliability.md).
//!
//! * [`check_trace`]: the oracles applied to every trace a reader accepts: it validates, and it
//!   survives the compact and pickle round trips unchanged (both writers document that reading
//!   their output back gives an equal trace).
//! * [`allocator_ops`]: decodes bytes into a configuration, a fault plan and a sequence of
//!   allocator calls, runs them on a [`SimDevice`] and checks every invariant after every call.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudamem_alloc::{AllocError, AllocatorConfig, CachingAllocator};
use cudamem_device::sim::{EventMode, FaultOp, FaultPlan, SimConfig, SimDevice};
use cudamem_device::{Device, StreamId};
use cudamem_trace::Trace;

/// Compares two traces, treating NaN settings as equal to themselves (`f64`'s `PartialEq`
/// does not).
fn same_trace(a: &Trace, b: &Trace) -> bool {
    a == b || format!("{a:?}") == format!("{b:?}")
}

/// The oracles for a trace a reader accepted. `via_pickle_too`: also round-trip through the
/// pickle writer (its reader interns stacks and drops devices without events, so only traces
/// read from a pickle are sure to come back equal).
pub fn check_trace(trace: &Trace, via_pickle_too: bool) {
    trace.validate().expect("a reader returned a trace that does not validate");
    let _ = trace.summary();
    let mut compact = Vec::new();
    cudamem_trace::write_compact(trace, &mut compact).expect("write_compact of an accepted trace");
    let back = cudamem_trace::read_compact(&compact, &trace.source).expect("read_compact of write_compact's output");
    assert!(same_trace(trace, &back), "compact round trip changed the trace");
    if via_pickle_too {
        // Device ordinals are bounded by the readers (Trace::validate, MAX_DEVICE_ORDINAL), so
        // the writer's one device_traces list per ordinal stays small (a fuzz finding:
        // crates/trace/tests/fuzz_regressions.rs).
        let mut pickle = Vec::new();
        cudamem_trace::write_snapshot_pickle(trace, &mut pickle).expect("write_snapshot_pickle of an accepted trace");
        let back = cudamem_trace::read_pickle(&pickle, &trace.source).expect("read_pickle of write_snapshot_pickle's output");
        assert!(same_trace(trace, &back), "pickle round trip changed the trace");
    }
}

/// A little-endian byte reader that yields zeros once the input is used up.
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    /// Reads `data` from the start.
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data, pos: 0 }
    }
    /// Whether every byte was consumed.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }
    /// The next byte, 0 past the end.
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    /// The next little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    /// The next little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    /// The next little-endian u64.
    pub fn u64(&mut self) -> u64 {
        (self.u32() as u64) | ((self.u32() as u64) << 32)
    }
    /// Up to `n` raw bytes.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.pos = start + n;
        &self.data[start..end]
    }
}

/// Steer the `allocator_ops` decoder away from the two engine bugs the fuzzer found first, so
/// that fuzzing time goes to finding others:
///
/// 1. `release_available_cached_blocks` released an expandable or split block as a whole
///    segment (needs `max_split_size_mb` with expandable segments, or lowered at run time);
/// 2. the oversize counts went negative when `max_split_size_mb` was lowered at run time.
///
/// With it on, `max_split_size_mb` is only ever set at start and only with the native policy
/// and no expandable segments, and `set_settings` strings never contain `max_split` (a
/// `set_settings` without it resets the limit to unlimited, which raises it: harmless).
/// Both are fixed (commit 44c526c, regression tests in
/// crates/alloc/tests/fuzz_regressions.rs), so it is off: keep it for the next such bug.
pub const AVOID_KNOWN_BUGS: bool = false;

/// The policies the allocator target picks from.
/// Every registered policy, so that the fuzzer drives each one.
pub const POLICIES: &[&str] = cudamem_alloc::policy::POLICY_NAMES;

/// Settings strings the allocator target starts from or switches to (valid and invalid ones).
pub const SETTINGS: [&str; 14] = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:24",
    "max_split_size_mb:40,roundup_power2_divisions:4",
    "roundup_power2_divisions:[1:8,256:4,>:1]",
    "garbage_collection_threshold:0.6",
    "garbage_collection_threshold:0.6,max_split_size_mb:64",
    "large_segment_size_mb:32,max_non_split_rounding_mb:64",
    "expandable_segments:False",
    "max_split_size_mb:20,expandable_segments:True",
    "roundup_power2_divisions:16,garbage_collection_threshold:0.9",
    "max_split_size_mb:5",
    "bogus:1",
    "expandable_segments:maybe",
];

/// Device capacities the allocator target picks from: small ones make OOM and retries common,
/// and every one keeps a capacity-sized request to at most 2,048 pages of 2 MiB (an H200-sized
/// device made such requests map 70,000 pages, one call each, which slowed the target 50x).
pub const CAPACITIES: [u64; 4] = [64 << 20, 200 << 20, 1 << 30, 4 << 30];

/// Memory fractions, valid and invalid.
pub const FRACTIONS: [f64; 8] = [-0.1, 0.0, 0.25, 0.5, 0.8, 1.0, 1.1, f64::NAN];

/// A request size drawn from every range that matters: 0, small, the 1 MiB and 10 MiB
/// boundaries, large, around the device capacity, and huge.
pub fn size_of(b: &mut Bytes, capacity: u64) -> u64 {
    let class = b.u8();
    let r = b.u32() as u64;
    match class % 16 {
        0 => 0,
        1..=4 => 1 + r % 4096,
        5..=6 => 1 + r % (1 << 20),
        7 => (1 << 20) - 1 + r % 3,          // 1 MiB - 1 .. 1 MiB + 1
        8 => (10 << 20) - 1 + r % 3,         // 10 MiB - 1 .. 10 MiB + 1
        9..=10 => (1 << 20) + r % (12 << 20), // between the boundaries
        11 => (12 << 20) + r % (100 << 20),
        12 => capacity.wrapping_sub(1).wrapping_add(r % 3), // capacity - 1 .. capacity + 1
        13 => [(1 << 60) - 1, 1 << 60, 1 << 63, u64::MAX][(r % 4) as usize],
        14 => b.u64(),
        _ => 512 * (1 + r % 64),
    }
}

/// One decoded allocator call.
#[derive(Clone, Debug)]
pub enum Op {
    /// `malloc(size, stream)`.
    Alloc { size: u64, stream: u64 },
    /// `free` of a live allocation (index modulo the live count).
    Free { pick: usize },
    /// `free` of the start of an allocation already freed.
    DoubleFree { pick: usize },
    /// `free` of an address inside a live allocation.
    FreeInterior { pick: usize, offset: u64 },
    /// `free` of an arbitrary address.
    FreeWild { ptr: u64 },
    /// `record_stream` of a live allocation.
    RecordStream { pick: usize, stream: u64 },
    /// `record_stream` of an address that is not a live allocation.
    RecordStreamInvalid { ptr: u64, stream: u64 },
    /// `SimDevice::complete_stream`.
    CompleteStream { stream: u64 },
    /// `SimDevice::complete_all`.
    CompleteAll,
    /// `empty_cache`.
    EmptyCache,
    /// `set_memory_fraction`.
    SetFraction { fraction: f64 },
    /// `set_settings`.
    SetSettings { settings: String },
    /// `memory_stats`, `memory_summary` and `snapshot`.
    Inspect,
}

/// A decoded run: how to build the allocator, which faults to inject, what to call.
#[derive(Clone, Debug)]
pub struct Run {
    /// Policy name.
    pub policy: &'static str,
    /// Starting settings.
    pub settings: &'static str,
    /// Device bytes.
    pub capacity: u64,
    /// Faults.
    pub faults: FaultPlan,
    /// The calls.
    pub ops: Vec<Op>,
}

fn stream_of(b: &mut Bytes) -> u64 {
    // Mostly 4 streams, sometimes an arbitrary handle.
    let s = b.u8();
    if s < 254 {
        (s % 4) as u64
    } else {
        b.u64()
    }
}

/// Decodes bytes into a [`Run`] (at most `max_ops` calls).
pub fn decode(data: &[u8], max_ops: usize) -> Run {
    let mut b = Bytes::new(data);
    let policy = POLICIES[b.u8() as usize % POLICIES.len()];
    let mut settings = SETTINGS[b.u8() as usize % 11]; // only the valid ones to start from
    if AVOID_KNOWN_BUGS && settings.contains("max_split") && (policy != "pytorch" || settings.contains("expandable_segments:True")) {
        settings = "";
    }
    let capacity = CAPACITIES[b.u8() as usize % CAPACITIES.len()];
    let mut faults = FaultPlan::default();
    let fault_byte = b.u8();
    if fault_byte & 1 != 0 {
        let ops = [FaultOp::Malloc, FaultOp::Map, FaultOp::QueryEvent];
        let chosen: Vec<FaultOp> = ops.iter().enumerate().filter(|(i, _)| fault_byte & (2 << i) != 0).map(|(_, o)| *o).collect();
        let fraction = (b.u8() as f64) / 255.0 * 0.6;
        faults = faults.fail_fraction(&chosen, fraction, b.u64());
    }
    if fault_byte & 16 != 0 {
        for _ in 0..(b.u8() % 4) {
            let op = [FaultOp::Malloc, FaultOp::Map, FaultOp::QueryEvent][b.u8() as usize % 3];
            faults = faults.fail_nth(op, 1 + (b.u8() as u64 % 32));
        }
    }
    let mut ops = Vec::new();
    while !b.is_empty() && ops.len() < max_ops {
        let op = match b.u8() % 32 {
            0..=9 => Op::Alloc { size: size_of(&mut b, capacity), stream: stream_of(&mut b) },
            10..=16 => Op::Free { pick: b.u16() as usize },
            17 => Op::DoubleFree { pick: b.u16() as usize },
            18 => Op::FreeInterior { pick: b.u16() as usize, offset: b.u32() as u64 },
            19 => Op::FreeWild { ptr: b.u64() },
            20..=21 => Op::RecordStream { pick: b.u16() as usize, stream: stream_of(&mut b) },
            22 => Op::RecordStreamInvalid { ptr: b.u64(), stream: stream_of(&mut b) },
            23..=24 => Op::CompleteStream { stream: stream_of(&mut b) },
            25 => Op::CompleteAll,
            26 => Op::EmptyCache,
            27 => Op::SetFraction { fraction: FRACTIONS[b.u8() as usize % FRACTIONS.len()] },
            28 => {
                let pick = b.u8();
                let settings = if pick < 200 {
                    SETTINGS[pick as usize % SETTINGS.len()].to_string()
                } else {
                    let n = b.u8() as usize % 48;
                    String::from_utf8_lossy(b.take(n)).into_owned()
                };
                if AVOID_KNOWN_BUGS && settings.contains("max_split") {
                    Op::Inspect
                } else {
                    Op::SetSettings { settings }
                }
            }
            _ => Op::Inspect,
        };
        ops.push(op);
    }
    Run { policy, settings, capacity, faults, ops }
}

/// Checks the allocator and the device after a call.
fn check_all(a: &CachingAllocator, sim: &SimDevice, after: &Op) {
    if let Err(e) = a.check_invariants() {
        panic!("after {after:?}: allocator invariant broken: {e}");
    }
    if let Err(e) = sim.check() {
        panic!("after {after:?}: device invariant broken: {e}");
    }
    assert_eq!(a.memory_reserved(), sim.used(), "after {after:?}: reserved != device used");
}

/// A call that must fail with an invalid pointer and change nothing.
fn expect_invalid(a: &CachingAllocator, r: Result<(), AllocError>, before: &cudamem_alloc::DeviceStats, what: &str) {
    match r {
        Err(AllocError::InvalidPointer { .. }) => {}
        other => panic!("{what}: expected InvalidPointer, got {other:?}"),
    }
    assert_eq!(&a.stats(), before, "{what}: a rejected call changed the stats");
}

/// Runs a decoded [`Run`], checking after every call:
/// * the allocator's invariants ([`CachingAllocator::check_invariants`]) and the device's
///   ([`SimDevice::check`]), and reserved bytes == device used bytes;
/// * a successful allocation is non-null for a non-zero size, 512-aligned and overlaps no live
///   allocation;
/// * a failed allocation is an out-of-memory error (nothing else);
/// * invalid frees and record_streams are `InvalidPointer` and change no stat;
/// * at the end, with faults off, freeing everything and `empty_cache` returns every byte to
///   the device and destroys every event.
pub fn run(r: &Run) {
    let sim = Arc::new(SimDevice::new(SimConfig { capacity: r.capacity, event_mode: EventMode::Manual, ..SimConfig::default() }));
    let dev: Arc<dyn Device> = sim.clone();
    let cfg = AllocatorConfig::parse(r.settings).expect("the starting settings are valid");
    let a = CachingAllocator::with_policy(dev, cfg, r.policy).expect("known policy");
    sim.set_faults(r.faults.clone());
    // Live allocations: address -> (size, index in `order`); `order` keeps a stable pick order.
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let mut order: Vec<u64> = Vec::new();
    let mut freed: Vec<u64> = Vec::new();
    let pick = |order: &Vec<u64>, i: usize| order.get(i % order.len().max(1)).copied();
    for op in &r.ops {
        match op {
            Op::Alloc { size, stream } => match a.malloc(*size, StreamId(*stream)) {
                Ok(0) => assert_eq!(*size, 0, "null pointer for a non-zero size"),
                Ok(p) => {
                    assert!(*size > 0, "size 0 must return address 0");
                    assert_eq!(p % 512, 0, "unaligned pointer {p:#x}");
                    let end = p.checked_add(*size).expect("allocation wraps the address space");
                    if let Some((&q, &qs)) = live.range(..end).next_back() {
                        assert!(q + qs <= p, "new allocation [{p:#x}, +{size}) overlaps live [{q:#x}, +{qs})");
                    }
                    live.insert(p, *size);
                    order.push(p);
                    freed.retain(|&f| f != p);
                }
                Err(e) => assert!(e.is_out_of_memory(), "malloc({size}) failed with a non-OOM error: {e:?}"),
            },
            Op::Free { pick: i } => {
                if let Some(p) = pick(&order, *i) {
                    a.free(p).unwrap_or_else(|e| panic!("free of live {p:#x}: {e}"));
                    live.remove(&p);
                    order.retain(|&q| q != p);
                    freed.push(p);
                }
            }
            Op::DoubleFree { pick: i } => {
                if let Some(p) = pick(&freed, *i) {
                    let before = a.stats();
                    expect_invalid(&a, a.free(p), &before, "double free");
                }
            }
            Op::FreeInterior { pick: i, offset } => {
                if let Some(p) = pick(&order, *i) {
                    let size = live[&p];
                    if size > 1 {
                        let q = p + 1 + offset % (size - 1);
                        let before = a.stats();
                        expect_invalid(&a, a.free(q), &before, "interior free");
                    }
                }
            }
            Op::FreeWild { ptr } => {
                if *ptr != 0 && !live.contains_key(ptr) {
                    let before = a.stats();
                    expect_invalid(&a, a.free(*ptr), &before, "wild free");
                }
            }
            Op::RecordStream { pick: i, stream } => {
                if let Some(p) = pick(&order, *i) {
                    a.record_stream(p, StreamId(*stream)).unwrap_or_else(|e| panic!("record_stream of live {p:#x}: {e}"));
                }
            }
            Op::RecordStreamInvalid { ptr, stream } => {
                if !live.contains_key(ptr) {
                    let before = a.stats();
                    expect_invalid(&a, a.record_stream(*ptr, StreamId(*stream)), &before, "record_stream of a non-allocation");
                }
            }
            Op::CompleteStream { stream } => sim.complete_stream(StreamId(*stream)),
            Op::CompleteAll => sim.complete_all(),
            Op::EmptyCache => a.empty_cache().expect("empty_cache"),
            Op::SetFraction { fraction } => {
                let ok = (0.0..=1.0).contains(fraction);
                match a.set_memory_fraction(*fraction) {
                    Ok(()) => assert!(ok, "fraction {fraction} accepted"),
                    Err(AllocError::InvalidArgument(_)) => assert!(!ok, "fraction {fraction} rejected"),
                    Err(e) => panic!("set_memory_fraction({fraction}): {e:?}"),
                }
            }
            Op::SetSettings { settings } => {
                let before = a.config();
                match a.set_settings(settings) {
                    Ok(()) => {}
                    Err(AllocError::Config(e)) => {
                        assert!(!e.to_string().is_empty());
                        assert_eq!(a.config(), before, "a rejected set_settings changed the config");
                    }
                    Err(e) => panic!("set_settings({settings:?}): {e:?}"),
                }
            }
            Op::Inspect => {
                let stats = a.memory_stats();
                assert_eq!(stats.len(), 122);
                let _ = a.memory_summary(false);
                let snap = a.snapshot();
                snap.validate().expect("snapshot validates");
            }
        }
        check_all(&a, &sim, op);
    }
    sim.set_faults(FaultPlan::default());
    for p in order {
        a.free(p).unwrap_or_else(|e| panic!("final free of {p:#x}: {e}"));
    }
    a.empty_cache().expect("final empty_cache");
    check_all(&a, &sim, &Op::EmptyCache);
    assert_eq!(a.memory_allocated(), 0, "allocated bytes after freeing everything");
    assert_eq!(a.memory_reserved(), 0, "reserved bytes after freeing everything and empty_cache");
    assert_eq!(sim.used(), 0, "device memory still in use after freeing everything and empty_cache");
    assert_eq!(sim.live_events(), 0, "events not destroyed");
}

/// Decodes and runs `data` (the `allocator_ops` target).
pub fn allocator_ops(data: &[u8]) {
    run(&decode(data, 400));
}

/// `data` with the compact header's magic, `file_len` and trailing checksum made right, so that
/// mutations reach the section parser instead of failing the checksum.
pub fn fix_compact(data: &[u8]) -> Vec<u8> {
    let mut v = data.to_vec();
    v[..8].copy_from_slice(cudamem_trace::compact::MAGIC);
    let len = v.len() as u64;
    v[16..24].copy_from_slice(&len.to_le_bytes());
    let n = v.len() - 8;
    let h = cudamem_trace::compact::hash64(&v[..n]);
    v[n..].copy_from_slice(&h.to_le_bytes());
    v
}

/// The `config` target: parse and apply an arbitrary string.
/// * `parse` never panics; a rejection's message is non-empty and names its key (or, for a
///   syntax error without a key, quotes the string);
/// * `apply` on a configured value is atomic: on error the configuration is unchanged;
/// * an accepted string also applies at runtime to an allocator (unless it names another
///   backend), and the allocator still allocates and frees afterwards.
pub fn config(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    match AllocatorConfig::parse(&s) {
        Ok(c) => {
            assert_eq!(c.settings, s, "settings keep the string as given");
            let _ = c.to_settings_map();
            for size in [1u64, 512, 1 << 20, (1 << 20) + 1, 123_456_789, u64::MAX] {
                assert!(c.round_size(size) >= size);
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.is_empty());
            if !e.key().is_empty() {
                assert!(msg.contains(e.key()), "message {msg:?} does not name the key {:?}", e.key());
            }
        }
    }
    let mut base = AllocatorConfig::parse("expandable_segments:True,max_split_size_mb:64").unwrap();
    let before = base.clone();
    let applied = base.apply(&s).is_ok();
    if !applied {
        assert_eq!(base, before, "a failed apply changed the configuration");
    }
    // At runtime, on an allocator with one live allocation.
    let sim = Arc::new(SimDevice::with_capacity(256 << 20));
    let a = CachingAllocator::with_policy(sim.clone(), AllocatorConfig::default(), "pytorch").unwrap();
    let p = a.malloc(3 << 20, StreamId(0)).unwrap();
    let cfg_before = a.config();
    match a.set_settings(&s) {
        Ok(()) => {}
        Err(AllocError::Config(_)) => assert_eq!(a.config(), cfg_before, "a rejected set_settings changed the config"),
        Err(e) => panic!("set_settings: unexpected error {e:?}"),
    }
    let q = a.malloc(5 << 20, StreamId(0)).expect("allocation after set_settings");
    a.free(q).unwrap();
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(sim.used(), 0);
}

/// The `pickle` target: `read_pickle` and `read_bytes` on arbitrary bytes.
pub fn pickle(data: &[u8]) {
    if let Ok(t) = cudamem_trace::read_pickle(data, "fuzz") {
        check_trace(&t, true);
    }
    if let Ok(t) = cudamem_trace::read_bytes(data, "fuzz") {
        let from_pickle = matches!(
            cudamem_trace::detect_format(data),
            Some(cudamem_trace::Format::Pickle | cudamem_trace::Format::Gzip)
        );
        check_trace(&t, from_pickle);
    }
}

/// The `rmm_csv` target: `read_rmm_csv` on arbitrary text (non-UTF-8 bytes go through
/// `read_bytes`, which must reject them with a line number).
pub fn rmm_csv(data: &[u8]) {
    match std::str::from_utf8(data) {
        Ok(text) => {
            if let Ok(t) = cudamem_trace::read_rmm_csv(text, "fuzz") {
                check_trace(&t, false);
            }
        }
        Err(_) => {
            let _ = cudamem_trace::read_bytes(data, "fuzz");
        }
    }
}

/// The `compact` target: `read_compact` on arbitrary bytes, and (for odd last bytes) on the
/// same bytes with a correct header length and checksum patched in, so that mutations get
/// past the checksum to the section parser.
pub fn compact(data: &[u8]) {
    if let Ok(t) = cudamem_trace::read_compact(data, "fuzz") {
        check_trace(&t, false);
    }
    if data.len() >= 32 && data[data.len() - 1] & 1 == 1 {
        let fixed = fix_compact(data);
        if let Ok(t) = cudamem_trace::read_compact(&fixed, "fuzz") {
            check_trace(&t, false);
        }
    }
}

/// A target by name (for `examples/run_inputs.rs`).
pub fn target(name: &str) -> Option<fn(&[u8])> {
    Some(match name {
        "pickle" => pickle,
        "rmm_csv" => rmm_csv,
        "compact" => compact,
        "config" => config,
        "allocator_ops" => allocator_ops,
        _ => return None,
    })
}
