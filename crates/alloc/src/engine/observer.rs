//! # Segment observers: hearing the engine's device memory change
//!
//! PyTorch's `attachAllocatorTraceTracker`: code outside the allocator that must know which
//! device memory exists (ProcessGroupNCCL registers each segment with its communicators, and
//! deregisters it before it is freed) hears every `segment_alloc`, `segment_free`,
//! `segment_map` and `segment_unmap`, whether or not the history is recorded.
//!
//! Rules:
//! * An observer hears a change after the device call made it (`Alloc`, `Map`) or before the
//!   memory goes back to the device (`Free`, `Unmap`: the engine tells it at the point it records
//!   the history event, which PyTorch does before `cudaFree` as well), once per change, in order.
//! * It runs under the engine's lock, like PyTorch's trackers under its allocator's mutex: it
//!   must not call back into the engine, and should be quick.
//! * With no observer set the engine pays one predictable branch per segment change.

use std::fmt;
use std::sync::Arc;

use cudamem_device::StreamId;

use super::{Engine, StatSink};

/// What happened to the device memory behind a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentChange {
    /// A segment was obtained from the device (`cudaMalloc`, or an expandable segment's first
    /// mapping).
    Alloc,
    /// A segment went back to the device.
    Free,
    /// Pages of an expandable segment were mapped.
    Map,
    /// Pages of an expandable segment were unmapped.
    Unmap,
}

/// One change, as an observer hears it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentEvent {
    /// What happened.
    pub change: SegmentChange,
    /// The device ordinal.
    pub device: i32,
    /// The first address of the range.
    pub addr: u64,
    /// Its bytes.
    pub size: u64,
    /// The stream the segment belongs to.
    pub stream: StreamId,
}

/// Hears segment changes; see the [module documentation](self).
pub type SegmentObserver = Arc<dyn Fn(&SegmentEvent) + Send + Sync>;

/// The engine's observer, if any.
#[derive(Clone, Default)]
pub(crate) struct Observer(pub(crate) Option<SegmentObserver>);

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Observer(set)"
        } else {
            "Observer(none)"
        })
    }
}

impl<S: StatSink> Engine<S> {
    /// Sets (or, with `None`, removes) the observer of segment changes.
    pub fn set_segment_observer(&mut self, observer: Option<SegmentObserver>) {
        self.observer = Observer(observer);
    }

    /// Tells the observer, if any, of a change of `[addr, addr+size)`.
    #[inline]
    pub(super) fn observe(&self, change: SegmentChange, addr: u64, size: u64, stream: StreamId) {
        if let Some(o) = &self.observer.0 {
            o(&SegmentEvent {
                change,
                device: self.device.index(),
                addr,
                size,
                stream,
            });
        }
    }
}
