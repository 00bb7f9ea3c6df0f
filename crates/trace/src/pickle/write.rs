//! The writer of PyTorch's snapshot schema as a pickle, one serializer per level of the
//! schema, so that PyTorch's own tools read what cudamem writes.
//!
//! The schema is written once, here, as serde `Serialize` impls: the pickle writer serializes
//! them with serde_pickle, and the Python package turns the same impls into Python objects
//! ([`snapshot_schema`]). For the latter each `frames` list is tagged with its stack's id (see
//! [`STACK_TAG`]), so that one Python list per recorded stack can be shared, as PyTorch's own
//! snapshots share them.

#[allow(unused_imports)]
use super::*;

/// Write `trace` as a PyTorch snapshot pickle (see the module docs for the
/// schema). The trace must pass [`Trace::validate`].
pub fn write_snapshot_pickle(trace: &Trace, out: impl Write) -> Result<(), TraceError> {
    trace.validate()?;
    let mut w = std::io::BufWriter::with_capacity(1 << 16, out);
    let ctx = Ctx {
        t: trace,
        tag_stacks: false,
    };
    serde_pickle::to_writer(&mut w, &SnapshotSer(ctx), SerOptions::new()).map_err(|e| {
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

/// The name of the newtype variant each `frames` list is wrapped in by [`snapshot_schema`]; its
/// variant index is the stack's id (its index in [`Trace::stacks`]).
pub const STACK_TAG: &str = "cudamem.stack";

/// `trace` in PyTorch's snapshot schema as serde values — what [`write_snapshot_pickle`]
/// writes, except that each non-empty `frames` list is the newtype variant [`STACK_TAG`] of the
/// stack's id (a serializer that does not look for it writes a one-key map instead). The trace
/// is not validated.
pub fn snapshot_schema(trace: &Trace) -> impl Serialize + '_ {
    SnapshotSer(Ctx {
        t: trace,
        tag_stacks: true,
    })
}

/// The trace being written, and whether `frames` lists carry their stack's id.
#[derive(Clone, Copy)]
pub(super) struct Ctx<'a> {
    t: &'a Trace,
    tag_stacks: bool,
}

pub(super) struct SnapshotSer<'a>(Ctx<'a>);
pub(super) struct SegmentsSer<'a>(Ctx<'a>);
pub(super) struct SegmentSer<'a>(Ctx<'a>, &'a SegmentSnapshot);
pub(super) struct BlockSer<'a>(Ctx<'a>, &'a BlockSnapshot);
pub(super) struct FramesSer<'a>(Ctx<'a>, Option<StackId>);
pub(super) struct FrameListSer<'a>(&'a [crate::Frame]);
pub(super) struct FrameSer<'a>(&'a crate::Frame);
pub(super) struct DeviceTracesSer<'a>(Ctx<'a>);
pub(super) struct EventsSer<'a>(Ctx<'a>, Option<&'a DeviceTrace>);
pub(super) struct EventSer<'a>(Ctx<'a>, &'a TraceEvent);
pub(super) struct SettingsSer<'a>(&'a AllocatorSettings);
pub(super) struct DivisionsSer<'a>(&'a [(u64, u64)]);
pub(super) struct AnnotationsSer<'a>(&'a [Annotation]);
pub(super) struct AnnotationSer<'a>(&'a Annotation);

impl Serialize for SnapshotSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("segments", &SegmentsSer(self.0))?;
        m.serialize_entry("device_traces", &DeviceTracesSer(self.0))?;
        m.serialize_entry("allocator_settings", &SettingsSer(&self.0.t.settings))?;
        m.serialize_entry("external_annotations", &AnnotationsSer(&self.0.t.annotations))?;
        m.end()
    }
}

impl Serialize for SegmentsSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut q = s.serialize_seq(Some(self.0.t.segments.len()))?;
        for seg in &self.0.t.segments {
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
        m.serialize_entry("frames", &FramesSer(t, g.stack))?;
        struct Blocks<'a>(Ctx<'a>, &'a [BlockSnapshot]);
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
        m.serialize_entry("frames", &FramesSer(self.0, b.stack))?;
        m.end()
    }
}

impl Serialize for FramesSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (ctx, id) = (self.0, self.1);
        match (ctx.t.stack(id), id) {
            (Some(st), Some(i)) if ctx.tag_stacks => {
                s.serialize_newtype_variant(STACK_TAG, i, "frames", &FrameListSer(&st.frames))
            }
            (st, _) => FrameListSer(st.map_or(&[][..], |st| &st.frames[..])).serialize(s),
        }
    }
}

impl Serialize for FrameListSer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let frames = self.0;
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
        let (ctx, t) = (self.0, self.0.t);
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
            q.serialize_element(&EventsSer(ctx, t.device(dev as i32)))?;
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
        let stack = self.0.t.stack(e.stack);
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
            m.serialize_entry("frames", &FramesSer(self.0, e.stack))?;
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
