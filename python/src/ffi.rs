//! # The C ABI: what PyTorch's `CUDAPluggableAllocator` calls
//!
//! Exported unmangled from the extension module's shared library (`cudamem/_cudamem.abi3.so`),
//! so that `ctypes` (and `torch.cuda.memory.CUDAPluggableAllocator`) find them by name:
//!
//! | function | PyTorch hook |
//! |---|---|
//! | `void* cudamem_malloc(size_t size, int device, cudaStream_t stream)` | alloc function |
//! | `void cudamem_free(void* ptr, size_t size, int device, cudaStream_t stream)` | free function |
//! | `void cudamem_empty_cache(void)` | `set_reset_fn` (`torch.cuda.empty_cache()`) |
//! | `void cudamem_set_memory_fraction(double fraction, int device)` | `set_memory_fraction_fn` |
//! | `void cudamem_record_stream(void* ptr, cudaStream_t stream)` | `set_record_stream_fn` |
//! | `void* cudamem_malloc_or_error(size_t, int, cudaStream_t, char* msg, size_t msg_len)` | used by the C++ shim |
//!
//! and a few helpers (`cudamem_last_error`, `cudamem_last_error_kind`, `cudamem_set_error_mode`,
//! `cudamem_set_error_thrower`, `cudamem_memory_allocated`, `cudamem_memory_reserved`,
//! `cudamem_unknown_frees`).
//!
//! ## Rules
//!
//! * **No panic crosses the boundary**: every body runs under the one panic guard of
//!   [`crate::guard`]; a panic (a bug) becomes an error of kind `ERR_INTERNAL` with the panic's
//!   message. Allocation and free are [`crate::entry`]'s bodies, shared with the native class
//!   and the Python functions.
//! * **Failures are never silent.** A failing `cudamem_malloc` stores the message and its kind as
//!   the calling thread's *last error* (`cudamem_last_error`), then acts by the process-wide
//!   *error mode* (`cudamem_set_error_mode`):
//!   - [`MODE_RETURN_NULL`] (the default, for C callers that check NULL): prints the message to
//!     stderr and returns NULL;
//!   - [`MODE_THROW`]: calls the *thrower* set by `cudamem_set_error_thrower` — a function with
//!     the signature of `c10::detail::torchCheckFail(const char* func, const char* file,
//!     uint32_t line, const char* msg)`, which throws a C++ `c10::Error` that PyTorch turns into
//!     a Python `RuntimeError`. This unwinds through `cudamem_malloc`, which is therefore
//!     declared `extern "C-unwind"`; nothing is locked at that point. Without a thrower it
//!     behaves as [`MODE_ABORT`];
//!   - [`MODE_ABORT`]: prints the message and aborts the process (better than handing PyTorch a
//!     NULL pointer, which it would wrap into a tensor without complaint).
//!
//!   `cudamem.torch.install()` does not route allocations through `cudamem_malloc` at all when
//!   it can compile its C++ shim: the shim calls `cudamem_malloc_or_error`, which never prints
//!   or throws, and throws `c10::OutOfMemoryError` itself (→ `torch.OutOfMemoryError`).
//! * **A free of an unknown pointer is ignored**, reported on stderr the first time and counted
//!   (`cudamem_unknown_frees`). The hooks (`empty_cache`, `set_memory_fraction`,
//!   `record_stream`) cannot return errors to PyTorch: they report failures on stderr.
//! * Size 0 returns NULL, as PyTorch's own allocator does; freeing NULL does nothing.
//! * **Memory history.** While a device records its history with stacks
//!   (`cudamem.record_memory_history`), `cudamem_malloc` / `cudamem_malloc_or_error` (and, with
//!   context "all", `cudamem_free`) record the calling thread's Python stack: the GIL is taken
//!   (or re-entered), the frames read, the GIL released, and only then is the allocator locked
//!   (see [`crate::history`]). Otherwise the only cost is one atomic load.

use std::ffi::{c_char, c_double, c_int, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

use cudamem_device::StreamId;

use crate::abi;
use crate::entry::{self, Owner, StackSource};
use crate::guard::{guarded, last_error, set_last_error, CError, ERR_INVALID};
use crate::registry;

/// Error mode: print the message to stderr, return NULL.
pub const MODE_RETURN_NULL: c_int = 0;
/// Error mode: throw through the registered thrower (a C++ exception), else abort.
pub const MODE_THROW: c_int = 1;
/// Error mode: print the message to stderr and abort the process.
pub const MODE_ABORT: c_int = 2;

/// `c10::detail::torchCheckFail(const char*, const char*, uint32_t, const char*)`.
type Thrower = unsafe extern "C-unwind" fn(*const c_char, *const c_char, u32, *const c_char);

static ERROR_MODE: AtomicI32 = AtomicI32::new(MODE_RETURN_NULL);
static THROWER: AtomicUsize = AtomicUsize::new(0);
static UNKNOWN_FREES: AtomicU64 = AtomicU64::new(0);
static UNKNOWN_FREE_REPORTED: AtomicBool = AtomicBool::new(false);
static UNKNOWN_RECORD_REPORTED: AtomicBool = AtomicBool::new(false);

fn report(message: &str) {
    // eprintln! panics if stderr is closed; a report must never panic.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{message}");
}

/// Copies `msg` into `buf` (at most `len - 1` bytes, cut at a character boundary, then NUL).
///
/// # Safety
/// `buf` must be NULL or point to `len` writable bytes.
unsafe fn write_c_string(msg: &str, buf: *mut c_char, len: usize) {
    if buf.is_null() || len == 0 {
        return;
    }
    let mut n = msg.len().min(len - 1);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: `buf` has `len > n` writable bytes (caller's contract); the source is `n` bytes of
    // `msg`; the two cannot overlap (`msg` is Rust-owned).
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
}

fn malloc_impl(size: usize, device: c_int, stream: *mut c_void) -> Result<*mut c_void, CError> {
    entry::malloc(
        device,
        size as u64,
        StreamId(stream as u64),
        None,
        StackSource::Gather,
        None,
    )
    .map(|p| p as *mut c_void)
}

/// `void* cudamem_malloc(size_t size, int device, cudaStream_t stream)`: PyTorch's alloc
/// function. On failure see the module documentation (error modes).
#[no_mangle]
pub extern "C-unwind" fn cudamem_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    let err = match malloc_impl(size, device, stream) {
        Ok(p) => return p,
        Err(e) => e,
    };
    set_last_error(err.kind, &err.message);
    let mode = ERROR_MODE.load(Ordering::Relaxed);
    if mode == MODE_THROW {
        let t = THROWER.load(Ordering::Acquire);
        if t != 0 {
            let msg = CString::new(err.message.replace('\0', " ")).unwrap_or_default();
            // SAFETY: `t` was registered by `cudamem_set_error_thrower` as a function with the
            // `Thrower` signature (c10::detail::torchCheckFail). It does not return: it throws a
            // C++ exception that unwinds through this `C-unwind` frame (dropping `msg` and
            // `err`) back into PyTorch, which converts it to a Python RuntimeError. No lock is
            // held here.
            unsafe {
                let f: Thrower = std::mem::transmute::<usize, Thrower>(t);
                f(
                    c"cudamem_malloc".as_ptr(),
                    c"cudamem/python/src/ffi.rs".as_ptr(),
                    line!(),
                    msg.as_ptr(),
                );
            }
        }
    }
    report(&err.message);
    if mode != MODE_RETURN_NULL {
        report("cudamem: aborting: cannot report this allocation failure to the caller (error mode 'abort')");
        std::process::abort();
    }
    std::ptr::null_mut()
}

/// `void* cudamem_malloc_or_error(size_t, int, cudaStream_t, char* msg_buf, size_t msg_len)`:
/// like [`cudamem_malloc`], but on failure it returns NULL and writes the message (NUL-ended,
/// cut to `msg_len - 1` bytes) to `msg_buf`, never printing, throwing or aborting. The kind of
/// the failure is `cudamem_last_error_kind()`. With size 0 it returns NULL and writes "".
///
/// # Safety
/// `msg_buf` must be NULL or point to `msg_len` writable bytes.
#[no_mangle]
pub unsafe extern "C-unwind" fn cudamem_malloc_or_error(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    msg_buf: *mut c_char,
    msg_len: usize,
) -> *mut c_void {
    match malloc_impl(size, device, stream) {
        Ok(p) => {
            // SAFETY: caller's contract on msg_buf.
            unsafe { write_c_string("", msg_buf, msg_len) };
            p
        }
        Err(e) => {
            set_last_error(e.kind, &e.message);
            // SAFETY: caller's contract on msg_buf.
            unsafe { write_c_string(&e.message, msg_buf, msg_len) };
            std::ptr::null_mut()
        }
    }
}

/// `void cudamem_free(void* ptr, size_t size, int device, cudaStream_t stream)`: PyTorch's free
/// function. `size` and `stream` are not needed (the allocator knows both). A pointer cudamem
/// did not hand out is ignored: reported on stderr the first time, counted always.
#[no_mangle]
pub extern "C-unwind" fn cudamem_free(ptr: *mut c_void, _size: usize, device: c_int, _stream: *mut c_void) {
    if let Err(e) = entry::free(ptr as u64, Owner::Device(device), StackSource::Gather, None) {
        if e.kind == ERR_INVALID {
            UNKNOWN_FREES.fetch_add(1, Ordering::Relaxed);
            if !UNKNOWN_FREE_REPORTED.swap(true, Ordering::Relaxed) {
                report(&format!(
                    "cudamem: ignoring cudamem_free of a pointer it did not allocate: {} \
                     (reported once; cudamem_unknown_frees() counts them)",
                    e.message
                ));
            }
        } else {
            report(&e.message);
        }
    }
}

/// `void cudamem_empty_cache(void)`: PyTorch's reset hook (`torch.cuda.empty_cache()`): returns
/// the unused cached memory of every device to the driver.
#[no_mangle]
pub extern "C" fn cudamem_empty_cache() {
    let r = guarded("cudamem_empty_cache", || {
        for (_, a) in registry::existing() {
            a.empty_cache()?;
        }
        Ok(())
    });
    if let Err(e) = r {
        report(&format!("cudamem: empty_cache failed: {}", e.message));
    }
}

/// `void cudamem_set_memory_fraction(double fraction, int device)`: PyTorch's memory-fraction
/// hook (`torch.cuda.set_per_process_memory_fraction`).
#[no_mangle]
pub extern "C" fn cudamem_set_memory_fraction(fraction: c_double, device: c_int) {
    let r = guarded("cudamem_set_memory_fraction", || {
        registry::get_or_create(device)?
            .set_per_process_memory_fraction(fraction)
            .map_err(CError::from)
    });
    if let Err(e) = r {
        report(&format!(
            "cudamem: set_memory_fraction({fraction}, {device}) failed: {}",
            e.message
        ));
    }
}

/// `void cudamem_record_stream(void* ptr, cudaStream_t stream)`: PyTorch's record-stream hook
/// (`tensor.record_stream(s)`). The pointer is looked up on every device that has an allocator.
#[no_mangle]
pub extern "C" fn cudamem_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    if let Err(e) = entry::record_stream_any(ptr as u64, stream as u64) {
        if e.kind != ERR_INVALID || !UNKNOWN_RECORD_REPORTED.swap(true, Ordering::Relaxed) {
            report(&format!(
                "cudamem: record_stream ignored: {} (unknown pointers are reported once)",
                e.message
            ));
        }
    }
}

/// `int cudamem_last_error(char* buf, size_t len)`: copies the calling thread's last error
/// message to `buf` (NUL-ended) and returns its kind (`0` none, `1` out of memory, `2` invalid
/// argument or setting, `3` device error, `4` internal error).
///
/// # Safety
/// `buf` must be NULL or point to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn cudamem_last_error(buf: *mut c_char, len: usize) -> c_int {
    let (kind, msg) = last_error();
    // SAFETY: caller's contract on buf.
    unsafe { write_c_string(&msg, buf, len) };
    kind
}

/// `int cudamem_last_error_kind(void)`: the kind of the calling thread's last error.
#[no_mangle]
pub extern "C" fn cudamem_last_error_kind() -> c_int {
    last_error().0
}

/// `int cudamem_set_error_mode(int mode)`: sets how `cudamem_malloc` reports failures (0 print
/// and return NULL, 1 throw through the thrower, 2 abort); returns the previous mode, or -1 (and
/// changes nothing) for an unknown mode.
#[no_mangle]
pub extern "C" fn cudamem_set_error_mode(mode: c_int) -> c_int {
    if !(MODE_RETURN_NULL..=MODE_ABORT).contains(&mode) {
        return -1;
    }
    ERROR_MODE.swap(mode, Ordering::Relaxed)
}

/// Sets the thrower used in error mode 1 (NULL removes it).
///
/// # Safety
/// `f` must be NULL or a function with the signature of `c10::detail::torchCheckFail(const
/// char*, const char*, uint32_t, const char*)` that stays loaded for the rest of the process.
#[no_mangle]
pub unsafe extern "C" fn cudamem_set_error_thrower(f: *const c_void) {
    THROWER.store(f as usize, Ordering::Release);
}

/// `size_t cudamem_memory_allocated(int device)`: bytes allocated on `device` (0 before its first
/// allocation).
#[no_mangle]
pub extern "C" fn cudamem_memory_allocated(device: c_int) -> u64 {
    guarded("cudamem_memory_allocated", || {
        Ok(registry::get(device).map_or(0, |a| a.memory_allocated()))
    })
    .unwrap_or(0)
}

/// `size_t cudamem_memory_reserved(int device)`: bytes reserved from `device`.
#[no_mangle]
pub extern "C" fn cudamem_memory_reserved(device: c_int) -> u64 {
    guarded("cudamem_memory_reserved", || {
        Ok(registry::get(device).map_or(0, |a| a.memory_reserved()))
    })
    .unwrap_or(0)
}

/// `uint64_t cudamem_unknown_frees(void)`: how many `cudamem_free` calls named a pointer cudamem
/// did not hand out.
#[no_mangle]
pub extern "C" fn cudamem_unknown_frees() -> u64 {
    UNKNOWN_FREES.load(Ordering::Relaxed)
}

/// The current error mode.
pub fn error_mode() -> c_int {
    ERROR_MODE.load(Ordering::Relaxed)
}

// The exported functions the C++ side calls through pointers have the types it declares
// (`crate::abi`, generated into the C++ header).
const _: abi::MallocOrErrorFn = cudamem_malloc_or_error;
const _: abi::PluggableFreeFn = cudamem_free;
const _: abi::LastErrorFn = cudamem_last_error;
const _: abi::LastErrorKindFn = cudamem_last_error_kind;
