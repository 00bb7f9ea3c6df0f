//! # The `cudamem` policy: PyTorch's allocator with 2 MiB pages and reclaim at the high-water mark
//!
//! Fragmentation in PyTorch's allocator is memory that is *reserved* (mapped or `cudaMalloc`ed)
//! but sits in holes between live blocks at the moment of the peak. Expandable segments remove
//! most of it by packing blocks back to back in one growing address range, but they still map
//! 20 MiB pages for the large pool and never give a hole's pages back while the job runs, so a
//! hole left by a freed tensor stays reserved while the segment grows past it.
//!
//! This policy keeps PyTorch's rounding, pools, best fit and stream semantics, and changes three
//! things:
//! 1. **Every pool grows in pages of the device granularity (2 MiB on an H200)**, so a pool's
//!    mapped range ends at most 2 MiB past its last block, and a hole of one free page can be
//!    given back.
//! 2. **Split whenever at least 512 bytes remain** (as in expandable segments): blocks pack
//!    back to back; no 1 MiB sliver rule is needed, because free pages go back to the device.
//! 3. **Reclaim at the high-water mark**: before mapping new pages, if the growth would take the
//!    reserved total above the most this allocator ever held, the whole free pages inside holes
//!    of the pool's segments are unmapped first (largest holes first, only until the growth fits
//!    under the mark again). The physical memory of a hole thus moves to where it is needed
//!    instead of new memory being added. Below the mark nothing is unmapped, so a job in steady
//!    state — the same peak every step — maps and unmaps nothing after its first steps.
//!
//! Costs, and why they are acceptable: mapping 2 MiB pages takes more driver calls than
//! PyTorch's 20 MiB pages when a pool first grows, and a reclaim waits for the segment's stream
//! before unmapping (as `empty_cache` does in PyTorch). Both happen only while the job reaches a
//! new peak. The replay reports the calls (`device_maps`, `device_unmaps`); the H200 measurement
//! of their time is in the README.
//!
//! Invariants: those of the engine (see [`crate::block`]), plus: a reclaim never unmaps a byte of
//! a block that is allocated or waiting for events (only free blocks are candidates, and only
//! their whole pages), and reserved memory never exceeds the high-water mark unless no whole free
//! page remains in the pool.

use super::pytorch::PytorchPolicy;
use super::{Policy, PoolSpec};
use crate::block::{Block, PoolId};
use crate::config::AllocatorConfig;

/// Page size when the device reports none other: 2 MiB, the VMM granularity of current GPUs.
pub const PAGE: u64 = 2 << 20;

/// The `cudamem` policy. See the [module documentation](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct CudamemPolicy;

impl Policy for CudamemPolicy {
    fn name(&self) -> &str {
        "cudamem"
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
    fn reclaim_before_growth(&self) -> bool {
        true
    }
}
