//! # cudarc interop: a [`Buffer`] as a cudarc slice, without copying
//!
//! [`Buffer::cuda_slice`] and [`Buffer::cuda_slice_zeroed`] give a [`CudaSliceRef<T>`]: a typed
//! view of the buffer's memory, on a cudarc stream, that cudarc's copies and kernel launches
//! take like one of its own slices:
//!
//! * it implements [`DeviceSlice`], [`DevicePtr`] and [`DevicePtrMut`], so
//!   `stream.memcpy_htod(&host, &mut view)`, `stream.memcpy_dtoh(&view, &mut host)`,
//!   `stream.memcpy_dtod(&view, &mut other)`, `stream.memset_zeros(&mut view)` and
//!   `stream.clone_dtoh(&view)` work;
//! * it dereferences to `&CudaSlice<T>` (a read-only kernel argument, `.slice(..)`, `.len()`),
//!   and [`CudaSliceRef::as_view_mut`] / [`CudaSliceRef::slice_mut`] give the `CudaViewMut` a
//!   kernel writes through (`launch_builder(&f).arg(&mut view)`).
//!
//! ```no_run
//! use cudamem::{Allocator, Stream};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let alloc = Allocator::new("cuda:0")?;
//! let ctx = alloc.cuda_context()?; // the device's primary context, shared with the allocator
//! let stream = ctx.new_stream()?;
//! let s = alloc.stream_from_cudarc(&stream)?;
//! let mut buf = alloc.alloc(1024 * std::mem::size_of::<f32>(), s)?;
//! {
//!     let mut view = buf.cuda_slice_zeroed::<f32>(&stream)?; // 1024 zeroed f32s
//!     let host: Vec<f32> = (0..1024).map(|i| i as f32).collect();
//!     stream.memcpy_htod(&host, &mut view)?; // straight into the cudamem buffer
//!     let back = stream.clone_dtoh(&view)?;
//!     assert_eq!(back, host);
//! } // the view ends: its stream is joined back to the buffer's stream
//! drop(buf); // back to the cache; the memory is reused only after the work above
//! # Ok(())
//! # }
//! ```
//!
//! ## Why this is sound
//!
//! The obvious alternative, `CudaStream::upgrade_device_ptr`, yields an *owning*
//! `CudaSlice<T>`: dropping it would `cuMemFree` memory that belongs to the allocator's cache,
//! and `ManuallyDrop` alone does not stop safe code from moving it out (`mem::replace` through a
//! `&mut`). So the `CudaSlice` built over the buffer is private to the view:
//!
//! * **It never frees.** The view keeps the slice in a `ManuallyDrop` and, when dropped, hands
//!   it to `CudaSlice::leak`, which releases cudarc's bookkeeping (its events and stream
//!   reference) and not the memory. Only `&CudaSlice<T>` and `CudaViewMut<'_, T>` are handed
//!   out, and neither can be turned into an owned slice.
//! * **It cannot outlive the buffer**: it borrows the buffer mutably, so the buffer can be
//!   neither dropped nor used otherwise while the view exists.
//! * **Streams are ordered against the buffer's stream.** The allocator reuses a freed block on
//!   the buffer's own stream without waiting (stream order, as in PyTorch), so work on any
//!   other stream must be ordered against that stream on both sides. When the view is made for
//!   a stream other than the buffer's, that stream first waits for the work queued on the
//!   buffer's stream (for example a kernel still using the memory under its previous owner);
//!   when the view is dropped, the buffer's stream waits for the view's stream, so anything
//!   queued there through the view completes before the block can be handed out again.
//!   A copy through `DevicePtr`/`DevicePtrMut` on yet another stream waits for the buffer's and
//!   the view's streams, and that stream is synchronised as soon as the copy is queued (the
//!   `SyncOnDrop` cudarc drops after queueing), so nothing of it is left pending.
//! * **Contexts are checked**: the cudarc stream must belong to the primary context of the
//!   allocator's device, the context the allocator allocates in.
//! * **Element types are checked**: the buffer's address must be aligned for `T`; the view has
//!   `len / size_of::<T>()` elements.
//!
//! What stays the caller's business, as with any cudarc slice:
//!
//! * [`Buffer::cuda_slice`] is `unsafe` because the memory may not hold valid `T`s yet (like
//!   cudarc's `CudaStream::alloc`); [`Buffer::cuda_slice_zeroed`] zeroes it first and is safe
//!   for `T: ValidAsZeroBits`.
//! * **Launch kernels on the view's stream** (make the view on the stream you launch on; views
//!   are cheap). A kernel argument (`&*view`, `&mut view.as_view_mut()`) cannot tell the view
//!   which stream the launch is on; on another stream the only protection is cudarc's own event
//!   tracking (the latest read and the latest write of the slice, joined to the view's stream
//!   when the view ends), exactly as for cudarc's own slices — and none if the context's event
//!   tracking was switched off (`unsafe` in cudarc).

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Deref, RangeBounds};
use std::sync::Arc;

use cudamem_cuda::cudarc::driver::{
    sys, CudaSlice, CudaStream, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice, SyncOnDrop,
    ValidAsZeroBits,
};
use cudamem_cuda::{CudaDevice, Device};

use crate::{cuda_stream_wait, keep_cudarc_stream, Buffer, Error, StreamId};

/// A typed, borrowed view of a [`Buffer`] as a cudarc slice on a cudarc stream. See the
/// [module documentation](self).
pub struct CudaSliceRef<'a, T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    /// The stream the view was made for (also referenced by `slice`; kept here so that the join
    /// in `drop` happens while the stream is certainly alive).
    stream: Arc<CudaStream>,
    cuda: Arc<CudaDevice>,
    /// The buffer's own stream.
    home: StreamId,
    _buffer: PhantomData<&'a mut Buffer>,
}

impl Buffer {
    /// A typed view of this buffer for cudarc, on `stream`: `len() / size_of::<T>()` elements,
    /// usable by cudarc copies and kernels without copying. CUDA only (the simulated device has
    /// no memory contents: [`Error::Unsupported`]); `stream` must belong to the device's primary
    /// context (see [`Allocator::cuda_context`](crate::Allocator::cuda_context)).
    ///
    /// # Safety
    /// The buffer's bytes may not be valid values of `T` (it comes from a cache, uninitialised):
    /// read them as `T` only after writing them, as with cudarc's `CudaStream::alloc`. Prefer
    /// [`cuda_slice_zeroed`](Self::cuda_slice_zeroed) where zeroing is affordable.
    pub unsafe fn cuda_slice<T: DeviceRepr>(&mut self, stream: &Arc<CudaStream>) -> Result<CudaSliceRef<'_, T>, Error> {
        let cuda = self.alloc.require_cuda("cuda_slice")?.clone();
        if stream.context().cu_ctx() != cuda.context() {
            return Err(Error::Unsupported(format!(
                "cuda_slice: the cudarc stream belongs to another context than {}'s primary \
                 context",
                cuda.name()
            )));
        }
        let size = std::mem::size_of::<T>();
        if size == 0 {
            return Err(Error::Unsupported("cuda_slice: zero-sized element type".into()));
        }
        if self.ptr % std::mem::align_of::<T>() as u64 != 0 {
            return Err(Error::Unsupported(format!(
                "cuda_slice: address {:#x} is not aligned for an element of alignment {}",
                self.ptr,
                std::mem::align_of::<T>()
            )));
        }
        let on = StreamId(stream.cu_stream() as u64);
        let home = self.stream.id();
        // Whatever is queued on the buffer's stream (earlier users of the block included) comes
        // first. The stream is kept alive for good, like every stream given to the allocator.
        keep_cudarc_stream(stream);
        cuda_stream_wait(&cuda, on, home)?;
        // SAFETY: `[ptr, +len * size)` lies in this live buffer, which the returned view
        // borrows mutably, so it stays allocated for the view's life; the slice is never
        // dropped as an owner (`Drop` of the view leaks it), so cudarc never frees it; the
        // caller answers for the contents being read as `T` (this function's contract).
        let slice = unsafe { stream.upgrade_device_ptr::<T>(self.ptr, self.len / size) };
        Ok(CudaSliceRef {
            slice: ManuallyDrop::new(slice),
            stream: stream.clone(),
            cuda,
            home,
            _buffer: PhantomData,
        })
    }

    /// [`cuda_slice`](Self::cuda_slice) with the memory zeroed first (`cuMemsetD8Async` on
    /// `stream`), so every element is a valid `T`; safe.
    pub fn cuda_slice_zeroed<T: DeviceRepr + ValidAsZeroBits>(
        &mut self,
        stream: &Arc<CudaStream>,
    ) -> Result<CudaSliceRef<'_, T>, Error> {
        // SAFETY: the contents are zeroed below, before the view is returned, and zero bits are
        // a valid `T` (`ValidAsZeroBits`).
        let mut view = unsafe { self.cuda_slice::<T>(stream) }?;
        stream
            .memset_zeros(&mut view)
            .map_err(|e| Error::Unsupported(format!("cuda_slice_zeroed: {e:?}")))?;
        Ok(view)
    }
}

impl<T> CudaSliceRef<'_, T> {
    /// The cudarc stream the view was made for.
    pub fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// A mutable cudarc view of all elements (a kernel argument a kernel may write through).
    pub fn as_view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice.as_view_mut()
    }

    /// A mutable cudarc view of some elements.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> CudaViewMut<'_, T> {
        self.slice.slice_mut(range)
    }

    /// Before a copy on `stream`, another stream than the view's: `stream` waits for the work
    /// queued on the buffer's stream and on the view's stream. (The caller then synchronises
    /// `stream` once the copy is queued.) A failure of the waits means the device is failing;
    /// the copy that follows reports it through cudarc.
    fn enter_other(&self, stream: &CudaStream) {
        let on = StreamId(stream.cu_stream() as u64);
        let _ = cuda_stream_wait(&self.cuda, on, self.home);
        let _ = cuda_stream_wait(&self.cuda, on, StreamId(self.stream.cu_stream() as u64));
    }

    fn is_own(&self, stream: &CudaStream) -> bool {
        stream.cu_stream() == self.stream.cu_stream()
    }
}

impl<T> Deref for CudaSliceRef<'_, T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> DeviceSlice<T> for CudaSliceRef<'_, T> {
    fn len(&self) -> usize {
        self.slice.len()
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for CudaSliceRef<'_, T> {
    fn device_ptr<'b>(&'b self, stream: &'b CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        if self.is_own(stream) {
            return self.slice.device_ptr(stream);
        }
        self.enter_other(stream);
        let (p, record) = self.slice.device_ptr(stream);
        drop(record);
        (p, SyncOnDrop::sync_stream(stream))
    }
}

impl<T> DevicePtrMut<T> for CudaSliceRef<'_, T> {
    fn device_ptr_mut<'b>(&'b mut self, stream: &'b CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        if self.is_own(stream) {
            return self.slice.device_ptr_mut(stream);
        }
        self.enter_other(stream);
        let (p, record) = self.slice.device_ptr_mut(stream);
        drop(record);
        (p, SyncOnDrop::sync_stream(stream))
    }
}

impl<T> Drop for CudaSliceRef<'_, T> {
    fn drop(&mut self) {
        // SAFETY: the slice is taken out exactly once, here, and the field is not used again.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // Releases cudarc's events and stream reference, not the memory; when cudarc tracks
        // streams, this also makes the view's stream wait for every use it recorded.
        let _ = slice.leak();
        // The buffer's stream waits for the view's stream: the block is reused on the buffer's
        // stream only after the work queued through the view.
        let on = StreamId(self.stream.cu_stream() as u64);
        let _ = cuda_stream_wait(&self.cuda, self.home, on);
    }
}

impl<T> std::fmt::Debug for CudaSliceRef<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSliceRef")
            .field("len", &self.slice.len())
            .field("stream", &self.stream.cu_stream())
            .field("home", &format_args!("{:#x}", self.home.0))
            .finish()
    }
}
