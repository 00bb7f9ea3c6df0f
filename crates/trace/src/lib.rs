//! Readers and writers of CUDA allocation traces.
//!
//! `cudamem-trace` turns allocation traces recorded by other tools into one
//! in-memory model, [`Trace`], that the replay engine consumes, and writes that
//! model back out. It knows nothing about the allocator engine itself.
//!
//! Formats (see each module for the details and what its reader guarantees):
//!
//! | format | read | write | module |
//! | --- | --- | --- | --- |
//! | PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot()`), `.pickle` or gzip'd | [`read_pickle`] | [`write_snapshot_pickle`] | [`pickle`] |
//! | RMM `logging_resource_adaptor` CSV log | [`read_rmm_csv`] | – | [`rmm`] |
//! | cudamem's compact binary format (`CUDAMEMT`) | [`read_compact`] | [`write_compact`] | [`compact`] |
//!
//! [`read_path`] and [`read_bytes`] pick the format from the content, never from
//! the file name: gzip magic (`1f 8b`) → gunzip, then look again; pickle `PROTO`
//! opcode (`0x80`) → pickle; `CUDAMEMT` → compact; a first line starting with
//! `Thread,` → RMM CSV.
//!
//! Guarantees common to every reader:
//!
//! * no input makes a reader panic, overflow its stack, or allocate memory
//!   because a length field says so; malformed input gives a [`TraceError`]
//!   that names the file and the position (line, entry path or byte offset);
//! * every `stack: Some(id)` in the returned trace is a valid index into
//!   [`Trace::stacks`], and each distinct non-empty frame list is stored once;
//! * events keep the order of the input (which is the time order: snapshot
//!   pickles and RMM logs are written in the order the allocator saw them).
//!
//! Frames are interned: an empty frame list and a missing one both read as
//! `None`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::Path;

pub mod compact;
pub mod pickle;
mod pickle_vm;
pub mod rmm;

pub use compact::{read_compact, write_compact};
pub use pickle::{read_pickle, write_snapshot_pickle};
pub use rmm::read_rmm_csv;

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

/// Counts and ranges of a trace, for printing.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TraceSummary {
    /// [`Trace::source`].
    pub source: String,
    /// Device ordinals with events.
    pub devices: Vec<i32>,
    /// Total number of events.
    pub events: u64,
    /// Events per action, in [`Action::ALL`] order, zero counts omitted.
    pub by_action: Vec<(Action, u64)>,
    /// Distinct streams seen in events, sorted.
    pub streams: Vec<u64>,
    /// Number of interned stacks.
    pub stacks: usize,
    /// Number of snapshot segments.
    pub segments: usize,
    /// Number of snapshot blocks.
    pub blocks: usize,
    /// Earliest and latest event time, if any event.
    pub time_range_us: Option<(i64, i64)>,
}

impl fmt::Display for TraceSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "trace {}", self.source)?;
        writeln!(f, "  devices: {:?}", self.devices)?;
        writeln!(f, "  events: {}", self.events)?;
        for (a, n) in &self.by_action {
            writeln!(f, "    {:<15} {}", a.as_str(), n)?;
        }
        writeln!(f, "  streams: {:?}", self.streams)?;
        writeln!(f, "  stacks: {}", self.stacks)?;
        writeln!(f, "  segments: {} ({} blocks)", self.segments, self.blocks)?;
        if let Some((a, b)) = self.time_range_us {
            writeln!(f, "  time: {} us .. {} us ({} us)", a, b, b.saturating_sub(a))?;
        }
        Ok(())
    }
}

impl Trace {
    /// An empty trace named `source`.
    pub fn new(source: impl Into<String>) -> Trace {
        Trace {
            source: source.into(),
            ..Trace::default()
        }
    }

    /// The events of `device`, if it has any.
    pub fn device(&self, device: i32) -> Option<&DeviceTrace> {
        self.devices.iter().find(|d| d.device == device)
    }

    /// All events of all devices (device by device).
    pub fn events(&self) -> impl Iterator<Item = &TraceEvent> {
        self.devices.iter().flat_map(|d| d.events.iter())
    }

    /// Number of events on all devices.
    pub fn num_events(&self) -> usize {
        self.devices.iter().map(|d| d.events.len()).sum()
    }

    /// Number of events with `action`, over all devices.
    pub fn count(&self, action: Action) -> usize {
        self.events().filter(|e| e.action == action).count()
    }

    /// Number of events with `action` on `device`.
    pub fn count_on(&self, device: i32, action: Action) -> usize {
        self.device(device)
            .map_or(0, |d| d.events.iter().filter(|e| e.action == action).count())
    }

    /// The stack `id` refers to (None for `None` or an out-of-range id).
    pub fn stack(&self, id: Option<StackId>) -> Option<&Stack> {
        id.and_then(|i| self.stacks.get(i as usize))
    }

    /// Peak of the reserved memory implied by the segment events of `device`,
    /// and the number of segments obtained from CUDA.
    ///
    /// Returns `(peak, allocs)`: `peak` is the maximum of the running sum of
    /// `segment_alloc`/`segment_map` sizes (+) and `segment_free`/
    /// `segment_unmap` sizes (−), starting at 0 (segments that existed before
    /// recording started are not known, so the sum can go below 0 when they
    /// are freed; the peak is never below 0); `allocs` counts
    /// `segment_alloc` + `segment_map` events.
    pub fn segment_history_peak(&self, device: i32) -> (u64, u64) {
        let Some(d) = self.device(device) else {
            return (0, 0);
        };
        let mut cur: i128 = 0;
        let mut peak: i128 = 0;
        let mut allocs = 0u64;
        for e in &d.events {
            match e.action {
                Action::SegmentAlloc | Action::SegmentMap => {
                    cur += e.size as i128;
                    allocs += 1;
                }
                Action::SegmentFree | Action::SegmentUnmap => cur -= e.size as i128,
                _ => {}
            }
            peak = peak.max(cur);
        }
        (peak.min(u64::MAX as i128) as u64, allocs)
    }

    /// Addresses of the `segment_alloc` events of `device`, in trace order.
    pub fn segment_alloc_addresses(&self, device: i32) -> Vec<u64> {
        self.device(device).map_or_else(Vec::new, |d| {
            d.events
                .iter()
                .filter(|e| e.action == Action::SegmentAlloc)
                .map(|e| e.addr)
                .collect()
        })
    }

    /// Distinct streams used by the events of `device`, sorted.
    pub fn streams(&self, device: i32) -> Vec<u64> {
        let mut s: Vec<u64> = self
            .device(device)
            .map_or_else(Vec::new, |d| d.events.iter().map(|e| e.stream).collect());
        s.sort_unstable();
        s.dedup();
        s
    }

    /// Counts and ranges, for printing.
    pub fn summary(&self) -> TraceSummary {
        let mut counts = [0u64; Action::ALL.len()];
        let mut streams = Vec::new();
        let mut range: Option<(i64, i64)> = None;
        for e in self.events() {
            counts[e.action.code() as usize] += 1;
            streams.push(e.stream);
            range = Some(match range {
                None => (e.time_us, e.time_us),
                Some((a, b)) => (a.min(e.time_us), b.max(e.time_us)),
            });
        }
        streams.sort_unstable();
        streams.dedup();
        TraceSummary {
            source: self.source.clone(),
            devices: self.devices.iter().map(|d| d.device).collect(),
            events: counts.iter().sum(),
            by_action: Action::ALL
                .iter()
                .zip(counts)
                .filter(|(_, n)| *n > 0)
                .map(|(a, n)| (*a, n))
                .collect(),
            streams,
            stacks: self.stacks.len(),
            segments: self.segments.len(),
            blocks: self.segments.iter().map(|s| s.blocks.len()).sum(),
            time_range_us: range,
        }
    }

    /// The error for a device ordinal outside `0..=MAX_DEVICE_ORDINAL`.
    fn ordinal_error(&self, at: String, device: i32) -> TraceError {
        TraceError::new(
            &self.source,
            ErrorKind::Invalid,
            Location::Entry(at),
            format!("device ordinal {device} is outside 0..={MAX_DEVICE_ORDINAL}"),
        )
    }

    /// Checks the invariants every reader guarantees: stack ids in range, devices sorted and
    /// unique, device ordinals within `0..=MAX_DEVICE_ORDINAL`. Writers call it before writing.
    pub fn validate(&self) -> Result<(), TraceError> {
        let n = self.stacks.len();
        let bad = |what: String| {
            TraceError::new(
                &self.source,
                ErrorKind::Invalid,
                Location::Entry(what),
                "stack id out of range",
            )
        };
        let ok = |s: Option<StackId>| !matches!(s, Some(i) if i as usize >= n);
        for (di, d) in self.devices.iter().enumerate() {
            if di > 0 && self.devices[di - 1].device >= d.device {
                return Err(TraceError::new(
                    &self.source,
                    ErrorKind::Invalid,
                    Location::Entry(format!("devices[{di}]")),
                    "devices must be sorted by device ordinal without repeats",
                ));
            }
            if d.device < 0 {
                return Err(TraceError::new(
                    &self.source,
                    ErrorKind::Invalid,
                    Location::Entry(format!("devices[{di}]")),
                    "negative device ordinal",
                ));
            }
            if d.device > MAX_DEVICE_ORDINAL {
                return Err(self.ordinal_error(format!("devices[{di}]"), d.device));
            }
            for (i, e) in d.events.iter().enumerate() {
                if !ok(e.stack) {
                    return Err(bad(format!("devices[{di}].events[{i}]")));
                }
            }
        }
        for (si, s) in self.segments.iter().enumerate() {
            if !ok(s.stack) {
                return Err(bad(format!("segments[{si}]")));
            }
            if !(0..=MAX_DEVICE_ORDINAL).contains(&s.device) {
                return Err(self.ordinal_error(format!("segments[{si}]"), s.device));
            }
            for (bi, b) in s.blocks.iter().enumerate() {
                if !ok(b.stack) {
                    return Err(bad(format!("segments[{si}].blocks[{bi}]")));
                }
            }
        }
        for (ai, a) in self.annotations.iter().enumerate() {
            if !(0..=MAX_DEVICE_ORDINAL).contains(&a.device) {
                return Err(self.ordinal_error(format!("external_annotations[{ai}]"), a.device));
            }
        }
        Ok(())
    }
}

/// What went wrong, broadly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The file could not be read.
    Io,
    /// The content matches none of the known formats.
    UnknownFormat,
    /// gzip decoding failed.
    Gzip,
    /// The pickle stream is malformed (the decoder's message is kept).
    Pickle,
    /// The pickle decoded but does not have the snapshot's shape or types.
    Schema,
    /// A line of an RMM CSV log is malformed.
    Csv,
    /// The compact file is malformed (bad magic, version, checksum, record).
    Compact,
    /// The input ends early (compact format: offset and expected length).
    Truncated,
    /// The input is larger or deeper than the reader accepts.
    TooLarge,
    /// A trace handed to a writer breaks the model's invariants.
    Invalid,
}

/// Where in the input an error is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// No particular place (or the place is part of the message).
    Whole,
    /// 1-based line number (CSV).
    Line(usize),
    /// Path of the entry, e.g. `device_traces[0][1234]` (pickle).
    Entry(String),
    /// Byte offset (compact format, pickle stream).
    Byte(u64),
}

/// An error of a reader or writer. `Display` names the file and the place:
/// `trace.csv:17: …`, `x.pickle: device_traces[0][1234]: field 'size' is a
/// str, expected int`, `x.cmt: truncated at byte 1234 of 5678`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceError {
    /// The file (or source name) being read.
    pub source: String,
    /// Broad category.
    pub kind: ErrorKind,
    /// Where.
    pub location: Location,
    /// What.
    pub message: String,
}

impl TraceError {
    /// Build an error.
    pub fn new(source: &str, kind: ErrorKind, location: Location, message: impl Into<String>) -> TraceError {
        TraceError {
            source: source.to_string(),
            kind,
            location,
            message: message.into(),
        }
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Location::Whole => write!(f, "{}: {}", self.source, self.message),
            Location::Line(n) => write!(f, "{}:{}: {}", self.source, n, self.message),
            Location::Entry(p) => write!(f, "{}: {}: {}", self.source, p, self.message),
            Location::Byte(_) if self.kind == ErrorKind::Truncated => {
                write!(f, "{}: {}", self.source, self.message)
            }
            Location::Byte(o) => write!(f, "{}: at byte {}: {}", self.source, o, self.message),
        }
    }
}

impl std::error::Error for TraceError {}

/// The formats [`detect_format`] recognizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// gzip-compressed (of any of the others).
    Gzip,
    /// Python pickle (PyTorch snapshot).
    Pickle,
    /// cudamem compact format.
    Compact,
    /// RMM logging_resource_adaptor CSV.
    RmmCsv,
}

/// Recognize a format from the first bytes of the content.
pub fn detect_format(bytes: &[u8]) -> Option<Format> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return Some(Format::Gzip);
    }
    if bytes.starts_with(compact::MAGIC) {
        return Some(Format::Compact);
    }
    if bytes.first() == Some(&0x80) {
        return Some(Format::Pickle);
    }
    let text = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let first = text
        .iter()
        .position(|&c| !c.is_ascii_whitespace())
        .map_or(&[][..], |p| &text[p..]);
    if first.starts_with(b"Thread,") {
        return Some(Format::RmmCsv);
    }
    // Protocol 0/1 pickles have no PROTO opcode; a snapshot dict or segment
    // list starts with one of these.
    if matches!(bytes.first(), Some(b'}' | b']' | b'(')) {
        return Some(Format::Pickle);
    }
    None
}

/// Most bytes a gzip'd input may expand to (4 GiB): a guard against gzip
/// bombs. Real snapshots are far smaller.
pub const MAX_DECOMPRESSED: u64 = 4 << 30;

/// Gunzip `bytes` (all members), refusing to expand past [`MAX_DECOMPRESSED`].
pub fn gunzip(bytes: &[u8], source: &str) -> Result<Vec<u8>, TraceError> {
    let mut out = Vec::with_capacity(bytes.len().saturating_mul(4).min(256 << 20));
    let dec = flate2::read::MultiGzDecoder::new(bytes);
    dec.take(MAX_DECOMPRESSED + 1).read_to_end(&mut out).map_err(|e| {
        TraceError::new(
            source,
            ErrorKind::Gzip,
            Location::Whole,
            format!("gzip decode error: {e}"),
        )
    })?;
    if out.len() as u64 > MAX_DECOMPRESSED {
        return Err(TraceError::new(
            source,
            ErrorKind::TooLarge,
            Location::Whole,
            format!("gzip content expands past {MAX_DECOMPRESSED} bytes"),
        ));
    }
    Ok(out)
}

/// Read a trace from `bytes`, choosing the format by content (see the crate
/// docs). `source` names the input in errors and in [`Trace::source`].
pub fn read_bytes(bytes: &[u8], source: &str) -> Result<Trace, TraceError> {
    match detect_format(bytes) {
        Some(Format::Gzip) => {
            let inner = gunzip(bytes, source)?;
            match detect_format(&inner) {
                Some(Format::Gzip) => Err(TraceError::new(
                    source,
                    ErrorKind::UnknownFormat,
                    Location::Whole,
                    "gzip inside gzip is not a trace format",
                )),
                Some(_) => read_bytes(&inner, source),
                None => Err(unknown(source, &inner, "gzip content")),
            }
        }
        Some(Format::Pickle) => read_pickle(bytes, source),
        Some(Format::Compact) => read_compact(bytes, source),
        Some(Format::RmmCsv) => match std::str::from_utf8(bytes) {
            Ok(text) => read_rmm_csv(text, source),
            Err(e) => {
                let line = bytes[..e.valid_up_to()].iter().filter(|&&c| c == b'\n').count() + 1;
                Err(TraceError::new(
                    source,
                    ErrorKind::Csv,
                    Location::Line(line),
                    "line is not valid UTF-8",
                ))
            }
        },
        None => Err(unknown(source, bytes, "content")),
    }
}

fn unknown(source: &str, bytes: &[u8], what: &str) -> TraceError {
    let head: String = bytes
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    TraceError::new(
        source,
        ErrorKind::UnknownFormat,
        Location::Whole,
        format!(
            "{what} is not a known trace format (first bytes: {head}); expected gzip, a pickle, \
             a CUDAMEMT file or an RMM CSV log starting with 'Thread,'"
        ),
    )
}

/// Read a trace file, choosing the format by content. [`Trace::source`] is
/// the file name (without directories).
pub fn read_path(path: &Path) -> Result<Trace, TraceError> {
    let source = path
        .file_name()
        .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let bytes = std::fs::read(path).map_err(|e| {
        TraceError::new(
            &source,
            ErrorKind::Io,
            Location::Whole,
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    read_bytes(&bytes, &source)
}

/// A fast, non-cryptographic hasher (FxHash's multiply-rotate) for the
/// readers' internal tables, whose keys come from the input being read.
#[derive(Clone, Copy, Default)]
pub(crate) struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]));
        }
        for &b in chunks.remainder() {
            self.write_u64(b as u64);
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64);
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub(crate) type FastHash = std::hash::BuildHasherDefault<FastHasher>;

/// Interns frames and stacks while a reader builds a [`Trace`]. Keys borrow
/// from the decoded input, so interning costs no allocation per repeat.
pub(crate) struct StackInterner<'a> {
    /// Frames by the identity of their strings: a pickle's memo shares equal strings, so this
    /// hit avoids hashing their bytes (the content map below is the fallback).
    by_ptr: HashMap<(usize, usize, i64), u32, FastHash>,
    /// Stacks by the identity of the frames list (shared lists are decoded once).
    by_list: HashMap<usize, Option<StackId>, FastHash>,
    frames: HashMap<(&'a str, &'a str, i64), u32, FastHash>,
    frame_list: Vec<(&'a str, &'a str, i64)>,
    stacks: HashMap<Vec<u32>, StackId, FastHash>,
    stack_list: Vec<Vec<u32>>,
    scratch: Vec<u32>,
}

impl<'a> StackInterner<'a> {
    pub(crate) fn new() -> Self {
        StackInterner {
            by_ptr: HashMap::default(),
            by_list: HashMap::default(),
            frames: HashMap::default(),
            frame_list: Vec::new(),
            stacks: HashMap::default(),
            stack_list: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Start a new stack.
    pub(crate) fn begin(&mut self) {
        self.scratch.clear();
    }

    /// Add a frame to the stack being built.
    pub(crate) fn push(&mut self, name: &'a str, filename: &'a str, line: i64) {
        let pk = (
            name.as_ptr() as usize ^ name.len() << 48,
            filename.as_ptr() as usize ^ filename.len() << 48,
            line,
        );
        if let Some(&id) = self.by_ptr.get(&pk) {
            self.scratch.push(id);
            return;
        }
        let next = self.frame_list.len() as u32;
        let id = *self.frames.entry((name, filename, line)).or_insert(next);
        if id == next {
            self.frame_list.push((name, filename, line));
        }
        self.by_ptr.insert(pk, id);
        self.scratch.push(id);
    }

    /// The stack already interned for the frames list at `list` (by identity), if any.
    pub(crate) fn cached_list(&self, list: usize) -> Option<Option<StackId>> {
        self.by_list.get(&list).copied()
    }

    /// Remembers the stack of the frames list at `list`.
    pub(crate) fn cache_list(&mut self, list: usize, id: Option<StackId>) {
        self.by_list.insert(list, id);
    }

    /// Finish the stack; an empty one is `None`.
    pub(crate) fn finish(&mut self) -> Option<StackId> {
        if self.scratch.is_empty() {
            return None;
        }
        if let Some(&id) = self.stacks.get(self.scratch.as_slice()) {
            return Some(id);
        }
        let id = self.stack_list.len() as StackId;
        self.stacks.insert(self.scratch.clone(), id);
        self.stack_list.push(self.scratch.clone());
        Some(id)
    }

    pub(crate) fn into_stacks(self) -> Vec<Stack> {
        let frames: Vec<Frame> = self
            .frame_list
            .iter()
            .map(|&(n, f, l)| Frame {
                name: n.to_string(),
                filename: f.to_string(),
                line: l,
            })
            .collect();
        self.stack_list
            .into_iter()
            .map(|ids| Stack {
                frames: ids.into_iter().map(|i| frames[i as usize].clone()).collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(action: Action, addr: u64, size: u64) -> TraceEvent {
        TraceEvent {
            action,
            addr,
            size,
            stream: 0,
            time_us: 0,
            stack: None,
        }
    }

    #[test]
    fn action_names_and_codes_round_trip() {
        for a in Action::ALL {
            assert_eq!(Action::from_name(a.as_str()), Some(a));
            assert_eq!(Action::from_code(a.code()), Some(a));
        }
        assert_eq!(Action::from_name("free"), None);
        assert_eq!(Action::from_code(10), None);
    }

    #[test]
    fn segment_history_peak_counts_maps_and_frees() {
        let mut t = Trace::new("t");
        t.devices.push(DeviceTrace {
            device: 1,
            events: vec![
                ev(Action::SegmentAlloc, 0x1000, 100),
                ev(Action::Alloc, 0x1000, 10),
                ev(Action::SegmentMap, 0x2000, 50),
                ev(Action::SegmentUnmap, 0x2000, 50),
                ev(Action::SegmentFree, 0x1000, 100),
                ev(Action::SegmentAlloc, 0x3000, 120),
            ],
        });
        assert_eq!(t.segment_history_peak(1), (150, 3));
        assert_eq!(t.segment_history_peak(0), (0, 0));
        assert_eq!(t.segment_alloc_addresses(1), vec![0x1000, 0x3000]);
        assert_eq!(t.count(Action::SegmentAlloc), 2);
        assert_eq!(t.count_on(1, Action::Alloc), 1);
        let s = t.summary();
        assert_eq!(s.events, 6);
        assert_eq!(s.devices, vec![1]);
        assert!(s.to_string().contains("segment_alloc"));
    }

    #[test]
    fn peak_never_negative_when_trace_starts_late() {
        let mut t = Trace::new("t");
        t.devices.push(DeviceTrace {
            device: 0,
            events: vec![ev(Action::SegmentFree, 1, 10)],
        });
        assert_eq!(t.segment_history_peak(0), (0, 0));
    }

    #[test]
    fn detects_formats_by_content() {
        assert_eq!(detect_format(&[0x1f, 0x8b, 8]), Some(Format::Gzip));
        assert_eq!(detect_format(&[0x80, 4]), Some(Format::Pickle));
        assert_eq!(detect_format(b"CUDAMEMT\x01"), Some(Format::Compact));
        assert_eq!(detect_format(b"Thread,Time,Action"), Some(Format::RmmCsv));
        assert_eq!(detect_format(b"\xef\xbb\xbfThread,Time"), Some(Format::RmmCsv));
        assert_eq!(detect_format(b"hello"), None);
        assert_eq!(detect_format(b""), None);
        let e = read_bytes(b"hello", "x.bin").unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownFormat);
        assert!(e.to_string().starts_with("x.bin: "), "{e}");
    }

    #[test]
    fn interner_dedups() {
        let mut i = StackInterner::new();
        i.begin();
        i.push("f", "a.py", 1);
        i.push("g", "a.py", 2);
        let a = i.finish();
        i.begin();
        i.push("f", "a.py", 1);
        i.push("g", "a.py", 2);
        let b = i.finish();
        i.begin();
        let c = i.finish();
        assert_eq!(a, Some(0));
        assert_eq!(b, Some(0));
        assert_eq!(c, None);
        let stacks = i.into_stacks();
        assert_eq!(stacks.len(), 1);
        assert_eq!(stacks[0].frames[1].line, 2);
    }
}
