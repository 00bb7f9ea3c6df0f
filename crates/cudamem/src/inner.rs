//! The state an [`Allocator`](crate::Allocator) and its buffers share: the engine (or the
//! sharded allocator), the device, and the keep-alive that lets buffers outlive every
//! allocator handle without holding a reference count.
//!
//! Guarantees: the shared state lives as long as any handle or live allocation does, and a
//! free touches it no longer than its lock is held (see the comment above `impl Inner`); when
//! the last handle (and so the last buffer) goes, every cached segment is returned to the
//! device.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::{AllocError, CachingAllocator, CudaDevice, Device, ShardedAllocator, SimDevice, StreamId};

pub(crate) struct Inner {
    pub(crate) engine: CachingAllocator,
    /// Live [`Allocator`] handles (clones), not counting the uncounted aliases in buffers.
    pub(crate) handles: AtomicUsize,
    /// Without sharding: whether the engine holds a keep-alive count (taken when the last
    /// handle went while allocations were live). Read and written under the engine's lock.
    pub(crate) kept: AtomicBool,
    /// With `sharded:True`: serves every allocation instead of `engine` (which then holds
    /// nothing; it keeps the configuration, the policy's name and the history API).
    pub(crate) sharded: Option<ShardedAllocator>,
    pub(crate) device: Arc<dyn Device>,
    pub(crate) cuda: Option<Arc<CudaDevice>>,
    pub(crate) sim: Option<Arc<SimDevice>>,
}

/// Keep-alive. A buffer does not hold a counted handle of its allocator: one shared reference
/// count written by every alloc and free would make threads on their own streams contend
/// again, and costs a locked instruction each time even on one thread. What keeps `Inner` alive
/// while buffers outlive every handle:
///
/// * **With sharding**, each shard holds one count of the allocator's `Arc` while it has live
///   allocations: taken when its count of live allocations (kept under its lock) goes 0 → 1,
///   given back when it returns to 0. Why the `Arc` never reaches zero while it can still be
///   used: whoever allocates holds a counted handle or a live buffer (whose shard holds a
///   count), and a shard's count is given back only after its last buffer is gone; a take
///   always comes before the release that matches it, because the buffer whose free makes the
///   release exists only after its allocation's take.
/// * **Without sharding** (one engine), nothing is taken while a handle exists: the handles'
///   own counts keep `Inner` alive. When the last handle goes ([`Inner::handles`] reaches 0),
///   it takes one count, under the engine's lock, if allocations are live then ([`Inner::kept`]);
///   the free that leaves none live (under the same lock) gives it back. Why that suffices: an
///   allocation needs a handle or a live buffer's alias, so with no handle left, every
///   allocation happens while another is live and the engine's count of live allocations
///   never rises from 0; the lock orders the last handle's look at that count against every
///   free, so either the look sees the allocation live (and takes the count that its free
///   gives back) or the free came first (and needs no count: the handle still held one). A
///   cache-hit pair thus writes no shared count at all, where it used to take and give back a
///   count whenever it was the only live allocation (`gpu_bench`'s latency loop).
///
/// In both cases a free must not touch `Inner` once its lock is given back: another thread's
/// free may then give back the last count. So a buffer frees through [`Inner::free_raw`], which
/// holds no reference to `Inner` past that point, and a sharded free that merges the shards'
/// logs afterwards takes a count for it under the shard's lock (without it, Miri finds the
/// sharded free reading the allocator after its lock: `keepalive_when_the_last_handle_races_the_frees`).
impl Inner {
    /// Shard has live buffers now: one more count of the allocator's `Arc`.
    pub(crate) fn hold(self: &Arc<Self>) {
        // SAFETY: `self` is a live `Arc<Inner>`; the count taken here is given back by exactly
        // one `Release` (see the comment above `impl Inner`).
        unsafe { Arc::increment_strong_count(Arc::as_ptr(self)) }
    }
}

/// Gives back a shard's count of the allocator's `Arc` when dropped; drop it after the last use
/// of the allocator (this may free it).
pub(crate) struct Release(*const Inner);

impl Drop for Release {
    fn drop(&mut self) {
        // SAFETY: matches the `hold` of the shard whose live count just returned to zero; the
        // pointer came from that `Arc` (see the comment above `impl Inner`).
        unsafe { Arc::decrement_strong_count(self.0) }
    }
}

impl Inner {
    /// Allocates; `Some(shard)` when a count must be taken (a shard's live count went 0 → 1).
    pub(crate) fn malloc(&self, size: u64, stream: StreamId) -> Result<(u64, Option<usize>), AllocError> {
        match &self.sharded {
            Some(s) => s.malloc_noting(size, stream),
            None => Ok((self.engine.lock().malloc(size, stream)?, None)),
        }
    }
    /// Frees. Returns, to be dropped by the caller after this returns, the count to give back
    /// (a shard's live count went 1 → 0, or the engine's, with a count held since the last
    /// handle went) and any count taken to finish the operation after its lock was given back.
    ///
    /// Through a raw pointer, because once the lock is given back another thread's free may
    /// give back the last count and drop `Inner`: no reference to it may be used or held as an
    /// argument past that point (a `&self` method would hold one until it returns) unless a
    /// count is held.
    ///
    /// # Safety
    /// `this` must point to a live `Inner` until the lock is taken here: the caller's buffer,
    /// live until this free, ensures it (see the keep-alive comment above).
    pub(crate) unsafe fn free_raw(
        this: *const Inner,
        ptr: u64,
        stream: StreamId,
    ) -> (Result<(), AllocError>, [Option<Release>; 2]) {
        // SAFETY: live until the lock is taken (the contract); used after it only while a
        // count taken under the lock is held.
        let inner = unsafe { &*this };
        match &inner.sharded {
            Some(s) => {
                let pin = || {
                    // SAFETY: called under the shard's lock, where the buffer being freed keeps
                    // its shard's count, so `*this` is alive; the count is given back by the
                    // `Release` dropped after `free_raw` returns.
                    unsafe { Arc::increment_strong_count(this) };
                    Release(this)
                };
                // SAFETY: `s` lives in `*this`, which the caller's live buffer keeps alive until
                // the shard's lock is taken.
                let (r, pin) = unsafe { ShardedAllocator::free_noting_raw(s, ptr, stream, pin) };
                match r {
                    Ok(last) => (Ok(()), [last.map(|_| Release(this)), pin]),
                    Err(e) => (Err(e), [None, pin]),
                }
            }
            None => {
                let mut e = inner.engine.lock();
                if let Err(err) = e.free(ptr) {
                    return (Err(err), [None, None]);
                }
                let last = inner.kept.load(Ordering::Relaxed) && e.stats().allocation.all().current == 0;
                if last {
                    inner.kept.store(false, Ordering::Relaxed);
                }
                drop(e); // the last use of `inner`
                (Ok(()), [last.then(|| Release(this)), None])
            }
        }
    }

    /// The last handle is going (it still holds its count): without sharding, live allocations
    /// from now on keep the allocator alive through one count (see above).
    pub(crate) fn last_handle_gone(self: &Arc<Self>) {
        if self.sharded.is_some() {
            return; // the shards take and give back their own counts
        }
        let e = self.engine.lock();
        if e.stats().allocation.all().current > 0 && !self.kept.load(Ordering::Relaxed) {
            self.kept.store(true, Ordering::Relaxed);
            self.hold();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // No buffer is alive (each holds an Allocator clone): everything cached goes back.
        let _ = self.engine.empty_cache();
        if let Some(s) = &self.sharded {
            let _ = s.empty_cache();
        }
    }
}
