//! # Compiling a trace into replayable operations
//!
//! [`Program::compile`] turns one device's events into [`Op`]s by the rules of the crate
//! documentation ("How a trace becomes calls"), once, so that the timed loop does no hashing of
//! trace addresses. Beside the ops, the program keeps for each op the trace event it comes from
//! and that event's stack, which the reports use (the timed loop never reads them), and the
//! trace's own figures (peak reserved, device allocations, OOMs) that a replay is compared with.
//!
//! Invariants: `op_events` and `op_stacks` have one entry per op; `Malloc` ops appear in the
//! order of the trace's `alloc` events, one each; every slot a `Free` names was filled by an
//! earlier `Malloc`.

use std::collections::HashMap;

use cudamem_trace::{Action, DeviceTrace, StackId};

/// One replay step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes on `stream` into slot `slot`.
    Malloc {
        /// Requested bytes.
        size: u64,
        /// Stream handle.
        stream: u64,
        /// Slot receiving the address.
        slot: u32,
        /// When `size` does not fit, ask for half as much, down to nothing, instead of failing:
        /// the caller catches the out-of-memory error and makes do with less (cuDNN's
        /// benchmark halves its trial workspace; a plan whose workspace does not fit gives way
        /// to one that needs less). See [`Program::mark_shrinking`].
        shrink: bool,
    },
    /// Free the allocation in `slot`; with `deferred`, its reuse waits for replay stream
    /// `deferred` to complete.
    Free {
        /// Slot to free.
        slot: u32,
        /// Private replay stream whose completion makes the block reusable.
        deferred: Option<u32>,
    },
    /// Complete the replay stream (the trace's `free_completed` of a deferred free).
    Complete {
        /// Replay stream to complete.
        stream: u32,
    },
    /// The job released the cache.
    EmptyCache,
}

/// A device trace compiled into [`Op`]s.
#[derive(Clone, Debug, Default)]
pub struct Program {
    /// Device ordinal.
    pub device: i32,
    /// The steps.
    pub ops: Vec<Op>,
    /// For each op, the index of the trace event it comes from (for `EmptyCache`, the first
    /// release entry of its run).
    pub op_events: Vec<u32>,
    /// For each op, the stack of that event (`None` for `EmptyCache`).
    pub op_stacks: Vec<Option<StackId>>,
    /// Number of slots: the most allocations live at once (a freed allocation's slot is
    /// reused, last freed first, so that the replay's own table stays small and warm in the
    /// cache instead of growing by one slot per allocation of the trace).
    pub slots: u32,
    /// Number of private replay streams (deferred frees).
    pub deferred_streams: u32,
    /// Trace events counted as operations (allocs and frees).
    pub trace_ops: u64,
    /// Addresses of the trace's `segment_alloc` entries, in order.
    pub segment_addresses: Vec<u64>,
    /// `oom` entries in the trace.
    pub trace_ooms: u64,
    /// Peak of the running sum of the trace's segment entries (bytes reserved as recorded).
    pub trace_peak_reserved: u64,
    /// Number of the trace's `segment_alloc` + `segment_map` entries.
    pub trace_device_allocs: u64,
    /// Frees whose allocation the trace does not contain (recorded before history started).
    pub unmatched_frees: u64,
    /// Allocations of an address that was still live (the trace lost its free).
    pub double_allocs: DoubleAllocs,
    /// Whether deferred frees wait for their `free_completed` (see `ReplayOptions`).
    pub deferred_frees: bool,
}

/// Allocations at an address the trace had already allocated and not freed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DoubleAllocs {
    /// How many.
    pub count: u64,
    /// The first: its address, its event index, and the event index of the allocation that
    /// was still live there.
    pub first: Option<(u64, usize, usize)>,
}

impl Program {
    /// Compiles one device's events.
    pub fn compile(dt: &DeviceTrace) -> Program {
        let ev = &dt.events;
        let mut p = Program {
            device: dt.device,
            deferred_frees: true,
            ..Program::default()
        };
        let mut live: HashMap<u64, u32> = HashMap::new();
        let mut vacant: Vec<u32> = Vec::new();
        // Per slot, the event index of the allocation that holds it (to name it in a double
        // allocation).
        let mut slot_event: Vec<usize> = Vec::new();
        // Deferred frees waiting for their free_completed: address -> replay stream.
        let mut pending: HashMap<u64, u32> = HashMap::new();
        let (mut reserved, mut in_release_run) = (0i64, false);
        for (i, e) in ev.iter().enumerate() {
            let is_release = matches!(e.action, Action::SegmentFree | Action::SegmentUnmap);
            if is_release && !in_release_run {
                p.push(Op::EmptyCache, i, None);
            }
            in_release_run = is_release || (in_release_run && matches!(e.action, Action::Snapshot));
            match e.action {
                Action::Alloc => {
                    let slot = vacant.pop().unwrap_or_else(|| {
                        p.slots += 1;
                        p.slots - 1
                    });
                    // An address allocated twice without a free between (a free the trace
                    // lost) leaves the first slot occupied: its allocation lives to the end.
                    if let Some(old) = live.insert(e.addr, slot) {
                        let d = &mut p.double_allocs;
                        d.count += 1;
                        if d.first.is_none() {
                            d.first = Some((e.addr, i, slot_event[old as usize]));
                        }
                    }
                    if slot_event.len() <= slot as usize {
                        slot_event.resize(slot as usize + 1, 0);
                    }
                    slot_event[slot as usize] = i;
                    let op = Op::Malloc {
                        size: e.size,
                        stream: e.stream,
                        slot,
                        shrink: false,
                    };
                    p.push(op, i, e.stack);
                    p.trace_ops += 1;
                }
                Action::FreeRequested => {
                    p.trace_ops += 1;
                    let Some(slot) = live.remove(&e.addr) else {
                        p.unmatched_frees += 1;
                        continue;
                    };
                    vacant.push(slot);
                    let immediate = ev
                        .get(i + 1)
                        .is_some_and(|n| n.action == Action::FreeCompleted && n.addr == e.addr);
                    let deferred = if immediate {
                        None
                    } else {
                        let s = p.deferred_streams;
                        p.deferred_streams += 1;
                        pending.insert(e.addr, s);
                        Some(s)
                    };
                    p.push(Op::Free { slot, deferred }, i, e.stack);
                }
                Action::FreeCompleted => {
                    if let Some(s) = pending.remove(&e.addr) {
                        p.push(Op::Complete { stream: s }, i, e.stack);
                    }
                }
                Action::SegmentAlloc | Action::SegmentMap => {
                    if e.action == Action::SegmentAlloc {
                        p.segment_addresses.push(e.addr);
                    }
                    p.trace_device_allocs += 1;
                    reserved += e.size as i64;
                    p.trace_peak_reserved = p.trace_peak_reserved.max(reserved.max(0) as u64);
                }
                Action::SegmentFree | Action::SegmentUnmap => reserved -= e.size as i64,
                Action::Oom => p.trace_ooms += 1,
                Action::Snapshot | Action::Annotate => {}
            }
        }
        p
    }

    /// Makes the allocations whose stack is one of `stacks` shrink when they do not fit
    /// ([`Op::Malloc`]'s `shrink`); returns how many there are.
    pub fn mark_shrinking(&mut self, stacks: &[StackId]) -> usize {
        let mut n = 0;
        if stacks.is_empty() {
            return n;
        }
        for (op, stack) in self.ops.iter_mut().zip(&self.op_stacks) {
            if let (Op::Malloc { shrink, .. }, Some(s)) = (op, stack) {
                if stacks.contains(s) {
                    *shrink = true;
                    n += 1;
                }
            }
        }
        n
    }

    fn push(&mut self, op: Op, event: usize, stack: Option<StackId>) {
        self.ops.push(op);
        self.op_events.push(event as u32);
        self.op_stacks.push(stack);
    }
}

#[cfg(test)]
mod tests {
    use cudamem_trace::{Action, DeviceTrace, TraceEvent};

    use super::*;

    fn ev(action: Action, addr: u64) -> TraceEvent {
        TraceEvent {
            action,
            addr,
            size: 512,
            stream: 0,
            time_us: 0,
            stack: None,
        }
    }

    fn slot_of(op: &Op) -> u32 {
        match *op {
            Op::Malloc { slot, .. } | Op::Free { slot, .. } => slot,
            _ => panic!("not a malloc or free: {op:?}"),
        }
    }

    #[test]
    fn a_freed_slot_is_reused_and_slots_count_the_most_live() {
        use Action::{Alloc, FreeCompleted as Done, FreeRequested as Free};
        let events = [
            ev(Alloc, 0x1000),
            ev(Alloc, 0x2000),
            ev(Free, 0x1000),
            ev(Done, 0x1000),
            ev(Alloc, 0x3000), // takes 0x1000's slot
            ev(Alloc, 0x4000), // a new slot: two are live
            // 0x2000 allocated again without a free: its first slot stays occupied.
            ev(Alloc, 0x2000),
            ev(Free, 0x2000),
            ev(Done, 0x2000),
        ];
        let p = Program::compile(&DeviceTrace {
            device: 0,
            events: events.to_vec(),
        });
        let slots: Vec<u32> = p.ops.iter().map(slot_of).collect();
        // Ops: malloc a, malloc b, free a, malloc c, malloc d, malloc b', free b'.
        assert_eq!(slots, vec![0, 1, 0, 0, 2, 3, 3]);
        assert_eq!(p.slots, 4, "never more than four slots held at once");
        assert_eq!(p.trace_ops, 7);
    }

    #[test]
    fn an_address_allocated_twice_is_counted_with_its_events() {
        use Action::{Alloc, FreeCompleted as Done, FreeRequested as Free};
        let events = [ev(Alloc, 0x1000), ev(Alloc, 0x2000), ev(Free, 0x2000), ev(Done, 0x2000)];
        let p = Program::compile(&DeviceTrace {
            device: 0,
            events: events.to_vec(),
        });
        assert_eq!(
            p.double_allocs,
            DoubleAllocs::default(),
            "a freed address is not a double"
        );
        let events = [
            ev(Alloc, 0x1000),
            ev(Alloc, 0x2000),
            ev(Alloc, 0x1000),
            ev(Alloc, 0x1000),
        ];
        let p = Program::compile(&DeviceTrace {
            device: 0,
            events: events.to_vec(),
        });
        assert_eq!(p.double_allocs.count, 2);
        assert_eq!(p.double_allocs.first, Some((0x1000, 2, 0)));
    }
}
