//! `cudamem fidelity TRACE...`: the fidelity table of the README — for each trace, what PyTorch
//! recorded (its segment history, and the live stats saved beside the trace) next to what the
//! replay reproduces.

use std::path::{Path, PathBuf};

use cudamem_alloc::policy::registry;
use cudamem_replay::{replay, ReplayOptions};

/// Live `memory_stats()` saved beside a trace as `NAME.KIND.stats.json`, if present.
fn live_peak(trace: &Path, kind: &str) -> Option<u64> {
    let name = trace
        .file_name()?
        .to_str()?
        .trim_end_matches(".gz")
        .trim_end_matches(".pickle");
    let p = trace.with_file_name(format!("{name}.{kind}.stats.json"));
    let text = std::fs::read_to_string(p).ok()?;
    let key = "\"reserved_bytes.all.peak\":";
    let at = text.find(key)? + key.len();
    text[at..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Prints the markdown table.
pub fn run(paths: &[PathBuf]) -> crate::CliResult {
    outln!("| trace | trace peak reserved | replay peak reserved (`pytorch`) | trace device allocs | replay device allocs | live peak, expandable | replay peak (`pytorch-expandable`) | difference |");
    outln!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut mismatches = 0;
    for path in paths {
        let trace = cudamem_trace::read_path(path).map_err(|e| e.to_string())?;
        let opts = |p: &str| ReplayOptions {
            policy: p.into(),
            repeats: 0,
            ..ReplayOptions::default()
        };
        let native = replay(&trace, &opts(registry::PYTORCH))?;
        let d = &native.devices[0];
        if d.peak_reserved_bytes != d.trace_peak_reserved_bytes || d.device_allocs != d.trace_device_allocs {
            mismatches += 1;
        }
        let (live, exp, diff) = match live_peak(path, "expandable") {
            Some(live) => {
                let e = replay(&trace, &opts(registry::PYTORCH_EXPANDABLE))?.devices[0].peak_reserved_bytes;
                (
                    live.to_string(),
                    e.to_string(),
                    format!("{:+.2}%", 100.0 * (e as f64 / live as f64 - 1.0)),
                )
            }
            None => ("—".into(), "—".into(), "—".into()),
        };
        let name = path
            .file_name()
            .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
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
