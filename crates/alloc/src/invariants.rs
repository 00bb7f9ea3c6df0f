//! # Invariants, executable
//!
//! [`check`] walks the whole state and returns the first broken rule. Tests call it after every
//! step; it is far too slow for production paths and never runs there.
//!
//! Rules checked:
//! 1. The blocks of each segment tile it, linked in address order, with consistent back links.
//! 2. Free-set membership matches block state (free+mapped in `blocks`, free+unmapped in
//!    `unmapped`), and every set entry names a live block with the key's size and address.
//! 3. No two adjacent blocks are both free, idle, and equally mapped (merging is eager).
//! 4. Every allocated block is in the pointer map under its address, and nothing else is.
//! 5. Stats add up: allocated/active/requested bytes and counts, reserved bytes and segment
//!    counts equal what the blocks and segments sum to; `all == small_pool + large_pool`.
//! 6. Tags keep their rules (see [`crate::engine`]'s `tags` module): slept ranges and their
//!    counters agree, and tags' segments are expandable.

use std::collections::HashSet;

use crate::block::{BlockId, Pool};
use crate::engine::Engine;
use crate::stats::StatArray;

/// Checks every invariant of `e`.
pub fn check<S: crate::stats::StatSink>(e: &Engine<S>) -> Result<(), String> {
    let mut seen: HashSet<BlockId> = HashSet::new();
    let (mut reserved, mut segs) = ([0i64; 3], [0i64; 3]);
    for (sid, seg) in e.segments.iter() {
        let head = e
            .blocks
            .iter()
            .find(|(_, b)| b.segment == sid && b.prev.is_none())
            .ok_or_else(|| format!("segment {:#x} has no head block", seg.base))?;
        if head.1.addr != seg.base {
            return Err(format!("segment {:#x}: head block at {:#x}", seg.base, head.1.addr));
        }
        let (mut cur, mut end) = (Some(head.0), seg.base);
        let mut prev: Option<BlockId> = None;
        while let Some(id) = cur {
            if !e.blocks.is_live(id) {
                return Err(format!("segment {:#x}: a link names a removed block", seg.base));
            }
            let b = &e.blocks[id];
            if b.addr != end || b.prev != prev || b.segment != sid {
                return Err(format!(
                    "segment {:#x}: block {:#x} breaks the tiling",
                    seg.base, b.addr
                ));
            }
            if let Some(p) = prev {
                let pb = &e.blocks[p];
                if pb.is_free() && b.is_free() && pb.mapped == b.mapped {
                    return Err(format!(
                        "free neighbours {:#x} and {:#x} are not merged",
                        pb.addr, b.addr
                    ));
                }
            }
            if !b.mapped && !b.expandable {
                return Err(format!("unmapped block {:#x} outside an expandable segment", b.addr));
            }
            seen.insert(id);
            end = b.addr + b.size;
            prev = Some(id);
            cur = b.next;
        }
        if end != seg.base + seg.size {
            return Err(format!(
                "segment {:#x}: blocks end at {:#x}, segment at {:#x}",
                seg.base,
                end,
                seg.base + seg.size
            ));
        }
        let i = if e.pools[seg.pool.0 as usize].is_small { 1 } else { 2 };
        reserved[i] += seg.mapped_bytes() as i64;
        if !seg.is_expandable() {
            segs[i] += 1;
        }
    }
    if seen.len() != e.blocks.len() {
        return Err(format!("{} blocks belong to no segment", e.blocks.len() - seen.len()));
    }
    check_pools(e)?;
    check_allocated(e)?;
    e.check_tags()?;
    let s = &e.stats();
    let sum = |f: &dyn Fn(&crate::block::Block) -> i64, pred: &dyn Fn(&crate::block::Block) -> bool| {
        let mut v = [0i64; 3];
        for (_, b) in e.blocks.iter().filter(|(_, b)| pred(b)) {
            let i = if e.pools[b.pool.0 as usize].is_small { 1 } else { 2 };
            v[i] += f(b);
        }
        v[0] = v[1] + v[2];
        v
    };
    reserved[0] = reserved[1] + reserved[2];
    segs[0] = segs[1] + segs[2];
    let alloc = |b: &crate::block::Block| b.allocated;
    let active = |b: &crate::block::Block| b.allocated || !b.is_free();
    expect("allocated_bytes", &s.allocated_bytes, sum(&|b| b.size as i64, &alloc))?;
    expect("allocation", &s.allocation, sum(&|_| 1, &alloc))?;
    expect("active_bytes", &s.active_bytes, sum(&|b| b.size as i64, &active))?;
    expect("active", &s.active, sum(&|_| 1, &active))?;
    expect(
        "requested_bytes",
        &s.requested_bytes,
        sum(&|b| b.requested as i64, &active),
    )?;
    expect("reserved_bytes", &s.reserved_bytes, reserved)?;
    expect("segment", &s.segment, segs)?;
    let split_free = |b: &crate::block::Block| b.is_free() && b.is_split() && !b.expandable;
    expect("inactive_split", &s.inactive_split, sum(&|_| 1, &split_free))?;
    expect(
        "inactive_split_bytes",
        &s.inactive_split_bytes,
        sum(&|b| b.size as i64, &split_free),
    )?;
    if e.total_allocated_memory() as i64 != reserved[0] {
        return Err(format!(
            "total_allocated_memory {} != reserved {}",
            e.total_allocated_memory(),
            reserved[0]
        ));
    }
    Ok(())
}

fn expect(name: &str, arr: &StatArray, want: [i64; 3]) -> Result<(), String> {
    for (i, pool) in ["all", "small_pool", "large_pool"].iter().enumerate() {
        if arr.0[i].current != want[i] {
            return Err(format!(
                "{name}.{pool}.current is {} but the blocks add up to {}",
                arr.0[i].current, want[i]
            ));
        }
    }
    Ok(())
}

fn check_pools<S: crate::stats::StatSink>(e: &Engine<S>) -> Result<(), String> {
    let mut in_sets = HashSet::new();
    for pool in &e.pools {
        for k in pool.blocks.iter() {
            if !e.blocks.is_live(k.3) {
                return Err(format!("free set entry {:#x} names a removed block", k.2));
            }
            let b = &e.blocks[k.3];
            if Pool::size_key(k.3, b) != k || !b.is_free() || !b.mapped {
                return Err(format!("free set entry {:#x} does not match its block", k.2));
            }
            in_sets.insert(k.3);
        }
        for k in &pool.unmapped {
            if !e.blocks.is_live(k.2) {
                return Err(format!("unmapped set entry {:#x} names a removed block", k.1));
            }
            let b = &e.blocks[k.2];
            if Pool::addr_key(k.2, b) != *k || !b.is_free() || b.mapped {
                return Err(format!("unmapped set entry {:#x} does not match its block", k.1));
            }
            in_sets.insert(k.2);
        }
    }
    for (id, b) in e.blocks.iter() {
        if b.is_free() != in_sets.contains(&id) {
            return Err(format!(
                "block {:#x}: free={} but in a free set={}",
                b.addr,
                b.is_free(),
                in_sets.contains(&id)
            ));
        }
    }
    Ok(())
}

fn check_allocated<S: crate::stats::StatSink>(e: &Engine<S>) -> Result<(), String> {
    let n = e.blocks.iter().filter(|(_, b)| b.allocated).count();
    if n != e.allocated.len() {
        return Err(format!(
            "{} allocated blocks but {} in the pointer map",
            n,
            e.allocated.len()
        ));
    }
    for id in e.allocated.ids() {
        if !e.blocks.is_live(id) || !e.blocks[id].allocated {
            return Err(format!("pointer map entry of block {} is stale", id.index()));
        }
        let addr = e.blocks[id].addr;
        if e.allocated.get(addr, |i| e.blocks[i].addr == addr) != Some(id) {
            return Err(format!("pointer map entry {addr:#x} cannot be found by its address"));
        }
    }
    Ok(())
}
