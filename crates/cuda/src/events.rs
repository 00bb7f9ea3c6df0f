//! Streams and events. A [`StreamId`] is the raw `CUstream` value (0 is the legacy default
//! stream); events come from a pool (created with `CU_EVENT_DISABLE_TIMING`, reused after
//! `destroy_event`, destroyed when the device is dropped), and an [`EventId`] carries the raw
//! `CUevent` value.
//!
//! Guarantees: an [`EventId`] this device did not hand out (or that was destroyed) is
//! `InvalidArgument` and never reaches the driver. Streams are not checked (the driver offers no
//! way to validate a `CUstream`): a [`StreamId`] must be 0, 1 (`CU_STREAM_LEGACY`), 2
//! (`CU_STREAM_PER_THREAD`) or a live stream of this device's primary context.

use std::collections::HashSet;
use std::ptr;

use cudarc::driver::sys::{self, CUstream};

use crate::{check, lock, CudaDevice, DeviceError, EventId, StreamId};

/// Event bookkeeping: the pool of idle events and the set handed out.
#[derive(Debug, Default)]
pub(crate) struct Events {
    pub(crate) idle: Vec<u64>,
    pub(crate) live: HashSet<u64>,
}

impl CudaDevice {
    /// Creates a stream on this device (`cuStreamCreate`; `non_blocking` gives
    /// `CU_STREAM_NON_BLOCKING`, which does not synchronise with the legacy default stream).
    pub fn create_stream(&self, non_blocking: bool) -> Result<StreamId, DeviceError> {
        let flags = if non_blocking { 1 } else { 0 };
        let mut s: CUstream = ptr::null_mut();
        let _c = self.current()?;
        // SAFETY: the context is current; `s` is a valid out-pointer; flags are a valid
        // CUstream_flags value.
        let r = unsafe { sys::cuStreamCreate(&mut s, flags) };
        check(r, "cuStreamCreate")?;
        Ok(StreamId(s as u64))
    }

    /// Destroys a stream made by [`CudaDevice::create_stream`] (`cuStreamDestroy`); work already
    /// queued on it still completes.
    ///
    /// # Safety
    /// `stream` must come from `create_stream` of this device and not be used afterwards.
    pub unsafe fn destroy_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        let _c = self.current()?;
        // SAFETY: the caller guarantees `stream` is a live stream of this context that nobody
        // uses afterwards.
        let r = unsafe { sys::cuStreamDestroy_v2(stream.0 as CUstream) };
        check(r, "cuStreamDestroy")
    }

    /// Number of events handed out and not yet returned with `destroy_event`.
    pub fn live_events(&self) -> usize {
        lock(&self.events).live.len()
    }

    pub(crate) fn check_event(&self, event: EventId) -> Result<(), DeviceError> {
        if lock(&self.events).live.contains(&event.0) {
            Ok(())
        } else {
            Err(DeviceError::InvalidArgument(format!("unknown event {:#x}", event.0)))
        }
    }
}
