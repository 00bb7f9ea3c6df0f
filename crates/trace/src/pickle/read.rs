//! The reader of PyTorch's snapshot pickles: gzip or plain, run through the pickle VM, then
//! each field checked, with errors that name where in the snapshot they are.

#[allow(unused_imports)]
use super::*;

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

pub(super) fn read_plain_pickle(bytes: &[u8], source: &str) -> Result<Trace, TraceError> {
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
pub(super) struct SErr {
    path: String,
    msg: String,
}

type SR<T> = Result<T, SErr>;

pub(super) fn serr<T>(msg: impl Into<String>) -> SR<T> {
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
pub(super) struct Rd<'x, 'a> {
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
