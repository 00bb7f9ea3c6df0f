//! [`PrivatePools`], one allocator's private memory pools: the pools PyTorch gives CUDA graphs
//! and `torch.cuda.MemPool` (`MempoolId_t`, here a pair of `u64`). Named as PyTorch's
//! `CUDAAllocator` names them: create or take a reference, begin and end allocating to a pool
//! on the calling thread's captures, release, use counts, live-allocation checks, `use_on_oom`,
//! `no_split`, torch.compile's checkpoints, and the blocks freed during a capture that wait for
//! other streams.
//!
//! Guarantees: each call takes the engine's lock once (a question and the action it decides,
//! such as "is this pool here? then empty its cache", happen under that one lock). Allocation
//! into a pool is [`Raw::malloc_with`](crate::Raw::malloc_with) with the pool's slot. Only an
//! allocator with one device-wide engine offers this handle: with `sharded:True`,
//! [`Allocator::private_pools`](crate::Allocator::private_pools) is an error that says so.

use std::collections::HashSet;
use std::sync::Arc;

use cudamem_alloc::{AllocError, CachingAllocator, CheckpointDelta, MempoolId, PoolCheckpoint, PoolSlot};
use cudamem_device::{Device, StreamId};

/// One allocator's private pools, from
/// [`Allocator::private_pools`](crate::Allocator::private_pools).
#[derive(Clone, Copy)]
pub struct PrivatePools<'a> {
    pub(crate) engine: &'a CachingAllocator,
}

impl PrivatePools<'_> {
    /// Creates pool `id` (use count 1), or takes one more reference to it.
    pub fn create_or_incref(&self, id: MempoolId) -> Result<PoolSlot, AllocError> {
        self.engine.lock().create_or_incref_pool(id)
    }
    /// As [`create_or_incref`](Self::create_or_incref), with the segments of a new pool taken
    /// from `segments` (a `MemPool`'s own allocator) instead of the allocator's device.
    pub fn create_or_incref_with(
        &self,
        id: MempoolId,
        segments: Option<Arc<dyn Device>>,
    ) -> Result<PoolSlot, AllocError> {
        self.engine.lock().create_or_incref_pool_with(id, segments)
    }
    /// PyTorch's `beginAllocateToPool`: the slot whose allocations go to pool `id`.
    pub fn begin_allocate_to_pool(&self, id: MempoolId) -> Result<PoolSlot, AllocError> {
        self.engine.lock().begin_allocate_to_pool(id)
    }
    /// PyTorch's `endAllocateToPool`.
    pub fn end_allocate_to_pool(&self, id: MempoolId) -> Result<(), AllocError> {
        self.engine.lock().end_allocate_to_pool(id)
    }
    /// PyTorch's `releasePool`: gives back one reference; the last frees the pool's cache.
    pub fn release(&self, id: MempoolId) -> Result<(), AllocError> {
        self.engine.lock().release_pool(id)
    }
    /// The references to pool `id`, if it exists here.
    pub fn use_count(&self, id: MempoolId) -> Option<u32> {
        self.engine.lock().pool_use_count(id)
    }
    /// PyTorch's `checkPoolLiveAllocations`: whether the live allocations of pool `id` are
    /// exactly `expected`.
    pub fn check_live_allocations(&self, id: MempoolId, expected: &HashSet<u64>) -> Result<bool, AllocError> {
        self.engine.lock().check_pool_live_allocations(id, expected)
    }
    /// Whether allocations outside pool `id` may take its free blocks when out of memory.
    pub fn set_use_on_oom(&self, id: MempoolId, use_on_oom: bool) -> Result<(), AllocError> {
        self.engine.lock().set_use_on_oom(id, use_on_oom)
    }
    /// Blocks of pool `id` are never split.
    pub fn set_no_split(&self, id: MempoolId) -> Result<(), AllocError> {
        self.engine.lock().set_no_split(id)
    }
    /// Returns the cached blocks of pool `id` to the device, if the pool exists here; `false`
    /// (nothing done) when it does not.
    pub fn empty_cache(&self, id: MempoolId) -> Result<bool, AllocError> {
        let mut e = self.engine.lock();
        if e.pool_use_count(id).is_none() {
            return Ok(false);
        }
        e.empty_pool_cache(id).map(|()| true)
    }
    /// PyTorch's `getCheckpointState`: pool `id`'s state, to restore later.
    pub fn checkpoint(&self, id: MempoolId) -> Result<PoolCheckpoint, AllocError> {
        self.engine.lock().pool_checkpoint(id)
    }
    /// PyTorch's `setCheckpointPoolState`: restores `cp`; returns what was freed and allocated
    /// to get there.
    pub fn restore_checkpoint(&self, cp: &PoolCheckpoint) -> Result<CheckpointDelta, AllocError> {
        self.engine.lock().restore_pool_checkpoint(cp)
    }
    /// The streams the block at `ptr`, freed during a capture, still waits for; `None` when
    /// `ptr` is no such block of this allocator.
    pub fn deferred_streams(&self, ptr: u64) -> Option<Vec<StreamId>> {
        self.engine.lock().deferred_streams(ptr)
    }
    /// Makes the block at `ptr`, freed during a capture, reusable now if it waits for other
    /// streams here; `false` (nothing done) when `ptr` is no such block of this allocator.
    pub fn release_deferred(&self, ptr: u64) -> Result<bool, AllocError> {
        let mut e = self.engine.lock();
        if e.deferred_streams(ptr).is_none() {
            return Ok(false);
        }
        e.release_deferred(ptr).map(|()| true)
    }
}
