//! Methods of [`Trace`] that read it (counts, peaks, streams, validation) and its printable
//! summary. None changes a trace.

use std::fmt;

use crate::*;

/// Counts and ranges of a trace, for printing.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TraceSummary {
    /// [`Trace::source`].
    pub source: String,
    /// Device ordinals with events.
    pub devices: Vec<i32>,
    /// Total number of events.
    pub events: u64,
    /// Events per action, in [`Action::ALL`] order, zero counts omitted.
    pub by_action: Vec<(Action, u64)>,
    /// Distinct streams seen in events, sorted.
    pub streams: Vec<u64>,
    /// Number of interned stacks.
    pub stacks: usize,
    /// Number of snapshot segments.
    pub segments: usize,
    /// Number of snapshot blocks.
    pub blocks: usize,
    /// Earliest and latest event time, if any event.
    pub time_range_us: Option<(i64, i64)>,
}

impl fmt::Display for TraceSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "trace {}", self.source)?;
        writeln!(f, "  devices: {:?}", self.devices)?;
        writeln!(f, "  events: {}", self.events)?;
        for (a, n) in &self.by_action {
            writeln!(f, "    {:<15} {}", a.as_str(), n)?;
        }
        writeln!(f, "  streams: {:?}", self.streams)?;
        writeln!(f, "  stacks: {}", self.stacks)?;
        writeln!(f, "  segments: {} ({} blocks)", self.segments, self.blocks)?;
        if let Some((a, b)) = self.time_range_us {
            writeln!(f, "  time: {} us .. {} us ({} us)", a, b, b.saturating_sub(a))?;
        }
        Ok(())
    }
}

impl Trace {
    /// An empty trace named `source`.
    pub fn new(source: impl Into<String>) -> Trace {
        Trace {
            source: source.into(),
            ..Trace::default()
        }
    }

    /// The events of `device`, if it has any.
    pub fn device(&self, device: i32) -> Option<&DeviceTrace> {
        self.devices.iter().find(|d| d.device == device)
    }

    /// All events of all devices (device by device).
    pub fn events(&self) -> impl Iterator<Item = &TraceEvent> {
        self.devices.iter().flat_map(|d| d.events.iter())
    }

    /// Number of events on all devices.
    pub fn num_events(&self) -> usize {
        self.devices.iter().map(|d| d.events.len()).sum()
    }

    /// Number of events with `action`, over all devices.
    pub fn count(&self, action: Action) -> usize {
        self.events().filter(|e| e.action == action).count()
    }

    /// Number of events with `action` on `device`.
    pub fn count_on(&self, device: i32, action: Action) -> usize {
        self.device(device)
            .map_or(0, |d| d.events.iter().filter(|e| e.action == action).count())
    }

    /// The stack `id` refers to (None for `None` or an out-of-range id).
    pub fn stack(&self, id: Option<StackId>) -> Option<&Stack> {
        id.and_then(|i| self.stacks.get(i as usize))
    }

    /// Peak of the reserved memory implied by the segment events of `device`,
    /// and the number of segments obtained from CUDA.
    ///
    /// Returns `(peak, allocs)`: `peak` is the maximum of the running sum of
    /// `segment_alloc`/`segment_map` sizes (+) and `segment_free`/
    /// `segment_unmap` sizes (−), starting at 0 (segments that existed before
    /// recording started are not known, so the sum can go below 0 when they
    /// are freed; the peak is never below 0); `allocs` counts
    /// `segment_alloc` + `segment_map` events.
    pub fn segment_history_peak(&self, device: i32) -> (u64, u64) {
        let Some(d) = self.device(device) else {
            return (0, 0);
        };
        let mut cur: i128 = 0;
        let mut peak: i128 = 0;
        let mut allocs = 0u64;
        for e in &d.events {
            match e.action {
                Action::SegmentAlloc | Action::SegmentMap => {
                    cur += e.size as i128;
                    allocs += 1;
                }
                Action::SegmentFree | Action::SegmentUnmap => cur -= e.size as i128,
                _ => {}
            }
            peak = peak.max(cur);
        }
        (peak.min(u64::MAX as i128) as u64, allocs)
    }

    /// Addresses of the `segment_alloc` events of `device`, in trace order.
    pub fn segment_alloc_addresses(&self, device: i32) -> Vec<u64> {
        self.device(device).map_or_else(Vec::new, |d| {
            d.events
                .iter()
                .filter(|e| e.action == Action::SegmentAlloc)
                .map(|e| e.addr)
                .collect()
        })
    }

    /// Distinct streams used by the events of `device`, sorted.
    pub fn streams(&self, device: i32) -> Vec<u64> {
        let mut s: Vec<u64> = self
            .device(device)
            .map_or_else(Vec::new, |d| d.events.iter().map(|e| e.stream).collect());
        s.sort_unstable();
        s.dedup();
        s
    }

    /// Counts and ranges, for printing.
    pub fn summary(&self) -> TraceSummary {
        let mut counts = [0u64; Action::ALL.len()];
        let mut streams = Vec::new();
        let mut range: Option<(i64, i64)> = None;
        for e in self.events() {
            counts[e.action.code() as usize] += 1;
            streams.push(e.stream);
            range = Some(match range {
                None => (e.time_us, e.time_us),
                Some((a, b)) => (a.min(e.time_us), b.max(e.time_us)),
            });
        }
        streams.sort_unstable();
        streams.dedup();
        TraceSummary {
            source: self.source.clone(),
            devices: self.devices.iter().map(|d| d.device).collect(),
            events: counts.iter().sum(),
            by_action: Action::ALL
                .iter()
                .zip(counts)
                .filter(|(_, n)| *n > 0)
                .map(|(a, n)| (*a, n))
                .collect(),
            streams,
            stacks: self.stacks.len(),
            segments: self.segments.len(),
            blocks: self.segments.iter().map(|s| s.blocks.len()).sum(),
            time_range_us: range,
        }
    }

    /// The error for a device ordinal outside `0..=MAX_DEVICE_ORDINAL`.
    fn ordinal_error(&self, at: String, device: i32) -> TraceError {
        TraceError::new(
            &self.source,
            ErrorKind::Invalid,
            Location::Entry(at),
            format!("device ordinal {device} is outside 0..={MAX_DEVICE_ORDINAL}"),
        )
    }

    /// Checks the invariants every reader guarantees: stack ids in range, devices sorted and
    /// unique, device ordinals within `0..=MAX_DEVICE_ORDINAL`. Writers call it before writing.
    pub fn validate(&self) -> Result<(), TraceError> {
        let n = self.stacks.len();
        let bad = |what: String| {
            TraceError::new(
                &self.source,
                ErrorKind::Invalid,
                Location::Entry(what),
                "stack id out of range",
            )
        };
        let ok = |s: Option<StackId>| !matches!(s, Some(i) if i as usize >= n);
        for (di, d) in self.devices.iter().enumerate() {
            if di > 0 && self.devices[di - 1].device >= d.device {
                return Err(TraceError::new(
                    &self.source,
                    ErrorKind::Invalid,
                    Location::Entry(format!("devices[{di}]")),
                    "devices must be sorted by device ordinal without repeats",
                ));
            }
            if d.device < 0 {
                return Err(TraceError::new(
                    &self.source,
                    ErrorKind::Invalid,
                    Location::Entry(format!("devices[{di}]")),
                    "negative device ordinal",
                ));
            }
            if d.device > MAX_DEVICE_ORDINAL {
                return Err(self.ordinal_error(format!("devices[{di}]"), d.device));
            }
            for (i, e) in d.events.iter().enumerate() {
                if !ok(e.stack) {
                    return Err(bad(format!("devices[{di}].events[{i}]")));
                }
            }
        }
        for (si, s) in self.segments.iter().enumerate() {
            if !ok(s.stack) {
                return Err(bad(format!("segments[{si}]")));
            }
            if !(0..=MAX_DEVICE_ORDINAL).contains(&s.device) {
                return Err(self.ordinal_error(format!("segments[{si}]"), s.device));
            }
            for (bi, b) in s.blocks.iter().enumerate() {
                if !ok(b.stack) {
                    return Err(bad(format!("segments[{si}].blocks[{bi}]")));
                }
            }
        }
        for (ai, a) in self.annotations.iter().enumerate() {
            if !(0..=MAX_DEVICE_ORDINAL).contains(&a.device) {
                return Err(self.ordinal_error(format!("external_annotations[{ai}]"), a.device));
            }
        }
        Ok(())
    }
}
