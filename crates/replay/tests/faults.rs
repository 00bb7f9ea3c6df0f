//! Fault injection on long replays: every shared trace is replayed with the `pytorch`,
//! `pytorch-expandable` and `cudamem` policies while the simulated GPU's `FaultPlan` makes
//! device `malloc`s, `map`s and event queries fail, at random (several seeds and fractions:
//! 1%, 10%, 50%) and at chosen points (the Nth malloc / map / query), on an H200-sized device
//! and on one just large enough for the trace. After every run:
//!
//! * every invariant holds (`cudamem_alloc::check_engine`, checked every few thousand ops too),
//!   the device's own check passes, and reserved bytes equal the device's used bytes;
//! * the stats add up: live allocations and requested bytes equal what the replay holds,
//!   `num_ooms` equals the out-of-memory errors seen, and (native policy) device allocations
//!   and frees equal the device's counts;
//! * every injected failure surfaced either as a success through the retry path or as a typed
//!   `AllocError::OutOfMemory`: no other error, no panic, and `free`/`record_stream`/
//!   `empty_cache` never fail;
//! * with faults off, freeing everything and `empty_cache` return reserved and the device's used
//!   memory to 0, destroy every event and release every address-space reservation.
//!
//! `replay()` takes no fault plan, so the engine is driven here directly: the trace is compiled
//! with `Program::compile` and its ops are replayed as `run_once` does, skipping the frees of
//! failed allocations. A thin wrapper around the `SimDevice` counts the failures injected.
//! Each test prints its runs and injected failures (`cargo test -- --nocapture` shows them).
//! Debug builds run fewer plans (one seed, H200 capacity only); CI runs `--release`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudamem_alloc::{check_engine, AllocatorConfig, CachingAllocator};
use cudamem_device::sim::{EventMode, FaultOp, FaultPlan, SimConfig, SimDevice, H200_CAPACITY};
use cudamem_device::{Device, DeviceCounters, DeviceError, DevicePtr, EventId, StreamId};
use cudamem_replay::{effective_config, Op, Program, ReplayOptions};

/// Every registered policy: a fault must be survived whichever decides.
const POLICIES: &[&str] = cudamem_alloc::policy::POLICY_NAMES;
/// Private streams for deferred frees, far above real stream handles.
const DEFERRED: u64 = 0xdef0_0000_0000_0000;
/// Invariants are checked every this many ops during a run (and at its end).
const CHECK_EVERY: usize = 1000;

/// A `SimDevice` that counts the failures its fault plan injects, per operation.
#[derive(Debug)]
struct Counting {
    sim: Arc<SimDevice>,
    /// malloc, map, query_event.
    injected: [AtomicU64; 3],
    /// Address-space reservations made and released (expandable segments).
    reservations: [AtomicU64; 2],
}

impl Counting {
    fn count<T>(&self, i: usize, r: Result<T, DeviceError>) -> Result<T, DeviceError> {
        if matches!(r, Err(DeviceError::Injected { .. })) {
            self.injected[i].fetch_add(1, Ordering::Relaxed);
        }
        r
    }
    fn total(&self) -> u64 {
        self.injected.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

impl Device for Counting {
    fn index(&self) -> i32 {
        self.sim.index()
    }
    fn name(&self) -> String {
        self.sim.name()
    }
    fn total_memory(&self) -> u64 {
        self.sim.total_memory()
    }
    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        self.sim.mem_get_info()
    }
    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        self.count(0, self.sim.malloc(size))
    }
    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        self.sim.free(ptr, size)
    }
    fn granularity(&self) -> u64 {
        self.sim.granularity()
    }
    fn reserve(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let r = self.sim.reserve(size);
        if r.is_ok() {
            self.reservations[0].fetch_add(1, Ordering::Relaxed);
        }
        r
    }
    fn release_reservation(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let r = self.sim.release_reservation(ptr, size);
        if r.is_ok() {
            self.reservations[1].fetch_add(1, Ordering::Relaxed);
        }
        r
    }
    fn map(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        self.count(1, self.sim.map(ptr, size))
    }
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        self.sim.unmap(ptr, size)
    }
    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.sim.record_event(stream)
    }
    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        self.count(2, self.sim.query_event(event))
    }
    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError> {
        self.sim.synchronize_event(event)
    }
    fn destroy_event(&self, event: EventId) {
        self.sim.destroy_event(event)
    }
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        self.sim.synchronize_stream(stream)
    }
    fn synchronize(&self) -> Result<(), DeviceError> {
        self.sim.synchronize()
    }
    fn counters(&self) -> DeviceCounters {
        self.sim.counters()
    }
}

/// What one run saw.
#[derive(Default, Debug, Clone, Copy)]
struct Tally {
    runs: u64,
    ops: u64,
    injected: [u64; 3],
    /// Allocations that succeeded although a device call failed during them (retry path).
    recovered: u64,
    /// Allocations that failed with OutOfMemory.
    ooms: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.runs += o.runs;
        self.ops += o.ops;
        for i in 0..3 {
            self.injected[i] += o.injected[i];
        }
        self.recovered += o.recovered;
        self.ooms += o.ooms;
    }
    fn injected_total(&self) -> u64 {
        self.injected.iter().sum()
    }
}

/// Replays `p` once on a fresh device of `capacity` bytes with `plan`; checks everything the
/// module documentation lists. `what` names the run in messages.
fn run(p: &Program, cfg: &AllocatorConfig, policy: &str, capacity: u64, plan: FaultPlan, what: &str) -> Tally {
    let sim = Arc::new(SimDevice::new(SimConfig {
        index: p.device,
        capacity,
        event_mode: EventMode::Manual,
        ..SimConfig::default()
    }));
    let dev = Arc::new(Counting {
        sim: sim.clone(),
        injected: Default::default(),
        reservations: Default::default(),
    });
    let a = CachingAllocator::with_policy(dev.clone(), cfg.clone(), policy).unwrap();
    sim.set_faults(plan);
    let mut t = Tally {
        runs: 1,
        ..Tally::default()
    };
    // Per slot: (address, requested size); 0 = not live.
    let mut slots = vec![(0u64, 0u64); p.slots as usize];
    let (mut live, mut live_bytes, mut mallocs) = (0i64, 0i64, 0i64);
    {
        let mut e = a.lock();
        for (i, op) in p.ops.iter().enumerate() {
            match *op {
                Op::Malloc { size, stream, slot, .. } => {
                    let before = dev.total();
                    match e.malloc(size, StreamId(stream)) {
                        Ok(0) => assert_eq!(size, 0, "{what}: null pointer"),
                        Ok(ptr) => {
                            slots[slot as usize] = (ptr, size);
                            live += 1;
                            live_bytes += size as i64;
                            mallocs += 1;
                            if dev.total() > before {
                                t.recovered += 1;
                            }
                        }
                        Err(err) if err.is_out_of_memory() => t.ooms += 1,
                        Err(err) => panic!("{what}: op {i}: malloc({size}) failed with a non-OOM error: {err:?}"),
                    }
                }
                Op::Free { slot, deferred } => {
                    let (ptr, size) = std::mem::take(&mut slots[slot as usize]);
                    if ptr == 0 {
                        continue; // its allocation failed (or was of size 0)
                    }
                    if let Some(s) = deferred {
                        e.record_stream(ptr, StreamId(DEFERRED + s as u64))
                            .unwrap_or_else(|err| panic!("{what}: op {i}: record_stream: {err}"));
                    }
                    e.free(ptr).unwrap_or_else(|err| panic!("{what}: op {i}: free: {err}"));
                    live -= 1;
                    live_bytes -= size as i64;
                }
                Op::Complete { stream } => sim.complete_stream(StreamId(DEFERRED + stream as u64)),
                Op::EmptyCache => e
                    .empty_cache()
                    .unwrap_or_else(|err| panic!("{what}: op {i}: empty_cache: {err}")),
            }
            if i % CHECK_EVERY == CHECK_EVERY - 1 {
                check_engine(&e).unwrap_or_else(|err| panic!("{what}: after op {i}: {err}"));
            }
        }
        t.ops = p.ops.len() as u64;
        check_engine(&e).unwrap_or_else(|err| panic!("{what}: at the end: {err}"));
        let s = e.stats();
        assert_eq!(s.num_ooms as u64, t.ooms, "{what}: num_ooms");
        assert_eq!(s.allocation.all().current, live, "{what}: live allocations");
        assert_eq!(s.allocation.all().allocated, mallocs, "{what}: allocations made");
        let pending = pending_requested(&mut e);
        let s = e.stats();
        assert_eq!(
            s.requested_bytes.all().current - pending,
            live_bytes,
            "{what}: requested bytes"
        );
        if policy == "pytorch" {
            let c = sim.counters();
            assert_eq!(s.num_device_alloc as u64, c.mallocs, "{what}: device allocations");
            assert_eq!(s.num_device_free as u64, c.frees, "{what}: device frees");
        }
    }
    sim.check().unwrap_or_else(|err| panic!("{what}: device: {err}"));
    assert_eq!(a.memory_reserved(), sim.used(), "{what}: reserved vs device used");
    t.injected = [0, 1, 2].map(|i| dev.injected[i].load(Ordering::Relaxed));

    // Faults off: free what is live, release the cache: every byte and event goes back.
    sim.set_faults(FaultPlan::default());
    for (ptr, _) in slots {
        if ptr != 0 {
            a.free(ptr).unwrap_or_else(|err| panic!("{what}: final free: {err}"));
        }
    }
    a.empty_cache().unwrap();
    a.check_invariants()
        .unwrap_or_else(|err| panic!("{what}: after draining: {err}"));
    let s = a.stats();
    assert_eq!(
        (s.allocation.all().current, s.active.all().current),
        (0, 0),
        "{what}: blocks left"
    );
    assert_eq!(a.memory_reserved(), 0, "{what}: reserved after draining");
    assert_eq!(sim.used(), 0, "{what}: device memory after draining");
    assert_eq!(sim.live_events(), 0, "{what}: events after draining");
    let (made, released) = (
        dev.reservations[0].load(Ordering::Relaxed),
        dev.reservations[1].load(Ordering::Relaxed),
    );
    // Address space too (an expandable segment whose first growth failed kept its reservation
    // until commit 44c526c).
    assert_eq!(made, released, "{what}: address-space reservations left after draining");
    t
}

/// Requested bytes of blocks freed but still waiting for their events: they stay `active`
/// (and in `requested_bytes`) until the events complete.
fn pending_requested(e: &mut cudamem_alloc::Engine) -> i64 {
    e.snapshot()
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == cudamem_trace::BlockState::ActivePendingFree)
        .map(|b| b.requested_size as i64)
        .sum()
}

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(name)
}

/// The fault plans of a run set: random ones (fractions × seeds) and chosen points.
/// Named fault plans.
type Plans = Vec<(String, FaultPlan)>;

fn plans() -> (Plans, Plans) {
    let all = [FaultOp::Malloc, FaultOp::Map, FaultOp::QueryEvent];
    let seeds: &[u64] = if cfg!(debug_assertions) {
        &[1]
    } else {
        &[1, 0x5eed, 42, 0xfa17]
    };
    let mut random = Vec::new();
    for &f in &[0.01, 0.10, 0.50] {
        for &seed in seeds {
            random.push((
                format!("random {:.0}% seed {seed:#x}", f * 100.0),
                FaultPlan::default().fail_fraction(&all, f, seed),
            ));
        }
    }
    let mut nth = Vec::new();
    for (op, name, ns) in [
        (FaultOp::Malloc, "malloc", &[1u64, 2, 7, 50][..]),
        (FaultOp::Map, "map", &[1, 3, 20][..]),
        (FaultOp::QueryEvent, "query", &[1, 10][..]),
    ] {
        for &n in ns {
            nth.push((format!("{name} #{n}"), FaultPlan::default().fail_nth(op, n)));
        }
    }
    // Several chosen points at once, of every kind.
    let mut many = FaultPlan::default();
    for n in [1u64, 2, 3, 5, 8, 13, 21, 34, 55, 89] {
        many = many
            .fail_nth(FaultOp::Malloc, n)
            .fail_nth(FaultOp::Map, n)
            .fail_nth(FaultOp::QueryEvent, n);
    }
    nth.push(("malloc/map/query #1,2,3,5,...,89".into(), many));
    (random, nth)
}

fn fault_runs(name: &str) {
    let trace = cudamem_trace::read_path(&data(&format!("{name}.pickle.gz"))).unwrap();
    let (random, nth) = plans();
    let mut total = Tally::default();
    for &policy in POLICIES {
        let opts = ReplayOptions {
            policy: policy.into(),
            repeats: 0,
            ..ReplayOptions::default()
        };
        let cfg = effective_config(&trace, &opts).unwrap();
        for dt in &trace.devices {
            let p = Program::compile(dt);
            // Just large enough for the trace as recorded (plus a little): OOMs come from the
            // device too, not only from the fault plan.
            let tight = (p.trace_peak_reserved + (64 << 20)).div_ceil(20 << 20) * (20 << 20);
            let caps: &[(&str, u64)] = if cfg!(debug_assertions) {
                &[("H200", H200_CAPACITY)]
            } else {
                &[("H200", H200_CAPACITY), ("tight", tight)]
            };
            let mut tally = Tally::default();
            for (cap_name, cap) in caps {
                for (plan_name, plan) in &random {
                    let what = format!("{name} dev{} {policy} {cap_name} {plan_name}", p.device);
                    tally.add(&run(&p, &cfg, policy, *cap, plan.clone(), &what));
                }
            }
            for (plan_name, plan) in &nth {
                let what = format!("{name} dev{} {policy} H200 {plan_name}", p.device);
                tally.add(&run(&p, &cfg, policy, H200_CAPACITY, plan.clone(), &what));
            }
            println!(
                "faults: {name} dev{} {policy:<18}: {} runs, {} ops, injected malloc {} map {} query {} \
                 (total {}), {} allocations recovered by the retry path, {} typed OOMs",
                p.device,
                tally.runs,
                tally.ops,
                tally.injected[0],
                tally.injected[1],
                tally.injected[2],
                tally.injected_total(),
                tally.recovered,
                tally.ooms
            );
            assert!(tally.injected_total() > 0, "{name} {policy}: no fault was injected");
            total.add(&tally);
        }
    }
    println!(
        "faults: {name} total: {} runs, {} ops replayed, {} failures injected, {} recovered, {} OOMs",
        total.runs,
        total.ops,
        total.injected_total(),
        total.recovered,
        total.ooms
    );
}

#[test]
fn seed_example_survives_injected_faults() {
    fault_runs("seed_example");
}

#[test]
fn resnet50_train_survives_injected_faults() {
    fault_runs("resnet50_train");
}

#[test]
fn gpt2_train_survives_injected_faults() {
    fault_runs("gpt2_train");
}

#[test]
fn multistream_prefetch_survives_injected_faults() {
    fault_runs("multistream_prefetch");
}

#[test]
fn bert_varlen_infer_survives_injected_faults() {
    fault_runs("bert_varlen_infer");
}
