//! # The `pytorch` policy: PyTorch's native caching allocator, rule for rule
//!
//! Source of truth: `c10/cuda/CUDACachingAllocator.cpp` (torch 2.x) and the goldens captured from
//! torch 2.11. Each rule below names the PyTorch function it reproduces.
//!
//! * `round_size`: at least 512 bytes; multiples of 512, or power-of-two divisions when
//!   `roundup_power2_divisions` asks for them (see [`AllocatorConfig::round_size`]).
//! * `get_pool`: blocks of at most 1 MiB go to the small pool, others to the large pool.
//! * `get_allocation_size`: a small block gets a 2 MiB segment; a block under 10 MiB a 20 MiB
//!   segment (`large_segment_size`); anything else its size rounded up to 2 MiB.
//! * `get_free_block`: a cached block of at least `max_split_size` never serves a smaller request;
//!   a request of at least `max_split_size` takes a cached block only if it wastes less than
//!   `max_non_split_rounding` (20 MiB by default).
//! * `should_split`: in the small pool, or with expandable segments, split if at least 512 bytes
//!   remain; in the large pool split only if the request is under `max_split_size` and more than
//!   1 MiB remains.
//! * Expandable segments (`expandable_segments:True`): pages of 2 MiB for the small pool and of
//!   `large_segment_size` (20 MiB) for the large pool.

use super::{Policy, PoolSpec};
use crate::block::{Block, PoolId};
use crate::config::AllocatorConfig;

/// Largest request of the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size of the small pool.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Requests below this get a `large_segment_size` segment.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Larger segments are rounded to a multiple of this.
pub const ROUND_LARGE: u64 = 2 << 20;
/// Every block is a multiple of this.
pub const MIN_BLOCK_SIZE: u64 = 512;

const SMALL: PoolId = PoolId(0);
const LARGE: PoolId = PoolId(1);

/// PyTorch's native policy (with `expandable_segments` taken from the configuration).
#[derive(Clone, Copy, Debug, Default)]
pub struct PytorchPolicy;

impl Policy for PytorchPolicy {
    fn name(&self) -> &str {
        "pytorch"
    }

    fn reproduces_pytorch(&self) -> bool {
        true
    }

    fn pools(&self) -> Vec<PoolSpec> {
        vec![PoolSpec { is_small: true }, PoolSpec { is_small: false }]
    }

    fn round_size(&self, cfg: &AllocatorConfig, size: u64) -> u64 {
        cfg.round_size(size)
    }

    fn pool_for(&self, _cfg: &AllocatorConfig, rounded: u64) -> PoolId {
        if rounded <= SMALL_SIZE {
            SMALL
        } else {
            LARGE
        }
    }

    fn allocation_size(&self, cfg: &AllocatorConfig, rounded: u64) -> u64 {
        if rounded <= SMALL_SIZE {
            SMALL_BUFFER
        } else if rounded < MIN_LARGE_ALLOC {
            cfg.large_segment_size
        } else {
            rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
        }
    }

    fn expandable_page_size(&self, cfg: &AllocatorConfig, pool: PoolId) -> Option<u64> {
        cfg.expandable_segments.then_some(if pool == SMALL {
            SMALL_BUFFER
        } else {
            cfg.large_segment_size
        })
    }

    fn accepts_cached(&self, cfg: &AllocatorConfig, rounded: u64, candidate: u64) -> bool {
        let max_split = cfg.max_split_size;
        if rounded < max_split && candidate >= max_split {
            return false; // an oversize block never serves a normal request
        }
        if rounded >= max_split && candidate >= rounded.saturating_add(cfg.max_non_split_rounding) {
            return false; // an oversize request may waste at most max_non_split_rounding
        }
        true
    }

    fn should_split(&self, cfg: &AllocatorConfig, block: &Block, rounded: u64, small_pool: bool) -> bool {
        let remaining = block.size - rounded;
        if small_pool || block.expandable {
            remaining >= MIN_BLOCK_SIZE
        } else {
            rounded < cfg.max_split_size && remaining > SMALL_SIZE
        }
    }

    fn builtin(&self, _: super::sealed::Token) -> Option<super::Builtin> {
        Some(super::Builtin::Pytorch(*self))
    }
}
