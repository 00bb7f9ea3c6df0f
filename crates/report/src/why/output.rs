//! # The why report as text and JSON
//!
//! What [`WhyReport`] prints: the pinned segments first, largest pin first, each with the live
//! blocks that pin it and their stacks; the same facts as JSON for tools.

use std::fmt;

use serde_json::{json, Value};

use super::{asleep, Reason, SegmentWhy, WhyReport};
use crate::{frames_json, human, write_frames};

impl WhyReport {
    /// Segments whose free bytes stay reserved, most pinned bytes first.
    pub fn pinned_segments(&self) -> Vec<&SegmentWhy> {
        let mut v: Vec<&SegmentWhy> = self.segments.iter().filter(|s| s.pinned > 0).collect();
        v.sort_by(|a, b| b.pinned.cmp(&a.pinned).then(a.address.cmp(&b.address)));
        v
    }

    /// Bytes that stay reserved after `empty_cache()`: the allocated blocks and the free bytes
    /// they (or private pools) pin, `allocated + pinned`, the same sums as the segment rows
    /// (and `reserved - releasable` by the module's guarantee).
    pub fn stays_reserved(&self) -> u64 {
        self.allocated.saturating_add(self.pinned)
    }

    /// The one-paragraph answer: "empty_cache() would release X now; Y stays reserved: A
    /// allocated and P free that N live blocks pin in M segments", where Y = A + P and P is the
    /// sum of the pinned segments' rows.
    pub fn headline(&self) -> String {
        // "1 segment", "2 segments".
        let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        let partly = self
            .segments
            .iter()
            .any(|s| s.is_expandable && s.releasable > 0 && s.releasable < s.total_size);
        let mut s = format!(
            "empty_cache() would release {} now ({}{})",
            human(self.releasable),
            count(self.segments.iter().filter(|s| s.releasable > 0).count(), "segment"),
            if partly {
                ", counting partly released expandable ones"
            } else {
                ""
            }
        );
        match (self.stays_reserved(), self.pinned) {
            (0, _) => return s + "; nothing stays reserved",
            (stays, 0) => return s + &format!("; {} stays reserved: all of it allocated", human(stays)),
            (stays, _) => s.push_str(&format!("; {} stays reserved: ", human(stays))),
        }
        let mut parts = Vec::new();
        if self.allocated > 0 {
            parts.push(format!("{} allocated", human(self.allocated)));
        }
        let (by_blocks, by_pools): (Vec<&SegmentWhy>, Vec<&SegmentWhy>) = self
            .pinned_segments()
            .into_iter()
            .partition(|p| p.reason != Reason::PrivatePool);
        if !by_blocks.is_empty() {
            let blocks: usize = by_blocks.iter().map(|p| p.pinned_by.len()).sum();
            parts.push(format!(
                "{} free that {} pin{} in {}",
                human(by_blocks.iter().map(|p| p.pinned).sum()),
                count(blocks, "live block"),
                if blocks == 1 { "s" } else { "" },
                count(by_blocks.len(), "segment")
            ));
        }
        if !by_pools.is_empty() {
            parts.push(format!(
                "{} free in {} of private pools",
                human(by_pools.iter().map(|p| p.pinned).sum()),
                count(by_pools.len(), "segment")
            ));
        }
        if let Some((last, rest)) = parts.split_last() {
            if !rest.is_empty() {
                s.push_str(&format!("{} and ", rest.join(", ")));
            }
            s.push_str(last);
        }
        s
    }

    /// The text rendering: totals, the headline, then the `top` most pinned segments with at
    /// most `blocks` pinning blocks each and `frames` frames per block.
    pub fn to_text(&self, top: usize, blocks: usize, frames: usize) -> String {
        use fmt::Write;
        let mut s = String::new();
        let free = self.reserved.saturating_sub(self.allocated);
        let _ = writeln!(
            s,
            "{} (from {}): reserved {}, allocated {}, free in the cache {}",
            self.source,
            self.basis,
            human(self.reserved),
            human(self.allocated),
            human(free)
        );
        if self.pending_free > 0 {
            let _ = writeln!(
                s,
                "({} of the free bytes are blocks freed but still used by other streams; empty_cache() waits for them first)",
                human(self.pending_free)
            );
        }
        s.push_str(&asleep::text(&self.asleep));
        let pinned = self.pinned_segments();
        let _ = write!(s, "\n{}", self.headline());
        s.push_str(if pinned.is_empty() { ".\n" } else { ":\n" });
        let multi = self.segments.iter().any(|x| x.device != self.segments[0].device);
        for p in pinned.iter().take(top) {
            let dev = if multi {
                format!("device {} ", p.device)
            } else {
                String::new()
            };
            let kind = format!(
                "{}{} pool, stream {}",
                if p.is_expandable { "expandable, " } else { "" },
                p.segment_type.as_str(),
                p.stream
            );
            match p.reason {
                Reason::PrivatePool => {
                    let _ = writeln!(
                        s,
                        "\n  {dev}segment {:#x} ({}, {kind}): {} free, held by private pool {:?} (CUDA graph or MemPool)",
                        p.address,
                        human(p.total_size),
                        human(p.pinned),
                        p.pool_id
                    );
                }
                _ => {
                    let what = if p.is_expandable {
                        "in partly used pages, next to"
                    } else {
                        "pinned by"
                    };
                    let _ = writeln!(
                        s,
                        "\n  {dev}segment {:#x} ({}, {kind}): {} free {what} {} live block{}:",
                        p.address,
                        human(p.total_size),
                        human(p.pinned),
                        p.pinned_by.len(),
                        if p.pinned_by.len() == 1 { "" } else { "s" }
                    );
                    for b in p.pinned_by.iter().take(blocks) {
                        let _ = writeln!(
                            s,
                            "      {} at {:#x} (requested {})",
                            human(b.size),
                            b.address,
                            human(b.requested_size)
                        );
                        write_frames(&mut s, &b.frames, frames, "          ");
                    }
                    if p.pinned_by.len() > blocks {
                        let _ = writeln!(s, "      ... {} more blocks", p.pinned_by.len() - blocks);
                    }
                }
            }
        }
        if pinned.len() > top {
            let rest: u64 = pinned[top..].iter().map(|p| p.pinned).sum();
            let _ = writeln!(
                s,
                "\n  ... {} more pinned segments hold {}",
                pinned.len() - top,
                human(rest)
            );
        }
        let rel: Vec<&SegmentWhy> = self.segments.iter().filter(|x| x.releasable > 0).collect();
        if !rel.is_empty() {
            let _ = writeln!(s, "\nreleasable now:");
            for r in rel.iter().take(top) {
                let _ = writeln!(
                    s,
                    "  segment {:#x} ({}, {} pool{}): {}{}",
                    r.address,
                    human(r.total_size),
                    r.segment_type.as_str(),
                    if r.is_expandable { ", expandable" } else { "" },
                    human(r.releasable),
                    if r.is_expandable && r.releasable < r.total_size {
                        " of whole free pages"
                    } else {
                        ""
                    }
                );
            }
            if rel.len() > top {
                let _ = writeln!(s, "  ... {} more segments", rel.len() - top);
            }
        }
        s
    }

    /// The report as JSON (every segment; sizes in bytes).
    pub fn to_json(&self) -> Value {
        json!({
            "trace": self.source,
            "basis": self.basis,
            "reserved": self.reserved,
            "allocated": self.allocated,
            "pending_free": self.pending_free,
            "releasable": self.releasable,
            "pinned": self.pinned,
            "stays_reserved": self.stays_reserved(),
            "headline": self.headline(),
            "asleep": asleep::to_json(&self.asleep),
            "segments": self.segments.iter().map(|s| json!({
                "device": s.device,
                "address": s.address,
                "total_size": s.total_size,
                "segment_type": s.segment_type.as_str(),
                "stream": s.stream,
                "pool_id": [s.pool_id.0, s.pool_id.1],
                "is_expandable": s.is_expandable,
                "allocated": s.allocated,
                "pending_free": s.pending_free,
                "releasable": s.releasable,
                "pinned": s.pinned,
                "reason": match s.reason { Reason::None => "none", Reason::LiveBlocks => "live_blocks", Reason::PrivatePool => "private_pool" },
                "pinned_by": s.pinned_by.iter().map(|b| json!({
                    "address": b.address, "size": b.size, "requested_size": b.requested_size,
                    "frames": frames_json(&b.frames),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }
}

impl fmt::Display for WhyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text(10, 5, 6))
    }
}
