//! # Merging: the aggregate, the windows of logs, and the replayers
//!
//! A merge cuts a window (every shard's log, taken with every shard locked) into the
//! [`Aggregate`]'s queue; the [`Replayers`] (two threads, started with the second shard) replay
//! the queued windows, in timestamp order, only when a series could have passed its peak in
//! them. Guarantee: after [`drain`], the aggregate's peaks are those of one linear order of all
//! operations so far.

use super::*;

/// The merged view: the tracked values of the whole device and their peaks, and the windows of
/// logs that merges took and that wait for a replay.
#[derive(Debug)]
pub(crate) struct Aggregate {
    /// Per series (the `all` ones as small + large), as of the last cut.
    pub(crate) current: [i64; S],
    pub(crate) peak: [i64; S],
    /// Windows cut and not yet replayed, oldest first: one log per shard each.
    pub(crate) queue: std::collections::VecDeque<Vec<Log>>,
    /// Windows being replayed by replayers, outside the lock.
    pub(crate) in_flight: usize,
    /// Emptied windows, for the next cuts (their logs keep their capacity).
    pub(crate) spare: Vec<Vec<Log>>,
    /// Windows that had to replay operations one by one (a new peak was possible).
    pub(crate) replays: u64,
    /// Windows merged in all.
    pub(crate) merges: u64,
    /// Time spent replaying, ns.
    pub(crate) replay_ns: u64,
    /// Log entries cut (operations logged, and the rare rebase entry).
    pub(crate) logged: u64,
}

/// The aggregate, and what tells a reader that the replayers have finished.
#[derive(Debug)]
pub(crate) struct Merged {
    pub(crate) aggregate: Padded<Mutex<Aggregate>>,
    /// Notified when the last window in flight is applied.
    pub(crate) idle: Condvar,
}

/// At most this many windows wait for replayers; a merge beyond it replays one itself.
pub(crate) const QUEUE_MAX: usize = 4;

impl Aggregate {
    pub(crate) fn new() -> Aggregate {
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
    pub(crate) fn cut(&mut self, shards: &mut [MutexGuard<'_, ShardState>]) {
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
    pub(crate) fn apply(&mut self, mut logs: Vec<Log>, replayed: Option<[i64; S]>, ns: u64) {
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
    pub(crate) fn replay_oldest(&mut self) -> bool {
        let Some(logs) = self.queue.pop_front() else {
            return false;
        };
        let t = std::time::Instant::now();
        let r = replay_window(&logs, &self.peak);
        self.apply(logs, r, t.elapsed().as_nanos() as u64);
        true
    }

    /// Replays every queued window here, under the lock.
    pub(crate) fn replay_queued(&mut self) {
        while self.replay_oldest() {}
    }
}

/// Every window merged: queued ones replayed here, and — unless the replayers are not this
/// process's (a child made by `fork`) — those in flight waited for.
pub(crate) fn drain<'a>(merged: &'a Merged, own_replayers: bool) -> MutexGuard<'a, Aggregate> {
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
pub(crate) fn replay_window(logs: &[Log], peak: &[i64; S]) -> Option<[i64; S]> {
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
pub(crate) fn replay(logs: &[&Log], may: u64, current: &mut [i64; S], peak: &mut [i64; S]) {
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
pub(crate) fn next_stamp(log: &Log, pos: &mut (usize, usize, u64)) -> u64 {
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
pub(crate) struct Replayers {
    pub(crate) threads: Vec<std::thread::Thread>,
    pub(crate) handles: Mutex<Vec<std::thread::JoinHandle<()>>>,
    pub(crate) stop: Arc<AtomicBool>,
    /// The process that started the threads: a child made by `fork` has none. Its merges
    /// still replay, at the next merge or read (replayers only save time) — but a window a
    /// replayer was replaying at the fork is lost to the child's peaks. (CUDA does not support
    /// a child using the parent's device anyway.)
    pub(crate) pid: u32,
}

/// Replayer threads per allocator.
pub(crate) const REPLAYERS: usize = 2;

impl Replayers {
    /// `None` if no thread can be started: merges then replay where they run.
    pub(crate) fn spawn(merged: Arc<Merged>) -> Option<Replayers> {
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

    pub(crate) fn wake(&self) {
        for t in &self.threads {
            t.unpark();
        }
    }
}

pub(crate) fn replayer_loop(merged: &Merged, stop: &AtomicBool) {
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
