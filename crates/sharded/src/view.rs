//! # Device-wide views of a sharded allocator: merges, stats, resets, checks
//!
//! Everything that needs every shard at once: cutting and settling windows, the merged stats
//! (sums of the shards' counts, the aggregate's peaks), the resets and the invariant check.
//! Locks are taken as the crate documentation says: the aggregate first, then shards in index
//! order.

use super::*;

impl ShardedAllocator {
    /// After an operation on shard `i` whose log has `len` entries: merge when due (at each
    /// multiple of [`MERGE_AT`], if no merge is running; and always past [`MERGE_MUST`]).
    #[inline(always)]
    pub(crate) fn after_op(&self, len: usize) {
        if merge_due_at(len) {
            self.merge_due(len);
        }
    }

    #[cold]
    pub(crate) fn merge_due(&self, len: usize) {
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
    pub(crate) fn merge(&self, mut agg: MutexGuard<'_, Aggregate>) {
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
    pub(crate) fn own_replayers(&self) -> bool {
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

    /// A consistent view: every shard locked (in index order, as the out-of-memory path locks
    /// them), so that nothing changes until the guards are dropped, and — once several shards
    /// are in use — every operation merged into the aggregate. Also the mode.
    pub(crate) fn snapshot(&self) -> (MutexGuard<'_, Aggregate>, Vec<MutexGuard<'_, ShardState>>, u64) {
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
            cudamem_alloc::check_engine(&st.engine).map_err(|e| format!("shard {i}: {e}"))?;
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
