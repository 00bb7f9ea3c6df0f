//! # Private pools through the C ABI of the native torch allocator
//!
//! The entries of [`crate::abi::NativeApi`] for CUDA-graph and `MemPool` pools: create, begin
//! and end allocating to one, release, use counts, live-allocation checks, `use_on_oom` and
//! `no_split`, torch.compile's checkpoints, and the blocks freed during a capture that wait for
//! other streams (`graph_capture_record_stream_reuse`). The rules are [`crate::native`]'s: no
//! panic crosses the boundary, a failure returns an error kind and leaves its message as the
//! thread's last error, and pool ids are PyTorch's `MempoolId_t` halves.

use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudamem::{PoolCheckpoint, PrivatePools};

use crate::abi::PtrSink;
use crate::entry::alloc;
use crate::guard::{run, CError, ERR_NONE};
use crate::registry;

/// The private pools of `device`'s allocator (created on first use).
fn pools(device: c_int) -> Result<PrivatePools<'static>, CError> {
    Ok(alloc(device)?.private_pools()?)
}

pub(crate) unsafe extern "C" fn nat_deferred_streams(ptr: *mut c_void, out: *mut u64, cap: usize) -> c_int {
    let found = catch_unwind(AssertUnwindSafe(|| {
        registry::existing().find_map(|(_, a)| a.private_pools().ok()?.deferred_streams(ptr as u64))
    }));
    let Ok(Some(streams)) = found else {
        return -1;
    };
    for (i, s) in streams.iter().take(cap).enumerate() {
        // SAFETY: the caller passes `cap` writable u64.
        unsafe { *out.add(i) = s.0 };
    }
    streams.len() as c_int
}

pub(crate) extern "C" fn nat_release_deferred(ptr: *mut c_void) -> c_int {
    run("release_deferred", || {
        let ptr = ptr as u64;
        for (_, a) in registry::existing() {
            if a.private_pools()?.release_deferred(ptr)? {
                return Ok(());
            }
        }
        Err(CError::invalid(format!(
            "{ptr:#x} is not a block waiting, freed during a capture, for other streams"
        )))
    })
}

pub(crate) extern "C" fn nat_pool_create(device: c_int, a: u64, b: u64) -> c_int {
    run("create_or_incref_pool", || {
        pools(device)?.create_or_incref((a, b))?;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn nat_pool_begin(device: c_int, a: u64, b: u64, slot: *mut c_int) -> c_int {
    run("begin_allocate_to_pool", || {
        let s = pools(device)?.begin_allocate_to_pool((a, b))?;
        // SAFETY: the caller passes a writable int.
        unsafe { *slot = s.0 as c_int };
        Ok(())
    })
}

pub(crate) extern "C" fn nat_pool_end(device: c_int, a: u64, b: u64) -> c_int {
    run("end_allocate_to_pool", || {
        Ok(pools(device)?.end_allocate_to_pool((a, b))?)
    })
}

pub(crate) extern "C" fn nat_pool_release(device: c_int, a: u64, b: u64) -> c_int {
    run("release_pool", || Ok(pools(device)?.release((a, b))?))
}

pub(crate) extern "C" fn nat_pool_use_count(device: c_int, a: u64, b: u64) -> c_int {
    registry::get(device)
        .and_then(|al| al.private_pools().ok()?.use_count((a, b)))
        .map_or(0, |n| n as c_int)
}

pub(crate) unsafe extern "C" fn nat_pool_check_live(
    device: c_int,
    a: u64,
    b: u64,
    ptrs: *const u64,
    n: usize,
) -> c_int {
    let mut answer = false;
    let kind = run("check_pool_live_allocations", || {
        // SAFETY: the caller passes `n` readable u64 (or n == 0).
        let expected: HashSet<u64> = match n {
            0 => HashSet::new(),
            _ => unsafe { std::slice::from_raw_parts(ptrs, n) }.iter().copied().collect(),
        };
        answer = pools(device)?.check_live_allocations((a, b), &expected)?;
        Ok(())
    });
    match kind {
        ERR_NONE => answer as c_int,
        k => -k,
    }
}

pub(crate) extern "C" fn nat_pool_set_use_on_oom(device: c_int, a: u64, b: u64, on: c_int) -> c_int {
    run("set_use_on_oom", || Ok(pools(device)?.set_use_on_oom((a, b), on != 0)?))
}

pub(crate) extern "C" fn nat_pool_set_no_split(device: c_int, a: u64, b: u64) -> c_int {
    run("set_no_split", || Ok(pools(device)?.set_no_split((a, b))?))
}

pub(crate) extern "C" fn nat_checkpoint_get(device: c_int, a: u64, b: u64) -> *mut c_void {
    let mut cp = None;
    run("get_checkpoint_state", || {
        cp = Some(pools(device)?.checkpoint((a, b))?);
        Ok(())
    });
    cp.map_or(std::ptr::null_mut(), |c| Box::into_raw(Box::new(c)).cast())
}

pub(crate) unsafe extern "C" fn nat_checkpoint_free(cp: *mut c_void) {
    if !cp.is_null() {
        // SAFETY: `cp` came from `nat_checkpoint_get` and is freed once (the C++ owner's
        // destructor).
        drop(unsafe { Box::from_raw(cp.cast::<PoolCheckpoint>()) });
    }
}

pub(crate) unsafe extern "C" fn nat_checkpoint_restore(
    device: c_int,
    cp: *const c_void,
    ctx: *mut c_void,
    on_freed: PtrSink,
    on_allocated: PtrSink,
) -> c_int {
    let mut delta = None;
    let kind = run("set_checkpoint_pool_state", || {
        // SAFETY: `cp` came from `nat_checkpoint_get` and is alive (the caller owns it).
        let cp = unsafe { &*cp.cast::<PoolCheckpoint>() };
        delta = Some(pools(device)?.restore_checkpoint(cp)?);
        Ok(())
    });
    // The callbacks run after the lock is given back (they build torch objects).
    if let Some(d) = delta {
        for p in d.freed {
            // SAFETY: the caller's callbacks take any address.
            unsafe { on_freed(ctx, p, 0) };
        }
        for (p, s) in d.allocated {
            unsafe { on_allocated(ctx, p, s) };
        }
    }
    kind
}
