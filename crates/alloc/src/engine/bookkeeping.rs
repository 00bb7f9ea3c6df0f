//! # Bookkeeping: stat updates, history entries and pool lookups
//!
//! The only places where a stat value changes ([`Engine::stat_up`], [`Engine::stat_down`],
//! [`Engine::stat_change`], the oversize counters) and where a history entry is made
//! ([`Engine::trace`]), so that "every change of a stat happens next to the state change it
//! describes, once" can be checked by reading the callers. A sink that hears changes
//! ([`StatSink::HEARS`]) is told each one; one that hears nothing lets `all` be summed later
//! (see [`Engine::stats`]).

#[allow(unused_imports)]
use super::*;

impl<S: StatSink> Engine<S> {
    /// Emits one history entry (the only place that does).
    #[inline]
    pub(super) fn trace(&mut self, action: Action, addr: u64, size: u64, stream: StreamId, stack: Option<u32>) {
        self.observe(action, addr, size, stream);
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
    pub(super) fn stat_up(&mut self, a: Array, small: bool, n: u64) {
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
    pub(super) fn stat_down(&mut self, a: Array, small: bool, n: u64) {
        if !S::HEARS {
            return self.stats.array_mut(a).decrease_pool(small, n);
        }
        self.stats.array_mut(a).decrease(small, n);
        self.sink.fell(pool_value_index(a, small), -(n as i64));
    }

    /// Changes them by a signed amount, noting which changed.
    #[inline]
    pub(super) fn stat_change(&mut self, a: Array, small: bool, delta: i64) {
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
    pub(super) fn oversize_change(&mut self, i: usize, up: bool) {
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
    pub(super) fn is_small(&self, pool: PoolId) -> bool {
        self.pool(pool).is_small
    }

    /// Pool `p`, unchecked. Every `PoolId` the engine holds, in a request, a block or a
    /// segment, came from the policy through [`Engine::request`], which checks it, and `pools`
    /// keeps its length from `new` on. Debug builds check again.
    #[inline(always)]
    pub(super) fn pool(&self, p: PoolId) -> &Pool {
        debug_assert!((p.0 as usize) < self.pools.len());
        // SAFETY: as said above, `p` indexes `pools`.
        unsafe { self.pools.get_unchecked(p.0 as usize) }
    }
}
