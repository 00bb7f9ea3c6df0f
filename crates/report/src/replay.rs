//! Replaying a trace event by event, keeping what the reports need.
//!
//! [`cudamem_replay::replay`] answers "how much would this job reserve"; it compiles the trace
//! into slots and throws the allocator away at the end. The reports need more: the allocator's
//! final state as a snapshot (with the trace's stacks on its blocks), the block size the
//! allocator gave each allocation, and optionally the allocator's own history. [`run`] drives a
//! [`CachingAllocator`] on a simulated device directly from the trace's events, with the same
//! rules as `cudamem_replay` (see that crate's docs, "How a trace becomes calls"):
//!
//! * `alloc` → `malloc(size, stream)` with the event's stack set as the current stack;
//! * `free_requested` directly followed by its `free_completed` → `free`; otherwise
//!   `record_stream` on a private stream, `free`, and that stream completes at the
//!   `free_completed`;
//! * the first of a run of `segment_free`/`segment_unmap` → `empty_cache()`;
//! * everything else is the recorded allocator's own output and is not replayed.
//!
//! With the `pytorch` policy and the trace's own settings, new segments get the trace's recorded
//! addresses, exactly as `cudamem_replay::replay` does, so the replay reproduces the recorded
//! segment history and its final state matches the trace's own. The statistics at the end and at
//! the reserved peak are therefore the same as `cudamem_replay::replay`'s (a test checks it).
//!
//! With `record_history`, the allocator records its history
//! (`record_memory_history(true, RecordContext::All, usize::MAX)`) and [`snapshot`] returns the
//! replay as a trace of its own: the history as `device_traces`, the final state as `segments`.
//! Its times are the replay's wall clock (the engine's clock cannot be driven from outside
//! `cudamem-alloc`); the viewer's x axis is the event index, so this only shows in tooltips.

use std::collections::HashMap;
use std::sync::Arc;

use cudamem_alloc::{AllocatorConfig, CachingAllocator, DeviceStats, RecordContext};
use cudamem_device::sim::{EventMode, SimConfig, SimDevice, H200_CAPACITY};
use cudamem_device::{Device, StreamId};
use cudamem_replay::{effective_config, settings_string, ReplayOptions, DEFERRED_STREAM_BASE};
use cudamem_trace::{Action, DeviceTrace, StackId, Trace};

/// How to run a trace.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Policy name (`pytorch`, `pytorch-expandable`, `cudamem`).
    pub policy: String,
    /// Settings over the trace's own (`PYTORCH_CUDA_ALLOC_CONF` syntax); `None` = the trace's.
    pub config: Option<String>,
    /// Simulated device memory.
    pub capacity: u64,
    /// Record the allocator's history, so that [`snapshot`] carries `device_traces`.
    pub record_history: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            policy: cudamem_alloc::policy::registry::PYTORCH.into(),
            config: None,
            capacity: H200_CAPACITY,
            record_history: false,
        }
    }
}

/// One device of a [`Run`].
#[derive(Clone, Debug)]
pub struct DeviceRun {
    /// Device ordinal.
    pub device: i32,
    /// For each `alloc` event of the input device trace, in order: the size of the block the
    /// allocator handed out (0 when the allocation failed in the replay or asked for 0 bytes).
    pub block_sizes: Vec<u64>,
    /// Stats at the end.
    pub stats_at_end: DeviceStats,
    /// Stats when reserved memory peaked (captured after each malloc, as `cudamem_replay` does).
    pub stats_at_peak: DeviceStats,
    /// Allocations that failed.
    pub ooms: u64,
    /// The allocator's `snapshot()` at the end (one device; its stack ids index its own `stacks`).
    pub snapshot: Trace,
}

/// A whole trace replayed event by event.
#[derive(Clone, Debug)]
pub struct Run {
    /// The input's name.
    pub trace: String,
    /// Policy used.
    pub policy: String,
    /// Effective settings string.
    pub config: String,
    /// Per device, in the trace's order.
    pub devices: Vec<DeviceRun>,
}

/// Replays every device of `trace` (see the [module docs](self)).
pub fn run(trace: &Trace, opts: &RunOptions) -> Result<Run, String> {
    let ropts = ReplayOptions {
        policy: opts.policy.clone(),
        config: opts.config.clone(),
        capacity: opts.capacity,
        repeats: 0,
        ..ReplayOptions::default()
    };
    let cfg = effective_config(trace, &ropts)?;
    let own = opts.config.as_deref().is_none_or(|s| s.trim().is_empty());
    let plan = own && cudamem_alloc::policy::registry::replays_recorded_decisions(&opts.policy);
    let mut devices = Vec::new();
    for dt in &trace.devices {
        devices.push(run_device(trace, dt, &cfg, opts, plan)?);
    }
    let config = settings_string(&cfg, &opts.policy);
    Ok(Run {
        trace: trace.source.clone(),
        policy: opts.policy.clone(),
        config,
        devices,
    })
}

fn run_device(
    trace: &Trace,
    dt: &DeviceTrace,
    cfg: &AllocatorConfig,
    opts: &RunOptions,
    plan: bool,
) -> Result<DeviceRun, String> {
    let sim = Arc::new(SimDevice::new(SimConfig {
        index: dt.device,
        capacity: opts.capacity,
        event_mode: EventMode::Manual,
        ..SimConfig::default()
    }));
    if plan {
        sim.plan_addresses(
            dt.events
                .iter()
                .filter(|e| e.action == Action::SegmentAlloc)
                .map(|e| e.addr),
        );
    }
    let dev: Arc<dyn Device> = sim.clone();
    let alloc = CachingAllocator::with_policy(dev, cfg.clone(), &opts.policy).map_err(|e| e.to_string())?;
    let mut e = alloc.lock();
    if opts.record_history {
        e.record_memory_history(true, RecordContext::All, usize::MAX);
    }
    let ev = &dt.events;
    let mut live: HashMap<u64, u64> = HashMap::new(); // trace address -> replay address
    let mut pending: HashMap<u64, u64> = HashMap::new(); // trace address -> deferred stream
    let mut next_stream = 0u64;
    let mut block_sizes = Vec::new();
    let mut ooms = 0;
    let mut best = -1i64;
    let mut peak: Option<DeviceStats> = None;
    let mut in_release_run = false;
    let mut cur_stack: Option<StackId> = None;
    let mut set_stack = |e: &mut cudamem_alloc::Engine, s: Option<StackId>| {
        if s != cur_stack {
            cur_stack = s;
            let frames = s
                .and_then(|id| trace.stacks.get(id as usize))
                .map(|st| st.frames.clone());
            e.set_current_stack(frames);
        }
    };
    for (i, ev_i) in ev.iter().enumerate() {
        let is_release = matches!(ev_i.action, Action::SegmentFree | Action::SegmentUnmap);
        if is_release && !in_release_run {
            set_stack(&mut e, None);
            e.empty_cache()
                .map_err(|err| format!("{}: replay: empty_cache: {err}", trace.source))?;
        }
        in_release_run = is_release || (in_release_run && ev_i.action == Action::Snapshot);
        match ev_i.action {
            Action::Alloc => {
                set_stack(&mut e, ev_i.stack);
                let before = e.stats().allocated_bytes.all().current;
                match e.malloc(ev_i.size, StreamId(ev_i.stream)) {
                    Ok(ptr) => {
                        block_sizes.push((e.stats().allocated_bytes.all().current - before).max(0) as u64);
                        live.insert(ev_i.addr, ptr);
                        if e.stats().reserved_bytes.all().current > best {
                            best = e.stats().reserved_bytes.all().current;
                            peak = Some(e.stats());
                        }
                    }
                    Err(err) if err.is_out_of_memory() => {
                        ooms += 1;
                        block_sizes.push(0);
                        live.insert(ev_i.addr, 0);
                    }
                    Err(err) => {
                        return Err(format!(
                            "{}: replay: device failure on a simulated device: {err}",
                            trace.source
                        ))
                    }
                }
            }
            Action::FreeRequested => {
                let Some(ptr) = live.remove(&ev_i.addr) else { continue };
                let immediate = ev
                    .get(i + 1)
                    .is_some_and(|n| n.action == Action::FreeCompleted && n.addr == ev_i.addr);
                let deferred = if immediate {
                    None
                } else {
                    let s = next_stream;
                    next_stream += 1;
                    pending.insert(ev_i.addr, s);
                    Some(s)
                };
                if ptr == 0 {
                    continue; // its allocation failed (or was size 0)
                }
                set_stack(&mut e, ev_i.stack);
                if let Some(s) = deferred {
                    let _ = e.record_stream(ptr, StreamId(DEFERRED_STREAM_BASE + s));
                }
                e.free(ptr)
                    .map_err(|err| format!("{}: replay: free: {err}", trace.source))?;
            }
            Action::FreeCompleted => {
                if let Some(s) = pending.remove(&ev_i.addr) {
                    sim.complete_stream(StreamId(DEFERRED_STREAM_BASE + s));
                }
            }
            _ => {}
        }
    }
    set_stack(&mut e, None);
    let stats = e.stats();
    let snapshot = e.snapshot();
    Ok(DeviceRun {
        device: dt.device,
        block_sizes,
        stats_at_end: stats,
        stats_at_peak: peak.unwrap_or(stats),
        ooms,
        snapshot,
    })
}

/// The replay as one trace: every device's snapshot merged (stacks re-indexed), named
/// `"<source> replayed with <policy>"`, with the replay's settings. With
/// [`RunOptions::record_history`] its `devices` hold the allocator's history.
pub fn snapshot(trace: &Trace, r: &Run) -> Trace {
    let mut out = Trace::new(format!("{} replayed with {}", trace.source, r.policy));
    for d in &r.devices {
        let s = &d.snapshot;
        let off = out.stacks.len() as StackId;
        let map = |id: Option<StackId>| id.map(|i| i + off);
        out.stacks.extend(s.stacks.iter().cloned());
        for dt in &s.devices {
            let mut dt = dt.clone();
            dt.device = d.device;
            for e in &mut dt.events {
                e.stack = map(e.stack);
            }
            out.devices.push(dt);
        }
        for seg in &s.segments {
            let mut seg = seg.clone();
            seg.device = d.device;
            seg.stack = map(seg.stack);
            for b in &mut seg.blocks {
                b.stack = map(b.stack);
            }
            out.segments.push(seg);
        }
        for a in &s.annotations {
            let mut a = a.clone();
            a.device = d.device;
            out.annotations.push(a);
        }
        out.settings = s.settings.clone();
    }
    out.devices.retain(|d| !d.events.is_empty());
    out
}
