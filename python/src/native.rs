//! # The C ABI of the native torch allocator
//!
//! `cudamem/_shim/native_allocator.cpp` is a `c10::cuda::CUDACachingAllocator::CUDAAllocator`
//! that `cudamem.torch.install()` compiles against the installed torch and makes torch's CUDA
//! allocator. It reaches the allocators of [`crate::registry`] only through the table of
//! [`NativeApi`], whose address `cudamem_native_api()` returns and the Python side passes to
//! the C++ library's `cudamem_native_install`. The table is versioned ([`NATIVE_API_VERSION`],
//! checked by the C++ side together with its size), so a library built for another version
//! is refused instead of called wrongly.
//!
//! Rules, as for [`crate::ffi`]: no panic crosses the boundary (each body runs under the panic
//! guard of [`crate::guard`]); a failure returns an error kind (`ERR_*`, 0 for success) and
//! leaves its message as the thread's last error (`cudamem_last_error`), which the C++ side
//! turns into `c10::OutOfMemoryError` or `c10::Error`. Allocation and free are the bodies of
//! [`crate::entry`], shared with the pluggable path and the Python functions. Pool ids are PyTorch's `MempoolId_t` halves.
//! A private pool's slot is what `pool_begin` returns; the C++ side, which owns PyTorch's
//! stream filters, passes it with every allocation the filter sends to that pool (−1: none).

use std::ffi::{c_char, c_double, c_int, c_void, CStr};

use cudamem_alloc::DeviceStats;
use cudamem_alloc::PoolSlot;
use cudamem_device::StreamId;

use crate::abi::{NativeApi, NATIVE_API_VERSION, STATS_LEN};
use crate::entry::{self, alloc, Owner, StackSource, Usage};
use crate::guard::{fail, run, CError, ERR_NONE};
use crate::history;
use crate::ipc;
use crate::native_pools;
use crate::pool_allocator;
use crate::registry;
use crate::trackers;

static API: NativeApi = NativeApi {
    version: NATIVE_API_VERSION,
    size: std::mem::size_of::<NativeApi>() as u32,
    malloc: nat_malloc,
    free: nat_free,
    record_stream: nat_record_stream,
    empty_cache: nat_empty_cache,
    stats: nat_stats,
    reset_peak: nat_reset_peak,
    reset_accumulated: nat_reset_accumulated,
    set_fraction: nat_set_fraction,
    get_fraction: nat_get_fraction,
    largest_free: nat_largest_free,
    base_allocation: nat_base_allocation,
    pool_create: native_pools::nat_pool_create,
    pool_begin: native_pools::nat_pool_begin,
    pool_end: native_pools::nat_pool_end,
    pool_release: native_pools::nat_pool_release,
    pool_use_count: native_pools::nat_pool_use_count,
    pool_check_live: native_pools::nat_pool_check_live,
    pool_set_use_on_oom: native_pools::nat_pool_set_use_on_oom,
    checkpoint_get: native_pools::nat_checkpoint_get,
    checkpoint_free: native_pools::nat_checkpoint_free,
    checkpoint_restore: native_pools::nat_checkpoint_restore,
    set_settings: nat_set_settings,
    totals: nat_totals,
    history_enabled: nat_history_enabled,
    snapshot: crate::native_snapshot::nat_snapshot,
    ipc_share: ipc::nat_ipc_share,
    ipc_open: ipc::nat_ipc_open,
    ipc_close: ipc::nat_ipc_close,
    set_trace_hook: trackers::nat_set_trace_hook,
    pool_create_with: pool_allocator::nat_pool_create_with,
    deferred_streams: native_pools::nat_deferred_streams,
    release_deferred: native_pools::nat_release_deferred,
    pool_set_no_split: native_pools::nat_pool_set_no_split,
};

/// `const NativeApi* cudamem_native_api(void)`: the table above.
#[no_mangle]
pub extern "C" fn cudamem_native_api() -> *const NativeApi {
    &API
}

const _: crate::abi::NativeApiFn = cudamem_native_api;

unsafe extern "C-unwind" fn nat_malloc(
    device: c_int,
    size: usize,
    stream: *mut c_void,
    slot: c_int,
    info: *mut u64,
) -> *mut c_void {
    // SAFETY (all of `info` here): the caller passes 3 writable u64.
    let profiling = unsafe { *info } != 0;
    let mut usage = Usage::default();
    let slot = u16::try_from(slot).ok().map(PoolSlot);
    let r = entry::malloc(
        device,
        size as u64,
        StreamId(stream as u64),
        slot,
        StackSource::Gather,
        profiling.then_some(&mut usage),
    );
    let out = [usage.block, usage.allocated, usage.reserved];
    unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), info, 3) };
    match r {
        Ok(p) => p as *mut c_void,
        Err(e) => {
            fail(&e);
            std::ptr::null_mut()
        }
    }
}

unsafe extern "C-unwind" fn nat_free(ptr: *mut c_void, info: *mut u64) -> c_int {
    // SAFETY (all of `info` here): the caller passes 4 writable u64.
    let profiling = unsafe { *info } != 0;
    let mut usage = Usage::default();
    let r = entry::free(
        ptr as u64,
        Owner::Find,
        StackSource::Gather,
        profiling.then_some(&mut usage),
    );
    let device = *r.as_ref().unwrap_or(&0);
    let out = [usage.block, usage.allocated, usage.reserved, device as u64];
    unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), info, 4) };
    match r {
        Ok(_) => ERR_NONE,
        Err(e) => fail(&e),
    }
}

extern "C" fn nat_record_stream(ptr: *mut c_void, stream: *mut c_void) -> c_int {
    run("record_stream", || entry::record_stream_any(ptr as u64, stream as u64))
}

extern "C" fn nat_empty_cache(pa: u64, pb: u64) -> c_int {
    run("empty_cache", || {
        for (_, a) in registry::existing() {
            if (pa, pb) == (0, 0) {
                a.empty_cache()?;
            } else {
                a.private_pools()?.empty_cache((pa, pb))?;
            }
        }
        Ok(())
    })
}

/// c10's `DeviceStats` as [`STATS_LEN`] values: the nine arrays (aggregate, small, large;
/// each current, peak, allocated, freed), then `num_alloc_retries`, `num_ooms`,
/// `oversize_allocations`, `oversize_segments`, `num_sync_all_streams`, `num_device_alloc`,
/// `num_device_free`, `max_split_size`.
pub fn flatten_stats(s: &DeviceStats) -> Vec<i64> {
    let mut v = Vec::with_capacity(STATS_LEN);
    let arrays = [
        &s.allocation,
        &s.segment,
        &s.active,
        &s.inactive_split,
        &s.allocated_bytes,
        &s.reserved_bytes,
        &s.active_bytes,
        &s.inactive_split_bytes,
        &s.requested_bytes,
    ];
    let stat =
        |v: &mut Vec<i64>, st: &cudamem_alloc::stats::Stat| v.extend([st.current, st.peak, st.allocated, st.freed]);
    for a in arrays {
        for st in &a.0 {
            stat(&mut v, st);
        }
    }
    v.extend([s.num_alloc_retries, s.num_ooms]);
    stat(&mut v, &s.oversize_allocations);
    stat(&mut v, &s.oversize_segments);
    v.extend([
        s.num_sync_all_streams,
        s.num_device_alloc,
        s.num_device_free,
        s.max_split_size,
    ]);
    v
}

unsafe extern "C" fn nat_stats(device: c_int, out: *mut i64, len: usize) -> c_int {
    run("stats", || {
        if len != STATS_LEN {
            return Err(CError::invalid(format!(
                "cudamem: stats wants {STATS_LEN} values, the caller has {len}"
            )));
        }
        registry::slot_index(device)?;
        // A device nothing was allocated on has zero stats (asking must not open it).
        let s = registry::get(device).map_or_else(|| DeviceStats::new(u64::MAX), |a| a.stats());
        let v = flatten_stats(&s);
        // SAFETY: the caller passes `len` writable i64.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, len) };
        Ok(())
    })
}

extern "C" fn nat_reset_peak(device: c_int) {
    if let Some(a) = registry::get(device) {
        a.reset_peak_memory_stats();
    }
}

extern "C" fn nat_reset_accumulated(device: c_int) {
    if let Some(a) = registry::get(device) {
        a.reset_accumulated_memory_stats();
    }
}

extern "C" fn nat_set_fraction(device: c_int, fraction: c_double) -> c_int {
    run("set_memory_fraction", || {
        Ok(alloc(device)?.set_per_process_memory_fraction(fraction)?)
    })
}

extern "C" fn nat_get_fraction(device: c_int) -> c_double {
    registry::get(device)
        .and_then(|a| a.inspect().ok())
        .map_or(1.0, |i| i.memory_fraction())
}

extern "C" fn nat_largest_free(device: c_int) -> u64 {
    registry::get(device)
        .and_then(|a| a.inspect().ok())
        .map_or(0, |i| i.largest_free_block())
}

unsafe extern "C" fn nat_base_allocation(ptr: *mut c_void, size: *mut u64) -> *mut c_void {
    let mut base = 0u64;
    let kind = run("get_base_allocation", || {
        for (_, a) in registry::existing() {
            if let Some((b, s)) = a.inspect()?.base_allocation(ptr as u64)? {
                base = b;
                // SAFETY: the caller passes a writable u64.
                unsafe { *size = s };
                return Ok(());
            }
        }
        Err(CError::invalid(format!(
            "invalid device pointer: {:#x} (not in any cudamem segment)",
            ptr as u64
        )))
    });
    if kind != ERR_NONE {
        return std::ptr::null_mut();
    }
    base as *mut c_void
}

unsafe extern "C" fn nat_set_settings(settings: *const c_char) -> c_int {
    run("set_allocator_settings", || {
        // SAFETY: the caller passes a NUL-ended string.
        let s = unsafe { CStr::from_ptr(settings) }.to_string_lossy().into_owned();
        registry::set_settings_everywhere(&s)?;
        Ok(())
    })
}

unsafe extern "C" fn nat_totals(device: c_int, out: *mut u64) {
    let (al, re) = registry::get(device)
        .and_then(|a| a.inspect().ok())
        .map_or((0, 0), |i| i.allocated_and_reserved());
    // SAFETY: the caller passes 2 writable u64.
    unsafe {
        *out = al;
        *out.add(1) = re;
    }
}

extern "C" fn nat_history_enabled() -> c_int {
    history::any_recording() as c_int
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flat_stats_have_c10s_length_and_order() {
        let mut s = DeviceStats::new(u64::MAX);
        s.allocated_bytes.0[0].current = 7;
        s.num_ooms = 3;
        s.max_split_size = -1;
        let v = flatten_stats(&s);
        assert_eq!(v.len(), STATS_LEN);
        assert_eq!(STATS_LEN, 122);
        assert_eq!(v[4 * 12], 7, "allocated_bytes is the fifth array");
        assert_eq!(v[108 + 1], 3, "num_ooms follows num_alloc_retries");
        assert_eq!(v[121], -1, "max_split_size is last");
    }
}
