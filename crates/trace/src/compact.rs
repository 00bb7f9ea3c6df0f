//! cudamem's compact trace format: a versioned binary file that loads in a
//! few milliseconds per million events.
//!
//! # Layout (version 1)
//!
//! All integers are little-endian.
//!
//! ```text
//! offset  size  field
//! 0       8     magic "CUDAMEMT"
//! 8       4     version u32 = 1
//! 12      4     flags u32 = 0 (reserved)
//! 16      8     file_len u64: length of the whole file, trailer included
//! 24      …     sections: tag [u8; 4], len u64, payload[len]
//! end-8   8     checksum u64: hash64 (below) of bytes [0, file_len - 8)
//! ```
//!
//! Sections written by version 1, in this order (a reader skips tags it does
//! not know, so later minor additions stay readable):
//!
//! * `STRS` string table: `n u32`, then `n` × (`len u32`, UTF-8 bytes).
//!   Other sections refer to strings by index (`u32`).
//! * `STKS` stacks: `n u32`, then `n` × (`frames u32`, then per frame
//!   `name u32`, `filename u32`, `line i64`).
//! * `SETT` allocator settings as text: one `key=value` per line (`conf` with
//!   `\\`, `\n`, `\r` escaped; `roundup_power2_divisions=1:0,2:4,…`).
//!   Unknown keys are ignored by readers.
//! * `DEVS` events: `n u32`, then per device `device i32`, `events u64`, then
//!   fixed-width 37-byte records: `action u8` ([`Action::code`]),
//!   `stream u64`, `addr u64`, `size u64`, `time_us i64`, `stack u32`
//!   (`u32::MAX` = none).
//! * `SEGS` snapshot segments: `n u32`, then per segment `device i32`,
//!   `address u64`, `total_size u64`, `allocated_size u64`,
//!   `active_size u64`, `requested_size u64`, `stream u64`,
//!   `segment_type u8` (0 large, 1 small), `pool_id i64 i64`,
//!   `is_expandable u8`, `stack u32`, `blocks u32`, then per block
//!   `address u64`, `size u64`, `requested_size u64`, `state u8`
//!   (0 active_allocated, 1 active_pending_free, 2 inactive), `stack u32`.
//! * `ANNS` external annotations: `n u32`, then `n` × (`device i32`,
//!   `stage u32`, `name u32`, `time_us i64`).
//! * `STAG` cudamem's tags of segments, only when a segment has one: `n u32`,
//!   then `n` × (`segment u32`, an index into `SEGS`, which comes before;
//!   `tag u32`, a string or `u32::MAX` for none; `asleep u8`). Older readers
//!   skip it.
//!
//! [`Trace::source`] is not stored: the reader's `source` argument names the
//! trace.
//!
//! `hash64` processes the bytes as 8-byte little-endian words (the tail
//! zero-padded): `h = (h ^ w) * 0x9E3779B97F4A7C15; h ^= h >> 29`, starting
//! from `0xCBF29CE484222325 ^ len`, and ends with the SplitMix64 finalizer.
//! Each step is a bijection of `h`, so any change of a single word is always
//! detected.
//!
//! # What the reader guarantees
//!
//! * A file shorter than its `file_len` fails with `truncated at byte N of M`;
//!   a file whose checksum does not match fails before anything is parsed; a
//!   newer major version fails with a clear message.
//! * No count or length field makes it allocate more than the bytes that are
//!   really there; every string and stack index is checked; devices are
//!   sorted and unique. No input makes it panic.
//! * `write_compact` then `read_compact` gives back an equal trace (except
//!   `source`, which is the reader's argument).

use std::collections::HashMap;
use std::io::Write;

use crate::{
    Action, AllocatorSettings, Annotation, BlockSnapshot, BlockState, DeviceTrace, ErrorKind, Frame, Location,
    SegmentSnapshot, SegmentType, Stack, StackId, Trace, TraceError, TraceEvent,
};

/// The first 8 bytes of a compact file.
pub const MAGIC: &[u8; 8] = b"CUDAMEMT";
/// The version this crate writes (and the newest it reads).
pub const VERSION: u32 = 1;
/// Size of one event record.
pub const EVENT_RECORD: usize = 37;
const HEADER: usize = 24;
const TRAILER: usize = 8;
const SEGMENT_RECORD: usize = 4 + 8 * 6 + 1 + 16 + 1 + 4 + 4;
const BLOCK_RECORD: usize = 8 * 3 + 1 + 4;
const NO_STACK: u32 = u32::MAX;

/// The checksum of the format (see the module docs).
pub fn hash64(data: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h: u64 = 0xCBF2_9CE4_8422_2325 ^ data.len() as u64;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        h = (h ^ w).wrapping_mul(K);
        h ^= h >> 29;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut b = [0u8; 8];
        b[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(b)).wrapping_mul(K);
        h ^= h >> 29;
    }
    // SplitMix64 finalizer.
    h ^= h >> 30;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

// ---------------------------------------------------------------------------
// writer

struct Strings<'a> {
    index: HashMap<&'a str, u32>,
    list: Vec<&'a str>,
}

impl<'a> Strings<'a> {
    fn id(&mut self, s: &'a str) -> u32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.list.len() as u32;
        self.index.insert(s, i);
        self.list.push(s);
        i
    }
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_i64(b: &mut Vec<u8>, v: i64) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_i32(b: &mut Vec<u8>, v: i32) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn stack_code(s: Option<StackId>) -> u32 {
    s.unwrap_or(NO_STACK)
}

fn section(out: &mut Vec<u8>, tag: &[u8; 4], payload: &[u8]) {
    out.extend_from_slice(tag);
    put_u64(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n").replace('\r', "\\r")
}

fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.next()? {
                '\\' => out.push('\\'),
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                _ => return None,
            }
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// The settings as the `SETT` section's text.
pub fn settings_to_text(s: &AllocatorSettings) -> String {
    let div: Vec<String> = s
        .roundup_power2_divisions
        .iter()
        .map(|(k, v)| format!("{k}:{v}"))
        .collect();
    format!(
        "conf={}\nmax_split_size={}\ngarbage_collection_threshold={}\nexpandable_segments={}\n\
         roundup_power2_divisions={}\nrelease_lock_on_cudamalloc={}\npinned_num_register_threads={}\n\
         pinned_use_cuda_host_register={}\ngraph_capture_record_stream_reuse={}\n",
        escape(&s.conf),
        s.max_split_size,
        s.garbage_collection_threshold,
        s.expandable_segments,
        div.join(","),
        s.release_lock_on_cudamalloc,
        s.pinned_num_register_threads,
        s.pinned_use_cuda_host_register,
        s.graph_capture_record_stream_reuse,
    )
}

/// Parse the `SETT` text; unknown keys are ignored, missing ones default.
pub fn settings_from_text(text: &str) -> Result<AllocatorSettings, String> {
    let mut s = AllocatorSettings::default();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("settings line '{line}' is not key=value"));
        };
        let bad = || format!("bad value '{v}' for setting '{k}'");
        let b = |v: &str| match v {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(bad()),
        };
        match k {
            "conf" => s.conf = unescape(v).ok_or_else(bad)?,
            "max_split_size" => s.max_split_size = v.parse().map_err(|_| bad())?,
            "garbage_collection_threshold" => s.garbage_collection_threshold = v.parse().map_err(|_| bad())?,
            "expandable_segments" => s.expandable_segments = b(v)?,
            "release_lock_on_cudamalloc" => s.release_lock_on_cudamalloc = b(v)?,
            "pinned_num_register_threads" => s.pinned_num_register_threads = v.parse().map_err(|_| bad())?,
            "pinned_use_cuda_host_register" => s.pinned_use_cuda_host_register = b(v)?,
            "graph_capture_record_stream_reuse" => s.graph_capture_record_stream_reuse = b(v)?,
            "roundup_power2_divisions" => {
                s.roundup_power2_divisions.clear();
                for pair in v.split(',').filter(|p| !p.is_empty()) {
                    let (a, c) = pair.split_once(':').ok_or_else(bad)?;
                    s.roundup_power2_divisions
                        .push((a.parse().map_err(|_| bad())?, c.parse().map_err(|_| bad())?));
                }
            }
            _ => {}
        }
    }
    Ok(s)
}

/// Encode `trace` into the compact format.
pub fn to_compact_bytes(trace: &Trace) -> Result<Vec<u8>, TraceError> {
    trace.validate()?;
    Ok(encode(trace))
}

/// Encodes a trace without checking it (tests use it to make files that break the bounds).
fn encode(trace: &Trace) -> Vec<u8> {
    let n_events: usize = trace.num_events();
    let mut strings = Strings {
        index: HashMap::new(),
        list: Vec::new(),
    };

    let mut stks = Vec::new();
    put_u32(&mut stks, trace.stacks.len() as u32);
    for st in &trace.stacks {
        put_u32(&mut stks, st.frames.len() as u32);
        for f in &st.frames {
            put_u32(&mut stks, strings.id(&f.name));
            put_u32(&mut stks, strings.id(&f.filename));
            put_i64(&mut stks, f.line);
        }
    }
    let mut anns = Vec::new();
    put_u32(&mut anns, trace.annotations.len() as u32);
    for a in &trace.annotations {
        put_i32(&mut anns, a.device);
        put_u32(&mut anns, strings.id(&a.stage));
        put_u32(&mut anns, strings.id(&a.name));
        put_i64(&mut anns, a.time_us);
    }
    let mut stag = Vec::new();
    let tagged: Vec<(usize, &SegmentSnapshot)> = (trace.segments.iter().enumerate())
        .filter(|(_, g)| g.tag.is_some() || g.asleep)
        .collect();
    if !tagged.is_empty() {
        put_u32(&mut stag, tagged.len() as u32);
        for (i, g) in tagged {
            put_u32(&mut stag, i as u32);
            put_u32(&mut stag, g.tag.as_deref().map_or(NO_STACK, |t| strings.id(t)));
            stag.push(g.asleep as u8);
        }
    }
    let mut strs = Vec::new();
    put_u32(&mut strs, strings.list.len() as u32);
    for s in &strings.list {
        put_u32(&mut strs, s.len() as u32);
        strs.extend_from_slice(s.as_bytes());
    }

    let mut out = Vec::with_capacity(HEADER + TRAILER + 1024 + strs.len() + stks.len() + n_events * EVENT_RECORD);
    out.extend_from_slice(MAGIC);
    put_u32(&mut out, VERSION);
    put_u32(&mut out, 0);
    put_u64(&mut out, 0); // file_len, patched below
    section(&mut out, b"STRS", &strs);
    drop(strs);
    section(&mut out, b"STKS", &stks);
    drop(stks);
    section(&mut out, b"SETT", settings_to_text(&trace.settings).as_bytes());

    // DEVS is written in place: it is the big one.
    out.extend_from_slice(b"DEVS");
    let len_at = out.len();
    put_u64(&mut out, 0);
    let start = out.len();
    put_u32(&mut out, trace.devices.len() as u32);
    for d in &trace.devices {
        put_i32(&mut out, d.device);
        put_u64(&mut out, d.events.len() as u64);
        for e in &d.events {
            out.push(e.action.code());
            put_u64(&mut out, e.stream);
            put_u64(&mut out, e.addr);
            put_u64(&mut out, e.size);
            put_i64(&mut out, e.time_us);
            put_u32(&mut out, stack_code(e.stack));
        }
    }
    let devs_len = (out.len() - start) as u64;
    out[len_at..len_at + 8].copy_from_slice(&devs_len.to_le_bytes());

    let mut segs = Vec::with_capacity(4 + trace.segments.len() * SEGMENT_RECORD);
    put_u32(&mut segs, trace.segments.len() as u32);
    for g in &trace.segments {
        put_i32(&mut segs, g.device);
        for v in [
            g.address,
            g.total_size,
            g.allocated_size,
            g.active_size,
            g.requested_size,
            g.stream,
        ] {
            put_u64(&mut segs, v);
        }
        segs.push(match g.segment_type {
            SegmentType::Large => 0,
            SegmentType::Small => 1,
        });
        put_i64(&mut segs, g.pool_id.0);
        put_i64(&mut segs, g.pool_id.1);
        segs.push(g.is_expandable as u8);
        put_u32(&mut segs, stack_code(g.stack));
        put_u32(&mut segs, g.blocks.len() as u32);
        for b in &g.blocks {
            put_u64(&mut segs, b.address);
            put_u64(&mut segs, b.size);
            put_u64(&mut segs, b.requested_size);
            segs.push(match b.state {
                BlockState::ActiveAllocated => 0,
                BlockState::ActivePendingFree => 1,
                BlockState::Inactive => 2,
            });
            put_u32(&mut segs, stack_code(b.stack));
        }
    }
    section(&mut out, b"SEGS", &segs);
    section(&mut out, b"ANNS", &anns);
    if !stag.is_empty() {
        section(&mut out, b"STAG", &stag);
    }

    let file_len = (out.len() + TRAILER) as u64;
    out[16..24].copy_from_slice(&file_len.to_le_bytes());
    let sum = hash64(&out);
    put_u64(&mut out, sum);
    out
}

/// Write `trace` in the compact format.
pub fn write_compact(trace: &Trace, mut out: impl Write) -> Result<(), TraceError> {
    let bytes = to_compact_bytes(trace)?;
    out.write_all(&bytes).and_then(|_| out.flush()).map_err(|e| {
        TraceError::new(
            &trace.source,
            ErrorKind::Io,
            Location::Whole,
            format!("cannot write compact trace: {e}"),
        )
    })
}

// ---------------------------------------------------------------------------
// reader

/// A bounds-checked reader over `data[..end]`; every failure names the byte.
struct Cur<'a> {
    data: &'a [u8],
    pos: usize,
    end: usize,
    what: &'static str,
}

type CR<T> = Result<T, (u64, String)>;

impl<'a> Cur<'a> {
    fn need(&self, n: usize) -> CR<()> {
        if self.end - self.pos < n {
            Err((
                self.pos as u64,
                format!(
                    "section {} ends at byte {} but a field needs {n} bytes",
                    self.what, self.end
                ),
            ))
        } else {
            Ok(())
        }
    }
    fn bytes(&mut self, n: usize) -> CR<&'a [u8]> {
        self.need(n)?;
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> CR<[u8; N]> {
        let s = self.bytes(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u8(&mut self) -> CR<u8> {
        Ok(self.arr::<1>()?[0])
    }
    fn u32(&mut self) -> CR<u32> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn i32(&mut self) -> CR<i32> {
        Ok(i32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> CR<u64> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn i64(&mut self) -> CR<i64> {
        Ok(i64::from_le_bytes(self.arr()?))
    }
    fn left(&self) -> usize {
        self.end - self.pos
    }
    /// A count of records of at least `min` bytes each, checked against the
    /// bytes left, so it can size an allocation safely.
    fn count(&mut self, n: u64, min: usize) -> CR<usize> {
        let at = self.pos as u64;
        if n.saturating_mul(min.max(1) as u64) > self.left() as u64 {
            return Err((
                at,
                format!(
                    "section {} claims {n} records, more than its {} bytes hold",
                    self.what,
                    self.left()
                ),
            ));
        }
        Ok(n as usize)
    }
    fn fail<T>(&self, at: usize, msg: String) -> CR<T> {
        Err((at as u64, msg))
    }
}

/// Read a compact trace (see the module docs). `source` names it in errors
/// and becomes [`Trace::source`].
pub fn read_compact(data: &[u8], source: &str) -> Result<Trace, TraceError> {
    let trace = read_compact_unchecked(data, source)?;
    // The bounds every reader guarantees (stack ids, device ordinals): see `Trace::validate`.
    trace.validate()?;
    Ok(trace)
}

fn read_compact_unchecked(data: &[u8], source: &str) -> Result<Trace, TraceError> {
    let err = |kind: ErrorKind, at: u64, msg: String| TraceError::new(source, kind, Location::Byte(at), msg);
    let magic_prefix = !data.is_empty() && MAGIC.starts_with(&data[..data.len().min(8)]);
    if !magic_prefix {
        return Err(err(
            ErrorKind::Compact,
            0,
            "not a cudamem compact file (bad magic)".into(),
        ));
    }
    if data.len() < HEADER + TRAILER {
        return Err(err(
            ErrorKind::Truncated,
            data.len() as u64,
            format!("truncated at byte {} of at least {}", data.len(), HEADER + TRAILER),
        ));
    }
    let version = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
    if version != VERSION {
        return Err(err(
            ErrorKind::Compact,
            8,
            format!("compact format version {version} is not supported (this reader knows version {VERSION})"),
        ));
    }
    let mut fl = [0u8; 8];
    fl.copy_from_slice(&data[16..24]);
    let file_len = u64::from_le_bytes(fl);
    if (data.len() as u64) < file_len {
        return Err(err(
            ErrorKind::Truncated,
            data.len() as u64,
            format!("truncated at byte {} of {}", data.len(), file_len),
        ));
    }
    if (data.len() as u64) > file_len {
        return Err(err(
            ErrorKind::Compact,
            file_len,
            format!(
                "{} unexpected bytes after the end of the file (byte {file_len})",
                data.len() as u64 - file_len
            ),
        ));
    }
    let body_end = data.len() - TRAILER;
    let mut sum = [0u8; 8];
    sum.copy_from_slice(&data[body_end..]);
    if hash64(&data[..body_end]) != u64::from_le_bytes(sum) {
        return Err(err(
            ErrorKind::Compact,
            body_end as u64,
            "checksum mismatch: the file is corrupt".into(),
        ));
    }
    parse_sections(data, body_end, source).map_err(|(at, msg)| err(ErrorKind::Compact, at, msg))
}

fn parse_sections(data: &[u8], body_end: usize, source: &str) -> CR<Trace> {
    let mut trace = Trace::new(source);
    let mut strings: Vec<&str> = Vec::new();
    let mut top = Cur {
        data,
        pos: HEADER,
        end: body_end,
        what: "header",
    };
    while top.pos < body_end {
        let at = top.pos;
        let tag: [u8; 4] = top.arr()?;
        let len = top.u64()?;
        if len > top.left() as u64 {
            return top.fail(
                at,
                format!("section at byte {at} claims {len} bytes, only {} left", top.left()),
            );
        }
        let start = top.pos;
        let end = start + len as usize;
        top.pos = end;
        let what: &'static str = match &tag {
            b"STRS" => "STRS",
            b"STKS" => "STKS",
            b"SETT" => "SETT",
            b"DEVS" => "DEVS",
            b"SEGS" => "SEGS",
            b"ANNS" => "ANNS",
            b"STAG" => "STAG",
            _ => continue, // unknown section: skip
        };
        let mut c = Cur {
            data,
            pos: start,
            end,
            what,
        };
        match what {
            "STRS" => strings = read_strings(&mut c)?,
            "STKS" => trace.stacks = read_stacks(&mut c, &strings)?,
            "SETT" => {
                let text = std::str::from_utf8(c.bytes(c.left())?)
                    .or_else(|_| c.fail(start, "settings text is not UTF-8".into()))?;
                trace.settings = settings_from_text(text).or_else(|m| c.fail(start, m))?;
            }
            "DEVS" => trace.devices = read_devices(&mut c, trace.stacks.len())?,
            "SEGS" => trace.segments = read_segments(&mut c, trace.stacks.len())?,
            "ANNS" => trace.annotations = read_annotations(&mut c, &strings)?,
            _ => read_segment_tags(&mut c, &strings, &mut trace.segments)?,
        }
        if c.pos != end {
            return c.fail(c.pos, format!("section {what} has {} unread bytes", end - c.pos));
        }
    }
    Ok(trace)
}

fn read_strings<'a>(c: &mut Cur<'a>) -> CR<Vec<&'a str>> {
    let n = c.u32()? as u64;
    let n = c.count(n, 4)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let len = c.u32()? as usize;
        let at = c.pos;
        let b = c.bytes(len)?;
        v.push(std::str::from_utf8(b).or_else(|_| c.fail(at, "string is not UTF-8".into()))?);
    }
    Ok(v)
}

fn string(c: &Cur<'_>, strings: &[&str], at: usize, i: u32) -> CR<String> {
    match strings.get(i as usize) {
        Some(s) => Ok((*s).to_string()),
        None => c.fail(at, format!("string index {i} out of range ({} strings)", strings.len())),
    }
}

fn read_stacks(c: &mut Cur<'_>, strings: &[&str]) -> CR<Vec<Stack>> {
    let n = c.u32()? as u64;
    let n = c.count(n, 4)?;
    let mut stacks = Vec::with_capacity(n);
    for _ in 0..n {
        let nf = c.u32()? as u64;
        let nf = c.count(nf, 16)?;
        let mut frames = Vec::with_capacity(nf);
        for _ in 0..nf {
            let at = c.pos;
            let (ni, fi, line) = (c.u32()?, c.u32()?, c.i64()?);
            frames.push(Frame {
                name: string(c, strings, at, ni)?,
                filename: string(c, strings, at, fi)?,
                line,
            });
        }
        stacks.push(Stack { frames });
    }
    Ok(stacks)
}

fn stack_ref(c: &Cur<'_>, at: usize, code: u32, n_stacks: usize) -> CR<Option<StackId>> {
    if code == NO_STACK {
        Ok(None)
    } else if (code as usize) < n_stacks {
        Ok(Some(code))
    } else {
        c.fail(at, format!("stack id {code} out of range ({n_stacks} stacks)"))
    }
}

fn read_devices(c: &mut Cur<'_>, n_stacks: usize) -> CR<Vec<DeviceTrace>> {
    let n = c.u32()? as u64;
    let n = c.count(n, 12)?;
    let mut devices: Vec<DeviceTrace> = Vec::with_capacity(n);
    for _ in 0..n {
        let at = c.pos;
        let device = c.i32()?;
        if device < 0 || devices.last().is_some_and(|d| d.device >= device) {
            return c.fail(
                at,
                format!("device {device} out of order (devices must be sorted, unique, ≥ 0)"),
            );
        }
        let ne = c.u64()?;
        let ne = c.count(ne, EVENT_RECORD)?;
        let base = c.pos;
        let recs = c.bytes(ne * EVENT_RECORD)?;
        let mut events = Vec::with_capacity(ne);
        for (i, r) in recs.chunks_exact(EVENT_RECORD).enumerate() {
            let at = base + i * EVENT_RECORD;
            let w = |o: usize| {
                u64::from_le_bytes([
                    r[o],
                    r[o + 1],
                    r[o + 2],
                    r[o + 3],
                    r[o + 4],
                    r[o + 5],
                    r[o + 6],
                    r[o + 7],
                ])
            };
            let Some(action) = Action::from_code(r[0]) else {
                return c.fail(at, format!("unknown action code {}", r[0]));
            };
            let code = u32::from_le_bytes([r[33], r[34], r[35], r[36]]);
            let stack = stack_ref(c, at + 33, code, n_stacks)?;
            events.push(TraceEvent {
                action,
                stream: w(1),
                addr: w(9),
                size: w(17),
                time_us: w(25) as i64,
                stack,
            });
        }
        devices.push(DeviceTrace { device, events });
    }
    Ok(devices)
}

fn read_segments(c: &mut Cur<'_>, n_stacks: usize) -> CR<Vec<SegmentSnapshot>> {
    let n = c.u32()? as u64;
    let n = c.count(n, SEGMENT_RECORD)?;
    let mut segs = Vec::with_capacity(n);
    for _ in 0..n {
        let device = c.i32()?;
        let (address, total_size, allocated_size, active_size, requested_size, stream) =
            (c.u64()?, c.u64()?, c.u64()?, c.u64()?, c.u64()?, c.u64()?);
        let at = c.pos;
        let segment_type = match c.u8()? {
            0 => SegmentType::Large,
            1 => SegmentType::Small,
            t => return c.fail(at, format!("unknown segment type {t}")),
        };
        let pool_id = (c.i64()?, c.i64()?);
        let at = c.pos;
        let is_expandable = match c.u8()? {
            0 => false,
            1 => true,
            v => return c.fail(at, format!("bad boolean {v}")),
        };
        let at = c.pos;
        let code = c.u32()?;
        let stack = stack_ref(c, at, code, n_stacks)?;
        let nb = c.u32()? as u64;
        let nb = c.count(nb, BLOCK_RECORD)?;
        let mut blocks = Vec::with_capacity(nb);
        for _ in 0..nb {
            let (address, size, requested_size) = (c.u64()?, c.u64()?, c.u64()?);
            let at = c.pos;
            let state = match c.u8()? {
                0 => BlockState::ActiveAllocated,
                1 => BlockState::ActivePendingFree,
                2 => BlockState::Inactive,
                s => return c.fail(at, format!("unknown block state {s}")),
            };
            let at = c.pos;
            let code = c.u32()?;
            let stack = stack_ref(c, at, code, n_stacks)?;
            blocks.push(BlockSnapshot {
                address,
                size,
                requested_size,
                state,
                stack,
            });
        }
        segs.push(SegmentSnapshot {
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
            tag: None,
            asleep: false,
        });
    }
    Ok(segs)
}

fn read_annotations(c: &mut Cur<'_>, strings: &[&str]) -> CR<Vec<Annotation>> {
    let n = c.u32()? as u64;
    let n = c.count(n, 20)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let at = c.pos;
        let device = c.i32()?;
        let (si, ni, time_us) = (c.u32()?, c.u32()?, c.i64()?);
        v.push(Annotation {
            device,
            stage: string(c, strings, at, si)?,
            name: string(c, strings, at, ni)?,
            time_us,
        });
    }
    Ok(v)
}

fn read_segment_tags(c: &mut Cur<'_>, strings: &[&str], segs: &mut [SegmentSnapshot]) -> CR<()> {
    let n = c.u32()? as u64;
    let n = c.count(n, 9)?;
    for _ in 0..n {
        let at = c.pos;
        let i = c.u32()? as usize;
        let code = c.u32()?;
        let tag = if code == NO_STACK {
            None
        } else {
            Some(string(c, strings, at + 4, code)?)
        };
        let asleep = match c.u8()? {
            0 => false,
            1 => true,
            v => return c.fail(at + 8, format!("bad boolean {v}")),
        };
        let Some(g) = segs.get_mut(i) else {
            return c.fail(
                at,
                format!("tag of segment {i}, but SEGS holds {} segments", segs.len()),
            );
        };
        (g.tag, g.asleep) = (tag, asleep);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fuzz finding (the short fuzz run of CI): compact files whose annotation or event-list
    /// device ordinals are out of range were returned by `read_compact` without the bound check
    /// the pickle reader makes. They are rejected now, naming the entry.
    #[test]
    fn out_of_range_device_ordinals_are_rejected_on_read() {
        let mut t = Trace::new("fuzz.cmt");
        t.annotations.push(crate::Annotation {
            device: 1_179_648,
            stage: "START".into(),
            name: "x".into(),
            time_us: 0,
        });
        let e = read_compact(&encode(&t), "fuzz.cmt").unwrap_err().to_string();
        assert!(
            e.contains("external_annotations[0]") && e.contains("device ordinal 1179648"),
            "{e}"
        );
        let mut t = Trace::new("fuzz.cmt");
        t.devices.push(crate::DeviceTrace {
            device: 1 << 20,
            events: Vec::new(),
        });
        let e = read_compact(&encode(&t), "fuzz.cmt").unwrap_err().to_string();
        assert!(e.contains("devices[0]") && e.contains("device ordinal 1048576"), "{e}");
    }

    fn sample() -> Trace {
        let mut t = Trace::new("sample");
        t.stacks.push(Stack {
            frames: vec![Frame {
                name: "f".into(),
                filename: "a.py".into(),
                line: 3,
            }],
        });
        t.devices.push(DeviceTrace {
            device: 0,
            events: vec![
                TraceEvent {
                    action: Action::SegmentAlloc,
                    addr: 1 << 40,
                    size: 2 << 20,
                    stream: 0,
                    time_us: 5,
                    stack: Some(0),
                },
                TraceEvent {
                    action: Action::Oom,
                    addr: 123,
                    size: u64::MAX,
                    stream: 7,
                    time_us: -1,
                    stack: None,
                },
            ],
        });
        t.devices.push(DeviceTrace {
            device: 3,
            events: vec![],
        });
        t.segments.push(SegmentSnapshot {
            device: 0,
            address: 1 << 40,
            total_size: 2 << 20,
            segment_type: SegmentType::Small,
            pool_id: (1, -2),
            is_expandable: true,
            stack: Some(0),
            blocks: vec![BlockSnapshot {
                address: 1 << 40,
                size: 512,
                requested_size: 500,
                state: BlockState::ActivePendingFree,
                stack: None,
            }],
            ..Default::default()
        });
        t.segments.push(SegmentSnapshot {
            address: 2 << 40,
            total_size: 2 << 20,
            tag: Some("weights".into()),
            asleep: true,
            ..Default::default()
        });
        t.settings.conf = "expandable_segments:True,\nweird\\".into();
        t.settings.roundup_power2_divisions = vec![(1, 4), (2, 0)];
        t.settings.garbage_collection_threshold = 0.6;
        t.annotations.push(Annotation {
            device: 0,
            stage: "START".into(),
            name: "step".into(),
            time_us: 9,
        });
        t
    }

    #[test]
    fn round_trip() {
        let t = sample();
        let b = to_compact_bytes(&t).unwrap();
        let r = read_compact(&b, "sample").unwrap();
        assert_eq!(r, t);
    }

    #[test]
    fn truncation_and_corruption_are_reported() {
        let b = to_compact_bytes(&sample()).unwrap();
        let n = b.len();
        let e = read_compact(&b[..n - 10], "s.cmt").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Truncated);
        assert_eq!(e.to_string(), format!("s.cmt: truncated at byte {} of {}", n - 10, n));
        let mut c = b.clone();
        c[40] ^= 1;
        let e = read_compact(&c, "s.cmt").unwrap_err();
        assert!(e.to_string().contains("checksum mismatch"), "{e}");
        let mut v = b.clone();
        v[8] = 9;
        assert!(read_compact(&v, "s").unwrap_err().to_string().contains("version 9"));
        let mut long = b.clone();
        long.push(0);
        assert!(read_compact(&long, "s").is_err());
        assert!(read_compact(b"CUDA", "s").is_err());
        assert!(read_compact(b"", "s").is_err());
        assert!(read_compact(b"NOTMAGIC________________________", "s").is_err());
    }

    /// Re-seal a modified body with a valid length and checksum, so that the
    /// section parser itself sees hostile values.
    fn reseal(mut body: Vec<u8>) -> Vec<u8> {
        let len = (body.len() + 8) as u64;
        body[16..24].copy_from_slice(&len.to_le_bytes());
        let h = hash64(&body);
        body.extend_from_slice(&h.to_le_bytes());
        body
    }

    #[test]
    fn huge_counts_do_not_allocate() {
        // A DEVS section claiming 2^60 events.
        let mut body = Vec::new();
        body.extend_from_slice(MAGIC);
        put_u32(&mut body, VERSION);
        put_u32(&mut body, 0);
        put_u64(&mut body, 0);
        let mut devs = Vec::new();
        put_u32(&mut devs, 1);
        put_i32(&mut devs, 0);
        put_u64(&mut devs, 1 << 60);
        section(&mut body, b"DEVS", &devs);
        let e = read_compact(&reseal(body), "h").unwrap_err();
        assert!(e.to_string().contains("claims"), "{e}");
        // A section claiming more bytes than the file has.
        let mut body = Vec::new();
        body.extend_from_slice(MAGIC);
        put_u32(&mut body, VERSION);
        put_u32(&mut body, 0);
        put_u64(&mut body, 0);
        body.extend_from_slice(b"STRS");
        put_u64(&mut body, u64::MAX);
        assert!(read_compact(&reseal(body), "h").is_err());
    }

    #[test]
    fn hostile_fields_inside_a_sealed_file() {
        let b = to_compact_bytes(&sample()).unwrap();
        let body = b[..b.len() - 8].to_vec();
        // Flip every byte of the body in turn (re-sealed): never panics.
        for i in 24..body.len() {
            for x in [0x01u8, 0x80, 0xff] {
                let mut m = body.clone();
                m[i] ^= x;
                let _ = read_compact(&reseal(m), "h");
            }
        }
    }

    #[test]
    fn settings_text_round_trip() {
        let s = sample().settings;
        assert_eq!(settings_from_text(&settings_to_text(&s)).unwrap(), s);
        assert!(settings_from_text("expandable_segments=maybe").is_err());
        assert_eq!(
            settings_from_text("future_key=1\n").unwrap(),
            AllocatorSettings::default()
        );
    }
}
