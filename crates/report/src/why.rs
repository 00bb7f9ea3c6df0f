//! # Why is memory still reserved?
//!
//! [`why`] explains every reserved-but-unallocated byte at the end of a trace: which of it
//! `empty_cache()` would return to the device now, and which live blocks keep the rest.
//!
//! **State.** The snapshot's `segments` when the trace has them (the allocator's own record).
//! Otherwise (an RMM log, or a snapshot saved without state) the final state is reconstructed
//! by replaying the trace with the `pytorch` policy and the trace's own settings
//! ([`crate::replay`]; new segments get the recorded addresses) and taking the allocator's
//! `snapshot()`; the trace's stacks are carried onto the blocks.
//!
//! **Rules** — PyTorch's `empty_cache()` (`release_cached_blocks`) first waits for all
//! outstanding stream events, so blocks *pending free* (`active_pending_free`) become free and
//! merge with their free neighbours; then it releases
//!
//! * every segment of the default pools with no allocated block (a `cudaMalloc` segment is
//!   returned whole or not at all: **one allocated block pins the whole segment**), and
//! * for expandable segments, every whole page that lies inside a free run (pages of 2 MiB in
//!   the small pool and `large_segment_size`, 20 MiB by default, in the large pool; pages are
//!   aligned to the segment's start, which PyTorch reports per mapped range). The free bytes of
//!   a page shared with an allocated block stay mapped: the blocks on either side of the free
//!   run pin them.
//!
//! Segments of a private pool (`segment_pool_id` ≠ (0, 0): CUDA graphs, `MemPool`) are not
//! released by `empty_cache()` while the pool exists; their free bytes are reported as pinned
//! by the pool.
//!
//! Segments of a tag (`tag` set: sleep and wake) are released by `empty_cache()` like the
//! default pools' while the tag is awake, in pages of 2 MiB (the device's granularity). Those of
//! a sleeping tag (`asleep`) are not reserved at all: they are left out of every sum and listed
//! per tag instead ([`asleep`]).
//!
//! **Guarantee:** for every segment and in the totals,
//! `reserved = allocated + releasable + pinned`, where `allocated` counts `active_allocated`
//! blocks (rounded sizes, like `memory_allocated()`), and pending-free bytes count as free.
//!
//! The text and JSON forms of the report are in `why/output.rs`.

use cudamem_alloc::config::{AllocatorConfig, LARGE_BUFFER};
use cudamem_trace::{BlockState, Frame, SegmentSnapshot, SegmentType, Trace};

use crate::replay::{run, snapshot, RunOptions};

pub mod asleep;
mod output;
use crate::live_stacks_by_address;
pub use asleep::AsleepTag;

/// Small-pool page size of expandable segments.
const SMALL_PAGE: u64 = 2 << 20;

/// A block that keeps free bytes reserved.
#[derive(Clone, Debug, PartialEq)]
pub struct PinBlock {
    /// Address.
    pub address: u64,
    /// Block size.
    pub size: u64,
    /// Bytes the caller asked for.
    pub requested_size: u64,
    /// Frames of its allocation, innermost first (empty when none were recorded).
    pub frames: Vec<Frame>,
}

/// Why a segment's free bytes stay reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Nothing stays: the segment has no free byte, or `empty_cache()` releases all of it.
    None,
    /// Allocated blocks pin it (a whole `cudaMalloc` segment, or partial pages of an
    /// expandable one).
    LiveBlocks,
    /// It belongs to a private pool (CUDA graph or `MemPool`).
    PrivatePool,
}

/// One segment of the final state.
#[derive(Clone, Debug, PartialEq)]
pub struct SegmentWhy {
    /// Device ordinal.
    pub device: i32,
    /// Base address.
    pub address: u64,
    /// Reserved bytes.
    pub total_size: u64,
    /// Pool kind.
    pub segment_type: SegmentType,
    /// Stream it was allocated for.
    pub stream: u64,
    /// `(0, 0)` for the default pools.
    pub pool_id: (i64, i64),
    /// Expandable segment (one mapped range of one).
    pub is_expandable: bool,
    /// Bytes in allocated blocks.
    pub allocated: u64,
    /// Bytes freed by the caller but waiting for stream events (`empty_cache()` waits for them).
    pub pending_free: u64,
    /// Bytes `empty_cache()` would release now.
    pub releasable: u64,
    /// Free bytes that stay reserved.
    pub pinned: u64,
    /// Why `pinned` is not zero.
    pub reason: Reason,
    /// The blocks that pin `pinned` bytes (all allocated blocks of a `cudaMalloc` segment;
    /// the neighbours of partly free pages in an expandable one), in address order.
    pub pinned_by: Vec<PinBlock>,
}

/// The result of [`why`].
#[derive(Clone, Debug, PartialEq)]
pub struct WhyReport {
    /// The trace's name.
    pub source: String,
    /// Where the final state came from.
    pub basis: String,
    /// Every segment, in (device, address) order.
    pub segments: Vec<SegmentWhy>,
    /// Reserved bytes.
    pub reserved: u64,
    /// Allocated bytes.
    pub allocated: u64,
    /// Pending-free bytes (included in `releasable` + `pinned`).
    pub pending_free: u64,
    /// Bytes `empty_cache()` would release now.
    pub releasable: u64,
    /// Free bytes that stay reserved after `empty_cache()`.
    pub pinned: u64,
    /// The sleeping tags, whose segments the sums above leave out.
    pub asleep: Vec<AsleepTag>,
}

/// Explains the reserved-but-unallocated bytes at the end of `trace` (see the
/// [module docs](self)).
pub fn why(trace: &Trace) -> Result<WhyReport, String> {
    let large_page = AllocatorConfig::parse(&trace.settings.conf)
        .map(|c| c.large_segment_size)
        .unwrap_or(LARGE_BUFFER);
    if !trace.segments.is_empty() || trace.devices.iter().all(|d| d.events.is_empty()) {
        let stacks = live_stacks_by_address(trace);
        let frames_of = |device: i32, b: &cudamem_trace::BlockSnapshot| -> Vec<Frame> {
            b.stack
                .or_else(|| stacks.get(&(device, b.address)).copied().flatten())
                .and_then(|id| trace.stacks.get(id as usize))
                .map(|s| s.frames.clone())
                .unwrap_or_default()
        };
        let (awake, sleeping) = asleep::split(&trace.segments);
        let segs = (awake.into_iter())
            .map(|s| explain(s, large_page, &|b| frames_of(s.device, b)))
            .collect();
        let basis = if trace.segments.is_empty() {
            "an empty trace"
        } else {
            "the snapshot's segments"
        };
        let mut r = report(trace.source.clone(), basis.into(), segs);
        r.asleep = sleeping;
        return Ok(r);
    }
    let r = run(trace, &RunOptions::default())?;
    let snap = snapshot(trace, &r);
    let frames_of = |b: &cudamem_trace::BlockSnapshot| -> Vec<Frame> {
        b.stack
            .and_then(|id| snap.stacks.get(id as usize))
            .map(|s| s.frames.clone())
            .unwrap_or_default()
    };
    let segs = snap
        .segments
        .iter()
        .map(|s| explain(s, large_page, &frames_of))
        .collect();
    Ok(report(
        trace.source.clone(),
        "a replay with policy pytorch and the trace's settings (the trace has no segments)".into(),
        segs,
    ))
}

fn report(source: String, basis: String, mut segments: Vec<SegmentWhy>) -> WhyReport {
    segments.sort_by_key(|s| (s.device, s.address));
    WhyReport {
        source,
        basis,
        reserved: segments.iter().map(|s| s.total_size).sum(),
        allocated: segments.iter().map(|s| s.allocated).sum(),
        pending_free: segments.iter().map(|s| s.pending_free).sum(),
        releasable: segments.iter().map(|s| s.releasable).sum(),
        pinned: segments.iter().map(|s| s.pinned).sum(),
        segments,
        asleep: Vec::new(),
    }
}

/// Explains one segment; `frames` gives a block's allocation frames.
pub fn explain(
    s: &SegmentSnapshot,
    large_page: u64,
    frames: &dyn Fn(&cudamem_trace::BlockSnapshot) -> Vec<Frame>,
) -> SegmentWhy {
    let sum = |st: BlockState| s.blocks.iter().filter(|b| b.state == st).map(|b| b.size).sum::<u64>();
    let allocated = sum(BlockState::ActiveAllocated);
    let pending_free = sum(BlockState::ActivePendingFree);
    // Blocks tile the segment; trust total_size for the free bytes.
    let free_total = s.total_size.saturating_sub(allocated);
    let pin = |b: &cudamem_trace::BlockSnapshot| PinBlock {
        address: b.address,
        size: b.size,
        requested_size: b.requested_size,
        frames: frames(b),
    };
    let mut w = SegmentWhy {
        device: s.device,
        address: s.address,
        total_size: s.total_size,
        segment_type: s.segment_type,
        stream: s.stream,
        pool_id: s.pool_id,
        is_expandable: s.is_expandable,
        allocated,
        pending_free,
        releasable: 0,
        pinned: 0,
        reason: Reason::None,
        pinned_by: Vec::new(),
    };
    if free_total == 0 {
        return w;
    }
    if s.pool_id != (0, 0) && s.tag.is_none() {
        w.pinned = free_total;
        w.reason = Reason::PrivatePool;
        return w;
    }
    if !s.is_expandable {
        if allocated == 0 {
            w.releasable = s.total_size;
        } else {
            w.pinned = free_total;
            w.reason = Reason::LiveBlocks;
            w.pinned_by = s
                .blocks
                .iter()
                .filter(|b| b.state == BlockState::ActiveAllocated)
                .map(pin)
                .collect();
        }
        return w;
    }
    // Expandable: whole pages inside free runs (pending blocks merge with free neighbours).
    let page = if s.segment_type == SegmentType::Small || s.tag.is_some() {
        SMALL_PAGE
    } else {
        large_page.max(1)
    };
    let mut pinners: Vec<usize> = Vec::new();
    let mut i = 0;
    let n = s.blocks.len();
    while i < n {
        if s.blocks[i].state == BlockState::ActiveAllocated {
            i += 1;
            continue;
        }
        let start = s.blocks[i].address;
        let mut j = i;
        while j < n && s.blocks[j].state != BlockState::ActiveAllocated {
            j += 1;
        }
        let end = s.blocks[j - 1].address + s.blocks[j - 1].size;
        let off = |a: u64| a.saturating_sub(s.address);
        let first = off(start).div_ceil(page) * page;
        let last = off(end) / page * page;
        let whole = last.saturating_sub(first);
        w.releasable += whole;
        if end - start > whole {
            if i > 0 {
                pinners.push(i - 1);
            }
            if j < n {
                pinners.push(j);
            }
        }
        i = j;
    }
    w.pinned = free_total - w.releasable.min(free_total);
    if w.pinned > 0 {
        w.reason = Reason::LiveBlocks;
        pinners.sort_unstable();
        pinners.dedup();
        w.pinned_by = pinners.into_iter().map(|k| pin(&s.blocks[k])).collect();
    }
    w
}
