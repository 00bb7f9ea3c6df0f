//! # Expandable segments: growing a pool by mapping pages into a reserved range
//!
//! PyTorch's `expandable_segments`: a segment reserves virtual address space once and maps
//! pages as its pool grows, so a large block can span pages mapped at different times. Blocks
//! of an expandable segment are either mapped (in the pool's free set when free) or unmapped
//! (in its unmapped set); merging never joins a mapped and an unmapped block. Unmapping gives
//! back whole pages only.

#[allow(unused_imports)]
use super::*;

impl<S: StatSink> Engine<S> {
    /// The lowest-addressed run of free and unmapped blocks with `size` bytes of room, in a new
    /// expandable segment if none has room (PyTorch `find_expandable_block`).
    pub(super) fn find_expandable_block(&mut self, req: &Request, page_size: u64) -> Result<BlockId, AllocError> {
        if let Some(c) = self.expandable_run(req) {
            return Ok(c);
        }
        let total = self.device.total_memory();
        let va = (total + total / 8).div_ceil(page_size) * page_size;
        let base = self.device.reserve(va)?;
        let map_chunk = self.policy.get().map_chunk(&self.config, req.pool).unwrap_or(page_size);
        let seg = self.segments.insert(Segment {
            base,
            size: va,
            pool: req.pool,
            stream: req.stream,
            backing: Backing::Expandable {
                page_size,
                map_chunk,
                mappings: Default::default(),
            },
            stack: self.current_stack,
            oversize: false,
        });
        let mut b = self.new_block(base, va, req.stream, req.pool, seg, true);
        b.mapped = false;
        let id = self.blocks.insert(b);
        self.insert_free(id);
        Ok(id)
    }

    /// The first block of the lowest-addressed run of free and unmapped blocks of the request's
    /// pool and stream with room for it, if any.
    fn expandable_run(&self, req: &Request) -> Option<BlockId> {
        let allocatable = |blocks: &BlockArena, b: Option<BlockId>| b.filter(|&b| blocks[b].is_free());
        let pool = &self.pools[req.pool.0 as usize];
        for &(stream, _, id) in pool.unmapped.range((req.stream, 0, BlockId::MIN)..) {
            if stream != req.stream {
                break;
            }
            let mut c = id;
            if let Some(p) = allocatable(&self.blocks, self.blocks[c].prev) {
                c = p;
            }
            let (mut bytes, mut b) = (0u64, Some(c));
            while bytes < req.size {
                match allocatable(&self.blocks, b) {
                    Some(x) => {
                        bytes += self.blocks[x].size;
                        b = self.blocks[x].next;
                    }
                    None => break,
                }
            }
            if bytes >= req.size {
                return Some(c);
            }
        }
        None
    }

    /// The bytes a growth for `req` maps: the unmapped part of the run it extends, in whole
    /// pages, or the whole request in a new segment.
    pub(super) fn bytes_to_map(&self, req: &Request, page_size: u64) -> u64 {
        let Some(c) = self.expandable_run(req) else {
            return req.size.div_ceil(page_size) * page_size;
        };
        let (mut covered, mut to_map, mut b) = (0u64, 0u64, Some(c));
        while covered < req.size {
            let Some(x) = b else { break };
            let blk = &self.blocks[x];
            let mut take = (req.size - covered).min(blk.size);
            if !blk.mapped {
                take = take.div_ceil(page_size) * page_size;
                to_map += take;
            }
            covered += take;
            b = blk.next;
        }
        to_map
    }

    /// Whether memory is plentiful for a growth of `pool` by `size` bytes: the policy's
    /// `whole_growth_headroom` share of the memory this allocator may use stays unreserved
    /// after it (never, without a share). See [`Engine::left_after`].
    pub(super) fn plentiful(&self, pool: PoolId, size: u64) -> bool {
        let Some(share) = self.policy.get().whole_growth_headroom(&self.config, pool) else {
            return false;
        };
        self.left_after(size) >= share
    }

    /// The share of the memory this allocator may use (the memory fraction's limit, else the
    /// device's) that stays unreserved after a growth by `size` bytes. Against the memory
    /// fraction's limit, this allocator's own count; against the device's, what the device
    /// object handed out by its own records (else the engine's count): no driver query on the
    /// allocation path (nor during a capture), and device-wide, so that the shards of
    /// `sharded:True` decide as one engine would.
    fn left_after(&self, size: u64) -> f64 {
        // The memory fraction limits this allocator's own memory; the device's, everyone's.
        let (limit, reserved) = match self.allowed_memory_maximum {
            Some(max) => (max, self.total_allocated_memory),
            None => (
                self.device.total_memory(),
                self.device.handed_out().unwrap_or(self.total_allocated_memory),
            ),
        };
        let left = limit.saturating_sub(reserved.saturating_add(size));
        left as f64 / limit.max(1) as f64
    }

    /// The largest mapping a growth of `pool` by `size` bytes tries first (`u64::MAX`: one;
    /// 0: the pool's `map_chunk`; 1: one page). While memory is plentiful a growth is one
    /// mapping, except one the policy reclaims for: a reclaim unmaps only wholly free mappings,
    /// so its holes must be pieces (of the policy's `reclaim_chunk`). Near the limit (the
    /// policy's `page_mapping_headroom`) it is mapped page by page, so that the reclaim at the
    /// limit can take back any free page. A whole mapping the device refuses falls back to
    /// pieces (`Segment::map`).
    fn growth_mapping_size(&self, pool: PoolId, size: u64) -> u64 {
        let policy = self.policy.get();
        if !self.plentiful(pool, size) {
            let tight = policy.page_mapping_headroom(&self.config, pool);
            return match tight {
                Some(share) if self.left_after(size) < share => 1,
                _ => 0,
            };
        }
        if policy.reclaim_before_growth(size) {
            return policy.reclaim_chunk(&self.config, pool).unwrap_or(0);
        }
        u64::MAX
    }

    /// Maps the first `size` bytes of the unmapped block `to_map` (PyTorch `map_block`).
    /// Returns false when the device is out of memory.
    pub(super) fn map_block(&mut self, to_map: BlockId, size: u64) -> Result<bool, AllocError> {
        let (seg, addr, bsize, stream, pool) = {
            let b = &self.blocks[to_map];
            debug_assert!(!b.mapped && size <= b.size);
            (b.segment, b.addr, b.size, b.stream, b.pool)
        };
        let first = self.growth_mapping_size(pool, size);
        let Some((mptr, msize)) = self.segments[seg].map(&*self.device, addr, size, first)? else {
            return Ok(false);
        };
        debug_assert!(mptr == addr && msize >= size);
        self.remove_free(to_map);
        self.blocks[to_map].mapped = true;
        if msize < bsize {
            let mut rest = self.new_block(addr + msize, bsize - msize, stream, pool, seg, true);
            rest.mapped = false;
            rest.prev = Some(to_map);
            rest.next = self.blocks[to_map].next;
            let rid = self.blocks.insert(rest);
            if let Some(n) = self.blocks[to_map].next {
                self.blocks[n].prev = Some(rid);
            }
            self.blocks[to_map].next = Some(rid);
            self.blocks[to_map].size = msize;
            self.insert_free(rid);
        }
        let (p, n) = (self.blocks[to_map].prev, self.blocks[to_map].next);
        self.try_merge_blocks(to_map, p);
        self.try_merge_blocks(to_map, n);
        self.insert_free(to_map);
        self.total_allocated_memory += msize;
        self.reclaim_watermark = self.reclaim_watermark.max(self.total_allocated_memory);
        let small = self.is_small(pool);
        self.stat_up(Array::ReservedBytes, small, msize);
        self.stats.num_device_alloc += 1;
        self.trace(Action::SegmentMap, mptr, msize, stream, self.current_stack);
        Ok(true)
    }

    /// PyTorch `try_allocate_expandable_block`.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        req: &Request,
        page_size: u64,
    ) -> Result<Option<BlockId>, AllocError> {
        let mut candidate = self.find_expandable_block(req, page_size)?;
        if !self.blocks[candidate].mapped {
            let sz = self.blocks[candidate].size.min(req.size);
            if !self.map_block(candidate, sz)? {
                return Ok(None);
            }
        }
        while self.blocks[candidate].size < req.size {
            let remaining = req.size - self.blocks[candidate].size;
            let next = self.blocks[candidate].next.expect("expandable run continues");
            let sz = remaining.min(self.blocks[next].size);
            if !self.map_block(next, sz)? {
                return Ok(None);
            }
            candidate = next;
        }
        self.remove_free(candidate);
        Ok(Some(candidate))
    }

    /// Unmaps the whole free pages of a free, mapped expandable block (PyTorch `unmap_block`).
    pub(super) fn unmap_block(&mut self, id: BlockId) -> Result<(), AllocError> {
        let (addr, size) = (self.blocks[id].addr, self.blocks[id].size);
        self.unmap_block_range(id, addr, size)
    }

    /// Unmaps the mappings lying wholly inside `[lo, lo+len)`, a part of the free, mapped
    /// expandable block `id`; the rest of the block stays mapped and free.
    pub(super) fn unmap_block_range(&mut self, id: BlockId, lo: u64, len: u64) -> Result<(), AllocError> {
        let (seg, addr, size, stream, pool) = {
            let b = &self.blocks[id];
            (b.segment, b.addr, b.size, b.stream, b.pool)
        };
        debug_assert!(lo >= addr && lo + len <= addr + size);
        let (uptr, usize_) = self.segments[seg].unmap(&*self.device, lo, len)?;
        if usize_ == 0 {
            return Ok(());
        }
        self.remove_free(id);
        let before = uptr - addr;
        if before > 0 {
            let mut bf = self.new_block(addr, before, stream, pool, seg, true);
            bf.prev = self.blocks[id].prev;
            bf.next = Some(id);
            let bid = self.blocks.insert(bf);
            if let Some(p) = self.blocks[id].prev {
                self.blocks[p].next = Some(bid);
            }
            self.blocks[id].prev = Some(bid);
            self.insert_free(bid);
        }
        let after = size - before - usize_;
        if after > 0 {
            let mut af = self.new_block(uptr + usize_, after, stream, pool, seg, true);
            af.prev = Some(id);
            af.next = self.blocks[id].next;
            let aid = self.blocks.insert(af);
            if let Some(n) = self.blocks[id].next {
                self.blocks[n].prev = Some(aid);
            }
            self.blocks[id].next = Some(aid);
            self.insert_free(aid);
        }
        {
            let b = &mut self.blocks[id];
            b.addr = uptr;
            b.size = usize_;
            b.mapped = false;
        }
        let (p, n) = (self.blocks[id].prev, self.blocks[id].next);
        self.try_merge_blocks(id, p);
        self.try_merge_blocks(id, n);
        self.insert_free(id);
        self.total_allocated_memory -= usize_;
        let small = self.is_small(pool);
        self.stat_down(Array::ReservedBytes, small, usize_);
        self.stats.num_device_free += 1;
        self.trace(Action::SegmentUnmap, uptr, usize_, stream, self.current_stack);
        Ok(())
    }

    /// Returns a wholly unmapped expandable segment's address space.
    pub(super) fn release_expandable_segment(&mut self, id: BlockId) -> Result<(), AllocError> {
        let seg = self.blocks[id].segment;
        debug_assert!(!self.blocks[id].mapped && self.blocks[id].size == self.segments[seg].size);
        self.remove_free(id);
        self.blocks.remove(id);
        let s = self.segments.remove(seg);
        self.device.release_reservation(s.base, s.size)?;
        Ok(())
    }
}
