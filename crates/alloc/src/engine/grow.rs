//! # Getting device memory, and out of memory
//!
//! [`Engine::alloc_block`] is PyTorch's `alloc_block`: a whole segment from the device, or pages
//! of an expandable segment (see `expandable.rs`), within the memory fraction if one is set.
//! [`Engine::raise_oom`] records the `oom` history entry and counts it; the error
//! ([`Engine::out_of_memory_error`]) carries PyTorch's figures plus the largest free block.
//! Invariants: a segment is counted (stats, history, `total_allocated_memory`) exactly when the
//! device gave it; a device failure other than out of memory is an error, never `Ok(None)`.

use cudamem_device::StreamId;

use super::{Engine, Request};
use crate::block::{Block, BlockId, PoolId, SegmentId};
use crate::error::{AllocError, OutOfMemory};
use crate::history::Action;
use crate::segment::{Backing, Segment};
use crate::stats::{Array, StatSink, OVERSIZE_SEGMENTS};

impl<S: StatSink> Engine<S> {
    #[cold]
    pub(super) fn raise_oom(&mut self, req: &Request, orig_size: u64) -> AllocError {
        let err = self.out_of_memory_error(orig_size, req.alloc_size, false);
        if let AllocError::OutOfMemory(o) = &err {
            let free = o.free;
            self.trace(Action::Oom, free, req.size, req.stream, self.current_stack);
        }
        self.stats.num_ooms += 1;
        err
    }

    pub(super) fn out_of_memory_error(&self, requested: u64, tried: u64, over: bool) -> AllocError {
        let (free, total) = self.device.mem_get_info().unwrap_or((0, self.device.total_memory()));
        AllocError::OutOfMemory(Box::new(OutOfMemory {
            device: self.device.index(),
            requested,
            tried,
            total,
            free,
            process_used: total.saturating_sub(free),
            allowed: self.allowed_memory_maximum,
            allocated: self.stats().allocated_bytes.all().current as u64,
            reserved: self.stats().reserved_bytes.all().current as u64,
            largest_free_block: self.largest_free_block(),
            over_one_exabyte: over,
            not_moved_during_capture: self.private.active > 0 && self.policy.get().reclaim_at_limit(),
        }))
    }

    /// The largest free cached block (PyTorch's `cacheInfo`).
    pub fn largest_free_block(&self) -> u64 {
        self.pools.iter().filter_map(|p| p.blocks.max_size()).max().unwrap_or(0)
    }

    /// Gets device memory for the request (PyTorch `alloc_block`). `Ok(None)` means out of
    /// memory; any other device failure is an error.
    pub(super) fn alloc_block(&mut self, req: &Request, is_retry: bool) -> Result<Option<BlockId>, AllocError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        // Near the limit, make room before a growth that would be refused, rather than after
        // mapping part of it: the device refuses a mapping only once it is out of memory.
        if self.private.active == 0 && self.policy.get().reclaim_at_limit() && !self.plentiful(req.pool, req.alloc_size)
        {
            self.reclaim_at_limit(req)?;
        }
        if let Some(max) = self.allowed_memory_maximum {
            if self.total_allocated_memory.saturating_add(req.alloc_size) > max {
                return Ok(None);
            }
        }
        if let Some(page_size) = self.growth_page_size(req.pool) {
            let need = req.size.div_ceil(page_size) * page_size;
            // Never while a private pool is being allocated to (a CUDA-graph capture): an unmap
            // waits for its stream, which a capture forbids.
            if self.private.active == 0 && self.policy.get().reclaim_before_growth(need) {
                self.reclaim_free_pages(req.pool, need)?;
            }
            return self.try_allocate_expandable_block(req, page_size);
        }
        let size = req.alloc_size;
        let ptr = match self.segment_device(req.pool).malloc(size) {
            Ok(p) => p,
            Err(e) if e.is_out_of_memory() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        self.total_allocated_memory += size;
        let seg = self.segments.insert(Segment {
            base: ptr,
            size,
            pool: req.pool,
            stream: req.stream,
            backing: Backing::Malloc,
            stack: self.current_stack,
            oversize: size >= self.config.max_split_size,
        });
        self.private.count_segment(req.pool, true);
        let id = self
            .blocks
            .insert(self.new_block(ptr, size, req.stream, req.pool, seg, false));
        let small = req.small;
        self.stat_up(Array::Segment, small, 1);
        self.stat_up(Array::ReservedBytes, small, size);
        if self.segments[seg].oversize {
            self.oversize_change(OVERSIZE_SEGMENTS, true);
        }
        self.stats.num_device_alloc += 1;
        self.trace(Action::SegmentAlloc, ptr, size, req.stream, self.current_stack);
        Ok(Some(id))
    }

    /// The page size a growth of `pool` maps, `None` when it takes whole segments.
    pub(super) fn growth_page_size(&self, pool: PoolId) -> Option<u64> {
        match self.private.is_private(pool) {
            false => self.policy.expandable_page_size(&self.config, pool),
            // Private pools take whole segments, as PyTorch's do; tags' pools map pages.
            true => self.tag_page_size(pool),
        }
    }

    pub(super) fn new_block(
        &self,
        addr: u64,
        size: u64,
        stream: StreamId,
        pool: PoolId,
        segment: SegmentId,
        expandable: bool,
    ) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            pool,
            segment,
            prev: None,
            next: None,
            allocated: false,
            mapped: true,
            event_count: 0,
            stream_uses: None,
            gc_count_base: 0,
            stack: None,
            expandable,
            oversize: false,
        }
    }
}
