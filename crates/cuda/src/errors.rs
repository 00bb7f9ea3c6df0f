//! Driver presence, initialisation and errors: whether `libcuda` can be loaded (asked once per
//! process), `cuInit` (once, its result remembered), the device-count probe, and the conversion of
//! driver results into [`DeviceError`]s.
//!
//! Guarantees: none of these functions panics on a machine without a driver or GPU ([`is_available`]
//! is then `false`, [`device_count`] 0); `CUDA_ERROR_OUT_OF_MEMORY` is told apart as
//! [`DeviceError::OutOfMemory`] by [`check_alloc`]; every other failure keeps the driver's own
//! error name (`cuGetErrorName`) in [`DeviceError::Driver`], so no error is swallowed.

use std::ffi::CStr;
use std::ptr;
use std::sync::OnceLock;

use cudarc::driver::sys::{self, CUresult};

use crate::DeviceError;

/// Whether `libcuda` can be loaded. Cached: loading is attempted once per process.
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: `is_culib_present` only tries to `dlopen` the driver library under its usual
        // names and closes it again; it calls no driver function and has no preconditions.
        unsafe { sys::is_culib_present() }
    })
}

/// `cuInit(0)`, once per process; its result is remembered. Callers have checked
/// [`driver_present`] (otherwise cudarc would panic loading the symbol).
pub(crate) fn driver_init() -> Result<(), DeviceError> {
    static INIT: OnceLock<Result<(), DeviceError>> = OnceLock::new();
    debug_assert!(driver_present());
    INIT.get_or_init(|| {
        // SAFETY: the driver library is present (checked by every caller), `cuInit` takes flags
        // that must be 0 and is safe to call from any thread, any number of times.
        let r = unsafe { sys::cuInit(0) };
        check(r, "cuInit")
    })
    .clone()
}

/// The driver's name for an error code (`cuGetErrorName`), e.g. `"CUDA_ERROR_INVALID_VALUE"`.
/// Falls back to the binding's variant name, which is the same spelling.
pub fn error_name(r: CUresult) -> String {
    if driver_present() {
        let mut p: *const std::ffi::c_char = ptr::null();
        // SAFETY: the library is present; `p` is a valid out-pointer. cuGetErrorName needs no
        // context or initialisation and writes a pointer to a static NUL-terminated string.
        let got = unsafe { sys::cuGetErrorName(r, &mut p) };
        if got == CUresult::CUDA_SUCCESS && !p.is_null() {
            // SAFETY: on success `p` points to a static NUL-terminated string owned by the driver.
            let s = unsafe { CStr::from_ptr(p) };
            return s.to_string_lossy().into_owned();
        }
    }
    format!("{r:?}")
}

/// Turns a driver result into `Ok(())` or [`DeviceError::Driver`] naming `call` and the error.
/// Use [`check_alloc`] where out-of-memory must be told apart.
pub fn check(r: CUresult, call: &'static str) -> Result<(), DeviceError> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DeviceError::Driver {
            call,
            name: error_name(r),
        })
    }
}

/// Like [`check`], but `CUDA_ERROR_OUT_OF_MEMORY` becomes [`DeviceError::OutOfMemory`] of
/// `requested` bytes.
pub fn check_alloc(r: CUresult, call: &'static str, requested: u64) -> Result<(), DeviceError> {
    if r == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        Err(DeviceError::OutOfMemory { requested })
    } else {
        check(r, call)
    }
}

/// Whether a CUDA driver and at least one CUDA device are present. Never panics.
pub fn is_available() -> bool {
    device_count() > 0
}

/// The number of CUDA devices, 0 when there is no driver or it cannot be initialised. Never
/// panics.
pub fn device_count() -> i32 {
    probe().map(|(n, _)| n).unwrap_or(0)
}

/// Why there is no usable CUDA device on this machine, or `None` if there is one. The message is
/// the one [`CudaDevice::new`](crate::CudaDevice::new) would give.
pub fn unavailable_reason() -> Option<String> {
    match probe() {
        Ok((n, _)) if n > 0 => None,
        Ok((_, version)) => Some(format!(
            "the CUDA driver (version {version}) reports no CUDA device on this machine"
        )),
        Err(DeviceError::Unavailable(m)) => Some(m),
        Err(e) => Some(e.to_string()),
    }
}

/// `(device count, driver version)`, or why the driver is unusable.
pub(crate) fn probe() -> Result<(i32, i32), DeviceError> {
    if !driver_present() {
        return Err(DeviceError::Unavailable(
            "the CUDA driver library (libcuda.so.1) was not found on this machine".into(),
        ));
    }
    driver_init().map_err(|e| DeviceError::Unavailable(format!("the CUDA driver failed to start: {e}")))?;
    let mut n: std::ffi::c_int = 0;
    let mut version: std::ffi::c_int = 0;
    // SAFETY: the driver is present and initialised; both are valid out-pointers.
    unsafe {
        check(sys::cuDeviceGetCount(&mut n), "cuDeviceGetCount")
            .map_err(|e| DeviceError::Unavailable(e.to_string()))?;
        // The version only decorates messages; its failure is not an error of the probe.
        if sys::cuDriverGetVersion(&mut version) != CUresult::CUDA_SUCCESS {
            version = 0;
        }
    }
    Ok((n, version))
}
