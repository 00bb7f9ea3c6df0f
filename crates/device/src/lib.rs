//! # The device: what a GPU offers an allocator
//!
//! cudamem's engine never talks to CUDA directly. It asks a [`Device`] for the few things
//! a caching allocator needs from a GPU:
//!
//! * **segments** — `malloc`/`free` of device memory (`cuMemAlloc`/`cuMemFree`);
//! * **virtual memory** — reserve an address range, map and unmap physical pages inside it at
//!   the device's [`granularity`](Device::granularity) (`cuMemAddressReserve`, `cuMemCreate` +
//!   `cuMemMap` + `cuMemSetAccess`, `cuMemUnmap` + `cuMemRelease`); used by expandable segments;
//! * **streams and events** — record an event on a stream and ask whether it completed
//!   (`cuEventRecord`/`cuEventQuery`), which is how `record_stream` knows a block is safe to reuse;
//! * **`mem_get_info`** — free and total bytes, as `cudaMemGetInfo` reports them;
//! * **copies** between device memory it handed out and host memory (`cuMemcpyDtoH`/`HtoD`),
//!   with which sleeping tags offload their bytes and get them back.
//!
//! Two implementations exist: [`sim::SimDevice`] (this crate; deterministic, with fault
//! injection and caller-controlled events) and the CUDA device (crate `cudamem-cuda`).
//!
//! ## Contract
//! * Every method may be called from any thread (`Send + Sync`); the engine serialises calls for
//!   one allocator under its own lock, but several allocators may share a device.
//! * Out of memory is [`DeviceError::OutOfMemory`], distinct from every other failure, because
//!   the allocator answers it by releasing its cache and retrying; any other error is passed to
//!   the user unchanged, with the driver's error name.
//! * Sizes given to `map`/`unmap`/`reserve` are multiples of [`Device::granularity`].

#![warn(missing_docs)]

pub mod ipc;
pub mod sim;

use std::fmt;

use ipc::{ExportedMapping, ImportedPart, IPC_HANDLE_SIZE};

/// A device address (`CUdeviceptr`).
pub type DevicePtr = u64;

/// A stream, identified by its raw handle value (`cudaStream_t` as an integer; 0 is the legacy
/// default stream). Traces and PyTorch use the same numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId(pub u64);

/// An event recorded on a stream, as handed out by [`Device::record_event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId(pub u64);

/// Why a device call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceError {
    /// The device has not enough free memory for the request (`CUDA_ERROR_OUT_OF_MEMORY`).
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
    },
    /// A failure injected by a test (see [`sim::FaultPlan`]); the allocator treats it as an
    /// out-of-memory of the same call.
    Injected {
        /// Which device operation failed, e.g. `"malloc"`.
        op: &'static str,
    },
    /// Any other driver error, with the driver's name for it (e.g. `CUDA_ERROR_INVALID_VALUE`).
    Driver {
        /// The driver call that failed, e.g. `"cuMemMap"`.
        call: &'static str,
        /// The CUDA error name.
        name: String,
    },
    /// The caller passed something the device does not know (an address it never handed out,
    /// a size that is not a multiple of the granularity, an unknown event).
    InvalidArgument(String),
    /// No such device or no driver on this machine.
    Unavailable(String),
}

impl DeviceError {
    /// True for failures that the allocator answers by freeing cache and retrying.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, DeviceError::OutOfMemory { .. } | DeviceError::Injected { .. })
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::OutOfMemory { requested } => {
                write!(f, "device out of memory allocating {requested} bytes")
            }
            DeviceError::Injected { op } => write!(f, "injected failure of device {op}"),
            DeviceError::Driver { call, name } => write!(f, "{call} failed: {name}"),
            DeviceError::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            DeviceError::Unavailable(m) => write!(f, "device unavailable: {m}"),
        }
    }
}

impl std::error::Error for DeviceError {}

/// Counters of device calls, kept by every [`Device`] so that a policy's cost in driver calls can
/// be compared (a policy must not win by mapping and unmapping on every allocation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// `malloc` calls that succeeded.
    pub mallocs: u64,
    /// `free` calls.
    pub frees: u64,
    /// `map` calls that succeeded (each creates and maps one physical allocation).
    pub maps: u64,
    /// `unmap` calls.
    pub unmaps: u64,
    /// Pages (of [`Device::granularity`]) mapped, summed over calls.
    pub pages_mapped: u64,
    /// Pages unmapped, summed over calls.
    pub pages_unmapped: u64,
    /// Events recorded.
    pub events_recorded: u64,
    /// Whole-device synchronisations.
    pub synchronizes: u64,
}

/// What a GPU offers the allocator. See the [crate documentation](crate) for the contract.
pub trait Device: Send + Sync + fmt::Debug {
    /// The device ordinal (`cuda:N`); 0 for a lone simulated device.
    fn index(&self) -> i32;
    /// A short name for messages: `"sim"` or `"cuda:0"`.
    fn name(&self) -> String;
    /// Total device memory in bytes.
    fn total_memory(&self) -> u64;
    /// `(free, total)` bytes, as `cudaMemGetInfo` reports them.
    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError>;

    /// Allocates a segment of `size` bytes (`cuMemAlloc`).
    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError>;
    /// Frees a segment returned by [`Device::malloc`] (`cuMemFree`). `size` is the size it was
    /// allocated with.
    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError>;

    /// The physical page size of virtual-memory mappings (2 MiB on an H200).
    fn granularity(&self) -> u64;
    /// Reserves `size` bytes of virtual address space, backed by nothing (`cuMemAddressReserve`).
    fn reserve(&self, size: u64) -> Result<DevicePtr, DeviceError>;
    /// Returns a reservation made by [`Device::reserve`]; every page in it must be unmapped.
    fn release_reservation(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError>;
    /// Backs `[ptr, ptr+size)` inside a reservation with one new physical allocation, readable
    /// and writable by this device (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`). Like a CUDA
    /// allocation handle, a mapping is later unmapped whole. On failure nothing stays mapped.
    fn map(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError>;
    /// Unmaps `[ptr, ptr+size)`, which must be a run of whole mappings, and releases their
    /// physical memory (`cuMemUnmap` + `cuMemRelease`). The caller has made sure no pending work
    /// uses the range.
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError>;

    /// Records an event on `stream` (`cuEventRecord`).
    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError>;
    /// Whether the work before `event` has completed (`cuEventQuery`).
    fn query_event(&self, event: EventId) -> Result<bool, DeviceError>;
    /// Blocks until `event` completes (`cuEventSynchronize`).
    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError>;
    /// Returns an event to the device once the allocator no longer needs it.
    fn destroy_event(&self, event: EventId);
    /// Waits for all work on `stream` (`cuStreamSynchronize`).
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError>;
    /// Waits for all work on the device (`cuCtxSynchronize`).
    fn synchronize(&self) -> Result<(), DeviceError>;

    /// Counters of the calls made so far.
    fn counters(&self) -> DeviceCounters;

    /// Bytes this device object has handed out and not taken back (segments and mapped
    /// pages), from its own records, with no driver call; `None` if it keeps no such count.
    /// Allocators sharing one device (the shards of `sharded:True`) read the device-wide total
    /// here.
    fn handed_out(&self) -> Option<u64> {
        None
    }

    /// Copies `dst.len()` bytes of device memory at `ptr` into `dst` (`cuMemcpyDtoH`,
    /// synchronous). The range must lie in memory this device handed out and that is backed now
    /// (a segment, or mapped pages); anything else is [`DeviceError::InvalidArgument`]. A device
    /// without copies answers [`DeviceError::Unavailable`].
    fn copy_to_host(&self, ptr: DevicePtr, dst: &mut [u8]) -> Result<(), DeviceError> {
        let _ = (ptr, dst);
        Err(DeviceError::Unavailable(format!("{} has no host copies", self.name())))
    }

    /// Copies `src` to device memory at `ptr` (`cuMemcpyHtoD`, synchronous), with the same
    /// rules as [`Device::copy_to_host`]. The caller makes sure no pending work uses the range.
    fn copy_from_host(&self, ptr: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        let _ = (ptr, src);
        Err(DeviceError::Unavailable(format!("{} has no host copies", self.name())))
    }

    /// The IPC handle of the segment `malloc` returned at `base` (`cuIpcGetMemHandle`), with
    /// which another process opens it (see [`ipc`]). A device that cannot share memory
    /// answers [`DeviceError::Unavailable`], as do the other IPC methods.
    fn ipc_handle(&self, base: DevicePtr) -> Result<[u8; IPC_HANDLE_SIZE], DeviceError> {
        let _ = base;
        Err(no_ipc(&self.name()))
    }

    /// Exports the physical allocations mapped over `[ptr, ptr+size)`, in address order; they
    /// must be mapped and contiguous. See [`ipc`] for how long the descriptors stay open.
    fn export_mappings(&self, ptr: DevicePtr, size: u64) -> Result<Vec<ExportedMapping>, DeviceError> {
        let _ = (ptr, size);
        Err(no_ipc(&self.name()))
    }

    /// Opens a segment of another process by its IPC handle (`cuIpcOpenMemHandle`); returns
    /// where it is mapped here.
    fn open_ipc_handle(&self, handle: &[u8; IPC_HANDLE_SIZE]) -> Result<DevicePtr, DeviceError> {
        let _ = handle;
        Err(no_ipc(&self.name()))
    }

    /// Closes what [`Device::open_ipc_handle`] returned.
    fn close_ipc_handle(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let _ = ptr;
        Err(no_ipc(&self.name()))
    }

    /// Imports the physical allocations of process `pid` and maps them contiguously, in order;
    /// returns the start of the range.
    fn import_mappings(&self, pid: i32, parts: &[ImportedPart]) -> Result<DevicePtr, DeviceError> {
        let _ = (pid, parts);
        Err(no_ipc(&self.name()))
    }

    /// Unmaps and releases what [`Device::import_mappings`] returned.
    fn release_imported(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let _ = ptr;
        Err(no_ipc(&self.name()))
    }
}

fn no_ipc(device: &str) -> DeviceError {
    DeviceError::Unavailable(format!(
        "{device} cannot share memory with other processes (CUDA IPC needs a CUDA device)"
    ))
}
