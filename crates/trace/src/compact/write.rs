//! The writer of the compact format: strings and stacks interned, then the sections the
//! parent module's layout describes, then the trailer with the hash of everything before it.

#[allow(unused_imports)]
use super::*;

pub(super) struct Strings<'a> {
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

pub(super) fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub(super) fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub(super) fn put_i64(b: &mut Vec<u8>, v: i64) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub(super) fn put_i32(b: &mut Vec<u8>, v: i32) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub(super) fn stack_code(s: Option<StackId>) -> u32 {
    s.unwrap_or(NO_STACK)
}

pub(super) fn section(out: &mut Vec<u8>, tag: &[u8; 4], payload: &[u8]) {
    out.extend_from_slice(tag);
    put_u64(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

/// Encode `trace` into the compact format.
pub fn to_compact_bytes(trace: &Trace) -> Result<Vec<u8>, TraceError> {
    trace.validate()?;
    Ok(encode(trace))
}

/// Encodes a trace without checking it (tests use it to make files that break the bounds).
pub(super) fn encode(trace: &Trace) -> Vec<u8> {
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
