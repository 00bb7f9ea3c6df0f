//! # The one malloc and the one free behind every entry point
//!
//! PyTorch reaches cudamem's allocators three ways: the pluggable path's C functions
//! ([`crate::ffi`]: `cudamem_malloc`, `cudamem_malloc_or_error`, `cudamem_free`), the native
//! class's function table ([`crate::native`]) and the Python functions `cudamem.malloc` /
//! `cudamem.free`. Each one only adapts its arguments and its way of reporting errors; the work
//! is [`malloc`] and [`free`] here:
//!
//! * the allocator is looked up (created on first use for a malloc; a free names its device, or
//!   the allocator that owns the pointer is found, [`Owner`]);
//! * the stack for the memory history is gathered, if the device records one, *before* the
//!   allocator is locked and outside the panic guard (see [`frames_for`]);
//! * the allocator's pointer-level call ([`cudamem::Raw::malloc_with`] and
//!   [`cudamem::Raw::free_with`]) runs under the one panic guard ([`guarded`]): one lock of the
//!   engine, with the stack attached to its events, and what the profiler wants (the block's
//!   size, the device's totals) read under that same lock, only when the caller asks for it
//!   ([`Usage`]): no second pointer lookup otherwise.
//!
//! Size 0 allocates nothing and returns 0; freeing 0 does nothing.

use std::ffi::c_int;

use cudamem::{AllocError, Allocator, Frame, PoolSlot};
use cudamem_device::StreamId;

use crate::guard::{alloc_error, guarded, CError};
use crate::history;
use crate::recording::{self, STACKS_ALL, STACKS_ALLOC};
use crate::registry;

/// Where the stack recorded in the memory history for an allocation or a free comes from.
pub enum StackSource {
    /// The calling thread's Python stack, gathered (taking the GIL) only if the device records
    /// history with stacks: C callers, such as PyTorch's alloc and free functions.
    Gather,
    /// Given by the caller: the Python API gathers it with the GIL it holds.
    Given(Option<Vec<Frame>>),
}

/// Which allocator a free goes to.
#[derive(Clone, Copy)]
pub enum Owner {
    /// The one of this device ordinal (the caller names it).
    Device(c_int),
    /// The one that handed the pointer out (the native class, which does not know the device).
    Find,
}

/// What the profiler wants of a malloc or a free: the block's size, then the device's
/// allocated and reserved bytes after the call.
pub use cudamem::Usage;

/// The frames to record for a call on `device`: gathered (C callers) only when the device
/// records stacks for this kind of call (`mode` [`STACKS_ALLOC`] for allocations,
/// [`STACKS_ALL`] for frees).
///
/// Runs outside `catch_unwind` on purpose: taking the GIL while the interpreter shuts down
/// makes CPython end the thread with `pthread_exit`, a forced unwind, which must pass through
/// (as it passes through PyTorch's own allocator); `catch_unwind` would stop it and abort the
/// process ("FATAL: exception not rethrown"). The C entry points that get here are therefore
/// `extern "C-unwind"`. Nothing here panics, and nothing is locked yet.
#[inline]
pub fn frames_for(device: c_int, stack: StackSource, mode: u8) -> Option<Vec<Frame>> {
    match stack {
        StackSource::Gather if recording::stack_mode(device) >= mode => history::gather_python_frames(),
        StackSource::Gather => None,
        StackSource::Given(f) => f,
    }
}

/// The allocator of `device`, created on first use.
#[inline]
pub fn alloc(device: c_int) -> Result<&'static Allocator, CError> {
    Ok(registry::get_or_create(device)?)
}

/// The allocator that handed out `ptr`, with its ordinal.
#[inline]
pub fn owner_of(ptr: u64) -> Option<(c_int, &'static Allocator)> {
    if let Some(one) = registry::sole() {
        return Some(one); // its free says whether the pointer is its own
    }
    registry::existing().find(|(_, a)| a.inspect().is_ok_and(|i| i.owns(ptr)))
}

/// `e`, naming `device` where it is about a pointer (the engine names only the device's kind).
pub fn on_device(e: AllocError, device: c_int) -> AllocError {
    match e {
        AllocError::InvalidPointer { ptr, reason } => AllocError::InvalidPointer {
            ptr,
            reason: format!("device {device}: {reason}"),
        },
        e => e,
    }
}

/// Allocates `size` bytes on `device` for use on `stream`, from the private pool `slot` if one
/// is given; with `usage`, also reads what the profiler wants. Returns the address (0 for size
/// 0, which creates no allocator).
#[inline]
pub fn malloc(
    device: c_int,
    size: u64,
    stream: StreamId,
    slot: Option<PoolSlot>,
    stack: StackSource,
    usage: Option<&mut Usage>,
) -> Result<u64, CError> {
    if size == 0 {
        return Ok(0);
    }
    // First: a new allocator gets the history setting of device=None, which decides whether
    // to gather.
    let raw = match registry::raw(device) {
        Some(raw) => raw,
        None => guarded("malloc", || alloc(device)?.raw().map_err(|e| alloc_error(&e)))?,
    };
    let frames = frames_for(device, stack, STACKS_ALLOC);
    guarded("malloc", || {
        raw.malloc_with(size, stream, slot, frames, usage)
            .map_err(|e| alloc_error(&e))
    })
}

/// Frees `ptr` (0: nothing); with `usage`, also reads what the profiler wants (the block's size
/// is the freed one). Returns the device it was freed on (for 0 with [`Owner::Find`], 0).
#[inline]
pub fn free(ptr: u64, owner: Owner, stack: StackSource, usage: Option<&mut Usage>) -> Result<c_int, CError> {
    let (device, raw) = match owner {
        _ if ptr == 0 => return Ok(if let Owner::Device(d) = owner { d } else { 0 }),
        Owner::Device(d) => match registry::raw(d) {
            Some(raw) => (d, raw),
            None => {
                return Err(CError::invalid(format!(
                    "invalid device pointer: {ptr:#x} (cudamem has no allocator on device {d})"
                )))
            }
        },
        Owner::Find => match owner_of(ptr).and_then(|(d, _)| Some((d, registry::raw(d)?))) {
            Some(found) => found,
            None => {
                return Err(CError::invalid(format!(
                    "invalid device pointer: {ptr:#x} (no allocator exists)"
                )))
            }
        },
    };
    let frames = frames_for(device, stack, STACKS_ALL); // outside the guard: see frames_for
    guarded("free", || {
        raw.free_with(ptr, frames, usage).map_err(|err| match owner {
            Owner::Device(d) => alloc_error(&on_device(err, d)),
            Owner::Find => alloc_error(&err),
        })?;
        Ok(device)
    })
}

/// Records that `ptr` is used on `stream` too, on whichever device owns it.
pub fn record_stream_any(ptr: u64, stream: u64) -> Result<(), CError> {
    guarded("record_stream", || {
        if ptr == 0 {
            return Ok(()); // the storage of an empty tensor
        }
        let mut last = None;
        for (_, a) in registry::existing() {
            match a.raw().and_then(|r| r.record_stream(ptr, StreamId(stream))) {
                Ok(()) => return Ok(()),
                Err(e @ AllocError::InvalidPointer { .. }) => last = Some(e),
                Err(e) => return Err(alloc_error(&e)),
            }
        }
        Err(match last {
            Some(e) => alloc_error(&e),
            None => CError::invalid(format!("invalid device pointer: {ptr:#x} (no allocator exists)")),
        })
    })
}
