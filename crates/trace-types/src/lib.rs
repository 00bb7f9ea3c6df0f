//! # cudamem-trace-types: the in-memory model of an allocation trace
//!
//! [`Trace`] and its parts (devices' event lists, segments and blocks of a snapshot, interned
//! stacks, the allocator's settings, annotations) are the one vocabulary that the trace readers
//! (`cudamem-trace`), the allocator engine (its history and snapshots) and the replay share.
//! This crate holds only the types, their small helpers and [`TraceError`]; it reads and writes
//! no file, so that the engine can produce traces without depending on the readers.
//! `cudamem-trace` re-exports everything here.
//!
//! Invariants every producer keeps (readers and the engine's snapshots): every `stack: Some(id)`
//! is a valid index into [`Trace::stacks`], and events keep the order the allocator saw them in.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;

mod error;
mod summary;

pub use error::{ErrorKind, Location, TraceError};
pub use summary::TraceSummary;

/// The largest device ordinal a trace may name. Writers emit one device list per ordinal up to
/// the largest, so an absurd ordinal in a hostile file would make a gigabyte snapshot.
pub const MAX_DEVICE_ORDINAL: i32 = 1024;

/// Index of a [`Stack`] in [`Trace::stacks`].
pub type StackId = u32;

/// A whole allocation trace, in whatever format it was read from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// Name of the file (or other source) it was read from; used in messages.
    pub source: String,
    /// One entry per device that has at least one event, in increasing
    /// device order. `device` is the CUDA device ordinal where the format
    /// records it (the index into a snapshot's `device_traces`).
    pub devices: Vec<DeviceTrace>,
    /// The snapshot's `segments`: the allocator's state at dump time (the
    /// *end* of the trace). Empty for formats that do not record it (RMM CSV).
    pub segments: Vec<SegmentSnapshot>,
    /// The snapshot's `allocator_settings`; [`AllocatorSettings::default`]
    /// when the source has none.
    pub settings: AllocatorSettings,
    /// Interned Python/C++ stacks, referred to by [`StackId`].
    pub stacks: Vec<Stack>,
    /// The snapshot's `external_annotations` (e.g. `record_function` ranges
    /// such as `Optimizer.step#AdamW.step` START/END), in file order. They
    /// let a replay cut a trace into iterations, and let snapshots
    /// round-trip. Empty for formats without them.
    pub annotations: Vec<Annotation>,
}

/// The events recorded for one device, in recording order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceTrace {
    /// CUDA device ordinal.
    pub device: i32,
    /// Events in the order the allocator recorded them (non-decreasing time).
    pub events: Vec<TraceEvent>,
}

/// One allocator event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceEvent {
    /// What happened.
    pub action: Action,
    /// Device address of the block or segment. For [`Action::Oom`] this holds
    /// the snapshot's `device_free` instead: the bytes CUDA reported free
    /// when the allocation failed.
    pub addr: u64,
    /// Bytes. For `alloc`/`free_*` in PyTorch traces this is the size the
    /// caller asked for (not rounded); for `segment_*` the segment size; for
    /// `oom` the requested size.
    pub size: u64,
    /// CUDA stream handle (`cudaStream_t` as an integer; 0 = default stream).
    pub stream: u64,
    /// Time of the event in microseconds (PyTorch: since the epoch; RMM:
    /// since midnight or since the epoch, depending on the log).
    pub time_us: i64,
    /// Stack that made the call, if recorded.
    pub stack: Option<StackId>,
}

/// The kind of an allocator event (PyTorch's `TraceEntry::Action`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// A block was handed to the caller (`alloc`).
    Alloc,
    /// The caller freed a block; it may still be in use by other streams
    /// (`free_requested`).
    FreeRequested,
    /// The block is really free now (`free_completed`).
    FreeCompleted,
    /// A segment was obtained from CUDA (`cudaMalloc`; `segment_alloc`).
    SegmentAlloc,
    /// A segment was returned to CUDA (`segment_free`).
    SegmentFree,
    /// Expandable segments: pages were mapped (`segment_map`).
    SegmentMap,
    /// Expandable segments: pages were unmapped (`segment_unmap`).
    SegmentUnmap,
    /// An allocation failed (`oom`); `addr` holds `device_free`.
    Oom,
    /// A snapshot was taken (`snapshot`).
    Snapshot,
    /// A user annotation (`annotate`, newer PyTorch builds).
    Annotate,
}

impl Action {
    /// All actions, in declaration order (which is also the compact code order).
    pub const ALL: [Action; 10] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Oom,
        Action::Snapshot,
        Action::Annotate,
    ];

    /// The name PyTorch uses in snapshot pickles.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::Snapshot => "snapshot",
            Action::Annotate => "annotate",
        }
    }

    /// Parse PyTorch's name of an action.
    pub fn from_name(name: &str) -> Option<Action> {
        Action::ALL.iter().copied().find(|a| a.as_str() == name)
    }

    /// Code used by the compact format.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Inverse of [`Action::code`].
    pub fn from_code(code: u8) -> Option<Action> {
        Action::ALL.get(code as usize).copied()
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One frame of a recorded stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Frame {
    /// Function name.
    pub name: String,
    /// Source file.
    pub filename: String,
    /// Line number.
    pub line: i64,
}

/// A recorded stack, innermost frame first (PyTorch's order).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Stack {
    /// The frames.
    pub frames: Vec<Frame>,
}

/// Which pool a segment belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SegmentType {
    /// Large pool (blocks > 1 MiB).
    #[default]
    Large,
    /// Small pool (blocks ≤ 1 MiB, 2 MiB segments).
    Small,
}

impl SegmentType {
    /// PyTorch's name (`"large"` / `"small"`).
    pub fn as_str(self) -> &'static str {
        match self {
            SegmentType::Large => "large",
            SegmentType::Small => "small",
        }
    }
}

/// A segment of the snapshot's `segments` list (state at dump time).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SegmentSnapshot {
    /// CUDA device ordinal.
    pub device: i32,
    /// Base address.
    pub address: u64,
    /// Bytes reserved from CUDA.
    pub total_size: u64,
    /// Bytes in `active_allocated` blocks.
    pub allocated_size: u64,
    /// Bytes in active blocks (allocated or pending free).
    pub active_size: u64,
    /// Bytes requested by callers for the active blocks.
    pub requested_size: u64,
    /// Stream the segment was allocated for.
    pub stream: u64,
    /// Pool kind.
    pub segment_type: SegmentType,
    /// `segment_pool_id`: (0, 0) for the default pool, else a graph/mempool id.
    pub pool_id: (i64, i64),
    /// Whether it is an expandable segment.
    pub is_expandable: bool,
    /// Stack of the segment's allocation (`frames` of the segment).
    pub stack: Option<StackId>,
    /// Blocks, in address order, tiling the segment.
    pub blocks: Vec<BlockSnapshot>,
    /// cudamem: the tag whose pools hold the segment (`tag` in a pickle); `None` for untagged
    /// memory and in PyTorch's snapshots.
    pub tag: Option<String>,
    /// cudamem: the segment's tag is asleep (`asleep`): the range is not mapped now, so it is
    /// not reserved; its blocks keep their states.
    pub asleep: bool,
}

/// State of a block at dump time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum BlockState {
    /// Handed out (`active_allocated`).
    ActiveAllocated,
    /// Freed by the caller but still in use by a stream (`active_pending_free`).
    ActivePendingFree,
    /// Free (`inactive`).
    #[default]
    Inactive,
}

impl BlockState {
    /// PyTorch's name.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// A block of a [`SegmentSnapshot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct BlockSnapshot {
    /// Address. Old snapshots have no block addresses; the reader then
    /// computes them from the segment address and the sizes of the blocks
    /// before it (blocks tile their segment).
    pub address: u64,
    /// Block size (rounded).
    pub size: u64,
    /// Size the caller asked for (`size` when the snapshot does not say).
    pub requested_size: u64,
    /// State at dump time.
    pub state: BlockState,
    /// Stack of the allocation that owns the block.
    pub stack: Option<StackId>,
}

/// The snapshot's `allocator_settings`.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorSettings {
    /// `PYTORCH_CUDA_ALLOC_CONF` as the process saw it.
    pub conf: String,
    /// `max_split_size` in bytes; -1 = unlimited.
    pub max_split_size: i64,
    /// `garbage_collection_threshold` (0.0 = off).
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// `roundup_power2_divisions`: (interval start in MiB, divisions), sorted
    /// by interval; PyTorch writes keys "1", "2", … "32768".
    pub roundup_power2_divisions: Vec<(u64, u64)>,
    /// `release_lock_on_cudamalloc`.
    pub release_lock_on_cudamalloc: bool,
    /// `pinned_num_register_threads`.
    pub pinned_num_register_threads: i64,
    /// `pinned_use_cuda_host_register`.
    pub pinned_use_cuda_host_register: bool,
    /// `graph_capture_record_stream_reuse`.
    pub graph_capture_record_stream_reuse: bool,
}

impl Default for AllocatorSettings {
    /// PyTorch's defaults: empty conf, unlimited split size, no GC threshold,
    /// no expandable segments, no power-of-two rounding, one pinned thread.
    fn default() -> Self {
        AllocatorSettings {
            conf: String::new(),
            max_split_size: -1,
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            roundup_power2_divisions: Vec::new(),
            release_lock_on_cudamalloc: false,
            pinned_num_register_threads: 1,
            pinned_use_cuda_host_register: false,
            graph_capture_record_stream_reuse: false,
        }
    }
}

/// One entry of a snapshot's `external_annotations`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Annotation {
    /// Device ordinal.
    pub device: i32,
    /// `START` or `END` (kept as written).
    pub stage: String,
    /// Name of the range, e.g. `Optimizer.step#AdamW.step`.
    pub name: String,
    /// Time in microseconds (same clock as the events).
    pub time_us: i64,
}
