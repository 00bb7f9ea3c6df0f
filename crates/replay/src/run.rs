//! Running a [`Program`] on a simulated device, timing it, and searching the smallest capacity.

use cudamem_alloc::config::Backend;
use cudamem_alloc::policy::registry;
use cudamem_alloc::{AllocatorConfig, DeviceStats};
use cudamem_device::sim::{SimConfig, SimDevice, H200_CAPACITY};
use cudamem_device::{Device, DeviceCounters};

use cudamem_trace::Trace;

use crate::options::ReplayOptions;
use crate::pass::{free_leftovers, run_once};
use crate::program::{Op, Program};
use crate::target::new_allocator;

/// What the replay of one device found.
#[derive(Clone, Debug)]
pub struct DeviceResult {
    /// Device ordinal.
    pub device: i32,
    /// Trace operations replayed (allocs and frees).
    pub ops: u64,
    /// Peak of live requested bytes.
    pub peak_requested_bytes: u64,
    /// Peak of allocated (rounded) bytes.
    pub peak_allocated_bytes: u64,
    /// Peak of reserved bytes.
    pub peak_reserved_bytes: u64,
    /// Device allocations (segment mallocs and expandable maps), as `num_device_alloc`.
    pub device_allocs: u64,
    /// Device frees (segment frees and unmaps), as `num_device_free`.
    pub device_frees: u64,
    /// Driver-level calls counted by the simulated device.
    pub device_calls: DeviceCounters,
    /// Allocations that failed.
    pub ooms: u64,
    /// Allocations that needed the release-all retry.
    pub alloc_retries: u64,
    /// Median ns per op over the timed runs (load and compile excluded).
    pub replay_ns_per_op: f64,
    /// Stats when reserved memory peaked.
    pub stats_at_peak: DeviceStats,
    /// Stats at the end.
    pub stats_at_end: DeviceStats,
    /// Peak reserved bytes as the trace's own segment entries record it.
    pub trace_peak_reserved_bytes: u64,
    /// Device allocations as the trace records them.
    pub trace_device_allocs: u64,
    /// `oom` entries in the trace.
    pub trace_ooms: u64,
    /// Allocations of an address the trace had allocated and not freed (a lost free): the
    /// replay keeps the earlier allocation live to the end.
    pub double_allocs: crate::DoubleAllocs,
    /// Frees of an address the trace never allocated (an allocation made before recording
    /// started, or a lost event). The replay skips them; they are counted in `ops`.
    pub unmatched_frees: u64,
}

/// The replay of a whole trace.
#[derive(Clone, Debug)]
pub struct ReplayResult {
    /// The trace's name.
    pub trace: String,
    /// Policy replayed.
    pub policy: String,
    /// Effective settings string.
    pub config: String,
    /// Simulated capacity per device.
    pub capacity: u64,
    /// Per device.
    pub devices: Vec<DeviceResult>,
}

impl ReplayResult {
    /// Sum of a count over devices.
    pub fn total(&self, f: impl Fn(&DeviceResult) -> u64) -> u64 {
        self.devices.iter().map(f).sum()
    }
    /// Largest per-device value (peaks: each device is its own GPU).
    pub fn max(&self, f: impl Fn(&DeviceResult) -> u64) -> u64 {
        self.devices.iter().map(f).max().unwrap_or(0)
    }
}

/// The configuration a replay uses: the trace's settings, then `opts.config` over them.
pub fn effective_config(trace: &Trace, opts: &ReplayOptions) -> Result<AllocatorConfig, String> {
    let mut cfg = AllocatorConfig::parse(&trace.settings.conf)
        .map_err(|e| format!("{}: the trace's allocator settings: {e}", trace.source))?;
    if trace.settings.expandable_segments {
        cfg.expandable_segments = true;
    }
    if let Some(s) = opts.config.as_deref().filter(|s| !s.trim().is_empty()) {
        check_replay_config(s, &opts.policy)?;
        cfg.apply(s).map_err(|e| format!("--config: {e}"))?;
    }
    Ok(cfg)
}

/// Refuses the keys of a replay's `--config` that the replay cannot honour as written, with
/// what to do instead: `backend:cudaMallocAsync` (a replay runs the caching allocator; the
/// stream-ordered allocator has no cache to replay), and a `policy:` key that names no policy
/// or another policy than the one replayed (one replay runs one policy, named once). The
/// string is read as at process start, since each replay starts a fresh allocator.
fn check_replay_config(s: &str, policy: &str) -> Result<(), String> {
    let own = AllocatorConfig::parse(s).map_err(|e| format!("--config: {e}"))?;
    if own.backend != Backend::Native {
        return Err(format!(
            "--config: backend:{}: a replay runs PyTorch's caching allocator (backend:native); \
             CUDA's stream-ordered allocator keeps no cache to replay, so leave the backend key out",
            own.backend
        ));
    }
    if let Some(p) = own.policy.as_deref() {
        if registry::entry(p).is_none() {
            return Err(format!(
                "--config: policy:{p}: unknown policy (known: {})",
                registry::POLICY_NAMES.join(", ")
            ));
        }
        if p != policy {
            return Err(format!(
                "--config names policy '{p}' but the replay runs policy '{policy}' (--policy): \
                 name the policy once, with --policy or with the policy key"
            ));
        }
    }
    Ok(())
}

/// Pools the policies keep per stream (small and large); each may hold one expandable segment.
const POOLS_PER_STREAM: u64 = 2;
/// Room per reservation for the engine's rounding of a reservation up to its page size.
const PAGE_SLACK: u64 = 64 << 20;

/// The ranges of address space a replay of `p` on a simulated device of `capacity` bytes may
/// hold at once: the device's memory for plain segments, and for each (stream, pool) the trace
/// allocates on one expandable segment, for which the engine reserves 1 1/8 of the device's
/// memory. `None` when a size does not fit in 64 bits.
fn address_space_needed(p: &Program, capacity: u64) -> Option<Vec<u64>> {
    let mut streams: Vec<u64> = p
        .ops
        .iter()
        .filter_map(|op| match *op {
            Op::Malloc { stream, .. } => Some(stream),
            _ => None,
        })
        .collect();
    streams.sort_unstable();
    streams.dedup();
    let expandable = capacity.checked_add(capacity / 8)?.checked_add(PAGE_SLACK)?;
    let n = (streams.len() as u64).max(1) * POOLS_PER_STREAM;
    let mut v = vec![capacity];
    v.extend(std::iter::repeat_n(expandable, n as usize));
    Some(v)
}

/// Whether a fresh simulated device of `capacity` bytes can reserve every range of
/// [`address_space_needed`] at once (asked of the device itself, so the answer follows its
/// address-space size).
fn sim_address_space_fits(p: &Program, capacity: u64) -> bool {
    let Some(ranges) = address_space_needed(p, capacity) else {
        return false;
    };
    let sim = SimDevice::new(SimConfig {
        index: p.device,
        capacity,
        ..SimConfig::default()
    });
    let g = sim.granularity();
    ranges.into_iter().all(|r| match r.checked_next_multiple_of(g) {
        Some(size) => sim.reserve(size).is_ok(),
        None => false,
    })
}

/// Refuses, before anything is replayed, a simulated capacity the simulated device cannot
/// serve: every range of `address_space_needed` must fit in its address space. The message
/// names the largest capacity (to 1 GiB) that this trace's device can be replayed with.
pub fn check_sim_capacity(p: &Program, capacity: u64) -> Result<(), String> {
    if sim_address_space_fits(p, capacity) {
        return Ok(());
    }
    const GIB: u64 = 1 << 30;
    let (mut lo, mut hi) = (0u64, capacity / GIB + 1); // lo GiB fits (or is 0), hi GiB does not
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if sim_address_space_fits(p, mid * GIB) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let tib = |b: u64| b as f64 / (1u64 << 40) as f64;
    Err(format!(
        "the simulated GPU cannot serve a capacity of {:.2} TiB ({capacity} bytes) for this trace: its \
         address space must hold the memory plus one expandable segment (1 1/8 of the memory) per pool and \
         stream the trace uses; the largest capacity it serves for device {} of this trace is {:.2} TiB ({} bytes)",
        tib(capacity),
        p.device,
        tib(lo * GIB),
        lo * GIB,
    ))
}

/// Replays one compiled device trace.
pub fn replay_device(
    p: &Program,
    cfg: &AllocatorConfig,
    opts: &ReplayOptions,
    trace_own_settings: bool,
) -> Result<DeviceResult, String> {
    let mut p = p.clone();
    p.deferred_frees = opts.deferred_frees;
    let p = &p;
    if opts.device == "sim" {
        check_sim_capacity(p, opts.capacity)?;
    }
    let plan = opts.device == "sim"
        && opts
            .plan_addresses
            .unwrap_or(trace_own_settings && cudamem_alloc::policy::registry::replays_recorded_decisions(&opts.policy));
    let mut slots = vec![0u64; p.slots as usize];
    let (target, alloc) = new_allocator(p, cfg, opts, plan)?;
    let (ns, ooms, peak) = {
        let mut e = alloc.lock();
        run_once(p, &mut e, &target, &mut slots, true)
    };
    let stats = alloc.stats();
    let counters = target.device().counters();
    let mut times = vec![ns];
    for _ in 0..opts.repeats {
        if opts.warm {
            let mut e = alloc.lock();
            free_leftovers(&mut e, &target, &mut slots);
            times.push(run_once(p, &mut e, &target, &mut slots, false).0);
        } else {
            let (t2, a2) = new_allocator(p, cfg, opts, plan)?;
            let mut e = a2.lock();
            times.push(run_once(p, &mut e, &t2, &mut slots, false).0);
            free_leftovers(&mut e, &t2, &mut slots);
            let _ = e.empty_cache();
        }
    }
    if opts.warm && times.len() > 1 {
        times.remove(0); // the cold first pass is not a warm figure
    }
    {
        let mut e = alloc.lock();
        free_leftovers(&mut e, &target, &mut slots);
        let _ = e.empty_cache(); // give a real GPU its memory back
    }
    times.sort_unstable();
    let median = times[times.len() / 2];
    let ops = (p.trace_ops).max(1);
    Ok(DeviceResult {
        device: p.device,
        ops: p.trace_ops,
        peak_requested_bytes: stats.requested_bytes.all().peak as u64,
        peak_allocated_bytes: stats.allocated_bytes.all().peak as u64,
        peak_reserved_bytes: stats.reserved_bytes.all().peak as u64,
        device_allocs: stats.num_device_alloc as u64,
        device_frees: stats.num_device_free as u64,
        device_calls: counters,
        ooms,
        alloc_retries: stats.num_alloc_retries as u64,
        replay_ns_per_op: median as f64 / ops as f64,
        stats_at_peak: peak.unwrap_or(stats),
        stats_at_end: stats,
        trace_peak_reserved_bytes: p.trace_peak_reserved,
        trace_device_allocs: p.trace_device_allocs,
        trace_ooms: p.trace_ooms,
        unmatched_frees: p.unmatched_frees,
        double_allocs: p.double_allocs,
    })
}

/// The settings a replay ran with, as a `PYTORCH_CUDA_ALLOC_CONF` string (the policy name
/// `pytorch-expandable` implies `expandable_segments:True`).
pub fn settings_string(cfg: &AllocatorConfig, policy: &str) -> String {
    cudamem_alloc::policy::registry::with_implied_settings(&cfg.settings, policy)
}

/// Replays every device of a trace.
pub fn replay(trace: &Trace, opts: &ReplayOptions) -> Result<ReplayResult, String> {
    let cfg = effective_config(trace, opts)?;
    let own = opts.config.as_deref().is_none_or(|s| s.trim().is_empty());
    let mut devices = Vec::new();
    let shrinking = shrinking_stacks(trace, &opts.shrink_on_oom);
    for dt in &trace.devices {
        let mut p = Program::compile(dt);
        p.mark_shrinking(&shrinking);
        devices.push(replay_device(&p, &cfg, opts, own)?);
    }
    let config = settings_string(&cfg, &opts.policy);
    Ok(ReplayResult {
        trace: trace.source.clone(),
        policy: opts.policy.clone(),
        config,
        capacity: opts.capacity,
        devices,
    })
}

/// The stacks of `trace` whose innermost frame is named one of `names`.
fn shrinking_stacks(trace: &Trace, names: &[String]) -> Vec<cudamem_trace::StackId> {
    if names.is_empty() {
        return Vec::new();
    }
    (0..trace.stacks.len())
        .filter(|&i| trace.stacks[i].frames.first().is_some_and(|f| names.contains(&f.name)))
        .map(|i| i as cudamem_trace::StackId)
        .collect()
}

/// The smallest capacity (a multiple of 2 MiB) on which every device of the trace replays
/// without an out-of-memory error, found by bisection between the peak requested bytes and the
/// peak reserved on an H200. Assumes more memory never hurts, which holds for these policies
/// except in contrived cases; the answer is re-verified by a final replay.
pub fn fit(trace: &Trace, opts: &ReplayOptions) -> Result<u64, String> {
    const STEP: u64 = 2 << 20;
    if opts.device != "sim" {
        return Err("fit searches capacities of the simulated GPU: use --device sim".into());
    }
    let base = ReplayOptions {
        repeats: 0,
        capacity: H200_CAPACITY,
        plan_addresses: Some(false),
        ..opts.clone()
    };
    let full = replay(trace, &base)?;
    if full.total(|d| d.ooms) > 0 {
        return Err(format!("{} does not fit even in {} bytes", trace.source, H200_CAPACITY));
    }
    let ok = |cap: u64| -> Result<bool, String> {
        let r = replay(
            trace,
            &ReplayOptions {
                capacity: cap,
                ..base.clone()
            },
        )?;
        Ok(r.total(|d| d.ooms) == 0)
    };
    let mut lo = full.max(|d| d.peak_requested_bytes) / STEP; // lo*STEP: assumed too small
    let mut hi = full.max(|d| d.peak_reserved_bytes).div_ceil(STEP); // hi*STEP fits
    if lo >= hi {
        lo = hi.saturating_sub(1);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ok(mid * STEP)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi * STEP)
}
