//! # The CUDA device: cudamem's [`Device`] on a real GPU
//!
//! [`CudaDevice`] implements [`cudamem_device::Device`] with the CUDA **driver API**, through the
//! raw bindings of [`cudarc`] (`cudarc::driver::sys`). `libcuda` is loaded at run time
//! (cudarc's `dynamic-loading`), so this crate builds and its tests run on machines without a
//! CUDA toolkit or GPU: there [`is_available`] is `false`, [`device_count`] is 0 and
//! [`CudaDevice::new`] returns [`DeviceError::Unavailable`] — none of them panics.
//!
//! ## Design
//!
//! * **Primary context.** A `CudaDevice` retains the device's primary context
//!   (`cuDevicePrimaryCtxRetain`) and releases it when dropped. That is the context the CUDA
//!   runtime, PyTorch and cudarc's `CudaContext` use, so memory handed out here is usable by
//!   them in the same process, and theirs by us.
//! * **Any thread.** Every method makes the context current on the calling thread for the
//!   duration of its driver calls: it asks `cuCtxGetCurrent` and, only when another context (or
//!   none) is current, pushes ours and pops it again before returning. The calling thread's
//!   context is therefore the same after a call as before it (so a runtime-API user on that
//!   thread never sees its current device change), and the common case costs one cheap query.
//! * **Segments** are `cuMemAlloc_v2`/`cuMemFree_v2`. `CUDA_ERROR_OUT_OF_MEMORY` becomes
//!   [`DeviceError::OutOfMemory`]; every other failure becomes [`DeviceError::Driver`] with the
//!   driver's own error name (`cuGetErrorName`, e.g. `CUDA_ERROR_INVALID_VALUE`). No error is
//!   swallowed.
//! * **Virtual memory** (expandable segments): `reserve` is `cuMemAddressReserve` aligned to the
//!   [granularity](Device::granularity) (the *minimum* granularity of pinned device memory,
//!   read once at construction: 2 MiB on an H200). `map(ptr, size)` creates **one** physical
//!   allocation of `size` bytes (`cuMemCreate`, pinned, on this device, no shareable handle
//!   type), maps it (`cuMemMap`) and grants read/write access to it (`cuMemSetAccess`) to this
//!   device and to every device that can access it as a peer (`cuDeviceCanAccessPeer`, read once
//!   at construction) — without the peers, a copy from another GPU (`tensor.to("cuda:1")`) fails
//!   with `CUDA_ERROR_INVALID_VALUE`, because peer access enabled on a context covers `cuMemAlloc`
//!   memory but not VMM mappings. PyTorch's expandable segments map a 20 MiB page as one handle
//!   the same way (and add peers when torch enables peer access). The mappings live in a map (start → size and `CUmemGenericAllocationHandle`) under a
//!   mutex. If any step fails, what that call created is unmapped and released again and the
//!   error is returned (an OOM from `cuMemCreate` as [`DeviceError::OutOfMemory`]). `unmap(ptr,
//!   size)` must cover exactly a run of whole mappings (a range starting or ending inside one is
//!   [`DeviceError::InvalidArgument`], as on the simulated device); each mapping is unmapped
//!   (`cuMemUnmap`) and its handle released (`cuMemRelease`).
//! * **Streams and events.** A [`StreamId`] is the raw `CUstream` value (0 is the legacy default
//!   stream). Events come from a pool (created with `CU_EVENT_DISABLE_TIMING`, reused after
//!   [`destroy_event`](Device::destroy_event), destroyed when the device is dropped); an
//!   [`EventId`] carries the raw `CUevent` value.
//! * **Host copies** (`copy_to_host`/`copy_from_host`, with which sleeping tags offload and
//!   restore their bytes) are synchronous `cuMemcpyDtoH_v2`/`cuMemcpyHtoD_v2` on the primary
//!   context, refused (`InvalidArgument`, no driver call) unless the range lies in one segment or
//!   a contiguous run of mappings of this device.
//! * **Counters** ([`DeviceCounters`]) are kept with atomics, counting exactly what
//!   [`cudamem_device::sim::SimDevice`] counts.
//!
//! ## Guarantees
//!
//! * **Never touches memory it did not hand out.** The device remembers its segments,
//!   reservations and mappings. `free`, `unmap` and `release_reservation` of anything else
//!   (or with another size) is [`DeviceError::InvalidArgument`] and reaches no driver call, so a
//!   wrong address can never free or unmap memory belonging to PyTorch or other code sharing the
//!   primary context. `map` only maps inside a reservation of this device, onto unmapped addresses.
//!   These are the same checks, with the same error kinds, as the simulated device makes.
//! * **Events are checked too**: an [`EventId`] this device did not hand out (or that was
//!   destroyed) is `InvalidArgument`, never passed to the driver.
//! * **Streams are not checked**: the driver offers no way to validate a `CUstream`. A
//!   [`StreamId`] must be 0 (legacy default stream), 1 (`CU_STREAM_LEGACY`), 2
//!   (`CU_STREAM_PER_THREAD`) or a live stream of this device's primary context.
//! * **On failure, nothing changes** in the device's own records; `map` undoes its partial work
//!   (should even that undo fail, the allocation that is still mapped stays recorded, so a later
//!   `unmap` can release it); a failing `unmap` keeps on record exactly the mappings still
//!   mapped.
//! * **Dropping** a `CudaDevice` destroys its events and releases its reference to the primary
//!   context. Segments, reservations and mappings still alive are *not* freed (their pointers may
//!   still be in use); the allocator frees them before it lets go of the device.
//!
//! ## Limits
//!
//! * The bindings are cudarc's for CUDA 12.8 (`cuda-12080`), which a CUDA 13 driver serves. A
//!   driver returning an error code newer than those bindings know would not be representable;
//!   none of the calls made here is documented to do so.
//! * `cudarc` resolves each driver symbol on first use and panics if the library lacks it; every
//!   function used here exists in drivers since CUDA 11.2.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]
// `%` rather than `is_multiple_of`, which is newer than the workspace's rust-version.
#![allow(clippy::manual_is_multiple_of)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::CStr;
use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

pub use cudamem_device::{Device, DeviceCounters, DeviceError, DevicePtr, EventId, StreamId};
/// The cudarc version this crate is built against, so that callers (tests, benchmarks) can make
/// their own raw driver calls with the same bindings.
pub use cudarc;

use cudarc::driver::sys::{
    self, CUcontext, CUdevice, CUdevice_attribute, CUevent, CUmemAccessDesc, CUmemAccess_flags,
    CUmemAllocationGranularity_flags, CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType,
    CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType, CUresult, CUstream,
};

/// The granularity assumed when the device does not support virtual memory management (VMM
/// calls then fail with `CUDA_ERROR_NOT_SUPPORTED`).
const FALLBACK_GRANULARITY: u64 = 2 << 20;

mod ipc;

// ---------------------------------------------------------------------------------------------
// Driver presence and errors
// ---------------------------------------------------------------------------------------------

/// Whether `libcuda` can be loaded. Cached: loading is attempted once per process.
fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: `is_culib_present` only tries to `dlopen` the driver library under its usual
        // names and closes it again; it calls no driver function and has no preconditions.
        unsafe { sys::is_culib_present() }
    })
}

/// `cuInit(0)`, once per process; its result is remembered. Callers have checked
/// [`driver_present`] (otherwise cudarc would panic loading the symbol).
fn driver_init() -> Result<(), DeviceError> {
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
/// the one [`CudaDevice::new`] would give.
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
fn probe() -> Result<(i32, i32), DeviceError> {
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

// ---------------------------------------------------------------------------------------------
// The device
// ---------------------------------------------------------------------------------------------

/// A `CUcontext` that may be moved and shared between threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ctx(CUcontext);

// SAFETY: a CUDA context handle is an opaque, process-wide driver object; the driver API allows
// making one context current on any number of threads at once and calling into it concurrently.
unsafe impl Send for Ctx {}
// SAFETY: as above; `Ctx` is only ever read.
unsafe impl Sync for Ctx {}

/// Keeps the device's context current on this thread while alive; pops it on drop if it had to
/// push it. Not `Send`: the pop must happen on the thread that pushed.
struct Current {
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

/// Virtual-memory bookkeeping, under one mutex.
#[derive(Debug, Default)]
struct Vmm {
    /// Reservations made by this device: start → size.
    reservations: BTreeMap<DevicePtr, u64>,
    /// Mappings: start → (size, the physical allocation mapped there). One `map` call makes
    /// one; they never overlap.
    mappings: BTreeMap<DevicePtr, Mapping>,
}

/// One physical allocation mapped into a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mapping {
    size: u64,
    handle: CUmemGenericAllocationHandle,
    /// The POSIX descriptor it was exported as for another process (see [`ipc`]), closed when
    /// it is unmapped.
    fd: Option<i32>,
}

impl Vmm {
    /// Whether `[ptr, ptr+size)` intersects a mapping.
    fn overlaps(&self, ptr: DevicePtr, size: u64) -> bool {
        self.mappings
            .range(..ptr + size)
            .next_back()
            .is_some_and(|(&a, m)| a + m.size > ptr)
    }

    /// The starts of the mappings that make up exactly `[ptr, ptr+size)`, or why the range is
    /// not a run of whole mappings.
    fn whole_run(&self, ptr: DevicePtr, size: u64) -> Result<Vec<DevicePtr>, DeviceError> {
        let end = ptr + size;
        let (mut at, mut starts) = (ptr, Vec::new());
        while at < end {
            match self.mappings.get(&at) {
                Some(m) => {
                    starts.push(at);
                    at += m.size;
                }
                None => {
                    let inside = self.mappings.range(..at).next_back().filter(|(&a, m)| a + m.size > at);
                    let why = match inside {
                        Some((&a, m)) => format!(
                            "{at:#x} is inside the mapping [{a:#x}, +{}) (mappings are unmapped whole)",
                            m.size
                        ),
                        None => format!("{at:#x} is not mapped by this device"),
                    };
                    return Err(DeviceError::InvalidArgument(format!(
                        "unmap of [{ptr:#x}, +{size}): {why}"
                    )));
                }
            }
        }
        if at != end {
            return Err(DeviceError::InvalidArgument(format!(
                "unmap of [{ptr:#x}, +{size}) ends inside the mapping that ends at {at:#x} \
                 (mappings are unmapped whole)"
            )));
        }
        Ok(starts)
    }
}

/// Event bookkeeping: the pool of idle events and the set handed out.
#[derive(Debug, Default)]
struct Events {
    idle: Vec<u64>,
    live: HashSet<u64>,
}

#[derive(Debug, Default)]
struct Counters {
    mallocs: AtomicU64,
    frees: AtomicU64,
    maps: AtomicU64,
    unmaps: AtomicU64,
    pages_mapped: AtomicU64,
    pages_unmapped: AtomicU64,
    events_recorded: AtomicU64,
    synchronizes: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The records are updated only after the driver call they describe succeeded, so a panic
    // while a lock is held leaves them consistent; keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One CUDA device, seen through its primary context. See the [crate documentation](crate).
#[derive(Debug)]
pub struct CudaDevice {
    ordinal: i32,
    dev: CUdevice,
    ctx: Ctx,
    total: u64,
    granularity: u64,
    vmm_supported: bool,
    /// Ordinals of the other devices that can access this one's memory as peers.
    peers: Vec<i32>,
    segments: Mutex<HashMap<DevicePtr, u64>>,
    vmm: Mutex<Vmm>,
    /// Whether physical allocations are created exportable as POSIX descriptors (CUDA IPC);
    /// cleared for good if the driver refuses that.
    exportable: AtomicBool,
    /// Memory of other processes imported here (see [`ipc`]): start → its parts.
    imports: Mutex<HashMap<DevicePtr, ipc::Imported>>,
    events: Mutex<Events>,
    counters: Counters,
}

impl CudaDevice {
    /// Opens device `ordinal` (`cuda:N`): retains its primary context and reads its total memory
    /// and VMM granularity. [`DeviceError::Unavailable`] when there is no CUDA driver on this
    /// machine or no such device; `Driver` if the driver fails otherwise. Wrap the result in an
    /// `Arc` to share it (`Arc<CudaDevice>` coerces to `Arc<dyn Device>`).
    pub fn new(ordinal: i32) -> Result<CudaDevice, DeviceError> {
        let (count, version) = probe()?;
        if ordinal < 0 || ordinal >= count {
            return Err(DeviceError::Unavailable(format!(
                "no CUDA device cuda:{ordinal}: the driver (version {version}) reports {count} device(s)"
            )));
        }
        let mut dev: CUdevice = 0;
        let mut ctx: CUcontext = ptr::null_mut();
        // SAFETY: driver present and initialised (probe); `ordinal` is in range; both are valid
        // out-pointers. The retained context is released by `Drop` of the device built below.
        unsafe {
            check(sys::cuDeviceGet(&mut dev, ordinal), "cuDeviceGet")?;
            check(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), "cuDevicePrimaryCtxRetain")?;
        }
        let mut d = CudaDevice {
            ordinal,
            dev,
            ctx: Ctx(ctx),
            total: 0,
            granularity: FALLBACK_GRANULARITY,
            vmm_supported: false,
            peers: Vec::new(),
            segments: Mutex::default(),
            vmm: Mutex::default(),
            exportable: AtomicBool::new(true),
            imports: Mutex::default(),
            events: Mutex::default(),
            counters: Counters::default(),
        };
        // From here on `d`'s Drop releases the context if anything fails.
        d.total = d.query_total()?;
        d.vmm_supported = d.query_vmm_supported()?;
        if d.vmm_supported {
            d.granularity = d.query_granularity()?;
        }
        d.peers = d.query_peers(count)?;
        Ok(d)
    }

    /// The devices (of `count`) whose contexts can access this device's memory directly.
    fn query_peers(&self, count: i32) -> Result<Vec<i32>, DeviceError> {
        let mut peers = Vec::new();
        for o in (0..count).filter(|&o| o != self.ordinal) {
            let mut other: CUdevice = 0;
            let mut can: std::ffi::c_int = 0;
            // SAFETY: the driver is initialised, `o` is a device ordinal below the device count,
            // and both are valid out-pointers.
            unsafe {
                check(sys::cuDeviceGet(&mut other, o), "cuDeviceGet")?;
                check(
                    sys::cuDeviceCanAccessPeer(&mut can, other, self.dev),
                    "cuDeviceCanAccessPeer",
                )?;
            }
            if can != 0 {
                peers.push(o);
            }
        }
        Ok(peers)
    }

    /// Ordinals of the other devices granted access to this device's mappings (peers).
    pub fn peers(&self) -> &[i32] {
        &self.peers
    }

    fn query_total(&self) -> Result<u64, DeviceError> {
        let mut total: usize = 0;
        // SAFETY: `self.dev` is a valid device; `total` is a valid out-pointer.
        let r = unsafe { sys::cuDeviceTotalMem_v2(&mut total, self.dev) };
        check(r, "cuDeviceTotalMem")?;
        Ok(total as u64)
    }

    fn query_vmm_supported(&self) -> Result<bool, DeviceError> {
        let mut v: std::ffi::c_int = 0;
        let attr = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED;
        // SAFETY: `self.dev` is a valid device; `v` is a valid out-pointer.
        let r = unsafe { sys::cuDeviceGetAttribute(&mut v, attr, self.dev) };
        check(r, "cuDeviceGetAttribute")?;
        Ok(v != 0)
    }

    fn query_granularity(&self) -> Result<u64, DeviceError> {
        let prop = self.page_prop();
        let mut g: usize = 0;
        let _c = self.current()?;
        // SAFETY: `prop` describes pinned memory on this device and outlives the call; `g` is a
        // valid out-pointer; the context is current.
        let r = unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        };
        check(r, "cuMemGetAllocationGranularity")?;
        if g == 0 || !g.is_power_of_two() {
            return Err(DeviceError::Driver {
                call: "cuMemGetAllocationGranularity",
                name: format!("CUDA_ERROR_UNEXPECTED_GRANULARITY_{g}"),
            });
        }
        Ok(g as u64)
    }

    /// The allocation properties of a VMM allocation: pinned device memory on this device,
    /// exportable as a POSIX descriptor (as PyTorch's expandable segments request) unless the
    /// driver refused that once.
    fn page_prop(&self) -> CUmemAllocationProp {
        let handle_type = if self.exportable.load(Ordering::Relaxed) {
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        } else {
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        };
        CUmemAllocationProp {
            type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: handle_type,
            location: self.location(),
            win32HandleMetaData: ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }

    fn location(&self) -> CUmemLocation {
        CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.ordinal,
        }
    }

    /// Makes this device's primary context current on the calling thread until the guard drops.
    fn current(&self) -> Result<Current, DeviceError> {
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

    /// The driver's device handle (`CUdevice`).
    pub fn cu_device(&self) -> CUdevice {
        self.dev
    }

    /// Whether the device supports virtual memory management (`reserve`/`map`); true on every
    /// GPU PyTorch's expandable segments run on.
    pub fn vmm_supported(&self) -> bool {
        self.vmm_supported
    }

    /// Creates a stream on this device (`cuStreamCreate`; `non_blocking` gives
    /// `CU_STREAM_NON_BLOCKING`, which does not synchronise with the legacy default stream).
    pub fn create_stream(&self, non_blocking: bool) -> Result<StreamId, DeviceError> {
        let flags = if non_blocking { 1 } else { 0 };
        let mut s: CUstream = ptr::null_mut();
        let _c = self.current()?;
        // SAFETY: the context is current; `s` is a valid out-pointer; flags are a valid
        // CUstream_flags value.
        let r = unsafe { sys::cuStreamCreate(&mut s, flags) };
        check(r, "cuStreamCreate")?;
        Ok(StreamId(s as u64))
    }

    /// Destroys a stream made by [`CudaDevice::create_stream`] (`cuStreamDestroy`); work already
    /// queued on it still completes.
    ///
    /// # Safety
    /// `stream` must come from `create_stream` of this device and not be used afterwards.
    pub unsafe fn destroy_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        let _c = self.current()?;
        // SAFETY: the caller guarantees `stream` is a live stream of this context that nobody
        // uses afterwards.
        let r = unsafe { sys::cuStreamDestroy_v2(stream.0 as CUstream) };
        check(r, "cuStreamDestroy")
    }

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
    fn check_backed(&self, what: &str, ptr: DevicePtr, len: u64) -> Result<(), DeviceError> {
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

    /// Bytes currently mapped by this device.
    pub fn mapped_bytes(&self) -> u64 {
        lock(&self.vmm).mappings.values().map(|m| m.size).sum()
    }

    /// The mappings currently in place, as `(start, size)` in address order.
    pub fn mappings(&self) -> Vec<(DevicePtr, u64)> {
        lock(&self.vmm).mappings.iter().map(|(&a, m)| (a, m.size)).collect()
    }

    /// Number of events handed out and not yet returned with `destroy_event`.
    pub fn live_events(&self) -> usize {
        lock(&self.events).live.len()
    }

    fn check_aligned(&self, what: &str, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let g = self.granularity;
        if size == 0 || size % g != 0 || ptr % g != 0 {
            return Err(DeviceError::InvalidArgument(format!(
                "{what} of [{ptr:#x}, +{size}) is not aligned to the granularity {g}"
            )));
        }
        Ok(())
    }

    fn vmm_unsupported(&self, call: &'static str) -> DeviceError {
        DeviceError::Driver {
            call,
            name: "CUDA_ERROR_NOT_SUPPORTED".into(),
        }
    }

    /// Undoes a failed `map` of `[ptr, +size)`: unmaps the allocation `h` if `mapped`, then
    /// releases it. Returns false if it could not be unmapped (it stays mapped and must be kept on
    /// record so that a later `unmap` can release it). The caller holds a context guard.
    fn undo_map(&self, ptr: DevicePtr, size: u64, h: CUmemGenericAllocationHandle, mapped: bool) -> bool {
        // SAFETY: `[ptr, +size)` was mapped by the failed call with `h` (if `mapped`), nobody
        // else knows the range yet, and `h` was created by that call and is released exactly once
        // here. The context is current (the caller holds a guard).
        unsafe {
            if mapped && sys::cuMemUnmap(ptr, size as usize) != CUresult::CUDA_SUCCESS {
                return false;
            }
            // Nothing more can be done about a failing release of a handle that is no longer
            // mapped; the original error is what the caller gets.
            let _ = sys::cuMemRelease(h);
        }
        true
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let events = std::mem::take(&mut *lock(&self.events));
        if let Ok(_c) = self.current() {
            for e in events.idle.into_iter().chain(events.live) {
                // SAFETY: every event in the pool was created by this device in its context and
                // is not used after this point (the device is going away). Errors cannot be
                // reported from drop.
                let _ = unsafe { sys::cuEventDestroy_v2(e as CUevent) };
            }
        }
        // SAFETY: `new` retained the primary context of `self.dev` exactly once; this is the
        // matching release. Other users (PyTorch, other CudaDevices) hold their own references.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

impl Device for CudaDevice {
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
            let desc: Vec<CUmemAccessDesc> = std::iter::once(self.ordinal)
                .chain(self.peers.iter().copied())
                .map(|id| CUmemAccessDesc {
                    location: CUmemLocation {
                        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                        id,
                    },
                    flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                })
                .collect();
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

impl CudaDevice {
    fn check_event(&self, event: EventId) -> Result<(), DeviceError> {
        if lock(&self.events).live.contains(&event.0) {
            Ok(())
        } else {
            Err(DeviceError::InvalidArgument(format!("unknown event {:#x}", event.0)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_never_panics_and_agrees_with_itself() {
        let n = device_count();
        assert!(n >= 0);
        assert_eq!(is_available(), n > 0);
        assert_eq!(unavailable_reason().is_none(), n > 0);
        if !driver_present() {
            assert!(!is_available());
            assert_eq!(n, 0);
            let why = unavailable_reason().expect("a reason");
            assert!(why.contains("libcuda"), "{why}");
        }
    }

    #[test]
    fn new_without_a_device_is_unavailable_with_a_clear_message() {
        if is_available() {
            eprintln!("(a CUDA device is present: checking only out-of-range ordinals)");
        } else {
            match CudaDevice::new(0) {
                Err(DeviceError::Unavailable(m)) => {
                    assert!(m.contains("libcuda") || m.contains("no CUDA device"), "{m}");
                    assert!(!m.is_empty());
                }
                other => panic!("expected Unavailable, got {other:?}"),
            }
        }
        for bad in [-1, i32::MAX] {
            match CudaDevice::new(bad) {
                Err(DeviceError::Unavailable(m)) => assert!(!m.is_empty()),
                other => panic!("expected Unavailable for ordinal {bad}, got {other:?}"),
            }
        }
    }

    #[test]
    fn out_of_range_ordinal_names_the_device() {
        if driver_present() {
            match CudaDevice::new(i32::MAX) {
                Err(DeviceError::Unavailable(m)) => {
                    assert!(m.contains(&format!("cuda:{}", i32::MAX)) || m.contains("driver"), "{m}")
                }
                other => panic!("expected Unavailable, got {other:?}"),
            }
        }
    }

    #[test]
    fn host_copies_round_trip_on_backed_memory_only() {
        if !is_available() {
            eprintln!("SKIPPED: no CUDA device");
            return;
        }
        let d = CudaDevice::new(0).unwrap();
        let g = d.granularity();
        let base = d.reserve(4 * g).unwrap();
        let refused = |r: Result<(), DeviceError>| matches!(r, Err(DeviceError::InvalidArgument(_)));
        assert!(refused(d.copy_from_host(base, b"x")), "unmapped memory is refused");
        d.map(base, g).unwrap();
        d.map(base + g, g).unwrap();
        let data: Vec<u8> = (0..g as usize + 4096).map(|i| (i % 251) as u8).collect();
        let at = base + g / 2; // straddles the two mappings
        d.copy_from_host(at, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        d.copy_to_host(at, &mut back).unwrap();
        assert!(back == data, "bytes round-trip across two mappings");
        assert!(
            refused(d.copy_to_host(base + 2 * g - 8, &mut [0; 16])),
            "a copy past the mappings is refused"
        );
        let seg = d.malloc(1 << 20).unwrap();
        d.copy_from_host(seg + 100, b"cudamem").unwrap();
        let mut out = [0u8; 7];
        d.copy_to_host(seg + 100, &mut out).unwrap();
        assert_eq!(&out, b"cudamem");
        assert!(
            refused(d.copy_to_host(seg + (1 << 20) - 4, &mut [0; 8])),
            "a copy past a segment is refused"
        );
        d.free(seg, 1 << 20).unwrap();
        d.unmap(base, 2 * g).unwrap();
        d.release_reservation(base, 4 * g).unwrap();
    }

    #[test]
    fn error_names_are_cuda_spellings() {
        // Without a driver the binding's names are used; with one, the driver's. Both spell it so.
        assert_eq!(
            error_name(CUresult::CUDA_ERROR_INVALID_VALUE),
            "CUDA_ERROR_INVALID_VALUE"
        );
        assert_eq!(
            check_alloc(CUresult::CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", 7),
            Err(DeviceError::OutOfMemory { requested: 7 })
        );
        assert_eq!(
            check_alloc(CUresult::CUDA_ERROR_INVALID_VALUE, "cuMemAlloc", 7),
            Err(DeviceError::Driver {
                call: "cuMemAlloc",
                name: "CUDA_ERROR_INVALID_VALUE".into()
            })
        );
        assert_eq!(check(CUresult::CUDA_SUCCESS, "x"), Ok(()));
    }
}
