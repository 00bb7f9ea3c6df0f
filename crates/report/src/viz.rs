//! # `cudamem viz`: one self-contained HTML file to look at a trace
//!
//! [`viz`] turns a trace into a single HTML page with four views of each device:
//!
//! 1. **Active-memory timeline** — every allocation is a band from its `alloc` to its
//!    `free_completed`, stacked in allocation order; when a band ends, the bands above it slide
//!    down (PyTorch's "Active Memory Timeline"). x is the event index, y bytes. Hovering shows
//!    the block size and requested size, address, lifetime (events and µs) and stack. A
//!    checkbox overlays the trace's reserved bytes (off by default: the y axis then fits the
//!    active bytes). Drag to zoom, double-click to reset, click to move the segment map to that
//!    event.
//! 2. **Segment map at one event** — a slider over the event index (it starts at the reserved
//!    peak, or at event N when the page is opened as `report.html#event=N`); each segment is drawn in
//!    address order, wrapped over rows of equal bytes (same scale at every event), with its
//!    blocks colored by state: allocated, pending free (freed, waiting for stream events), free;
//!    for expandable segments the pages not mapped at that moment are hatched. The state is
//!    computed in the page from the trace's own `segment_*`, `alloc`, `free_requested` and
//!    `free_completed` events, starting from the state at the first event (see below).
//! 3. **Reserved vs allocated** over the event index: reserved from the trace's segment events,
//!    allocated (block sizes) and requested bytes of live allocations.
//! 4. **`memory_summary()`** at the end and at the reserved peak.
//!
//! plus a header with the trace name, policy and settings, and the peaks.
//!
//! ## Design
//! * **No network, no dependencies.** Everything is inline: the CSS and JavaScript come from
//!   `assets/viz.css` and `assets/viz.js` (`include_str!`), the data is one JSON object in a
//!   `<script type="application/json">` block (every `<` escaped as `\u003c`, so no trace
//!   content can close the block or inject markup; the page writes trace strings only through
//!   `textContent`). The drawing is hand-written on `<canvas>`: the timeline's shifting bands
//!   and the wrapped segment map are custom shapes that no small charting library draws, and a
//!   library only for the line chart would add a vendored file and its license for little. A
//!   unit test checks that the page has no `src=`/`href=`/`import` of any URL.
//! * **Bounded work in the page.** Each allocation is embedded once, in columns (event of
//!   alloc, of `free_requested`, of `free_completed`, requested size, block size, address
//!   relative to a base, stack id): about 50 bytes per allocation. The timeline draws at most
//!   [`VizOptions::max_bands`] bands (20,000 by default): the largest blocks; the others are
//!   summed into one "smaller allocations" band on top. The segment map and the curves use every
//!   allocation; a slider move scans the allocations once (linear, no replay of the history).
//!   Curves are drawn as per-pixel min/max envelopes, so long traces draw in constant time.
//! * **Block sizes.** Trace `alloc` events carry requested sizes. The block size of each
//!   allocation comes from replaying the trace with the recorded allocator (policy `pytorch`,
//!   the trace's settings, recorded segment addresses — an exact reproduction, see
//!   `cudamem-replay`), which also yields the `memory_summary()` tables. If that replay fails
//!   (bad settings string), blocks fall back to PyTorch's rounding of the request and the
//!   tables are left out.
//! * **State before the first event.** A trace recorded after the job started holds frees of
//!   allocations and segments it never saw allocated. They are taken to exist from the start;
//!   so are the snapshot's segments, mapped ranges and active blocks that no event explains.
//!   For a trace recorded from the start (all the shared traces) the initial state is empty.
//! * **Expandable segments** appear in events as `segment_map`/`segment_unmap` of page ranges.
//!   One expandable segment's mapped ranges always lie in one contiguous span of address space
//!   (pages are mapped from the segment's start upwards, and a hole can only come from an unmap),
//!   so the union of all ranges ever mapped, with touching ranges merged, gives the segments; the
//!   map draws each over its whole span with the currently unmapped pages hatched.
//! * **Checkable.** The page sets `data-render-ok="1"` on `<body>` after drawing every view,
//!   and `data-render-error` from `window.onerror`. Opened with `#selftest` it drives its own
//!   interactions (slider at 41 events, hovers over both plots, zoom in and out) and checks at
//!   each of those events that the segment map's reserved and allocated bytes equal the
//!   curves', then sets `data-selftest-ok`. `scripts/viz/browser-test.sh` runs both in headless
//!   Chromium. Its Content-Security-Policy is `default-src 'none'` (inline code and style
//!   only), so even a bug could not make the browser fetch anything.
//! * With [`viz_replay`] (`cudamem viz --policy NAME`) the page shows the replay of another
//!   policy instead: the trace is replayed with history recording on
//!   (`record_memory_history(true, RecordContext::All, usize::MAX)`, the trace's stacks carried
//!   onto each allocation) and the replay's own snapshot is visualised.

use std::collections::{BTreeMap, HashMap};

use cudamem_alloc::summary::memory_summary;
use cudamem_alloc::AllocatorConfig;
use cudamem_trace::{Action, BlockState, DeviceTrace, StackId, Trace};
use serde_json::{json, Value};

use crate::replay::{run, snapshot, Run, RunOptions};
use crate::short_path;

const TEMPLATE: &str = include_str!("../assets/viz.html");
const CSS: &str = include_str!("../assets/viz.css");
const JS: &str = include_str!("../assets/viz.js");

/// Options of [`viz_with`].
#[derive(Clone, Debug)]
pub struct VizOptions {
    /// The page's title.
    pub title: String,
    /// Most bands the timeline draws individually.
    pub max_bands: usize,
}

impl Default for VizOptions {
    fn default() -> Self {
        VizOptions {
            title: "cudamem viz".into(),
            max_bands: 20_000,
        }
    }
}

/// The HTML viewer of a recorded trace (see the [module docs](self)).
pub fn viz(trace: &Trace, title: &str) -> String {
    viz_with(
        trace,
        &VizOptions {
            title: title.to_string(),
            ..VizOptions::default()
        },
    )
}

/// [`viz`] with options.
pub fn viz_with(trace: &Trace, opts: &VizOptions) -> String {
    let r = run(trace, &RunOptions::default());
    let (label, note) = match &r {
        Ok(_) => (
            "recorded (PyTorch's allocator)".to_string(),
            "block sizes and memory_summary() from a replay with policy pytorch and the trace's settings".to_string(),
        ),
        Err(e) => (
            "recorded".to_string(),
            format!("no replay ({e}); block sizes estimated by rounding"),
        ),
    };
    let block_sizes: Vec<Option<Vec<u64>>> = match &r {
        Ok(run) => trace
            .devices
            .iter()
            .map(|d| {
                run.devices
                    .iter()
                    .find(|x| x.device == d.device)
                    .map(|x| x.block_sizes.clone())
            })
            .collect(),
        Err(_) => trace.devices.iter().map(|_| None).collect(),
    };
    render(trace, opts, &label, &note, &block_sizes, r.as_ref().ok())
}

/// The HTML viewer of `trace` replayed with `policy` (history recorded, the replay's snapshot
/// visualised). `config` is applied over the trace's settings.
pub fn viz_replay(trace: &Trace, policy: &str, config: Option<String>, title: &str) -> Result<String, String> {
    let r = run(
        trace,
        &RunOptions {
            policy: policy.to_string(),
            config,
            record_history: true,
            ..RunOptions::default()
        },
    )?;
    let snap = snapshot(trace, &r);
    // The k-th alloc entry of the history is the k-th successful malloc.
    let block_sizes: Vec<Option<Vec<u64>>> = snap
        .devices
        .iter()
        .map(|d| {
            r.devices
                .iter()
                .find(|x| x.device == d.device)
                .map(|x| x.block_sizes.iter().copied().filter(|&b| b > 0).collect())
        })
        .collect();
    let label = format!("replay with policy {}", r.policy);
    let note = format!(
        "settings '{}'; {} allocation(s) failed in the replay; times are the replay's clock",
        r.config,
        r.devices.iter().map(|d| d.ooms).sum::<u64>()
    );
    Ok(render(
        &snap,
        &VizOptions {
            title: title.to_string(),
            ..VizOptions::default()
        },
        &label,
        &note,
        &block_sizes,
        Some(&r),
    ))
}

mod data;

use data::device_data;

fn render(
    trace: &Trace,
    opts: &VizOptions,
    policy_label: &str,
    note: &str,
    block_sizes: &[Option<Vec<u64>>],
    run: Option<&Run>,
) -> String {
    let cfg = AllocatorConfig::parse(&trace.settings.conf).unwrap_or_default();
    let mut stack_ids: HashMap<StackId, usize> = HashMap::new();
    let mut devices = Vec::new();
    for (i, dt) in trace.devices.iter().enumerate() {
        let mut d = device_data(
            trace,
            dt,
            block_sizes.get(i).and_then(|b| b.as_ref()),
            &cfg,
            opts,
            &mut stack_ids,
        );
        if let Some(r) = run.and_then(|r| r.devices.iter().find(|x| x.device == dt.device)) {
            d["summary_end"] = json!(memory_summary(&r.stats_at_end.to_dict(), r.device, false));
            d["summary_peak"] = json!(memory_summary(&r.stats_at_peak.to_dict(), r.device, false));
            d["replay_peak_reserved"] = json!(r.stats_at_end.reserved_bytes.all().peak);
            d["replay_peak_allocated"] = json!(r.stats_at_end.allocated_bytes.all().peak);
            d["replay_ooms"] = json!(r.ooms);
        }
        devices.push(d);
    }
    // Stacks in first-use order, frames interned.
    let mut order: Vec<(usize, StackId)> = stack_ids.iter().map(|(&id, &k)| (k, id)).collect();
    order.sort_unstable();
    let mut frame_ids: HashMap<(&str, &str, i64), usize> = HashMap::new();
    let mut frames: Vec<Value> = Vec::new();
    let mut stacks: Vec<Vec<usize>> = Vec::new();
    for (_, id) in order {
        let st = trace
            .stacks
            .get(id as usize)
            .map(|s| s.frames.as_slice())
            .unwrap_or(&[]);
        stacks.push(
            st.iter()
                .map(|f| {
                    let key = (f.name.as_str(), short_path(&f.filename), f.line);
                    let next = frames.len();
                    let k = *frame_ids.entry(key).or_insert(next);
                    if k == next {
                        frames.push(json!([key.0, key.1, key.2]));
                    }
                    k
                })
                .collect(),
        );
    }
    let s = &trace.settings;
    let data = json!({
        "title": opts.title,
        "source": trace.source,
        "policy": policy_label,
        "note": note,
        "settings": {
            "conf": s.conf,
            "expandable_segments": s.expandable_segments,
            "max_split_size": s.max_split_size,
            "garbage_collection_threshold": s.garbage_collection_threshold,
        },
        "generator": concat!("cudamem-report ", env!("CARGO_PKG_VERSION")),
        "devices": devices,
        "frames": frames,
        "stacks": stacks,
    });
    let data = data.to_string().replace('<', "\\u003c");
    TEMPLATE
        .replacen("__TITLE__", &html_escape(&opts.title), 1)
        .replacen("/*__CSS__*/", CSS, 1)
        .replacen("/*__JS__*/", JS, 1)
        .replacen("__DATA__", &data, 1)
}

fn html_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests;
