//! Replaying a trace, keeping what the reports need.
//!
//! [`cudamem_replay::replay`] answers "how much would this job reserve" and throws the allocator
//! away at the end. The reports need more: the allocator's final state as a snapshot (with the
//! trace's stacks on its blocks), the block size the allocator gave each allocation, and
//! optionally the allocator's own history. [`run`] replays the trace with the replay crate's own
//! compiler and loop ([`Program::compile`], [`run_observed`]: the rules of "How a trace becomes
//! calls" in that crate's docs), on a simulated device, with an observer that makes each
//! allocation's and free's stack current (the program keeps each op's stack) and notes each
//! block's size.
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

use cudamem_alloc::{AllocatorConfig, DeviceStats, Engine, RecordContext};
use cudamem_device::sim::H200_CAPACITY;
use cudamem_replay::{
    effective_config, new_allocator, run_observed, settings_string, Observer, Op, Program, ReplayOptions,
};
use cudamem_trace::{DeviceTrace, StackId, Trace};

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
    let p = Program::compile(dt);
    let ropts = ReplayOptions {
        policy: opts.policy.clone(),
        capacity: opts.capacity,
        ..ReplayOptions::default()
    };
    let (target, alloc) = new_allocator(&p, cfg, &ropts, plan)?;
    let mut e = alloc.lock();
    if opts.record_history {
        e.record_memory_history(true, RecordContext::All, usize::MAX);
    }
    let mut slots = vec![0u64; p.slots as usize];
    let mut obs = Recorder {
        trace,
        program: &p,
        stack: None,
        allocated_before: 0,
        block_sizes: Vec::new(),
    };
    let (_, ooms, peak) = run_observed(&p, &mut e, &target, &mut slots, true, &mut obs);
    obs.set_stack(&mut e, None);
    let block_sizes = obs.block_sizes;
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

/// What the reports keep of a pass: each op's stack made the engine's current one (so that the
/// history and the snapshot carry the trace's stacks), and each allocation's block size.
struct Recorder<'a> {
    trace: &'a Trace,
    program: &'a Program,
    /// The stack last made current.
    stack: Option<StackId>,
    /// `allocated_bytes` before the `Malloc` running.
    allocated_before: i64,
    block_sizes: Vec<u64>,
}

impl Recorder<'_> {
    fn set_stack(&mut self, e: &mut Engine, s: Option<StackId>) {
        if s != self.stack {
            self.stack = s;
            let frames = s
                .and_then(|id| self.trace.stacks.get(id as usize))
                .map(|st| st.frames.clone());
            e.set_current_stack(frames);
        }
    }
}

impl Observer for Recorder<'_> {
    fn before(&mut self, i: usize, e: &mut Engine) {
        match self.program.ops[i] {
            Op::EmptyCache => self.set_stack(e, None),
            Op::Malloc { .. } => {
                self.set_stack(e, self.program.op_stacks[i]);
                self.allocated_before = e.stats().allocated_bytes.all().current;
            }
            Op::Free { .. } => self.set_stack(e, self.program.op_stacks[i]),
            Op::Complete { .. } => {}
        }
    }

    fn after_malloc(&mut self, _i: usize, e: &Engine, ptr: Option<u64>) {
        let size = match ptr {
            Some(_) => (e.stats().allocated_bytes.all().current - self.allocated_before).max(0) as u64,
            None => 0,
        };
        self.block_sizes.push(size);
    }
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
