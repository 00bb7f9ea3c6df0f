//! # Errors of the allocator
//!
//! [`AllocError`] is what a caller can get back: out of memory (with everything PyTorch's message
//! reports, and more), a pointer the allocator does not own, a bad configuration, or a device
//! failure passed through with the driver's name. A failed call leaves the allocator's state as it
//! was before the call, except for the counters PyTorch also bumps (`num_ooms`, retries).

use std::fmt;

use cudamem_device::DeviceError;

use crate::format::format_size;

/// Everything known when an allocation failed for lack of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    /// Device ordinal.
    pub device: i32,
    /// What the caller asked for, in bytes.
    pub requested: u64,
    /// The device allocation that failed (PyTorch reports this as "Tried to allocate").
    pub tried: u64,
    /// Device total memory.
    pub total: u64,
    /// Device free memory after the retries.
    pub free: u64,
    /// Memory this process uses on the device (PyTorch asks NVML; cudamem takes
    /// `total - free`, exact when the process is alone on its GPU).
    pub process_used: u64,
    /// The per-process limit, when a memory fraction is set.
    pub allowed: Option<u64>,
    /// Bytes allocated to callers.
    pub allocated: u64,
    /// Bytes reserved from the device.
    pub reserved: u64,
    /// The largest free cached block, in bytes (beyond PyTorch).
    pub largest_free_block: u64,
    /// True for requests of 1 EB or more, which PyTorch rejects without trying.
    pub over_one_exabyte: bool,
    /// True when the policy would have moved free pages from holes to the request, but a CUDA
    /// graph capture or memory-pool context was open, which nothing may disturb (beyond
    /// PyTorch).
    pub not_moved_during_capture: bool,
}

impl OutOfMemory {
    /// PyTorch's message, character for character (the process line is derived from
    /// `mem_get_info`, as NVML would report a process alone on its GPU).
    pub fn pytorch_message(&self) -> String {
        if self.over_one_exabyte {
            return "CUDA out of memory. Tried to allocate more than 1EB memory.".to_string();
        }
        let allowed = self
            .allowed
            .map(|a| format!("{} allowed; ", format_size(a)))
            .unwrap_or_default();
        format!(
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. \
             Including non-PyTorch memory, this process has {} memory in use. {}Of the allocated memory {} is \
             allocated by PyTorch, and {} is reserved by PyTorch but unallocated. If reserved but unallocated \
             memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  \
             See documentation for Memory Management  \
             (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
            format_size(self.tried),
            self.device,
            format_size(self.total),
            format_size(self.free),
            format_size(self.process_used),
            allowed,
            format_size(self.allocated),
            format_size(self.reserved.saturating_sub(self.allocated)),
        )
    }

    /// Share of reserved-but-unallocated bytes that the largest free block does not cover:
    /// 0 when all cached memory is one block, near 1 when it is in slivers.
    pub fn fragmentation(&self) -> f64 {
        // Sleeping tags keep their blocks allocated but not reserved: allocated may exceed it.
        let cached = self.reserved.saturating_sub(self.allocated);
        if cached == 0 {
            0.0
        } else {
            1.0 - self.largest_free_block as f64 / cached as f64
        }
    }
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.pytorch_message())?;
        if !self.over_one_exabyte {
            write!(
                f,
                " [cudamem: requested {}; largest free cached block {}; fragmentation {:.1}% of cached memory; \
                 {}the largest batch that fits: cudamem scale or cudamem.estimate, docs/guide/will-it-fit.md]",
                format_size(self.requested),
                format_size(self.largest_free_block),
                100.0 * self.fragmentation(),
                if self.not_moved_during_capture {
                    "free pages in holes were not moved to this request because a CUDA graph capture or \
                     memory-pool context is open (moving them waits for a stream, which a capture \
                     forbids); "
                } else {
                    ""
                }
            )?;
        }
        Ok(())
    }
}

/// Why an allocator call failed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum AllocError {
    /// Not enough device memory, after releasing the cache and retrying.
    OutOfMemory(Box<OutOfMemory>),
    /// `free`/`record_stream` of an address that is not a live allocation of this allocator.
    InvalidPointer {
        /// The address given.
        ptr: u64,
        /// What is known about it: freed already, interior to a block, never allocated here.
        reason: String,
    },
    /// An invalid argument (a memory fraction outside [0, 1], for example).
    InvalidArgument(String),
    /// A configuration string was rejected.
    Config(crate::config::ConfigError),
    /// A device call failed for a reason other than memory.
    Device(DeviceError),
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::OutOfMemory(o) => o.fmt(f),
            AllocError::InvalidPointer { ptr, reason } => write!(f, "invalid device pointer: {ptr:#x} ({reason})"),
            AllocError::InvalidArgument(m) => f.write_str(m),
            AllocError::Config(e) => e.fmt(f),
            AllocError::Device(e) => write!(f, "CUDA error: {e}"),
        }
    }
}

impl std::error::Error for AllocError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AllocError::Device(e) => Some(e),
            AllocError::Config(e) => Some(e),
            _ => None,
        }
    }
}

impl From<DeviceError> for AllocError {
    fn from(e: DeviceError) -> Self {
        AllocError::Device(e)
    }
}

impl AllocError {
    /// True for out-of-memory errors.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, AllocError::OutOfMemory(_))
    }
}
