//! PyTorch memory snapshots: the pickles written by
//! `torch.cuda.memory._dump_snapshot()` (plain or gzip'd).
//!
//! # Format
//!
//! A pickle (protocol 4 from current PyTorch; any protocol is accepted) of
//! plain Python values only — dicts, lists, tuples, str, int, float, bool and
//! None. The top level is a dict:
//!
//! * `segments`: list of segment dicts (`device`, `address`, `total_size`,
//!   `allocated_size`, `active_size`, `requested_size`, `stream`,
//!   `segment_type` "large"/"small", `segment_pool_id` (2-tuple),
//!   `is_expandable`, `frames`, `blocks`: list of {`address`, `size`,
//!   `requested_size`, `state`, `frames`}) — the allocator's state when the
//!   snapshot was taken; cudamem adds `tag` (str) and `asleep` (bool) to the
//!   segments of a tag, keys PyTorch's readers ignore;
//! * `device_traces`: one list per device of trace entries {`action`, `addr`,
//!   `size`, `stream`, `time_us`, `frames`?, `compile_context`?,
//!   `user_metadata`?}; an `oom` entry carries `device_free` instead of
//!   `addr`;
//! * `allocator_settings`: `PYTORCH_CUDA_ALLOC_CONF`, `max_split_size`, …,
//!   `roundup_power2_divisions` ({"1": n, "2": n, … "32768": n});
//! * `external_annotations`: list of {`stage`, `name`, `device`, `time_us`}.
//!
//! Frames are lists of {`name`, `filename`, `line`}.
//!
//! A top-level *list* is read as a bare `segments` list, as
//! `torch.cuda._memory_viz` does.
//!
//! # What the reader guarantees
//!
//! * Any key may be missing (other PyTorch versions): optional keys take
//!   defaults (stream 0, time 0, no frames, `segment_type` large, pool (0,0),
//!   settings defaults, block addresses computed from the segment address and
//!   the sizes of the blocks before, segment sizes summed from the blocks).
//!   Keys that an event cannot do without (`action`; `addr` and `size` except
//!   for `oom`/`snapshot`/`annotate`; a block's `size` and `state`) are
//!   required. Unknown keys are ignored.
//! * A present key of the wrong type is an error naming the entry, e.g.
//!   `device_traces[0][1234]: field 'size' is a str, expected int`. So is an
//!   unknown `action`, `state` or `segment_type` string, and a negative
//!   address or size.
//! * `oom` entries keep `device_free` in [`TraceEvent::addr`].
//! * Frames are interned into [`Trace::stacks`]; empty frame lists read as
//!   `None`.
//! * The pickle is decoded by this crate's own decoder (module `pickle_vm`;
//!   `serde-pickle`'s copies memoized objects, so it is slow on real traces
//!   and unsafe on hostile ones): it shares memoized objects as Python does instead of copying
//!   them, never recurses (the schema walk has a fixed depth, so deep
//!   nesting and cycles are harmless), uses memory linear in the input, and
//!   rejects classes and globals. Decode errors carry the byte offset.
//!
//! # Writer
//!
//! [`write_snapshot_pickle`] writes the same schema back with `serde-pickle`
//! (protocol 3, which Python ≥ 3.0 reads), so that
//! `python -m torch.cuda._memory_viz` and the MemoryViz web page open it.
//! Each event gets `compile_context: 'N/A'` and `user_metadata: ''` as
//! current PyTorch writes them; `frames` is written for events that have a
//! stack, and always (possibly empty) for segments and blocks; one
//! `device_traces` list is written for each device ordinal up to the largest
//! one used. Reading the output back gives a trace equal to the input.
//!
//! `serde-pickle` does not memoize, so repeated strings and frames are
//! written out in full each time: the 21.7 MB `bert_varlen_infer` snapshot
//! (frames on every event) comes back as 124 MB of pickle (it gzips well).

use std::io::Write;

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_pickle::SerOptions;

use crate::pickle_vm::{self, Arena, Kind, Val};
use crate::{
    Action, AllocatorSettings, Annotation, BlockSnapshot, BlockState, DeviceTrace, ErrorKind, Location,
    SegmentSnapshot, SegmentType, StackId, StackInterner, Trace, TraceError, TraceEvent,
};

mod read;
mod write;

pub use read::read_pickle;
pub use write::{snapshot_schema, write_snapshot_pickle, STACK_TAG};

#[cfg(test)]
mod tests;
