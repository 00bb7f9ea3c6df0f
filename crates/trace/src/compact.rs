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

mod read;
mod write;

pub use read::read_compact;
pub use write::{to_compact_bytes, write_compact};

#[cfg(test)]
mod tests;
