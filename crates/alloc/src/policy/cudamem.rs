//! # The `cudamem` policies: PyTorch's allocator on 2 MiB pages, with or without compaction
//!
//! Fragmentation in PyTorch's allocator is memory that is *reserved* (mapped or `cudaMalloc`ed)
//! but sits in holes between live blocks at the moment of the peak. Expandable segments remove
//! most of it by packing blocks back to back in one growing address range, but they map 20 MiB
//! pages for the large pool, so a pool's mapped range ends up to 20 MiB past its last block and
//! the retry path can only give back whole 20 MiB pages.
//!
//! The policies keep PyTorch's rounding, pools, best fit and stream semantics, and change:
//! 1. **Every pool grows in pages of the device granularity (2 MiB on an H200)**: the mapped
//!    range ends at most 2 MiB past the last block, and any wholly free 2 MiB page can go back.
//! 2. **Split whenever at least 512 bytes remain** (as in expandable segments): blocks pack back
//!    to back, with no 1 MiB sliver rule.
//! 3. **Release under pressure**: when the device (or the memory fraction) cannot supply a new
//!    page, PyTorch's retry path unmaps every wholly free page and maps the request again — with
//!    2 MiB pages that frees far more than 20 MiB pages do, so a job fits a smaller GPU.
//!
//! `cudamem` (the default) behaves by how near the limit memory is (the device's memory, or
//! the memory fraction's limit):
//! * **Plentiful** ([`WHOLE_GROWTH_HEADROOM`]): a growth is one device mapping.
//! * **Nearer the limit**: growths are mapped in [`MAP_CHUNK`] pieces, and page by page once
//!   less than [`PAGE_MAPPING_HEADROOM`] of the memory stays unreserved, so that any free page a
//!   growth leaves in a hole can later go back on its own.
//! * **Large growths** (at least [`LARGE_GROWTH`]), at any distance from the limit, are mapped
//!   in pieces (of [`RECLAIM_CHUNK`] while memory is plentiful), and if one would take the
//!   reserved total past the most this allocator ever held, the wholly free mappings inside
//!   holes are unmapped first, as `cudamem-compact16` does for every growth: the few large
//!   temporaries that make a training step's holes (a language model's logits) move their
//!   memory once, in the first step, and later steps find it where they need it.
//! * **At the limit** (a growth the device or the memory fraction refuses): the free mappings
//!   inside holes are unmapped, only as many bytes as the request lacks, and the request is
//!   mapped again, before PyTorch's ladder (which synchronises and releases the whole cache).
//!   This is `cudamem-compact`'s reclaim, done only when memory has run out, so it is where
//!   `cudamem fit` finds its smallest GPU.
//!
//! While memory is plentiful it therefore maps and unmaps nothing after warm-up, so a training
//! loop pays no steady-state cost; near the limit its first iteration makes more, smaller
//! mappings, and a pass at the limit moves pages instead of releasing the cache.
//!
//! `cudamem-compact` adds **reclaim at the high-water mark**: before mapping new pages, if the
//! growth would take the reserved total above the most this allocator ever held, the whole free
//! pages inside holes are unmapped first (largest holes first, only until the growth fits under
//! the mark). The physical memory of a hole moves to where it is needed instead of new memory
//! being added, which keeps peak reserved within ~3% of peak requested on the shared traces. The
//! price is driver calls: the holes of one iteration are reused by the next, so reclaimed pages
//! are mapped again — measured on an H200 as microseconds per allocation (see the README). Use it
//! when memory, not time, is what runs out.
//!
//! `cudamem-compact16` reclaims as `cudamem-compact` does, in the [`MAP_CHUNK`] mappings that
//! `cudamem` maps near the limit: a reclaim gives back only mappings that are wholly free, so it
//! keeps a little more than `cudamem-compact`, but it makes an eighth of the mappings, and where
//! a loop's holes recur in the same places (training steps) its later iterations find the
//! memory where they need it and reclaim nothing — no steady-state driver calls. Where the
//! layout drifts between iterations (variable lengths, several streams) it still remaps.
//!
//! Invariants: those of the engine (see [`crate::block`]), plus: a reclaim never unmaps a byte of
//! a block that is allocated or waiting for events (only free blocks are candidates, and only
//! their whole pages), and none happens while a private pool is being allocated to (a CUDA-graph
//! capture: an unmap waits for its stream).

use super::pytorch::PytorchPolicy;
use super::{Policy, PoolSpec};
use crate::block::{Block, PoolId};
use crate::config::AllocatorConfig;

/// Page size when the device reports none other: 2 MiB, the VMM granularity of current GPUs.
pub const PAGE: u64 = 2 << 20;

/// `cudamem` maps a growth in device allocations of up to 16 MiB (8 pages). A driver mapping
/// (`cuMemCreate`+`cuMemMap`+`cuMemSetAccess`) costs about the same whatever its size up to
/// tens of MiB (the `vmm_costs` example measures it), so mapping page by page multiplies the
/// first iteration's driver time; a larger chunk makes fewer calls but gives less back on the
/// retry path, which unmaps a mapping only when it is wholly free. The rule: the chunk is the
/// largest with which every shared trace still fits a smaller GPU (`cudamem fit`) than under
/// expandable segments. The calls it makes beyond expandable segments' are a one-time cost of
/// the first iteration; after warm-up it maps nothing.
pub const MAP_CHUNK: u64 = 16 << 20;

/// `cudamem` maps a growth as one device mapping while at least this share of the memory it may
/// use stays unreserved after it, and in [`MAP_CHUNK`] pieces below that. Each mapping costs
/// about what a `cudaMalloc` does, whatever its size up to hundreds of MiB, so a first
/// iteration on a GPU with room to spare makes one driver mapping per growth; near the limit,
/// where the retry path can give back only whole mappings, growths are cut. The rule: the
/// lowest share (the most growths made whole) with which every shared trace still fits
/// (`cudamem fit`) the same smallest GPU as with [`MAP_CHUNK`] pieces alone.
pub const WHOLE_GROWTH_HEADROOM: f64 = 0.9;

/// `cudamem` reclaims free mappings at the high-water mark before a growth of at least this
/// many bytes, and maps such a growth in pieces. A large growth is the one whose excess a
/// reclaim removes at a price of a few driver calls per hundreds of MiB, once, in the first
/// iteration of a loop; smaller growths recur where a layout drifts (variable lengths), and
/// reclaiming for them remaps in every iteration. The rule: the smallest power of two at which
/// no shared or recorded trace's warm pass makes a driver call.
pub const LARGE_GROWTH: u64 = 512 << 20;

/// `cudamem` maps a [`LARGE_GROWTH`] in mappings of this many bytes while memory is plentiful
/// (in [`MAP_CHUNK`] pieces near the limit). Larger pieces make fewer driver calls but leave
/// less that a reclaim can unmap. The rule: the largest power of two with which gpt2_train,
/// the shared trace whose excess the reclaim removes, stays within 3% of its peak requested.
pub const RECLAIM_CHUNK: u64 = 64 << 20;

/// `cudamem` maps a growth one page per mapping while less than this share of the memory it
/// may use stays unreserved after it (in [`MAP_CHUNK`] pieces above it). The driver gives back
/// a mapping only whole, so a hole that keeps part of a larger mapping keeps all of it when a
/// request at the limit needs the memory; holes that matter at the limit can have been mapped
/// long before it. Pages cost a driver call each, so the share is no higher than needed. The
/// rule: the lowest tenth with which every trace of `tests/data` fits (`cudamem fit`) within 3%
/// of its peak requested.
pub const PAGE_MAPPING_HEADROOM: f64 = 0.8;

/// Whether, and for which growths, a `cudamem` policy reclaims free memory at the high-water
/// mark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reclaim {
    /// Before growths of at least [`LARGE_GROWTH`] while memory is plentiful, in
    /// [`RECLAIM_CHUNK`] mappings (`cudamem`).
    #[default]
    LargeGrowths,
    /// Free pages, each its own mapping (`cudamem-compact`).
    Pages,
    /// Wholly free [`MAP_CHUNK`] mappings (`cudamem-compact16`).
    Chunks,
}

/// The `cudamem`, `cudamem-compact` and `cudamem-compact16` policies. See the
/// module documentation (`policy/cudamem.rs`).
#[derive(Clone, Copy, Debug, Default)]
pub struct CudamemPolicy {
    /// Reclaim at the high-water mark, and in what units.
    pub reclaim: Reclaim,
}

impl Policy for CudamemPolicy {
    fn name(&self) -> &str {
        match self.reclaim {
            Reclaim::LargeGrowths => "cudamem",
            Reclaim::Pages => "cudamem-compact",
            Reclaim::Chunks => "cudamem-compact16",
        }
    }
    fn pools(&self) -> Vec<PoolSpec> {
        PytorchPolicy.pools()
    }
    fn round_size(&self, cfg: &AllocatorConfig, size: u64) -> u64 {
        cfg.round_size(size)
    }
    fn pool_for(&self, cfg: &AllocatorConfig, rounded: u64) -> PoolId {
        PytorchPolicy.pool_for(cfg, rounded)
    }
    fn allocation_size(&self, cfg: &AllocatorConfig, rounded: u64) -> u64 {
        // Used for the memory-fraction check and the OOM message; growth maps only what fits.
        PytorchPolicy.allocation_size(cfg, rounded)
    }
    fn expandable_page_size(&self, _cfg: &AllocatorConfig, _pool: PoolId) -> Option<u64> {
        Some(PAGE)
    }
    fn accepts_cached(&self, cfg: &AllocatorConfig, rounded: u64, candidate: u64) -> bool {
        PytorchPolicy.accepts_cached(cfg, rounded, candidate)
    }
    fn should_split(&self, _cfg: &AllocatorConfig, block: &Block, rounded: u64, _small: bool) -> bool {
        block.size - rounded >= super::pytorch::MIN_BLOCK_SIZE
    }
    fn reclaim_before_growth(&self, need: u64) -> bool {
        match self.reclaim {
            Reclaim::LargeGrowths => need >= LARGE_GROWTH,
            Reclaim::Pages | Reclaim::Chunks => true,
        }
    }
    fn map_chunk(&self, _cfg: &AllocatorConfig, _pool: PoolId) -> Option<u64> {
        // What a reclaim can unmap is a wholly free mapping: cudamem-compact maps single pages
        // so that every free page can go.
        (self.reclaim != Reclaim::Pages).then_some(MAP_CHUNK)
    }
    fn reclaim_chunk(&self, _cfg: &AllocatorConfig, _pool: PoolId) -> Option<u64> {
        (self.reclaim == Reclaim::LargeGrowths).then_some(RECLAIM_CHUNK)
    }
    fn whole_growth_headroom(&self, _cfg: &AllocatorConfig, _pool: PoolId) -> Option<f64> {
        // A growth mapped whole could be reclaimed only whole: the compact policies cut it.
        (self.reclaim == Reclaim::LargeGrowths).then_some(WHOLE_GROWTH_HEADROOM)
    }
    fn page_mapping_headroom(&self, _cfg: &AllocatorConfig, _pool: PoolId) -> Option<f64> {
        (self.reclaim == Reclaim::LargeGrowths).then_some(PAGE_MAPPING_HEADROOM)
    }
    fn reclaim_at_limit(&self) -> bool {
        self.reclaim == Reclaim::LargeGrowths
    }

    fn builtin(&self, _: super::sealed::Token) -> Option<super::Builtin> {
        Some(super::Builtin::Cudamem(*self))
    }
}
