//! CUDA IPC on the CUDA device: the methods behind `Device::ipc_handle`, `export_mappings`,
//! `open_ipc_handle`, `close_ipc_handle`, `import_mappings` and `release_imported` (the contract
//! is [`cudamem_device::ipc`]'s).
//!
//! The device's guarantees hold here too: a handle is only taken of a segment of this device, only
//! mappings of this device are exported, and only what this device opened or imported is closed
//! or released (anything else is `InvalidArgument` before any driver call). An import that fails
//! half-way undoes what it did.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use cudamem_device::ipc::{ExportedMapping, ImportedPart, IPC_HANDLE_SIZE};
use cudarc::driver::sys::{
    self, CUipcMemHandle, CUipcMem_flags, CUmemAllocationHandleType, CUmemGenericAllocationHandle, CUresult,
};

use crate::{check, lock, CudaDevice, DeviceError, DevicePtr};

/// What this device opened or imported from another process.
#[derive(Debug)]
pub(crate) enum Imported {
    /// A segment opened by its IPC handle.
    Opened,
    /// A reservation of `size` bytes with `parts` (offset, size, handle) mapped in it.
    Mapped {
        size: u64,
        parts: Vec<(u64, u64, CUmemGenericAllocationHandle)>,
    },
}

/// Closes a descriptor this process owns; nothing can be done about a failure.
pub(crate) fn close_fd(fd: i32) {
    // SAFETY: `fd` is a descriptor this process created (an export) and closes once.
    unsafe { libc::close(fd) };
}

fn invalid(msg: String) -> DeviceError {
    DeviceError::InvalidArgument(msg)
}

/// A descriptor of process `pid`'s, duplicated into this process (`pidfd_getfd`).
struct PidFd(i32);

impl PidFd {
    fn open(pid: i32) -> Result<PidFd, DeviceError> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(os_error("pidfd_open", pid));
        }
        Ok(PidFd(fd as i32))
    }

    fn dup(&self, pid: i32, their_fd: i32) -> Result<i32, DeviceError> {
        // SAFETY: pidfd_getfd takes a pidfd this process owns, a descriptor number of that
        // process and flags 0; it returns a new descriptor of this process or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, self.0, their_fd, 0) };
        if fd < 0 {
            return Err(os_error("pidfd_getfd", pid));
        }
        Ok(fd as i32)
    }
}

impl Drop for PidFd {
    fn drop(&mut self) {
        close_fd(self.0);
    }
}

fn os_error(call: &'static str, pid: i32) -> DeviceError {
    let e = std::io::Error::last_os_error();
    let hint = match e.raw_os_error() {
        Some(libc::ENOSYS) => " (this kernel lacks the syscall; Linux 5.6 or later is needed)",
        Some(libc::EPERM) => " (this process may not read the sender's descriptors: ptrace permission)",
        Some(libc::ESRCH) => " (the sending process is gone)",
        _ => "",
    };
    DeviceError::Driver {
        call,
        name: format!("{e} for process {pid}{hint}"),
    }
}

impl CudaDevice {
    pub(crate) fn ipc_segment_handle(&self, base: DevicePtr) -> Result<[u8; IPC_HANDLE_SIZE], DeviceError> {
        if !lock(&self.segments).contains_key(&base) {
            return Err(invalid(format!(
                "{base:#x} is not the start of a segment of this device"
            )));
        }
        let _c = self.current()?;
        let mut h = CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `base` starts a live cuMemAlloc segment of this context (on record); `h` is a
        // valid out-pointer.
        check(unsafe { sys::cuIpcGetMemHandle(&mut h, base) }, "cuIpcGetMemHandle")?;
        Ok(h.reserved.map(|c| c as u8))
    }

    pub(crate) fn export_mapped(&self, ptr: DevicePtr, size: u64) -> Result<Vec<ExportedMapping>, DeviceError> {
        let mut vmm = lock(&self.vmm);
        let end = ptr
            .checked_add(size.max(1))
            .ok_or_else(|| invalid(format!("range {ptr:#x}+{size} overflows")))?;
        let mut at = match vmm.mappings.range(..=ptr).next_back() {
            Some((&a, m)) if a + m.size > ptr => a,
            _ => return Err(invalid(format!("{ptr:#x} is not mapped by this device"))),
        };
        let mut starts = Vec::new();
        while at < end {
            let Some(m) = vmm.mappings.get(&at) else {
                return Err(invalid(format!(
                    "[{ptr:#x}, +{size}) is not mapped contiguously: {at:#x} is unmapped"
                )));
            };
            starts.push(at);
            at += m.size;
        }
        let _c = self.current()?;
        let mut out = Vec::with_capacity(starts.len());
        for a in starts {
            let m = vmm
                .mappings
                .get_mut(&a)
                .expect("on record: found above under this lock");
            if m.fd.is_none() {
                let mut fd: i32 = -1;
                // SAFETY: `m.handle` is a live physical allocation of this device; for the POSIX
                // descriptor type the out-pointer is an int; flags must be 0.
                let r = unsafe {
                    sys::cuMemExportToShareableHandle(
                        (&mut fd as *mut i32).cast::<c_void>(),
                        m.handle,
                        CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                        0,
                    )
                };
                if r != CUresult::CUDA_SUCCESS && !self.exportable.load(Ordering::Relaxed) {
                    return Err(DeviceError::Unavailable(format!(
                        "{} cannot export its memory to another process: the driver refused exportable \
                         allocations (cuMemCreate with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)",
                        self.name_string()
                    )));
                }
                check(r, "cuMemExportToShareableHandle")?;
                m.fd = Some(fd);
            }
            out.push(ExportedMapping {
                start: a,
                size: m.size,
                fd: m.fd.expect("set above"),
            });
        }
        Ok(out)
    }

    pub(crate) fn open_segment_handle(&self, handle: &[u8; IPC_HANDLE_SIZE]) -> Result<DevicePtr, DeviceError> {
        let _c = self.current()?;
        let h = CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut p: sys::CUdeviceptr = 0;
        let flags = CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: the context is current; `p` is a valid out-pointer; the handle is passed by
        // value and the driver validates it.
        let r = unsafe { sys::cuIpcOpenMemHandle_v2(&mut p, h, flags) };
        check(r, "cuIpcOpenMemHandle")?;
        lock(&self.imports).insert(p, Imported::Opened);
        Ok(p)
    }

    pub(crate) fn close_segment_handle(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let mut imports = lock(&self.imports);
        if !matches!(imports.get(&ptr), Some(Imported::Opened)) {
            return Err(invalid(format!(
                "{ptr:#x} was not opened from an IPC handle by this device"
            )));
        }
        let _c = self.current()?;
        // SAFETY: `ptr` was returned by cuIpcOpenMemHandle on this context (on record) and is
        // closed once (taken off the record below, under the same lock).
        check(unsafe { sys::cuIpcCloseMemHandle(ptr) }, "cuIpcCloseMemHandle")?;
        imports.remove(&ptr);
        Ok(())
    }

    pub(crate) fn import_parts(&self, pid: i32, parts: &[ImportedPart]) -> Result<DevicePtr, DeviceError> {
        let g = self.granularity;
        if parts.is_empty() || parts.iter().any(|p| p.size == 0 || p.size % g != 0) {
            return Err(invalid(format!(
                "an import needs one or more parts, each a multiple of the granularity {g}"
            )));
        }
        if !self.vmm_supported {
            return Err(self.vmm_unsupported("cuMemImportFromShareableHandle"));
        }
        let total: u64 = parts.iter().map(|p| p.size).sum();
        let pidfd = PidFd::open(pid)?;
        let _c = self.current()?;
        let mut handles: Vec<CUmemGenericAllocationHandle> = Vec::with_capacity(parts.len());
        let mut undo = Undo {
            handles: Vec::new(),
            base: 0,
            total,
            mapped: Vec::new(),
        };
        for p in parts {
            let fd = pidfd.dup(pid, p.fd)?;
            let mut h: CUmemGenericAllocationHandle = 0;
            // SAFETY: `fd` is a descriptor of this process duplicated from the sender's export;
            // for the POSIX type the OS handle is the descriptor value cast to a pointer.
            let r = unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut h,
                    fd as usize as *mut c_void,
                    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            };
            close_fd(fd); // the driver holds its own reference once imported
            check(r, "cuMemImportFromShareableHandle")?;
            handles.push(h);
            undo.handles.push(h);
        }
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: the context is current; `base` is a valid out-pointer; `total` is a multiple
        // of the power-of-two alignment `g`.
        let r = unsafe { sys::cuMemAddressReserve(&mut base, total as usize, g as usize, 0, 0) };
        check(r, "cuMemAddressReserve")?;
        undo.base = base;
        let mut off = 0;
        let mut record = Vec::with_capacity(parts.len());
        for (p, &h) in parts.iter().zip(&handles) {
            // SAFETY: `[base+off, +p.size)` lies in the fresh reservation and is unmapped; `h` is
            // an imported allocation of `p.size` bytes (the sender's size), mapped from offset 0.
            let r = unsafe { sys::cuMemMap(base + off, p.size as usize, 0, h, 0) };
            check(r, "cuMemMap")?;
            undo.mapped.push((base + off, p.size));
            record.push((off, p.size, h));
            off += p.size;
        }
        let desc = self.access_descs();
        // SAFETY: `[base, +total)` is fully mapped just above; `desc` holds `desc.len()` valid
        // descriptors and outlives the call.
        let r = unsafe { sys::cuMemSetAccess(base, total as usize, desc.as_ptr(), desc.len()) };
        check(r, "cuMemSetAccess")?;
        std::mem::forget(undo);
        lock(&self.imports).insert(
            base,
            Imported::Mapped {
                size: total,
                parts: record,
            },
        );
        Ok(base)
    }

    pub(crate) fn release_parts(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let mut imports = lock(&self.imports);
        let Some(Imported::Mapped { size, parts }) = imports.get(&ptr) else {
            return Err(invalid(format!(
                "{ptr:#x} was not imported from another process by this device"
            )));
        };
        let _c = self.current()?;
        // Unlike cuMemFree, cuMemUnmap does not wait for pending work: wait first (PyTorch
        // synchronises the device here too).
        // SAFETY: the context is current.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")?;
        let undo = Undo {
            handles: parts.iter().map(|p| p.2).collect(),
            base: ptr,
            total: *size,
            mapped: parts.iter().map(|p| (ptr + p.0, p.1)).collect(),
        };
        imports.remove(&ptr);
        drop(undo); // unmaps, releases and frees the reservation
        Ok(())
    }

    fn name_string(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }
}

/// Undoes an import (or releases one): unmaps, releases the handles, frees the reservation.
/// The caller holds a context guard.
struct Undo {
    handles: Vec<CUmemGenericAllocationHandle>,
    base: DevicePtr,
    total: u64,
    mapped: Vec<(DevicePtr, u64)>,
}

impl Drop for Undo {
    fn drop(&mut self) {
        // SAFETY: each range was mapped by this import and each handle imported by it; all are
        // undone exactly once, here. Failures cannot be reported from drop; the original error
        // (if any) is what the caller gets.
        unsafe {
            for &(a, s) in &self.mapped {
                let _ = sys::cuMemUnmap(a, s as usize);
            }
            for &h in &self.handles {
                let _ = sys::cuMemRelease(h);
            }
            if self.base != 0 {
                let _ = sys::cuMemAddressFree(self.base, self.total as usize);
            }
        }
    }
}
