//! # `torch.cuda.MemPool(allocator=...)`: a private pool's segments from torch's allocator
//!
//! The native class hands the engine, for such a pool, a [`Device`] whose `malloc` and `free`
//! call the pool's allocator (a `CUDAPluggableAllocator`, through C function pointers the C++
//! side supplies) and whose every other method is the engine's own device's. The engine asks it
//! only for the pool's segments (see `cudamem_alloc`'s `engine/pool_sources.rs`); the pool keeps
//! it, and so torch's allocator object (the C++ context holds a reference), while it holds
//! segments. Dropping it tells the C++ side to let go of that reference.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use cudamem_device::ipc::{ExportedMapping, ImportedPart, IPC_HANDLE_SIZE};
use cudamem_device::{Device, DeviceCounters, DeviceError, DevicePtr, EventId, StreamId};

use crate::abi::{PoolAllocFn, PoolDropFn, PoolFreeFn};
use crate::entry::alloc;
use crate::guard::run;

/// A pool's segments from torch's allocator; everything else from `inner`.
#[derive(Debug)]
struct PoolAllocator {
    ctx: usize,
    alloc: PoolAllocFn,
    free: PoolFreeFn,
    drop: PoolDropFn,
    inner: Arc<dyn Device>,
}

impl Drop for PoolAllocator {
    fn drop(&mut self) {
        // SAFETY: the C++ side's context, dropped exactly once (this is its only owner).
        unsafe { (self.drop)(self.ctx as *mut c_void) }
    }
}

impl Device for PoolAllocator {
    fn index(&self) -> i32 {
        self.inner.index()
    }
    fn name(&self) -> String {
        format!("{} (a MemPool's allocator)", self.inner.name())
    }
    fn total_memory(&self) -> u64 {
        self.inner.total_memory()
    }
    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        self.inner.mem_get_info()
    }
    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let bytes = usize::try_from(size).map_err(|_| DeviceError::OutOfMemory { requested: size })?;
        // SAFETY: the C++ side's context and function, valid while this object lives.
        let p = unsafe { (self.alloc)(self.ctx as *mut c_void, bytes, self.inner.index()) };
        if p.is_null() {
            return Err(DeviceError::OutOfMemory { requested: size });
        }
        Ok(p as u64)
    }
    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        // SAFETY: `ptr` came from this allocator's `malloc` with `size` (the engine frees only
        // the segments it got from the device that made them).
        unsafe {
            (self.free)(
                self.ctx as *mut c_void,
                ptr as *mut c_void,
                size as usize,
                self.inner.index(),
            )
        };
        Ok(())
    }
    fn granularity(&self) -> u64 {
        self.inner.granularity()
    }
    fn reserve(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        self.inner.reserve(size)
    }
    fn release_reservation(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        self.inner.release_reservation(ptr, size)
    }
    fn map(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        self.inner.map(ptr, size)
    }
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        self.inner.unmap(ptr, size)
    }
    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.inner.record_event(stream)
    }
    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        self.inner.query_event(event)
    }
    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError> {
        self.inner.synchronize_event(event)
    }
    fn destroy_event(&self, event: EventId) {
        self.inner.destroy_event(event)
    }
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        self.inner.synchronize_stream(stream)
    }
    fn synchronize(&self) -> Result<(), DeviceError> {
        self.inner.synchronize()
    }
    fn counters(&self) -> DeviceCounters {
        self.inner.counters()
    }
    fn copy_to_host(&self, ptr: DevicePtr, dst: &mut [u8]) -> Result<(), DeviceError> {
        self.inner.copy_to_host(ptr, dst)
    }
    fn copy_from_host(&self, ptr: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        self.inner.copy_from_host(ptr, src)
    }
    fn ipc_handle(&self, base: DevicePtr) -> Result<[u8; IPC_HANDLE_SIZE], DeviceError> {
        self.inner.ipc_handle(base)
    }
    fn export_mappings(&self, ptr: DevicePtr, size: u64) -> Result<Vec<ExportedMapping>, DeviceError> {
        self.inner.export_mappings(ptr, size)
    }
    fn open_ipc_handle(&self, handle: &[u8; IPC_HANDLE_SIZE]) -> Result<DevicePtr, DeviceError> {
        self.inner.open_ipc_handle(handle)
    }
    fn close_ipc_handle(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.inner.close_ipc_handle(ptr)
    }
    fn import_mappings(&self, pid: i32, parts: &[ImportedPart]) -> Result<DevicePtr, DeviceError> {
        self.inner.import_mappings(pid, parts)
    }
    fn release_imported(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.inner.release_imported(ptr)
    }
}

/// `(device, a, b, ctx, alloc, free, drop) -> kind`: `createOrIncrefPool` with an allocator.
/// `drop(ctx)` is called once the context is not needed: at once if the pool existed already.
pub(crate) unsafe extern "C" fn nat_pool_create_with(
    device: c_int,
    a: u64,
    b: u64,
    ctx: *mut c_void,
    alloc_fn: PoolAllocFn,
    free_fn: PoolFreeFn,
    drop_fn: PoolDropFn,
) -> c_int {
    let ctx = ctx as usize;
    run("create_or_incref_pool", || {
        let owner = alloc(device);
        let owner = match owner {
            Ok(o) => o,
            Err(e) => {
                // SAFETY: the context is ours to drop when the pool will not keep it.
                unsafe { drop_fn(ctx as *mut c_void) };
                return Err(e);
            }
        };
        let segments: Arc<dyn Device> = Arc::new(PoolAllocator {
            ctx,
            alloc: alloc_fn,
            free: free_fn,
            drop: drop_fn,
            inner: owner.device(),
        });
        owner.private_pools()?.create_or_incref_with((a, b), Some(segments))?;
        Ok(())
    })
}
