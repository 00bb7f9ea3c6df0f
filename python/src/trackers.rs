//! # Torch's allocator trace trackers on the native class
//!
//! `attachAllocatorTraceTracker` (ProcessGroupNCCL registers every segment with its
//! communicators through it when `TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1`): the C++ class
//! keeps the trackers and, with its first one, installs one hook here, which every allocator's
//! segment observer calls (see `cudamem_alloc::engine::SegmentObserver` for when and under
//! which lock). The hook turns each change into c10's `TraceEntry` and calls the trackers.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use cudamem_alloc::engine::{SegmentChange, SegmentEvent};

use crate::native::run;
use crate::registry;

/// `(ctx, device, action, addr, size, stream)`; `action` is c10's `TraceEntry::Action`
/// (3 segment_alloc, 4 segment_free, 5 segment_map, 6 segment_unmap).
pub type SegmentHook = unsafe extern "C" fn(*mut c_void, c_int, c_int, u64, u64, u64);

fn action(change: SegmentChange) -> c_int {
    match change {
        SegmentChange::Alloc => 3,
        SegmentChange::Free => 4,
        SegmentChange::Map => 5,
        SegmentChange::Unmap => 6,
    }
}

/// `(ctx, hook) -> kind`: every allocator's segment changes go to `hook(ctx, ...)` from now on.
/// The C++ side calls it once, with a context that lives as long as the process.
pub unsafe extern "C" fn nat_set_segment_hook(ctx: *mut c_void, hook: SegmentHook) -> c_int {
    let ctx = ctx as usize; // the C++ allocator object: process-lifetime, usable from any thread
    run("attach_allocator_trace_tracker", || {
        registry::set_segment_observer(Arc::new(move |e: &SegmentEvent| {
            // SAFETY: the C++ side passed a hook and a context valid for the process's life.
            unsafe {
                hook(
                    ctx as *mut c_void,
                    e.device,
                    action(e.change),
                    e.addr,
                    e.size,
                    e.stream.0,
                )
            }
        }));
        Ok(())
    })
}
