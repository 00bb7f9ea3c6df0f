//! # `memory_summary()` of a trace
//!
//! [`summary`] replays the trace with the recorded allocator — policy `pytorch` and the trace's
//! own settings, new segments at the recorded addresses ([`cudamem_replay::replay`]) — and
//! prints PyTorch's `torch.cuda.memory_summary()` table for each device twice: at the end of the
//! trace and at the moment reserved memory peaked. Because that replay reproduces the recorded
//! segment history, the tables are what PyTorch would have printed at those two moments, except
//! for the counters a trace cannot carry (allocations made before history recording started,
//! `num_sync_all_streams`).

use std::fmt;

use cudamem_alloc::summary::{memory_summary, StatsDict};
use cudamem_alloc::DeviceStats;
use cudamem_replay::{replay, ReplayOptions};
use cudamem_trace::Trace;
use serde_json::{json, Value};

use crate::human;

/// One device's tables.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceSummary {
    /// Device ordinal.
    pub device: i32,
    /// Stats at the end of the trace.
    pub stats_at_end: DeviceStats,
    /// Stats when reserved memory peaked.
    pub stats_at_peak: DeviceStats,
    /// `memory_summary()` at the end.
    pub table_at_end: String,
    /// `memory_summary()` at the reserved peak.
    pub table_at_peak: String,
}

/// The result of [`summary`].
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryReport {
    /// The trace's name.
    pub source: String,
    /// Policy replayed (`pytorch`).
    pub policy: String,
    /// Effective settings (the trace's own).
    pub config: String,
    /// Per device.
    pub devices: Vec<DeviceSummary>,
}

/// `memory_summary()` tables of `trace` at its end and at its reserved peak (see the
/// [module docs](self)).
pub fn summary(trace: &Trace) -> Result<SummaryReport, String> {
    let opts = ReplayOptions {
        policy: cudamem_alloc::policy::registry::PYTORCH.into(),
        repeats: 0,
        ..ReplayOptions::default()
    };
    let r = replay(trace, &opts)?;
    Ok(SummaryReport {
        source: trace.source.clone(),
        policy: r.policy.clone(),
        config: r.config.clone(),
        devices: r
            .devices
            .iter()
            .map(|d| DeviceSummary {
                device: d.device,
                stats_at_end: d.stats_at_end,
                stats_at_peak: d.stats_at_peak,
                table_at_end: memory_summary(&d.stats_at_end.to_dict(), d.device, false),
                table_at_peak: memory_summary(&d.stats_at_peak.to_dict(), d.device, false),
            })
            .collect(),
    })
}

impl SummaryReport {
    /// The report as JSON: the tables and the key numbers (bytes).
    pub fn to_json(&self) -> Value {
        json!({
            "trace": self.source,
            "policy": self.policy,
            "config": self.config,
            "devices": self.devices.iter().map(|d| json!({
                "device": d.device,
                "peak_reserved_bytes": d.stats_at_end.reserved_bytes.all().peak,
                "peak_allocated_bytes": d.stats_at_end.allocated_bytes.all().peak,
                "reserved_bytes_at_end": d.stats_at_end.reserved_bytes.all().current,
                "allocated_bytes_at_end": d.stats_at_end.allocated_bytes.all().current,
                "memory_summary_at_end": d.table_at_end,
                "memory_summary_at_peak": d.table_at_peak,
            })).collect::<Vec<_>>(),
        })
    }
}

impl fmt::Display for SummaryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: replayed with policy {} and the trace's settings ('{}')",
            self.source, self.policy, self.config
        )?;
        for d in &self.devices {
            writeln!(f, "\nmemory_summary() at the end of the trace (device {}):", d.device)?;
            f.write_str(&d.table_at_end)?;
            if let Some(n) = summary_note(&d.stats_at_end.to_dict()) {
                writeln!(f, "{n}")?;
            }
            writeln!(
                f,
                "\nmemory_summary() when reserved memory peaked at {} (device {}):",
                human(d.stats_at_peak.reserved_bytes.all().current as u64),
                d.device
            )?;
            f.write_str(&d.table_at_peak)?;
            if let Some(n) = summary_note(&d.stats_at_peak.to_dict()) {
                writeln!(f, "{n}")?;
            }
        }
        Ok(())
    }
}

/// A line to print under a `memory_summary()` table whose "GPU reserved segments" row reads 0
/// while memory is reserved: PyTorch counts only `cudaMalloc`ed segments there, and memory
/// mapped into expandable segments (PyTorch's `expandable_segments:True`, and every cudamem
/// policy) is in none of them. The table stays PyTorch's, character for character; the line
/// says where the reserved memory is. `None` when the row and the reserved bytes agree.
pub fn summary_note(stats: &StatsDict) -> Option<String> {
    let get = |k: &str| stats.get(k).copied().unwrap_or(0);
    let reserved = get("reserved_bytes.all.current");
    if reserved <= 0 || get("segment.all.current") > 0 {
        return None;
    }
    Some(format!(
        "note: \"GPU reserved segments\" counts cudaMalloc'ed segments, as PyTorch does; the {} reserved \
         here is mapped into expandable segments, which that row does not count",
        crate::human(reserved as u64)
    ))
}

#[cfg(test)]
mod note_tests {
    use super::*;

    #[test]
    fn reserved_memory_in_no_counted_segment_is_explained() {
        let mut d = StatsDict::new();
        d.insert("reserved_bytes.all.current".into(), 20 << 20);
        let n = summary_note(&d).unwrap();
        assert!(n.contains("20.0 MiB") && n.contains("expandable segments"), "{n}");
        d.insert("segment.all.current".into(), 1);
        assert_eq!(summary_note(&d), None);
        assert_eq!(summary_note(&StatsDict::new()), None);
    }
}
