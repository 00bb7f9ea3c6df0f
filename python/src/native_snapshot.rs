//! # Snapshots for the native class's `snapshot()`
//!
//! The records the C++ side turns into c10's `SegmentInfo` and `BlockInfo`: every device's
//! segments (cudamem's merged snapshot), each followed by its blocks in address order. The
//! callbacks run after every allocator lock is given back, because they build torch objects.

use std::ffi::{c_int, c_void};

use crate::abi::{BlockRecord, BlockSink, SegmentRecord, SegmentSink};
use crate::guard::run;
use crate::history;

/// `(ctx, on_segment, on_block) -> kind`: the table's `snapshot`.
pub(crate) unsafe extern "C" fn nat_snapshot(ctx: *mut c_void, on_segment: SegmentSink, on_block: BlockSink) -> c_int {
    let mut trace = None;
    let kind = run("snapshot", || {
        trace = Some(history::snapshot_trace(None)?);
        Ok(())
    });
    // The callbacks run after every lock is given back (they build torch objects).
    for seg in trace.iter().flat_map(|t| &t.segments) {
        let r = SegmentRecord {
            device: seg.device,
            is_large: (seg.segment_type != cudamem_trace::SegmentType::Small) as c_int,
            is_expandable: seg.is_expandable as c_int,
            address: seg.address,
            total_size: seg.total_size,
            requested_size: seg.requested_size,
            allocated_size: seg.allocated_size,
            active_size: seg.active_size,
            stream: seg.stream,
            pool_a: seg.pool_id.0 as u64,
            pool_b: seg.pool_id.1 as u64,
        };
        // SAFETY: the caller's callbacks take any record for the duration of the call.
        unsafe { on_segment(ctx, &r) };
        for b in &seg.blocks {
            let r = BlockRecord {
                size: b.size,
                requested_size: b.requested_size,
                allocated: (b.state == cudamem_trace::BlockState::ActiveAllocated) as c_int,
                active: (b.state != cudamem_trace::BlockState::Inactive) as c_int,
            };
            unsafe { on_block(ctx, &r) };
        }
    }
    kind
}
