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

use cudamem_alloc::engine::hook::Attempt;
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

/// The timestamp of the operation just done, taken under the shard's lock.
mod clock {
    use super::*;

    static FALLBACK: AtomicU64 = AtomicU64::new(0);

    /// Whether the time-stamp counter orders events across cores on this machine.
    fn tsc_is_reliable() -> bool {
        static OK: OnceLock<bool> = OnceLock::new();
        *OK.get_or_init(|| {
            cfg!(target_arch = "x86_64")
                && std::env::var_os("CUDAMEM_SHARD_CLOCK").is_none_or(|v| v != "counter")
                && std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
                    .is_ok_and(|s| s.trim() == "tsc")
        })
    }

    /// What orders the operations: `"tsc"` or `"counter"`.
    pub fn kind() -> &'static str {
        if tsc_is_reliable() {
            "tsc"
        } else {
            "counter"
        }
    }

    #[inline]
    pub fn now() -> u64 {
        #[cfg(target_arch = "x86_64")]
        if tsc_is_reliable() {
            let mut aux = 0u32;
            // SAFETY: `rdtscp` exists on every x86-64 CPU whose kernel uses the TSC as its
            // clocksource; it reads a counter and writes `aux`, nothing else. It waits for the
            // instructions before it, so the stamp follows the operation's state changes.
            return unsafe { core::arch::x86_64::__rdtscp(&mut aux) };
        }
        FALLBACK.fetch_add(1, Ordering::SeqCst)
    }
}

/// The tracked "current" values of a stats record, in the order of
/// [`DeviceStats::pool_value`] (bit `i` of a shard's [`Changes`] is value `i`).
#[inline]
fn currents(s: &DeviceStats) -> [i64; N] {
    std::array::from_fn(|i| s.pool_value(i))
}

/// Every tracked series of a stats record — the [`N`] per-pool values, then the 9 arrays'
/// `all` — as (current, peak).
fn series(s: &DeviceStats) -> ([i64; S], [i64; S]) {
    let (mut cur, mut high) = ([0i64; S], [0i64; S]);
    for (a, (_, arr)) in s.arrays().into_iter().enumerate() {
        for (k, series) in [(1, 2 * a), (2, 2 * a + 1), (0, N + a)] {
            cur[series] = arr.0[k].current;
            high[series] = arr.0[k].peak;
        }
    }
    for (series, st) in [(18, s.oversize_allocations), (19, s.oversize_segments)] {
        cur[series] = st.current;
        high[series] = st.peak;
    }
    (cur, high)
}

/// Series whose peaks are tracked: the [`N`] per-pool values, then the 9 arrays' `all`.
const S: usize = N + 9;

/// Changes of the tracked values since the last merge, one entry per operation that changed
/// any, plus a summary that lets a merge skip the entries when they cannot make a new peak.
/// The summary is not kept per operation: the shard's engine already keeps, for every stat, its
/// highest value — which no one reads once several shards are used (the device's peaks are the
/// aggregate's) — so the window's largest rise is that peak minus the window's start value,
/// read when the window closes ([`ShardState::close_window`]).
///
/// Compact, because a merge that replays reads every byte from other cores, and the writer
/// then pays to own those lines again: an entry is 8 bytes (the stamp as an offset from
/// `base`, and the mask), a change one 4-byte word as a rule (see [`push_delta`]) — about 32
/// bytes per operation instead of 64.
#[derive(Debug)]
struct Log {
    /// (timestamp − `base`, bit i set if value i changed); the mask [`REBASE`] instead moves
    /// `base` to the stamp written as the entry's changes (for windows longer than 2³² ticks).
    entries: Vec<(u32, u32)>,
    /// The changes, in entry order and bit order, encoded by [`push_delta`].
    deltas: Vec<i32>,
    /// The stamp the entries' offsets count from (that of the window's first entry).
    base: u64,
    /// Per series: the shard's value where its entries start (set when the window closes) —
    /// the window's start, or the moment the shard began logging within it.
    start: [i64; S],
    /// Per series: the net change over the entries (set when the window closes).
    net: [i64; S],
    /// Per series: the largest rise over the window above its start value, ≥ 0 (set when it
    /// closes; it may count a value reached inside an operation, so it bounds the rise of the
    /// logged end values from above, which is all a merge needs to skip the entries).
    rise: [i64; S],
}

impl Default for Log {
    fn default() -> Self {
        Log {
            entries: Vec::new(),
            deltas: Vec::new(),
            base: 0,
            start: [0; S],
            net: [0; S],
            rise: [0; S],
        }
    }
}

/// The mask of an entry that sets a log's `base` (no real entry has bit 31: `N` < 31).
const REBASE: u32 = 1 << 31;

/// Appends a change: one word when it fits in an `i32` other than `i32::MIN`, otherwise
/// `i32::MIN` and the value's low and high halves.
#[inline]
fn push_delta(deltas: &mut Vec<i32>, d: i64) {
    match i32::try_from(d) {
        Ok(w) if w != i32::MIN => deltas.push(w),
        _ => deltas.extend_from_slice(&[i32::MIN, d as i32, (d >> 32) as i32]),
    }
}

/// [`push_delta`] into space already reserved (`out` has room for the longest form); returns
/// the words written. The hot path's copy of the encoding (the round-trip test holds the two to
/// the same words): built on `push_delta`'s word array, or written without the slice, it cost
/// 28–55 more instructions per logged operation.
#[inline(always)]
fn write_delta(out: &mut [std::mem::MaybeUninit<i32>], d: i64) -> usize {
    // One unsigned comparison for "fits in an i32 other than i32::MIN".
    if (d.wrapping_add(i32::MAX as i64) as u64) < u32::MAX as u64 {
        out[0].write(d as i32);
        1
    } else {
        out[0].write(i32::MIN);
        out[1].write(d as i32);
        out[2].write((d >> 32) as i32);
        3
    }
}

/// Reads the change at `*at` (written by [`push_delta`]) and moves past it.
#[inline]
fn read_delta(deltas: &[i32], at: &mut usize) -> i64 {
    let w = deltas[*at];
    if w != i32::MIN {
        *at += 1;
        return w as i64;
    }
    let d = (deltas[*at + 1] as u32 as i64) | ((deltas[*at + 2] as i64) << 32);
    *at += 3;
    d
}

impl Log {
    fn clear(&mut self) {
        self.entries.clear();
        self.deltas.clear();
        self.net = [0; S];
        self.rise = [0; S];
    }
}

/// How a shard's operations reach the device's peaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tracking {
    /// The shard is the only one used so far: it is the device, its own stats are exact.
    Solo,
    /// Nothing is logged while every tracked value of the shard stays at or below its
    /// ceiling: the ceilings of all shards sum to at most the device's peaks, so no operation
    /// can make a new peak.
    Bounded,
    /// Every operation that changes a tracked value is logged with its timestamp.
    Logged,
}

/// What a shard's engine changed in the operation under way, told as it changes it (values
/// numbered as [`DeviceStats::pool_value`] numbers them): which values changed and by how much
/// in all, and whether one of them, or its array's `all`, went above the shard's ceiling. So a
/// shard reads nothing after an operation: a bounded one tests one flag, a logged one writes the
/// amounts as they are, and the values before the operation are the values minus the amounts.
/// A few instructions per change (a fall compares nothing); comparing all twenty values and
/// their nine sums after every operation cost about 180, and comparing those that rose about 100.
#[derive(Debug)]
struct Changes {
    /// Bit `i`: value `i` changed (by `delta[i]`, which may net to 0).
    mask: u32,
    /// Some value, or some array's `all`, was above its ceiling after a change. Within an
    /// operation values first fall and then rise, so a value above its ceiling at some change
    /// is above it at the end (and a flag raised for nothing would only log more).
    over: bool,
    /// Per value: the operation's net change.
    delta: [i64; N],
    /// Per value: the highest it may reach unlogged (see [`Tracking::Bounded`]).
    ceiling: [i64; N],
    /// Per array: the highest its `all` may reach unlogged; the last entry, for the oversize
    /// counters (which have no `all`), is never reached.
    ceiling_all: [i64; S - N + 1],
}

impl Default for Changes {
    fn default() -> Self {
        let mut ceiling_all = [0; S - N + 1];
        // The oversize counters' slot (`i >> 1` of 18 and 19): they have no `all`.
        ceiling_all[S - N] = i64::MAX;
        Changes {
            mask: 0,
            over: false,
            delta: [0; N],
            ceiling: [0; N],
            ceiling_all,
        }
    }
}

impl Changes {
    /// Ready for the next operation.
    #[inline(always)]
    fn clear(&mut self) {
        self.mask = 0;
        self.over = false;
        self.delta = [0; N];
    }

    /// Sets the ceiling of series `k` (the [`N`] values, then the 9 arrays' `all`).
    fn set_ceiling(&mut self, k: usize, c: i64) {
        if k < N {
            self.ceiling[k] = c;
        } else {
            self.ceiling_all[k - N] = c;
        }
    }
}

impl StatSink for Changes {
    #[inline(always)]
    fn rose(&mut self, i: usize, delta: i64, now: i64, all: i64) {
        self.mask |= 1 << i;
        self.delta[i] += delta;
        self.over |= (now > self.ceiling[i]) | (all > self.ceiling_all[i >> 1]);
    }

    /// A fall passes no ceiling: nothing to compare.
    #[inline(always)]
    fn fell(&mut self, i: usize, delta: i64) {
        self.mask |= 1 << i;
        self.delta[i] += delta;
    }
}

/// One shard: an engine and the log of its operations.
#[derive(Debug)]
struct ShardState {
    engine: Engine<Changes>,
    log: Log,
    /// Every series' value where the log window began (or, after the window closed, where
    /// the next one begins).
    start: [i64; S],
    tracking: Tracking,
    /// Per series: how far the shard rose above its value at the end of the last window
    /// (set when a window closes; what [`settle`] shares the headroom by).
    demand: [i64; S],
    /// Whether the shard has been used since several shards are (or was the one before). An
    /// unused shard holds nothing — no memory, no log — and its ceilings are its values (0), so
    /// its first operation that changes a tracked value passes them and logs (see
    /// [`ShardState::start_logging`], which sets this). Merges skip unused shards but for their
    /// locks: most of [`SHARDS`] usually are.
    used: bool,
}

// Within one operation every series first falls (events processed, caches released, pages
// reclaimed) and then rises (the new block), never the other way round; so an operation's
// highest point is its start or its end, and only end values are logged and checked for peaks.

/// The [`S`] series of [`N`] per-pool values (each `all` is small + large).
#[inline]
fn series_of(v: &[i64; N]) -> [i64; S] {
    let mut out = [0i64; S];
    out[..N].copy_from_slice(v);
    for a in 0..9 {
        out[N + a] = v[2 * a] + v[2 * a + 1];
    }
    out
}

impl ShardState {
    /// Notes what the operation just done changed. Call under the shard's lock, after every
    /// operation that may change stats. On the hot path of every sharded operation:
    /// * `Bounded` (the steady state): if no value went above its ceiling (the engine's sink
    ///   compared each as it changed) and no shard has raised `alarm`, that is all.
    /// * Otherwise the shard logs, starting with this operation — and raises `alarm` if it
    ///   passed a ceiling, so that every shard logs from its next operation on.
    ///
    /// Why that is exact: an unlogged operation read `alarm` clear after its changes, so it
    /// precedes (in the one order of all atomic operations) the first store of `alarm`; put
    /// it there in the order of operations. Up to that store every shard was within its
    /// ceilings, so no peak was passed; from it on every operation is logged, stamped after
    /// its own read (or store) of `alarm`, and each shard's log starts from its values at that
    /// moment (those before its first logged operation). A merge replays from there.
    #[inline(always)]
    fn record(&mut self, alarm: &AtomicBool) {
        match self.tracking {
            Tracking::Solo => {}
            Tracking::Bounded if !self.engine.sink().over && !alarm.load(Ordering::SeqCst) => {
                self.engine.sink_mut().clear()
            }
            _ => self.record_tracked(alarm),
        }
    }

    /// [`Self::record`] of a `Bounded` shard that passed a ceiling or saw the `alarm`, and of a
    /// `Logged` one (out of line: the others then pay a few comparisons, not this function's
    /// register saves).
    #[inline(never)]
    fn record_tracked(&mut self, alarm: &AtomicBool) {
        if self.tracking == Tracking::Bounded {
            self.start_logging(self.engine.sink().over, alarm);
        }
        let sink = self.engine.sink_mut();
        let changed = sink.mask;
        if changed == 0 {
            sink.clear();
            return;
        }
        // Stamped after the operation's state changes (see `clock::now`), before the log's.
        let t = clock::now();
        let log = &mut self.log;
        if log.entries.is_empty() {
            log.base = t;
        }
        let mut offset = t.wrapping_sub(log.base);
        if offset > u32::MAX as u64 {
            log.entries.push((0, REBASE));
            push_delta(&mut log.deltas, t as i64);
            log.base = t;
            offset = 0;
        }
        // The changes go straight into reserved space (at most 3 words for each of N values),
        // with one length update: a push per change checked the capacity each time.
        log.deltas.reserve(3 * N);
        let len = log.deltas.len();
        let spare = &mut log.deltas.spare_capacity_mut()[..3 * N];
        // Every noted value gets a change, 0 included (a value changed and changed back within
        // the operation: rare, and harmless to a replay), so the mask is the engine's.
        let (mut m, mut k) = (changed, 0usize);
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            k += write_delta(&mut spare[k..k + 3], sink.delta[i]);
        }
        // SAFETY: the first `k` words of the spare capacity were just written.
        unsafe { log.deltas.set_len(len + k) };
        log.entries.push((offset as u32, changed));
        sink.clear();
    }

    /// The tracked values before the operation just done: now minus what it changed.
    fn values_before(&self) -> [i64; N] {
        let now = currents(self.engine.kept_stats());
        std::array::from_fn(|i| now[i] - self.engine.sink().delta[i])
    }

    /// `Bounded` → `Logged`, before the operation just done: raise `alarm` (with a full
    /// barrier, before the operation's stamp) if this shard passed a ceiling; the shard's log
    /// starts from its values before the operation.
    #[cold]
    fn start_logging(&mut self, over: bool, alarm: &AtomicBool) {
        if over {
            alarm.store(true, Ordering::SeqCst);
        }
        self.used = true;
        self.start = series_of(&self.values_before());
        // Rises are counted from here: the operation's end value is its highest point.
        self.engine.reset_peak_stats();
        self.tracking = Tracking::Logged;
    }

    /// Closes the log window (under every shard's lock): the log gets the shard's values where
    /// its entries start, and their net change and largest rise per series; the shard's
    /// `demand` is its rise above where it ends; the next window starts from here, with the
    /// engine's peaks back at the current values.
    fn close_window(&mut self) {
        let (now, high) = series(self.engine.kept_stats());
        if self.tracking == Tracking::Logged && !self.log.entries.is_empty() {
            self.log.start = self.start;
            for k in 0..S {
                self.log.net[k] = now[k] - self.start[k];
                // A shard that began logging inside the window counts its rise from there
                // (its peaks were reset then); `max` because its start may be the higher.
                self.log.rise[k] = (high[k] - self.start[k]).max(0);
            }
        } else {
            // Nothing logged (net and rise stay 0: a taken log comes back cleared): whatever
            // the shard did unlogged stayed under its ceilings, and its values now are those
            // it had when the first shard began logging, if one did.
            self.log.start = now;
        }
        for k in 0..S {
            self.demand[k] = (high[k] - now[k]).max(0);
        }
        self.start = now;
        self.engine.reset_peak_stats();
    }
}

/// Every shard (all locked, windows just closed) becomes `Bounded`, with ceilings from
/// [`headroom_shares`] per series. `peak` may be older than the shards' values (a merge replays
/// the window after the shards run again): a total above it is a value the device had, so the
/// peak is at least that.
fn settle(peak: &[i64; S], shards: &mut [MutexGuard<'_, ShardState>], alarm: &AtomicBool) {
    // The used shards only: an unused one keeps its ceilings at its values, 0.
    let mut used = [0usize; SHARDS];
    let mut n = 0;
    for (i, st) in shards.iter().enumerate() {
        if st.used {
            used[n] = i;
            n += 1;
        }
    }
    let used = &used[..n];
    let (mut current, mut demand, mut share) = ([0i64; SHARDS], [0i64; SHARDS], [0i64; SHARDS]);
    for (k, &peak) in peak.iter().enumerate() {
        for (j, &i) in used.iter().enumerate() {
            current[j] = shards[i].start[k];
            demand[j] = shards[i].demand[k];
        }
        headroom_shares(peak, &current[..n], &demand[..n], &mut share[..n]);
        for (j, &i) in used.iter().enumerate() {
            let st = &mut shards[i];
            let c = st.start[k] + share[j];
            st.engine.sink_mut().set_ceiling(k, c);
        }
    }
    for &i in used {
        let st: &mut ShardState = &mut shards[i];
        // Between operations the sink is clear, but for the shard that was the device until
        // now: a `Solo` shard records nothing, and its sink kept adding.
        st.engine.sink_mut().clear();
        st.tracking = Tracking::Bounded;
    }
    alarm.store(false, Ordering::SeqCst);
}

/// How one series' headroom — its peak (at least its current total) minus that total — is
/// shared among shards whose values are `current` and who rose by `demand` (≥ 0) in the last
/// window: first each shard's demand, then the rest evenly among those that rose (among all if
/// none did); if the headroom is short, in proportion to demand. Guarantees: every share is
/// ≥ 0 and the shares sum to at most the headroom — so ceilings (`current + share`) sum to at
/// most the peak, which is what makes unlogged operations exact (see [`ShardState::record`]).
fn headroom_shares(peak: i64, current: &[i64], demand: &[i64], share: &mut [i64]) {
    let total: i64 = current.iter().sum();
    let slack = peak.max(total) - total;
    let want: i64 = demand.iter().sum();
    let wanting = demand.iter().filter(|&&d| d > 0).count() as i64;
    let n = current.len().max(1) as i64;
    for (s, &d) in share.iter_mut().zip(demand) {
        *s = if want <= slack {
            let rest = slack - want;
            d + if wanting == 0 {
                rest / n
            } else if d > 0 {
                rest / wanting
            } else {
                0
            }
        } else {
            (d as i128 * slack as i128 / want as i128) as i64
        };
    }
}

/// A value on cache lines of its own (128 bytes: adjacent-line prefetch pairs 64-byte lines).
#[derive(Debug)]
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Cache-line aligned so that shards do not share lines.
#[derive(Debug)]
#[repr(align(128))]
struct Shard(Mutex<ShardState>);

/// The merged view: the tracked values of the whole device and their peaks, and the windows of
/// logs that merges took and that wait for a replay.
#[derive(Debug)]
struct Aggregate {
    /// Per series (the `all` ones as small + large), as of the last cut.
    current: [i64; S],
    peak: [i64; S],
    /// Windows cut and not yet replayed, oldest first: one log per shard each.
    queue: std::collections::VecDeque<Vec<Log>>,
    /// Windows being replayed by replayers, outside the lock.
    in_flight: usize,
    /// Emptied windows, for the next cuts (their logs keep their capacity).
    spare: Vec<Vec<Log>>,
    /// Windows that had to replay operations one by one (a new peak was possible).
    replays: u64,
    /// Windows merged in all.
    merges: u64,
    /// Time spent replaying, ns.
    replay_ns: u64,
    /// Log entries cut (operations logged, and the rare rebase entry).
    logged: u64,
}

/// The aggregate, and what tells a reader that the replayers have finished.
#[derive(Debug)]
struct Merged {
    aggregate: Padded<Mutex<Aggregate>>,
    /// Notified when the last window in flight is applied.
    idle: Condvar,
}

/// At most this many windows wait for replayers; a merge beyond it replays one itself.
const QUEUE_MAX: usize = 4;

impl Aggregate {
    fn new() -> Aggregate {
        Aggregate {
            current: [0; S],
            peak: [0; S],
            queue: std::collections::VecDeque::new(),
            in_flight: 0,
            spare: Vec::new(),
            replays: 0,
            merges: 0,
            replay_ns: 0,
            logged: 0,
        }
    }

    /// Takes every shard's log (all locked: one window of time, ending now) into the queue and
    /// notes the device's totals now. The caller then [`settle`]s the shards, before it lets
    /// them go.
    fn cut(&mut self, shards: &mut [MutexGuard<'_, ShardState>]) {
        let mut logs = self
            .spare
            .pop()
            .unwrap_or_else(|| (0..shards.len()).map(|_| Log::default()).collect());
        self.current = [0; S];
        for (st, log) in shards.iter_mut().zip(logs.iter_mut()) {
            if !st.used {
                // Nothing to take: its log is empty, its values 0 (and so is the `start` of
                // this slot's log, which only this shard's windows ever filled).
                continue;
            }
            st.close_window();
            std::mem::swap(log, &mut st.log);
            self.logged += log.entries.len() as u64;
            for s in 0..S {
                self.current[s] += st.start[s];
            }
        }
        self.queue.push_back(logs);
    }

    /// Applies a replayed window: its peaks (the window's own, at least `self.peak` as it was
    /// when the replay began) raise the device's; its logs go back to the spares.
    fn apply(&mut self, mut logs: Vec<Log>, replayed: Option<[i64; S]>, ns: u64) {
        self.merges += 1;
        if let Some(peak) = replayed {
            self.replays += 1;
            self.replay_ns += ns;
            for (p, q) in self.peak.iter_mut().zip(peak) {
                *p = (*p).max(q);
            }
        }
        for l in &mut logs {
            l.clear();
        }
        self.spare.push(logs);
    }

    /// Replays the oldest queued window here, under the lock; false if none was queued.
    fn replay_oldest(&mut self) -> bool {
        let Some(logs) = self.queue.pop_front() else {
            return false;
        };
        let t = std::time::Instant::now();
        let r = replay_window(&logs, &self.peak);
        self.apply(logs, r, t.elapsed().as_nanos() as u64);
        true
    }

    /// Replays every queued window here, under the lock.
    fn replay_queued(&mut self) {
        while self.replay_oldest() {}
    }
}

/// Every window merged: queued ones replayed here, and — unless the replayers are not this
/// process's (a child made by `fork`) — those in flight waited for.
fn drain<'a>(merged: &'a Merged, own_replayers: bool) -> MutexGuard<'a, Aggregate> {
    let mut agg = lock(&merged.aggregate);
    loop {
        agg.replay_queued();
        if agg.in_flight == 0 || !own_replayers {
            return agg;
        }
        agg = merged.idle.wait(agg).unwrap_or_else(|e| e.into_inner());
    }
}

/// Replays one window's logs against the peaks `peak` (as known when it starts): `None` if no
/// series can have passed its peak in the window — its value where the logs start plus every
/// shard's largest rise is at most the peak — otherwise the peaks after applying every logged
/// operation in timestamp order. Windows are independent (each log carries the value it
/// starts from), so replayers can work on several at once.
fn replay_window(logs: &[Log], peak: &[i64; S]) -> Option<[i64; S]> {
    // Where the replay starts: every shard's value where its entries start — the moment the
    // first shard began logging (see `ShardState::record`).
    let mut current = [0i64; S];
    let mut rise = [0i64; S];
    for l in logs {
        for s in 0..S {
            current[s] += l.start[s];
            rise[s] += l.rise[s];
        }
    }
    // Series that may have passed their peak in the window, as bits of [0, S).
    let mut may = 0u64;
    for s in 0..S {
        if current[s] + rise[s] > peak[s] {
            may |= 1 << s;
        }
    }
    if may == 0 {
        return None;
    }
    let mut peak = *peak;
    let logs: Vec<&Log> = logs.iter().filter(|l| !l.entries.is_empty()).collect();
    replay(&logs, may, &mut current, &mut peak);
    Some(peak)
}

/// Applies every operation of `logs` in timestamp order to the series in `may` (bits of
/// [0, S)) and the per-pool values they are made of, raising their peaks. Series outside
/// `may` cannot have passed their peak; skipping them keeps a replay's cost to what it must
/// read.
fn replay(logs: &[&Log], may: u64, current: &mut [i64; S], peak: &mut [i64; S]) {
    // Per-pool values to track: those in `may`, and both halves of every `all` in `may`;
    // `all_pairs` has bit 2a for every `all` in `may`.
    let mut track = (may as u32) & ((1 << N) - 1);
    let mut all_pairs = 0u32;
    for a in 0..9 {
        if may & (1 << (N + a)) != 0 {
            track |= 0b11 << (2 * a);
            all_pairs |= 1 << (2 * a);
        }
    }
    // Per log: where its next entry and that entry's changes are, its base, and the entry's
    // stamp (u64::MAX when done).
    let mut pos: Vec<(usize, usize, u64)> = logs.iter().map(|l| (0, 0, l.base)).collect();
    let mut head = vec![0u64; logs.len()];
    for k in 0..logs.len() {
        head[k] = next_stamp(logs[k], &mut pos[k]);
    }
    while let Some((k, &t)) = head.iter().enumerate().min_by_key(|&(_, t)| *t) {
        if t == u64::MAX {
            break;
        }
        let log = logs[k];
        let (e, mut d, base) = pos[k];
        let mask = log.entries[e].1;
        // Every change of the operation first, then the totals: an operation's end values are
        // its highest point (see the note above `impl ShardState`), but a total built halfway —
        // one pool moved, the other not yet — is a value that never existed (e.g. the
        // out-of-memory path frees a large segment and maps a small one).
        let mut m = mask;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            let delta = read_delta(&log.deltas, &mut d);
            if track & (1 << i) == 0 {
                continue;
            }
            current[i] += delta;
            peak[i] = peak[i].max(current[i]);
        }
        // Bit 2a: array a's small or large value moved and its `all` is tracked.
        let mut a_bits = (mask | (mask >> 1)) & all_pairs;
        while a_bits != 0 {
            let a = a_bits.trailing_zeros() as usize / 2;
            a_bits &= a_bits - 1;
            current[N + a] = current[2 * a] + current[2 * a + 1];
            peak[N + a] = peak[N + a].max(current[N + a]);
        }
        pos[k] = (e + 1, d, base);
        head[k] = next_stamp(log, &mut pos[k]);
    }
}

/// The stamp of the entry at `pos` (entry, change, base) of `log`, after applying any
/// [`REBASE`] entries there; `u64::MAX` past the end.
fn next_stamp(log: &Log, pos: &mut (usize, usize, u64)) -> u64 {
    loop {
        let Some(&(offset, mask)) = log.entries.get(pos.0) else {
            return u64::MAX;
        };
        if mask != REBASE {
            return pos.2 + offset as u64;
        }
        pos.2 = read_delta(&log.deltas, &mut pos.1) as u64;
        pos.0 += 1;
    }
}

/// Threads that replay the windows merges cut (see [`ShardedAllocator::after_op`]): woken after
/// a cut, each takes the oldest queued window, replays it without the lock and applies it —
/// several windows at once when one thread cannot keep up. Stopped and joined when the
/// allocator is dropped.
#[derive(Debug)]
struct Replayers {
    threads: Vec<std::thread::Thread>,
    handles: Mutex<Vec<std::thread::JoinHandle<()>>>,
    stop: Arc<AtomicBool>,
    /// The process that started the threads: a child made by `fork` has none. Its merges
    /// still replay, at the next merge or read (replayers only save time) — but a window a
    /// replayer was replaying at the fork is lost to the child's peaks. (CUDA does not support
    /// a child using the parent's device anyway.)
    pid: u32,
}

/// Replayer threads per allocator.
const REPLAYERS: usize = 2;

impl Replayers {
    /// `None` if no thread can be started: merges then replay where they run.
    fn spawn(merged: Arc<Merged>) -> Option<Replayers> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for k in 0..REPLAYERS {
            let (merged, stopped) = (merged.clone(), stop.clone());
            let h = std::thread::Builder::new()
                .name(format!("cudamem-replay-{k}"))
                .spawn(move || replayer_loop(&merged, &stopped));
            match h {
                Ok(h) => handles.push(h),
                Err(_) if !handles.is_empty() => break,
                Err(_) => return None,
            }
        }
        Some(Replayers {
            threads: handles.iter().map(|h| h.thread().clone()).collect(),
            handles: Mutex::new(handles),
            stop,
            pid: std::process::id(),
        })
    }

    fn wake(&self) {
        for t in &self.threads {
            t.unpark();
        }
    }
}

fn replayer_loop(merged: &Merged, stop: &AtomicBool) {
    loop {
        std::thread::park(); // woken after a cut (or spuriously: then the queue may be empty)
        if stop.load(Ordering::Acquire) {
            return;
        }
        loop {
            let (logs, peak) = {
                let mut agg = lock(&merged.aggregate);
                let Some(logs) = agg.queue.pop_front() else { break };
                agg.in_flight += 1;
                (logs, agg.peak)
            };
            let t = std::time::Instant::now();
            let r = replay_window(&logs, &peak);
            let ns = t.elapsed().as_nanos() as u64;
            let mut agg = lock(&merged.aggregate);
            agg.apply(logs, r, ns);
            agg.in_flight -= 1;
            if agg.in_flight == 0 {
                merged.idle.notify_all();
            }
        }
    }
}

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

    /// After an operation on shard `i` whose log has `len` entries: merge when due (at each
    /// multiple of [`MERGE_AT`], if no merge is running; and always past [`MERGE_MUST`]).
    #[inline(always)]
    fn after_op(&self, len: usize) {
        if merge_due_at(len) {
            self.merge_due(len);
        }
    }

    #[cold]
    fn merge_due(&self, len: usize) {
        if len >= MERGE_MUST {
            self.merge(lock(&self.merged.aggregate));
        } else if let Ok(agg) = self.merged.aggregate.try_lock() {
            self.merge(agg);
        }
    }

    /// Cuts a window — every shard's log, with every shard locked, in index order, so that the
    /// logs hold exactly the operations of one window of time — and settles the shards again;
    /// the replayers replay it once the lock is dropped (here, if there are none, or too many
    /// windows wait). Why not here: a replay reads every logged operation of the window, which
    /// made the operation that filled a log many times slower than the others, and with eight
    /// threads one of them was always replaying.
    fn merge(&self, mut agg: MutexGuard<'_, Aggregate>) {
        {
            let mut shards: Vec<_> = (0..self.shards.len()).map(|i| self.shard(i)).collect();
            agg.cut(&mut shards);
            // With the peaks known so far, which windows still to replay can only raise.
            settle(&agg.peak, &mut shards, &self.alarm);
        }
        match self.replayers.get() {
            Some(r) if agg.queue.len() <= QUEUE_MAX => {
                drop(agg);
                r.wake();
            }
            _ => {
                // Only the oldest: the replayers are on the others.
                agg.replay_oldest();
            }
        }
    }

    /// Whether the replayers, if any, run in this process.
    fn own_replayers(&self) -> bool {
        self.replayers.get().is_some_and(|r| r.pid == std::process::id())
    }

    /// Windows merged, and how many of them replayed operations one by one (the others only
    /// added net changes, no new peak being possible). For benchmarks and tests.
    pub fn merge_counts(&self) -> (u64, u64) {
        let agg = drain(&self.merged, self.own_replayers());
        (agg.merges, agg.replays)
    }

    /// Operations logged so far (the others stayed under their shards' ceilings: see the module
    /// documentation). For benchmarks.
    pub fn logged_operations(&self) -> u64 {
        drain(&self.merged, self.own_replayers()).logged
    }

    /// Time spent replaying logged operations, in ns, summed over replayers (for benchmarks).
    pub fn replay_time_ns(&self) -> u64 {
        drain(&self.merged, self.own_replayers()).replay_ns
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

    /// A consistent view: every shard locked (in index order, as the out-of-memory path locks
    /// them), so that nothing changes until the guards are dropped, and — once several shards
    /// are in use — every operation merged into the aggregate. Also the mode.
    fn snapshot(&self) -> (MutexGuard<'_, Aggregate>, Vec<MutexGuard<'_, ShardState>>, u64) {
        let mut agg = drain(&self.merged, self.own_replayers());
        let mut shards: Vec<_> = (0..self.shards.len()).map(|i| self.shard(i)).collect();
        let mode = self.mode.load(Ordering::Acquire);
        if mode == MULTI {
            agg.cut(&mut shards);
            agg.replay_queued(); // the window just cut: no replayer can take it, the lock is held
            settle(&agg.peak, &mut shards, &self.alarm); // with the exact peaks
        }
        (agg, shards, mode)
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

    /// The device's statistics: totals summed over shards, peaks from the merged order (or,
    /// while one shard is all that was used, its own).
    pub fn stats(&self) -> DeviceStats {
        let (agg, shards, mode) = self.snapshot();
        let mut out = DeviceStats::new(0);
        out.max_split_size = shards[0].engine.kept_stats().max_split_size;
        for st in &shards {
            let s = st.engine.kept_stats();
            let add = |o: &mut Stat, x: &Stat| {
                o.current += x.current;
                o.allocated += x.allocated;
                o.freed += x.freed;
            };
            let mut src = *s;
            for (o, x) in out.arrays_mut().into_iter().zip(src.arrays_mut()) {
                for k in 0..3 {
                    add(&mut o.0[k], &x.0[k]);
                }
            }
            add(&mut out.oversize_allocations, &s.oversize_allocations);
            add(&mut out.oversize_segments, &s.oversize_segments);
            out.num_alloc_retries += s.num_alloc_retries;
            out.num_ooms += s.num_ooms;
            out.num_sync_all_streams += s.num_sync_all_streams;
            out.num_device_alloc += s.num_device_alloc;
            out.num_device_free += s.num_device_free;
        }
        if mode == MULTI {
            for (a, arr) in out.arrays_mut().into_iter().enumerate() {
                arr.0[1].peak = agg.peak[2 * a];
                arr.0[2].peak = agg.peak[2 * a + 1];
                arr.0[0].peak = agg.peak[N + a];
            }
            out.oversize_allocations.peak = agg.peak[18];
            out.oversize_segments.peak = agg.peak[19];
        } else if mode != EMPTY {
            let mut solo = *shards[mode as usize].engine.kept_stats();
            for (o, x) in out.arrays_mut().into_iter().zip(solo.arrays_mut()) {
                for k in 0..3 {
                    o.0[k].peak = x.0[k].peak;
                }
            }
            out.oversize_allocations.peak = solo.oversize_allocations.peak;
            out.oversize_segments.peak = solo.oversize_segments.peak;
        }
        out
    }

    /// `memory_stats()`: the 122-key dict.
    pub fn memory_stats(&self) -> StatsDict {
        self.stats().to_dict()
    }

    /// `memory_summary(abbreviated)`: PyTorch's table.
    pub fn memory_summary(&self, abbreviated: bool) -> String {
        summary::memory_summary(&self.memory_stats(), self.device.index(), abbreviated)
    }

    /// `reset_peak_memory_stats()`: every peak becomes its current value.
    pub fn reset_peak_memory_stats(&self) {
        let (mut agg, mut shards, mode) = self.snapshot();
        agg.peak = agg.current;
        if mode == MULTI {
            // The ceilings shared the old peaks' headroom: share none.
            settle(&agg.peak, &mut shards, &self.alarm);
        } else if mode != EMPTY {
            shards[mode as usize].engine.reset_peak_stats();
        }
    }

    /// `reset_accumulated_memory_stats()`.
    pub fn reset_accumulated_memory_stats(&self) {
        for i in 0..self.shards.len() {
            self.shard(i).engine.reset_accumulated_stats();
        }
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &str {
        &self.policy
    }

    /// Checks every shard's invariants and that the merged current values equal the shards'
    /// sums (slow; for tests).
    pub fn check_invariants(&self) -> Result<(), String> {
        let (agg, shards, mode) = self.snapshot();
        let mut sum = [0i64; N];
        for (i, st) in shards.iter().enumerate() {
            cudamem_alloc::invariants::check(&st.engine).map_err(|e| format!("shard {i}: {e}"))?;
            for (s, c) in sum.iter_mut().zip(currents(st.engine.kept_stats())) {
                *s += c;
            }
        }
        if mode == MULTI && sum[..] != agg.current[..N] {
            return Err(format!("merged current values {:?} != shard sums {sum:?}", agg.current));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

#[doc(hidden)]
pub mod workload;
