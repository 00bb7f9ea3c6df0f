//! Readers and writers of CUDA allocation traces.
//!
//! `cudamem-trace` turns allocation traces recorded by other tools into one
//! in-memory model, [`Trace`], that the replay engine consumes, and writes that
//! model back out. It knows nothing about the allocator engine itself. The model's
//! types live in `cudamem-trace-types` (so that the engine, which makes snapshots,
//! needs no reader) and are re-exported here.
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
//! opcode (`0x80`, then protocol 0 to 5) → pickle; `CUDAMEMT` → compact; a first line starting with
//! `Thread,` → RMM CSV. [`read_path`] decides from the first bytes alone and reads no further
//! into content of no known format, and reads at most [`MAX_TRACE_BYTES`] (module `input`).
//!
//! Guarantees common to every reader:
//!
//! * no input makes a reader panic, overflow its stack, or allocate memory
//!   because a length field says so; malformed input gives a [`TraceError`]
//!   that names the file and the position (line, entry path or byte offset);
//! * no input, raw or gunzipped, is read past [`MAX_TRACE_BYTES`] (or the limit given to
//!   [`read_path_limited`]), so an endless stream ends in an error, not in exhausted memory;
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
use std::io::Read;

pub mod compact;
mod input;
pub mod pickle;
mod pickle_vm;
pub mod rmm;

pub use compact::{read_compact, write_compact};
pub use cudamem_trace_types::*;
pub use input::{read_path, read_path_limited, MAX_TRACE_BYTES, SNIFF_BYTES};
pub use pickle::{read_pickle, write_snapshot_pickle};
pub use rmm::read_rmm_csv;

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
    // PROTO and a protocol number PyTorch's pickle module can write (0 to 5).
    if bytes.first() == Some(&0x80) && !matches!(bytes.get(1), Some(&p) if p > 5) {
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

/// Most bytes a gzip'd input may expand to: [`MAX_TRACE_BYTES`], a guard against gzip bombs.
pub const MAX_DECOMPRESSED: u64 = MAX_TRACE_BYTES;

/// Gunzip `bytes` (all members), refusing to expand past [`MAX_DECOMPRESSED`].
pub fn gunzip(bytes: &[u8], source: &str) -> Result<Vec<u8>, TraceError> {
    gunzip_within(bytes, source, MAX_DECOMPRESSED)
}

fn gunzip_within(bytes: &[u8], source: &str, max_bytes: u64) -> Result<Vec<u8>, TraceError> {
    let mut out = Vec::with_capacity(bytes.len().saturating_mul(4).min(256 << 20).min(max_bytes as usize));
    let dec = flate2::read::MultiGzDecoder::new(bytes);
    dec.take(max_bytes + 1).read_to_end(&mut out).map_err(|e| {
        TraceError::new(
            source,
            ErrorKind::Gzip,
            Location::Whole,
            format!("gzip decode error: {e}"),
        )
    })?;
    if out.len() as u64 > max_bytes {
        return Err(input::too_large(source, "the gzip content", max_bytes));
    }
    Ok(out)
}

/// Read a trace from `bytes`, choosing the format by content (see the crate
/// docs). `source` names the input in errors and in [`Trace::source`].
pub fn read_bytes(bytes: &[u8], source: &str) -> Result<Trace, TraceError> {
    read_bytes_within(bytes, source, MAX_DECOMPRESSED)
}

/// [`read_bytes`] with `max_bytes` as the limit on what gzip content expands to.
pub(crate) fn read_bytes_within(bytes: &[u8], source: &str, max_bytes: u64) -> Result<Trace, TraceError> {
    match detect_format(bytes) {
        Some(Format::Gzip) => {
            let inner = gunzip_within(bytes, source, max_bytes)?;
            match detect_format(&inner) {
                Some(Format::Gzip) => Err(TraceError::new(
                    source,
                    ErrorKind::UnknownFormat,
                    Location::Whole,
                    "gzip inside gzip is not a trace format",
                )),
                Some(_) => read_bytes_within(&inner, source, max_bytes),
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

pub(crate) fn unknown(source: &str, bytes: &[u8], what: &str) -> TraceError {
    if bytes.is_empty() {
        return TraceError::new(
            source,
            ErrorKind::UnknownFormat,
            Location::Whole,
            format!("{what} is empty: not a trace"),
        );
    }
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
