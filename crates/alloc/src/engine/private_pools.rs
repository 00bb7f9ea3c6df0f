//! # Private pools: CUDA-graph captures and `torch.cuda.MemPool`
//!
//! A *private pool* is a set of engine pools (one per pool the policy declares) whose blocks
//! are handed out only to allocations directed at it, named by the caller's id (PyTorch's
//! `MempoolId_t`, a pair of integers; `(0, 0)` is the default pools and never private).
//! PyTorch's allocator keeps one for every CUDA graph (`torch.cuda.graph`, `torch.compile`'s
//! CUDA-graph trees) and every `torch.cuda.MemPool`; this module is that, over the engine.
//!
//! Rules (PyTorch's `PrivatePool`, `beginAllocateToPool`, `releasePool`):
//! * **Isolation.** Slot `k` owns the engine pools `n·(k+1) .. n·(k+2)` (`n` = the policy's
//!   pool count). A block never moves between pools, so a private pool's memory serves only
//!   its own allocations, and a graph's addresses stay its own after capture.
//! * **Whole segments, no expandable mappings.** Private pools allocate device segments as
//!   PyTorch's do (`expandable_segments` does not apply to them).
//! * **Use count.** `create_or_incref_pool` and `begin_allocate_to_pool` take a use;
//!   `release_pool` gives one back. A pool with no uses left is *freeable*: `empty_cache`
//!   returns its cached segments to the device, and the pool (its slot) is gone once its last
//!   segment is. Blocks still allocated keep their segment until they are freed.
//! * **While allocating to a pool** (`active > 0`: a capture or a `use_mem_pool` context is
//!   open), no event is queried or recorded, nothing is synchronised and no memory is returned
//!   to the device — each of these would invalidate a stream capture. A block freed then with
//!   uses on other streams waits, unreused, until the last such context ends; then its events
//!   are recorded as usual (PyTorch's `needs_events_deferred_until_no_capture`).
//! * Which streams a pool serves is the caller's business (PyTorch's stream filter): the
//!   caller passes the pool's slot to [`Engine::malloc_in_pool`].
//!
//! Tags ([`super::tags`]) hold their pools in slots of this table, under ids whose first half
//! is `TAG_POOL_ID`; every call here refuses those ids and slots from a caller.
//!
//! Checkpoints ([`Engine::pool_checkpoint`], [`Engine::restore_pool_checkpoint`]) record and
//! restore which blocks of a pool's segments are allocated, for `torch.compile`'s CUDA-graph
//! trees.

use std::collections::HashSet;

use cudamem_device::StreamId;

use super::tags::TAG_POOL_ID;
use super::{Attempt, Engine, Request};
use crate::block::{BlockId, PoolId};
use crate::error::AllocError;
use crate::stats::StatSink;

/// A private pool's name: PyTorch's `MempoolId_t`.
pub type MempoolId = (u64, u64);

/// A private pool's slot in its engine: what [`Engine::malloc_in_pool`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolSlot(pub u16);

#[derive(Debug)]
pub(super) struct PrivatePool {
    pub(super) id: MempoolId,
    /// Captures, `MemPool` objects and `use_mem_pool` contexts using the pool.
    pub(super) use_count: u32,
    /// Device segments the pool holds.
    segments: u32,
    /// A capture or context is allocating to it now.
    recording: bool,
    /// Set by `set_use_on_oom`: the pool's cached blocks serve default-pool allocations that
    /// would otherwise fail (see `pool_sources`).
    pub(super) use_on_oom: bool,
    /// Where the pool's segments come from, if not the engine's device (see `pool_sources`).
    pub(super) segments_from: Option<std::sync::Arc<dyn cudamem_device::Device>>,
}

/// The engine's private pools. See the [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct PrivatePools {
    /// The policy's pool count: slot `k` owns engine pools `base·(k+1) .. base·(k+2)`.
    pub(super) base: u16,
    pub(super) slots: Vec<Option<PrivatePool>>,
    /// Pools marked by `set_no_split`, whether they exist or not (kept for good, as PyTorch's
    /// `no_split_pools`).
    pub(super) no_split: Vec<MempoolId>,
    /// Open captures and pool contexts (PyTorch's `captures_underway`).
    pub(crate) active: u32,
    /// Blocks freed while `active > 0` whose stream events are not recorded yet.
    pub(crate) deferred: Vec<BlockId>,
}

impl PrivatePools {
    pub(crate) fn new(base: usize) -> Self {
        PrivatePools {
            base: base as u16,
            ..Default::default()
        }
    }

    /// Whether engine pool `p` belongs to a private pool.
    #[inline(always)]
    pub(crate) fn is_private(&self, p: PoolId) -> bool {
        p.0 >= self.base
    }

    pub(super) fn slot_of_pool(&self, p: PoolId) -> usize {
        (p.0 / self.base - 1) as usize
    }

    pub(super) fn find(&self, id: MempoolId) -> Option<usize> {
        self.slots.iter().position(|s| s.as_ref().is_some_and(|s| s.id == id))
    }

    fn get(&self, id: MempoolId) -> Result<usize, AllocError> {
        refuse_tag_id(id)?;
        self.find(id)
            .ok_or_else(|| AllocError::InvalidArgument(format!("no private memory pool with id ({}, {})", id.0, id.1)))
    }

    pub(super) fn pool(&mut self, slot: usize) -> &mut PrivatePool {
        self.slots[slot].as_mut().expect("a found slot is occupied")
    }

    /// Counts a segment added to (`+1`) or removed from (`-1`) engine pool `p`, if private.
    #[inline]
    pub(crate) fn count_segment(&mut self, p: PoolId, added: bool) {
        if self.is_private(p) {
            let s = self.slot_of_pool(p);
            let pp = self.pool(s);
            if added {
                pp.segments += 1;
            } else {
                pp.segments -= 1;
            }
        }
    }

    /// The id of the private pool that owns engine pool `p`, if any.
    pub(crate) fn owner(&self, p: PoolId) -> Option<MempoolId> {
        if !self.is_private(p) {
            return None;
        }
        self.slots.get(self.slot_of_pool(p))?.as_ref().map(|s| s.id)
    }

    /// The engine pools of a slot.
    fn pools_of(&self, slot: usize) -> std::ops::Range<u16> {
        let first = self.base * (slot as u16 + 1);
        first..first + self.base
    }
}

/// Which blocks of one segment of a private pool were allocated (a checkpoint's part).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentCheckpoint {
    /// The segment's address.
    pub base: u64,
    /// Its bytes.
    pub size: u64,
    /// `(size, requested)` of each block in address order; `requested` is `None` for a free one.
    pub blocks: Vec<(u64, Option<u64>)>,
}

/// The allocation state of a private pool's segments ([`Engine::pool_checkpoint`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolCheckpoint {
    /// The pool.
    pub pool: MempoolId,
    /// Its segments, by address.
    pub segments: Vec<SegmentCheckpoint>,
}

/// What restoring a checkpoint changed: the pointers it freed, and the `(address, size)` of
/// the allocations it made (a pointer may be in both).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointDelta {
    /// Allocations that the restore freed.
    pub freed: Vec<u64>,
    /// `(address, block size)` of the allocations it made.
    pub allocated: Vec<(u64, u64)>,
}

/// Refuses the ids that tags hold their pools under.
fn refuse_tag_id(id: MempoolId) -> Result<(), AllocError> {
    if id.0 == TAG_POOL_ID {
        return Err(AllocError::InvalidArgument(format!(
            "memory pool ids ({TAG_POOL_ID}, _) are reserved for tags"
        )));
    }
    Ok(())
}

impl<S: StatSink> Engine<S> {
    /// Creates the private pool `id` with one use, or takes one more use of it.
    pub fn create_or_incref_pool(&mut self, id: MempoolId) -> Result<PoolSlot, AllocError> {
        refuse_tag_id(id)?;
        self.take_pool_slot(id)
    }

    /// [`Engine::create_or_incref_pool`] for any id, tags' included.
    pub(crate) fn take_pool_slot(&mut self, id: MempoolId) -> Result<PoolSlot, AllocError> {
        if id == (0, 0) {
            return Err(AllocError::InvalidArgument(
                "memory pool id (0, 0) names the default pools, not a private pool".into(),
            ));
        }
        if let Some(s) = self.private.find(id) {
            self.private.pool(s).use_count += 1;
            return Ok(PoolSlot(s as u16));
        }
        let slot = match self.private.slots.iter().position(Option::is_none) {
            Some(s) => s,
            None => {
                let base = self.private.base as usize;
                let next = self.private.slots.len();
                if base * (next + 2) > u16::MAX as usize {
                    return Err(AllocError::InvalidArgument(format!(
                        "too many private memory pools at once ({next}); release unused CUDA graphs or MemPools"
                    )));
                }
                let specs: Vec<bool> = self.pools[..base].iter().map(|p| p.is_small).collect();
                self.pools.extend(specs.into_iter().map(crate::block::Pool::new));
                self.private.slots.push(None);
                next
            }
        };
        self.private.slots[slot] = Some(PrivatePool {
            id,
            use_count: 1,
            segments: 0,
            recording: false,
            use_on_oom: false,
            segments_from: None,
        });
        Ok(PoolSlot(slot as u16))
    }

    /// Starts directing allocations to pool `id` (a capture or a `use_mem_pool` context): takes
    /// a use of it (creating it if new) and opens a context. See the module's rules.
    pub fn begin_allocate_to_pool(&mut self, id: MempoolId) -> Result<PoolSlot, AllocError> {
        if let Some(s) = self.private.find(id) {
            if self.private.pool(s).recording {
                return Err(AllocError::InvalidArgument(format!(
                    "already allocating to memory pool ({}, {}): end that capture or context first",
                    id.0, id.1
                )));
            }
        }
        let slot = self.create_or_incref_pool(id)?;
        self.private.pool(slot.0 as usize).recording = true;
        self.private.active += 1;
        Ok(slot)
    }

    /// Ends the context of [`Engine::begin_allocate_to_pool`]. The use it took stays until
    /// [`Engine::release_pool`]. When no context is left, deferred frees record their events.
    pub fn end_allocate_to_pool(&mut self, id: MempoolId) -> Result<(), AllocError> {
        let s = self.private.get(id)?;
        let pp = self.private.pool(s);
        if !pp.recording {
            return Err(AllocError::InvalidArgument(format!(
                "not allocating to memory pool ({}, {}): end without a begin",
                id.0, id.1
            )));
        }
        pp.recording = false;
        self.private.active -= 1;
        if self.private.active == 0 {
            for b in std::mem::take(&mut self.private.deferred) {
                self.insert_events(b);
            }
        }
        Ok(())
    }

    /// Gives back one use of pool `id`; with none left its cached memory is released by the
    /// next `empty_cache` (and by an allocation that runs out of memory).
    pub fn release_pool(&mut self, id: MempoolId) -> Result<(), AllocError> {
        let s = self.private.get(id)?;
        let pp = self.private.pool(s);
        if pp.use_count == 0 {
            return Err(AllocError::InvalidArgument(format!(
                "memory pool ({}, {}) released more often than it was used",
                id.0, id.1
            )));
        }
        pp.use_count -= 1;
        Ok(())
    }

    /// The uses of pool `id`, or `None` if there is no such pool.
    pub fn pool_use_count(&self, id: MempoolId) -> Option<u32> {
        self.private
            .find(id)
            .map(|s| self.private.slots[s].as_ref().unwrap().use_count)
    }

    /// Sets `use_on_oom` for pool `id` (`torch.cuda.MemPool(use_on_oom=...)`).
    pub fn set_use_on_oom(&mut self, id: MempoolId, use_on_oom: bool) -> Result<(), AllocError> {
        let s = self.private.get(id)?;
        self.private.pool(s).use_on_oom = use_on_oom;
        Ok(())
    }

    /// Marks pool `id` as never splitting a block (`torch.cuda.MemPool(no_split=True)`): a
    /// request it serves takes the whole free block found, however much larger. As PyTorch's
    /// `setNoSplit`, the mark does not need the pool to exist yet and is never cleared.
    pub fn set_no_split(&mut self, id: MempoolId) -> Result<(), AllocError> {
        refuse_tag_id(id)?;
        if id == (0, 0) {
            return Err(AllocError::InvalidArgument(
                "memory pool id (0, 0) names the default pools, not a private pool: they always split".into(),
            ));
        }
        if !self.private.no_split.contains(&id) {
            self.private.no_split.push(id);
        }
        Ok(())
    }

    /// Whether engine pool `p` belongs to a pool marked by [`Engine::set_no_split`].
    #[inline]
    pub(super) fn is_no_split(&self, p: PoolId) -> bool {
        !self.private.no_split.is_empty()
            && self
                .private
                .owner(p)
                .is_some_and(|id| self.private.no_split.contains(&id))
    }

    /// Whether any capture or pool context is open (then nothing is synchronised or released).
    pub fn allocating_to_pool(&self) -> bool {
        self.private.active > 0
    }

    /// `malloc` from private pool `slot`: the policy's rounding and pool choice, applied to the
    /// slot's pools.
    pub fn malloc_in_pool(&mut self, orig_size: u64, stream: StreamId, slot: PoolSlot) -> Result<u64, AllocError> {
        let s = slot.0 as usize;
        if (self.private.slots.get(s)).is_none_or(|p| p.as_ref().is_none_or(|p| p.id.0 == TAG_POOL_ID)) {
            return Err(AllocError::InvalidArgument(format!(
                "no private memory pool in slot {s}"
            )));
        }
        let offset = self.private.base * (slot.0 + 1);
        match self.try_malloc_in(orig_size, stream, false, offset)? {
            Attempt::Done(p) => Ok(p),
            Attempt::NeedsDeviceRelease => unreachable!("the last resort is not deferred"),
        }
    }

    /// Releases the cached segments of pool `id` (PyTorch `emptyCache(mempool_id)`); the pool
    /// is gone when it has neither uses nor segments left.
    pub fn empty_pool_cache(&mut self, id: MempoolId) -> Result<(), AllocError> {
        self.refuse_release_while_allocating_to_pool()?;
        let s = self.private.get(id)?;
        self.synchronize_and_free_events()?;
        self.release_private_pool(s)
    }

    /// Releases slot `s`'s cached segments, and the slot when nothing of it is left.
    pub(crate) fn release_private_pool(&mut self, s: usize) -> Result<(), AllocError> {
        for p in self.private.pools_of(s) {
            self.release_blocks(PoolId(p))?;
        }
        let pp = self.private.pool(s);
        if pp.use_count == 0 && pp.segments == 0 {
            self.private.slots[s] = None;
        }
        Ok(())
    }

    /// The slots of pools with no uses left (released by `empty_cache`).
    pub(crate) fn freeable_pools(&self) -> Vec<usize> {
        (self.private.slots.iter().enumerate())
            .filter(|(_, p)| p.as_ref().is_some_and(|p| p.use_count == 0))
            .map(|(s, _)| s)
            .collect()
    }

    pub(crate) fn refuse_release_while_allocating_to_pool(&self) -> Result<(), AllocError> {
        if self.private.active > 0 {
            return Err(AllocError::InvalidArgument(
                "cannot release cached memory while a CUDA graph capture or a memory-pool context is \
                 open (it would synchronise, which invalidates the capture): call empty_cache() after it"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The allocated blocks of pool `id`, by address.
    fn allocated_in(&self, s: usize) -> Vec<(u64, BlockId)> {
        let pools = self.private.pools_of(s);
        let mut v: Vec<_> = (self.blocks.iter())
            .filter(|(_, b)| b.allocated && pools.contains(&b.pool.0))
            .map(|(id, b)| (b.addr, id))
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether the allocations of pool `id` are exactly `expected` (PyTorch
    /// `checkPoolLiveAllocations`).
    pub fn check_pool_live_allocations(&self, id: MempoolId, expected: &HashSet<u64>) -> Result<bool, AllocError> {
        let s = self.private.get(id)?;
        let live = self.allocated_in(s);
        Ok(live.len() == expected.len() && live.iter().all(|(a, _)| expected.contains(a)))
    }

    /// The blocks of each segment of slot `s`, in address order.
    fn segment_blocks(&self, s: usize) -> Vec<(u64, u64, Vec<BlockId>)> {
        let pools = self.private.pools_of(s);
        let mut segs: Vec<(u64, u64, crate::block::SegmentId)> = (self.segments.iter())
            .filter(|(_, g)| pools.contains(&g.pool.0))
            .map(|(id, g)| (g.base, g.size, id))
            .collect();
        segs.sort_unstable_by_key(|g| g.0);
        let mut members: Vec<(crate::block::SegmentId, u64, BlockId)> = (self.blocks.iter())
            .filter(|(_, b)| pools.contains(&b.pool.0))
            .map(|(id, b)| (b.segment, b.addr, id))
            .collect();
        members.sort_unstable_by_key(|m| (m.0, m.1));
        segs.into_iter()
            .map(|(base, size, sid)| {
                let ids = members.iter().filter(|m| m.0 == sid).map(|m| m.2).collect();
                (base, size, ids)
            })
            .collect()
    }

    /// Records which blocks of pool `id`'s segments are allocated (PyTorch
    /// `getCheckpointState`). Frees waiting for events count as allocated.
    pub fn pool_checkpoint(&mut self, id: MempoolId) -> Result<PoolCheckpoint, AllocError> {
        let s = self.private.get(id)?;
        let segments = (self.segment_blocks(s).into_iter())
            .map(|(base, size, ids)| SegmentCheckpoint {
                base,
                size,
                blocks: (ids.iter().map(|&b| &self.blocks[b]))
                    .map(|b| (b.size, (!b.is_free()).then_some(b.requested)))
                    .collect(),
            })
            .collect();
        Ok(PoolCheckpoint { pool: id, segments })
    }

    /// Returns pool `cp.pool` to the state of `cp` (PyTorch `setCheckpointPoolState`): frees
    /// every allocation of the pool, then allocates the blocks `cp` says were allocated, at
    /// their addresses. Every segment of `cp` must still be in the pool; segments allocated
    /// after it stay, free. The caller owns the returned allocations.
    pub fn restore_pool_checkpoint(&mut self, cp: &PoolCheckpoint) -> Result<CheckpointDelta, AllocError> {
        let s = self.private.get(cp.pool)?;
        let current = self.segment_blocks(s);
        for seg in &cp.segments {
            let sum: u64 = seg.blocks.iter().map(|b| b.0).sum();
            if sum != seg.size || !current.iter().any(|c| c.0 == seg.base && c.1 == seg.size) {
                return Err(AllocError::InvalidArgument(format!(
                    "checkpoint of memory pool ({}, {}) names a segment at {:#x} that the pool no longer holds",
                    cp.pool.0, cp.pool.1, seg.base
                )));
            }
        }
        let mut delta = CheckpointDelta::default();
        for (addr, b) in self.allocated_in(s) {
            self.blocks[b].stream_uses = None; // a restore forgets pending uses, as PyTorch does
            self.free(addr)?;
            delta.freed.push(addr);
        }
        for seg in &cp.segments {
            // The segment is one free block now (every block of it was freed and merged).
            let Some((_, _, ids)) = self.segment_blocks(s).into_iter().find(|c| c.0 == seg.base) else {
                unreachable!("checked above");
            };
            let &[cur] = ids.as_slice() else {
                return Err(AllocError::InvalidArgument(format!(
                    "segment {:#x} of memory pool ({}, {}) is still in use on another stream; \
                     synchronise before restoring a checkpoint",
                    seg.base, cp.pool.0, cp.pool.1
                )));
            };
            self.remove_free(cur);
            let mut made = Vec::with_capacity(seg.blocks.len());
            for (i, &(size, requested)) in seg.blocks.iter().enumerate() {
                let b = &self.blocks[cur];
                let req = Request {
                    size,
                    stream: b.stream,
                    pool: b.pool,
                    small: self.pool(b.pool).is_small,
                    alloc_size: 0,
                };
                let last = i + 1 == seg.blocks.len();
                let addr = self.alloc_found_block(cur, &req, requested.unwrap_or(size), !last);
                made.push((addr, size, requested.is_some()));
                if !last {
                    self.remove_free(cur); // the remainder, which alloc_found_block cached
                }
            }
            for (addr, size, allocated) in made {
                if allocated {
                    delta.allocated.push((addr, size));
                } else {
                    self.free(addr)?;
                }
            }
        }
        Ok(delta)
    }

    /// The private pool that owns engine pool `p` (for snapshots), if any.
    pub fn pool_owner(&self, p: PoolId) -> Option<MempoolId> {
        self.private.owner(p)
    }
}
