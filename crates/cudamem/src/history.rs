//! [`History`], one allocator's memory history and event stream: PyTorch's
//! `recordHistory` (`torch.cuda.memory._record_memory_history`), `snapshot`, annotations,
//! and an observer that hears every allocator event as it happens (`attachAllocatorTraceTracker`).
//!
//! Guarantees: each call takes the engine's lock once; the observer runs under that lock (it
//! must not call back into the allocator). Only an allocator with one device-wide engine keeps
//! a history: with `sharded:True`, [`Allocator::history`](crate::Allocator::history) is an error
//! that says so.

use cudamem_alloc::{CachingAllocator, RecordContext, TraceObserver};
use cudamem_trace_types::Trace;

/// One allocator's history, from [`Allocator::history`](crate::Allocator::history).
#[derive(Clone, Copy)]
pub struct History<'a> {
    pub(crate) engine: &'a CachingAllocator,
}

impl History<'_> {
    /// Starts (or, with `enabled` false, stops and clears) recording up to `max_entries`
    /// events, with stacks as `context` says.
    pub fn record_memory_history(&self, enabled: bool, context: RecordContext, max_entries: usize) {
        self.engine.record_memory_history(enabled, context, max_entries)
    }
    /// `torch.cuda.memory._snapshot()`: segments, blocks and the recorded events, in PyTorch's
    /// schema.
    pub fn snapshot(&self) -> Trace {
        self.engine.snapshot()
    }
    /// Records an annotation: `stage` `START` or `END` of the region `name`.
    pub fn annotate(&self, stage: &str, name: &str) {
        self.engine.annotate(stage, name)
    }
    /// Makes `observer` (or, with `None`, nobody) hear every event from now on.
    pub fn set_trace_observer(&self, observer: Option<TraceObserver>) {
        self.engine.lock().set_trace_observer(observer)
    }
}
