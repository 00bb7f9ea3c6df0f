//! [`Raw`], the pointer-level interface of an [`Allocator`](crate::Allocator): what PyTorch's
//! `CUDAAllocator` calls `raw_alloc_with_stream`, `raw_delete`, `recordStream` and
//! `shareIpcHandle`, for callers that own addresses rather than [`Buffer`](crate::Buffer)s (a
//! C ABI, PyTorch's allocator class).
//!
//! Guarantees: one lock of the engine per call. [`Raw::malloc_with`] and [`Raw::free_with`]
//! attach the caller's stack to the call's history events and read what a profiler wants
//! ([`Usage`]) under that same lock, and only when asked. Raw allocations are the caller's to
//! free; they are not buffers, so they do not take part in the buffers' keep-alive (a raw
//! allocation still live when the last handle goes keeps the allocator's memory, never frees
//! it early). Only an allocator with one device-wide engine offers this handle: with
//! `sharded:True`, [`Allocator::raw`](crate::Allocator::raw) is an error that says so.

use cudamem_alloc::{AllocError, CachingAllocator, Frame, PoolSlot, Shared};
use cudamem_device::StreamId;

/// The pointer-level interface of one allocator, from [`Allocator::raw`](crate::Allocator::raw).
#[derive(Clone, Copy)]
pub struct Raw<'a> {
    pub(crate) engine: &'a CachingAllocator,
}

/// What a profiler wants of a malloc or a free: the block's size (the rounded size handed
/// out, or freed), then the device's allocated and reserved bytes after the call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// The block's size.
    pub block: u64,
    /// Bytes allocated on the device after the call.
    pub allocated: u64,
    /// Bytes reserved on the device after the call.
    pub reserved: u64,
}

impl Raw<'_> {
    /// Allocates `size` bytes for use on `stream` (size 0: address 0), from the private pool
    /// `pool` when one is given ([`PrivatePools::begin_allocate_to_pool`](crate::PrivatePools::begin_allocate_to_pool)),
    /// with `stack` recorded in the history's events of this call; with `usage`, also fills it.
    /// One lock of the engine.
    #[inline]
    pub fn malloc_with(
        &self,
        size: u64,
        stream: StreamId,
        pool: Option<PoolSlot>,
        stack: Option<Vec<Frame>>,
        usage: Option<&mut Usage>,
    ) -> Result<u64, AllocError> {
        let mut e = self.engine.lock();
        let with_stack = stack.is_some();
        if with_stack {
            e.set_current_stack(stack);
        }
        let r = match pool {
            Some(s) => e.malloc_in_pool(size, stream, s),
            None => e.malloc(size, stream),
        };
        if with_stack {
            e.set_current_stack(None);
        }
        let ptr = r?;
        if let Some(u) = usage {
            u.block = e.allocation_size(ptr).unwrap_or(0);
            (u.allocated, u.reserved) = e.allocated_and_reserved();
        }
        Ok(ptr)
    }

    /// Frees `ptr`, an address [`malloc_with`](Self::malloc_with) returned, with `stack`
    /// recorded in the history's events of this call; with `usage`, also fills it (the block's
    /// size is the freed one). An address this allocator did not hand out is
    /// [`AllocError::InvalidPointer`]. One lock of the engine.
    #[inline]
    pub fn free_with(&self, ptr: u64, stack: Option<Vec<Frame>>, usage: Option<&mut Usage>) -> Result<(), AllocError> {
        let mut e = self.engine.lock();
        let block = match usage {
            Some(_) => e.allocation_size(ptr).unwrap_or(0),
            None => 0,
        };
        let with_stack = stack.is_some();
        if with_stack {
            e.set_current_stack(stack);
        }
        let r = e.free(ptr);
        if with_stack {
            e.set_current_stack(None);
        }
        r?;
        if let Some(u) = usage {
            u.block = block;
            (u.allocated, u.reserved) = e.allocated_and_reserved();
        }
        Ok(())
    }

    /// PyTorch's `recordStream`: the allocation at `ptr` is used on `stream` too, so its block
    /// is reused only after the work queued there by the time it is freed has completed.
    pub fn record_stream(&self, ptr: u64, stream: StreamId) -> Result<(), AllocError> {
        self.engine.record_stream(ptr, stream)
    }

    /// PyTorch's `shareIpcHandle`: what another process needs to open the memory of the
    /// allocation at `ptr`.
    pub fn share(&self, ptr: u64) -> Result<Shared, AllocError> {
        self.engine.lock().share(ptr)
    }
}
