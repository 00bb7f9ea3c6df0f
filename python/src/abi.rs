//! # The C interface to torch, defined once
//!
//! Everything the C++ side (the native allocator class `cudamem/_shim/native_allocator.cpp` and
//! the pluggable path's shim `cudamem/_shim/torch_shim.cpp`) shares with the Rust side: the
//! error kinds, the native class's function table [`NativeApi`] with the records and callbacks
//! it passes, and the types of the pluggable path's C functions. Types and constants only; the
//! functions are in `native.rs` (the table's entries) and `ffi.rs` (the exported C functions),
//! each checked by the compiler against the types here.
//!
//! The C++ declarations are generated from this file by cbindgen into
//! `cudamem/_shim/cudamem_abi.h` (namespace `cudamem_abi`), which the class and the shim
//! include: nothing is copied by hand. The test `python/abi-header` fails when the checked-in
//! header differs from what this file generates (and rewrites it with
//! `CUDAMEM_WRITE_HEADER=1`). So this file holds nothing cbindgen cannot read: plain `repr(C)`
//! structs, function pointer types and literal constants.
//!
//! The table is versioned ([`NATIVE_API_VERSION`], checked by the class together with the
//! table's size when it is installed), so a class built for another version is refused instead
//! of called wrongly: bump the version whenever the table changes.

use std::ffi::{c_char, c_double, c_int, c_void};

/// No error.
pub const ERR_NONE: c_int = 0;
/// Out of memory (PyTorch's message, plus cudamem's diagnosis).
pub const ERR_OOM: c_int = 1;
/// A bad argument or setting: unknown device ordinal, bad configuration string or policy.
pub const ERR_INVALID: c_int = 2;
/// The device failed (no driver, a CUDA error other than out-of-memory).
pub const ERR_DEVICE: c_int = 3;
/// A bug in cudamem (a caught panic).
pub const ERR_INTERNAL: c_int = 4;

/// The version of `NativeApi`; the class checks it.
pub const NATIVE_API_VERSION: u32 = 10;

/// The number of values the table's `stats` writes: c10's `DeviceStats`, in its order.
pub const STATS_LEN: usize = 9 * 3 * 4 + 2 + 4 + 4 + 4;

/// `(ctx, address, size)`: how a checkpoint restore reports each pointer.
pub type PtrSink = unsafe extern "C" fn(*mut c_void, u64, u64);

/// One segment of a snapshot, as c10's `SegmentInfo` wants it.
#[repr(C)]
pub struct SegmentRecord {
    pub device: c_int,
    pub is_large: c_int,
    pub is_expandable: c_int,
    pub address: u64,
    pub total_size: u64,
    pub requested_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub stream: u64,
    pub pool_a: u64,
    pub pool_b: u64,
}

/// One block of a snapshot, as c10's `BlockInfo` wants it.
#[repr(C)]
pub struct BlockRecord {
    pub size: u64,
    pub requested_size: u64,
    pub allocated: c_int,
    pub active: c_int,
}

/// Receives each segment of a snapshot.
pub type SegmentSink = unsafe extern "C" fn(*mut c_void, *const SegmentRecord);
/// Receives each block of the segment last received.
pub type BlockSink = unsafe extern "C" fn(*mut c_void, *const BlockRecord);
/// Receives the bytes of an IPC handle.
pub type ByteSink = unsafe extern "C" fn(*mut c_void, *const u8, usize);
/// `(ctx, device, action, addr, size, stream)`: one event of an engine; `action` is c10's
/// `TraceEntry::Action`.
pub type TraceHook = unsafe extern "C" fn(*mut c_void, c_int, c_int, u64, u64, u64);
/// A `MemPool`'s own allocator: `(ctx, size, device) -> ptr` (NULL: out of memory).
pub type PoolAllocFn = unsafe extern "C" fn(*mut c_void, usize, c_int) -> *mut c_void;
/// A `MemPool`'s own allocator: `(ctx, ptr, size, device)`.
pub type PoolFreeFn = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int);
/// `(ctx)`: the pool does not use its allocator's context any more.
pub type PoolDropFn = unsafe extern "C" fn(*mut c_void);

/// The functions the native class calls, in the order of the C++ struct generated from this one.
/// Pool ids are PyTorch's `MempoolId_t` halves; a failure returns an error kind and leaves its
/// message as the calling thread's last error (`LastErrorFn`).
#[repr(C)]
pub struct NativeApi {
    /// `NATIVE_API_VERSION`.
    pub version: u32,
    /// The size of this struct in bytes.
    pub size: u32,
    /// `(device, size, stream, slot, info[3]) -> ptr` (NULL on failure): from the private pool
    /// `slot` (as `pool_begin` returned it; -1: none). `info`: the block's size, then the
    /// device's allocated and reserved bytes, read only when `info[0]` was nonzero on entry
    /// (the profiler wants them; zeros otherwise).
    pub malloc: unsafe extern "C-unwind" fn(c_int, usize, *mut c_void, c_int, *mut u64) -> *mut c_void,
    /// `(ptr, info[4]) -> kind`; `info` as for `malloc` (the size of the block freed), then the
    /// device.
    pub free: unsafe extern "C-unwind" fn(*mut c_void, *mut u64) -> c_int,
    /// `(ptr, stream) -> kind`.
    pub record_stream: extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    /// `(pool_a, pool_b) -> kind`: (0, 0) empties every device's default pools.
    pub empty_cache: extern "C" fn(u64, u64) -> c_int,
    /// `(device, out, len) -> kind`: `STATS_LEN` values.
    pub stats: unsafe extern "C" fn(c_int, *mut i64, usize) -> c_int,
    pub reset_peak: extern "C" fn(c_int),
    pub reset_accumulated: extern "C" fn(c_int),
    pub set_fraction: extern "C" fn(c_int, c_double) -> c_int,
    pub get_fraction: extern "C" fn(c_int) -> c_double,
    pub largest_free: extern "C" fn(c_int) -> u64,
    /// `(ptr, size_out) -> base`, NULL on failure.
    pub base_allocation: unsafe extern "C" fn(*mut c_void, *mut u64) -> *mut c_void,
    pub pool_create: extern "C" fn(c_int, u64, u64) -> c_int,
    /// `(device, a, b, slot_out) -> kind`.
    pub pool_begin: unsafe extern "C" fn(c_int, u64, u64, *mut c_int) -> c_int,
    pub pool_end: extern "C" fn(c_int, u64, u64) -> c_int,
    pub pool_release: extern "C" fn(c_int, u64, u64) -> c_int,
    /// Uses of the pool; 0 for an unknown one (as PyTorch answers).
    pub pool_use_count: extern "C" fn(c_int, u64, u64) -> c_int,
    /// `(device, a, b, ptrs, n) -> 1 | 0 | -kind`.
    pub pool_check_live: unsafe extern "C" fn(c_int, u64, u64, *const u64, usize) -> c_int,
    pub pool_set_use_on_oom: extern "C" fn(c_int, u64, u64, c_int) -> c_int,
    /// `(device, a, b) -> checkpoint` (NULL on error); freed with `checkpoint_free`.
    pub checkpoint_get: extern "C" fn(c_int, u64, u64) -> *mut c_void,
    pub checkpoint_free: unsafe extern "C" fn(*mut c_void),
    /// `(device, checkpoint, ctx, on_freed, on_allocated) -> kind`.
    pub checkpoint_restore: unsafe extern "C" fn(c_int, *const c_void, *mut c_void, PtrSink, PtrSink) -> c_int,
    /// `(settings) -> kind`: a `PYTORCH_CUDA_ALLOC_CONF`-style string applied to every device.
    pub set_settings: unsafe extern "C" fn(*const c_char) -> c_int,
    /// `(device, out[2])`: allocated and reserved bytes.
    pub totals: unsafe extern "C" fn(c_int, *mut u64),
    /// Whether any device records cudamem's own history (`cudamem.record_memory_history`;
    /// torch's is the class's own).
    pub history_enabled: extern "C" fn() -> c_int,
    /// `(ctx, on_segment, on_block) -> kind`: every device's segments, each followed by its
    /// blocks (c10's `SnapshotInfo.segments`).
    pub snapshot: unsafe extern "C" fn(*mut c_void, SegmentSink, BlockSink) -> c_int,
    /// `(ptr, ctx, sink, offset_out) -> kind`: `shareIpcHandle`.
    pub ipc_share: unsafe extern "C" fn(*mut c_void, *mut c_void, ByteSink, *mut u64) -> c_int,
    /// `(device, bytes, len, ptr_out, opened_out) -> kind`: `getIpcDevPtr`.
    pub ipc_open: unsafe extern "C" fn(c_int, *const u8, usize, *mut u64, *mut c_int) -> c_int,
    /// `(device, ptr, opened) -> kind`: the deleter of what `ipc_open` returned.
    pub ipc_close: extern "C" fn(c_int, u64, c_int) -> c_int,
    /// `(ctx, hook or NULL) -> kind`: every engine event to the class's trackers and torch
    /// history. (The hook's type is spelled out: cbindgen makes a nullable function pointer of
    /// `Option<fn>`, not of `Option<alias>`.)
    pub set_trace_hook: unsafe extern "C" fn(
        *mut c_void,
        Option<unsafe extern "C" fn(*mut c_void, c_int, c_int, u64, u64, u64)>,
    ) -> c_int,
    /// `(device, a, b, ctx, alloc, free, drop) -> kind`: a `MemPool` with an allocator of its own.
    pub pool_create_with:
        unsafe extern "C" fn(c_int, u64, u64, *mut c_void, PoolAllocFn, PoolFreeFn, PoolDropFn) -> c_int,
    /// `(ptr, out, cap) -> n`: the streams of a block freed during a capture that waits for
    /// other streams' uses, its allocation stream first (at most `cap` written; `n` is the
    /// count); -1 for any other pointer or with `graph_capture_record_stream_reuse` off.
    pub deferred_streams: unsafe extern "C" fn(*mut c_void, *mut u64, usize) -> c_int,
    /// `(ptr) -> kind`: that block back to its pool now (the capture's graph orders its uses).
    pub release_deferred: extern "C" fn(*mut c_void) -> c_int,
    /// `(device, id.0, id.1) -> kind`: the pool never splits a block (`MemPool(no_split=True)`).
    pub pool_set_no_split: extern "C" fn(c_int, u64, u64) -> c_int,
}

/// `cudamem_native_api`: the table's address.
pub type NativeApiFn = extern "C" fn() -> *const NativeApi;
/// `cudamem_last_error(buf, len) -> kind`: the calling thread's last error message (NUL-ended)
/// and its kind.
pub type LastErrorFn = unsafe extern "C" fn(*mut c_char, usize) -> c_int;
/// `cudamem_last_error_kind() -> kind`.
pub type LastErrorKindFn = extern "C" fn() -> c_int;
/// `cudamem_malloc_or_error(size, device, stream, msg, msg_len) -> ptr`: the shim's alloc; on
/// failure NULL, with the message in `msg`.
pub type MallocOrErrorFn = unsafe extern "C-unwind" fn(usize, c_int, *mut c_void, *mut c_char, usize) -> *mut c_void;
/// `cudamem_free(ptr, size, device, stream)`: the shim's free.
pub type PluggableFreeFn = extern "C-unwind" fn(*mut c_void, usize, c_int, *mut c_void);
