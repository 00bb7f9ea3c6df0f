//! Copies between host and device memory, and `memset`: the raw (unsafe) copies offered to
//! callers, and the check that makes the safe `copy_to_host`/`copy_from_host` of the `Device`
//! implementation (with which sleeping tags offload and restore their bytes) sound.
//!
//! Guarantees: the copies are synchronous `cuMemcpyDtoH_v2`/`cuMemcpyHtoD_v2` on the primary
//! context; the safe ones are refused (`InvalidArgument`, no driver call) unless the range lies in
//! one segment or a contiguous run of mappings of this device.

use cudarc::driver::sys::{self, CUstream};

use crate::{check, lock, CudaDevice, DeviceError, DevicePtr, StreamId};

impl CudaDevice {
    /// Copies `src` to device memory at `dst` (`cuMemcpyHtoD`, synchronous).
    ///
    /// # Safety
    /// `[dst, dst + src.len())` must be device memory the caller may write, and no pending work
    /// may use it concurrently.
    pub unsafe fn copy_to_device(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        let _c = self.current()?;
        // SAFETY: `src` is a valid host buffer of `src.len()` bytes; the caller guarantees the
        // device range; the driver rejects unmapped device addresses with an error.
        let r = unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) };
        check(r, "cuMemcpyHtoD")
    }

    /// Copies device memory at `src` into `dst` (`cuMemcpyDtoH`, synchronous).
    ///
    /// # Safety
    /// `[src, src + dst.len())` must be device memory the caller may read.
    pub unsafe fn copy_from_device(&self, dst: &mut [u8], src: DevicePtr) -> Result<(), DeviceError> {
        let _c = self.current()?;
        // SAFETY: `dst` is a valid, exclusively borrowed host buffer of `dst.len()` bytes; the
        // caller guarantees the device range.
        let r = unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len()) };
        check(r, "cuMemcpyDtoH")
    }

    /// Sets `len` bytes at `dst` to `value`, ordered on `stream` (`cuMemsetD8Async`); returns
    /// when the work is queued.
    ///
    /// # Safety
    /// `[dst, dst + len)` must be device memory the caller may write until the work completes,
    /// and `stream` a valid stream of this context (see the crate documentation).
    pub unsafe fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        len: u64,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        let _c = self.current()?;
        // SAFETY: guaranteed by the caller.
        let r = unsafe { sys::cuMemsetD8Async(dst, value, len as usize, stream.0 as CUstream) };
        check(r, "cuMemsetD8Async")
    }

    /// Whether `[ptr, +len)` is backed memory this device handed out: inside one of its
    /// segments, or covered by a contiguous run of its mappings.
    pub(crate) fn check_backed(&self, what: &str, ptr: DevicePtr, len: u64) -> Result<(), DeviceError> {
        let bad =
            || DeviceError::InvalidArgument(format!("{what} of [{ptr:#x}, +{len}) is not memory this device backs"));
        let end = ptr.checked_add(len).ok_or_else(bad)?;
        if lock(&self.segments).iter().any(|(&a, &l)| a <= ptr && end <= a + l) {
            return Ok(());
        }
        let vmm = lock(&self.vmm);
        let mut at = ptr;
        if let Some((&a, m)) = vmm.mappings.range(..=ptr).next_back() {
            if a + m.size > ptr {
                at = a + m.size;
            }
        }
        while at < end {
            match vmm.mappings.get(&at) {
                Some(m) if at > ptr => at += m.size,
                _ => return Err(bad()),
            }
        }
        if at == ptr {
            return Err(bad());
        }
        Ok(())
    }
}
