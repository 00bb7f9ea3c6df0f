//! # Sharing device memory with another process (CUDA IPC)
//!
//! What `torch.multiprocessing` needs to send a CUDA tensor: the sending process describes the
//! memory behind it, the receiving process maps the same physical memory at an address of its
//! own. CUDA has one mechanism for each kind of memory a [`Device`](crate::Device) hands out:
//!
//! * **A segment of `malloc`** is shared whole, by its 64-byte IPC handle
//!   ([`IPC_HANDLE_SIZE`], `cuIpcGetMemHandle`). The receiver opens it once per process
//!   (`cuIpcOpenMemHandle`) and closes it when its last user is gone.
//! * **Mapped pages** (virtual memory) are shared by exporting each physical allocation mapped
//!   there as a POSIX file descriptor (`cuMemExportToShareableHandle`). The receiver duplicates
//!   the descriptors out of the sender (`pidfd_getfd`, which needs the sender's pid), imports
//!   them (`cuMemImportFromShareableHandle`) and maps them, in order and contiguously, into a
//!   reservation of its own.
//!
//! ## Contract
//! * An exported descriptor stays open in the exporting process until its mapping is unmapped:
//!   the receiver may duplicate it at any time before. Exporting the same mapping again returns
//!   the same descriptor.
//! * What a receiver opens or imports is not memory of its allocator: it is released with
//!   [`Device::close_ipc_handle`](crate::Device::close_ipc_handle) or
//!   [`Device::release_imported`](crate::Device::release_imported), never by `free`/`unmap`.
//! * The physical memory lives until both sides let go (the driver counts the references), so a
//!   sender may free and unmap its block while a receiver still reads it; keeping the block from
//!   being reused meanwhile is the caller's business (torch's IPC reference counting).

use crate::DevicePtr;

/// Bytes of a CUDA IPC memory handle (`CU_IPC_HANDLE_SIZE`).
pub const IPC_HANDLE_SIZE: usize = 64;

/// One physical allocation of a mapped range, exported for another process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportedMapping {
    /// Where it is mapped in the exporting process.
    pub start: DevicePtr,
    /// Its bytes (a multiple of the granularity).
    pub size: u64,
    /// Its POSIX file descriptor in the exporting process.
    pub fd: i32,
}

/// One physical allocation to import from another process: its size and its descriptor there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportedPart {
    /// Bytes (a multiple of the granularity).
    pub size: u64,
    /// The file descriptor in the exporting process.
    pub fd: i32,
}
