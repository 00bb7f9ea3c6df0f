//! # Releasing cached memory to the device
//!
//! `empty_cache`, the out-of-memory ladder's releases and garbage collection. Only whole
//! segments (or whole pages of expandable segments) go back; a private pool in use keeps its
//! cache; nothing is released while a capture or pool context is open.

#[allow(unused_imports)]
use super::*;

impl<S: StatSink> Engine<S> {
    /// `empty_cache`: waits for outstanding events, then returns every unsplit cached segment and
    /// every whole free page of expandable segments to the device.
    pub fn empty_cache(&mut self) -> Result<(), AllocError> {
        self.release_cached_blocks()
    }

    /// Releases the default pools' cached memory and that of private pools nobody uses; a
    /// private pool in use keeps its cache (a CUDA graph replays into it).
    pub(super) fn release_cached_blocks(&mut self) -> Result<(), AllocError> {
        self.refuse_release_while_allocating_to_pool()?;
        self.synchronize_and_free_events()?;
        // PyTorch releases the large pool first, then the small one.
        let mut order: Vec<usize> = (0..self.pools.len())
            .filter(|&i| !self.private.is_private(PoolId(i as u16)))
            .collect();
        order.sort_by_key(|&i| self.pools[i].is_small);
        for p in order {
            self.release_blocks(PoolId(p as u16))?;
        }
        for s in self.freeable_pools() {
            self.release_private_pool(s)?;
        }
        self.release_awake_tags()
    }

    pub(super) fn release_blocks(&mut self, pool: PoolId) -> Result<(), AllocError> {
        let keys: Vec<_> = self.pools[pool.0 as usize].blocks.iter().map(|k| k.3).collect();
        let mut to_unmap = Vec::new();
        for id in keys {
            let b = &self.blocks[id];
            if b.expandable {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(id)?;
            }
        }
        for id in to_unmap {
            self.unmap_block(id)?;
            if !self.blocks[id].is_split() {
                self.release_expandable_segment(id)?;
            }
        }
        // Segments that were never mapped (their first growth failed) are one unmapped block
        // and appear in no free set: release their address space too.
        let empty: Vec<BlockId> = self.pools[pool.0 as usize]
            .unmapped
            .iter()
            .map(|k| k.2)
            .filter(|&id| !self.blocks[id].is_split())
            .collect();
        for id in empty {
            self.release_expandable_segment(id)?;
        }
        Ok(())
    }

    /// Returns an unsplit cached segment to the device (PyTorch `release_block`).
    pub(super) fn release_block(&mut self, id: BlockId) -> Result<(), AllocError> {
        let (addr, size, stream, pool, seg) = {
            let b = &self.blocks[id];
            debug_assert!(!b.expandable && !b.is_split());
            (b.addr, b.size, b.stream, b.pool, b.segment)
        };
        let seg_stack = self.segments[seg].stack;
        self.segment_device(pool).free(addr, size)?;
        self.stats.num_device_free += 1;
        self.trace(Action::SegmentFree, addr, size, stream, seg_stack);
        self.total_allocated_memory -= size;
        let small = self.is_small(pool);
        self.stat_down(Array::Segment, small, 1);
        self.stat_down(Array::ReservedBytes, small, size);
        if self.segments[seg].oversize {
            self.oversize_change(OVERSIZE_SEGMENTS, false);
        }
        self.remove_free(id);
        self.blocks.remove(id);
        self.segments.remove(seg);
        self.private.count_segment(pool, false);
        Ok(())
    }

    /// Frees oversize cached blocks, just enough for the request (PyTorch
    /// `release_available_cached_blocks`); only with a `max_split_size`.
    pub(super) fn release_available_cached_blocks(&mut self, req: &Request) -> Result<bool, AllocError> {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let key_size = req.size.max(max_split);
        // Only whole device segments can be freed here: blocks of expandable segments give back
        // pages through the full release instead (as in PyTorch).
        let blocks = &self.blocks;
        let pool = &self.pools[req.pool.0 as usize];
        // (A split block can be here only if max_split_size was lowered at run time.)
        let whole = |k: &crate::block::SizeKey| !blocks[k.3].expandable && !blocks[k.3].is_split();
        let found = pool.blocks.from_size(req.stream, key_size).find(whole);
        match found {
            Some(k) => {
                self.release_block(k.3)?;
                Ok(true)
            }
            None => {
                // No single block is large enough: free oversize blocks, largest first.
                let victims: Vec<_> = pool
                    .blocks
                    .below_size(req.stream, key_size)
                    .take_while(|k| k.1 >= max_split)
                    .filter(whole)
                    .collect();
                let mut released = 0;
                for k in victims {
                    if released >= key_size {
                        break;
                    }
                    released += k.1;
                    self.release_block(k.3)?;
                }
                Ok(released >= key_size)
            }
        }
    }

    /// Frees old unsplit cached blocks when usage passes the GC threshold (PyTorch
    /// `garbage_collect_cached_blocks`); never synchronises.
    pub(super) fn garbage_collect_cached_blocks(&mut self) -> Result<(), AllocError> {
        let Some(max) = self.allowed_memory_maximum else {
            return Ok(());
        };
        let threshold = (self.config.garbage_collection_threshold * max as f64) as u64;
        if self.total_allocated_memory <= threshold {
            return Ok(());
        }
        let target = self.total_allocated_memory - threshold;
        let large: Vec<usize> = (0..self.pools.len())
            .filter(|&i| !self.pools[i].is_small && !self.private.is_private(PoolId(i as u16)))
            .collect();
        let age = |e: &Engine<S>, id: BlockId| {
            let b = &e.blocks[id];
            e.pools[b.pool.0 as usize].get_free_blocks_call_count - b.gc_count_base
        };
        let freeable = |e: &Engine<S>| -> Vec<BlockId> {
            large
                .iter()
                .flat_map(|&p| e.pools[p].blocks.iter().map(|k| k.3))
                .filter(|&id| !e.blocks[id].is_split() && !e.blocks[id].expandable)
                .collect()
        };
        let mut reclaimed = 0;
        let mut candidates = freeable(self);
        let mut total_age: i64 = candidates.iter().map(|&id| age(self, id)).sum();
        while reclaimed < target && !candidates.is_empty() {
            let threshold_age = total_age as f64 / candidates.len() as f64;
            let mut freed_any = false;
            for id in candidates.clone() {
                let a = age(self, id);
                if a as f64 >= threshold_age {
                    reclaimed += self.blocks[id].size;
                    total_age -= a;
                    self.release_block(id)?;
                    freed_any = true;
                }
            }
            if !freed_any {
                break;
            }
            candidates = freeable(self);
        }
        Ok(())
    }
}
