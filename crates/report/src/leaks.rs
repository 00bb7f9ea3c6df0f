//! # Leaks: what is still allocated, grouped by the stack that allocated it
//!
//! [`leaks`] answers "after `del` and `empty_cache()`, what is still live, and who allocated
//! it?". The live set is found in one of two ways:
//!
//! * **at the end of a snapshot** (the trace has `segments`): the snapshot's
//!   `active_allocated` blocks are the live set — they are the allocator's own record, and they
//!   include allocations made before history recording started. A block without a stack takes
//!   the stack of the trace's `alloc` event that is still live at its address, if any.
//! * **anywhere else** (a marked point, or a trace without segments such as an RMM log): the
//!   trace's events are paired — `alloc` opens an allocation at its address, `free_requested`
//!   closes it — up to and including the point. A free whose `alloc` is not in the trace
//!   (recorded before history started) closes nothing and is counted in
//!   [`LeakReport::unmatched_frees`].
//!
//! A block freed by the caller but still waiting for stream events (`active_pending_free`, or
//! between `free_requested` and `free_completed`) is not live: the program let go of it.
//!
//! Allocations are grouped by (device, stack): the frames of the allocation, or
//! [`NO_STACK`](crate::NO_STACK) when none were recorded. Groups are sorted by total bytes, largest first (then
//! by count, then by device and first frame, so the order is deterministic). Bytes are the
//! sizes the callers asked for (`requested_size`; trace `alloc` sizes are requested sizes too).
//! The example address of a group is its largest allocation (the lowest address of equal sizes).
//!
//! The point ([`At`]) is an event index (the state just after that event of each device, i.e.
//! events `0..=N` applied) or an annotation name: the `k`-th annotation with that exact name
//! (`NAME@k`, 1-based, default 1; `NAME@last` for the last), and events with a time at or
//! before the annotation's time are applied.

use std::collections::HashMap;
use std::fmt;

use cudamem_trace::{Action, BlockState, Frame, StackId, Trace};
use serde_json::{json, Value};

use crate::{frames_json, human, write_frames};

/// Where in the trace to look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum At {
    /// The end of the trace.
    End,
    /// Just after event `N` of each device (0-based; clamped to the last event).
    Event(usize),
    /// At an annotation: its name and which occurrence (1-based; `None` = the last).
    Annotation(String, Option<usize>),
}

impl At {
    /// Parses `--at`: digits are an event index; `NAME`, `NAME@k` and `NAME@last` name an
    /// annotation.
    pub fn parse(s: &str) -> At {
        let t = s.trim();
        if !t.is_empty() && t.bytes().all(|c| c.is_ascii_digit()) {
            if let Ok(n) = t.parse() {
                return At::Event(n);
            }
        }
        if let Some((name, k)) = t.rsplit_once('@') {
            if k == "last" {
                return At::Annotation(name.to_string(), None);
            }
            if let Ok(k) = k.parse::<usize>() {
                if k >= 1 {
                    return At::Annotation(name.to_string(), Some(k));
                }
            }
        }
        At::Annotation(t.to_string(), Some(1))
    }
}

/// One group of live allocations with the same stack.
#[derive(Clone, Debug, PartialEq)]
pub struct LeakGroup {
    /// Device ordinal.
    pub device: i32,
    /// The stack id in the trace, if any.
    pub stack: Option<StackId>,
    /// The allocation's frames, innermost first (empty when none were recorded).
    pub frames: Vec<Frame>,
    /// Number of live allocations.
    pub count: u64,
    /// Their requested bytes.
    pub bytes: u64,
    /// Address of the largest of them.
    pub example_address: u64,
    /// Its requested bytes.
    pub example_size: u64,
}

/// The result of [`leaks`].
#[derive(Clone, Debug, PartialEq)]
pub struct LeakReport {
    /// The trace's name.
    pub source: String,
    /// What `at` resolved to, in words ("the end of the trace", "after event 1234", ...).
    pub point: String,
    /// Where the live set came from: `"snapshot segments"` or `"trace events"`.
    pub basis: &'static str,
    /// Groups, largest total first.
    pub groups: Vec<LeakGroup>,
    /// Live allocations in all groups.
    pub count: u64,
    /// Their requested bytes.
    pub bytes: u64,
    /// Frees in the applied events whose `alloc` the trace does not contain.
    pub unmatched_frees: u64,
}

struct Live {
    size: u64,
    stack: Option<StackId>,
}

/// Resolves `at` to a per-device cut: the number of events of each device to apply.
fn cut(trace: &Trace, at: &At) -> Result<(Vec<usize>, String), String> {
    match at {
        At::End => Ok((
            trace.devices.iter().map(|d| d.events.len()).collect(),
            "the end of the trace".into(),
        )),
        At::Event(n) => {
            let max = trace.devices.iter().map(|d| d.events.len()).max().unwrap_or(0);
            if max == 0 {
                return Err(format!(
                    "{}: the trace has no events, so there is no event {n}",
                    trace.source
                ));
            }
            if *n >= max {
                return Err(format!(
                    "{}: event index {n} is past the last event ({})",
                    trace.source,
                    max - 1
                ));
            }
            Ok((
                trace.devices.iter().map(|d| (n + 1).min(d.events.len())).collect(),
                format!("after event {n}"),
            ))
        }
        At::Annotation(name, k) => {
            let hits: Vec<_> = trace.annotations.iter().filter(|a| &a.name == name).collect();
            if hits.is_empty() {
                let mut names: Vec<&str> = trace.annotations.iter().map(|a| a.name.as_str()).collect();
                names.sort_unstable();
                names.dedup();
                let known = if names.is_empty() {
                    "the trace has no annotations".to_string()
                } else {
                    format!(
                        "known annotations: {}",
                        names.iter().take(20).copied().collect::<Vec<_>>().join(", ")
                    )
                };
                return Err(format!(
                    "{}: no annotation named '{name}' ({known}); --at also takes an event index",
                    trace.source
                ));
            }
            let a = match k {
                None => hits[hits.len() - 1],
                Some(k) => *hits.get(k - 1).ok_or_else(|| {
                    format!(
                        "{}: annotation '{name}' occurs {} times, not {k}",
                        trace.source,
                        hits.len()
                    )
                })?,
            };
            let counts = trace
                .devices
                .iter()
                .map(|d| d.events.partition_point(|e| e.time_us <= a.time_us))
                .collect();
            let which = match k {
                None => "last".to_string(),
                Some(k) => format!("#{k}"),
            };
            Ok((
                counts,
                format!("annotation '{}' ({} {}, t={} us)", name, which, a.stage, a.time_us),
            ))
        }
    }
}

/// Allocations still live at `at` (see the [module docs](self)).
pub fn leaks(trace: &Trace, at: &At) -> Result<LeakReport, String> {
    let (counts, point) = cut(trace, at)?;
    let mut unmatched = 0u64;
    // (device, address) -> live allocation, from the events.
    let mut by_events: Vec<(i32, HashMap<u64, Live>)> = Vec::new();
    for (d, &n) in trace.devices.iter().zip(&counts) {
        let mut live: HashMap<u64, Live> = HashMap::new();
        for e in &d.events[..n] {
            match e.action {
                Action::Alloc => {
                    live.insert(
                        e.addr,
                        Live {
                            size: e.size,
                            stack: e.stack,
                        },
                    );
                }
                // The guard closes the allocation; a free that closes none is counted.
                Action::FreeRequested if live.remove(&e.addr).is_none() => unmatched += 1,
                _ => {}
            }
        }
        by_events.push((d.device, live));
    }
    let use_segments = *at == At::End && !trace.segments.is_empty();
    // (device, stack) -> (count, bytes, example addr, example size)
    type Key = (i32, Option<StackId>);
    let mut groups: HashMap<Key, (u64, u64, u64, u64)> = HashMap::new();
    let mut add = |device: i32, stack: Option<StackId>, addr: u64, size: u64| {
        let g = groups.entry((device, stack)).or_insert((0, 0, addr, size));
        g.0 += 1;
        g.1 += size;
        if size > g.3 || (size == g.3 && addr < g.2) {
            g.2 = addr;
            g.3 = size;
        }
    };
    if use_segments {
        for s in &trace.segments {
            let ev = by_events.iter().find(|(d, _)| *d == s.device).map(|(_, m)| m);
            for b in s.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated) {
                let stack = b
                    .stack
                    .or_else(|| ev.and_then(|m| m.get(&b.address)).and_then(|l| l.stack));
                add(s.device, stack, b.address, b.requested_size);
            }
        }
    } else {
        for (device, live) in &by_events {
            let mut v: Vec<(&u64, &Live)> = live.iter().collect();
            v.sort_by_key(|(a, _)| **a);
            for (addr, l) in v {
                add(*device, l.stack, *addr, l.size);
            }
        }
    }
    let mut groups: Vec<LeakGroup> = groups
        .into_iter()
        .map(
            |((device, stack), (count, bytes, example_address, example_size))| LeakGroup {
                device,
                stack,
                frames: stack
                    .and_then(|id| trace.stacks.get(id as usize))
                    .map(|s| s.frames.clone())
                    .unwrap_or_default(),
                count,
                bytes,
                example_address,
                example_size,
            },
        )
        .collect();
    groups.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.count.cmp(&a.count))
            .then(a.device.cmp(&b.device))
            .then_with(|| {
                a.frames
                    .first()
                    .map(|f| (&f.filename, f.line))
                    .cmp(&b.frames.first().map(|f| (&f.filename, f.line)))
            })
            .then(a.example_address.cmp(&b.example_address))
    });
    Ok(LeakReport {
        source: trace.source.clone(),
        point,
        basis: if use_segments {
            "snapshot segments"
        } else {
            "trace events"
        },
        count: groups.iter().map(|g| g.count).sum(),
        bytes: groups.iter().map(|g| g.bytes).sum(),
        groups,
        unmatched_frees: unmatched,
    })
}

impl LeakReport {
    /// The point as a sentence says it: "after event N" as it is, every other point after "at".
    fn point_phrase(&self) -> String {
        if self.point.starts_with("after ") {
            self.point.clone()
        } else {
            format!("at {}", self.point)
        }
    }

    /// The text rendering with the `top` largest groups and at most `frames` frames each.
    pub fn to_text(&self, top: usize, frames: usize) -> String {
        let mut s = String::new();
        use fmt::Write;
        let sites = self.groups.len();
        let _ = writeln!(
            s,
            "{}: {} live allocation{} ({}) {} from {} call site{} (from the {})",
            self.source,
            self.count,
            if self.count == 1 { "" } else { "s" },
            human(self.bytes),
            self.point_phrase(),
            sites,
            if sites == 1 { "" } else { "s" },
            self.basis
        );
        if self.unmatched_frees > 0 {
            let _ = writeln!(
                s,
                "note: {} free(s) have no alloc in the trace (recorded before history started)",
                self.unmatched_frees
            );
        }
        let multi = self.groups.iter().any(|g| g.device != self.groups[0].device);
        for (i, g) in self.groups.iter().take(top).enumerate() {
            let _ = writeln!(
                s,
                "\n#{:<3} {:>10} in {} allocation{}{}   e.g. {:#x} ({})",
                i + 1,
                human(g.bytes),
                g.count,
                if g.count == 1 { "" } else { "s" },
                if multi {
                    format!(" on device {}", g.device)
                } else {
                    String::new()
                },
                g.example_address,
                human(g.example_size)
            );
            write_frames(&mut s, &g.frames, frames, "      ");
        }
        if self.groups.len() > top {
            let rest: u64 = self.groups[top..].iter().map(|g| g.bytes).sum();
            let n: u64 = self.groups[top..].iter().map(|g| g.count).sum();
            let _ = writeln!(
                s,
                "\n... {} more call sites: {} in {} allocations",
                self.groups.len() - top,
                human(rest),
                n
            );
        }
        s
    }

    /// The report as JSON (all groups; sizes in bytes).
    pub fn to_json(&self) -> Value {
        json!({
            "trace": self.source,
            "at": self.point,
            "basis": self.basis,
            "count": self.count,
            "bytes": self.bytes,
            "unmatched_frees": self.unmatched_frees,
            "groups": self.groups.iter().map(|g| json!({
                "device": g.device,
                "count": g.count,
                "bytes": g.bytes,
                "example_address": g.example_address,
                "example_size": g.example_size,
                "frames": frames_json(&g.frames),
            })).collect::<Vec<_>>(),
        })
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text(10, 12))
    }
}
