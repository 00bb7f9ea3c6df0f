//! # Blocks and pools: the bookkeeping every policy shares
//!
//! Vocabulary (used the same way in every module):
//! * A **segment** is memory obtained from the device in one piece: a `malloc`'d range, or the
//!   virtual range of an expandable segment (see [`crate::segment`]).
//! * A **block** is a contiguous byte range of one segment. The blocks of a segment tile it
//!   exactly, linked in address order by `prev`/`next`. A block is either *allocated* (handed to a
//!   caller), *pending* (freed by the caller, waiting for events on other streams), or *free*.
//!   In an expandable segment a free block may also be *unmapped* (no physical pages behind it).
//! * A **pool** holds the free blocks of one size class (PyTorch: small ≤ 1 MiB, large), ordered
//!   by `(stream, size, address)` so that `lower_bound` is best fit on the caller's stream.
//!   Unmapped blocks sit in a second set ordered by `(stream, address)`.
//!
//! Invariants (checked by [`crate::CachingAllocator::check_invariants`]):
//! 1. The blocks of a segment tile it: `b.next.addr == b.addr + b.size`, no gaps, no overlap.
//! 2. A block is in its pool's free set iff it is free and mapped; in the unmapped set iff it is
//!    free and unmapped.
//! 3. Two adjacent free blocks with the same mapped state and no pending events never stay
//!    unmerged after a free completes (PyTorch merges eagerly).
//!
//! Blocks live in an arena and are named by [`BlockId`] (an index), as TensorFlow's BFC allocator
//! names chunks by handle: the metadata stays in safe Rust and lookups are O(1).

use std::collections::BTreeSet;

use cudamem_device::StreamId;

use crate::free_index::FreeIndex;
pub use crate::ids::{AddrKey, BlockId, PoolId, SegmentId, SizeKey};

/// One block. See the module documentation (`block.rs`).
#[derive(Clone, Debug)]
pub struct Block {
    /// Device address of the first byte.
    pub addr: u64,
    /// Bytes (a multiple of 512).
    pub size: u64,
    /// Bytes the caller asked for at this block's last allocation. Kept after the free, and
    /// through merges into this block and splits off it, as PyTorch's block keeps it: torch's
    /// snapshots show it on inactive blocks, and tools read it there. Counts toward
    /// `requested_bytes` only while the block is active.
    pub requested: u64,
    /// The stream the block was allocated on; it is reused only on this stream.
    pub stream: StreamId,
    /// The pool the block returns to.
    pub pool: PoolId,
    /// The segment the block belongs to.
    pub segment: SegmentId,
    /// The block before this one in the segment.
    pub prev: Option<BlockId>,
    /// The block after this one in the segment.
    pub next: Option<BlockId>,
    /// Handed out to a caller and not yet freed.
    pub allocated: bool,
    /// Backed by physical memory (always true outside expandable segments).
    pub mapped: bool,
    /// Events still outstanding before the block may be reused (`record_stream`).
    pub event_count: u32,
    /// Streams other than `stream` that used the block (`record_stream`); boxed because it is
    /// rare and the block record is on every path.
    pub stream_uses: Option<Box<Vec<StreamId>>>,
    /// The pool's `get_free_block` call count when the block became free (for GC age).
    pub gc_count_base: i64,
    /// Stack recorded when the block was last allocated (history), if any.
    pub stack: Option<u32>,
    /// True if this block is in a segment that grows page by page.
    pub expandable: bool,
    /// Counted in `oversize_allocations` when it was handed out (the setting may change later).
    pub oversize: bool,
}

impl Block {
    /// Part of a segment that has been split (has a neighbour).
    #[inline]
    pub fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
    /// Free for reuse: not allocated, no pending events, no foreign stream uses.
    #[inline]
    pub fn is_free(&self) -> bool {
        !self.allocated && self.event_count == 0 && self.stream_uses.is_none()
    }
}

/// Storage of blocks with stable ids and slot reuse.
///
/// A vacant slot keeps the block that last lived there, marked dead in `live`: reading a block
/// then tests no `Option` (every operation reads blocks a few dozen times, so the test and its
/// panic path would be paid on every read). A dead id is a bookkeeping bug: `remove`
/// panics on it, and so does every access in debug builds; in a release build it reads the
/// stale block (wrong, but memory-safe).
///
/// Invariant (what makes reads unchecked): `slots` never shrinks, and the only ids used on an
/// arena are ids it handed out — so every id is in bounds. The arena is private to the crate,
/// and each engine indexes only its own. Reads skip the bounds check, which is on every
/// path (count a replay's instructions under callgrind to see it); debug builds still check.
#[derive(Debug, Default)]
pub(crate) struct BlockArena {
    slots: Vec<Block>,
    /// Whether each slot holds a live block.
    live: Vec<bool>,
    vacant: Vec<u32>,
}

impl BlockArena {
    /// Stores a block and returns its id.
    #[inline(always)]
    pub fn insert(&mut self, b: Block) -> BlockId {
        if let Some(i) = self.vacant.pop() {
            let i = i as usize;
            debug_assert!(i < self.slots.len() && i < self.live.len());
            // SAFETY: `vacant` holds only indices of slots that exist (`remove` pushes the
            // index of a live block; `slots` and `live` never shrink).
            let (slot, live) = unsafe { (self.slots.get_unchecked_mut(i), self.live.get_unchecked_mut(i)) };
            // The vacant slot's `stream_uses` was taken by `remove`: nothing to drop.
            std::mem::forget(std::mem::replace(slot, b));
            *live = true;
            BlockId::new(i as u32)
        } else {
            if self.slots.capacity() == 0 {
                // A device's first block: room for a typical working set at once, instead of
                // doubling from 4 while a program starts (a block is 80 bytes).
                self.slots.reserve(512);
                self.live.reserve(512);
                self.vacant.reserve(512);
            }
            self.slots.push(b);
            self.live.push(true);
            BlockId::new(self.slots.len() as u32 - 1)
        }
    }
    /// Removes a block; its id may be reused. Returns the block's fields (the slot keeps a
    /// copy of them until reused).
    #[inline(always)] // one call per merge; LLVM stops inlining it once the record grows
    pub fn remove(&mut self, id: BlockId) -> Block {
        let i = id.index();
        assert!(std::mem::take(&mut self.live[i]), "removing a dead block");
        self.vacant.push(i as u32);
        let b = &mut self.slots[i];
        Block {
            stream_uses: b.stream_uses.take(),
            ..*b
        }
    }
    /// Iterates over live blocks.
    pub fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> {
        self.slots
            .iter()
            .zip(&self.live)
            .enumerate()
            .filter(|(_, (_, &live))| live)
            .map(|(i, (b, _))| (BlockId::new(i as u32), b))
    }
    /// Whether `id` names a live block (an id of a removed block does not).
    pub fn is_live(&self, id: BlockId) -> bool {
        self.live.get(id.index()).copied().unwrap_or(false)
    }
    /// Number of live blocks.
    pub fn len(&self) -> usize {
        self.slots.len() - self.vacant.len()
    }
}

impl std::ops::Index<BlockId> for BlockArena {
    type Output = Block;
    #[inline]
    fn index(&self, id: BlockId) -> &Block {
        debug_assert!(self.live[id.index()], "dead block id");
        // SAFETY: `id` was handed out by this arena, whose slots never shrink (the type's
        // invariant), so it is in bounds.
        unsafe { self.slots.get_unchecked(id.index()) }
    }
}
impl std::ops::IndexMut<BlockId> for BlockArena {
    #[inline]
    fn index_mut(&mut self, id: BlockId) -> &mut Block {
        debug_assert!(self.live[id.index()], "dead block id");
        // SAFETY: as in `index`.
        unsafe { self.slots.get_unchecked_mut(id.index()) }
    }
}

/// The free blocks of one size class. See the [module documentation](self).
///
/// Aligned to 128 bytes: a pool's counters change on every operation, and the engines of an
/// allocator composed of several (see [`crate::engine::hook`]) are built one after another on
/// one thread, so without it one engine's pools could share a cache line with another's state
/// (false sharing between threads that share nothing).
#[derive(Debug)]
#[repr(align(128))]
pub struct Pool {
    /// Whether the pool's blocks count as `small_pool` in the stats.
    pub is_small: bool,
    /// Free, mapped blocks by `(stream, size, address)`.
    pub blocks: FreeIndex,
    /// Free, unmapped blocks of expandable segments by `(stream, address)`.
    pub unmapped: BTreeSet<AddrKey>,
    /// Calls of `get_free_block`, the clock of garbage collection ages.
    pub get_free_blocks_call_count: i64,
}

impl Pool {
    /// An empty pool.
    pub fn new(is_small: bool) -> Self {
        Pool {
            is_small,
            blocks: FreeIndex::default(),
            unmapped: BTreeSet::new(),
            get_free_blocks_call_count: 0,
        }
    }
    /// The key of a block in the free set.
    #[inline]
    pub fn size_key(id: BlockId, b: &Block) -> SizeKey {
        (b.stream, b.size, b.addr, id)
    }
    /// The key of a block in the unmapped set.
    #[inline]
    pub fn addr_key(id: BlockId, b: &Block) -> AddrKey {
        (b.stream, b.addr, id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(addr: u64) -> Block {
        Block {
            addr,
            size: 512,
            requested: 0,
            stream: StreamId(0),
            pool: PoolId(0),
            segment: SegmentId(0),
            prev: None,
            next: None,
            allocated: false,
            mapped: true,
            event_count: 0,
            stream_uses: Some(Box::new(vec![StreamId(7)])),
            gc_count_base: 0,
            stack: None,
            expandable: false,
            oversize: false,
        }
    }

    #[test]
    fn the_arena_reuses_slots_and_knows_which_are_live() {
        let mut a = BlockArena::default();
        let (x, y) = (a.insert(block(0)), a.insert(block(512)));
        let removed = a.remove(x);
        assert_eq!(removed.addr, 0);
        assert_eq!(
            removed.stream_uses.as_deref(),
            Some(&vec![StreamId(7)]),
            "remove hands back every field"
        );
        assert!(!a.is_live(x) && a.is_live(y) && !a.is_live(BlockId::new(99)));
        assert_eq!(a.len(), 1);
        assert_eq!(a.iter().map(|(id, b)| (id, b.addr)).collect::<Vec<_>>(), vec![(y, 512)]);
        let z = a.insert(block(1024));
        assert_eq!(z, x, "the vacant slot is reused");
        assert_eq!(a[z].addr, 1024);
        assert_eq!(a.len(), 2);
    }

    #[test]
    #[should_panic(expected = "removing a dead block")]
    fn removing_a_removed_block_panics() {
        let mut a = BlockArena::default();
        let x = a.insert(block(0));
        a.remove(x);
        a.remove(x);
    }

    #[test]
    fn the_block_record_stays_small() {
        // Every operation reads and writes block records; keep them to a few cache lines.
        assert_eq!(std::mem::size_of::<Option<BlockId>>(), 4);
        assert!(std::mem::size_of::<Block>() <= 80, "{}", std::mem::size_of::<Block>());
    }
}
