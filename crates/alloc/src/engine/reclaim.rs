//! # Reclaim: moving free pages to where a growth needs them
//!
//! A hole between live blocks of an expandable segment keeps its pages mapped. A reclaim
//! unmaps the mappings that lie wholly inside free blocks, so that a growth maps that physical
//! memory where it needs it instead of adding new memory. Two policy decisions start one:
//! * **at the high-water mark** (`Policy::reclaim_before_growth`): before a growth that would
//!   take the reserved total past the most this allocator ever held, in the growing pool,
//!   largest free blocks first, until the growth fits under the mark;
//! * **at the limit** (`Policy::reclaim_at_limit`): when the device or the memory fraction has
//!   refused a growth, in the default pools' blocks of the request's stream (so that the shards
//!   of `sharded:True`, one per group of streams, decide as one engine would), largest free
//!   blocks first, only as many bytes as
//!   the request lacks (taken from the top of a block), and the growth is tried again. This
//!   comes before PyTorch's ladder (release the oversize cached blocks, then synchronise and
//!   release the whole cache), which stays the last resort.
//!
//! Guarantees: only whole mappings of free, mapped blocks go (never a byte of a block that is
//! allocated or waiting for events); blocks keep their addresses, only their backing goes; the
//! pools of tags and private pools are never taken from; and nothing is reclaimed while a
//! private pool is being allocated to (a CUDA-graph capture: an unmap waits for its stream,
//! which a capture forbids), so a growth refused then is out of memory with what is mapped.

#[allow(unused_imports)]
use super::*;

impl<S: StatSink> Engine<S> {
    /// The policy's `reclaim_before_growth`: when growing by `need` bytes would pass the
    /// high-water mark, unmaps whole free pages of the pool's expandable segments, largest free
    /// blocks first, until the growth fits under the mark (or nothing is left to unmap).
    pub(super) fn reclaim_free_pages(&mut self, pool: PoolId, need: u64) -> Result<(), AllocError> {
        let g = self.device.granularity();
        let mut cursor: Option<crate::block::SizeKey> = None;
        while self.total_allocated_memory + need > self.reclaim_watermark {
            // Walk the free set from the largest key down; unmapping changes the set, so look
            // the next key up below the last one instead of holding an iterator.
            let set = &self.pools[pool.0 as usize].blocks;
            let Some(key) = set.prev_key(cursor) else { break };
            cursor = Some(key);
            if key.1 >= g && self.blocks[key.3].expandable {
                self.unmap_block(key.3)?;
            }
        }
        Ok(())
    }

    /// The policy's `reclaim_at_limit`, after a growth for `req` was refused: unmaps whole free
    /// mappings of the default pools on the request's stream, largest free blocks first and from each block's top, until
    /// the memory fraction and the device's free memory have room for the request. Returns
    /// whether anything was unmapped (the caller then grows again).
    pub(super) fn reclaim_at_limit(&mut self, req: &Request) -> Result<bool, AllocError> {
        let short = self.shortfall(req);
        if short == 0 {
            return Ok(false);
        }
        let g = self.device.granularity();
        let mut candidates: Vec<(u64, u64, BlockId)> = (0..self.pools.len())
            .filter(|&p| {
                let p = PoolId(p as u16);
                !self.private.is_private(p) && !self.tags.is_tagged(p)
            })
            .flat_map(|p| self.pools[p].blocks.iter())
            .filter(|k| k.0 == req.stream && k.1 >= g && self.blocks[k.3].expandable)
            .map(|k| (k.1, k.2, k.3))
            .collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        let start = self.total_allocated_memory;
        for (size, addr, id) in candidates {
            let freed = start - self.total_allocated_memory;
            if freed >= short {
                break;
            }
            // An unmap merges only with unmapped neighbours, which are never candidates; check
            // anyway that the block is still the free one listed.
            let b = &self.blocks;
            if !b.is_live(id) || b[id].addr != addr || b[id].size != size || !b[id].is_free() || !b[id].mapped {
                continue;
            }
            let want = (short - freed).div_ceil(g) * g;
            if want < size {
                self.unmap_block_range(id, addr + size - want, want)?;
                if start - self.total_allocated_memory > freed {
                    continue;
                }
                // Its top holds no whole mapping (mappings larger than the shortfall).
            }
            self.unmap_block(id)?;
        }
        Ok(self.total_allocated_memory < start)
    }

    /// The bytes that must be given back before a growth for `req` can succeed: what the
    /// memory fraction's check lacks (it counts PyTorch's allocation size, as `alloc_block`
    /// does), or what the device's free memory lacks for the pages the growth maps. 0 when
    /// neither lacks anything or the device cannot say.
    fn shortfall(&self, req: &Request) -> u64 {
        let fraction = self.allowed_memory_maximum.map_or(0, |max| {
            (self.total_allocated_memory + req.alloc_size).saturating_sub(max)
        });
        let need = match self.growth_page_size(req.pool) {
            Some(ps) => self.bytes_to_map(req, ps),
            None => req.alloc_size,
        };
        let device = match self.device.mem_get_info() {
            Ok((free, _)) => need.saturating_sub(free),
            Err(_) => 0,
        };
        fraction.max(device)
    }
}
