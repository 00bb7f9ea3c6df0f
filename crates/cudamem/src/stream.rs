//! Streams: [`Stream`], a raw stream handle plus whether it may be passed to a CUDA driver, and
//! the stream-ordering helpers of the crate (a stream waiting for another; cudarc streams kept
//! alive).
//!
//! Guarantees: on a CUDA device, only streams known to be valid are passed to the driver: the
//! constants ([`Stream::DEFAULT`], [`Stream::LEGACY`], [`Stream::PER_THREAD`]), streams from
//! [`Allocator::create_stream`](crate::Allocator::create_stream) or
//! [`Allocator::stream_from_cudarc`](crate::Allocator::stream_from_cudarc) (kept alive for the
//! rest of the process, so their handles are never reused for another stream), and raw handles
//! vouched for with the `unsafe` [`Stream::from_raw_cuda`]. Any other stream is
//! [`Error::InvalidStream`](crate::Error::InvalidStream) there; the simulated device takes any.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use cudamem_cuda::cudarc::driver::sys::{self, CUevent, CUresult, CUstream};
use cudamem_cuda::cudarc::driver::CudaStream;

use crate::{CudaDevice, Device, DeviceError, StreamId};

/// A stream, by its raw handle (`cudaStream_t` as an integer; 0 is the legacy default stream),
/// plus whether the handle may be passed to a CUDA driver.
///
/// Equality and hashing look at the raw handle only. On the simulated device any value names a
/// stream. On a CUDA device the handle is passed to the driver, which cannot validate it, so
/// only streams known to be valid are accepted there (others are [`Error::InvalidStream`](crate::Error::InvalidStream)):
/// the constants, streams from [`Allocator::create_stream`](crate::Allocator::create_stream) and
/// [`Allocator::stream_from_cudarc`](crate::Allocator::stream_from_cudarc) (which live until the process exits), and handles vouched
/// for with [`Stream::from_raw_cuda`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Stream {
    pub(crate) raw: u64,
    pub(crate) cuda_ok: bool,
}

impl Stream {
    /// The legacy default stream (handle 0; PyTorch's default stream).
    pub const DEFAULT: Stream = Stream { raw: 0, cuda_ok: true };
    /// `CU_STREAM_LEGACY` (handle 1), the legacy default stream named explicitly.
    pub const LEGACY: Stream = Stream { raw: 1, cuda_ok: true };
    /// `CU_STREAM_PER_THREAD` (handle 2), the calling thread's default stream.
    pub const PER_THREAD: Stream = Stream { raw: 2, cuda_ok: true };

    /// A stream named by its raw handle. Safe: on a CUDA device such a stream is refused (with
    /// [`Error::InvalidStream`](crate::Error::InvalidStream)) unless it is one of the constants; use it for the simulated
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
pub(crate) fn keep_cudarc_stream(s: &Arc<CudaStream>) {
    static KEPT: OnceLock<Mutex<HashMap<u64, Arc<CudaStream>>>> = OnceLock::new();
    let kept = KEPT.get_or_init(Default::default);
    let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
    kept.entry(s.cu_stream() as u64).or_insert_with(|| Arc::clone(s));
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
