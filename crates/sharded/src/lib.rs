//! # Per-stream shards: a device allocator whose threads do not wait for each other
//!
//! [`cudamem_alloc::CachingAllocator`] guards a device with one mutex, as PyTorch does, so threads that
//! allocate on their own streams queue behind each other. [`ShardedAllocator`] removes that
//! queue without changing a decision: PyTorch's rules never let one stream reuse another's
//! block or segment (best fit, splitting, merging and expandable segments are all per stream),
//! so the streams can be split among independent [`Engine`]s — **shards**, each behind its own
//! mutex — and every block ends up exactly where the single engine would have put it.
//!
//! What crosses streams, and how it stays exact:
//! * **Statistics.** Counts and totals (`allocated`, `freed`, `num_*`) are sums over shards.
//!   Peaks are not: the peak of a sum is not the sum of peaks. They stay exact in two regimes:
//!   - **Bounded** (the steady state). Each shard has a *ceiling* per tracked value (the 20
//!     "current" values — 9 stat arrays × small/large pool, plus the two oversize counters —
//!     and the 9 arrays' `all`), and the ceilings of all shards sum to at most the device's
//!     peak: while every shard stays under its ceilings, no new peak can happen, so nothing is
//!     logged or stamped. An operation costs one engine operation, two comparisons per value
//!     it raised (its engine's [`StatSink`] compares the value and its array's `all` with their
//!     ceilings as it changes them) and one read of a flag that nobody writes. Ceilings are set at every merge (see `settle`): the
//!     headroom between peak and current total goes first to the shards that rose in the last
//!     window, by how much they rose. One thread driving several streams stays here, and so do
//!     threads that reach their highs together; threads whose phases drift apart keep making
//!     totals no earlier moment had, and log.
//!   - **Logged**. A shard that passes a ceiling raises the `alarm`; from then on every shard
//!     appends to its own log the change of each tracked value after each operation, with a
//!     timestamp taken under the shard's lock (why that order is exact: at
//!     `ShardState::record`). It reads nothing back: the engine's sink has noted which
//!     values the operation changed and by how much, which a property test holds it to. A merge (when a log fills, and before every read of the
//!     stats) *cuts* a window: with every shard locked it takes every shard's log — one window
//!     of time — and bounds every shard again (only the shards ever used do any work: the
//!     others hold nothing, keep ceilings of 0, and log from their first operation).
//!     *Replayers*, two threads started with the second
//!     shard, replay the queued windows, several at once (each window's logs carry their start
//!     values, and peaks combine by `max`): if some series could have passed its peak in the
//!     window — its value where the logs start plus every shard's largest rise exceeds the
//!     peak — the logs are replayed in timestamp order, tracking the peaks of those series;
//!     otherwise there is nothing to do. So the operation that filled a log does not pay for
//!     everyone's, and one thread's replay speed does not cap the device's; a read of the stats
//!     replays what is queued and waits for what is in flight. A replay reads logs that other
//!     cores wrote (and those cores pay to own the lines again), so logs are compact (about 32
//!     bytes per operation).
//!
//!   The peaks are those of one linear order of all operations, consistent with real time:
//!   the timestamp is the CPU's invariant time-stamp counter (`rdtscp`, synchronised across
//!   cores; used only where the kernel's clocksource is `tsc`, i.e. where Linux checked that),
//!   otherwise a shared counter (same order, but a write every logged operation shares). No
//!   operation writes memory another shard's operations touch (what merges write sits on cache
//!   lines of its own), so the fast path scales. Until a second shard is used, the one in use
//!   *is* the device: its own stats are exact and nothing is checked (a single-stream program
//!   pays only the shard lookup); the second shard's first operation seeds the aggregate from
//!   the first shard's stats, under every lock, and bounds every shard.
//! * **Out of memory.** PyTorch's last resort frees every cached block of the device, including
//!   other streams'. A shard whose own ladder fails releases its lock, takes every shard's lock
//!   in index order, empties the other shards' caches, then runs the last step itself (release
//!   its own cache, retry) — the same steps and counters as the single engine; the error, if it
//!   still fails, reports the device's totals.
//! * **Locks.** An operation holds its shard's lock only. Whoever needs several (a merge, a
//!   stats read, the out-of-memory path, the second shard's start) takes the aggregate's lock, if
//!   at all, first, and then shards in index order, while holding no shard lock: no cycle.
//! * **Which shard.** A stream is given a shard the first time it is seen (round robin, so the
//!   first [`SHARDS`] streams never share one) and keeps it; the table is read without locks.
//!   `free` is told the allocation's stream (PyTorch's free hook and [`crate`]'s buffers know
//!   it); given a wrong one, it finds the owner by asking every shard.
//!
//! One difference of timing, not of decisions: a block freed after `record_stream` waits for
//! its events and is checked for them when *its* shard next allocates (the single engine checks
//! at every allocation of the device). The block could only be reused by its own stream — in
//! that shard — anyway; until then it may count as active longer than with the single engine.
//! `empty_cache` and the out-of-memory path wait for every event of every shard, as the single
//! engine does. (The equivalence test therefore uses no `record_stream`.)
//!
//! Not supported here (use [`cudamem_alloc::CachingAllocator`]): a per-process memory fraction, the
//! history and snapshots — each needs one device-wide view per operation, which is what
//! sharding removes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use cudamem_device::{Device, DevicePtr, StreamId};

use cudamem_alloc::hook::Attempt;
use cudamem_alloc::stats::{DeviceStats, Stat, StatSink};
use cudamem_alloc::summary::{self, StatsDict};
use cudamem_alloc::{policy, AllocError, AllocatorConfig, Engine};

/// Number of shards of a device: streams beyond this many share shards (correct, but they
/// contend).
pub const SHARDS: usize = 64;
/// A shard's log is merged when it holds this many operations. Fewer would end sooner the
/// logging that a shard passing its ceiling starts, which helps threads that take turns on
/// few cores; but threads on cores of their own pass their ceilings again right after every
/// merge, so a small threshold only makes merges, which lock every shard, more frequent, and
/// the whole device slower. The rule: the threshold is judged by pairs per second of 8 threads
/// on their own cores (`gpu_bench`, `sharded_cost mixed`), not by the share of operations
/// logged on a machine with fewer cores than threads.
const MERGE_AT: usize = 4096;
/// ...and its writer waits for a merge (instead of leaving it to a merge in progress) beyond
/// this many, so that logs stay bounded.
const MERGE_MUST: usize = 16 * MERGE_AT;
/// Slots of the stream → shard table.
const TABLE: usize = 1024;
/// The "current" values whose peaks are tracked across shards: 9 arrays × (small, large), then
/// `oversize_allocations`, `oversize_segments`.
const N: usize = cudamem_alloc::stats::POOL_VALUES;

/// Whether an operation that left its shard's log with `len` entries merges afterwards (at each
/// multiple of [`MERGE_AT`]).
#[inline(always)]
fn merge_due_at(len: usize) -> bool {
    len >= MERGE_AT && len.is_multiple_of(MERGE_AT)
}

mod clock;
mod log;
mod merge;
mod shard;
mod view;

use log::*;
use merge::*;
use shard::*;

impl Drop for ShardedAllocator {
    fn drop(&mut self) {
        if let Some(r) = self.replayers.get().filter(|r| r.pid == std::process::id()) {
            r.stop.store(true, Ordering::Release);
            r.wake();
            for h in lock(&r.handles).drain(..) {
                let _ = h.join();
            }
        }
    }
}

/// A device allocator with one engine per group of streams. See the
/// [module documentation](self).
#[derive(Debug)]
pub struct ShardedAllocator {
    shards: Box<[Shard]>,
    /// Stream → shard: key `stream + 1` (0 = empty slot), value the shard + 1 (0 = being set).
    table: Box<[(AtomicU64, AtomicU64)]>,
    next_shard: Padded<AtomicU64>,
    /// On lines of its own: merges write it while every operation reads the fields above.
    /// Shared with the replayers.
    merged: Arc<Merged>,
    /// The threads that replay the windows merges cut (from the second shard's start on).
    replayers: OnceLock<Replayers>,
    /// [`EMPTY`], [`MULTI`], or the one shard used so far.
    mode: AtomicU64,
    /// Raised by a `Bounded` shard that passed a ceiling: every shard logs from its next
    /// operation on, until the next merge settles them again (see [`ShardState::record`]).
    alarm: AtomicBool,
    device: Arc<dyn Device>,
    policy: String,
}

/// No shard used yet.
const EMPTY: u64 = u64::MAX;
/// Several shards used: every shard is `Bounded` or `Logged`.
const MULTI: u64 = u64::MAX - 1;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // State is consistent between operations; a panic under the lock is reported by itself.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ShardedAllocator {
    /// An allocator for `device` with the policy named `policy` (as on the command line) and
    /// the configuration `config`. A per-process memory fraction is refused (see the module
    /// documentation).
    pub fn new(device: Arc<dyn Device>, config: AllocatorConfig, policy: &str) -> Result<Self, AllocError> {
        if config.per_process_memory_fraction < 1.0 {
            return Err(AllocError::InvalidArgument(
                "a per-process memory fraction needs one device-wide view: use the unsharded allocator".into(),
            ));
        }
        let mut shards = Vec::with_capacity(SHARDS);
        for _ in 0..SHARDS {
            let mut cfg = config.clone();
            let p = policy::by_name(policy, &mut cfg).map_err(AllocError::InvalidArgument)?;
            shards.push(Shard(Mutex::new(ShardState {
                engine: Engine::new(device.clone(), cfg, p),
                log: Log::default(),
                start: [0; S],
                tracking: Tracking::Solo,
                demand: [0; S],
                used: false,
            })));
        }
        Ok(ShardedAllocator {
            shards: shards.into_boxed_slice(),
            table: (0..TABLE).map(|_| (AtomicU64::new(0), AtomicU64::new(0))).collect(),
            next_shard: Padded(AtomicU64::new(0)),
            replayers: OnceLock::new(),
            merged: Arc::new(Merged {
                aggregate: Padded(Mutex::new(Aggregate::new())),
                idle: Condvar::new(),
            }),
            mode: AtomicU64::new(EMPTY),
            alarm: AtomicBool::new(false),
            device,
            policy: policy.to_string(),
        })
    }

    /// What orders operations across shards on this machine: `"tsc"` (the CPU's time-stamp
    /// counter) or `"counter"` (a shared counter).
    pub fn clock_kind() -> &'static str {
        clock::kind()
    }

    /// What one read of that clock costs here, in ns (measured over 1M reads; for benchmarks).
    pub fn clock_cost_ns() -> f64 {
        let t = std::time::Instant::now();
        let mut x = 0u64;
        for _ in 0..1_000_000 {
            x = x.wrapping_add(clock::now());
        }
        std::hint::black_box(x);
        t.elapsed().as_nanos() as f64 / 1e6
    }

    /// The shard of a stream (assigned at first sight, then fixed).
    #[inline]
    fn shard_of(&self, stream: StreamId) -> usize {
        let key = stream.0.wrapping_add(1).max(1);
        let h = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize;
        for probe in 0..TABLE {
            let (k, v) = &self.table[(h + probe) % TABLE];
            let mut seen = k.load(Ordering::Acquire);
            if seen == 0 {
                // Claim the empty slot for this stream, then publish its shard (+1; 0 = not yet).
                match k.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        let shard = self.next_shard.fetch_add(1, Ordering::Relaxed) % SHARDS as u64;
                        v.store(shard + 1, Ordering::Release);
                        return shard as usize;
                    }
                    Err(x) => seen = x,
                }
            }
            if seen == key {
                loop {
                    // The claimer stores the shard right after its claim.
                    let s = v.load(Ordering::Acquire);
                    if s != 0 {
                        return (s - 1) as usize;
                    }
                    std::hint::spin_loop();
                }
            }
        }
        h % SHARDS // table full: a fixed hash (a stream never moves)
    }

    fn shard(&self, i: usize) -> MutexGuard<'_, ShardState> {
        lock(&self.shards[i].0)
    }

    /// Before an operation on shard `i` (holding no lock): makes sure the mode is "only shard
    /// `i` so far" or "several" — so that, under the shard's lock, `tracking` is right.
    #[inline]
    fn enter(&self, i: usize) {
        let m = self.mode.load(Ordering::Acquire);
        if m != MULTI && m != i as u64 {
            self.switch_mode(i);
        }
    }

    /// The first operation of a shard: the first one of the device makes it the only one; a
    /// second one seeds the aggregate with the first shard's own stats (exact, since it was the
    /// device until now) and settles every shard. Holds every lock meanwhile.
    #[cold]
    fn switch_mode(&self, i: usize) {
        let mut agg = lock(&self.merged.aggregate);
        let mut shards: Vec<_> = (0..self.shards.len()).map(|j| self.shard(j)).collect();
        match self.mode.load(Ordering::Acquire) {
            EMPTY => self.mode.store(i as u64, Ordering::Release),
            m if m == MULTI || m == i as u64 => {}
            solo => {
                let mut s = *shards[solo as usize].engine.kept_stats();
                agg.current[..N].copy_from_slice(&currents(&s));
                for (a, arr) in s.arrays_mut().into_iter().enumerate() {
                    agg.current[N + a] = arr.0[0].current;
                    agg.peak[2 * a] = arr.0[1].peak;
                    agg.peak[2 * a + 1] = arr.0[2].peak;
                    agg.peak[N + a] = arr.0[0].peak;
                }
                agg.peak[18] = s.oversize_allocations.peak;
                agg.peak[19] = s.oversize_segments.peak;
                // The others are unused: `Bounded` at ceilings 0 from here on.
                for st in shards.iter_mut() {
                    st.tracking = Tracking::Bounded;
                }
                shards[solo as usize].used = true;
                shards[solo as usize].close_window();
                settle(&agg.peak, &mut shards, &self.alarm);
                self.mode.store(MULTI, Ordering::Release);
                if let Some(r) = Replayers::spawn(self.merged.clone()) {
                    let _ = self.replayers.set(r);
                }
            }
        }
    }

    /// Allocates `size` bytes for use on `stream`. Size 0 returns address 0.
    pub fn malloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        self.malloc_noting(size, stream).map(|(p, _)| p)
    }

    /// [`malloc`](Self::malloc), also naming the shard if the allocation is now its only live
    /// one (its count of live allocations went from 0 to 1). An owner that must outlive its
    /// allocations can then hold itself alive per shard instead of per allocation — which would
    /// make every thread write one shared reference count (the Rust API does this), and
    /// [`free_noting`](Self::free_noting) names the shard when its count is back to 0.
    pub fn malloc_noting(&self, size: u64, stream: StreamId) -> Result<(DevicePtr, Option<usize>), AllocError> {
        let i = self.shard_of(stream);
        self.enter(i);
        let mut st = self.shard(i);
        let before = st.engine.kept_stats().allocation.all().current;
        let r = st.engine.malloc_or_defer(size, stream);
        st.record(&self.alarm);
        let first = (before == 0 && st.engine.kept_stats().allocation.all().current > 0).then_some(i);
        let len = st.log.entries.len();
        drop(st);
        match r? {
            Attempt::Done(p) => {
                self.after_op(len);
                Ok((p, first))
            }
            Attempt::NeedsDeviceRelease => self.malloc_after_release(i, size, stream),
        }
    }

    /// PyTorch's last resort across shards: release every cached block of the device (the
    /// other shards' first, then this one's), retry once.
    #[cold]
    fn malloc_after_release(
        &self,
        i: usize,
        size: u64,
        stream: StreamId,
    ) -> Result<(DevicePtr, Option<usize>), AllocError> {
        let mut all: Vec<_> = (0..self.shards.len()).map(|j| self.shard(j)).collect();
        for (j, st) in all.iter_mut().enumerate() {
            // Any segment, even one with no pages mapped (an expandable segment's reserved
            // address range): the single engine's release frees those too, and skipping them
            // here left the device's address space different (found by the property test).
            if j != i && st.engine.has_segments() {
                // Shard i's release below counts the device's one synchronisation.
                st.engine.empty_cache_uncounted()?;
                st.record(&self.alarm);
            }
        }
        let st = &mut all[i];
        let before = st.engine.kept_stats().allocation.all().current;
        let r = st.engine.malloc_after_device_release(size, stream);
        st.record(&self.alarm);
        let first = (before == 0 && st.engine.kept_stats().allocation.all().current > 0).then_some(i);
        match r {
            Err(e) if e.is_out_of_memory() => Err(self.device_wide_oom(&all, e)),
            r => r.map(|p| (p, first)),
        }
    }

    /// An out-of-memory error whose totals are the device's, not one shard's.
    fn device_wide_oom(&self, all: &[MutexGuard<'_, ShardState>], e: AllocError) -> AllocError {
        match e {
            AllocError::OutOfMemory(mut o) => {
                o.allocated = all
                    .iter()
                    .map(|s| s.engine.kept_stats().allocated_bytes.all().current as u64)
                    .sum();
                o.reserved = all
                    .iter()
                    .map(|s| s.engine.kept_stats().reserved_bytes.all().current as u64)
                    .sum();
                o.largest_free_block = all.iter().map(|s| s.engine.largest_free_block()).max().unwrap_or(0);
                AllocError::OutOfMemory(o)
            }
            e => e,
        }
    }

    /// Frees an allocation made on `stream` (PyTorch's free hook passes it). With a wrong
    /// stream the owner is searched for; an address no shard handed out is an error.
    pub fn free(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        self.free_noting(ptr, stream).map(|_| ())
    }

    /// [`free`](Self::free), also naming the allocation's shard if it now has no live
    /// allocation (see [`malloc_noting`](Self::malloc_noting)).
    pub fn free_noting(&self, ptr: DevicePtr, stream: StreamId) -> Result<Option<usize>, AllocError> {
        // SAFETY: `self` is a live reference for the whole call.
        unsafe { Self::free_noting_raw(self, ptr, stream, || ()) }.0
    }

    /// [`ShardedAllocator::free_noting`] for a caller whose free may let another thread drop
    /// the allocator as soon as the shard's lock is given back (the Rust API, when no handle
    /// is left and the freed allocation was what kept the allocator alive): no reference to
    /// `*this` is used, or held as an argument, after that point, except while `pin()`'s value
    /// is held. `pin` is called under the shard's lock when the operation is due to merge the
    /// shards' logs afterwards (once in [`MERGE_AT`] operations of a shard), and its value —
    /// which must keep `*this` alive while held — is returned, to be dropped once this
    /// function has returned.
    ///
    /// # Safety
    /// `this` must point to a live `ShardedAllocator` until the shard's lock is taken here
    /// (a live allocation on the shard, which this call frees, ensures it in the Rust API).
    pub unsafe fn free_noting_raw<P>(
        this: *const Self,
        ptr: DevicePtr,
        stream: StreamId,
        pin: impl FnOnce() -> P,
    ) -> (Result<Option<usize>, AllocError>, Option<P>) {
        if ptr == 0 {
            return (Ok(None), None);
        }
        // SAFETY: live until the lock is taken (the caller's contract), and the local reference
        // is used after the lock is given back only while `pinned` keeps the allocator alive.
        let s = unsafe { &*this };
        let i = s.shard_of(stream);
        s.enter(i);
        let mut st = s.shard(i);
        match st.engine.free(ptr) {
            Ok(()) => {
                st.record(&s.alarm);
                let last = (st.engine.kept_stats().allocation.all().current == 0).then_some(i);
                let len = st.log.entries.len();
                let pinned = merge_due_at(len).then(pin);
                drop(st);
                if pinned.is_some() {
                    s.merge_due(len);
                }
                (Ok(last), pinned)
            }
            Err(e @ AllocError::InvalidPointer { .. }) => {
                drop(st);
                // A wrong stream: the owner is another shard. If none has it, this shard's
                // explanation (e.g. "freed already") is the one that applies. (The allocation
                // is still live here, so `s` is too; this rare path takes the lock of the
                // owner's shard and returns without merging.)
                let r = match s.free_anywhere_noting(ptr) {
                    Err(AllocError::InvalidPointer { .. }) => Err(e),
                    r => r,
                };
                (r, None)
            }
            Err(e) => (Err(e), None),
        }
    }

    /// Frees an allocation whose stream the caller does not know (asks every shard).
    pub fn free_anywhere(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        self.free_anywhere_noting(ptr).map(|_| ())
    }

    fn free_anywhere_noting(&self, ptr: DevicePtr) -> Result<Option<usize>, AllocError> {
        for i in 0..self.shards.len() {
            let mut st = self.shard(i);
            if st.engine.owns(ptr) {
                st.engine.free(ptr)?;
                st.record(&self.alarm);
                return Ok((st.engine.kept_stats().allocation.all().current == 0).then_some(i));
            }
        }
        // No shard has it: let shard 0 explain what is wrong with the address.
        let mut st = self.shard(0);
        st.engine.free(ptr).map(|_| None)
    }

    /// PyTorch's `recordStream`: the allocation at `ptr`, made on `stream`, is used on `user`.
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamId, user: StreamId) -> Result<(), AllocError> {
        let mut st = self.shard(self.shard_of(stream));
        st.engine.record_stream(ptr, user)
    }

    /// Returns every shard's unused cached memory to the device.
    pub fn empty_cache(&self) -> Result<(), AllocError> {
        for i in 0..self.shards.len() {
            let mut st = self.shard(i);
            if i > 0 {
                // One device-wide synchronisation, as the single engine counts it.
                st.engine.empty_cache_uncounted()?;
            } else {
                st.engine.empty_cache()?;
            }
            st.record(&self.alarm);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

#[doc(hidden)]
pub mod workload;
