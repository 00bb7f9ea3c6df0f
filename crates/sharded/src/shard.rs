//! # One shard's state, its ceilings, and how headroom is shared
//!
//! [`ShardState`] is an engine and its log. Its `record`, on every operation, is the fast path
//! of the crate: a bounded shard under its ceilings does nothing else. [`settle`] gives every
//! shard new ceilings at a merge, sharing each series' headroom (peak minus current total) by
//! [`headroom_shares`]; the ceilings of all shards sum to at most the device's peak, which is
//! why a shard under its ceilings cannot make a new peak.

use super::*;

/// One shard: an engine and the log of its operations.
#[derive(Debug)]
pub(crate) struct ShardState {
    pub(crate) engine: Engine<Changes>,
    pub(crate) log: Log,
    /// Every series' value where the log window began (or, after the window closed, where
    /// the next one begins).
    pub(crate) start: [i64; S],
    pub(crate) tracking: Tracking,
    /// Per series: how far the shard rose above its value at the end of the last window
    /// (set when a window closes; what [`settle`] shares the headroom by).
    pub(crate) demand: [i64; S],
    /// Whether the shard has been used since several shards are (or was the one before). An
    /// unused shard holds nothing — no memory, no log — and its ceilings are its values (0), so
    /// its first operation that changes a tracked value passes them and logs (see
    /// [`ShardState::start_logging`], which sets this). Merges skip unused shards but for their
    /// locks: most of [`SHARDS`] usually are.
    pub(crate) used: bool,
}

// Within one operation every series first falls (events processed, caches released, pages
// reclaimed) and then rises (the new block), never the other way round; so an operation's
// highest point is its start or its end, and only end values are logged and checked for peaks.

/// The [`S`] series of [`N`] per-pool values (each `all` is small + large).
#[inline]
pub(crate) fn series_of(v: &[i64; N]) -> [i64; S] {
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
    pub(crate) fn record(&mut self, alarm: &AtomicBool) {
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
    pub(crate) fn record_tracked(&mut self, alarm: &AtomicBool) {
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
    pub(crate) fn values_before(&self) -> [i64; N] {
        let now = currents(self.engine.kept_stats());
        std::array::from_fn(|i| now[i] - self.engine.sink().delta[i])
    }

    /// `Bounded` → `Logged`, before the operation just done: raise `alarm` (with a full
    /// barrier, before the operation's stamp) if this shard passed a ceiling; the shard's log
    /// starts from its values before the operation.
    #[cold]
    pub(crate) fn start_logging(&mut self, over: bool, alarm: &AtomicBool) {
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
    pub(crate) fn close_window(&mut self) {
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
pub(crate) fn settle(peak: &[i64; S], shards: &mut [MutexGuard<'_, ShardState>], alarm: &AtomicBool) {
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
pub(crate) fn headroom_shares(peak: i64, current: &[i64], demand: &[i64], share: &mut [i64]) {
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
pub(crate) struct Padded<T>(pub(crate) T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Cache-line aligned so that shards do not share lines.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Shard(pub(crate) Mutex<ShardState>);
