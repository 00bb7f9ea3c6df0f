//! # What sleeps: the tags of a snapshot that gave their memory back
//!
//! A sleeping tag's segments are listed in a snapshot (`asleep`) though nothing is mapped there,
//! so [`super::why`] takes them out of the reserved accounting and reports them here instead:
//! one line per sleeping tag with its bytes (what waking it maps again) and the live blocks in
//! them (still allocated; their bytes are in host memory if the sleep offloaded them).

use cudamem_trace::{BlockState, SegmentSnapshot};
use serde_json::{json, Value};

use crate::human;

/// One sleeping tag of one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsleepTag {
    /// Device ordinal.
    pub device: i32,
    /// The tag's name (`"?"` when an asleep segment names none).
    pub tag: String,
    /// Bytes of its ranges: what waking it maps again.
    pub bytes: u64,
    /// Bytes of the blocks still allocated in them.
    pub allocated: u64,
}

/// Splits off the asleep segments of `segments`, summed per (device, tag) in first-seen order.
pub fn split(segments: &[SegmentSnapshot]) -> (Vec<&SegmentSnapshot>, Vec<AsleepTag>) {
    let mut awake = Vec::with_capacity(segments.len());
    let mut asleep: Vec<AsleepTag> = Vec::new();
    for s in segments {
        if !s.asleep {
            awake.push(s);
            continue;
        }
        let tag = s.tag.as_deref().unwrap_or("?");
        let i = match asleep.iter().position(|a| a.device == s.device && a.tag == tag) {
            Some(i) => i,
            None => {
                asleep.push(AsleepTag {
                    device: s.device,
                    tag: tag.to_string(),
                    bytes: 0,
                    allocated: 0,
                });
                asleep.len() - 1
            }
        };
        asleep[i].bytes += s.total_size;
        asleep[i].allocated += (s.blocks.iter())
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.size)
            .sum::<u64>();
    }
    (awake, asleep)
}

/// The text lines, one per sleeping tag, under a heading; empty when nothing sleeps.
pub fn text(asleep: &[AsleepTag]) -> String {
    if asleep.is_empty() {
        return String::new();
    }
    let total: u64 = asleep.iter().map(|a| a.bytes).sum();
    let mut s = format!("asleep, not reserved (waking maps it again): {}\n", human(total));
    let multi = asleep.iter().any(|a| a.device != asleep[0].device);
    for a in asleep {
        let dev = if multi {
            format!("device {} ", a.device)
        } else {
            String::new()
        };
        s.push_str(&format!(
            "  {dev}tag \"{}\": {} asleep, {} of it in live blocks\n",
            a.tag,
            human(a.bytes),
            human(a.allocated)
        ));
    }
    s
}

/// The JSON list.
pub fn to_json(asleep: &[AsleepTag]) -> Value {
    (asleep.iter())
        .map(|a| json!({"device": a.device, "tag": a.tag, "bytes": a.bytes, "allocated": a.allocated}))
        .collect()
}
