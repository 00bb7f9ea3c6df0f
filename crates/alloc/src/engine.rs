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
//!    memory (a segment, or pages of an expandable segment), then — on failure — release oversize
//!    cached blocks and retry, then synchronise, release every unsplit cached block and retry.
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

use std::collections::VecDeque;
use std::sync::Arc;

use cudamem_device::{Device, EventId, StreamId};

use crate::block::{Block, BlockArena, BlockId, Pool, PoolId, SegmentId};
use crate::config::AllocatorConfig;
use crate::error::{AllocError, OutOfMemory};
use crate::history::{Action, History};
use crate::policy::{Dispatch, Policy};
use crate::segment::{Backing, Segment, SegmentTable};
use crate::stats::{Array, DeviceStats, NoSink, StatSink, OVERSIZE_ALLOCATIONS, OVERSIZE_SEGMENTS};

mod private_pools;
mod tags;
pub use private_pools::{CheckpointDelta, MempoolId, PoolCheckpoint, PoolSlot, SegmentCheckpoint};
pub use tags::{SleepStats, TagId, TagInfo, MAX_TAG_LEN};

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

/// What a deferred-last-resort `malloc` came to.
pub(crate) enum Attempt {
    /// Allocated (or size 0).
    Done(u64),
    /// Everything short of releasing the device's whole cache failed.
    NeedsDeviceRelease,
}

/// The allocator state of one device. See the [module documentation](self). `S` hears of
/// every change of a per-pool stat value (see [`StatSink`]); the default hears nothing.
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
        };
        if e.config.per_process_memory_fraction < 1.0 {
            let f = e.config.per_process_memory_fraction;
            let _ = e.set_memory_fraction(f);
        }
        e
    }

    /// Emits one history entry (the only place that does).
    #[inline]
    fn trace(&mut self, action: Action, addr: u64, size: u64, stream: StreamId, stack: Option<u32>) {
        if self.history.enabled {
            let stack = if self.history.context >= crate::history::RecordContext::Alloc {
                stack
            } else {
                None
            };
            self.history.push(action, addr, size, stream.0, stack);
        }
    }

    /// Increases array `a`'s `all` and pool values by `n`, noting which changed.
    #[inline]
    fn stat_up(&mut self, a: Array, small: bool, n: u64) {
        let arr = self.stats.array_mut(a);
        if !S::HEARS {
            return arr.increase_pool(small, n); // see `Engine::stats`
        }
        arr.increase(small, n);
        let (now, all) = (arr.pool(small).current, arr.all().current);
        self.sink.rose(pool_value_index(a, small), n as i64, now, all);
    }

    /// Decreases them by `n`, noting which changed.
    #[inline]
    fn stat_down(&mut self, a: Array, small: bool, n: u64) {
        if !S::HEARS {
            return self.stats.array_mut(a).decrease_pool(small, n);
        }
        self.stats.array_mut(a).decrease(small, n);
        self.sink.fell(pool_value_index(a, small), -(n as i64));
    }

    /// Changes them by a signed amount, noting which changed.
    #[inline]
    fn stat_change(&mut self, a: Array, small: bool, delta: i64) {
        let arr = self.stats.array_mut(a);
        if !S::HEARS {
            return arr.change_pool(small, delta);
        }
        arr.change(small, delta);
        let (now, all) = (arr.pool(small).current, arr.all().current);
        if delta > 0 {
            self.sink.rose(pool_value_index(a, small), delta, now, all);
        } else {
            self.sink.fell(pool_value_index(a, small), delta);
        }
    }

    /// Counts one more (`up`) or one fewer oversize allocation (`i` = `OVERSIZE_ALLOCATIONS`)
    /// or segment (`OVERSIZE_SEGMENTS`), noting it.
    #[inline]
    fn oversize_change(&mut self, i: usize, up: bool) {
        let st = if i == OVERSIZE_SEGMENTS {
            &mut self.stats.oversize_segments
        } else {
            &mut self.stats.oversize_allocations
        };
        if up {
            st.increase(1);
            let now = st.current;
            self.sink.rose(i, 1, now, now);
        } else {
            st.decrease(1);
            self.sink.fell(i, -1);
        }
    }

    #[inline]
    fn is_small(&self, pool: PoolId) -> bool {
        self.pool(pool).is_small
    }

    /// Pool `p`, unchecked. Every `PoolId` the engine holds, in a request, a block or a
    /// segment, came from the policy through [`Engine::request`], which checks it, and `pools`
    /// keeps its length from `new` on. Debug builds check again.
    #[inline(always)]
    fn pool(&self, p: PoolId) -> &Pool {
        debug_assert!((p.0 as usize) < self.pools.len());
        // SAFETY: as said above, `p` indexes `pools`.
        unsafe { self.pools.get_unchecked(p.0 as usize) }
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
    /// other streams' caches ([`crate::sharded`]): it then gets `NeedsDeviceRelease` and calls
    /// [`Engine::malloc_last_resort`] once it has released them.
    #[inline(always)]
    pub(crate) fn try_malloc(
        &mut self,
        orig_size: u64,
        stream: StreamId,
        defer_last_resort: bool,
    ) -> Result<Attempt, AllocError> {
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
            return Err(self.raise_oom(&req, orig_size));
        };
        Ok(Attempt::Done(self.hand_out(block, &req, orig_size)))
    }

    /// The last step of the ladder for a deferred `try_malloc`: release this engine's cached
    /// blocks and retry (the caller released the other engines' first).
    pub(crate) fn malloc_last_resort(&mut self, orig_size: u64, stream: StreamId) -> Result<u64, AllocError> {
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
            .should_split(&self.config, &self.blocks[block], req.size, req.small);
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

    #[cold]
    fn raise_oom(&mut self, req: &Request, orig_size: u64) -> AllocError {
        let err = self.out_of_memory_error(orig_size, req.alloc_size, false);
        if let AllocError::OutOfMemory(o) = &err {
            let free = o.free;
            self.trace(Action::Oom, free, req.size, req.stream, self.current_stack);
        }
        self.stats.num_ooms += 1;
        err
    }

    fn out_of_memory_error(&self, requested: u64, tried: u64, over: bool) -> AllocError {
        let (free, total) = self.device.mem_get_info().unwrap_or((0, self.device.total_memory()));
        AllocError::OutOfMemory(Box::new(OutOfMemory {
            device: self.device.index(),
            requested,
            tried,
            total,
            free,
            process_used: total.saturating_sub(free),
            allowed: self.allowed_memory_maximum,
            allocated: self.stats().allocated_bytes.all().current as u64,
            reserved: self.stats().reserved_bytes.all().current as u64,
            largest_free_block: self.largest_free_block(),
            over_one_exabyte: over,
        }))
    }

    /// The largest free cached block (PyTorch's `cacheInfo`).
    pub fn largest_free_block(&self) -> u64 {
        self.pools.iter().filter_map(|p| p.blocks.max_size()).max().unwrap_or(0)
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

    /// Gets device memory for the request (PyTorch `alloc_block`). `Ok(None)` means out of
    /// memory; any other device failure is an error.
    fn alloc_block(&mut self, req: &Request, is_retry: bool) -> Result<Option<BlockId>, AllocError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if let Some(max) = self.allowed_memory_maximum {
            if self.total_allocated_memory.saturating_add(req.alloc_size) > max {
                return Ok(None);
            }
        }
        let page_size = match self.private.is_private(req.pool) {
            false => self.policy.expandable_page_size(&self.config, req.pool),
            // Private pools take whole segments, as PyTorch's do; tags' pools map pages.
            true => self.tag_page_size(req.pool),
        };
        if let Some(page_size) = page_size {
            if self.policy.get().reclaim_before_growth() {
                let need = req.size.div_ceil(page_size) * page_size;
                self.reclaim_free_pages(req.pool, need)?;
            }
            return self.try_allocate_expandable_block(req, page_size);
        }
        let size = req.alloc_size;
        let ptr = match self.device.malloc(size) {
            Ok(p) => p,
            Err(e) if e.is_out_of_memory() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        self.total_allocated_memory += size;
        let seg = self.segments.insert(Segment {
            base: ptr,
            size,
            pool: req.pool,
            stream: req.stream,
            backing: Backing::Malloc,
            stack: self.current_stack,
            oversize: size >= self.config.max_split_size,
        });
        self.private.count_segment(req.pool, true);
        let id = self
            .blocks
            .insert(self.new_block(ptr, size, req.stream, req.pool, seg, false));
        let small = req.small;
        self.stat_up(Array::Segment, small, 1);
        self.stat_up(Array::ReservedBytes, small, size);
        if self.segments[seg].oversize {
            self.oversize_change(OVERSIZE_SEGMENTS, true);
        }
        self.stats.num_device_alloc += 1;
        self.trace(Action::SegmentAlloc, ptr, size, req.stream, self.current_stack);
        Ok(Some(id))
    }

    fn new_block(
        &self,
        addr: u64,
        size: u64,
        stream: StreamId,
        pool: PoolId,
        segment: SegmentId,
        expandable: bool,
    ) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            pool,
            segment,
            prev: None,
            next: None,
            allocated: false,
            mapped: true,
            event_count: 0,
            stream_uses: None,
            gc_count_base: 0,
            stack: None,
            expandable,
            oversize: false,
        }
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

    // ----------------------------------------------------------------------------------------
    // expandable segments
    // ----------------------------------------------------------------------------------------

    /// The lowest-addressed run of free and unmapped blocks with `size` bytes of room, in a new
    /// expandable segment if none has room (PyTorch `find_expandable_block`).
    fn find_expandable_block(&mut self, req: &Request, page_size: u64) -> Result<BlockId, AllocError> {
        let allocatable = |blocks: &BlockArena, b: Option<BlockId>| b.filter(|&b| blocks[b].is_free());
        let pool = &self.pools[req.pool.0 as usize];
        for &(stream, _, id) in pool.unmapped.range((req.stream, 0, BlockId::MIN)..) {
            if stream != req.stream {
                break;
            }
            let mut c = id;
            if let Some(p) = allocatable(&self.blocks, self.blocks[c].prev) {
                c = p;
            }
            let (mut bytes, mut b) = (0u64, Some(c));
            while bytes < req.size {
                match allocatable(&self.blocks, b) {
                    Some(x) => {
                        bytes += self.blocks[x].size;
                        b = self.blocks[x].next;
                    }
                    None => break,
                }
            }
            if bytes >= req.size {
                return Ok(c);
            }
        }
        let total = self.device.total_memory();
        let va = (total + total / 8).div_ceil(page_size) * page_size;
        let base = self.device.reserve(va)?;
        let map_chunk = self.policy.get().map_chunk(&self.config, req.pool).unwrap_or(page_size);
        let seg = self.segments.insert(Segment {
            base,
            size: va,
            pool: req.pool,
            stream: req.stream,
            backing: Backing::Expandable {
                page_size,
                map_chunk,
                mappings: Default::default(),
            },
            stack: self.current_stack,
            oversize: false,
        });
        let mut b = self.new_block(base, va, req.stream, req.pool, seg, true);
        b.mapped = false;
        let id = self.blocks.insert(b);
        self.insert_free(id);
        Ok(id)
    }

    /// Maps the first `size` bytes of the unmapped block `to_map` (PyTorch `map_block`).
    /// Returns false when the device is out of memory.
    fn map_block(&mut self, to_map: BlockId, size: u64) -> Result<bool, AllocError> {
        let (seg, addr, bsize, stream, pool) = {
            let b = &self.blocks[to_map];
            debug_assert!(!b.mapped && size <= b.size);
            (b.segment, b.addr, b.size, b.stream, b.pool)
        };
        let Some((mptr, msize)) = self.segments[seg].map(&*self.device, addr, size)? else {
            return Ok(false);
        };
        debug_assert!(mptr == addr && msize >= size);
        self.remove_free(to_map);
        self.blocks[to_map].mapped = true;
        if msize < bsize {
            let mut rest = self.new_block(addr + msize, bsize - msize, stream, pool, seg, true);
            rest.mapped = false;
            rest.prev = Some(to_map);
            rest.next = self.blocks[to_map].next;
            let rid = self.blocks.insert(rest);
            if let Some(n) = self.blocks[to_map].next {
                self.blocks[n].prev = Some(rid);
            }
            self.blocks[to_map].next = Some(rid);
            self.blocks[to_map].size = msize;
            self.insert_free(rid);
        }
        let (p, n) = (self.blocks[to_map].prev, self.blocks[to_map].next);
        self.try_merge_blocks(to_map, p);
        self.try_merge_blocks(to_map, n);
        self.insert_free(to_map);
        self.total_allocated_memory += msize;
        self.reclaim_watermark = self.reclaim_watermark.max(self.total_allocated_memory);
        let small = self.is_small(pool);
        self.stat_up(Array::ReservedBytes, small, msize);
        self.stats.num_device_alloc += 1;
        self.trace(Action::SegmentMap, mptr, msize, stream, self.current_stack);
        Ok(true)
    }

    /// PyTorch `try_allocate_expandable_block`.
    fn try_allocate_expandable_block(&mut self, req: &Request, page_size: u64) -> Result<Option<BlockId>, AllocError> {
        let mut candidate = self.find_expandable_block(req, page_size)?;
        if !self.blocks[candidate].mapped {
            let sz = self.blocks[candidate].size.min(req.size);
            if !self.map_block(candidate, sz)? {
                return Ok(None);
            }
        }
        while self.blocks[candidate].size < req.size {
            let remaining = req.size - self.blocks[candidate].size;
            let next = self.blocks[candidate].next.expect("expandable run continues");
            let sz = remaining.min(self.blocks[next].size);
            if !self.map_block(next, sz)? {
                return Ok(None);
            }
            candidate = next;
        }
        self.remove_free(candidate);
        Ok(Some(candidate))
    }

    /// Unmaps the whole free pages of a free, mapped expandable block (PyTorch `unmap_block`).
    fn unmap_block(&mut self, id: BlockId) -> Result<(), AllocError> {
        let (seg, addr, size, stream, pool) = {
            let b = &self.blocks[id];
            (b.segment, b.addr, b.size, b.stream, b.pool)
        };
        let (uptr, usize_) = self.segments[seg].unmap(&*self.device, addr, size)?;
        if usize_ == 0 {
            return Ok(());
        }
        self.remove_free(id);
        let before = uptr - addr;
        if before > 0 {
            let mut bf = self.new_block(addr, before, stream, pool, seg, true);
            bf.prev = self.blocks[id].prev;
            bf.next = Some(id);
            let bid = self.blocks.insert(bf);
            if let Some(p) = self.blocks[id].prev {
                self.blocks[p].next = Some(bid);
            }
            self.blocks[id].prev = Some(bid);
            self.insert_free(bid);
        }
        let after = size - before - usize_;
        if after > 0 {
            let mut af = self.new_block(uptr + usize_, after, stream, pool, seg, true);
            af.prev = Some(id);
            af.next = self.blocks[id].next;
            let aid = self.blocks.insert(af);
            if let Some(n) = self.blocks[id].next {
                self.blocks[n].prev = Some(aid);
            }
            self.blocks[id].next = Some(aid);
            self.insert_free(aid);
        }
        {
            let b = &mut self.blocks[id];
            b.addr = uptr;
            b.size = usize_;
            b.mapped = false;
        }
        let (p, n) = (self.blocks[id].prev, self.blocks[id].next);
        self.try_merge_blocks(id, p);
        self.try_merge_blocks(id, n);
        self.insert_free(id);
        self.total_allocated_memory -= usize_;
        let small = self.is_small(pool);
        self.stat_down(Array::ReservedBytes, small, usize_);
        self.stats.num_device_free += 1;
        self.trace(Action::SegmentUnmap, uptr, usize_, stream, self.current_stack);
        Ok(())
    }

    /// The policy's `reclaim_before_growth`: when growing by `need` bytes would pass the
    /// high-water mark, unmaps whole free pages of the pool's expandable segments, largest free
    /// blocks first, until the growth fits under the mark (or nothing is left to unmap). Blocks
    /// keep their addresses; only their backing goes.
    fn reclaim_free_pages(&mut self, pool: PoolId, need: u64) -> Result<(), AllocError> {
        let g = self.device.granularity();
        let mut cursor: Option<crate::block::SizeKey> = None;
        while self.total_allocated_memory + need > self.reclaim_watermark {
            // Walk the free set from the largest key down; unmapping changes the set, so look
            // the next key up below the last one instead of holding an iterator.
            let set = &self.pools[pool.0 as usize].blocks;
            let Some(key) = set.prev_key(cursor) else { break };
            cursor = Some(key);
            if key.1 >= g && self.blocks[key.3].expandable {
                self.unmap_block(key.3)?;
            }
        }
        Ok(())
    }

    /// Returns a wholly unmapped expandable segment's address space.
    fn release_expandable_segment(&mut self, id: BlockId) -> Result<(), AllocError> {
        let seg = self.blocks[id].segment;
        debug_assert!(!self.blocks[id].mapped && self.blocks[id].size == self.segments[seg].size);
        self.remove_free(id);
        self.blocks.remove(id);
        let s = self.segments.remove(seg);
        self.device.release_reservation(s.base, s.size)?;
        Ok(())
    }

    // ----------------------------------------------------------------------------------------
    // free
    // ----------------------------------------------------------------------------------------

    /// Frees an allocation. Unknown, interior or already-freed pointers are an error and change
    /// nothing. Address 0 (a zero-size allocation) is accepted and ignored.
    pub fn free(&mut self, ptr: u64) -> Result<(), AllocError> {
        if ptr == 0 {
            return Ok(());
        }
        let blocks = &self.blocks;
        let Some(id) = self.allocated.remove(ptr, |id| blocks[id].addr == ptr) else {
            return Err(self.invalid_pointer(ptr));
        };
        if self.active_is_allocation && self.blocks[id].stream_uses.is_some() {
            // This block stays active after it stops being allocated: from now on `active`
            // is its own count.
            self.stats.active = self.stats.allocation;
            self.stats.active_bytes = self.stats.allocated_bytes;
            self.active_is_allocation = false;
        }
        let small = self.is_small(self.blocks[id].pool);
        let b = &mut self.blocks[id];
        b.allocated = false;
        let (size, requested, stream, stack) = (b.size, b.requested, b.stream, b.stack);
        self.stat_down(Array::Allocation, small, 1);
        self.stat_down(Array::AllocatedBytes, small, size);
        if self.history.enabled {
            let free_stack = if self.history.context >= crate::history::RecordContext::All {
                self.current_stack
            } else {
                stack
            };
            self.trace(Action::FreeRequested, ptr, requested, stream, free_stack.or(stack));
        }
        if std::mem::take(&mut self.blocks[id].oversize) {
            self.oversize_change(OVERSIZE_ALLOCATIONS, false);
        }
        if self.blocks[id].stream_uses.is_none() {
            self.free_block_of(id, small);
        } else if self.private.active > 0 {
            // No event may be recorded during a capture: the block waits, unreused, until the
            // last capture or pool context ends (see `private_pools`).
            self.private.deferred.push(id);
        } else {
            self.insert_events(id);
        }
        Ok(())
    }

    /// Whether `ptr` is an allocation of this engine (one `free` would accept).
    pub fn owns(&self, ptr: u64) -> bool {
        self.allocated.get(ptr, |id| self.blocks[id].addr == ptr).is_some()
    }

    #[cold]
    fn invalid_pointer(&self, ptr: u64) -> AllocError {
        let containing = self.blocks.iter().find(|(_, b)| b.addr <= ptr && ptr < b.addr + b.size);
        let reason = match containing {
            Some((_, b)) if b.addr == ptr && !b.allocated => {
                "not allocated: freed already (double free?) or never handed out".to_string()
            }
            Some((_, b)) => format!(
                "inside the {} block at {:#x} (+{} bytes); only the start of an allocation can be freed",
                if b.allocated { "allocated" } else { "free" },
                b.addr,
                ptr - b.addr
            ),
            None => format!("not allocated by this allocator (device {})", self.device.name()),
        };
        AllocError::InvalidPointer { ptr, reason }
    }

    /// Returns a block whose uses are over to its pool (PyTorch `free_block`).
    fn free_block(&mut self, id: BlockId) {
        let small = self.is_small(self.blocks[id].pool);
        self.free_block_of(id, small);
    }

    /// [`Engine::free_block`] for a block of the small pool (`small`) or a large one.
    #[inline(always)]
    fn free_block_of(&mut self, id: BlockId, small: bool) {
        let (addr, requested, stream, stack, original_size, expandable) = {
            let b = &self.blocks[id];
            debug_assert!(b.is_free());
            (b.addr, b.requested, b.stream, b.stack, b.size, b.expandable)
        };
        self.trace(Action::FreeCompleted, addr, requested, stream, stack);
        self.blocks[id].stack = None;
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for cand in [self.blocks[id].prev, self.blocks[id].next] {
            let subsumed = self.try_merge_blocks(id, cand);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        self.insert_free(id);
        let b = &mut self.blocks[id];
        b.requested = 0;
        if b.is_split() {
            net_blocks += 1;
            net_bytes += b.size as i64;
        }
        // A free that merged nothing and left a whole segment changes neither (half the frees
        // of a training step): skip the two no-op updates of four values each.
        if !expandable && net_blocks != 0 {
            self.stat_change(Array::InactiveSplit, small, net_blocks);
        }
        if !expandable && net_bytes != 0 {
            self.stat_change(Array::InactiveSplitBytes, small, net_bytes);
        }
        if !self.active_is_allocation {
            self.stat_down(Array::Active, small, 1);
            self.stat_down(Array::ActiveBytes, small, original_size);
        }
        self.stat_down(Array::RequestedBytes, small, requested);
    }

    /// Merges the free neighbour `src` into `dst` (PyTorch `try_merge_blocks`); returns the bytes
    /// gained, 0 when `src` is absent, busy or differently mapped. `dst` must not be in a set.
    #[inline(always)]
    fn try_merge_blocks(&mut self, dst: BlockId, src: Option<BlockId>) -> u64 {
        let Some(src) = src else { return 0 };
        {
            let s = &self.blocks[src];
            if !s.is_free() || s.mapped != self.blocks[dst].mapped {
                return 0;
            }
        }
        self.remove_free(src);
        let s = self.blocks.remove(src);
        let d = &mut self.blocks[dst];
        if d.prev == Some(src) {
            d.addr = s.addr;
            d.prev = s.prev;
            if let Some(p) = s.prev {
                self.blocks[p].next = Some(dst);
            }
        } else {
            d.next = s.next;
            if let Some(n) = s.next {
                self.blocks[n].prev = Some(dst);
            }
        }
        self.blocks[dst].size += s.size;
        s.size
    }

    // ----------------------------------------------------------------------------------------
    // streams and events
    // ----------------------------------------------------------------------------------------

    /// Marks an allocation as used on `stream` too: it will not be reused before the work queued
    /// on `stream` at its free has completed. Uses on its own stream need nothing.
    pub fn record_stream(&mut self, ptr: u64, stream: StreamId) -> Result<(), AllocError> {
        let Some(id) = self.allocated.get(ptr, |id| self.blocks[id].addr == ptr) else {
            return Err(self.invalid_pointer(ptr));
        };
        let b = &mut self.blocks[id];
        if stream != b.stream {
            let uses = b.stream_uses.get_or_insert_with(Default::default);
            if !uses.contains(&stream) {
                uses.push(stream);
            }
        }
        Ok(())
    }

    fn insert_events(&mut self, id: BlockId) {
        let streams = self.blocks[id].stream_uses.take().map_or_else(Vec::new, |v| *v);
        for s in streams {
            match self.device.record_event(s) {
                Ok(ev) => {
                    self.blocks[id].event_count += 1;
                    match self.events.iter_mut().find(|(st, _)| *st == s) {
                        Some((_, q)) => q.push_back((ev, id)),
                        None => self.events.push((s, VecDeque::from([(ev, id)]))),
                    }
                }
                // No event, no way to know when the stream is done: wait for it now instead.
                Err(_) => {
                    let _ = self.device.synchronize_stream(s);
                }
            }
        }
        if self.blocks[id].event_count == 0 {
            self.free_block(id);
        }
    }

    /// Frees the blocks whose events have all completed (PyTorch `process_events`). A failing
    /// query counts as "not yet": the block stays pending until a later query or a sync.
    #[inline(never)]
    pub fn process_events(&mut self) {
        if self.events.is_empty() {
            return;
        }
        let mut si = 0;
        while si < self.events.len() {
            while let Some(&(ev, block)) = self.events[si].1.front() {
                if !matches!(self.device.query_event(ev), Ok(true)) {
                    break;
                }
                self.events[si].1.pop_front();
                self.device.destroy_event(ev);
                self.event_done(block);
            }
            if self.events[si].1.is_empty() {
                self.events.swap_remove(si);
            } else {
                si += 1;
            }
        }
    }

    fn event_done(&mut self, block: BlockId) {
        let b = &mut self.blocks[block];
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(block);
        }
    }

    /// Waits for every outstanding event and frees its block (PyTorch
    /// `synchronize_and_free_events`).
    fn synchronize_and_free_events(&mut self) -> Result<(), AllocError> {
        self.stats.num_sync_all_streams += 1;
        let all = std::mem::take(&mut self.events);
        for (_, q) in all {
            for (ev, block) in q {
                if self.device.synchronize_event(ev).is_err() {
                    self.device.synchronize()?;
                }
                self.device.destroy_event(ev);
                self.event_done(block);
            }
        }
        Ok(())
    }

    /// Number of blocks waiting for events.
    pub fn pending_frees(&self) -> usize {
        self.events.iter().map(|(_, q)| q.len()).sum()
    }

    // ----------------------------------------------------------------------------------------
    // releasing cached memory
    // ----------------------------------------------------------------------------------------

    /// `empty_cache`: waits for outstanding events, then returns every unsplit cached segment and
    /// every whole free page of expandable segments to the device.
    pub fn empty_cache(&mut self) -> Result<(), AllocError> {
        self.release_cached_blocks()
    }

    /// Releases the default pools' cached memory and that of private pools nobody uses; a
    /// private pool in use keeps its cache (a CUDA graph replays into it).
    fn release_cached_blocks(&mut self) -> Result<(), AllocError> {
        self.refuse_release_while_allocating_to_pool()?;
        self.synchronize_and_free_events()?;
        // PyTorch releases the large pool first, then the small one.
        let mut order: Vec<usize> = (0..self.pools.len())
            .filter(|&i| !self.private.is_private(PoolId(i as u16)))
            .collect();
        order.sort_by_key(|&i| self.pools[i].is_small);
        for p in order {
            self.release_blocks(PoolId(p as u16))?;
        }
        for s in self.freeable_pools() {
            self.release_private_pool(s)?;
        }
        self.release_awake_tags()
    }

    fn release_blocks(&mut self, pool: PoolId) -> Result<(), AllocError> {
        let keys: Vec<_> = self.pools[pool.0 as usize].blocks.iter().map(|k| k.3).collect();
        let mut to_unmap = Vec::new();
        for id in keys {
            let b = &self.blocks[id];
            if b.expandable {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(id)?;
            }
        }
        for id in to_unmap {
            self.unmap_block(id)?;
            if !self.blocks[id].is_split() {
                self.release_expandable_segment(id)?;
            }
        }
        // Segments that were never mapped (their first growth failed) are one unmapped block
        // and appear in no free set: release their address space too.
        let empty: Vec<BlockId> = self.pools[pool.0 as usize]
            .unmapped
            .iter()
            .map(|k| k.2)
            .filter(|&id| !self.blocks[id].is_split())
            .collect();
        for id in empty {
            self.release_expandable_segment(id)?;
        }
        Ok(())
    }

    /// Returns an unsplit cached segment to the device (PyTorch `release_block`).
    fn release_block(&mut self, id: BlockId) -> Result<(), AllocError> {
        let (addr, size, stream, pool, seg) = {
            let b = &self.blocks[id];
            debug_assert!(!b.expandable && !b.is_split());
            (b.addr, b.size, b.stream, b.pool, b.segment)
        };
        let seg_stack = self.segments[seg].stack;
        self.device.free(addr, size)?;
        self.stats.num_device_free += 1;
        self.trace(Action::SegmentFree, addr, size, stream, seg_stack);
        self.total_allocated_memory -= size;
        let small = self.is_small(pool);
        self.stat_down(Array::Segment, small, 1);
        self.stat_down(Array::ReservedBytes, small, size);
        if self.segments[seg].oversize {
            self.oversize_change(OVERSIZE_SEGMENTS, false);
        }
        self.remove_free(id);
        self.blocks.remove(id);
        self.segments.remove(seg);
        self.private.count_segment(pool, false);
        Ok(())
    }

    /// Frees oversize cached blocks, just enough for the request (PyTorch
    /// `release_available_cached_blocks`); only with a `max_split_size`.
    fn release_available_cached_blocks(&mut self, req: &Request) -> Result<bool, AllocError> {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let key_size = req.size.max(max_split);
        // Only whole device segments can be freed here: blocks of expandable segments give back
        // pages through the full release instead (as in PyTorch).
        let blocks = &self.blocks;
        let pool = &self.pools[req.pool.0 as usize];
        // (A split block can be here only if max_split_size was lowered at run time.)
        let whole = |k: &crate::block::SizeKey| !blocks[k.3].expandable && !blocks[k.3].is_split();
        let found = pool.blocks.from_size(req.stream, key_size).find(whole);
        match found {
            Some(k) => {
                self.release_block(k.3)?;
                Ok(true)
            }
            None => {
                // No single block is large enough: free oversize blocks, largest first.
                let victims: Vec<_> = pool
                    .blocks
                    .below_size(req.stream, key_size)
                    .take_while(|k| k.1 >= max_split)
                    .filter(whole)
                    .collect();
                let mut released = 0;
                for k in victims {
                    if released >= key_size {
                        break;
                    }
                    released += k.1;
                    self.release_block(k.3)?;
                }
                Ok(released >= key_size)
            }
        }
    }

    /// Frees old unsplit cached blocks when usage passes the GC threshold (PyTorch
    /// `garbage_collect_cached_blocks`); never synchronises.
    fn garbage_collect_cached_blocks(&mut self) -> Result<(), AllocError> {
        let Some(max) = self.allowed_memory_maximum else {
            return Ok(());
        };
        let threshold = (self.config.garbage_collection_threshold * max as f64) as u64;
        if self.total_allocated_memory <= threshold {
            return Ok(());
        }
        let target = self.total_allocated_memory - threshold;
        let large: Vec<usize> = (0..self.pools.len())
            .filter(|&i| !self.pools[i].is_small && !self.private.is_private(PoolId(i as u16)))
            .collect();
        let age = |e: &Engine<S>, id: BlockId| {
            let b = &e.blocks[id];
            e.pools[b.pool.0 as usize].get_free_blocks_call_count - b.gc_count_base
        };
        let freeable = |e: &Engine<S>| -> Vec<BlockId> {
            large
                .iter()
                .flat_map(|&p| e.pools[p].blocks.iter().map(|k| k.3))
                .filter(|&id| !e.blocks[id].is_split() && !e.blocks[id].expandable)
                .collect()
        };
        let mut reclaimed = 0;
        let mut candidates = freeable(self);
        let mut total_age: i64 = candidates.iter().map(|&id| age(self, id)).sum();
        while reclaimed < target && !candidates.is_empty() {
            let threshold_age = total_age as f64 / candidates.len() as f64;
            let mut freed_any = false;
            for id in candidates.clone() {
                let a = age(self, id);
                if a as f64 >= threshold_age {
                    reclaimed += self.blocks[id].size;
                    total_age -= a;
                    self.release_block(id)?;
                    freed_any = true;
                }
            }
            if !freed_any {
                break;
            }
            candidates = freeable(self);
        }
        Ok(())
    }

    // ----------------------------------------------------------------------------------------
    // limits and settings
    // ----------------------------------------------------------------------------------------

    /// Limits this process to `fraction` of the device's memory (cached bytes count).
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), AllocError> {
        if !(0.0..=1.0).contains(&fraction) || fraction.is_nan() {
            return Err(AllocError::InvalidArgument(format!(
                "invalid memory fraction {fraction}: set it within [0, 1]"
            )));
        }
        let (_, total) = self.device.mem_get_info()?;
        self.allowed_memory_maximum = Some((fraction * total as f64) as u64);
        self.config.per_process_memory_fraction = fraction;
        Ok(())
    }

    /// The memory fraction in force (1 when none was set).
    pub fn memory_fraction(&self) -> f64 {
        match self.allowed_memory_maximum {
            Some(_) => self.config.per_process_memory_fraction,
            None => 1.0,
        }
    }

    /// The block size of allocation `ptr`, if it is one.
    #[inline]
    pub fn allocation_size(&self, ptr: u64) -> Option<u64> {
        let id = self.allocated.get(ptr, |id| self.blocks[id].addr == ptr)?;
        Some(self.blocks[id].size)
    }

    /// `allocated_bytes` and `reserved_bytes` of all pools, now (what PyTorch reports to its
    /// profiler with every allocation and free).
    pub fn allocated_and_reserved(&self) -> (u64, u64) {
        let s = &self.stats;
        let sum = |a: &crate::stats::StatArray| (a.small_pool().current + a.large_pool().current) as u64;
        (sum(&s.allocated_bytes), sum(&s.reserved_bytes))
    }

    /// The segment holding `ptr` (address, size), if it is a whole device segment: the base
    /// allocation PyTorch shares between processes. `Err` for memory of an expandable segment.
    pub fn base_allocation(&self, ptr: u64) -> Result<Option<(u64, u64)>, AllocError> {
        let Some((_, seg)) = self
            .segments
            .iter()
            .find(|(_, g)| g.base <= ptr && ptr < g.base + g.size)
        else {
            return Ok(None);
        };
        if seg.is_expandable() {
            return Err(AllocError::InvalidArgument(format!(
                "{ptr:#x} lies in an expandable segment, which has no base allocation to share between \
                 processes; allocate tensors to be shared with expandable_segments:False"
            )));
        }
        Ok(Some((seg.base, seg.size)))
    }

    /// The statistics.
    ///
    /// An engine whose sink hears nothing keeps each array's `all` `current`, `allocated`
    /// and `freed` as the sums of the pools' (it updates only the pool's value and `all`'s
    /// peak, against the pools' sum: two read-modify-writes of memory fewer a change, about
    /// twelve a pair); they are
    /// summed here. A hearing sink is told `all`'s value at every change, so that engine
    /// keeps `all` up to date.
    #[inline]
    pub fn stats(&self) -> DeviceStats {
        let mut s = self.stats;
        if self.active_is_allocation {
            s.active = s.allocation;
            s.active_bytes = s.allocated_bytes;
        }
        if !S::HEARS {
            s.sum_all();
        }
        s
    }

    /// `reset_peak_memory_stats()`: every peak becomes its current value.
    pub fn reset_peak_stats(&mut self) {
        if !S::HEARS {
            self.stats.sum_all(); // `all`'s current, for its peak
        }
        self.stats.reset_peak();
    }

    /// `reset_accumulated_memory_stats()`: every `allocated` and `freed` becomes 0.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// The configuration in force.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// The policy.
    pub fn policy(&self) -> &dyn Policy {
        self.policy.get()
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// Bytes obtained from the device.
    pub fn total_allocated_memory(&self) -> u64 {
        self.total_allocated_memory
    }
}
