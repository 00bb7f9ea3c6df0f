//! # Torch's trace trackers and torch's own history on the native class
//!
//! The native class installs one hook here while anyone listens: trackers attached with
//! `attachAllocatorTraceTracker` (ProcessGroupNCCL registers every segment through one when
//! `TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1`), or torch's memory history
//! (`recordHistory`), which the class keeps in torch's own `TraceEntry`s with torch's context
//! recorder. Every allocator's trace observer calls the hook (see
//! `cudamem_alloc::TraceObserver` for when, on which thread and under which lock);
//! with nobody listening the hook is removed and the engines pay nothing.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use cudamem_alloc::history::Action;
use cudamem_alloc::TraceEvent;

use crate::abi::TraceHook;
use crate::guard::run;
use crate::registry;

/// c10's `TraceEntry::Action` for a history action, if it has one.
fn c10_action(a: Action) -> Option<c_int> {
    Some(match a {
        Action::Alloc => 0,
        Action::FreeRequested => 1,
        Action::FreeCompleted => 2,
        Action::SegmentAlloc => 3,
        Action::SegmentFree => 4,
        Action::SegmentMap => 5,
        Action::SegmentUnmap => 6,
        Action::Snapshot => 7,
        Action::Oom => 8,
        _ => return None,
    })
}

/// `(ctx, hook) -> kind`: every allocator's events go to `hook(ctx, ...)` from now on; a NULL
/// `hook` removes it. The context must stay valid while the hook is installed (the C++ side
/// passes its allocator object, which lives as long as the process).
pub(crate) unsafe extern "C" fn nat_set_trace_hook(ctx: *mut c_void, hook: Option<TraceHook>) -> c_int {
    let ctx = ctx as usize;
    run("set_trace_hook", || {
        let observer = hook.map(|hook| -> cudamem_alloc::TraceObserver {
            Arc::new(move |e: &TraceEvent| {
                if let Some(action) = c10_action(e.action) {
                    // SAFETY: the C++ side passed a hook and a context valid while installed.
                    unsafe { hook(ctx as *mut c_void, e.device, action, e.addr, e.size, e.stream.0) }
                }
            })
        });
        registry::set_trace_observer(observer);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_c10s_numbers() {
        // c10/core/CachingDeviceAllocator.h, TraceEntry::Action, in its order.
        let order = [
            Action::Alloc,
            Action::FreeRequested,
            Action::FreeCompleted,
            Action::SegmentAlloc,
            Action::SegmentFree,
            Action::SegmentMap,
            Action::SegmentUnmap,
            Action::Snapshot,
            Action::Oom,
        ];
        for (i, a) in order.into_iter().enumerate() {
            assert_eq!(c10_action(a), Some(i as c_int));
        }
    }
}
