//! Virtual-memory bookkeeping (expandable segments): the reservations and mappings this device
//! made, kept under one mutex, and the checks `map`/`unmap` make against them before any driver
//! call (the driver calls themselves are in the `Device` implementation).
//!
//! Guarantees: mappings never overlap and lie inside a reservation of this device; `unmap`
//! must cover exactly a run of whole mappings (a range starting or ending inside one is
//! [`DeviceError::InvalidArgument`], as on the simulated device); a `map` that fails half-way
//! undoes its partial work, and should even that undo fail, the allocation still mapped stays on
//! record so that a later `unmap` can release it.

use std::collections::BTreeMap;

use cudarc::driver::sys::{self, CUmemGenericAllocationHandle, CUresult};

use crate::{lock, CudaDevice, DeviceError, DevicePtr};

/// Virtual-memory bookkeeping, under one mutex.
#[derive(Debug, Default)]
pub(crate) struct Vmm {
    /// Reservations made by this device: start → size.
    pub(crate) reservations: BTreeMap<DevicePtr, u64>,
    /// Mappings: start → (size, the physical allocation mapped there). One `map` call makes
    /// one; they never overlap.
    pub(crate) mappings: BTreeMap<DevicePtr, Mapping>,
}

/// One physical allocation mapped into a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub(crate) size: u64,
    pub(crate) handle: CUmemGenericAllocationHandle,
    /// The POSIX descriptor it was exported as for another process (see [`crate::ipc`]), closed when
    /// it is unmapped.
    pub(crate) fd: Option<i32>,
}

impl Vmm {
    /// Whether `[ptr, ptr+size)` intersects a mapping.
    pub(crate) fn overlaps(&self, ptr: DevicePtr, size: u64) -> bool {
        self.mappings
            .range(..ptr + size)
            .next_back()
            .is_some_and(|(&a, m)| a + m.size > ptr)
    }

    /// The starts of the mappings that make up exactly `[ptr, ptr+size)`, or why the range is
    /// not a run of whole mappings.
    pub(crate) fn whole_run(&self, ptr: DevicePtr, size: u64) -> Result<Vec<DevicePtr>, DeviceError> {
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

impl CudaDevice {
    /// Undoes a failed `map` of `[ptr, +size)`: unmaps the allocation `h` if `mapped`, then
    /// releases it. Returns false if it could not be unmapped (it stays mapped and must be kept on
    /// record so that a later `unmap` can release it). The caller holds a context guard.
    pub(crate) fn undo_map(&self, ptr: DevicePtr, size: u64, h: CUmemGenericAllocationHandle, mapped: bool) -> bool {
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

    /// Bytes currently mapped by this device.
    pub fn mapped_bytes(&self) -> u64 {
        lock(&self.vmm).mappings.values().map(|m| m.size).sum()
    }

    /// The mappings currently in place, as `(start, size)` in address order.
    pub fn mappings(&self) -> Vec<(DevicePtr, u64)> {
        lock(&self.vmm).mappings.iter().map(|(&a, m)| (a, m.size)).collect()
    }
}
