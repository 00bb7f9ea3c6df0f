//! `cudamem replay`: one trace, one policy, its peaks, counts and `memory_summary()` at the
//! peak, or one JSON object (`--json`, whose shape `compare --json` shares).

use cudamem_alloc::size::human;
use cudamem_alloc::summary::memory_summary;
use cudamem_replay::{DoubleAllocs, Program, ReplayOptions, ReplayResult};
use cudamem_trace::Trace;
use indicatif::ProgressBar;
use serde_json::{json, Value};

use crate::{load, CliResult};

/// The replay JSON object (sizes in bytes; peaks are the largest over devices).
pub(crate) fn to_json(r: &ReplayResult) -> Value {
    let dev: Vec<Value> = r
        .devices
        .iter()
        .map(|d| {
            json!({
                "device": d.device, "ops": d.ops,
                "peak_requested_bytes": d.peak_requested_bytes,
                "peak_allocated_bytes": d.peak_allocated_bytes,
                "peak_reserved_bytes": d.peak_reserved_bytes,
                "device_allocs": d.device_allocs, "device_frees": d.device_frees,
                "device_maps": d.device_calls.maps, "device_unmaps": d.device_calls.unmaps,
                "ooms": d.ooms, "alloc_retries": d.alloc_retries,
                "replay_ns_per_op": d.replay_ns_per_op,
                "trace_peak_reserved_bytes": d.trace_peak_reserved_bytes,
                "trace_device_allocs": d.trace_device_allocs,
                "trace_ooms": d.trace_ooms,
                "unmatched_frees": d.unmatched_frees,
            })
        })
        .collect();
    let ops = r.total(|d| d.ops);
    let ns = if ops == 0 {
        0.0
    } else {
        r.devices.iter().map(|d| d.replay_ns_per_op * d.ops as f64).sum::<f64>() / ops as f64
    };
    let peak_req = r.max(|d| d.peak_requested_bytes);
    let peak_res = r.max(|d| d.peak_reserved_bytes);
    json!({
        "trace": r.trace, "policy": r.policy, "config": r.config, "capacity": r.capacity,
        "ops": ops,
        "peak_requested_bytes": peak_req,
        "peak_allocated_bytes": r.max(|d| d.peak_allocated_bytes),
        "peak_reserved_bytes": peak_res,
        "reserved_over_requested": if peak_req == 0 { 0.0 } else { peak_res as f64 / peak_req as f64 },
        "device_allocs": r.total(|d| d.device_allocs),
        "device_frees": r.total(|d| d.device_frees),
        "device_maps": r.total(|d| d.device_calls.maps),
        "device_unmaps": r.total(|d| d.device_calls.unmaps),
        "ooms": r.total(|d| d.ooms),
        "alloc_retries": r.total(|d| d.alloc_retries),
        "unmatched_frees": r.total(|d| d.unmatched_frees),
        "replay_ns_per_op": ns,
        "devices": dev,
    })
}

/// The options of `cudamem replay`.
pub(crate) struct ReplayArgs {
    pub(crate) policy: Option<String>,
    pub(crate) config: Option<String>,
    pub(crate) capacity: Option<u64>,
    pub(crate) repeats: usize,
    pub(crate) device: String,
    pub(crate) warm: bool,
    pub(crate) placement: Option<cudamem_device::sim::Placement>,
}

/// `--device` read by the library's device-string parser (the one the Rust API and the Python
/// package use), as the replay's device (`sim` or `cuda:N`) and the simulated capacity it
/// names, if any (`sim:8GiB`). `auto` is `cuda:0` when a CUDA device is present, else `sim`.
fn device(spec: &str, capacity: Option<u64>) -> Result<(String, Option<u64>), String> {
    use cudamem::DeviceSpec;
    let parsed = DeviceSpec::parse(spec).map_err(|e| format!("--device: {e}"))?;
    let real = |i: i32| {
        if capacity.is_some() {
            return Err("--capacity sizes the simulated GPU; a real device has the memory it has".to_string());
        }
        Ok((format!("cuda:{i}"), None))
    };
    match parsed {
        DeviceSpec::Sim { capacity: None } => Ok(("sim".into(), capacity)),
        DeviceSpec::Sim { capacity: Some(c) } if capacity.is_none() => {
            let c = cudamem_estimate::check_capacity(spec.trim(), c)?;
            Ok(("sim".into(), Some(c)))
        }
        DeviceSpec::Sim { .. } => Err(format!(
            "--device {spec} and --capacity both size the simulated GPU: give the capacity once"
        )),
        DeviceSpec::Cuda(i) => real(i),
        DeviceSpec::Auto if cudamem_cuda::is_available() => real(0),
        DeviceSpec::Auto => Ok(("sim".into(), capacity)),
    }
}

pub(crate) fn run(path: &std::path::Path, a: ReplayArgs, json: bool) -> CliResult {
    let pols = crate::chosen_policies(
        a.policy.as_deref(),
        a.config.as_deref(),
        cudamem_alloc::policy::registry::DEFAULT,
    )?;
    if pols.len() > 1 {
        return Err(format!(
            "replay takes one policy, not '{}' (compare replays several)",
            pols.join(",")
        )
        .into());
    }
    let (dev, capacity) = device(&a.device, a.capacity)?;
    if dev != "sim" && a.placement.is_some() {
        return Err("--placement places segments on the simulated GPU; a real device's driver places them".into());
    }
    // A spinner on stderr while loading and replaying; hidden with --json, and by indicatif when
    // stderr is not a terminal. It only draws after a second, so quick runs print nothing.
    let spinner = if json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    let started = std::time::Instant::now();
    let tick = |msg: &str| {
        if started.elapsed().as_secs_f64() > 1.0 {
            spinner.enable_steady_tick(std::time::Duration::from_millis(120));
        }
        spinner.set_message(msg.to_string());
    };
    tick(&format!("loading {}", path.display()));
    let trace = load(path)?;
    tick(&format!("replaying {} ({} events)", path.display(), trace.num_events()));
    let opts = ReplayOptions {
        policy: pols[0].clone(),
        config: a.config,
        capacity: capacity.unwrap_or(cudamem_device::sim::H200_CAPACITY),
        repeats: a.repeats,
        plan_addresses: a.placement.map(|_| false),
        placement: a.placement.unwrap_or_default(),
        shrink_on_oom: Vec::new(),
        deferred_frees: dev == "sim",
        device: dev,
        warm: a.warm,
    };
    let r = cudamem_replay::replay(&trace, &opts);
    spinner.finish_and_clear();
    let r = r?;
    warn_trace_issues(&r.trace, &faults_of(&r));
    if json {
        outln!("{}", to_json(&r));
        return Ok(());
    }
    outln!("trace    {}", r.trace);
    outln!(
        "policy   {}   config '{}'   capacity {}",
        r.policy,
        r.config,
        human(r.capacity)
    );
    for d in &r.devices {
        outln!("\ndevice {}: {} ops, {:.1} ns/op", d.device, d.ops, d.replay_ns_per_op);
        outln!(
            "  peak requested {}   peak allocated {}   peak reserved {}   (reserved/requested {:.3})",
            human(d.peak_requested_bytes),
            human(d.peak_allocated_bytes),
            human(d.peak_reserved_bytes),
            d.peak_reserved_bytes as f64 / d.peak_requested_bytes.max(1) as f64
        );
        outln!(
            "  device allocs {}   frees {}   maps {}   unmaps {}   OOMs {}   retries {}",
            d.device_allocs,
            d.device_frees,
            d.device_calls.maps,
            d.device_calls.unmaps,
            d.ooms,
            d.alloc_retries
        );
        outln!(
            "  as recorded: peak reserved {}   device allocs {}   OOMs {}",
            human(d.trace_peak_reserved_bytes),
            d.trace_device_allocs,
            d.trace_ooms
        );
        outln!("\nmemory_summary() when reserved memory peaked:");
        let dict = d.stats_at_peak.to_dict();
        out!("{}", memory_summary(&dict, d.device, false));
        if let Some(note) = cudamem_report::summary_note(&dict) {
            outln!("{note}");
        }
    }
    Ok(())
}

/// What a trace itself gets wrong on one device: frees of addresses it never allocated, and
/// addresses allocated again while live. It is the same under every policy.
pub(crate) struct TraceFaults {
    pub device: i32,
    pub unmatched_frees: u64,
    pub double_allocs: DoubleAllocs,
}

/// The faults a replay found.
pub(crate) fn faults_of(r: &ReplayResult) -> Vec<TraceFaults> {
    r.devices
        .iter()
        .map(|d| TraceFaults {
            device: d.device,
            unmatched_frees: d.unmatched_frees,
            double_allocs: d.double_allocs,
        })
        .collect()
}

/// The faults of a trace without replaying it: each device's events compiled as a replay
/// compiles them (linear in the events, no allocator).
pub(crate) fn faults_of_trace(t: &Trace) -> Vec<TraceFaults> {
    t.devices
        .iter()
        .map(|dt| {
            let p = Program::compile(dt);
            TraceFaults {
                device: dt.device,
                unmatched_frees: p.unmatched_frees,
                double_allocs: p.double_allocs,
            }
        })
        .collect()
}

/// Warnings on stderr (with `--json` too: stdout keeps its one object) for what the trace
/// `name` gets wrong: frees the replay skipped, and, for an address allocated again while live
/// (a lost free), the first such address and both events, since the replay keeps the earlier
/// allocation live to the end and its peaks can be higher than the job's.
pub(crate) fn warn_trace_issues(name: &str, faults: &[TraceFaults]) {
    use std::io::Write as _;
    let mut err = std::io::stderr();
    // A closed stderr loses the warnings, nothing else.
    let n: u64 = faults.iter().map(|f| f.unmatched_frees).sum();
    if n > 0 {
        let frees = if n == 1 {
            "free of an address"
        } else {
            "frees of addresses"
        };
        let _ = writeln!(
            err,
            "cudamem: warning: {name}: {n} {frees} the trace never allocated (allocated \
             before recording started, or a lost event); the replay skipped them"
        );
    }
    for f in faults {
        let Some((addr, second, first)) = f.double_allocs.first else {
            continue;
        };
        let more = match f.double_allocs.count {
            1 => String::new(),
            n => format!(" ({n} such allocations on this device)"),
        };
        let _ = writeln!(
            err,
            "cudamem: warning: {name}: device {}: event {second} allocates address {addr:#x}, which event {first} \
             allocated and no event freed{more}; the replay keeps the earlier allocation live to the end",
            f.device
        );
    }
}
