//! PyTorch's `torch.cuda.memory_summary()` text, character for character.
//!
//! [`memory_summary`] renders the flat `memory_stats()` dict ([`StatsDict`])
//! into the 75-column table that `torch/cuda/memory.py` prints: a header with
//! the device id, the `num_ooms` and `num_alloc_retries` counters, then one
//! block per metric (allocated, active, requested, reserved and
//! non-releasable bytes; allocation, active, segment and inactive-split
//! counts) with its large/small pool rows, and the two oversize rows.
//!
//! Guarantees:
//! - For a dict holding PyTorch's 122 keys the output is byte-identical to
//!   PyTorch's, trailing newline included; `tests/summary_golden.rs` checks
//!   this against real PyTorch 2.11 output.
//! - Unit choice follows PyTorch's `_format_size` / `_format_count`: a value
//!   moves to the next unit (B, KiB, MiB, GiB, TiB, PiB; counts: none, K, M)
//!   while its *reference* value, counted in the current unit, is at least
//!   786,432 (counts: 750,000): bytes become KiB from 768 KiB, KiB become MiB
//!   from 768 MiB, and so on. The reference of a pool row is the `all` row
//!   above it, so "from small pool" rows share the unit of their metric's
//!   total (e.g. "37 MiB" under a 19874 MiB total, "5651 KiB" under a
//!   46355 KiB one). Values are truncated (Python floor division), never
//!   rounded.
//! - It never panics: a missing key reads as 0 (PyTorch would raise
//!   `KeyError`), negative values are floor-divided as Python does, and a
//!   value too wide for its column widens the row exactly as Python's
//!   format does.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The flat `torch.cuda.memory_stats()` dict: dotted key to integer value,
/// e.g. `"allocated_bytes.all.current"`, `"num_ooms"`,
/// `"oversize_segments.peak"`. A `BTreeMap` keeps PyTorch's sorted key order.
pub type StatsDict = BTreeMap<String, i64>;

/// Number of keys in PyTorch's `memory_stats()` dict: 9 per-pool stats x 3
/// pools x 4 fields, 6 scalars and 2 oversize stats x 4 fields.
pub const STAT_KEY_COUNT: usize = 122;

/// PyTorch's 122 `memory_stats()` keys, in the dict's (sorted) order.
pub const STAT_KEYS: [&str; STAT_KEY_COUNT] = [
    "active.all.allocated",
    "active.all.current",
    "active.all.freed",
    "active.all.peak",
    "active.large_pool.allocated",
    "active.large_pool.current",
    "active.large_pool.freed",
    "active.large_pool.peak",
    "active.small_pool.allocated",
    "active.small_pool.current",
    "active.small_pool.freed",
    "active.small_pool.peak",
    "active_bytes.all.allocated",
    "active_bytes.all.current",
    "active_bytes.all.freed",
    "active_bytes.all.peak",
    "active_bytes.large_pool.allocated",
    "active_bytes.large_pool.current",
    "active_bytes.large_pool.freed",
    "active_bytes.large_pool.peak",
    "active_bytes.small_pool.allocated",
    "active_bytes.small_pool.current",
    "active_bytes.small_pool.freed",
    "active_bytes.small_pool.peak",
    "allocated_bytes.all.allocated",
    "allocated_bytes.all.current",
    "allocated_bytes.all.freed",
    "allocated_bytes.all.peak",
    "allocated_bytes.large_pool.allocated",
    "allocated_bytes.large_pool.current",
    "allocated_bytes.large_pool.freed",
    "allocated_bytes.large_pool.peak",
    "allocated_bytes.small_pool.allocated",
    "allocated_bytes.small_pool.current",
    "allocated_bytes.small_pool.freed",
    "allocated_bytes.small_pool.peak",
    "allocation.all.allocated",
    "allocation.all.current",
    "allocation.all.freed",
    "allocation.all.peak",
    "allocation.large_pool.allocated",
    "allocation.large_pool.current",
    "allocation.large_pool.freed",
    "allocation.large_pool.peak",
    "allocation.small_pool.allocated",
    "allocation.small_pool.current",
    "allocation.small_pool.freed",
    "allocation.small_pool.peak",
    "inactive_split.all.allocated",
    "inactive_split.all.current",
    "inactive_split.all.freed",
    "inactive_split.all.peak",
    "inactive_split.large_pool.allocated",
    "inactive_split.large_pool.current",
    "inactive_split.large_pool.freed",
    "inactive_split.large_pool.peak",
    "inactive_split.small_pool.allocated",
    "inactive_split.small_pool.current",
    "inactive_split.small_pool.freed",
    "inactive_split.small_pool.peak",
    "inactive_split_bytes.all.allocated",
    "inactive_split_bytes.all.current",
    "inactive_split_bytes.all.freed",
    "inactive_split_bytes.all.peak",
    "inactive_split_bytes.large_pool.allocated",
    "inactive_split_bytes.large_pool.current",
    "inactive_split_bytes.large_pool.freed",
    "inactive_split_bytes.large_pool.peak",
    "inactive_split_bytes.small_pool.allocated",
    "inactive_split_bytes.small_pool.current",
    "inactive_split_bytes.small_pool.freed",
    "inactive_split_bytes.small_pool.peak",
    "max_split_size",
    "num_alloc_retries",
    "num_device_alloc",
    "num_device_free",
    "num_ooms",
    "num_sync_all_streams",
    "oversize_allocations.allocated",
    "oversize_allocations.current",
    "oversize_allocations.freed",
    "oversize_allocations.peak",
    "oversize_segments.allocated",
    "oversize_segments.current",
    "oversize_segments.freed",
    "oversize_segments.peak",
    "requested_bytes.all.allocated",
    "requested_bytes.all.current",
    "requested_bytes.all.freed",
    "requested_bytes.all.peak",
    "requested_bytes.large_pool.allocated",
    "requested_bytes.large_pool.current",
    "requested_bytes.large_pool.freed",
    "requested_bytes.large_pool.peak",
    "requested_bytes.small_pool.allocated",
    "requested_bytes.small_pool.current",
    "requested_bytes.small_pool.freed",
    "requested_bytes.small_pool.peak",
    "reserved_bytes.all.allocated",
    "reserved_bytes.all.current",
    "reserved_bytes.all.freed",
    "reserved_bytes.all.peak",
    "reserved_bytes.large_pool.allocated",
    "reserved_bytes.large_pool.current",
    "reserved_bytes.large_pool.freed",
    "reserved_bytes.large_pool.peak",
    "reserved_bytes.small_pool.allocated",
    "reserved_bytes.small_pool.current",
    "reserved_bytes.small_pool.freed",
    "reserved_bytes.small_pool.peak",
    "segment.all.allocated",
    "segment.all.current",
    "segment.all.freed",
    "segment.all.peak",
    "segment.large_pool.allocated",
    "segment.large_pool.current",
    "segment.large_pool.freed",
    "segment.large_pool.peak",
    "segment.small_pool.allocated",
    "segment.small_pool.current",
    "segment.small_pool.freed",
    "segment.small_pool.peak",
];

/// [`STAT_KEYS`] as owned strings, for callers that want a `Vec`.
pub fn stat_keys() -> Vec<String> {
    STAT_KEYS.iter().map(|k| (*k).to_string()).collect()
}

/// A stats dict with every one of the 122 keys set to 0, the starting point
/// of a fresh allocator except for `max_split_size`, which PyTorch reports
/// as -1 when unlimited and which the caller sets.
pub fn zeroed_stats() -> StatsDict {
    STAT_KEYS.iter().map(|k| ((*k).to_string(), 0)).collect()
}

const WIDTH: usize = 75;

/// The byte-valued metrics, in PyTorch's row order: (stat key, row title).
const SIZE_METRICS: [(&str, &str); 5] = [
    ("allocated_bytes", "Allocated memory"),
    ("active_bytes", "Active memory"),
    ("requested_bytes", "Requested memory"),
    ("reserved_bytes", "GPU reserved memory"),
    ("inactive_split_bytes", "Non-releasable memory"),
];

/// The count-valued metrics, after the byte-valued ones.
const COUNT_METRICS: [(&str, &str); 4] = [
    ("allocation", "Allocations"),
    ("active", "Active allocs"),
    ("segment", "GPU reserved segments"),
    ("inactive_split", "Non-releasable allocs"),
];

/// The rows without pool breakdown, closing the table.
const OVERSIZE_METRICS: [(&str, &str); 2] = [
    ("oversize_allocations", "Oversize allocations"),
    ("oversize_segments", "Oversize GPU segments"),
];

const FIELDS: [&str; 4] = ["current", "peak", "allocated", "freed"];

/// Which of Python's two formatters a metric uses.
#[derive(Clone, Copy)]
enum Kind {
    Size,
    Count,
}

/// Renders `torch.cuda.memory_summary(device, abbreviated)` from `stats`.
///
/// `abbreviated` drops the "from large pool" / "from small pool" rows, as in
/// PyTorch. The text ends with a newline.
pub fn memory_summary(stats: &StatsDict, device: i32, abbreviated: bool) -> String {
    let get = |key: &str| stats.get(key).copied().unwrap_or(0);

    let mut lines: Vec<String> = Vec::with_capacity(64);
    lines.push("=".repeat(WIDTH));
    // " {_:16} PyTorch CUDA memory summary, device ID {device:<17d} "
    lines.push(format!(
        " {:16} PyTorch CUDA memory summary, device ID {:<17} ",
        "", device
    ));
    lines.push("-".repeat(WIDTH));
    // "  {_:9} CUDA OOMs: {num_ooms:<12d} | {_:6} cudaMalloc retries: {num_alloc_retries:<8d}  "
    lines.push(format!(
        "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
        "",
        get("num_ooms"),
        "",
        get("num_alloc_retries")
    ));
    lines.push("=".repeat(WIDTH));
    lines.push("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string());

    let metrics = SIZE_METRICS
        .iter()
        .map(|m| (m, Kind::Size))
        .chain(COUNT_METRICS.iter().map(|m| (m, Kind::Count)));
    for (&(metric_key, metric_name), kind) in metrics {
        lines.push("-".repeat(WIDTH));
        let mut submetrics = vec![("all", metric_name)];
        if !abbreviated {
            submetrics.push(("large_pool", "      from large pool"));
            submetrics.push(("small_pool", "      from small pool"));
        }
        // The `all` row's values choose the units of every row of the block.
        let mut reference: Option<[i64; 4]> = None;
        for (submetric_key, submetric_name) in submetrics {
            let values = FIELDS.map(|f| get(&format!("{metric_key}.{submetric_key}.{f}")));
            let refs = *reference.get_or_insert(values);
            lines.push(row(submetric_name, kind, values, refs));
        }
    }

    for (metric_key, metric_name) in OVERSIZE_METRICS {
        lines.push("-".repeat(WIDTH));
        let values = FIELDS.map(|f| get(&format!("{metric_key}.{f}")));
        lines.push(row(metric_name, Kind::Count, values, values));
    }

    lines.push("=".repeat(WIDTH));

    let mut out = String::with_capacity(lines.len() * (WIDTH + 3));
    out.push('|');
    out.push_str(&lines.join("|\n|"));
    out.push_str("|\n");
    out
}

/// cudamem's table of tags, which [`crate::CachingAllocator::memory_summary`] prints under
/// PyTorch's when the allocator has tags (PyTorch's table stays byte for byte): per tag, its
/// live bytes (allocated blocks, asleep or not), reserved bytes (mapped now), asleep bytes
/// (given back to the device by sleeping) and offloaded bytes (host copies), in the table's
/// width and units. Empty when there are no tags.
pub fn tags_summary(tags: &[crate::TagInfo]) -> String {
    if tags.is_empty() {
        return String::new();
    }
    let mut lines = vec![
        "=".repeat(WIDTH),
        format!("{:^WIDTH$}", "cudamem tags (sleep and wake)"),
        "-".repeat(WIDTH),
        format!(" {:^21} | Live       | Reserved   | Asleep     | Offloaded  ", "Tag"),
        "-".repeat(WIDTH),
    ];
    for t in tags {
        let name = if t.asleep {
            format!("{} (asleep)", t.name)
        } else {
            t.name.clone()
        };
        let mut row = format!(" {name:<21} ");
        for v in [t.allocated_bytes, t.reserved_bytes, t.sleeping_bytes, t.offloaded_bytes] {
            let v = i64::try_from(v).unwrap_or(i64::MAX);
            let _ = write!(row, "| {} ", format_size_cell(v, v));
        }
        lines.push(row);
    }
    lines.push("=".repeat(WIDTH));
    format!("|{}|\n", lines.join("|\n|"))
}

/// One table row: `" {name:<21} | {c} | {p} | {a} | {f} "`.
fn row(name: &str, kind: Kind, values: [i64; 4], refs: [i64; 4]) -> String {
    let mut s = String::with_capacity(WIDTH);
    let _ = write!(s, " {name:<21} ");
    for (v, r) in values.into_iter().zip(refs) {
        let cell = match kind {
            Kind::Size => format_size_cell(v, r),
            Kind::Count => format_count_cell(v, r),
        };
        let _ = write!(s, "| {cell} ");
    }
    s
}

/// Python's `_format_size(sz, pref_sz)`: `f"{sz:6d} {prefix}"`, the unit
/// chosen by the reference value `pref_sz`.
pub fn format_size_cell(sz: i64, pref_sz: i64) -> String {
    const PREFIXES: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let (sz, unit) = scale(sz, pref_sz, 1024, 768 * 1024, &PREFIXES);
    format!("{sz:6} {unit}")
}

/// Python's `_format_count(cnt, pref_cnt)`: `f"{cnt:7d} {prefix} "`.
pub fn format_count_cell(cnt: i64, pref_cnt: i64) -> String {
    const PREFIXES: [&str; 3] = [" ", "K", "M"];
    let (cnt, unit) = scale(cnt, pref_cnt, 1000, 750 * 1000, &PREFIXES);
    format!("{cnt:7} {unit} ")
}

/// The loop shared by both Python formatters:
///
/// ```text
/// for new_prefix in prefixes[1:]:
///     if pref < threshold: break
///     prefix = new_prefix; v //= step; pref /= step
/// ```
///
/// `v //= step` is floor division on Python ints (`div_euclid` for a
/// positive step); `pref /= step` is true division, so `pref` becomes a
/// float, which `f64` reproduces: an `i64` converted to `f64` and divided by
/// a power of two, or by 1000, rounds exactly as Python's int/int and
/// float/int division do.
fn scale(mut v: i64, pref: i64, step: i64, threshold: i64, prefixes: &[&'static str]) -> (i64, &'static str) {
    let mut prefix = prefixes[0];
    // The first comparison is int vs int in Python.
    if pref < threshold {
        return (v, prefix);
    }
    let mut pref_f = pref as f64;
    for &new_prefix in &prefixes[1..] {
        if pref_f < threshold as f64 {
            break;
        }
        prefix = new_prefix;
        v = v.div_euclid(step);
        pref_f /= step as f64;
    }
    (v, prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_keys_are_sorted_unique_and_complete() {
        let mut sorted = STAT_KEYS.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, STAT_KEYS.to_vec());
        // Rebuild the list from its structure (reference section 4).
        let mut built: Vec<String> = Vec::new();
        for m in [
            "allocation",
            "segment",
            "active",
            "inactive_split",
            "allocated_bytes",
            "reserved_bytes",
            "active_bytes",
            "inactive_split_bytes",
            "requested_bytes",
        ] {
            for p in ["all", "small_pool", "large_pool"] {
                for f in FIELDS {
                    built.push(format!("{m}.{p}.{f}"));
                }
            }
        }
        for s in [
            "num_alloc_retries",
            "num_ooms",
            "num_sync_all_streams",
            "num_device_alloc",
            "num_device_free",
            "max_split_size",
        ] {
            built.push(s.to_string());
        }
        for m in ["oversize_allocations", "oversize_segments"] {
            for f in FIELDS {
                built.push(format!("{m}.{f}"));
            }
        }
        built.sort();
        assert_eq!(built, stat_keys());
        assert_eq!(zeroed_stats().len(), STAT_KEY_COUNT);
    }

    #[test]
    fn size_cells_switch_units_at_768_of_the_reference() {
        assert_eq!(format_size_cell(0, 0), "     0 B  ");
        assert_eq!(format_size_cell(786_431, 786_431), "786431 B  ");
        assert_eq!(format_size_cell(786_432, 786_432), "   768 KiB");
        // 768 MiB moves to MiB; one byte less stays in KiB.
        assert_eq!(format_size_cell(768 << 20, 768 << 20), "   768 MiB");
        assert_eq!(format_size_cell((768 << 20) - 1, (768 << 20) - 1), "786431 KiB");
        // A pool row uses the unit of its `all` row, and truncates.
        assert_eq!(format_size_cell(1023, 3 << 30), "     0 MiB");
        assert_eq!(format_size_cell(5 << 20, 1 << 20), "  5120 KiB");
        // PiB is the last unit.
        assert_eq!(format_size_cell(i64::MAX, i64::MAX), "  8191 PiB");
    }

    #[test]
    fn count_cells_switch_at_750_thousand() {
        assert_eq!(format_count_cell(489, 489), "    489   ");
        assert_eq!(format_count_cell(749_999, 749_999), " 749999   ");
        assert_eq!(format_count_cell(750_000, 750_000), "    750 K ");
        assert_eq!(format_count_cell(750_000_000, 750_000_000), "    750 M ");
        assert_eq!(format_count_cell(i64::MAX, i64::MAX), "9223372036854 M ");
    }

    #[test]
    fn negative_values_floor_like_python() {
        // Python: -1 // 1024 == -1
        assert_eq!(format_size_cell(-1, 1 << 20), "    -1 KiB");
        assert_eq!(format_size_cell(-5, -5), "    -5 B  ");
        assert_eq!(format_count_cell(-1, 1_000_000), "     -1 K ");
    }

    #[test]
    fn missing_keys_read_as_zero_and_lines_are_75_wide() {
        let text = memory_summary(&StatsDict::new(), 0, false);
        assert!(text.ends_with("|\n"));
        for line in text.lines() {
            assert_eq!(line.len(), WIDTH + 2, "{line:?}");
        }
        assert_eq!(text.lines().count(), 47);
        assert_eq!(memory_summary(&StatsDict::new(), 0, true).lines().count(), 29);
    }

    #[test]
    fn the_tags_table_has_the_width_of_pytorch_s_and_a_row_per_tag() {
        assert_eq!(tags_summary(&[]), "");
        let tag = |name: &str, asleep, [a, r, s, o]: [u64; 4]| crate::TagInfo {
            name: name.into(),
            asleep,
            allocated_bytes: a,
            reserved_bytes: r,
            sleeping_bytes: s,
            offloaded_bytes: o,
        };
        let t = tags_summary(&[
            tag("weights", true, [64 << 20, 0, 66 << 20, 66 << 20]),
            tag("kv", false, [1 << 30, 1 << 30, 0, 0]),
        ]);
        assert!(t.lines().all(|l| l.chars().count() == WIDTH + 2), "{t}");
        let row = t.lines().find(|l| l.starts_with("| weights (asleep)")).unwrap();
        assert_eq!(
            row,
            "| weights (asleep)      |  65536 KiB |      0 B   |  67584 KiB |  67584 KiB |"
        );
        assert!(t.contains("| kv                    |   1024 MiB |   1024 MiB |"), "{t}");
    }

    #[test]
    fn header_shows_device_ooms_and_retries() {
        let mut stats = zeroed_stats();
        stats.insert("num_ooms".into(), 12);
        stats.insert("num_alloc_retries".into(), 345);
        let text = memory_summary(&stats, 3, true);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1],
            "|                  PyTorch CUDA memory summary, device ID 3                 |"
        );
        assert_eq!(
            lines[3],
            "|            CUDA OOMs: 12           |        cudaMalloc retries: 345       |"
        );
    }
}
