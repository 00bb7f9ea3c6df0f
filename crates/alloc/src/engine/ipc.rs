//! # Sharing an allocation with another process
//!
//! [`Engine::share`] says how another process can map the memory of an allocation (what
//! `torch.multiprocessing` needs to send a CUDA tensor), in the two ways CUDA offers (see
//! `cudamem_device::ipc`):
//!
//! * an allocation in a **whole segment** is shared as that segment, by its IPC handle, with the
//!   allocation's offset in it — PyTorch shares its `cudaMalloc` blocks the same way;
//! * an allocation in an **expandable segment** (or a tag's pages) is shared as the physical
//!   allocations mapped over it, exported as descriptors.
//!
//! Sharing changes nothing in the engine: the block stays allocated to the caller, its stats and
//! its pool are untouched. The receiver's mapping is not the engine's memory (the receiver's
//! allocator does not count it either). Keeping the block alive while a receiver uses it is the
//! caller's (torch's IPC reference counting keeps the sender's storage until the receiver lets go).

use cudamem_device::ipc::{ExportedMapping, IPC_HANDLE_SIZE};

use super::{Engine, StatSink};
use crate::error::AllocError;

/// How another process maps an allocation; see the module documentation (`engine/ipc.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shared {
    /// The allocation lies at `ptr - base` in the segment `[base, base+size)`, whose IPC
    /// handle is `handle`.
    Segment {
        /// The segment's first address.
        base: u64,
        /// The segment's bytes.
        size: u64,
        /// Its `cudaIpcMemHandle_t`.
        handle: [u8; IPC_HANDLE_SIZE],
    },
    /// The allocation lies at `ptr - mappings[0].start` in the contiguous physical allocations
    /// `mappings`, exported for the other process.
    Mapped {
        /// In address order, covering the allocation.
        mappings: Vec<ExportedMapping>,
    },
}

impl<S: StatSink> Engine<S> {
    /// How another process can map allocation `ptr` (the address `malloc` returned). Requires a
    /// device that can share memory (a CUDA device); `InvalidArgument` if `ptr` is not a live
    /// allocation or its memory is not mapped now (a sleeping tag's).
    pub fn share(&self, ptr: u64) -> Result<Shared, AllocError> {
        let id = self
            .allocated
            .get(ptr, |id| self.blocks[id].addr == ptr)
            .ok_or_else(|| {
                AllocError::InvalidArgument(format!("{ptr:#x} is not a live allocation of {}", self.device.name()))
            })?;
        let b = &self.blocks[id];
        let seg = &self.segments[b.segment];
        if seg.is_expandable() {
            let mappings = self.device.export_mappings(b.addr, b.size)?;
            Ok(Shared::Mapped { mappings })
        } else {
            let handle = self.device.ipc_handle(seg.base)?;
            Ok(Shared::Segment {
                base: seg.base,
                size: seg.size,
                handle,
            })
        }
    }
}
