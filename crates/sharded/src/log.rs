//! # What a shard notes of each operation: its engine's sink and its log
//!
//! [`Changes`] is the shard engine's [`StatSink`]: it keeps which tracked values an operation
//! changed and by how much, and whether one rose above its ceiling, without reading any value
//! back. [`Log`] keeps those changes, compactly (about 32 bytes per operation), while a shard
//! logs; a merge reads them. Invariant: a log's entries, replayed from its `start`, give the
//! shard's values after each logged operation (a property test holds the sink to it).

use super::*;

/// The tracked "current" values of a stats record, in the order of
/// [`DeviceStats::pool_value`] (bit `i` of a shard's [`Changes`] is value `i`).
#[inline]
pub(crate) fn currents(s: &DeviceStats) -> [i64; N] {
    std::array::from_fn(|i| s.pool_value(i))
}

/// Every tracked series of a stats record — the [`N`] per-pool values, then the 9 arrays'
/// `all` — as (current, peak).
pub(crate) fn series(s: &DeviceStats) -> ([i64; S], [i64; S]) {
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
pub(crate) const S: usize = N + 9;

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
pub(crate) struct Log {
    /// (timestamp − `base`, bit i set if value i changed); the mask [`REBASE`] instead moves
    /// `base` to the stamp written as the entry's changes (for windows longer than 2³² ticks).
    pub(crate) entries: Vec<(u32, u32)>,
    /// The changes, in entry order and bit order, encoded by [`push_delta`].
    pub(crate) deltas: Vec<i32>,
    /// The stamp the entries' offsets count from (that of the window's first entry).
    pub(crate) base: u64,
    /// Per series: the shard's value where its entries start (set when the window closes) —
    /// the window's start, or the moment the shard began logging within it.
    pub(crate) start: [i64; S],
    /// Per series: the net change over the entries (set when the window closes).
    pub(crate) net: [i64; S],
    /// Per series: the largest rise over the window above its start value, ≥ 0 (set when it
    /// closes; it may count a value reached inside an operation, so it bounds the rise of the
    /// logged end values from above, which is all a merge needs to skip the entries).
    pub(crate) rise: [i64; S],
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
pub(crate) const REBASE: u32 = 1 << 31;

/// Appends a change: one word when it fits in an `i32` other than `i32::MIN`, otherwise
/// `i32::MIN` and the value's low and high halves.
#[inline]
pub(crate) fn push_delta(deltas: &mut Vec<i32>, d: i64) {
    match i32::try_from(d) {
        Ok(w) if w != i32::MIN => deltas.push(w),
        _ => deltas.extend_from_slice(&[i32::MIN, d as i32, (d >> 32) as i32]),
    }
}

/// [`push_delta`] into space already reserved (`out` has room for the longest form); returns
/// the words written. The hot path's copy of the encoding (the round-trip test holds the two to
/// the same words): built on `push_delta`'s word array, or written without the slice, it costs
/// tens of instructions more per logged operation.
#[inline(always)]
pub(crate) fn write_delta(out: &mut [std::mem::MaybeUninit<i32>], d: i64) -> usize {
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
pub(crate) fn read_delta(deltas: &[i32], at: &mut usize) -> i64 {
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
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.deltas.clear();
        self.net = [0; S];
        self.rise = [0; S];
    }
}

/// How a shard's operations reach the device's peaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tracking {
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
/// A few instructions per change (a fall compares nothing), where comparing all twenty values
/// and their nine sums after every operation, or those that rose, would cost far more.
#[derive(Debug)]
pub(crate) struct Changes {
    /// Bit `i`: value `i` changed (by `delta[i]`, which may net to 0).
    pub(crate) mask: u32,
    /// Some value, or some array's `all`, was above its ceiling after a change. Within an
    /// operation values first fall and then rise, so a value above its ceiling at some change
    /// is above it at the end (and a flag raised for nothing would only log more).
    pub(crate) over: bool,
    /// Per value: the operation's net change.
    pub(crate) delta: [i64; N],
    /// Per value: the highest it may reach unlogged (see [`Tracking::Bounded`]).
    pub(crate) ceiling: [i64; N],
    /// Per array: the highest its `all` may reach unlogged; the last entry, for the oversize
    /// counters (which have no `all`), is never reached.
    pub(crate) ceiling_all: [i64; S - N + 1],
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
    pub(crate) fn clear(&mut self) {
        self.mask = 0;
        self.over = false;
        self.delta = [0; N];
    }

    /// Sets the ceiling of series `k` (the [`N`] values, then the 9 arrays' `all`).
    pub(crate) fn set_ceiling(&mut self, k: usize, c: i64) {
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
