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

use std::collections::HashMap;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

pub use cudamem_device::{Device, DeviceCounters, DeviceError, DevicePtr, EventId, StreamId};
/// The cudarc version this crate is built against, so that callers (tests, benchmarks) can make
/// their own raw driver calls with the same bindings.
pub use cudarc;

use cudarc::driver::sys::{
    self, CUcontext, CUdevice, CUdevice_attribute, CUevent, CUmemAccessDesc, CUmemAccess_flags,
    CUmemAllocationGranularity_flags, CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType,
    CUmemLocation, CUmemLocationType,
};

/// The granularity assumed when the device does not support virtual memory management (VMM
/// calls then fail with `CUDA_ERROR_NOT_SUPPORTED`).
const FALLBACK_GRANULARITY: u64 = 2 << 20;

mod context;
mod copies;
mod device;
mod errors;
mod events;
mod ipc;
mod vmm;

pub use errors::{check, check_alloc, device_count, error_name, is_available, unavailable_reason};

use context::Ctx;
use errors::probe;
use events::Events;
use vmm::Vmm;

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

    /// Read-write access for this device and its peers: what every mapping gets, the device's
    /// own and those imported from another process.
    fn access_descs(&self) -> Vec<CUmemAccessDesc> {
        std::iter::once(self.ordinal)
            .chain(self.peers.iter().copied())
            .map(|id| CUmemAccessDesc {
                location: CUmemLocation {
                    type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id,
                },
                flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::driver_present;
    use cudarc::driver::sys::CUresult;

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
