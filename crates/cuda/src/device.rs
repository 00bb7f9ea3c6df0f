//! The [`Device`] implementation of [`CudaDevice`]: segments (`cuMemAlloc_v2`/`cuMemFree_v2`),
//! reservations and mappings, events, streams, host copies, IPC and counters.
//!
//! Guarantees (those of the crate documentation): `free`, `unmap` and `release_reservation` of
//! anything this device did not hand out (or with another size) is
//! [`DeviceError::InvalidArgument`] and reaches no driver call; `map` only maps inside a
//! reservation of this device, onto unmapped addresses; on failure the device's own records do
//! not change (a failing `unmap` keeps on record exactly the mappings still mapped);
//! `CUDA_ERROR_OUT_OF_MEMORY` is [`DeviceError::OutOfMemory`], every other driver failure
//! [`DeviceError::Driver`] with the driver's error name.

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::sys::{self, CUevent, CUmemGenericAllocationHandle, CUresult, CUstream};

use crate::vmm::Mapping;
use crate::{
    bump, check, check_alloc, ipc, lock, CudaDevice, Device, DeviceCounters, DeviceError, DevicePtr, EventId, StreamId,
};

impl Device for CudaDevice {
    fn handed_out(&self) -> Option<u64> {
        let segments: u64 = lock(&self.segments).values().sum();
        let mapped: u64 = lock(&self.vmm).mappings.values().map(|m| m.size).sum();
        Some(segments + mapped)
    }
    fn index(&self) -> i32 {
        self.ordinal
    }

    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn total_memory(&self) -> u64 {
        self.total
    }

    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        let (mut free, mut total) = (0usize, 0usize);
        let _c = self.current()?;
        // SAFETY: the context is current; both are valid out-pointers.
        let r = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
        check(r, "cuMemGetInfo")?;
        Ok((free as u64, total as u64))
    }

    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        if size == 0 {
            return Err(DeviceError::InvalidArgument("malloc of 0 bytes".into()));
        }
        let bytes = usize::try_from(size).map_err(|_| DeviceError::OutOfMemory { requested: size })?;
        let mut p: sys::CUdeviceptr = 0;
        {
            let _c = self.current()?;
            // SAFETY: the context is current; `p` is a valid out-pointer.
            let r = unsafe { sys::cuMemAlloc_v2(&mut p, bytes) };
            check_alloc(r, "cuMemAlloc", size)?;
        }
        lock(&self.segments).insert(p, size);
        bump(&self.counters.mallocs, 1);
        Ok(p)
    }

    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        {
            let mut segs = lock(&self.segments);
            match segs.get(&ptr) {
                Some(&s) if s == size => {
                    segs.remove(&ptr);
                }
                Some(&s) => {
                    return Err(DeviceError::InvalidArgument(format!(
                        "free of {ptr:#x} with size {size}, allocated with {s}"
                    )))
                }
                None => {
                    return Err(DeviceError::InvalidArgument(format!(
                        "free of {ptr:#x}, which this device did not allocate"
                    )))
                }
            }
        }
        // The lock is not held across cuMemFree (which waits for the device) so that other
        // threads' mallocs are not held up by our bookkeeping.
        let r = {
            let _c = match self.current() {
                Ok(c) => c,
                Err(e) => {
                    lock(&self.segments).insert(ptr, size);
                    return Err(e);
                }
            };
            // SAFETY: `ptr` was returned by cuMemAlloc of this device, is on record (so not
            // freed yet) and was taken off the record above, so it is freed once.
            unsafe { sys::cuMemFree_v2(ptr) }
        };
        if let Err(e) = check(r, "cuMemFree") {
            lock(&self.segments).insert(ptr, size);
            return Err(e);
        }
        bump(&self.counters.frees, 1);
        Ok(())
    }

    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn reserve(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let g = self.granularity;
        if size == 0 || size % g != 0 {
            return Err(DeviceError::InvalidArgument(format!(
                "reservation of {size} bytes is not a multiple of the granularity {g}"
            )));
        }
        if !self.vmm_supported {
            return Err(self.vmm_unsupported("cuMemAddressReserve"));
        }
        let bytes = usize::try_from(size).map_err(|_| DeviceError::Driver {
            call: "cuMemAddressReserve",
            name: "CUDA_ERROR_INVALID_VALUE".into(),
        })?;
        let mut p: sys::CUdeviceptr = 0;
        {
            let _c = self.current()?;
            // SAFETY: the context is current; `p` is a valid out-pointer; alignment `g` is a power
            // of two; address hint 0 and flags 0 are valid. Running out of address space is a
            // driver error here, as on the simulated device (it is not physical memory).
            let r = unsafe { sys::cuMemAddressReserve(&mut p, bytes, g as usize, 0, 0) };
            check(r, "cuMemAddressReserve")?;
        }
        lock(&self.vmm).reservations.insert(p, size);
        Ok(p)
    }

    fn release_reservation(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let mut vmm = lock(&self.vmm);
        match vmm.reservations.get(&ptr) {
            Some(&s) if s == size => {}
            _ => {
                return Err(DeviceError::InvalidArgument(format!(
                    "no reservation [{ptr:#x}, +{size}) on this device"
                )))
            }
        }
        let mapped = vmm.mappings.range(ptr..ptr + size).count();
        if mapped > 0 {
            return Err(DeviceError::InvalidArgument(format!(
                "reservation {ptr:#x} still has {mapped} mappings"
            )));
        }
        let _c = self.current()?;
        // SAFETY: `[ptr, +size)` is a reservation of this device with no page mapped, released
        // once (it is taken off the record below, under the same lock).
        let r = unsafe { sys::cuMemAddressFree(ptr, size as usize) };
        check(r, "cuMemAddressFree")?;
        vmm.reservations.remove(&ptr);
        Ok(())
    }

    fn map(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        self.check_aligned("map", ptr, size)?;
        if !self.vmm_supported {
            return Err(self.vmm_unsupported("cuMemMap"));
        }
        let g = self.granularity;
        let mut vmm = lock(&self.vmm);
        let inside = vmm
            .reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&base, &len)| ptr + size <= base + len);
        if !inside {
            return Err(DeviceError::InvalidArgument(format!(
                "map of [{ptr:#x}, +{size}) is not inside a reservation of this device"
            )));
        }
        if vmm.overlaps(ptr, size) {
            return Err(DeviceError::InvalidArgument(format!(
                "map of [{ptr:#x}, +{size}) overlaps a mapping of this device"
            )));
        }
        let _c = self.current()?;
        let bytes = size as usize;
        let mut h: CUmemGenericAllocationHandle = 0;
        let mut r;
        loop {
            let prop = self.page_prop();
            // SAFETY: the context is current; `prop` is a valid property struct that outlives
            // the call; `size` is a multiple of the granularity of these properties (checked
            // above; the handle type does not change it); flags must be 0.
            r = unsafe { sys::cuMemCreate(&mut h, bytes, &prop, 0) };
            let refused = matches!(
                r,
                CUresult::CUDA_ERROR_NOT_SUPPORTED | CUresult::CUDA_ERROR_INVALID_VALUE
            );
            // A driver (or container) without exportable allocations: map without, for good;
            // sharing such memory with another process then fails with a clear error.
            if !(refused && self.exportable.swap(false, Ordering::Relaxed)) {
                break;
            }
        }
        check_alloc(r, "cuMemCreate", size)?;
        // SAFETY: `[ptr, +size)` is granularity-aligned, inside a reservation of this device and
        // overlaps no mapping (checked above under the lock we hold); `h` is a fresh allocation
        // of exactly `size` bytes, mapped from offset 0.
        let r = unsafe { sys::cuMemMap(ptr, bytes, 0, h, 0) };
        let mut failure = check_alloc(r, "cuMemMap", size).err();
        let mapped = failure.is_none();
        if mapped {
            let desc = self.access_descs();
            // SAFETY: `[ptr, +size)` is exactly the mapping just made; `desc` holds `desc.len()`
            // valid access descriptors (this device and its peers) and outlives the call.
            let r = unsafe { sys::cuMemSetAccess(ptr, bytes, desc.as_ptr(), desc.len()) };
            failure = check_alloc(r, "cuMemSetAccess", size).err();
        }
        if let Some(e) = failure {
            if !self.undo_map(ptr, size, h, mapped) {
                vmm.mappings.insert(
                    ptr,
                    Mapping {
                        size,
                        handle: h,
                        fd: None,
                    },
                );
            }
            return Err(e);
        }
        vmm.mappings.insert(
            ptr,
            Mapping {
                size,
                handle: h,
                fd: None,
            },
        );
        bump(&self.counters.maps, 1);
        bump(&self.counters.pages_mapped, size / g);
        Ok(())
    }

    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        self.check_aligned("unmap", ptr, size)?;
        let g = self.granularity;
        let mut vmm = lock(&self.vmm);
        let starts = vmm.whole_run(ptr, size)?;
        let _c = self.current()?;
        let mut first_err = None;
        let mut unmapped = 0;
        for a in starts {
            let m = vmm.mappings[&a];
            // SAFETY: `[a, +m.size)` is one whole mapping made by this device's `map` (on record,
            // checked above under the lock we hold); the caller guarantees no pending work uses
            // the range.
            let r = unsafe { sys::cuMemUnmap(a, m.size as usize) };
            if let Err(e) = check(r, "cuMemUnmap") {
                // Still mapped: it stays on record; the mappings after it are not touched.
                first_err = Some(e);
                break;
            }
            vmm.mappings.remove(&a);
            unmapped += m.size;
            if let Some(fd) = m.fd {
                ipc::close_fd(fd);
            }
            // SAFETY: `m.handle` was created by `map`, its only mapping was just removed, and it
            // is off the record, so it is released exactly once.
            let r = unsafe { sys::cuMemRelease(m.handle) };
            if first_err.is_none() {
                first_err = check(r, "cuMemRelease").err();
            }
        }
        bump(&self.counters.pages_unmapped, unmapped / g);
        match first_err {
            None => {
                bump(&self.counters.unmaps, 1);
                Ok(())
            }
            Some(e) => Err(e),
        }
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        let _c = self.current()?;
        let pooled = lock(&self.events).idle.pop();
        let ev = match pooled {
            Some(e) => e as CUevent,
            None => {
                let mut e: CUevent = ptr::null_mut();
                let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as std::ffi::c_uint;
                // SAFETY: the context is current; `e` is a valid out-pointer.
                let r = unsafe { sys::cuEventCreate(&mut e, flags) };
                check(r, "cuEventCreate")?;
                e
            }
        };
        // SAFETY: `ev` is an event of this context that no one else holds (fresh or taken from
        // the idle pool); the caller guarantees `stream` (see the crate documentation).
        let r = unsafe { sys::cuEventRecord(ev, stream.0 as CUstream) };
        let mut events = lock(&self.events);
        if let Err(e) = check(r, "cuEventRecord") {
            events.idle.push(ev as u64);
            return Err(e);
        }
        events.live.insert(ev as u64);
        bump(&self.counters.events_recorded, 1);
        Ok(EventId(ev as u64))
    }

    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        self.check_event(event)?;
        let _c = self.current()?;
        // SAFETY: `event` was created by this device and events are destroyed only when the
        // device is dropped, so the handle is valid even if another thread returns it meanwhile.
        let r = unsafe { sys::cuEventQuery(event.0 as CUevent) };
        match r {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check(other, "cuEventQuery").map(|_| false),
        }
    }

    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError> {
        self.check_event(event)?;
        let _c = self.current()?;
        // SAFETY: as in `query_event`.
        let r = unsafe { sys::cuEventSynchronize(event.0 as CUevent) };
        check(r, "cuEventSynchronize")
    }

    fn destroy_event(&self, event: EventId) {
        let mut events = lock(&self.events);
        if events.live.remove(&event.0) {
            events.idle.push(event.0);
        }
    }

    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        let _c = self.current()?;
        // SAFETY: the context is current; the caller guarantees `stream` (crate documentation).
        let r = unsafe { sys::cuStreamSynchronize(stream.0 as CUstream) };
        check(r, "cuStreamSynchronize")
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        let _c = self.current()?;
        // SAFETY: the context is current; cuCtxSynchronize takes no arguments.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")?;
        bump(&self.counters.synchronizes, 1);
        Ok(())
    }

    fn copy_to_host(&self, ptr: DevicePtr, dst: &mut [u8]) -> Result<(), DeviceError> {
        if dst.is_empty() {
            return Ok(());
        }
        self.check_backed("copy to host", ptr, dst.len() as u64)?;
        // SAFETY: the range lies in memory this device backs now (checked above); reading it
        // cannot disturb anyone, and the driver orders the copy after prior work on the legacy
        // default stream.
        unsafe { self.copy_from_device(dst, ptr) }
    }

    fn copy_from_host(&self, ptr: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        if src.is_empty() {
            return Ok(());
        }
        self.check_backed("copy from host", ptr, src.len() as u64)?;
        // SAFETY: the range lies in memory this device handed out and backs now (checked
        // above); the trait's contract makes the caller (the allocator, restoring its own
        // blocks) ensure that no pending work uses it.
        unsafe { self.copy_to_device(ptr, src) }
    }

    fn ipc_handle(&self, base: DevicePtr) -> Result<[u8; cudamem_device::ipc::IPC_HANDLE_SIZE], DeviceError> {
        self.ipc_segment_handle(base)
    }

    fn export_mappings(
        &self,
        ptr: DevicePtr,
        size: u64,
    ) -> Result<Vec<cudamem_device::ipc::ExportedMapping>, DeviceError> {
        self.export_mapped(ptr, size)
    }

    fn open_ipc_handle(&self, handle: &[u8; cudamem_device::ipc::IPC_HANDLE_SIZE]) -> Result<DevicePtr, DeviceError> {
        self.open_segment_handle(handle)
    }

    fn close_ipc_handle(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.close_segment_handle(ptr)
    }

    fn import_mappings(&self, pid: i32, parts: &[cudamem_device::ipc::ImportedPart]) -> Result<DevicePtr, DeviceError> {
        self.import_parts(pid, parts)
    }

    fn release_imported(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.release_parts(ptr)
    }

    fn counters(&self) -> DeviceCounters {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DeviceCounters {
            mallocs: get(&c.mallocs),
            frees: get(&c.frees),
            maps: get(&c.maps),
            unmaps: get(&c.unmaps),
            pages_mapped: get(&c.pages_mapped),
            pages_unmapped: get(&c.pages_unmapped),
            events_recorded: get(&c.events_recorded),
            synchronizes: get(&c.synchronizes),
        }
    }
}
