//! # The engine: PyTorch's caching-allocator algorithm over [`Block`]s, driven by a [`Policy`]
//!
//! [`Engine`] is the state of one device's allocator and the algorithm that changes it. It is not
//! thread-safe by itself; [`crate::CachingAllocator`] owns it behind a mutex, so every method here
//! takes `&mut self` and "a public call never calls another public call" holds by construction.
//!
//! ## malloc (PyTorch `DeviceCachingAllocator::malloc`)
//! 1. Complete what finished: query outstanding events, free blocks whose events all completed.
//! 2. Round the request, choose its pool, and look for the best cached fit on the same stream.
//! 3. No fit: garbage-collect (only with a memory fraction and a GC threshold), then get device
//!    memory (a segment, or pages of an expandable segment), then — on failure — reclaim free
//!    pages from holes and retry (only if the policy says so, see `engine/reclaim.rs`), release
//!    oversize cached blocks and retry, then synchronise, release every unsplit cached block and
//!    retry.
//! 4. Still nothing: record an `oom` event and return [`AllocError::OutOfMemory`].
//! 5. Split the block if the policy says so; hand out the front part.
//!
//! ## free
//! The block stops counting as allocated at once. If other streams used it (`record_stream`),
//! an event is recorded on each and the block stays *pending* until all complete; then (or at once
//! when there were none) it is merged with free neighbours and returned to its pool.
//!
//! ## Stats and history
//! Every change of a stat happens next to the state change it describes, once; every history
//! entry is emitted through [`Engine::trace`].
//!
//! ## Where each part lives
//! This file: the engine's state and malloc (the fallback ladder, best fit, splitting).
//! `engine/bookkeeping.rs`: stat updates, history entries, pool lookups. `engine/expandable.rs`: segments
//! that grow by mapping pages. `engine/free.rs`: free and merge. `engine/events.rs`: streams and events.
//! `engine/release.rs`: returning cached memory. `engine/settings.rs`: the memory fraction and read-only
//! views. `engine/private_pools.rs`: CUDA-graph and `MemPool` pools. `engine/tags.rs`: sleep and wake.
//! `engine/grow.rs`: device memory for a miss, and out of memory. `engine/reclaim.rs`: free
//! pages moved to where a growth needs them.
//! `engine/hook.rs`: what an allocator composed of several engines may use (its whole interface
//! to them).

use std::collections::VecDeque;
use std::sync::Arc;

use cudamem_device::{Device, EventId, StreamId};

use crate::block::{BlockArena, BlockId, Pool, PoolId};
use crate::config::AllocatorConfig;
use crate::error::AllocError;
use crate::history::{Action, History};
use crate::policy::{Dispatch, Policy};
use crate::segment::{Backing, Segment, SegmentTable};
use crate::stats::{Array, DeviceStats, NoSink, StatSink, OVERSIZE_ALLOCATIONS, OVERSIZE_SEGMENTS};

mod bookkeeping;
mod events;
mod expandable;
mod free;
mod grow;
pub mod hook;
mod ipc;
mod observer;
mod pool_sources;
mod private_pools;
mod reclaim;
mod release;
mod settings;
mod tags;
pub use ipc::Shared;
pub use observer::{TraceEvent, TraceObserver};
pub use private_pools::{CheckpointDelta, MempoolId, PoolCheckpoint, PoolSlot, SegmentCheckpoint};
pub use tags::{sleep_annotation, SleepStats, TagId, TagInfo, MAX_TAG_LEN};

/// Requests of this size or more are refused outright, as PyTorch does.
pub const ONE_EXABYTE: u64 = 1 << 60;

/// What a search for a block needs to know (PyTorch's `AllocParams`).
#[derive(Clone, Copy, Debug)]
struct Request {
    size: u64,
    stream: StreamId,
    pool: PoolId,
    /// Whether `pool` counts as `small_pool` in the stats.
    small: bool,
    /// Device bytes to get on a miss (0 until [`Engine::with_alloc_size`]: a cache hit never
    /// needs it, and asking the policy costs a call).
    alloc_size: u64,
}

/// What a `malloc` that may leave its last resort to the caller came to (see [`hook`]).
#[derive(Debug)]
pub enum Attempt {
    /// Allocated (or size 0).
    Done(u64),
    /// Everything short of releasing the device's whole cache failed.
    NeedsDeviceRelease,
}

/// The allocator state of one device. See the module documentation (`engine.rs`). `S` hears of
/// every change of a per-pool stat value (see [`StatSink`] and [`hook`]); the default hears
/// nothing.
#[derive(Debug)]
pub struct Engine<S: StatSink = NoSink> {
    pub(crate) device: Arc<dyn Device>,
    pub(crate) policy: Dispatch,
    pub(crate) config: AllocatorConfig,
    pub(crate) blocks: BlockArena,
    pub(crate) pools: Vec<Pool>,
    pub(crate) segments: SegmentTable,
    /// Allocated blocks by address: the pointers callers hold.
    pub(crate) allocated: crate::pointer_map::PointerMap,
    /// Outstanding events per stream, in record order.
    events: Vec<(StreamId, VecDeque<(EventId, BlockId)>)>,
    /// The stats, except that `active` and `active_bytes` are stale while
    /// `active_is_allocation`, and every array's `all` but its peak while the sink hears
    /// nothing: read them through [`Engine::stats`].
    pub(crate) stats: DeviceStats,
    /// True while no block has waited for events (since the engine began): every active block
    /// is then allocated, so `active` and `active_bytes` equal `allocation` and
    /// `allocated_bytes` field for field (the same changes at the same moments, the same
    /// resets) and are not updated: 4 of the 13 or so stat-array updates of a pair. The
    /// first `free` of a block used on other streams copies them and ends this for good.
    /// Always false when the sink hears changes.
    active_is_allocation: bool,
    /// Bytes obtained from the device (segments and mapped pages).
    total_allocated_memory: u64,
    /// The per-process limit, when a memory fraction is set.
    pub(crate) allowed_memory_maximum: Option<u64>,
    pub(crate) history: History,
    /// Stack to attach to the events of the current call.
    pub(crate) current_stack: Option<u32>,
    /// The most memory ever obtained from the device (not reset by `reset_peak_memory_stats`).
    reclaim_watermark: u64,
    /// Hears every change of a per-pool value: each goes through [`Engine::stat_up`],
    /// [`Engine::stat_down`] or [`Engine::stat_change`], or tells it beside the oversize
    /// counters' changes.
    pub(crate) sink: S,
    /// CUDA-graph and `MemPool` pools (see [`private_pools`]).
    pub(crate) private: private_pools::PrivatePools,
    /// Tagged pools, which can sleep and wake (see [`tags`]).
    pub(crate) tags: tags::Tags,
    /// Hears every event (see [`observer`]).
    pub(crate) observer: observer::Observer,
}

/// [`Engine::pool`], mutable, from the pools alone (beside a borrow of the blocks).
#[inline(always)]
fn pool_mut(pools: &mut [Pool], p: PoolId) -> &mut Pool {
    debug_assert!((p.0 as usize) < pools.len());
    // SAFETY: as in `Engine::pool`: `p` indexes the engine's pools.
    unsafe { pools.get_unchecked_mut(p.0 as usize) }
}

/// The number of array `a`'s small-pool (`2a`) or large-pool (`2a + 1`) value, as
/// [`DeviceStats::pool_value`] numbers them.
#[inline]
const fn pool_value_index(a: Array, small: bool) -> usize {
    2 * a as usize + !small as usize
}

impl<S: StatSink> Engine<S> {
    /// An empty allocator for `device`.
    pub fn new(device: Arc<dyn Device>, config: AllocatorConfig, policy: Box<dyn Policy>) -> Self {
        let pools: Vec<Pool> = policy.pools().iter().map(|p| Pool::new(p.is_small)).collect();
        let private = private_pools::PrivatePools::new(pools.len());
        let tags = tags::Tags::new(pools.len());
        let mut e = Engine {
            stats: DeviceStats::new(config.max_split_size),
            device,
            policy: Dispatch::new(policy),
            config,
            blocks: BlockArena::default(),
            pools,
            segments: SegmentTable::default(),
            allocated: crate::pointer_map::PointerMap::default(),
            events: Vec::new(),
            active_is_allocation: !S::HEARS,
            total_allocated_memory: 0,
            allowed_memory_maximum: None,
            history: History::default(),
            current_stack: None,
            reclaim_watermark: 0,
            sink: S::default(),
            private,
            tags,
            observer: Default::default(),
        };
        if e.config.per_process_memory_fraction < 1.0 {
            let f = e.config.per_process_memory_fraction;
            let _ = e.set_memory_fraction(f);
        }
        e
    }

    // ----------------------------------------------------------------------------------------
    // malloc
    // ----------------------------------------------------------------------------------------

    /// Allocates `orig_size` bytes usable on `stream`. A size of 0 returns address 0 and changes
    /// nothing, as PyTorch's allocator does.
    pub fn malloc(&mut self, orig_size: u64, stream: StreamId) -> Result<u64, AllocError> {
        if self.tags.current.is_some() {
            return self.malloc_current_tag(orig_size, stream);
        }
        match self.try_malloc(orig_size, stream, false)? {
            Attempt::Done(p) => Ok(p),
            Attempt::NeedsDeviceRelease => unreachable!("the last resort is not deferred"),
        }
    }

    /// `malloc`, except that with `defer_last_resort` the last step of the fallback ladder
    /// (release every cached block of the device, retry) is left to the caller, who owns the
    /// device's other caches (see [`hook`]): it then gets `NeedsDeviceRelease` and calls
    /// [`Engine::malloc_last_resort`] once it has released them.
    #[inline(always)]
    fn try_malloc(&mut self, orig_size: u64, stream: StreamId, defer_last_resort: bool) -> Result<Attempt, AllocError> {
        self.try_malloc_in(orig_size, stream, defer_last_resort, 0)
    }

    /// `try_malloc` from the pools the policy names, shifted by `pool_offset` (0 for the
    /// default pools, a private pool's first engine pool otherwise).
    #[inline(always)]
    fn try_malloc_in(
        &mut self,
        orig_size: u64,
        stream: StreamId,
        defer_last_resort: bool,
        pool_offset: u16,
    ) -> Result<Attempt, AllocError> {
        if orig_size == 0 {
            return Ok(Attempt::Done(0));
        }
        if orig_size >= ONE_EXABYTE {
            return Err(self.out_of_memory_error(orig_size, orig_size, true));
        }
        if !self.events.is_empty() && self.private.active == 0 {
            // The check inlined, the work out of line: almost always nothing waits. Never
            // while allocating to a private pool: querying an event recorded on a capturing
            // stream invalidates the capture.
            self.process_events();
        }
        let mut req = self.request_in(orig_size, stream, pool_offset);
        let mut block = self.get_free_block(&req);
        if block.is_none() {
            req = self.with_alloc_size(req);
            block = self.allocate_new(&req, defer_last_resort)?;
            if block.is_none() && defer_last_resort {
                return Ok(Attempt::NeedsDeviceRelease);
            }
        }
        let Some(block) = block else {
            if pool_offset == 0 {
                if let Some(p) = self.malloc_from_use_on_oom_pools(orig_size, stream) {
                    return Ok(Attempt::Done(p));
                }
            }
            return Err(self.raise_oom(&req, orig_size));
        };
        Ok(Attempt::Done(self.hand_out(block, &req, orig_size)))
    }

    /// The last step of the ladder for a deferred `try_malloc`: release this engine's cached
    /// blocks and retry (the caller released the other engines' first).
    fn malloc_last_resort(&mut self, orig_size: u64, stream: StreamId) -> Result<u64, AllocError> {
        let req = self.with_alloc_size(self.request_in(orig_size, stream, 0));
        self.release_cached_blocks()?;
        match self.alloc_block(&req, true)? {
            Some(block) => Ok(self.hand_out(block, &req, orig_size)),
            None => Err(self.raise_oom(&req, orig_size)),
        }
    }

    #[inline]
    fn request_in(&self, orig_size: u64, stream: StreamId, pool_offset: u16) -> Request {
        let (size, pool) = self.policy.place(&self.config, orig_size);
        let pool = PoolId(pool.0 + pool_offset);
        Request {
            size,
            stream,
            pool,
            // Checked: the one place a `PoolId` enters the engine (see `Engine::pool`).
            small: self.pools[pool.0 as usize].is_small,
            alloc_size: 0,
        }
    }

    /// The request with the device bytes a miss gets.
    fn with_alloc_size(&self, req: Request) -> Request {
        Request {
            alloc_size: self.policy.get().allocation_size(&self.config, req.size),
            ..req
        }
    }

    #[inline]
    fn hand_out(&mut self, block: BlockId, req: &Request, orig_size: u64) -> u64 {
        let split = self
            .policy
            .should_split(&self.config, &self.blocks[block], req.size, req.small)
            && !self.is_no_split(self.blocks[block].pool);
        self.alloc_found_block(block, req, orig_size, split)
    }

    /// The fallback ladder of PyTorch's malloc, as named steps.
    fn allocate_new(&mut self, req: &Request, defer_last_resort: bool) -> Result<Option<BlockId>, AllocError> {
        if self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold > 0.0 {
            self.garbage_collect_cached_blocks()?;
        }
        if let Some(b) = self.alloc_block(req, false)? {
            return Ok(Some(b));
        }
        if self.private.active > 0 {
            // Releasing memory synchronises, which a capture forbids: out of memory.
            return Ok(None);
        }
        if self.policy.get().reclaim_at_limit() && self.reclaim_at_limit(req)? {
            if let Some(b) = self.alloc_block(req, false)? {
                return Ok(Some(b));
            }
        }
        if self.release_available_cached_blocks(req)? {
            if let Some(b) = self.alloc_block(req, false)? {
                return Ok(Some(b));
            }
        }
        if defer_last_resort {
            return Ok(None);
        }
        self.release_cached_blocks()?;
        self.alloc_block(req, true)
    }

    /// Best fit on the request's stream (PyTorch `get_free_block`).
    fn get_free_block(&mut self, req: &Request) -> Option<BlockId> {
        let gc = self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold > 0.0;
        let policy = &self.policy;
        let config = &self.config;
        let blocks = &self.blocks;
        let tags = &self.tags;
        let pool = pool_mut(&mut self.pools, req.pool);
        if gc {
            pool.get_free_blocks_call_count += 1;
        }
        let index = &pool.blocks;
        let mut pos = index.first_fit(req.stream, req.size)?;
        let mut key = index.key_at(pos);
        if blocks[key.3].expandable {
            // The size a block can grow to by mapping the unmapped block after it.
            let expandable_size = |id: BlockId| {
                let b = &blocks[id];
                b.size + b.next.map(|n| &blocks[n]).filter(|n| !n.mapped).map_or(0, |n| n.size)
            };
            if policy.expandable_page_size(config, req.pool).is_some() || tags.is_tagged(req.pool) {
                // Only a block followed by unmapped space can lose to a later candidate:
                // candidates ascend in size, so any other block's expandable size (its
                // size) is at most every later one's. Checking that first skips the look at
                // the next candidate, which costs two more block reads, on almost every call.
                while blocks[key.3].expandable && expandable_size(key.3) > key.1 {
                    let Some(next_pos) = index.next_position(pos) else {
                        break;
                    };
                    let next = index.key_at(next_pos);
                    if expandable_size(next.3) >= expandable_size(key.3) {
                        break;
                    }
                    (pos, key) = (next_pos, next);
                }
            } else {
                // Expandable segments were switched off: only plain blocks may serve.
                while blocks[key.3].expandable {
                    pos = index.next_position(pos)?;
                    key = index.key_at(pos);
                }
            }
        }
        if !policy.accepts_cached(config, req.size, key.1) {
            return None;
        }
        pool.blocks.remove_at(pos);
        Some(key.3)
    }

    /// Hands out `block` for the request, splitting off the rest (PyTorch `alloc_found_block`).
    fn alloc_found_block(&mut self, mut block: BlockId, req: &Request, orig_size: u64, split: bool) -> u64 {
        let small = req.small;
        let already_split = self.blocks[block].is_split();
        let expandable = self.blocks[block].expandable;
        if split {
            // The front `size` bytes become a new block; the old block keeps the remainder.
            let remaining = block;
            let (addr, prev, seg) = {
                let r = &self.blocks[remaining];
                (r.addr, r.prev, r.segment)
            };
            let mut nb = self.new_block(addr, req.size, req.stream, req.pool, seg, expandable);
            nb.prev = prev;
            nb.next = Some(remaining);
            block = self.blocks.insert(nb);
            if let Some(p) = prev {
                self.blocks[p].next = Some(block);
            }
            let r = &mut self.blocks[remaining];
            r.prev = Some(block);
            r.addr += req.size;
            r.size -= req.size;
            let rsize = r.size;
            self.insert_free(remaining);
            if !expandable {
                if already_split {
                    self.stat_down(Array::InactiveSplitBytes, small, req.size);
                } else {
                    self.stat_up(Array::InactiveSplitBytes, small, rsize);
                    self.stat_up(Array::InactiveSplit, small, 1);
                }
            }
        } else if already_split && !expandable {
            let bsize = self.blocks[block].size;
            self.stat_down(Array::InactiveSplitBytes, small, bsize);
            self.stat_down(Array::InactiveSplit, small, 1);
        }
        let stack = self.current_stack;
        let b = &mut self.blocks[block];
        b.allocated = true;
        b.requested = orig_size;
        b.stack = stack;
        let (addr, bsize, stream) = (b.addr, b.size, b.stream);
        self.trace(Action::Alloc, addr, orig_size, stream, stack);
        self.allocated.insert(addr, block);
        self.stat_up(Array::Allocation, small, 1);
        self.stat_up(Array::AllocatedBytes, small, bsize);
        if !self.active_is_allocation {
            self.stat_up(Array::Active, small, 1);
            self.stat_up(Array::ActiveBytes, small, bsize);
        }
        self.stat_up(Array::RequestedBytes, small, orig_size);
        // Remember the decision: max_split_size may change before the free.
        let oversize = bsize >= self.config.max_split_size;
        self.blocks[block].oversize = oversize;
        if oversize {
            self.oversize_change(OVERSIZE_ALLOCATIONS, true);
        }
        addr
    }

    /// Puts a free block in its pool's free set (mapped) or unmapped set.
    #[inline]
    fn insert_free(&mut self, id: BlockId) {
        let b = &mut self.blocks[id];
        let pool = pool_mut(&mut self.pools, b.pool);
        if b.mapped {
            b.gc_count_base = pool.get_free_blocks_call_count;
            pool.blocks.insert(Pool::size_key(id, b));
        } else {
            pool.unmapped.insert(Pool::addr_key(id, b));
        }
    }

    /// Takes a free block out of whichever set holds it.
    #[inline]
    fn remove_free(&mut self, id: BlockId) -> bool {
        let b = &self.blocks[id];
        let pool = pool_mut(&mut self.pools, b.pool);
        if b.mapped {
            pool.blocks.remove(&Pool::size_key(id, b))
        } else {
            pool.unmapped.remove(&Pool::addr_key(id, b))
        }
    }
}
