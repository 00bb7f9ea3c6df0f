//! # Trace observers: hearing every event of the engine as it happens
//!
//! PyTorch's `attachAllocatorTraceTracker` and the history torch keeps itself: code outside
//! the allocator hears each event the engine's history would record — `alloc`,
//! `free_requested`, `free_completed`, `segment_alloc`, `segment_free`, `segment_map`,
//! `segment_unmap`, `oom` — whether or not the engine records its own history.
//! ProcessGroupNCCL registers each segment with its communicators through it; cudamem's native
//! torch allocator turns the events into torch's `TraceEntry`s with torch's context recorder.
//!
//! Rules:
//! * An observer hears an event where the engine records it: after the device call made memory
//!   (`segment_alloc`, `segment_map`), before memory goes back to the device (`segment_free`,
//!   `segment_unmap`, as PyTorch records them before `cudaFree`), once per event, in order, on
//!   the thread whose call caused it.
//! * It runs under the engine's lock, like PyTorch's trackers under its allocator's mutex: it
//!   must not call back into the engine, and should be quick.
//! * With no observer set the engine pays one predictable branch per event.

use std::fmt;
use std::sync::Arc;

use cudamem_device::StreamId;

use super::{Engine, StatSink};
use crate::history::Action;

/// One event, as an observer hears it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// What happened (the history's action).
    pub action: Action,
    /// The device ordinal.
    pub device: i32,
    /// The address (of the block or range; for `oom`, the device's free bytes, as in the
    /// history).
    pub addr: u64,
    /// Bytes (requested bytes for `alloc`/`free_*`, as in the history).
    pub size: u64,
    /// The stream of the block or segment.
    pub stream: StreamId,
}

/// Hears the engine's events; see the module documentation (`engine/observer.rs`).
pub type TraceObserver = Arc<dyn Fn(&TraceEvent) + Send + Sync>;

/// The engine's observer, if any.
#[derive(Clone, Default)]
pub(crate) struct Observer(pub(crate) Option<TraceObserver>);

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
    /// Sets (or, with `None`, removes) the observer of the engine's events.
    pub fn set_trace_observer(&mut self, observer: Option<TraceObserver>) {
        self.observer = Observer(observer);
    }

    /// Tells the observer, if any, of an event.
    #[inline]
    pub(super) fn observe(&self, action: Action, addr: u64, size: u64, stream: StreamId) {
        if let Some(o) = &self.observer.0 {
            o(&TraceEvent {
                action,
                device: self.device.index(),
                addr,
                size,
                stream,
            });
        }
    }
}
