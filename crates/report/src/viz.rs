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

/// One allocation of the page: a band of the timeline and a block of the segment map.
#[derive(Clone, Debug)]
struct Band {
    s: i64,
    fr: usize,
    e: usize,
    size: u64,
    bsize: u64,
    addr: u64,
    stack: Option<StackId>,
}

/// Disjoint half-open intervals.
#[derive(Default)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    fn add(&mut self, a: u64, b: u64) {
        let (mut a, mut b) = (a, b);
        let over: Vec<(u64, u64)> = self
            .0
            .range(..=b)
            .filter(|(_, &e)| e >= a)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in over {
            self.0.remove(&s);
            a = a.min(s);
            b = b.max(e);
        }
        self.0.insert(a, b);
    }
    /// Removes [a, b); returns the parts that were not present.
    fn remove(&mut self, a: u64, b: u64) -> Vec<(u64, u64)> {
        let over: Vec<(u64, u64)> = self
            .0
            .range(..b)
            .filter(|(_, &e)| e > a)
            .map(|(&s, &e)| (s, e))
            .collect();
        let mut missing = Vec::new();
        let mut cur = a;
        for (s, e) in over {
            if s > cur {
                missing.push((cur, s));
            }
            cur = cur.max(e);
            self.0.remove(&s);
            if s < a {
                self.0.insert(s, a);
            }
            if e > b {
                self.0.insert(b, e);
            }
        }
        if cur < b {
            missing.push((cur, b));
        }
        missing
    }
    /// The parts of [a, b) that are not present.
    fn missing(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        let mut r = Ranges(self.0.clone());
        r.remove(a, b)
    }
}

fn device_data(
    trace: &Trace,
    dt: &DeviceTrace,
    block_sizes: Option<&Vec<u64>>,
    cfg: &AllocatorConfig,
    opts: &VizOptions,
    stack_ids: &mut HashMap<StackId, usize>,
) -> Value {
    let ev = &dt.events;
    let n = ev.len();
    let est = |size: u64| if size == 0 { 0 } else { cfg.round_size(size) };
    let mut bands: Vec<Band> = Vec::new();
    let mut live: HashMap<u64, usize> = HashMap::new();
    let mut pending: HashMap<u64, usize> = HashMap::new();
    let mut k = 0usize;
    // segment events: (index, action, addr, size)
    let mut segev: Vec<(usize, Action, u64, u64)> = Vec::new();
    let mut native: HashMap<u64, u64> = HashMap::new();
    let mut init_segs: Vec<(u64, u64)> = Vec::new();
    let mut mapped = Ranges::default();
    let mut init_maps: Vec<(u64, u64)> = Vec::new();
    let mut ooms = Vec::new();
    for (i, e) in ev.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                let bs = block_sizes
                    .and_then(|v| v.get(k).copied())
                    .filter(|&b| b > 0)
                    .unwrap_or_else(|| est(e.size));
                k += 1;
                if let Some(old) = live.remove(&e.addr) {
                    bands[old].fr = i;
                    bands[old].e = i;
                }
                bands.push(Band {
                    s: i as i64,
                    fr: n,
                    e: n,
                    size: e.size,
                    bsize: bs,
                    addr: e.addr,
                    stack: e.stack,
                });
                live.insert(e.addr, bands.len() - 1);
            }
            Action::FreeRequested => {
                let b = match live.remove(&e.addr) {
                    Some(b) => b,
                    None => {
                        bands.push(Band {
                            s: -1,
                            fr: n,
                            e: n,
                            size: e.size,
                            bsize: est(e.size),
                            addr: e.addr,
                            stack: None,
                        });
                        bands.len() - 1
                    }
                };
                bands[b].fr = i;
                pending.insert(e.addr, b);
            }
            Action::FreeCompleted => {
                if let Some(b) = pending.remove(&e.addr) {
                    bands[b].e = i;
                }
            }
            Action::SegmentAlloc => {
                native.insert(e.addr, e.size);
                segev.push((i, e.action, e.addr, e.size));
            }
            Action::SegmentFree => {
                if native.remove(&e.addr).is_none() {
                    init_segs.push((e.addr, e.size));
                }
                segev.push((i, e.action, e.addr, e.size));
            }
            Action::SegmentMap => {
                mapped.add(e.addr, e.addr + e.size);
                segev.push((i, e.action, e.addr, e.size));
            }
            Action::SegmentUnmap => {
                init_maps.extend(mapped.remove(e.addr, e.addr + e.size));
                segev.push((i, e.action, e.addr, e.size));
            }
            Action::Oom => ooms.push(i),
            _ => {}
        }
    }
    // What the snapshot holds that no event explains existed from the start.
    for s in trace.segments.iter().filter(|s| s.device == dt.device) {
        if s.asleep {
            // A sleeping tag's range is not mapped now; its live blocks still count below.
        } else if s.is_expandable {
            init_maps.extend(mapped.missing(s.address, s.address + s.total_size));
        } else if native.get(&s.address) != Some(&s.total_size) {
            init_segs.push((s.address, s.total_size));
        }
        for b in &s.blocks {
            if b.state == BlockState::Inactive || live.contains_key(&b.address) || pending.contains_key(&b.address) {
                continue;
            }
            let fr = if b.state == BlockState::ActivePendingFree { 0 } else { n };
            bands.push(Band {
                s: -1,
                fr,
                e: n,
                size: b.requested_size,
                bsize: b.size,
                addr: b.address,
                stack: b.stack,
            });
        }
    }
    // Expandable spans: the union of every range ever mapped, touching ranges merged.
    let mut ever = Ranges::default();
    for &(a, b) in &init_maps {
        ever.add(a, b);
    }
    for &(_, act, a, sz) in &segev {
        if act == Action::SegmentMap {
            ever.add(a, a + sz);
        }
    }
    let spans: Vec<(u64, u64)> = ever.0.iter().map(|(&a, &b)| (a, b)).collect();
    let span_of = |a: u64| spans.partition_point(|&(s, _)| s <= a).saturating_sub(1);

    // Base address for compact numbers.
    let base = bands
        .iter()
        .map(|b| b.addr)
        .chain(segev.iter().map(|s| s.2))
        .chain(init_segs.iter().map(|s| s.0))
        .chain(spans.iter().map(|s| s.0))
        .min()
        .unwrap_or(0);

    // Peaks: reserved from the segment events, active from the bands.
    let mut reserved: i64 =
        init_segs.iter().map(|s| s.1 as i64).sum::<i64>() + init_maps.iter().map(|(a, b)| (b - a) as i64).sum::<i64>();
    let (mut peak_res, mut peak_res_at) = (reserved, 0usize);
    for &(i, act, _, sz) in &segev {
        match act {
            Action::SegmentAlloc | Action::SegmentMap => reserved += sz as i64,
            _ => reserved -= sz as i64,
        }
        if reserved > peak_res {
            peak_res = reserved;
            peak_res_at = i;
        }
    }
    let mut delta_active = vec![0i64; n + 1];
    let mut delta_alloc = vec![0i64; n + 1];
    let mut delta_req = vec![0i64; n + 1];
    for b in &bands {
        let s = b.s.max(0) as usize;
        delta_active[s] += b.bsize as i64;
        delta_active[b.e.min(n)] -= b.bsize as i64;
        delta_alloc[s] += b.bsize as i64;
        delta_alloc[b.fr.min(n)] -= b.bsize as i64;
        delta_req[s] += b.size as i64;
        delta_req[b.fr.min(n)] -= b.size as i64;
    }
    let peak = |d: &[i64]| {
        let (mut cur, mut best, mut at) = (0i64, 0i64, 0usize);
        for (i, x) in d.iter().enumerate().take(n.max(1)) {
            cur += x;
            if cur > best {
                best = cur;
                at = i;
            }
        }
        (best.max(0) as u64, at)
    };
    let (peak_active, _) = peak(&delta_active);
    let (peak_alloc, _) = peak(&delta_alloc);
    let (peak_req, _) = peak(&delta_req);

    // Which bands the timeline draws one by one.
    let kept: Option<Vec<usize>> = if bands.len() > opts.max_bands {
        let mut idx: Vec<usize> = (0..bands.len()).collect();
        idx.sort_by(|&a, &b| {
            let (x, y) = (&bands[a], &bands[b]);
            y.bsize
                .cmp(&x.bsize)
                .then((y.e as i64 - y.s).cmp(&(x.e as i64 - x.s)))
                .then(a.cmp(&b))
        });
        idx.truncate(opts.max_bands);
        idx.sort_unstable();
        Some(idx)
    } else {
        None
    };

    let mut stack_id = |s: Option<StackId>| -> i64 {
        match s {
            None => -1,
            Some(id) => {
                let next = stack_ids.len();
                *stack_ids.entry(id).or_insert(next) as i64
            }
        }
    };
    let col = |f: &dyn Fn(&Band) -> i64| -> Vec<i64> { bands.iter().map(f).collect() };
    let stacks_col: Vec<i64> = bands.iter().map(|b| stack_id(b.stack)).collect();
    let t0 = ev.first().map_or(0, |e| e.time_us);
    let mut prev = t0;
    let dt_col: Vec<i64> = ev
        .iter()
        .map(|e| {
            let d = e.time_us - prev;
            prev = e.time_us;
            d
        })
        .collect();
    let act: Vec<u8> = ev.iter().map(|e| e.action.code()).collect();
    let ann: Vec<Value> = trace
        .annotations
        .iter()
        .filter(|a| a.device == dt.device)
        .take(500)
        .map(|a| json!([ev.partition_point(|e| e.time_us < a.time_us), a.stage, a.name]))
        .collect();
    let rel = |a: u64| a - base;
    json!({
        "device": dt.device,
        "n": n,
        "base": base,
        "t0": t0,
        "dt": dt_col,
        "act": act,
        "bands": {
            "s": col(&|b| b.s),
            "fr": col(&|b| b.fr as i64),
            "e": col(&|b| b.e as i64),
            "size": col(&|b| b.size as i64),
            "bsize": col(&|b| b.bsize as i64),
            "addr": col(&|b| rel(b.addr) as i64),
            "stack": stacks_col,
        },
        "kept": kept,
        "segs": {
            "i": segev.iter().map(|s| s.0).collect::<Vec<_>>(),
            "act": segev.iter().map(|s| s.1.code()).collect::<Vec<_>>(),
            "addr": segev.iter().map(|s| rel(s.2)).collect::<Vec<_>>(),
            "size": segev.iter().map(|s| s.3).collect::<Vec<_>>(),
            "span": segev.iter().map(|s| if matches!(s.1, Action::SegmentMap | Action::SegmentUnmap) { span_of(s.2) as i64 } else { -1 }).collect::<Vec<_>>(),
        },
        "init_segs": init_segs.iter().map(|&(a, s)| json!([rel(a), s])).collect::<Vec<_>>(),
        "init_maps": init_maps.iter().map(|&(a, b)| json!([rel(a), b - a, span_of(a)])).collect::<Vec<_>>(),
        "spans": spans.iter().map(|&(a, b)| json!([rel(a), b - a])).collect::<Vec<_>>(),
        "ann": ann,
        "ooms": ooms,
        "peak_reserved": peak_res.max(0),
        "peak_reserved_at": peak_res_at,
        "peak_active": peak_active,
        "peak_allocated": peak_alloc,
        "peak_requested": peak_req,
        "allocations": bands.len(),
    })
}

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
mod tests {
    use super::*;
    use cudamem_trace::{DeviceTrace, TraceEvent};

    fn ev(action: Action, addr: u64, size: u64) -> TraceEvent {
        TraceEvent {
            action,
            addr,
            size,
            stream: 0,
            time_us: 0,
            stack: None,
        }
    }

    fn small_trace() -> Trace {
        let mut t = Trace::new("t</script><script>alert(1)</script>");
        t.devices.push(DeviceTrace {
            device: 0,
            events: vec![
                ev(Action::SegmentAlloc, 1 << 30, 2 << 20),
                ev(Action::Alloc, 1 << 30, 1000),
                ev(Action::Alloc, (1 << 30) + 1024, 100),
                ev(Action::FreeRequested, 1 << 30, 1000),
                ev(Action::FreeCompleted, 1 << 30, 1000),
            ],
        });
        t
    }

    /// Every `src=`, `href=` and `import` in the page, with what follows.
    fn references(html: &str) -> Vec<String> {
        let lower = html.to_ascii_lowercase();
        let mut out = Vec::new();
        for pat in ["src=", "href=", "import ", "import(", "@import", "url("] {
            let mut from = 0;
            while let Some(i) = lower[from..].find(pat) {
                let at = from + i;
                out.push(lower[at..(at + 80).min(lower.len())].to_string());
                from = at + pat.len();
            }
        }
        out
    }

    #[test]
    fn html_is_self_contained_and_has_the_views() {
        let html = viz(&small_trace(), "unit <test>");
        for r in references(&html) {
            assert!(
                !r.contains("http://") && !r.contains("https://") && !r.contains("//"),
                "external reference: {r}"
            );
        }
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "a URL in the page"
        );
        for id in [
            "id=\"timeline\"",
            "id=\"segmap\"",
            "id=\"curve\"",
            "id=\"summary\"",
            "id=\"cudamem-data\"",
        ] {
            assert!(html.contains(id), "missing {id}");
        }
        assert!(html.contains("Active memory timeline"));
        assert!(html.contains("Reserved vs allocated"));
        assert!(html.contains("memory_summary()"));
        // The trace's name cannot close the data block.
        assert_eq!(
            html.matches("</script>").count(),
            2,
            "one data block and one code block"
        );
        assert!(html.contains("unit &lt;test&gt;"));
        // The summary tables are embedded.
        assert!(html.contains("PyTorch CUDA memory summary"));
    }

    #[test]
    fn bands_pair_allocs_and_frees() {
        let t = small_trace();
        let mut ids = HashMap::new();
        let d = device_data(
            &t,
            &t.devices[0],
            None,
            &AllocatorConfig::default(),
            &VizOptions::default(),
            &mut ids,
        );
        assert_eq!(d["bands"]["s"], json!([1, 2]));
        assert_eq!(d["bands"]["fr"], json!([3, 5]));
        assert_eq!(d["bands"]["e"], json!([4, 5]));
        assert_eq!(d["bands"]["bsize"], json!([1024, 512]));
        assert_eq!(d["peak_reserved"], json!(2 << 20));
        assert_eq!(d["peak_active"], json!(1536));
    }

    #[test]
    fn frees_without_allocs_and_unmaps_without_maps_start_live() {
        let mut t = Trace::new("t");
        t.devices.push(DeviceTrace {
            device: 0,
            events: vec![
                ev(Action::FreeRequested, 4096, 100),
                ev(Action::FreeCompleted, 4096, 100),
                ev(Action::SegmentUnmap, 1 << 21, 2 << 20),
                ev(Action::SegmentMap, 1 << 22, 2 << 20),
            ],
        });
        let mut ids = HashMap::new();
        let d = device_data(
            &t,
            &t.devices[0],
            None,
            &AllocatorConfig::default(),
            &VizOptions::default(),
            &mut ids,
        );
        assert_eq!(d["bands"]["s"], json!([-1]));
        assert_eq!(d["init_maps"].as_array().unwrap().len(), 1);
        // The unmapped range and the later map touch: one span of 4 MiB.
        assert_eq!(d["spans"].as_array().unwrap().len(), 1);
        assert_eq!(d["spans"][0][1], json!(4 << 20));
    }

    #[test]
    fn timeline_is_downsampled() {
        let mut t = Trace::new("t");
        let mut events = vec![ev(Action::SegmentAlloc, 1 << 30, 1 << 30)];
        for i in 0..100u64 {
            events.push(ev(Action::Alloc, (1 << 30) + i * (1 << 20), (i + 1) * 4096));
        }
        t.devices.push(DeviceTrace { device: 0, events });
        let mut ids = HashMap::new();
        let opts = VizOptions {
            max_bands: 10,
            ..VizOptions::default()
        };
        let d = device_data(&t, &t.devices[0], None, &AllocatorConfig::default(), &opts, &mut ids);
        let kept = d["kept"].as_array().unwrap();
        assert_eq!(kept.len(), 10);
        assert_eq!(kept[0], json!(90)); // the largest ones
    }

    #[test]
    fn empty_and_segmentless_traces_render() {
        let html = viz(&Trace::new("empty"), "empty");
        assert!(html.contains("\"devices\":[]"));
        let mut t = Trace::new("no segments");
        t.devices.push(DeviceTrace {
            device: 0,
            events: vec![],
        });
        assert!(viz(&t, "t").contains("\"n\":0"));
        t.devices[0].events = vec![ev(Action::Alloc, 4096, 100), ev(Action::FreeRequested, 4096, 100)];
        let html = viz(&t, "t");
        assert!(html.contains("\"init_segs\":[]"));
    }

    #[test]
    fn ranges() {
        let mut r = Ranges::default();
        r.add(0, 10);
        r.add(20, 30);
        r.add(10, 20);
        assert_eq!(r.0.len(), 1);
        assert_eq!(r.remove(5, 35), vec![(30, 35)]);
        assert_eq!(r.0.iter().collect::<Vec<_>>(), vec![(&0, &5)]);
    }
}
