//! The viewer's data for one device: the segments' and blocks' bands over time, built from the
//! trace's events and its snapshot, as the JSON the page's script draws.

#[allow(unused_imports)]
use super::*;

/// One allocation of the page: a band of the timeline and a block of the segment map.
#[derive(Clone, Debug)]
pub(super) struct Band {
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
pub(super) struct Ranges(pub(super) BTreeMap<u64, u64>);

impl Ranges {
    pub(super) fn add(&mut self, a: u64, b: u64) {
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
    pub(super) fn remove(&mut self, a: u64, b: u64) -> Vec<(u64, u64)> {
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
    pub(super) fn missing(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        let mut r = Ranges(self.0.clone());
        r.remove(a, b)
    }
}

pub(super) fn device_data(
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
