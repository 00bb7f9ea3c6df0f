//! # Trace replay: a recorded job's allocations, re-run through cudamem
//!
//! A PyTorch memory snapshot (or an RMM log) records every `alloc` and free of a job. Replaying
//! it through a [`CachingAllocator`](cudamem_alloc::CachingAllocator) on a simulated GPU answers "what would this job have
//! reserved with another policy, another configuration, or another GPU" without the GPU.
//!
//! ## How a trace becomes calls
//! The trace is first compiled into a [`Program`]: a flat list of [`Op`]s where each allocation
//! gets a slot number, so the timed loop does no hashing of trace addresses.
//! * `alloc` → `malloc(size, stream)`; the returned address goes into the allocation's slot.
//! * `free_requested` immediately followed (for that address) by `free_completed` → `free`.
//! * `free_requested` whose `free_completed` comes later (the block waited on events, as after
//!   `record_stream`) → `record_stream` on a private replay stream, then `free`; at the
//!   `free_completed` that stream's event is completed, so the block becomes reusable exactly
//!   when PyTorch's did (at the next `malloc`'s event processing).
//! * A run of `segment_free`/`segment_unmap` entries is the job calling `empty_cache()` (or
//!   PyTorch's out-of-memory retry, which releases the same blocks) → `empty_cache()`.
//! * Other segment entries, `oom`, `snapshot` and annotations are the recorded allocator's own
//!   output: they are compared against, not replayed.
//!
//! An allocation that fails in the replay is counted in `ooms`; its frees are skipped. One whose
//! innermost frame is named in [`ReplayOptions::shrink_on_oom`] asks for half as much, down to
//! nothing, instead (a caller that catches the error and makes do with less).
//!
//! ## Fidelity
//! With the `pytorch` policy and the trace's own settings, new segments get the addresses the
//! trace's `segment_alloc` entries carry (see `SimDevice::plan_addresses`), so ties between
//! equal-size free blocks break as they did in PyTorch and the segment history is reproduced.
//! Other segments go where [`ReplayOptions::placement`] says: the driver's own order is not
//! known without a trace, and it changes from run to run.
//!
//! ## Where each part lives
//! `program.rs`: the compiler ([`Program::compile`]), which also keeps each op's trace event and
//! stack for the reports. `pass.rs`: the loop ([`run_once`], the timed one; [`run_observed`],
//! the same loop telling an [`Observer`] of each op, which the HTML reports use, so every replay
//! follows the rules above once). `target.rs`: the simulated device or, with the `cuda`
//! feature, a real one ([`new_allocator`]). `options.rs`: how to replay ([`ReplayOptions`]), read by all
//! of them. `run.rs`: whole replays and their results, and the smallest-capacity search.

mod options;
mod pass;
mod program;
mod run;
mod target;

/// Where the simulated GPU places segments ([`ReplayOptions::placement`]).
pub use cudamem_device::sim::Placement;
pub use options::ReplayOptions;
pub use pass::{free_leftovers, run_observed, run_once, Observer, Quiet, DEFERRED_STREAM_BASE};
pub use program::{DoubleAllocs, Op, Program};
pub use run::{
    check_sim_capacity, effective_config, fit, replay, replay_device, settings_string, DeviceResult, ReplayResult,
};
pub use target::{new_allocator, Target};
