//! # cudamem-report: answers about a memory trace, in text, JSON and one HTML file
//!
//! Four reports over a [`Trace`] (a PyTorch snapshot pickle, an RMM log, a cudamem trace):
//!
//! | report | question | function | module |
//! |---|---|---|---|
//! | summary | what would `torch.cuda.memory_summary()` have printed, at the end and at the peak? | [`summary()`] | [`summary`](mod@summary) |
//! | leaks | what is still allocated (at the end, or at a marked point), and who allocated it? | [`leaks()`] | [`leaks`](mod@leaks) |
//! | why | which reserved bytes would `empty_cache()` release, and which live blocks pin the rest? | [`why()`] | [`why`](mod@why) |
//! | viz | one self-contained HTML viewer: active-memory timeline, segment map at any event, reserved vs allocated, the summary tables | [`viz()`], [`viz_replay`] | [`viz`](mod@viz) |
//!
//! Each function returns a struct; each struct renders as text (`Display` or `to_text`) and as
//! JSON (`to_json`). The command line (`cudamem summary|leaks|why|viz`) only parses arguments
//! and prints these.
//!
//! Where a report needs the allocator's state rather than the trace's own record, it replays the
//! trace with the recorded allocator — policy `pytorch`, the trace's settings, new segments at
//! the recorded addresses — which reproduces PyTorch's segment history exactly (the fidelity
//! tests of `cudamem-replay`). [`replay`] holds that event-by-event replay; it also records the
//! allocator's history for `cudamem viz --policy`, without changes to `cudamem-replay`.
//!
//! Guarantees common to all reports: no input trace makes them panic; errors name the trace;
//! output is deterministic (same trace, same bytes), so reports can be diffed and tested.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::collections::HashMap;

use cudamem_trace::{Action, Frame, StackId, Trace};
use serde_json::{json, Value};

pub mod leaks;
pub mod replay;
pub mod summary;
pub mod viz;
pub mod why;

pub use leaks::{leaks, At, LeakGroup, LeakReport};
pub use summary::{summary, summary_note, DeviceSummary, SummaryReport};
pub use viz::{viz, viz_replay, VizOptions};
pub use why::{why, PinBlock, Reason, SegmentWhy, WhyReport};

/// What the reports print for an allocation without recorded frames.
pub const NO_STACK: &str = "<no stack recorded>";

/// A size for people: `512 B`, `3.9 KiB`, `340.0 MiB`, `1.21 GiB`.
pub fn human(b: u64) -> String {
    const U: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i >= 2 {
        format!("{v:.2} {}", U[i])
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// Writes up to `max` frames, one a line, innermost first, each prefixed by `indent`;
/// [`NO_STACK`] when there are none.
pub(crate) fn write_frames(s: &mut String, frames: &[Frame], max: usize, indent: &str) {
    use std::fmt::Write;
    if frames.is_empty() {
        let _ = writeln!(s, "{indent}{NO_STACK}");
        return;
    }
    for f in frames.iter().take(max) {
        let _ = writeln!(s, "{indent}{}  {}:{}", f.name, short_path(&f.filename), f.line);
    }
    if frames.len() > max {
        let _ = writeln!(s, "{indent}... {} more frames", frames.len() - max);
    }
}

/// A file name without the site-packages prefix (`.../site-packages/torch/nn/x.py` →
/// `torch/nn/x.py`).
pub(crate) fn short_path(p: &str) -> &str {
    for key in ["site-packages/", "dist-packages/"] {
        if let Some(i) = p.rfind(key) {
            return &p[i + key.len()..];
        }
    }
    p
}

pub(crate) fn frames_json(frames: &[Frame]) -> Value {
    Value::Array(
        frames
            .iter()
            .map(|f| json!({"name": f.name, "filename": f.filename, "line": f.line}))
            .collect(),
    )
}

/// The stack of the allocation live at each (device, address) at the end of the trace,
/// from alloc/free pairing of the events.
pub(crate) fn live_stacks_by_address(trace: &Trace) -> HashMap<(i32, u64), Option<StackId>> {
    let mut m = HashMap::new();
    for d in &trace.devices {
        for e in &d.events {
            match e.action {
                Action::Alloc => {
                    m.insert((d.device, e.addr), e.stack);
                }
                Action::FreeRequested => {
                    m.remove(&(d.device, e.addr));
                }
                _ => {}
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(4000), "3.9 KiB");
        assert_eq!(human(340 << 20), "340.0 MiB");
        assert_eq!(human(1300 << 20), "1.27 GiB");
    }

    #[test]
    fn short_paths() {
        assert_eq!(
            short_path("venv/lib/python3.12/site-packages/torch/nn/linear.py"),
            "torch/nn/linear.py"
        );
        assert_eq!(short_path("gpu/workloads.py"), "gpu/workloads.py");
    }

    #[test]
    fn at_parsing() {
        assert_eq!(At::parse("12"), At::Event(12));
        assert_eq!(
            At::parse("Optimizer.step#SGD.step"),
            At::Annotation("Optimizer.step#SGD.step".into(), Some(1))
        );
        assert_eq!(At::parse("step@3"), At::Annotation("step".into(), Some(3)));
        assert_eq!(At::parse("step@last"), At::Annotation("step".into(), None));
        assert_eq!(At::parse("a@b"), At::Annotation("a@b".into(), Some(1)));
    }
}
