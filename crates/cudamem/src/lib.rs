//! # cudamem: PyTorch's CUDA caching allocator, in Rust
//!
//! This crate is the API a Rust GPU program uses. An [`Allocator`] owns one device's caching
//! allocator (the engine of `cudamem-alloc`, which keeps freed device memory in a cache and
//! hands it out again exactly as PyTorch's `CUDACachingAllocator` does) and hands out
//! [`Buffer`]s: owning handles to device memory that go back to the cache when dropped — the
//! Rust form of Python's `del tensor`.
//!
//! ```
//! use cudamem::{Allocator, Stream};
//!
//! # fn main() -> Result<(), cudamem::Error> {
//! // "auto" is cuda:0 when a GPU is present, else a simulated H200.
//! let alloc = Allocator::new("auto")?;
//! let buf = alloc.alloc(64 << 20, Stream::DEFAULT)?;
//! assert_eq!(alloc.memory_allocated(), 64 << 20);
//! drop(buf); // back to the cache: still reserved, not allocated
//! assert_eq!(alloc.memory_allocated(), 0);
//! assert!(alloc.memory_reserved() >= 64 << 20);
//! alloc.empty_cache()?; // give cached memory back to the device
//! assert_eq!(alloc.memory_reserved(), 0);
//! println!("{}", alloc.memory_summary(true));
//! # Ok(())
//! # }
//! ```
//!
//! A longer walk-through, with data written to and read from the GPU, is
//! `examples/quickstart.rs` (`cargo run -p cudamem --example quickstart [device]`; it runs on
//! the simulated device where there is no GPU).
//!
//! ## Devices
//!
//! [`Allocator::new`] takes a device string:
//!
//! | string | device |
//! |---|---|
//! | `sim` | a simulated H200 (150,109,880,320 bytes, 2 MiB pages) — no GPU needed |
//! | `sim:<capacity>` | a simulated GPU of that many bytes: `sim:8GiB`, `sim:80GB`, `sim:1073741824` |
//! | `cuda`, `cuda:N` | CUDA device N (0 by default) through the driver API |
//! | `auto` | `cuda:0` when a CUDA device is present, else `sim` |
//!
//! The simulated device ([`SimDevice`]) accounts for memory exactly as a GPU would (capacity,
//! out-of-memory, addresses, virtual-memory mappings) but stores no data, so the data calls of
//! a [`Buffer`] ([`copy_from_host`](Buffer::copy_from_host), [`fill`](Buffer::fill), …) are
//! [`Error::Unsupported`] there. [`Allocator::with_config`] adds a `PYTORCH_CUDA_ALLOC_CONF`
//! string and a policy name; [`Allocator::from_env`] reads both, and the device, from the
//! environment.
//!
//! ## Design
//!
//! * **One engine per device, behind one mutex** (as PyTorch's per-device mutex): every
//!   [`Allocator`] clone and every thread shares it. `Allocator` is `Clone + Send + Sync` (an
//!   `Arc` inside), and lives as long as any of its buffers. With the configuration key
//!   `sharded:True` each group of streams gets its own engine and mutex instead
//!   ([`ShardedAllocator`]: same decisions, exact device-wide statistics), so that threads on
//!   their own streams do not wait for each other; a per-process memory fraction and the
//!   history are then unavailable.
//! * **Buffers hold no reference count.** A buffer aliases its allocator without counting; the
//!   allocator keeps itself alive per shard while the shard has live allocations (taken when its
//!   count of live allocations leaves 0, given back when it returns to 0), so allocating and
//!   freeing on several threads writes no shared counter.
//! * **Stream-ordered, like PyTorch.** A buffer belongs to the [`Stream`] it was allocated on.
//!   When it is dropped its block may be handed out again at once *to work on the same stream*,
//!   which the stream orders after everything queued before the drop. A buffer that was also
//!   used on other streams must say so with [`Buffer::record_stream`]: its block is then reused
//!   only after the work queued on those streams at the time of the drop has completed
//!   (events), exactly as `tensor.record_stream(s)` in PyTorch.
//! * **Every PyTorch query is forwarded**: [`memory_stats`](Allocator::memory_stats) (the same
//!   122 keys), [`memory_summary`](Allocator::memory_summary) (the same table),
//!   [`memory_allocated`](Allocator::memory_allocated), [`empty_cache`](Allocator::empty_cache),
//!   [`set_per_process_memory_fraction`](Allocator::set_per_process_memory_fraction),
//!   [`set_settings`](Allocator::set_settings), … Out of memory is
//!   [`AllocError::OutOfMemory`] carrying PyTorch's message, character for character.
//! * **Dropping the last handle empties the cache**: when the last `Allocator` clone (and so the
//!   last `Buffer`) goes, every cached segment is returned to the device.
//!
//! ## Guarantees
//!
//! * **No double free, no use of a foreign pointer.** Only `Buffer`'s `Drop` (or
//!   [`Buffer::free`]) frees, exactly once; the engine refuses unknown pointers, and the CUDA
//!   device refuses to free or unmap anything it did not allocate.
//! * **Drop never panics**; a failure to free (which would be a bug) is ignored there, and
//!   [`Buffer::free`] reports it instead.
//! * **Streams are checked where it matters.** On a CUDA device, only streams known to be valid
//!   are passed to the driver: [`Stream::DEFAULT`], [`Stream::LEGACY`], [`Stream::PER_THREAD`],
//!   streams from [`Allocator::create_stream`] or [`Allocator::stream_from_cudarc`] (both kept
//!   alive for the rest of the process), and raw handles vouched for with the `unsafe`
//!   [`Stream::from_raw_cuda`]. Any other stream (such as [`Stream::from_raw`], which is safe,
//!   or a simulated stream) is [`Error::InvalidStream`] on CUDA; the simulated device takes any.
//! * **Invariants are executable**: [`Allocator::check_invariants`] checks every invariant of the
//!   engine (blocks tile segments, stats match blocks, pools hold exactly the free blocks, …).
//!
//! ## cudarc interop
//!
//! With a CUDA device, a buffer's memory can be used by [`cudarc`] kernels and copies without
//! copying it out: [`Buffer::cuda_slice`] (`unsafe`: the contents are not yet valid `T`s, as
//! with cudarc's own `CudaStream::alloc`) and [`Buffer::cuda_slice_zeroed`] (safe) return a
//! [`CudaSliceRef`], a borrowed typed view that implements cudarc's
//! [`DevicePtr`](cudarc::driver::DevicePtr) and [`DevicePtrMut`](cudarc::driver::DevicePtrMut)
//! (so `memcpy_htod`, `memcpy_dtoh`, `memcpy_dtod`, `memset_zeros` take it) and dereferences to
//! a `&CudaSlice<T>` (a kernel argument). See the [`interop`] module for why this is sound: the
//! view never owns the memory, and its streams are joined back to the buffer's stream.
//!
//! ## Limits
//!
//! * One device per allocator; create one `Allocator` per GPU.
//! * CUDA graphs capture, IPC handles and the pinned-host allocator of PyTorch are not offered.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]
// `%` rather than `is_multiple_of`, which is newer than the workspace's rust-version.
#![allow(clippy::manual_is_multiple_of)]

pub mod interop;

use std::collections::HashMap;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

pub use cudamem_alloc::config::ConfigError;
pub use cudamem_alloc::size::{parse_size, SizeError};
pub use cudamem_alloc::{AllocError, AllocatorConfig, CachingAllocator, DeviceStats, OutOfMemory, StatsDict};
pub use cudamem_cuda::{cudarc, CudaDevice};
pub use cudamem_device::sim::SimDevice;
pub use cudamem_device::{Device, DeviceCounters, DeviceError, DevicePtr, StreamId};
pub use cudamem_sharded::ShardedAllocator;
pub use interop::CudaSliceRef;

use cudamem_cuda::cudarc::driver::sys::{self, CUevent, CUresult, CUstream};
use cudamem_cuda::cudarc::driver::CudaStream;

/// The policy used when none is named.
pub const DEFAULT_POLICY: &str = "cudamem";

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// What can go wrong with the API of this crate.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A device string that is not `sim`, `sim:<capacity>`, `cuda`, `cuda:N` or `auto`.
    BadDevice {
        /// The string given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The device string was understood but the device could not be opened (no CUDA driver,
    /// no such ordinal, a driver failure).
    DeviceUnavailable {
        /// The string given.
        spec: String,
        /// The device's error.
        source: DeviceError,
    },
    /// The allocator configuration string (`PYTORCH_CUDA_ALLOC_CONF` syntax) was rejected.
    Config(ConfigError),
    /// An allocator call failed: out of memory ([`AllocError::OutOfMemory`], with PyTorch's
    /// message), an unknown pointer, a bad argument or a device failure.
    Alloc(AllocError),
    /// A stream that may not be passed to this allocator's device (see [`Stream`]).
    InvalidStream {
        /// The raw handle.
        raw: u64,
        /// The device it was given to.
        device: String,
    },
    /// An operation this device does not offer (data access on the simulated device), or a
    /// misuse of the cudarc interop (a stream of another context, a misaligned element type).
    Unsupported(String),
}

impl Error {
    /// True for out-of-memory errors of the allocator.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::Alloc(e) if e.is_out_of_memory())
    }

    /// The allocator's error, if this is one.
    pub fn as_alloc_error(&self) -> Option<&AllocError> {
        match self {
            Error::Alloc(e) => Some(e),
            _ => None,
        }
    }

    /// The out-of-memory report, if this is an out-of-memory error.
    pub fn out_of_memory(&self) -> Option<&OutOfMemory> {
        match self {
            Error::Alloc(AllocError::OutOfMemory(o)) => Some(o),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadDevice { spec, reason } => write!(
                f,
                "invalid device '{spec}': {reason} (expected sim, sim:<capacity> such as sim:8GiB, \
                 cuda, cuda:N or auto)"
            ),
            Error::DeviceUnavailable { spec, source } => {
                write!(f, "cannot open device '{spec}': {source}")
            }
            Error::Config(e) => write!(f, "invalid allocator configuration: {e}"),
            Error::Alloc(e) => e.fmt(f),
            Error::InvalidStream { raw, device } => write!(
                f,
                "stream {raw:#x} may not be used on {device}: use Stream::DEFAULT, \
                 Allocator::create_stream, Allocator::stream_from_cudarc or the unsafe \
                 Stream::from_raw_cuda"
            ),
            Error::Unsupported(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::DeviceUnavailable { source, .. } => Some(source),
            Error::Config(e) => Some(e),
            Error::Alloc(e) => Some(e),
            _ => None,
        }
    }
}

impl From<AllocError> for Error {
    fn from(e: AllocError) -> Self {
        Error::Alloc(e)
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}

impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Self {
        Error::Alloc(AllocError::Device(e))
    }
}

// ---------------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------------

/// A stream, by its raw handle (`cudaStream_t` as an integer; 0 is the legacy default stream),
/// plus whether the handle may be passed to a CUDA driver.
///
/// Equality and hashing look at the raw handle only. On the simulated device any value names a
/// stream. On a CUDA device the handle is passed to the driver, which cannot validate it, so
/// only streams known to be valid are accepted there (others are [`Error::InvalidStream`]):
/// the constants, streams from [`Allocator::create_stream`] and
/// [`Allocator::stream_from_cudarc`] (which live until the process exits), and handles vouched
/// for with [`Stream::from_raw_cuda`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Stream {
    raw: u64,
    cuda_ok: bool,
}

impl Stream {
    /// The legacy default stream (handle 0; PyTorch's default stream).
    pub const DEFAULT: Stream = Stream { raw: 0, cuda_ok: true };
    /// `CU_STREAM_LEGACY` (handle 1), the legacy default stream named explicitly.
    pub const LEGACY: Stream = Stream { raw: 1, cuda_ok: true };
    /// `CU_STREAM_PER_THREAD` (handle 2), the calling thread's default stream.
    pub const PER_THREAD: Stream = Stream { raw: 2, cuda_ok: true };

    /// A stream named by its raw handle. Safe: on a CUDA device such a stream is refused (with
    /// [`Error::InvalidStream`]) unless it is one of the constants; use it for the simulated
    /// device, or to compare with streams in traces and stats.
    pub const fn from_raw(raw: u64) -> Stream {
        Stream { raw, cuda_ok: raw <= 2 }
    }

    /// A CUDA stream from its raw `CUstream` handle, to be used on a CUDA device.
    ///
    /// # Safety
    /// `raw` must be 0, 1, 2 or a stream of the primary context of the device of every
    /// allocator it is given to, and stay alive (not `cuStreamDestroy`ed) while any buffer
    /// allocated on it or recorded with it exists, and while that allocator may still have work
    /// of it to wait for (until the buffers are dropped and `empty_cache` or the allocator's drop
    /// has run).
    pub const unsafe fn from_raw_cuda(raw: u64) -> Stream {
        Stream { raw, cuda_ok: true }
    }

    /// The raw handle.
    pub const fn as_raw(self) -> u64 {
        self.raw
    }

    /// The raw handle as a driver `CUstream`.
    pub fn as_cu_stream(self) -> CUstream {
        self.raw as CUstream
    }

    /// The engine's name for this stream.
    pub const fn id(self) -> StreamId {
        StreamId(self.raw)
    }

    /// Whether this stream may be passed to a CUDA device (see the type's documentation).
    pub const fn is_cuda_valid(self) -> bool {
        self.cuda_ok
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}
impl Eq for Stream {}
impl std::hash::Hash for Stream {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.raw.hash(state)
    }
}

impl From<Stream> for StreamId {
    fn from(s: Stream) -> StreamId {
        StreamId(s.raw)
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {:#x}", self.raw)
    }
}

/// cudarc streams handed to [`Allocator::stream_from_cudarc`] (or used by a [`CudaSliceRef`]),
/// kept alive until the process exits so that their handles stay valid (and are never reused
/// for another stream) wherever a [`Stream`] copy of them went.
fn keep_cudarc_stream(s: &Arc<CudaStream>) {
    static KEPT: OnceLock<Mutex<HashMap<u64, Arc<CudaStream>>>> = OnceLock::new();
    let kept = KEPT.get_or_init(Default::default);
    let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
    kept.entry(s.cu_stream() as u64).or_insert_with(|| Arc::clone(s));
}

// ---------------------------------------------------------------------------------------------
// Device strings
// ---------------------------------------------------------------------------------------------

/// A parsed device string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The simulated GPU, with this capacity (default: an H200's).
    Sim {
        /// Bytes of device memory; `None` for an H200's.
        capacity: Option<u64>,
    },
    /// CUDA device N.
    Cuda(i32),
    /// `cuda:0` if a CUDA device is present, else `sim`.
    Auto,
}

impl DeviceSpec {
    /// Parses `sim`, `sim:<capacity>`, `cuda`, `cuda:N` or `auto` (case-insensitive,
    /// surrounding blanks ignored). A capacity is a byte count of at least 1 with an optional
    /// unit in either case, parsed by [`parse_size`]: `KiB`/`K` … `EiB`/`E` (powers of 1024) or
    /// `B`, `KB` … `EB` (powers of 1000), e.g. `sim:8GiB`, `sim:1.5G`, `sim:80GB`,
    /// `sim:1073741824`.
    pub fn parse(spec: &str) -> Result<DeviceSpec, Error> {
        let bad = |reason: String| Error::BadDevice {
            spec: spec.to_string(),
            reason,
        };
        let s = spec.trim();
        if s.is_empty() {
            return Err(bad("the device string is empty".into()));
        }
        // The kind in either case; the argument as written, for messages.
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k.trim().to_ascii_lowercase(), Some(a.trim())),
            None => (s.to_ascii_lowercase(), None),
        };
        match (kind.as_str(), arg) {
            ("sim", None) => Ok(DeviceSpec::Sim { capacity: None }),
            ("sim", Some(c)) => match parse_size(c) {
                Ok(n) => Ok(DeviceSpec::Sim { capacity: Some(n) }),
                Err(e) => Err(bad(format!("bad capacity: {e}"))),
            },
            ("cuda", None) => Ok(DeviceSpec::Cuda(0)),
            ("cuda", Some(n)) => match n.parse::<i32>() {
                Ok(i) if i >= 0 => Ok(DeviceSpec::Cuda(i)),
                _ => Err(bad(format!("'{n}' is not a device ordinal (0, 1, ...)"))),
            },
            ("auto", None) => Ok(DeviceSpec::Auto),
            ("auto", Some(_)) => Err(bad("'auto' takes no argument".into())),
            (k, _) => Err(bad(format!("unknown device kind '{k}'"))),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The allocator
// ---------------------------------------------------------------------------------------------

struct Inner {
    engine: CachingAllocator,
    /// Live [`Allocator`] handles (clones), not counting the uncounted aliases in buffers.
    handles: AtomicUsize,
    /// Without sharding: whether the engine holds a keep-alive count (taken when the last
    /// handle went while allocations were live). Read and written under the engine's lock.
    kept: AtomicBool,
    /// With `sharded:True`: serves every allocation instead of `engine` (which then holds
    /// nothing; it keeps the configuration, the policy's name and the history API).
    sharded: Option<ShardedAllocator>,
    device: Arc<dyn Device>,
    cuda: Option<Arc<CudaDevice>>,
    sim: Option<Arc<SimDevice>>,
}

/// Keep-alive. A buffer does not hold a counted handle of its allocator: one shared reference
/// count written by every alloc and free would make threads on their own streams contend
/// again, and costs a locked instruction each time even on one thread. What keeps `Inner` alive
/// while buffers outlive every handle:
///
/// * **With sharding**, each shard holds one count of the allocator's `Arc` while it has live
///   allocations: taken when its count of live allocations (kept under its lock) goes 0 → 1,
///   given back when it returns to 0. Why the `Arc` never reaches zero while it can still be
///   used: whoever allocates holds a counted handle or a live buffer (whose shard holds a
///   count), and a shard's count is given back only after its last buffer is gone; a take
///   always comes before the release that matches it, because the buffer whose free makes the
///   release exists only after its allocation's take.
/// * **Without sharding** (one engine), nothing is taken while a handle exists: the handles'
///   own counts keep `Inner` alive. When the last handle goes ([`Inner::handles`] reaches 0),
///   it takes one count, under the engine's lock, if allocations are live then ([`Inner::kept`]);
///   the free that leaves none live (under the same lock) gives it back. Why that suffices: an
///   allocation needs a handle or a live buffer's alias, so with no handle left, every
///   allocation happens while another is live and the engine's count of live allocations
///   never rises from 0; the lock orders the last handle's look at that count against every
///   free, so either the look sees the allocation live (and takes the count that its free
///   gives back) or the free came first (and needs no count: the handle still held one). A
///   cache-hit pair thus writes no shared count at all, where it used to take and give back a
///   count whenever it was the only live allocation (`gpu_bench`'s latency loop).
///
/// In both cases a free must not touch `Inner` once its lock is given back: another thread's
/// free may then give back the last count. So a buffer frees through [`Inner::free_raw`], which
/// holds no reference to `Inner` past that point, and a sharded free that merges the shards'
/// logs afterwards takes a count for it under the shard's lock (Miri found the sharded free
/// reading the allocator after its lock on 2026-12-01; `keepalive_when_the_last_handle_races_the_frees`).
impl Inner {
    /// Shard has live buffers now: one more count of the allocator's `Arc`.
    fn hold(self: &Arc<Self>) {
        // SAFETY: `self` is a live `Arc<Inner>`; the count taken here is given back by exactly
        // one `Release` (see the comment above `impl Inner`).
        unsafe { Arc::increment_strong_count(Arc::as_ptr(self)) }
    }
}

/// Gives back a shard's count of the allocator's `Arc` when dropped; drop it after the last use
/// of the allocator (this may free it).
struct Release(*const Inner);

impl Drop for Release {
    fn drop(&mut self) {
        // SAFETY: matches the `hold` of the shard whose live count just returned to zero; the
        // pointer came from that `Arc` (see the comment above `impl Inner`).
        unsafe { Arc::decrement_strong_count(self.0) }
    }
}

impl Inner {
    /// Allocates; `Some(shard)` when a count must be taken (a shard's live count went 0 → 1).
    fn malloc(&self, size: u64, stream: StreamId) -> Result<(u64, Option<usize>), AllocError> {
        match &self.sharded {
            Some(s) => s.malloc_noting(size, stream),
            None => Ok((self.engine.lock().malloc(size, stream)?, None)),
        }
    }
    /// Frees. Returns, to be dropped by the caller after this returns, the count to give back
    /// (a shard's live count went 1 → 0, or the engine's, with a count held since the last
    /// handle went) and any count taken to finish the operation after its lock was given back.
    ///
    /// Through a raw pointer, because once the lock is given back another thread's free may
    /// give back the last count and drop `Inner`: no reference to it may be used or held as an
    /// argument past that point (a `&self` method would hold one until it returns) unless a
    /// count is held.
    ///
    /// # Safety
    /// `this` must point to a live `Inner` until the lock is taken here: the caller's buffer,
    /// live until this free, ensures it (see the keep-alive comment above).
    unsafe fn free_raw(
        this: *const Inner,
        ptr: u64,
        stream: StreamId,
    ) -> (Result<(), AllocError>, [Option<Release>; 2]) {
        // SAFETY: live until the lock is taken (the contract); used after it only while a
        // count taken under the lock is held.
        let inner = unsafe { &*this };
        match &inner.sharded {
            Some(s) => {
                let pin = || {
                    // SAFETY: called under the shard's lock, where the buffer being freed keeps
                    // its shard's count, so `*this` is alive; the count is given back by the
                    // `Release` dropped after `free_raw` returns.
                    unsafe { Arc::increment_strong_count(this) };
                    Release(this)
                };
                // SAFETY: `s` lives in `*this`, which the caller's live buffer keeps alive until
                // the shard's lock is taken.
                let (r, pin) = unsafe { ShardedAllocator::free_noting_raw(s, ptr, stream, pin) };
                match r {
                    Ok(last) => (Ok(()), [last.map(|_| Release(this)), pin]),
                    Err(e) => (Err(e), [None, pin]),
                }
            }
            None => {
                let mut e = inner.engine.lock();
                if let Err(err) = e.free(ptr) {
                    return (Err(err), [None, None]);
                }
                let last = inner.kept.load(Ordering::Relaxed) && e.stats().allocation.all().current == 0;
                if last {
                    inner.kept.store(false, Ordering::Relaxed);
                }
                drop(e); // the last use of `inner`
                (Ok(()), [last.then(|| Release(this)), None])
            }
        }
    }

    /// The last handle is going (it still holds its count): without sharding, live allocations
    /// from now on keep the allocator alive through one count (see above).
    fn last_handle_gone(self: &Arc<Self>) {
        if self.sharded.is_some() {
            return; // the shards take and give back their own counts
        }
        let e = self.engine.lock();
        if e.stats().allocation.all().current > 0 && !self.kept.load(Ordering::Relaxed) {
            self.kept.store(true, Ordering::Relaxed);
            self.hold();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // No buffer is alive (each holds an Allocator clone): everything cached goes back.
        let _ = self.engine.empty_cache();
        if let Some(s) = &self.sharded {
            let _ = s.empty_cache();
        }
    }
}

/// A caching allocator of one device. See the [crate documentation](crate).
///
/// Cloning is cheap (an `Arc`); every clone, and every [`Buffer`], shares the same cache.
pub struct Allocator {
    inner: Arc<Inner>,
}

impl Clone for Allocator {
    fn clone(&self) -> Self {
        self.inner.handles.fetch_add(1, Ordering::Relaxed);
        Allocator {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        // Buffers' aliases are never dropped (`ManuallyDrop`), so only handles count here.
        if self.inner.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.last_handle_gone();
        }
    }
}

impl fmt::Debug for Allocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocator")
            .field("device", &self.device_name())
            .field("policy", &self.policy_name())
            .field("allocated", &self.memory_allocated())
            .field("reserved", &self.memory_reserved())
            .finish()
    }
}

/// Synthetic stream handles of the simulated device, from [`Allocator::create_stream`].
static NEXT_SIM_STREAM: AtomicU64 = AtomicU64::new(0x5157_0000_0000);

impl Allocator {
    /// An allocator with PyTorch's default configuration and policy on `device` (`sim`,
    /// `sim:<capacity>`, `cuda`, `cuda:N` or `auto`; see the [crate documentation](crate)).
    pub fn new(device: &str) -> Result<Allocator, Error> {
        Self::with_allocator_config(device, AllocatorConfig::default(), DEFAULT_POLICY)
    }

    /// An allocator on `device` with a configuration in `PYTORCH_CUDA_ALLOC_CONF` syntax (e.g.
    /// `"expandable_segments:True,max_split_size_mb:128"`; empty for the defaults) and a policy
    /// (`"cudamem"`, `"cudamem-compact"`, `"pytorch"`, `"pytorch-expandable"`; empty for the configuration's `policy:` key, else
    /// `"cudamem"`).
    pub fn with_config(device: &str, config: &str, policy: &str) -> Result<Allocator, Error> {
        let cfg = AllocatorConfig::parse(config)?;
        Self::with_allocator_config(device, cfg, policy)
    }

    /// As [`with_config`](Self::with_config), with the configuration already parsed.
    pub fn with_allocator_config(device: &str, config: AllocatorConfig, policy: &str) -> Result<Allocator, Error> {
        let spec = DeviceSpec::parse(device)?;
        let policy = if policy.trim().is_empty() {
            config.policy.clone().unwrap_or_else(|| DEFAULT_POLICY.to_string())
        } else {
            policy.trim().to_string()
        };
        let unavailable = |source| Error::DeviceUnavailable {
            spec: device.to_string(),
            source,
        };
        let (dev, cuda, sim): (Arc<dyn Device>, _, _) = match spec {
            DeviceSpec::Sim { capacity } => {
                let s = Arc::new(match capacity {
                    Some(c) => SimDevice::with_capacity(c),
                    None => SimDevice::default(),
                });
                (s.clone(), None, Some(s))
            }
            DeviceSpec::Cuda(i) => {
                let c = Arc::new(CudaDevice::new(i).map_err(unavailable)?);
                (c.clone(), Some(c), None)
            }
            DeviceSpec::Auto if cudamem_cuda::is_available() => {
                let c = Arc::new(CudaDevice::new(0).map_err(unavailable)?);
                (c.clone(), Some(c), None)
            }
            DeviceSpec::Auto => {
                let s = Arc::new(SimDevice::default());
                (s.clone(), None, Some(s))
            }
        };
        let sharded = if config.sharded {
            Some(ShardedAllocator::new(dev.clone(), config.clone(), &policy)?)
        } else {
            None
        };
        let engine = CachingAllocator::with_policy(dev.clone(), config, &policy)?;
        Ok(Allocator {
            inner: Arc::new(Inner {
                engine,
                handles: AtomicUsize::new(1),
                kept: AtomicBool::new(false),
                sharded,
                device: dev,
                cuda,
                sim,
            }),
        })
    }

    /// An allocator configured by the environment, as a PyTorch process is:
    /// * `CUDAMEM_DEVICE`: the device string (default `auto`);
    /// * `CUDAMEM_ALLOC_CONF`, else `PYTORCH_CUDA_ALLOC_CONF` (and PyTorch's other names): the
    ///   configuration ([`AllocatorConfig::from_env`]);
    /// * `CUDAMEM_POLICY`: the policy (default: the configuration's `policy:` key, else
    ///   `pytorch`).
    pub fn from_env() -> Result<Allocator, Error> {
        let device = std::env::var("CUDAMEM_DEVICE").unwrap_or_else(|_| "auto".to_string());
        let config = AllocatorConfig::from_env()?;
        let policy = std::env::var("CUDAMEM_POLICY").unwrap_or_default();
        Self::with_allocator_config(&device, config, &policy)
    }

    fn check_stream(&self, stream: Stream) -> Result<(), Error> {
        if self.inner.cuda.is_some() && !stream.cuda_ok {
            return Err(Error::InvalidStream {
                raw: stream.raw,
                device: self.device_name(),
            });
        }
        Ok(())
    }

    /// Allocates `size` bytes for use on `stream` (PyTorch's `malloc`). A size of 0 gives an
    /// empty buffer at address 0. Out of memory (after freeing the cache and retrying, as
    /// PyTorch does) is [`AllocError::OutOfMemory`], whose `Display` is PyTorch's message.
    pub fn alloc(&self, size: usize, stream: Stream) -> Result<Buffer, Error> {
        self.check_stream(stream)?;
        let (ptr, first) = self.inner.malloc(size as u64, stream.id())?;
        if first.is_some() {
            self.inner.hold();
        }
        let (alloc, counted) = if ptr == 0 {
            // No allocation keeps the allocator alive for an empty buffer: it holds a handle.
            (ManuallyDrop::new(self.clone()), true)
        } else {
            // SAFETY: an uncounted alias of this allocator's `Arc`, never dropped (it is a
            // `ManuallyDrop` that `Buffer::drop` leaves alone when `counted` is false). The
            // `Inner` outlives it: the allocation at `ptr` stays live until the buffer is
            // dropped or freed, and while it is live its shard's keep-alive holds a counted
            // handle (taken just above if this is the shard's first live allocation).
            let alias = unsafe { Arc::from_raw(Arc::as_ptr(&self.inner)) };
            (ManuallyDrop::new(Allocator { inner: alias }), false)
        };
        Ok(Buffer {
            alloc,
            counted,
            ptr,
            len: size,
            stream,
            live: true,
        })
    }

    /// A new stream for this device: on CUDA a non-blocking stream (`cuStreamCreate` with
    /// `CU_STREAM_NON_BLOCKING`), which — like the streams of PyTorch's pool — is never
    /// destroyed, so that its handle stays valid wherever it went; on the simulated device a
    /// fresh stream number.
    pub fn create_stream(&self) -> Result<Stream, Error> {
        match &self.inner.cuda {
            Some(c) => {
                let s = c.create_stream(true)?;
                Ok(Stream {
                    raw: s.0,
                    cuda_ok: true,
                })
            }
            None => Ok(Stream::from_raw(NEXT_SIM_STREAM.fetch_add(1, Ordering::Relaxed))),
        }
    }

    /// The [`Stream`] of a cudarc stream, for use with this allocator. The cudarc stream must
    /// belong to this device's primary context (`CudaContext::new(ordinal)` gives it); it is kept
    /// alive until the process exits, so that its handle stays valid.
    pub fn stream_from_cudarc(&self, stream: &Arc<CudaStream>) -> Result<Stream, Error> {
        let cuda = self.require_cuda("stream_from_cudarc")?;
        if stream.context().cu_ctx() != cuda.context() {
            return Err(Error::Unsupported(format!(
                "the cudarc stream belongs to another context than {}'s primary context",
                self.device_name()
            )));
        }
        keep_cudarc_stream(stream);
        Ok(Stream {
            raw: stream.cu_stream() as u64,
            cuda_ok: true,
        })
    }

    /// A cudarc context for this device: its primary context, the one this allocator uses
    /// (`CudaContext::new(ordinal)`). [`Error::Unsupported`] on the simulated device.
    pub fn cuda_context(&self) -> Result<Arc<cudarc::driver::CudaContext>, Error> {
        let cuda = self.require_cuda("cuda_context")?;
        cudarc::driver::CudaContext::new(cuda.index() as usize)
            .map_err(|e| Error::Unsupported(format!("cudarc CudaContext::new failed: {e:?}")))
    }

    fn require_cuda(&self, what: &str) -> Result<&Arc<CudaDevice>, Error> {
        self.inner.cuda.as_ref().ok_or_else(|| {
            Error::Unsupported(format!(
                "{what} needs a CUDA device; this allocator runs on {}",
                self.device_name()
            ))
        })
    }

    /// Makes `waiter` wait (on the device, without blocking the host) for the work queued on
    /// `on` so far — PyTorch's `waiter.wait_stream(on)`. If no event can be recorded, blocks
    /// until `on` is idle instead. A no-op on the simulated device.
    pub fn stream_wait(&self, waiter: Stream, on: Stream) -> Result<(), Error> {
        self.check_stream(waiter)?;
        self.check_stream(on)?;
        match &self.inner.cuda {
            Some(c) => Ok(cuda_stream_wait(c, waiter.id(), on.id())?),
            None => Ok(()),
        }
    }

    /// Waits until the work queued on `stream` has completed (`cuStreamSynchronize`).
    pub fn synchronize_stream(&self, stream: Stream) -> Result<(), Error> {
        self.check_stream(stream)?;
        Ok(self.inner.device.synchronize_stream(stream.id())?)
    }

    /// Waits until all work on the device has completed (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<(), Error> {
        Ok(self.inner.device.synchronize()?)
    }

    // --- PyTorch's queries and controls -------------------------------------------------------

    /// `torch.cuda.memory_stats()`: the 122 keys, PyTorch's names.
    pub fn memory_stats(&self) -> StatsDict {
        match &self.inner.sharded {
            Some(s) => s.memory_stats(),
            None => self.inner.engine.memory_stats(),
        }
    }
    /// The statistics as a struct.
    pub fn stats(&self) -> DeviceStats {
        match &self.inner.sharded {
            Some(s) => s.stats(),
            None => self.inner.engine.stats(),
        }
    }
    /// `torch.cuda.memory_summary(abbreviated=...)`: PyTorch's table.
    pub fn memory_summary(&self, abbreviated: bool) -> String {
        match &self.inner.sharded {
            Some(s) => s.memory_summary(abbreviated),
            None => self.inner.engine.memory_summary(abbreviated),
        }
    }
    /// `torch.cuda.memory_allocated()`: bytes of live buffers (rounded sizes).
    pub fn memory_allocated(&self) -> u64 {
        self.stats().allocated_bytes.all().current as u64
    }
    /// `torch.cuda.max_memory_allocated()`.
    pub fn max_memory_allocated(&self) -> u64 {
        self.stats().allocated_bytes.all().peak as u64
    }
    /// `torch.cuda.memory_reserved()`: bytes held from the device (cached or in use).
    pub fn memory_reserved(&self) -> u64 {
        self.stats().reserved_bytes.all().current as u64
    }
    /// `torch.cuda.max_memory_reserved()`.
    pub fn max_memory_reserved(&self) -> u64 {
        self.stats().reserved_bytes.all().peak as u64
    }
    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak_memory_stats(&self) {
        match &self.inner.sharded {
            Some(s) => s.reset_peak_memory_stats(),
            None => self.inner.engine.reset_peak_memory_stats(),
        }
    }
    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated_memory_stats(&self) {
        match &self.inner.sharded {
            Some(s) => s.reset_accumulated_memory_stats(),
            None => self.inner.engine.reset_accumulated_memory_stats(),
        }
    }
    /// `torch.cuda.empty_cache()`: waits for pending frees, then returns every cached segment
    /// (and every free page of expandable segments) to the device.
    pub fn empty_cache(&self) -> Result<(), Error> {
        if let Some(s) = &self.inner.sharded {
            s.empty_cache()?;
        }
        Ok(self.inner.engine.empty_cache()?)
    }
    /// `torch.cuda.mem_get_info()`: `(free, total)` bytes of the device.
    pub fn mem_get_info(&self) -> Result<(u64, u64), Error> {
        Ok(self.inner.engine.mem_get_info()?)
    }
    /// `torch.cuda.set_per_process_memory_fraction(fraction)`: limits the memory this allocator
    /// may hold to `fraction` (in [0, 1]) of the device's.
    pub fn set_per_process_memory_fraction(&self, fraction: f64) -> Result<(), Error> {
        self.not_sharded("set_per_process_memory_fraction")?;
        Ok(self.inner.engine.set_memory_fraction(fraction)?)
    }
    /// `torch.cuda.memory._set_allocator_settings(settings)`: changes settings at run time.
    pub fn set_settings(&self, settings: &str) -> Result<(), Error> {
        self.not_sharded("set_settings")?;
        Ok(self.inner.engine.set_settings(settings)?)
    }
    /// The configuration in force.
    pub fn config(&self) -> AllocatorConfig {
        self.inner.engine.config()
    }
    /// The policy's name.
    pub fn policy_name(&self) -> String {
        self.inner.engine.policy_name()
    }
    /// Checks every invariant of the engine (slow; for tests). `Err` describes the first broken
    /// one.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.inner.engine.check_invariants()?;
        if let Some(s) = &self.inner.sharded {
            s.check_invariants()?;
        }
        if let Some(s) = &self.inner.sim {
            s.check()?;
        }
        Ok(())
    }

    // --- the device ---------------------------------------------------------------------------

    /// The device's name: `"sim"` or `"cuda:N"`.
    pub fn device_name(&self) -> String {
        self.inner.device.name()
    }
    /// The device ordinal.
    pub fn device_index(&self) -> i32 {
        self.inner.device.index()
    }
    /// Whether this allocator runs on a real CUDA device.
    pub fn is_cuda(&self) -> bool {
        self.inner.cuda.is_some()
    }
    /// The device.
    pub fn device(&self) -> Arc<dyn Device> {
        self.inner.device.clone()
    }
    /// Counters of the device calls made so far (mallocs, frees, maps, events, ...).
    pub fn device_counters(&self) -> DeviceCounters {
        self.inner.device.counters()
    }
    /// The CUDA device, when this allocator runs on one (for raw driver calls).
    pub fn cuda_device(&self) -> Option<&Arc<CudaDevice>> {
        self.inner.cuda.as_ref()
    }
    /// The simulated device, when this allocator runs on one (to inspect or inject faults).
    pub fn sim_device(&self) -> Option<&Arc<SimDevice>> {
        self.inner.sim.as_ref()
    }
    /// Whether allocations go to per-stream shards (`sharded:True`).
    pub fn is_sharded(&self) -> bool {
        self.inner.sharded.is_some()
    }
    /// The sharded allocator, with `sharded:True`.
    pub fn sharded_allocator(&self) -> Option<&ShardedAllocator> {
        self.inner.sharded.as_ref()
    }
    fn not_sharded(&self, what: &str) -> Result<(), Error> {
        if self.inner.sharded.is_some() {
            return Err(Error::Alloc(AllocError::InvalidArgument(format!(
                "{what} needs one device-wide view, which a sharded allocator (sharded:True) does not have"
            ))));
        }
        Ok(())
    }
    /// The engine, for calls this facade does not forward (history, settings, locking). With
    /// `sharded:True` it serves no allocation (they go to the shards).
    pub fn caching_allocator(&self) -> &CachingAllocator {
        &self.inner.engine
    }
}

/// `waiter` waits for the work queued on `on` so far: an event recorded on `on`, waited for by
/// `waiter` (`cuStreamWaitEvent`). Falls back to synchronising `on` if that fails.
pub(crate) fn cuda_stream_wait(dev: &CudaDevice, waiter: StreamId, on: StreamId) -> Result<(), DeviceError> {
    if waiter == on {
        return Ok(());
    }
    let ev = match dev.record_event(on) {
        Ok(e) => e,
        Err(_) => return dev.synchronize_stream(on),
    };
    let r = dev.with_current(|| {
        // SAFETY: the context is current; `ev` is a live event of this device's context, just
        // recorded; `waiter` is a valid stream of the context (streams reach here only after
        // `check_stream` or from a cudarc stream of the same context). The wait applies to this
        // recording of `ev`, so returning the event to the pool below (where it may be recorded
        // again) does not change what `waiter` waits for.
        unsafe { sys::cuStreamWaitEvent(waiter.0 as CUstream, ev.0 as CUevent, 0) }
    });
    dev.destroy_event(ev);
    match r {
        Ok(CUresult::CUDA_SUCCESS) => Ok(()),
        _ => dev.synchronize_stream(on),
    }
}

// ---------------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------------

/// Device memory from an [`Allocator`], owned: dropping it returns the block to the cache (the
/// Rust form of Python's `del tensor`). See the [crate documentation](crate) for the stream
/// rules.
pub struct Buffer {
    /// The allocator: an uncounted alias kept valid by the allocator's keep-alive while the
    /// allocation is live, or (`counted`, empty buffers) a counted handle.
    alloc: ManuallyDrop<Allocator>,
    counted: bool,
    ptr: u64,
    len: usize,
    stream: Stream,
    /// False once freed by [`Buffer::free`].
    live: bool,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("device_ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("stream", &format_args!("{:#x}", self.stream.raw))
            .field("device", &self.alloc.device_name())
            .finish()
    }
}

impl Buffer {
    /// The device address (`CUdeviceptr`); 0 for an empty buffer.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    /// Bytes asked for (the block behind it may be larger: sizes are rounded as in PyTorch).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer is empty (size 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The stream the buffer was allocated on.
    pub fn stream(&self) -> Stream {
        self.stream
    }
    /// The allocator it came from.
    pub fn allocator(&self) -> &Allocator {
        &self.alloc
    }

    /// PyTorch's `tensor.record_stream(stream)`: the buffer is used on `stream` too, so its
    /// block is not reused before the work queued on `stream` when the buffer is dropped has
    /// completed.
    pub fn record_stream(&self, stream: Stream) -> Result<(), Error> {
        self.alloc.check_stream(stream)?;
        if self.ptr == 0 {
            return Ok(());
        }
        match &self.alloc.inner.sharded {
            Some(s) => Ok(s.record_stream(self.ptr, self.stream.id(), stream.id())?),
            None => Ok(self.alloc.inner.engine.record_stream(self.ptr, stream.id())?),
        }
    }

    /// Frees the buffer now, reporting a failure (which `Drop` cannot).
    pub fn free(mut self) -> Result<(), Error> {
        self.release()
    }

    /// Returns the allocation; afterwards `self.alloc` may dangle (unless `counted`).
    fn release(&mut self) -> Result<(), Error> {
        if !std::mem::take(&mut self.live) {
            return Ok(());
        }
        let inner = Arc::as_ptr(&self.alloc.inner);
        // SAFETY: this buffer is live until the free, so its allocator is (keep-alive comment).
        let (r, counts) = unsafe { Inner::free_raw(inner, self.ptr, self.stream.id()) };
        // `self.alloc` is not used again: giving the counts back may free the allocator.
        drop(counts);
        r.map_err(Error::from)
    }

    fn cuda(&self, what: &str) -> Result<&Arc<CudaDevice>, Error> {
        self.alloc.require_cuda(what)
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<(), Error> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::Alloc(AllocError::InvalidArgument(format!(
                "range [{offset}, +{len}) is outside the buffer of {} bytes",
                self.len
            ))));
        }
        Ok(())
    }

    /// Copies `src` to the buffer at `offset`, ordered on the buffer's stream, and waits for
    /// the copy to complete (`cuMemcpyHtoDAsync` + `cuStreamSynchronize`). CUDA only.
    pub fn copy_from_host(&mut self, offset: usize, src: &[u8]) -> Result<(), Error> {
        let cuda = self.cuda("copy_from_host")?;
        self.check_range(offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let (dst, stream) = (self.ptr + offset as u64, self.stream.as_cu_stream());
        let r = cuda.with_current(|| {
            // SAFETY: `[dst, +src.len())` lies in this live buffer (checked above), which `&mut
            // self` gives us alone; `src` is a valid host slice borrowed until the stream is
            // synchronised below, so the asynchronous copy never outlives it; the stream was
            // checked when the buffer was allocated.
            unsafe {
                let r = sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), stream);
                if r != CUresult::CUDA_SUCCESS {
                    // Whatever was queued must finish before `src` may go away.
                    let _ = sys::cuStreamSynchronize(stream);
                    return (r, "cuMemcpyHtoDAsync");
                }
                (sys::cuStreamSynchronize(stream), "cuStreamSynchronize")
            }
        })?;
        Ok(cudamem_cuda::check(r.0, r.1)?)
    }

    /// Copies from the buffer at `offset` into `dst`, ordered on the buffer's stream (after the
    /// work queued on it), and waits for the copy (`cuMemcpyDtoHAsync` + `cuStreamSynchronize`).
    /// CUDA only.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        let cuda = self.cuda("copy_to_host")?;
        self.check_range(offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let (src, stream) = (self.ptr + offset as u64, self.stream.as_cu_stream());
        let r = cuda.with_current(|| {
            // SAFETY: `[src, +dst.len())` lies in this live buffer (checked above); `dst` is an
            // exclusively borrowed host slice, written only by this copy, which completes before
            // the borrow ends (the stream is synchronised below, also on failure); the stream was
            // checked when the buffer was allocated.
            unsafe {
                let r = sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, dst.len(), stream);
                if r != CUresult::CUDA_SUCCESS {
                    let _ = sys::cuStreamSynchronize(stream);
                    return (r, "cuMemcpyDtoHAsync");
                }
                (sys::cuStreamSynchronize(stream), "cuStreamSynchronize")
            }
        })?;
        Ok(cudamem_cuda::check(r.0, r.1)?)
    }

    /// The whole buffer read back into a `Vec` (see [`copy_to_host`](Self::copy_to_host)).
    pub fn to_vec(&self) -> Result<Vec<u8>, Error> {
        let mut v = vec![0u8; self.len];
        self.copy_to_host(0, &mut v)?;
        Ok(v)
    }

    /// Sets every byte to `value`, queued on the buffer's stream (`cuMemsetD8Async`); returns
    /// without waiting. CUDA only.
    pub fn fill(&mut self, value: u8) -> Result<(), Error> {
        let cuda = self.cuda("fill")?;
        if self.len == 0 {
            return Ok(());
        }
        // SAFETY: the whole live buffer, which `&mut self` gives us alone, on its own stream
        // (checked at allocation); work queued on the stream completes before the block can be
        // handed out again on that stream (stream order) or on any other (events/record_stream).
        unsafe { cuda.memset_async(self.ptr, value, self.len as u64, self.stream.id()) }?;
        Ok(())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // Cannot fail for a live buffer of this allocator unless the engine has a bug;
        // `Buffer::free` reports errors for callers who want them.
        let _ = self.release();
        if self.counted {
            // SAFETY: a counted handle (empty buffers), dropped once, here.
            unsafe { ManuallyDrop::drop(&mut self.alloc) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("8 gib"), Ok(8 << 30));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("80GB"), Ok(80_000_000_000));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_size("512b"), Ok(512));
        // The units the CLI has always taken: up to EiB, in either case.
        assert_eq!(parse_size("2PiB"), Ok(2 << 50));
        assert_eq!(parse_size("1eib"), Ok(1 << 60));
        assert_eq!(parse_size("8gb"), Ok(8_000_000_000));
        for bad in ["", "GiB", "8XB", "1.2.3", "-1", "0", "99999999999999TiB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn device_strings_parse() {
        assert_eq!(DeviceSpec::parse("sim").unwrap(), DeviceSpec::Sim { capacity: None });
        assert_eq!(
            DeviceSpec::parse(" SIM:8GiB ").unwrap(),
            DeviceSpec::Sim {
                capacity: Some(8 << 30)
            }
        );
        assert_eq!(DeviceSpec::parse("cuda").unwrap(), DeviceSpec::Cuda(0));
        assert_eq!(DeviceSpec::parse("cuda:3").unwrap(), DeviceSpec::Cuda(3));
        assert_eq!(DeviceSpec::parse("auto").unwrap(), DeviceSpec::Auto);
        assert_eq!(
            DeviceSpec::parse("sim:2pib").unwrap(),
            DeviceSpec::Sim {
                capacity: Some(2 << 50)
            }
        );
        for bad in ["", "gpu", "cuda:-1", "cuda:x", "sim:0", "sim:lots", "auto:1", "cpu:0"] {
            let e = DeviceSpec::parse(bad).unwrap_err();
            assert!(matches!(e, Error::BadDevice { .. }), "{bad}: {e}");
            assert!(e.to_string().contains(&format!("'{bad}'")), "{e}");
        }
        // The size parser's own message, with the unit as written.
        let e = DeviceSpec::parse("sim:8XB").unwrap_err().to_string();
        assert!(e.contains("unknown size unit 'XB'"), "{e}");
    }

    #[test]
    fn streams_compare_by_handle() {
        assert_eq!(Stream::from_raw(0), Stream::DEFAULT);
        assert!(Stream::from_raw(2).is_cuda_valid());
        assert!(!Stream::from_raw(0x1234).is_cuda_valid());
        // SAFETY: only compared, never given to an allocator.
        let s = unsafe { Stream::from_raw_cuda(0x1234) };
        assert_eq!(s, Stream::from_raw(0x1234));
        assert!(s.is_cuda_valid());
    }
}
