//! The reader of the compact format: the trailer's hash checked first, then each section
//! bounds-checked, with the guarantees the parent module lists.

#[allow(unused_imports)]
use super::*;

/// A bounds-checked reader over `data[..end]`; every failure names the byte.
pub(super) struct Cur<'a> {
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

pub(super) fn read_compact_unchecked(data: &[u8], source: &str) -> Result<Trace, TraceError> {
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

pub(super) fn parse_sections(data: &[u8], body_end: usize, source: &str) -> CR<Trace> {
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

pub(super) fn read_strings<'a>(c: &mut Cur<'a>) -> CR<Vec<&'a str>> {
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

pub(super) fn string(c: &Cur<'_>, strings: &[&str], at: usize, i: u32) -> CR<String> {
    match strings.get(i as usize) {
        Some(s) => Ok((*s).to_string()),
        None => c.fail(at, format!("string index {i} out of range ({} strings)", strings.len())),
    }
}

pub(super) fn read_stacks(c: &mut Cur<'_>, strings: &[&str]) -> CR<Vec<Stack>> {
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

pub(super) fn stack_ref(c: &Cur<'_>, at: usize, code: u32, n_stacks: usize) -> CR<Option<StackId>> {
    if code == NO_STACK {
        Ok(None)
    } else if (code as usize) < n_stacks {
        Ok(Some(code))
    } else {
        c.fail(at, format!("stack id {code} out of range ({n_stacks} stacks)"))
    }
}

pub(super) fn read_devices(c: &mut Cur<'_>, n_stacks: usize) -> CR<Vec<DeviceTrace>> {
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

pub(super) fn read_segments(c: &mut Cur<'_>, n_stacks: usize) -> CR<Vec<SegmentSnapshot>> {
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

pub(super) fn read_annotations(c: &mut Cur<'_>, strings: &[&str]) -> CR<Vec<Annotation>> {
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

pub(super) fn read_segment_tags(c: &mut Cur<'_>, strings: &[&str], segs: &mut [SegmentSnapshot]) -> CR<()> {
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
