//! `cudamem fidelity TRACE...`: the fidelity table of the README — for each trace, what PyTorch
//! recorded (its segment history, and the live stats saved beside the trace) next to what the
//! replay reproduces.

use std::io::Read;
use std::path::{Path, PathBuf};

use cudamem_alloc::policy::registry;
use cudamem_replay::{replay, ReplayOptions};
use cudamem_trace::Action;

/// Live `memory_stats()` saved beside a trace as `NAME.KIND.stats.json`, if present.
fn live_peak(trace: &Path, kind: &str) -> Option<u64> {
    let name = trace
        .file_name()?
        .to_str()?
        .trim_end_matches(".gz")
        .trim_end_matches(".pickle");
    let p = trace.with_file_name(format!("{name}.{kind}.stats.json"));
    // Read at most 1 MiB, so that a path naming an endless stream cannot stall the table.
    let mut text = String::new();
    std::fs::File::open(p)
        .ok()?
        .take(1 << 20)
        .read_to_string(&mut text)
        .ok()?;
    let key = "\"reserved_bytes.all.peak\":";
    let at = text.find(key)? + key.len();
    text[at..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// What a trace with no segment history gets: the table compares the trace's own segment
/// allocations with the replay's, so without them there is nothing to compare.
fn nothing_to_compare(name: &str) -> String {
    format!(
        "{name}: nothing to compare: the trace has no segment history (no segment_alloc or \
         segment_map entry; RMM logs and snapshots taken without recording history have none)"
    )
}

/// Prints the markdown table. A trace with nothing to compare stops the command with a message
/// (the table's header is printed only once there is a row to put under it).
pub fn run(paths: &[PathBuf]) -> crate::CliResult {
    let mut header = false;
    let mut mismatches = 0;
    for path in paths {
        let name = path
            .file_name()
            .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let trace = crate::load(path)?;
        if trace.count(Action::SegmentAlloc) + trace.count(Action::SegmentMap) == 0 {
            return Err(nothing_to_compare(&name).into());
        }
        let opts = |p: &str| ReplayOptions {
            policy: p.into(),
            repeats: 0,
            ..ReplayOptions::default()
        };
        let native = replay(&trace, &opts(registry::PYTORCH))?;
        // The row shows the first device with segment history; every device must match.
        let Some(d) = native.devices.iter().find(|d| d.trace_device_allocs > 0) else {
            return Err(nothing_to_compare(&name).into());
        };
        if native
            .devices
            .iter()
            .any(|d| d.peak_reserved_bytes != d.trace_peak_reserved_bytes || d.device_allocs != d.trace_device_allocs)
        {
            mismatches += 1;
        }
        let (live, exp, diff) = match live_peak(path, "expandable") {
            Some(live) => {
                let r = replay(&trace, &opts(registry::PYTORCH_EXPANDABLE))?;
                let e = r
                    .devices
                    .iter()
                    .find(|e| e.device == d.device)
                    .map_or(0, |e| e.peak_reserved_bytes);
                (
                    live.to_string(),
                    e.to_string(),
                    format!("{:+.2}%", 100.0 * (e as f64 / live as f64 - 1.0)),
                )
            }
            None => ("—".into(), "—".into(), "—".into()),
        };
        if !header {
            outln!("| trace | trace peak reserved | replay peak reserved (`pytorch`) | trace device allocs | replay device allocs | live peak, expandable | replay peak (`pytorch-expandable`) | difference |");
            outln!("|---|---:|---:|---:|---:|---:|---:|---:|");
            header = true;
        }
        outln!(
            "| {name} | {} | {} | {} | {} | {live} | {exp} | {diff} |",
            d.trace_peak_reserved_bytes,
            d.peak_reserved_bytes,
            d.trace_device_allocs,
            d.device_allocs
        );
    }
    if mismatches > 0 {
        return Err(format!("{mismatches} trace(s) not reproduced exactly").into());
    }
    Ok(())
}
