//! # Private pools with segments of their own, and pools that serve on out of memory
//!
//! Two options of PyTorch's `torch.cuda.MemPool`, over [`super::private_pools`]:
//!
//! * **`MemPool(allocator=...)`**: the pool's device segments come from another allocator (a
//!   `CUDAPluggableAllocator`, e.g. `ncclMemAlloc` for NCCL's zero-copy buffers) instead of the
//!   engine's device. The engine asks that [`Device`]'s `malloc`/`free` for the pool's segments
//!   and nothing else; the pool keeps it (and so the allocator) alive while it holds segments,
//!   so a tensor may outlive the `MemPool` object and its allocator (PyTorch's rule). Its
//!   segments count in the statistics as the engine's own, as PyTorch counts them.
//! * **`MemPool(use_on_oom=True)`**: when an allocation from the default pools fails (after
//!   PyTorch's whole ladder: freeing cached blocks, retrying), the cached free blocks of such
//!   pools serve it, in the order the pools were made, before out of memory is raised. The block
//!   stays its pool's: freeing it returns it there. No new segment is made for such a pool then.

use std::sync::Arc;

use cudamem_device::{Device, StreamId};

use super::private_pools::{MempoolId, PoolSlot};
use super::{Engine, StatSink};
use crate::block::PoolId;
use crate::error::AllocError;

impl<S: StatSink> Engine<S> {
    /// [`Engine::create_or_incref_pool`], with the pool's segments from `segments_from` when the
    /// pool is new (an existing pool keeps where its segments come from).
    pub fn create_or_incref_pool_with(
        &mut self,
        id: MempoolId,
        segments_from: Option<Arc<dyn Device>>,
    ) -> Result<PoolSlot, AllocError> {
        let new = self.private.find(id).is_none();
        let slot = self.create_or_incref_pool(id)?;
        if new {
            self.private.pool(slot.0 as usize).segments_from = segments_from;
        }
        Ok(slot)
    }

    /// The device that gives and takes back engine pool `pool`'s segments.
    #[inline]
    pub(super) fn segment_device(&self, pool: PoolId) -> &Arc<dyn Device> {
        if self.private.is_private(pool) {
            let slot = self.private.slot_of_pool(pool);
            if let Some(Some(p)) = self.private.slots.get(slot) {
                if let Some(d) = &p.segments_from {
                    return d;
                }
            }
        }
        &self.device
    }

    /// The last step before out of memory for a default-pool allocation: a cached block of a
    /// `use_on_oom` pool, handed out as usual (see the module documentation).
    #[cold]
    pub(super) fn malloc_from_use_on_oom_pools(&mut self, orig_size: u64, stream: StreamId) -> Option<u64> {
        let base = self.private.base;
        let slots: Vec<u16> = (self.private.slots.iter().enumerate())
            .filter(|(_, p)| p.as_ref().is_some_and(|p| p.use_on_oom && p.use_count > 0))
            .map(|(i, _)| i as u16)
            .collect();
        for slot in slots {
            let req = self.request_in(orig_size, stream, base * (slot + 1));
            if let Some(block) = self.get_free_block(&req) {
                return Some(self.hand_out(block, &req, orig_size));
            }
        }
        None
    }
}
