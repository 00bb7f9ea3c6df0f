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
//!   `serde-pickle`'s is ~10x slower on real traces and unsafe on hostile
//!   ones): it shares memoized objects as Python does instead of copying
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
    SegmentSnapshot, SegmentType, Stack, StackId, StackInterner, Trace, TraceError, TraceEvent,
};

/// Read a PyTorch snapshot pickle. `bytes` may also be gzip'd (detected by
/// magic bytes). `source` names the input in errors and in [`Trace::source`].
pub fn read_pickle(bytes: &[u8], source: &str) -> Result<Trace, TraceError> {
    let trace = if bytes.starts_with(&[0x1f, 0x8b]) {
        let inner = crate::gunzip(bytes, source)?;
        read_plain_pickle(&inner, source)?
    } else {
        read_plain_pickle(bytes, source)?
    };
    // Bounds a hostile file could break (device ordinals, stack ids) are checked here too.
    trace.validate()?;
    Ok(trace)
}

fn read_plain_pickle(bytes: &[u8], source: &str) -> Result<Trace, TraceError> {
    let (arena, root) = pickle_vm::decode(bytes).map_err(|e| {
        TraceError::new(
            source,
            ErrorKind::Pickle,
            Location::Byte(e.offset),
            format!("pickle decode error: {}", e.message),
        )
    })?;
    let rd = Rd { ar: &arena };
    rd.convert(&root, source).map_err(|e| {
        let loc = if e.path.is_empty() {
            Location::Whole
        } else {
            Location::Entry(e.path)
        };
        TraceError::new(source, ErrorKind::Schema, loc, e.msg)
    })
}

// ---------------------------------------------------------------------------
// decoded pickle → model

/// A schema error: the path of the entry (built from the inside out) and the
/// message.
struct SErr {
    path: String,
    msg: String,
}

type SR<T> = Result<T, SErr>;

fn serr<T>(msg: impl Into<String>) -> SR<T> {
    Err(SErr {
        path: String::new(),
        msg: msg.into(),
    })
}

trait At<T> {
    /// Prefix the error's path with `seg` (e.g. `[3]`, `.frames`, `segments`).
    fn at(self, seg: impl FnOnce() -> String) -> SR<T>;
}

impl<T> At<T> for SR<T> {
    fn at(self, seg: impl FnOnce() -> String) -> SR<T> {
        self.map_err(|mut e| {
            let s = seg();
            if e.path.is_empty() {
                e.path = s;
            } else if e.path.starts_with('[') || e.path.starts_with('.') {
                e.path = s + &e.path;
            } else {
                e.path = s + "." + &e.path;
            }
            e
        })
    }
}

/// Walks the decoded pickle along the snapshot schema. Depth is fixed by the
/// schema, so hostile nesting or cycles cannot make it recurse.
struct Rd<'x, 'a> {
    ar: &'x Arena<'a>,
}

/// A dict's items: keys and values alternate.
type Items<'x, 'a> = &'x [Val<'a>];

impl<'x, 'a> Rd<'x, 'a> {
    fn wrong<T>(&self, field: &str, v: &Val<'a>, expected: &str) -> SR<T> {
        serr(format!(
            "field '{field}' is a {}, expected {expected}",
            self.ar.type_name(v)
        ))
    }

    /// Field lookup; the last of repeated keys wins, as in Python.
    fn get(&self, d: Items<'x, 'a>, key: &str) -> Option<&'x Val<'a>> {
        d.chunks_exact(2)
            .rev()
            .find(|kv| self.ar.str(&kv[0]) == Some(key))
            .map(|kv| &kv[1])
    }

    /// Optional field: missing or None → None.
    fn opt(&self, d: Items<'x, 'a>, key: &str) -> Option<&'x Val<'a>> {
        match self.get(d, key) {
            None | Some(Val::None) => None,
            some => some,
        }
    }

    fn req(&self, d: Items<'x, 'a>, key: &str) -> SR<&'x Val<'a>> {
        match self.opt(d, key) {
            Some(v) => Ok(v),
            None => serr(format!("missing field '{key}'")),
        }
    }

    fn as_dict(&self, v: &Val<'a>, what: &str) -> SR<Items<'x, 'a>> {
        match self.ar.obj(v) {
            Some(o) if o.kind == Kind::Dict => Ok(&o.items),
            _ => serr(format!("{what} is a {}, expected dict", self.ar.type_name(v))),
        }
    }

    fn as_seq(&self, v: &Val<'a>, field: &str) -> SR<&'x [Val<'a>]> {
        match self.ar.obj(v) {
            Some(o) if matches!(o.kind, Kind::List | Kind::Tuple) => Ok(&o.items),
            _ => self.wrong(field, v, "list"),
        }
    }

    fn as_i64(&self, v: &Val<'a>, field: &str) -> SR<i64> {
        match *v {
            Val::Int(n) => Ok(n),
            Val::Wide(_) | Val::Huge => serr(format!("field '{field}' does not fit in a 64-bit signed int")),
            _ => self.wrong(field, v, "int"),
        }
    }

    fn as_u64(&self, v: &Val<'a>, field: &str) -> SR<u64> {
        match *v {
            Val::Int(n) if n >= 0 => Ok(n as u64),
            Val::Int(n) => serr(format!(
                "field '{field}' is negative ({n}), expected a non-negative int"
            )),
            Val::Wide(_) => match self.ar.int(v).map(u64::try_from) {
                Some(Ok(n)) => Ok(n),
                _ => serr(format!("field '{field}' does not fit in a 64-bit unsigned int")),
            },
            Val::Huge => serr(format!("field '{field}' does not fit in a 64-bit unsigned int")),
            _ => self.wrong(field, v, "int"),
        }
    }

    fn as_i32(&self, v: &Val<'a>, field: &str) -> SR<i32> {
        let n = self.as_i64(v, field)?;
        i32::try_from(n).or_else(|_| serr(format!("field '{field}' = {n} is out of range")))
    }

    fn as_f64(&self, v: &Val<'a>, field: &str) -> SR<f64> {
        match *v {
            Val::Float(x) => Ok(x),
            Val::Int(n) => Ok(n as f64),
            _ => self.wrong(field, v, "float"),
        }
    }

    fn as_bool(&self, v: &Val<'a>, field: &str) -> SR<bool> {
        match *v {
            Val::Bool(b) => Ok(b),
            _ => self.wrong(field, v, "bool"),
        }
    }

    fn as_str(&self, v: &Val<'a>, field: &str) -> SR<&'x str> {
        match self.ar.str(v) {
            Some(s) => Ok(s),
            None => self.wrong(field, v, "str"),
        }
    }

    fn convert(&self, root: &Val<'a>, source: &str) -> SR<Trace> {
        let mut interner = StackInterner::new();
        let mut trace = Trace::new(source);
        let top = match self.ar.obj(root).map(|o| o.kind) {
            Some(Kind::Dict) => self.as_dict(root, "snapshot")?,
            Some(Kind::List) => {
                // A bare segment list (what _memory_viz accepts too).
                trace.segments = self.segments(root, &mut interner).at(|| "segments".into())?;
                trace.stacks = interner.into_stacks();
                return Ok(trace);
            }
            _ => return serr(format!("snapshot is a {}, expected dict", self.ar.type_name(root))),
        };
        if let Some(v) = self.opt(top, "segments") {
            trace.segments = self.segments(v, &mut interner).at(|| "segments".into())?;
        }
        if let Some(v) = self.opt(top, "device_traces") {
            for (d, dev) in self.as_seq(v, "device_traces")?.iter().enumerate() {
                let entries = self.as_seq(dev, "device_traces").at(|| format!("device_traces[{d}]"))?;
                if entries.is_empty() {
                    continue;
                }
                let mut events = Vec::with_capacity(entries.len());
                for (i, e) in entries.iter().enumerate() {
                    events.push(self.event(e, &mut interner).at(|| format!("device_traces[{d}][{i}]"))?);
                }
                let device = i32::try_from(d).or_else(|_| serr("too many devices").at(|| "device_traces".into()))?;
                trace.devices.push(DeviceTrace { device, events });
            }
        }
        if let Some(v) = self.opt(top, "allocator_settings") {
            trace.settings = self.settings(v).at(|| "allocator_settings".into())?;
        }
        if let Some(v) = self.opt(top, "external_annotations") {
            for (i, a) in self.as_seq(v, "external_annotations")?.iter().enumerate() {
                trace
                    .annotations
                    .push(self.annotation(a).at(|| format!("external_annotations[{i}]"))?);
            }
        }
        trace.stacks = interner.into_stacks();
        Ok(trace)
    }

    fn frames(&self, d: Items<'x, 'a>, interner: &mut StackInterner<'x>) -> SR<Option<StackId>> {
        let Some(v) = self.opt(d, "frames") else {
            return Ok(None);
        };
        let list = self.as_seq(v, "frames")?;
        // Python shares one frames list between entries: look it up by identity first.
        let key = list.as_ptr() as usize ^ (list.len() << 48);
        if !list.is_empty() {
            if let Some(id) = interner.cached_list(key) {
                return Ok(id);
            }
        }
        interner.begin();
        for (i, f) in list.iter().enumerate() {
            let frame = || -> SR<(&'x str, &'x str, i64)> {
                let fm = self.as_dict(f, "frame")?;
                let name = self.opt(fm, "name").map_or(Ok(""), |v| self.as_str(v, "name"))?;
                let filename = self
                    .opt(fm, "filename")
                    .map_or(Ok(""), |v| self.as_str(v, "filename"))?;
                let line = self.opt(fm, "line").map_or(Ok(0), |v| self.as_i64(v, "line"))?;
                Ok((name, filename, line))
            };
            match frame() {
                Ok((name, filename, line)) => interner.push(name, filename, line),
                Err(e) => return Err(e).at(|| format!(".frames[{i}]")),
            }
        }
        let id = interner.finish();
        if !list.is_empty() {
            interner.cache_list(key, id);
        }
        Ok(id)
    }

    fn event(&self, v: &Val<'a>, interner: &mut StackInterner<'x>) -> SR<TraceEvent> {
        let d = self.as_dict(v, "entry")?;
        let name = self.as_str(self.req(d, "action")?, "action")?;
        let Some(action) = Action::from_name(name) else {
            return serr(format!("unknown action '{name}'"));
        };
        let optional = matches!(action, Action::Snapshot | Action::Annotate);
        let addr = match action {
            Action::Oom => match (self.opt(d, "device_free"), self.opt(d, "addr")) {
                (Some(v), _) => self.as_u64(v, "device_free")?,
                (None, Some(v)) => self.as_u64(v, "addr")?,
                (None, None) => 0,
            },
            _ if optional => self.opt(d, "addr").map_or(Ok(0), |v| self.as_u64(v, "addr"))?,
            _ => self.as_u64(self.req(d, "addr")?, "addr")?,
        };
        let size = if optional {
            self.opt(d, "size").map_or(Ok(0), |v| self.as_u64(v, "size"))?
        } else {
            self.as_u64(self.req(d, "size")?, "size")?
        };
        let stream = self.opt(d, "stream").map_or(Ok(0), |v| self.as_u64(v, "stream"))?;
        let time_us = self.opt(d, "time_us").map_or(Ok(0), |v| self.as_i64(v, "time_us"))?;
        let stack = self.frames(d, interner)?;
        Ok(TraceEvent {
            action,
            addr,
            size,
            stream,
            time_us,
            stack,
        })
    }

    fn segments(&self, v: &Val<'a>, interner: &mut StackInterner<'x>) -> SR<Vec<SegmentSnapshot>> {
        let list = self.as_seq(v, "segments")?;
        let mut out = Vec::with_capacity(list.len());
        for (i, s) in list.iter().enumerate() {
            out.push(self.segment(s, interner).at(|| format!("[{i}]"))?);
        }
        Ok(out)
    }

    fn segment(&self, v: &Val<'a>, interner: &mut StackInterner<'x>) -> SR<SegmentSnapshot> {
        let d = self.as_dict(v, "segment")?;
        let device = self.opt(d, "device").map_or(Ok(0), |v| self.as_i32(v, "device"))?;
        let address = self.as_u64(self.req(d, "address")?, "address")?;
        let stream = self.opt(d, "stream").map_or(Ok(0), |v| self.as_u64(v, "stream"))?;
        let segment_type = match self.opt(d, "segment_type") {
            None => SegmentType::Large,
            Some(v) => match self.as_str(v, "segment_type")? {
                "large" => SegmentType::Large,
                "small" => SegmentType::Small,
                other => return serr(format!("unknown segment_type '{other}', expected 'large' or 'small'")),
            },
        };
        let pool_id = match self.opt(d, "segment_pool_id") {
            None => (0, 0),
            Some(v) => {
                let t = self.as_seq(v, "segment_pool_id")?;
                if t.len() != 2 {
                    return serr("field 'segment_pool_id' must have 2 items");
                }
                (
                    self.as_i64(&t[0], "segment_pool_id")?,
                    self.as_i64(&t[1], "segment_pool_id")?,
                )
            }
        };
        let is_expandable = self
            .opt(d, "is_expandable")
            .map_or(Ok(false), |v| self.as_bool(v, "is_expandable"))?;
        let tag = match self.opt(d, "tag") {
            Some(v) => Some(self.as_str(v, "tag")?.to_string()),
            None => None,
        };
        let asleep = self.opt(d, "asleep").map_or(Ok(false), |v| self.as_bool(v, "asleep"))?;
        let stack = self.frames(d, interner)?;
        let mut blocks = Vec::new();
        if let Some(bv) = self.opt(d, "blocks") {
            let list = self.as_seq(bv, "blocks")?;
            blocks.reserve(list.len());
            let mut next = address;
            for (i, b) in list.iter().enumerate() {
                let blk = self.block(b, next, interner).at(|| format!(".blocks[{i}]"))?;
                next = blk.address.wrapping_add(blk.size);
                blocks.push(blk);
            }
        }
        let sum = |f: &dyn Fn(&BlockSnapshot) -> Option<u64>| blocks.iter().filter_map(f).fold(0u64, u64::wrapping_add);
        let field = |key: &str, default: &dyn Fn(&BlockSnapshot) -> Option<u64>| match self.opt(d, key) {
            Some(v) => self.as_u64(v, key),
            None => Ok(sum(default)),
        };
        let total_size = field("total_size", &|b| Some(b.size))?;
        let allocated_size = field("allocated_size", &|b| {
            (b.state == BlockState::ActiveAllocated).then_some(b.size)
        })?;
        let active_size = field("active_size", &|b| (b.state != BlockState::Inactive).then_some(b.size))?;
        let requested_size = field("requested_size", &|b| {
            (b.state != BlockState::Inactive).then_some(b.requested_size)
        })?;
        Ok(SegmentSnapshot {
            device,
            address,
            total_size,
            allocated_size,
            active_size,
            requested_size,
            stream,
            segment_type,
            pool_id,
            is_expandable,
            stack,
            blocks,
            tag,
            asleep,
        })
    }

    fn block(&self, v: &Val<'a>, default_address: u64, interner: &mut StackInterner<'x>) -> SR<BlockSnapshot> {
        let d = self.as_dict(v, "block")?;
        let address = self
            .opt(d, "address")
            .map_or(Ok(default_address), |v| self.as_u64(v, "address"))?;
        let size = self.as_u64(self.req(d, "size")?, "size")?;
        let requested_size = self
            .opt(d, "requested_size")
            .map_or(Ok(size), |v| self.as_u64(v, "requested_size"))?;
        let state = match self.as_str(self.req(d, "state")?, "state")? {
            "active_allocated" => BlockState::ActiveAllocated,
            "active_pending_free" => BlockState::ActivePendingFree,
            "inactive" => BlockState::Inactive,
            other => return serr(format!("unknown block state '{other}'")),
        };
        let stack = self.frames(d, interner)?;
        Ok(BlockSnapshot {
            address,
            size,
            requested_size,
            state,
            stack,
        })
    }

    fn settings(&self, v: &Val<'a>) -> SR<AllocatorSettings> {
        let d = self.as_dict(v, "allocator_settings")?;
        let mut s = AllocatorSettings::default();
        if let Some(v) = self.opt(d, "PYTORCH_CUDA_ALLOC_CONF") {
            s.conf = self.as_str(v, "PYTORCH_CUDA_ALLOC_CONF")?.to_string();
        }
        if let Some(v) = self.opt(d, "max_split_size") {
            s.max_split_size = self.as_i64(v, "max_split_size")?;
        }
        if let Some(v) = self.opt(d, "garbage_collection_threshold") {
            s.garbage_collection_threshold = self.as_f64(v, "garbage_collection_threshold")?;
        }
        if let Some(v) = self.opt(d, "expandable_segments") {
            s.expandable_segments = self.as_bool(v, "expandable_segments")?;
        }
        if let Some(v) = self.opt(d, "release_lock_on_cudamalloc") {
            s.release_lock_on_cudamalloc = self.as_bool(v, "release_lock_on_cudamalloc")?;
        }
        if let Some(v) = self.opt(d, "pinned_num_register_threads") {
            s.pinned_num_register_threads = self.as_i64(v, "pinned_num_register_threads")?;
        }
        if let Some(v) = self.opt(d, "pinned_use_cuda_host_register") {
            s.pinned_use_cuda_host_register = self.as_bool(v, "pinned_use_cuda_host_register")?;
        }
        if let Some(v) = self.opt(d, "graph_capture_record_stream_reuse") {
            s.graph_capture_record_stream_reuse = self.as_bool(v, "graph_capture_record_stream_reuse")?;
        }
        if let Some(v) = self.opt(d, "roundup_power2_divisions") {
            let items = match self.ar.obj(v) {
                Some(o) if o.kind == Kind::Dict => &o.items,
                _ => return self.wrong("roundup_power2_divisions", v, "dict"),
            };
            let mut pairs = Vec::with_capacity(items.len() / 2);
            for kv in items.chunks_exact(2) {
                let key = match kv[0] {
                    Val::Int(n) => u64::try_from(n).ok(),
                    ref k => self.ar.str(k).and_then(|s| s.trim().parse::<u64>().ok()),
                };
                let Some(key) = key else {
                    return serr(format!(
                        "roundup_power2_divisions has a key of type {}, expected a number like \"1024\"",
                        self.ar.type_name(&kv[0])
                    ));
                };
                let n = self
                    .as_u64(&kv[1], "roundup_power2_divisions")
                    .at(|| format!("roundup_power2_divisions[{key}]"))?;
                pairs.retain(|&(k, _)| k != key);
                pairs.push((key, n));
            }
            pairs.sort_unstable();
            s.roundup_power2_divisions = pairs;
        }
        Ok(s)
    }

    fn annotation(&self, v: &Val<'a>) -> SR<Annotation> {
        let d = self.as_dict(v, "annotation")?;
        Ok(Annotation {
            device: self.opt(d, "device").map_or(Ok(0), |v| self.as_i32(v, "device"))?,
            stage: self
                .opt(d, "stage")
                .map_or(Ok(""), |v| self.as_str(v, "stage"))?
                .to_string(),
            name: self
                .opt(d, "name")
                .map_or(Ok(""), |v| self.as_str(v, "name"))?
                .to_string(),
            time_us: self.opt(d, "time_us").map_or(Ok(0), |v| self.as_i64(v, "time_us"))?,
        })
    }
}

// ---------------------------------------------------------------------------
// model → pickle

/// Write `trace` as a PyTorch snapshot pickle (see the module docs for the
/// schema). The trace must pass [`Trace::validate`].
pub fn write_snapshot_pickle(trace: &Trace, out: impl Write) -> Result<(), TraceError> {
    trace.validate()?;
    let mut w = std::io::BufWriter::with_capacity(1 << 16, out);
    serde_pickle::to_writer(&mut w, &SnapshotSer(trace), SerOptions::new()).map_err(|e| {
        TraceError::new(
            &trace.source,
            ErrorKind::Io,
            Location::Whole,
            format!("cannot write snapshot pickle: {e}"),
        )
    })?;
    w.flush().map_err(|e| {
        TraceError::new(
            &trace.source,
            ErrorKind::Io,
            Location::Whole,
            format!("cannot write snapshot pickle: {e}"),
        )
    })
}

struct SnapshotSer<'a>(&'a Trace);
struct SegmentsSer<'a>(&'a Trace);
struct SegmentSer<'a>(&'a Trace, &'a SegmentSnapshot);
struct BlockSer<'a>(&'a Trace, &'a BlockSnapshot);
struct FramesSer<'a>(Option<&'a Stack>);
struct FrameSer<'a>(&'a crate::Frame);
struct DeviceTracesSer<'a>(&'a Trace);
struct EventsSer<'a>(&'a Trace, Option<&'a DeviceTrace>);
struct EventSer<'a>(&'a Trace, &'a TraceEvent);
struct SettingsSer<'a>(&'a AllocatorSettings);
struct DivisionsSer<'a>(&'a [(u64, u64)]);
struct AnnotationsSer<'a>(&'a [Annotation]);
struct AnnotationSer<'a>(&'a Annotation);

impl Serialize for SnapshotSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("segments", &SegmentsSer(self.0))?;
        m.serialize_entry("device_traces", &DeviceTracesSer(self.0))?;
        m.serialize_entry("allocator_settings", &SettingsSer(&self.0.settings))?;
        m.serialize_entry("external_annotations", &AnnotationsSer(&self.0.annotations))?;
        m.end()
    }
}

impl Serialize for SegmentsSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut q = s.serialize_seq(Some(self.0.segments.len()))?;
        for seg in &self.0.segments {
            q.serialize_element(&SegmentSer(self.0, seg))?;
        }
        q.end()
    }
}

impl Serialize for SegmentSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (t, g) = (self.0, self.1);
        let mut m = s.serialize_map(Some(12))?;
        m.serialize_entry("device", &g.device)?;
        m.serialize_entry("address", &g.address)?;
        m.serialize_entry("total_size", &g.total_size)?;
        m.serialize_entry("allocated_size", &g.allocated_size)?;
        m.serialize_entry("active_size", &g.active_size)?;
        m.serialize_entry("requested_size", &g.requested_size)?;
        m.serialize_entry("stream", &g.stream)?;
        m.serialize_entry("segment_type", g.segment_type.as_str())?;
        m.serialize_entry("segment_pool_id", &g.pool_id)?;
        m.serialize_entry("is_expandable", &g.is_expandable)?;
        // cudamem's keys, only on the segments they describe: PyTorch's snapshots stay as they were.
        if let Some(tag) = &g.tag {
            m.serialize_entry("tag", tag)?;
        }
        if g.tag.is_some() || g.asleep {
            m.serialize_entry("asleep", &g.asleep)?;
        }
        m.serialize_entry("frames", &FramesSer(t.stack(g.stack)))?;
        struct Blocks<'a>(&'a Trace, &'a [BlockSnapshot]);
        impl Serialize for Blocks<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut q = s.serialize_seq(Some(self.1.len()))?;
                for b in self.1 {
                    q.serialize_element(&BlockSer(self.0, b))?;
                }
                q.end()
            }
        }
        m.serialize_entry("blocks", &Blocks(t, &g.blocks))?;
        m.end()
    }
}

impl Serialize for BlockSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let b = self.1;
        let mut m = s.serialize_map(Some(5))?;
        m.serialize_entry("address", &b.address)?;
        m.serialize_entry("size", &b.size)?;
        m.serialize_entry("requested_size", &b.requested_size)?;
        m.serialize_entry("state", b.state.as_str())?;
        m.serialize_entry("frames", &FramesSer(self.0.stack(b.stack)))?;
        m.end()
    }
}

impl Serialize for FramesSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let frames = self.0.map_or(&[][..], |st| &st.frames[..]);
        let mut q = s.serialize_seq(Some(frames.len()))?;
        for f in frames {
            q.serialize_element(&FrameSer(f))?;
        }
        q.end()
    }
}

impl Serialize for FrameSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("name", &self.0.name)?;
        m.serialize_entry("filename", &self.0.filename)?;
        m.serialize_entry("line", &self.0.line)?;
        m.end()
    }
}

impl Serialize for DeviceTracesSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let t = self.0;
        let max_dev = t
            .devices
            .iter()
            .map(|d| d.device)
            .chain(t.segments.iter().map(|g| g.device))
            .filter(|&d| d >= 0)
            .max();
        let n = max_dev.map_or(0, |d| d as usize + 1);
        let mut q = s.serialize_seq(Some(n))?;
        for dev in 0..n {
            q.serialize_element(&EventsSer(t, t.device(dev as i32)))?;
        }
        q.end()
    }
}

impl Serialize for EventsSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let events = self.1.map_or(&[][..], |d| &d.events[..]);
        let mut q = s.serialize_seq(Some(events.len()))?;
        for e in events {
            q.serialize_element(&EventSer(self.0, e))?;
        }
        q.end()
    }
}

impl Serialize for EventSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let e = self.1;
        let stack = self.0.stack(e.stack);
        let mut m = s.serialize_map(Some(if stack.is_some() { 8 } else { 7 }))?;
        m.serialize_entry("action", e.action.as_str())?;
        if e.action == Action::Oom {
            m.serialize_entry("device_free", &e.addr)?;
        } else {
            m.serialize_entry("addr", &e.addr)?;
        }
        m.serialize_entry("size", &e.size)?;
        m.serialize_entry("stream", &e.stream)?;
        m.serialize_entry("time_us", &e.time_us)?;
        if stack.is_some() {
            m.serialize_entry("frames", &FramesSer(stack))?;
        }
        m.serialize_entry("compile_context", "N/A")?;
        m.serialize_entry("user_metadata", "")?;
        m.end()
    }
}

impl Serialize for SettingsSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let a = self.0;
        let mut m = s.serialize_map(Some(9))?;
        m.serialize_entry("PYTORCH_CUDA_ALLOC_CONF", &a.conf)?;
        m.serialize_entry("max_split_size", &a.max_split_size)?;
        m.serialize_entry("garbage_collection_threshold", &a.garbage_collection_threshold)?;
        m.serialize_entry("expandable_segments", &a.expandable_segments)?;
        m.serialize_entry("pinned_num_register_threads", &a.pinned_num_register_threads)?;
        m.serialize_entry("release_lock_on_cudamalloc", &a.release_lock_on_cudamalloc)?;
        m.serialize_entry("pinned_use_cuda_host_register", &a.pinned_use_cuda_host_register)?;
        m.serialize_entry(
            "graph_capture_record_stream_reuse",
            &a.graph_capture_record_stream_reuse,
        )?;
        m.serialize_entry("roundup_power2_divisions", &DivisionsSer(&a.roundup_power2_divisions))?;
        m.end()
    }
}

impl Serialize for DivisionsSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            m.serialize_entry(&k.to_string(), v)?;
        }
        m.end()
    }
}

impl Serialize for AnnotationsSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut q = s.serialize_seq(Some(self.0.len()))?;
        for a in self.0 {
            q.serialize_element(&AnnotationSer(a))?;
        }
        q.end()
    }
}

impl Serialize for AnnotationSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let a = self.0;
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("stage", &a.stage)?;
        m.serialize_entry("name", &a.name)?;
        m.serialize_entry("device", &a.device)?;
        m.serialize_entry("time_us", &a.time_us)?;
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_pickle::{HashableValue, Value};

    fn pickle_of(v: &Value) -> Vec<u8> {
        serde_pickle::value_to_vec(v, SerOptions::new()).unwrap()
    }

    fn s(x: &str) -> HashableValue {
        HashableValue::String(x.into())
    }

    fn dict(items: Vec<(&str, Value)>) -> Value {
        Value::Dict(items.into_iter().map(|(k, v)| (s(k), v)).collect())
    }

    #[test]
    fn wrong_type_names_the_entry() {
        let ev = |size: Value| {
            dict(vec![
                ("action", Value::String("alloc".into())),
                ("addr", Value::I64(4096)),
                ("size", size),
                ("stream", Value::I64(0)),
                ("time_us", Value::I64(1)),
            ])
        };
        let snap = dict(vec![(
            "device_traces",
            Value::List(vec![Value::List(vec![
                ev(Value::I64(512)),
                ev(Value::String("big".into())),
            ])]),
        )]);
        let e = read_pickle(&pickle_of(&snap), "t.pickle").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.pickle: device_traces[0][1]: field 'size' is a str, expected int"
        );
        assert_eq!(e.kind, ErrorKind::Schema);
    }

    #[test]
    fn missing_optional_keys_take_defaults() {
        let snap = dict(vec![(
            "device_traces",
            Value::List(vec![
                Value::List(vec![]),
                Value::List(vec![dict(vec![
                    ("action", Value::String("oom".into())),
                    ("device_free", Value::I64(77)),
                    ("size", Value::I64(1 << 40)),
                ])]),
            ]),
        )]);
        let t = read_pickle(&pickle_of(&snap), "t").unwrap();
        assert_eq!(t.devices.len(), 1);
        assert_eq!(t.devices[0].device, 1);
        let e = t.devices[0].events[0];
        assert_eq!(
            (e.action, e.addr, e.size, e.stream, e.time_us, e.stack),
            (Action::Oom, 77, 1 << 40, 0, 0, None)
        );
        assert_eq!(t.settings, AllocatorSettings::default());
        assert!(t.segments.is_empty());
    }

    #[test]
    fn block_addresses_and_sizes_are_computed_when_missing() {
        let blk =
            |size: i64, state: &str| dict(vec![("size", Value::I64(size)), ("state", Value::String(state.into()))]);
        let seg = dict(vec![
            ("address", Value::I64(1 << 20)),
            (
                "blocks",
                Value::List(vec![blk(512, "active_allocated"), blk(1536, "inactive")]),
            ),
        ]);
        let t = read_pickle(&pickle_of(&Value::List(vec![seg])), "segs").unwrap();
        let g = &t.segments[0];
        assert_eq!(g.blocks[1].address, (1 << 20) + 512);
        assert_eq!(
            (g.total_size, g.allocated_size, g.active_size, g.requested_size),
            (2048, 512, 512, 512)
        );
    }

    #[test]
    fn unknown_action_and_bad_top_level() {
        let snap = dict(vec![(
            "device_traces",
            Value::List(vec![Value::List(vec![dict(vec![
                ("action", Value::String("teleport".into())),
                ("addr", Value::I64(0)),
                ("size", Value::I64(0)),
            ])])]),
        )]);
        let e = read_pickle(&pickle_of(&snap), "t").unwrap_err();
        assert!(
            e.to_string().contains("device_traces[0][0]: unknown action 'teleport'"),
            "{e}"
        );
        let e = read_pickle(&pickle_of(&Value::I64(3)), "t").unwrap_err();
        assert!(e.to_string().contains("snapshot is a int, expected dict"), "{e}");
        let e = read_pickle(b"\x80\x04\x95", "t").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Pickle);
    }

    #[test]
    fn frame_errors_have_a_path() {
        let snap = dict(vec![(
            "segments",
            Value::List(vec![dict(vec![
                ("address", Value::I64(0)),
                (
                    "frames",
                    Value::List(vec![dict(vec![("line", Value::String("x".into()))])]),
                ),
            ])]),
        )]);
        let e = read_pickle(&pickle_of(&snap), "t").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t: segments[0].frames[0]: field 'line' is a str, expected int"
        );
    }
}
