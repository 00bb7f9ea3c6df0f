//! # Statistics: PyTorch's `DeviceStats`, kept exactly
//!
//! A [`Stat`] is PyTorch's counter: `current`, `peak` (the largest `current` seen since the last
//! peak reset), `allocated` (sum of increases) and `freed` (sum of decreases). Nine of them come
//! as a [`StatArray`] indexed by [`StatType`] (`all`, `small_pool`, `large_pool`); together with six
//! scalars and two oversize counters they make the 122 keys of `torch.cuda.memory_stats()`.
//!
//! The engine updates stats in one place per event (see `engine`), always for `all` plus the pool
//! the block belongs to, so `all == small_pool + large_pool` holds for every array at all times.
//! Two exceptions save work on every pair, both for an engine whose [`StatSink`] hears nothing,
//! and `Engine::stats` fills in what they leave out:
//! * `active` and `active_bytes` mirror `allocation` and `allocated_bytes` until a block first
//!   waits for events (they are equal field for field until then);
//! * `all`'s `current`, `allocated` and `freed` are the pools' sums, so only the pool's values
//!   and `all`'s peak (against the pools' sum) change (`StatArray::increase_pool`).
//!   `all.peak` is the one value of `all` that the pools do not determine.

use crate::summary::StatsDict;

/// One of PyTorch's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// Current value.
    pub current: i64,
    /// Largest `current` since the last [`Stat::reset_peak`].
    pub peak: i64,
    /// Sum of all increases since the last [`Stat::reset_accumulated`].
    pub allocated: i64,
    /// Sum of all decreases since the last [`Stat::reset_accumulated`].
    pub freed: i64,
}

impl Stat {
    /// Adds `n` (PyTorch's `increase_stat`).
    #[inline]
    pub fn increase(&mut self, n: u64) {
        self.current += n as i64;
        self.peak = self.peak.max(self.current);
        self.allocated += n as i64;
    }
    /// Subtracts `n` (PyTorch's `decrease_stat`).
    #[inline]
    pub fn decrease(&mut self, n: u64) {
        self.current -= n as i64;
        debug_assert!(self.current >= 0, "negative stat: a bookkeeping bug");
        self.freed += n as i64;
    }
    /// `peak = current`.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
    /// `allocated = freed = 0`.
    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// Which aggregate a stat belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatType {
    /// Everything.
    All = 0,
    /// Blocks of the small pool (≤ 1 MiB).
    SmallPool = 1,
    /// Blocks of the large pool.
    LargePool = 2,
}

/// A [`Stat`] per [`StatType`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// Increases `all` and the pool's stat.
    #[inline]
    pub fn increase(&mut self, small: bool, n: u64) {
        self.0[0].increase(n);
        self.0[if small { 1 } else { 2 }].increase(n);
    }
    /// Decreases `all` and the pool's stat.
    #[inline]
    pub fn decrease(&mut self, small: bool, n: u64) {
        self.0[0].decrease(n);
        self.0[if small { 1 } else { 2 }].decrease(n);
    }
    /// Changes `all` and the pool's stat by a signed amount.
    #[inline]
    pub fn change(&mut self, small: bool, delta: i64) {
        // Without a branch on the sign, which comes from the data (a third of these were
        // mispredicted in a replay): the same fields as `increase` or `decrease` would change.
        let (up, down) = (delta.max(0), delta.min(0).wrapping_neg());
        for k in [0, if small { 1 } else { 2 }] {
            let st = &mut self.0[k];
            st.current += delta;
            st.peak = st.peak.max(st.current);
            st.allocated += up;
            st.freed += down;
        }
        debug_assert!(self.0[0].current >= 0, "negative stat: a bookkeeping bug");
    }
    /// [`StatArray::increase`] where `all`'s `current`, `allocated` and `freed` are left to
    /// [`StatArray::sum_all`]: the pool's stat as always, and `all`'s peak against the pools'
    /// sum (what `all.current` would be). Two read-modify-writes of memory fewer.
    #[inline]
    pub(crate) fn increase_pool(&mut self, small: bool, n: u64) {
        self.0[if small { 1 } else { 2 }].increase(n);
        let sum = self.0[1].current + self.0[2].current;
        self.0[0].peak = self.0[0].peak.max(sum);
    }
    /// [`StatArray::decrease`] likewise: the pool's stat only (a fall sets no peak).
    #[inline]
    pub(crate) fn decrease_pool(&mut self, small: bool, n: u64) {
        self.0[if small { 1 } else { 2 }].decrease(n);
    }
    /// [`StatArray::change`] likewise.
    #[inline]
    pub(crate) fn change_pool(&mut self, small: bool, delta: i64) {
        let (up, down) = (delta.max(0), delta.min(0).wrapping_neg());
        let st = &mut self.0[if small { 1 } else { 2 }];
        st.current += delta;
        st.peak = st.peak.max(st.current);
        st.allocated += up;
        st.freed += down;
        debug_assert!(st.current >= 0, "negative stat: a bookkeeping bug");
        let sum = self.0[1].current + self.0[2].current;
        self.0[0].peak = self.0[0].peak.max(sum);
    }
    /// Sets `all`'s `current`, `allocated` and `freed` to the sums of the pools' (its peak
    /// is kept): what they are when every change went to both.
    pub(crate) fn sum_all(&mut self) {
        let [all, small, large] = &mut self.0;
        all.current = small.current + large.current;
        all.allocated = small.allocated + large.allocated;
        all.freed = small.freed + large.freed;
    }
    /// The stat of the small pool (`small`) or the large one.
    #[inline]
    pub fn pool(&self, small: bool) -> &Stat {
        &self.0[if small { 1 } else { 2 }]
    }
    /// The `all` stat.
    pub fn all(&self) -> &Stat {
        &self.0[0]
    }
    /// The `small_pool` stat.
    pub fn small_pool(&self) -> &Stat {
        &self.0[1]
    }
    /// The `large_pool` stat.
    pub fn large_pool(&self) -> &Stat {
        &self.0[2]
    }
    /// The stat of one aggregate.
    pub fn get(&self, t: StatType) -> &Stat {
        &self.0[t as usize]
    }
}

/// The nine arrays, each named by its place in [`DeviceStats::arrays`]' order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Array {
    Active = 0,
    ActiveBytes = 1,
    AllocatedBytes = 2,
    Allocation = 3,
    InactiveSplit = 4,
    InactiveSplitBytes = 5,
    RequestedBytes = 6,
    ReservedBytes = 7,
    Segment = 8,
}

/// Where an [`crate::Engine`] reports each change of a per-pool value besides making it: an
/// adaptor, as RMM's statistics are, so that an engine which needs no report pays nothing.
/// Values are numbered `2a` (small pool) and `2a + 1` (large pool) for the nine arrays in
/// `memory_stats()`' alphabetical order (`active` … `segment`), then 18
/// (`oversize_allocations`) and 19 (`oversize_segments`). The default, [`NoSink`], ignores
/// them; an allocator composed of several engines (see [`crate::engine::hook`]) can keep each
/// operation's changes (to log them without
/// reading any value back) and compare each rise with their ceilings as it happens. A rise and
/// a fall are told apart because only a rise can pass a ceiling.
pub trait StatSink: Default + std::fmt::Debug + Send {
    /// Whether this sink hears anything. An engine whose sink does not may leave `active` and
    /// `active_bytes` to mirror `allocation` and `allocated_bytes` while no block waits for
    /// events, and `all`'s values but its peak to the pools' sums (see `Engine::stats`); one
    /// whose sink hears must tell every change.
    const HEARS: bool = true;
    /// Value `i` rose by `delta` (> 0) and is now `now`; `all` is its array's `all` now (for
    /// the oversize counters, which have no `all`, `now` again).
    fn rose(&mut self, i: usize, delta: i64, now: i64, all: i64);
    /// Value `i` changed by `delta` ≤ 0 (0 included: a call site's change may net to nothing).
    fn fell(&mut self, i: usize, delta: i64);
}

/// The sink that ignores every change (the default engine's).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoSink;

impl StatSink for NoSink {
    const HEARS: bool = false;
    #[inline(always)]
    fn rose(&mut self, _: usize, _: i64, _: i64, _: i64) {}
    #[inline(always)]
    fn fell(&mut self, _: usize, _: i64) {}
}

/// The number of `oversize_allocations` among the values [`DeviceStats::pool_value`] numbers.
pub const OVERSIZE_ALLOCATIONS: usize = 18;
/// The number of `oversize_segments` among them.
pub const OVERSIZE_SEGMENTS: usize = 19;

/// How many per-pool values [`DeviceStats::pool_value`] numbers: 9 arrays × (small, large),
/// then the two oversize counters.
pub const POOL_VALUES: usize = 20;

/// PyTorch's `DeviceStats`: everything `memory_stats()` reports for one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceStats {
    /// Client allocations (`allocation.*`).
    pub allocation: StatArray,
    /// Device segments (`segment.*`): cudaMalloc'd segments; expandable mappings are not counted.
    pub segment: StatArray,
    /// Active blocks: allocated or waiting for events (`active.*`).
    pub active: StatArray,
    /// Free blocks inside split segments (`inactive_split.*`).
    pub inactive_split: StatArray,
    /// Rounded bytes of allocated blocks (`allocated_bytes.*`).
    pub allocated_bytes: StatArray,
    /// Bytes obtained from the device (`reserved_bytes.*`).
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks (`active_bytes.*`).
    pub active_bytes: StatArray,
    /// Bytes of free blocks in split segments (`inactive_split_bytes.*`).
    pub inactive_split_bytes: StatArray,
    /// Bytes the callers asked for, unrounded (`requested_bytes.*`).
    pub requested_bytes: StatArray,
    /// Allocations that needed the release-everything retry.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors raised.
    pub num_ooms: i64,
    /// Synchronisations of all outstanding events.
    pub num_sync_all_streams: i64,
    /// Device allocations (segment mallocs and expandable maps).
    pub num_device_alloc: i64,
    /// Device frees (segment frees and expandable unmaps).
    pub num_device_free: i64,
    /// `max_split_size` in bytes, -1 when unlimited (PyTorch casts SIZE_MAX to int64).
    pub max_split_size: i64,
    /// Allocations of at least `max_split_size`.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size`.
    pub oversize_segments: Stat,
}

impl DeviceStats {
    /// Empty stats for an allocator whose `max_split_size` is `max_split_size` bytes.
    pub fn new(max_split_size: u64) -> Self {
        DeviceStats {
            allocation: StatArray::default(),
            segment: StatArray::default(),
            active: StatArray::default(),
            inactive_split: StatArray::default(),
            allocated_bytes: StatArray::default(),
            reserved_bytes: StatArray::default(),
            active_bytes: StatArray::default(),
            inactive_split_bytes: StatArray::default(),
            requested_bytes: StatArray::default(),
            num_alloc_retries: 0,
            num_ooms: 0,
            num_sync_all_streams: 0,
            num_device_alloc: 0,
            num_device_free: 0,
            max_split_size: if max_split_size == u64::MAX {
                -1
            } else {
                max_split_size as i64
            },
            oversize_allocations: Stat::default(),
            oversize_segments: Stat::default(),
        }
    }

    /// The nine stat arrays with their `memory_stats()` names, in one fixed order (that of
    /// [`Self::pool_value`]'s numbering).
    pub fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("active", &self.active),
            ("active_bytes", &self.active_bytes),
            ("allocated_bytes", &self.allocated_bytes),
            ("allocation", &self.allocation),
            ("inactive_split", &self.inactive_split),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("segment", &self.segment),
        ]
    }

    /// Per-pool value `i` (see [`POOL_VALUES`]): `current` of array `i / 2`'s small (even `i`)
    /// or large (odd) pool, in [`Self::arrays`]' order; then `oversize_allocations` (18) and
    /// `oversize_segments` (19). Off the hot path: a composed allocator's sink keeps the
    /// changes, so it reads the values themselves only now and then.
    pub fn pool_value(&self, i: usize) -> i64 {
        match i {
            OVERSIZE_ALLOCATIONS => self.oversize_allocations.current,
            OVERSIZE_SEGMENTS => self.oversize_segments.current,
            _ => self.arrays()[i / 2].1 .0[1 + i % 2].current,
        }
    }

    /// The array named `a`, mutable.
    #[inline]
    pub(crate) fn array_mut(&mut self, a: Array) -> &mut StatArray {
        match a {
            Array::Active => &mut self.active,
            Array::ActiveBytes => &mut self.active_bytes,
            Array::AllocatedBytes => &mut self.allocated_bytes,
            Array::Allocation => &mut self.allocation,
            Array::InactiveSplit => &mut self.inactive_split,
            Array::InactiveSplitBytes => &mut self.inactive_split_bytes,
            Array::RequestedBytes => &mut self.requested_bytes,
            Array::ReservedBytes => &mut self.reserved_bytes,
            Array::Segment => &mut self.segment,
        }
    }

    /// The same arrays, mutable, in the same order.
    pub fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.active,
            &mut self.active_bytes,
            &mut self.allocated_bytes,
            &mut self.allocation,
            &mut self.inactive_split,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
            &mut self.reserved_bytes,
            &mut self.segment,
        ]
    }

    /// The flat `memory_stats()` dict: PyTorch's 122 keys.
    pub fn to_dict(&self) -> StatsDict {
        let mut d = StatsDict::new();
        let mut put = |prefix: &str, s: &Stat| {
            d.insert(format!("{prefix}.current"), s.current);
            d.insert(format!("{prefix}.peak"), s.peak);
            d.insert(format!("{prefix}.allocated"), s.allocated);
            d.insert(format!("{prefix}.freed"), s.freed);
        };
        for (name, arr) in self.arrays() {
            for (i, pool) in ["all", "small_pool", "large_pool"].iter().enumerate() {
                put(&format!("{name}.{pool}"), &arr.0[i]);
            }
        }
        put("oversize_allocations", &self.oversize_allocations);
        put("oversize_segments", &self.oversize_segments);
        d.insert("num_alloc_retries".into(), self.num_alloc_retries);
        d.insert("num_ooms".into(), self.num_ooms);
        d.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        d.insert("num_device_alloc".into(), self.num_device_alloc);
        d.insert("num_device_free".into(), self.num_device_free);
        d.insert("max_split_size".into(), self.max_split_size);
        d
    }

    /// [`StatArray::sum_all`] for every array.
    pub(crate) fn sum_all(&mut self) {
        for a in self.arrays_mut() {
            a.sum_all();
        }
    }

    /// `reset_peak_memory_stats`: every peak becomes its current value.
    pub fn reset_peak(&mut self) {
        for a in self.arrays_mut() {
            a.0.iter_mut().for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `reset_accumulated_memory_stats`: zeroes `allocated`/`freed` and the event counters.
    pub fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            a.0.iter_mut().for_each(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dict_has_the_122_keys_and_peaks_follow_current() {
        let mut s = DeviceStats::new(u64::MAX);
        s.allocated_bytes.increase(true, 512);
        s.allocated_bytes.increase(false, 4096);
        s.allocated_bytes.decrease(false, 4096);
        let d = s.to_dict();
        assert_eq!(d.len(), 122);
        assert_eq!(d["allocated_bytes.all.peak"], 4608);
        assert_eq!(d["allocated_bytes.all.current"], 512);
        assert_eq!(d["allocated_bytes.large_pool.freed"], 4096);
        assert_eq!(d["max_split_size"], -1);
        s.reset_peak();
        assert_eq!(s.allocated_bytes.all().peak, 512);
        // The offset tables read the fields they name.
        let mut t = DeviceStats::new(u64::MAX);
        for (k, arr) in t.arrays_mut().into_iter().enumerate() {
            arr.increase(true, 1 + 2 * k as u64);
            arr.increase(false, 100 + k as u64);
        }
        t.oversize_allocations.increase(7);
        t.oversize_segments.increase(9);
        for (a, (_, arr)) in t.arrays().into_iter().enumerate() {
            assert_eq!(t.pool_value(2 * a), arr.small_pool().current);
            assert_eq!(t.pool_value(2 * a + 1), arr.large_pool().current);
        }
        assert_eq!((t.pool_value(18), t.pool_value(19)), (7, 9));
        s.reset_accumulated();
        assert_eq!(s.allocated_bytes.all().allocated, 0);
        assert_eq!(s.allocated_bytes.all().current, 512);
    }
}
