//! # Snapshots in PyTorch's schema
//!
//! [`Engine::snapshot`] returns the allocator's state and history as a [`Trace`] — the model of
//! `torch.cuda.memory._snapshot()`: `segments` with their blocks and states, `device_traces` from
//! the history ring, `allocator_settings`, interned stacks and annotations. Written with
//! `cudamem_trace::write_snapshot_pickle`, it opens in PyTorch's `torch.cuda._memory_viz` and in
//! `cudamem viz`.
//!
//! As in PyTorch, an expandable segment is reported as one segment per contiguous mapped range,
//! and taking a snapshot records a `snapshot` history entry whose size is the active bytes.
//!
//! The segments of a tag carry its name (`tag`) and whether it is asleep (`asleep`). A sleeping
//! tag's ranges are listed with the blocks they held, as they were when it went to sleep (so
//! its live blocks stay in their segments), though nothing is mapped there now: a reader that
//! sums reserved memory skips them.

use cudamem_trace_types::{
    AllocatorSettings, Annotation, BlockSnapshot, BlockState, DeviceTrace, SegmentSnapshot, SegmentType, Trace,
    TraceEvent,
};

use crate::block::{Block, BlockId};
use crate::engine::Engine;
use crate::history::Action;

fn state(b: &Block) -> BlockState {
    if b.allocated {
        BlockState::ActiveAllocated
    } else if !b.is_free() {
        BlockState::ActivePendingFree
    } else {
        BlockState::Inactive
    }
}

/// The snapshot's `allocator_settings` for a configuration (PyTorch's keys and encodings:
/// `max_split_size` -1 when unlimited, `roundup_power2_divisions` by interval start in MiB).
pub fn settings_of(cfg: &crate::config::AllocatorConfig) -> AllocatorSettings {
    AllocatorSettings {
        conf: cfg.settings.clone(),
        max_split_size: if cfg.max_split_size == u64::MAX {
            -1
        } else {
            cfg.max_split_size as i64
        },
        garbage_collection_threshold: cfg.garbage_collection_threshold,
        expandable_segments: cfg.expandable_segments,
        roundup_power2_divisions: (0..cfg.roundup_power2_divisions.len())
            .map(|i| (1u64 << i, cfg.roundup_power2_divisions[i]))
            .collect(),
        release_lock_on_cudamalloc: cfg.release_lock_on_cudamalloc,
        pinned_num_register_threads: cfg.pinned_num_register_threads as i64,
        pinned_use_cuda_host_register: cfg.pinned_use_cuda_host_register,
        graph_capture_record_stream_reuse: cfg.graph_capture_record_stream_reuse,
    }
}

impl<S: crate::stats::StatSink> Engine<S> {
    /// The allocator's state and recorded history, in PyTorch's snapshot schema.
    pub fn snapshot(&mut self) -> Trace {
        let device = self.device.index();
        let mut segments = Vec::new();
        for (sid, seg) in self.segments.iter() {
            let head = self
                .blocks
                .iter()
                .find(|(_, b)| b.segment == sid && b.prev.is_none())
                .map(|(id, _)| id);
            let mut cur: Option<BlockId> = head;
            let mut open: Option<SegmentSnapshot> = None;
            while let Some(id) = cur {
                let b = &self.blocks[id];
                cur = b.next;
                if !b.mapped {
                    segments.extend(open.take());
                    continue;
                }
                let s = open.get_or_insert_with(|| SegmentSnapshot {
                    device,
                    address: b.addr,
                    stream: seg.stream.0,
                    segment_type: if self.pools[seg.pool.0 as usize].is_small {
                        SegmentType::Small
                    } else {
                        SegmentType::Large
                    },
                    pool_id: match self.private.owner(seg.pool) {
                        Some((a, b)) => (a as i64, b as i64),
                        None => (0, 0),
                    },
                    is_expandable: seg.is_expandable(),
                    stack: seg.stack,
                    tag: self.pool_tag_state(seg.pool).map(|(t, _)| t.to_string()),
                    asleep: self.pool_tag_state(seg.pool).is_some_and(|(_, a)| a),
                    ..SegmentSnapshot::default()
                });
                let st = state(b);
                s.total_size += b.size;
                if st == BlockState::ActiveAllocated {
                    s.allocated_size += b.size;
                }
                if st != BlockState::Inactive {
                    s.active_size += b.size;
                    s.requested_size += b.requested;
                }
                s.blocks.push(BlockSnapshot {
                    address: b.addr,
                    size: b.size,
                    requested_size: b.requested,
                    state: st,
                    stack: if st == BlockState::Inactive { None } else { b.stack },
                });
            }
            segments.extend(open);
        }
        segments.sort_by_key(|s| s.address);
        let active: u64 = segments.iter().map(|s| s.active_size).sum();
        if self.history.enabled {
            self.history.push(Action::Snapshot, 0, active, 0, None);
        }
        let events = self
            .history
            .entries
            .iter()
            .map(|e| TraceEvent {
                action: e.action,
                addr: e.addr,
                size: e.size,
                stream: e.stream,
                time_us: e.time_us,
                stack: e.stack,
            })
            .collect();
        let settings = settings_of(&self.config);
        let annotations = self
            .history
            .annotations
            .iter()
            .map(|(t, stage, name)| Annotation {
                device,
                stage: stage.clone(),
                name: name.clone(),
                time_us: *t,
            })
            .collect();
        Trace {
            source: format!("cudamem snapshot of {}", self.device.name()),
            devices: vec![DeviceTrace { device, events }],
            segments,
            settings,
            stacks: self.history.stacks.clone(),
            annotations,
        }
    }

    /// Starts or stops recording history (PyTorch's `_record_memory_history`): `max_entries`
    /// bounds the ring (PyTorch keeps one entry unless recording is "all"); stopping clears it.
    pub fn record_memory_history(&mut self, enabled: bool, context: crate::history::RecordContext, max_entries: usize) {
        self.history.enabled = enabled;
        self.history.context = if enabled {
            context
        } else {
            crate::history::RecordContext::Never
        };
        self.history.max_entries = max_entries.max(1);
        if !enabled {
            self.history.entries.clear();
        }
        while self.history.entries.len() > self.history.max_entries {
            self.history.entries.pop_front();
        }
    }

    /// Sets the stack attached to the events of the next calls (the Python package passes the
    /// Python frames of each allocation; `None` clears it).
    pub fn set_current_stack(&mut self, frames: Option<Vec<cudamem_trace_types::Frame>>) {
        self.current_stack = frames.map(|f| self.history.intern(f));
    }

    /// Records a user annotation (`torch.cuda.memory._annotate` / a profiler range):
    /// `stage` is `START` or `END`.
    pub fn annotate(&mut self, stage: &str, name: &str) {
        if self.history.enabled {
            let t = self.history.now_us();
            self.history.annotations.push((t, stage.to_string(), name.to_string()));
            self.history.push(Action::Annotate, 0, 0, 0, None);
        }
    }
}
