//! Making the device's primary context current: every method of [`CudaDevice`] holds a
//! [`Current`] guard for the duration of its driver calls.
//!
//! Guarantees: the calling thread's context is the same after a call as before it. The guard
//! asks `cuCtxGetCurrent` and pushes the device's context only when another one (or none) is
//! current, and pops it again on drop, on the same thread (the guard is not `Send`); so a
//! runtime-API user on that thread never sees its current device change, and the common case
//! costs one query.

use std::marker::PhantomData;
use std::ptr;

use cudarc::driver::sys::{self, CUcontext};

use crate::{check, CudaDevice, DeviceError};

/// A `CUcontext` that may be moved and shared between threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ctx(pub(crate) CUcontext);

// SAFETY: a CUDA context handle is an opaque, process-wide driver object; the driver API allows
// making one context current on any number of threads at once and calling into it concurrently.
unsafe impl Send for Ctx {}
// SAFETY: as above; `Ctx` is only ever read.
unsafe impl Sync for Ctx {}

/// Keeps the device's context current on this thread while alive; pops it on drop if it had to
/// push it. Not `Send`: the pop must happen on the thread that pushed.
pub(crate) struct Current {
    pushed: bool,
    _not_send: PhantomData<*const ()>,
}

impl Drop for Current {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: CUcontext = ptr::null_mut();
            // SAFETY: this thread pushed the context in `CudaDevice::current` and nothing in
            // between pops it (guards are scoped to one method); `popped` is a valid out-pointer.
            // A failure cannot be reported from `drop` and would only mean the stack was already
            // changed by the caller, so it is ignored.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

impl CudaDevice {
    /// Makes this device's primary context current on the calling thread until the guard drops.
    pub(crate) fn current(&self) -> Result<Current, DeviceError> {
        let mut cur: CUcontext = ptr::null_mut();
        // SAFETY: the driver is initialised (a CudaDevice exists); `cur` is a valid out-pointer.
        check(unsafe { sys::cuCtxGetCurrent(&mut cur) }, "cuCtxGetCurrent")?;
        if cur == self.ctx.0 {
            return Ok(Current {
                pushed: false,
                _not_send: PhantomData,
            });
        }
        // SAFETY: `self.ctx` is the primary context retained by this device and alive as long
        // as `self`; the guard pops it again on this thread.
        let r = unsafe { sys::cuCtxPushCurrent_v2(self.ctx.0) };
        check(r, "cuCtxPushCurrent")?;
        Ok(Current {
            pushed: true,
            _not_send: PhantomData,
        })
    }

    /// Runs `f` with this device's primary context current on the calling thread, for raw driver
    /// calls (`cudarc::driver::sys`) of tests, benchmarks and callers; the thread's previous
    /// context is current again afterwards.
    pub fn with_current<R>(&self, f: impl FnOnce() -> R) -> Result<R, DeviceError> {
        let _c = self.current()?;
        Ok(f())
    }

    /// The retained primary context (`CUcontext`).
    pub fn context(&self) -> CUcontext {
        self.ctx.0
    }
}
