//! The writer of PyTorch's snapshot schema as a pickle, one serializer per level of the
//! schema, so that PyTorch's own tools read what cudamem writes.

#[allow(unused_imports)]
use super::*;

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

pub(super) struct SnapshotSer<'a>(&'a Trace);
pub(super) struct SegmentsSer<'a>(&'a Trace);
pub(super) struct SegmentSer<'a>(&'a Trace, &'a SegmentSnapshot);
pub(super) struct BlockSer<'a>(&'a Trace, &'a BlockSnapshot);
pub(super) struct FramesSer<'a>(Option<&'a Stack>);
pub(super) struct FrameSer<'a>(&'a crate::Frame);
pub(super) struct DeviceTracesSer<'a>(&'a Trace);
pub(super) struct EventsSer<'a>(&'a Trace, Option<&'a DeviceTrace>);
pub(super) struct EventSer<'a>(&'a Trace, &'a TraceEvent);
pub(super) struct SettingsSer<'a>(&'a AllocatorSettings);
pub(super) struct DivisionsSer<'a>(&'a [(u64, u64)]);
pub(super) struct AnnotationsSer<'a>(&'a [Annotation]);
pub(super) struct AnnotationSer<'a>(&'a Annotation);

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
