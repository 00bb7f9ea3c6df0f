//! [`Buffer`]: owned device memory from an [`Allocator`](crate::Allocator), returned to the
//! cache when dropped (the Rust form of Python's `del tensor`), with its host copies.
//!
//! Guarantees: only `Drop` or [`Buffer::free`] frees, exactly once; drop never panics (a failure
//! to free is ignored there and reported by [`Buffer::free`]); a block used on other streams
//! ([`Buffer::record_stream`]) is reused only after their work queued before the drop has
//! completed; host copies are checked against the buffer's bounds, and are
//! [`Error::Unsupported`](crate::Error::Unsupported) on the simulated device.

use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudamem_cuda::cudarc::driver::sys::{self, CUresult};

use crate::{AllocError, Allocator, CudaDevice, Error, Inner, Stream};

/// Device memory from an [`Allocator`], owned: dropping it returns the block to the cache (the
/// Rust form of Python's `del tensor`). See the [crate documentation](crate) for the stream
/// rules.
pub struct Buffer {
    /// The allocator: an uncounted alias kept valid by the allocator's keep-alive while the
    /// allocation is live, or (`counted`, empty buffers) a counted handle.
    pub(crate) alloc: ManuallyDrop<Allocator>,
    pub(crate) counted: bool,
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) stream: Stream,
    /// False once freed by [`Buffer::free`].
    pub(crate) live: bool,
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
