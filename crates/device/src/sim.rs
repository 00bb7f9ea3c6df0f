//! # The simulated GPU
//!
//! [`SimDevice`] behaves like one CUDA device for the allocator, with no GPU present:
//!
//! * **Capacity**: physical memory is a byte count (default: an H200's 150,109,880,320 bytes).
//!   `malloc` and `map` consume it, `free` and `unmap` return it; asking for more than is free is
//!   [`DeviceError::OutOfMemory`](crate::DeviceError::OutOfMemory), exactly where `cudaMalloc` would fail.
//! * **Addresses** look like real ones (`0x7f..`), 2 MiB aligned, handed out first-fit from a
//!   virtual address space so freed ranges are reused as the driver does, or at seeded random
//!   places ([`Placement::Shuffled`]: the driver's order of segments is not predictable, and
//!   PyTorch's best fit breaks ties between equal free blocks by address). A replay can
//!   [`plan`](SimDevice::plan_addresses) the addresses of the next `malloc`s, so that a trace's own
//!   segment addresses (and with them PyTorch's tie-breaks between equal-size blocks) are reproduced.
//! * **Events** complete when the caller says so ([`EventMode::Manual`]: [`SimDevice::complete_stream`],
//!   [`SimDevice::complete_all`]) or at once ([`EventMode::Immediate`], the default). A
//!   synchronisation completes what it waits for, as on hardware.
//! * **Faults**: a [`FaultPlan`] makes chosen or random `malloc`, `map`, event-query and copy
//!   calls fail.
//! * **Bytes**: memory holds bytes only where they were written ([`SimDevice::write`],
//!   [`Device::copy_from_host`](crate::Device::copy_from_host)), stored sparsely in chunks of at most 4 KiB; unwritten bytes of
//!   backed memory read as zero. Freeing a segment or unmapping pages drops their bytes, so pages
//!   mapped anew read as zero, as fresh physical memory may on a GPU. Reads and writes must lie
//!   in backed memory (a live segment, or a contiguous run of mappings of one reservation).
//!
//! Invariants (checked by [`SimDevice::check`]): `used == sum(live segments) + mapped pages ×
//! granularity <= capacity`, no two live ranges (segments or reservations) overlap, and every
//! stored chunk of bytes lies in backed memory.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use crate::{DeviceCounters, DevicePtr, EventId, StreamId};

mod bytes;
mod device;
mod faults;
#[cfg(test)]
mod tests;
mod vmm;

pub use faults::{FaultOp, FaultOpKey, FaultPlan};
pub use vmm::Placement;
use vmm::{va_base, Reservation, VA_SIZE};

/// An H200's memory as `cudaMemGetInfo` reports its total.
pub const H200_CAPACITY: u64 = 150_109_880_320;
/// The VMM granularity of an H200 (and of most CUDA GPUs).
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;

/// When recorded events complete on a [`SimDevice`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EventMode {
    /// Every event is complete as soon as it is recorded (no kernels run on a simulated GPU).
    #[default]
    Immediate,
    /// Events stay pending until the caller completes their stream (tests, trace replay).
    Manual,
}

/// Builder-style settings of a [`SimDevice`].
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Device ordinal.
    pub index: i32,
    /// Physical memory in bytes.
    pub capacity: u64,
    /// VMM page size.
    pub granularity: u64,
    /// When events complete.
    pub event_mode: EventMode,
    /// Where new segments and reservations go in the address space.
    pub placement: Placement,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            index: 0,
            capacity: H200_CAPACITY,
            granularity: DEFAULT_GRANULARITY,
            event_mode: EventMode::Immediate,
            placement: Placement::LowestFree,
        }
    }
}

/// A map keyed by an id (one `u64`): the event and stream maps are read on every `query_event`,
/// which a replay with deferred frees makes on most allocations, and SipHash there cost more
/// than the allocator's own work (callgrind, multistream_prefetch). Keys are the device's own
/// ids, not input an adversary picks, so a multiply-shift hash is enough.
type IdMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of the one integer an id writes.
#[derive(Default)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    #[inline]
    fn finish(&self) -> u64 {
        // hashbrown takes its 7-bit tag from the top bits and the bucket from the low ones.
        self.0 ^ (self.0 >> 32)
    }
}

#[derive(Debug, Default)]
struct SimState {
    used: u64,
    /// Free virtual ranges: start -> len.
    va_free: BTreeMap<u64, u64>,
    segments: HashMap<DevicePtr, u64>,
    reservations: BTreeMap<DevicePtr, Reservation>,
    planned: VecDeque<DevicePtr>,
    next_event: u64,
    events: IdMap<EventId, (StreamId, u64)>,
    stream_recorded: IdMap<StreamId, u64>,
    stream_completed: IdMap<StreamId, u64>,
    faults: FaultPlan,
    op_calls: HashMap<FaultOp, u64>,
    rng: u64,
    /// State of [`Placement::Shuffled`]'s generator.
    placement_rng: u64,
    counters: DeviceCounters,
    /// Bytes written, by chunk number (address / chunk size); see the module documentation.
    bytes: BTreeMap<u64, Box<[u8]>>,
}

/// A simulated GPU. See the [module documentation](self).
#[derive(Debug)]
pub struct SimDevice {
    config: SimConfig,
    state: Mutex<SimState>,
}

impl Default for SimDevice {
    fn default() -> Self {
        Self::new(SimConfig::default())
    }
}

impl SimDevice {
    /// A simulated device with the given settings.
    pub fn new(config: SimConfig) -> Self {
        let mut state = SimState::default();
        state.va_free.insert(va_base(config.index), VA_SIZE);
        if let Placement::Shuffled(seed) = config.placement {
            state.placement_rng = seed;
        }
        SimDevice {
            config,
            state: Mutex::new(state),
        }
    }

    /// A simulated device of `capacity` bytes, other settings default.
    pub fn with_capacity(capacity: u64) -> Self {
        Self::new(SimConfig {
            capacity,
            ..SimConfig::default()
        })
    }

    /// The settings this device was made with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        // A panic while holding the lock cannot leave the state half-updated in a way that
        // matters more than the panic itself; keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the next `malloc` calls return these addresses, in order, where the range is free
    /// (a planned address whose range is taken is skipped). Replay uses this to give segments the
    /// addresses the trace recorded.
    pub fn plan_addresses(&self, addrs: impl IntoIterator<Item = DevicePtr>) {
        self.lock().planned.extend(addrs);
    }

    /// Completes every event recorded so far on `stream`.
    pub fn complete_stream(&self, stream: StreamId) {
        let mut s = self.lock();
        let rec = s.stream_recorded.get(&stream).copied().unwrap_or(0);
        s.stream_completed.insert(stream, rec);
    }

    /// Completes every event recorded so far on every stream.
    pub fn complete_all(&self) {
        let mut s = self.lock();
        let recorded: Vec<_> = s.stream_recorded.iter().map(|(k, v)| (*k, *v)).collect();
        for (k, v) in recorded {
            s.stream_completed.insert(k, v);
        }
    }

    /// Bytes of physical memory in use (segments plus mapped pages).
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// Number of events recorded and not yet destroyed.
    pub fn live_events(&self) -> usize {
        self.lock().events.len()
    }

    /// Checks the device's invariants; returns a description of the first broken one.
    pub fn check(&self) -> Result<(), String> {
        let s = self.lock();
        let c = self.chunk();
        for &k in s.bytes.keys() {
            if Self::backed(&s, k * c, 1).is_err() {
                return Err(format!("stored bytes at {:#x} lie in memory that is not backed", k * c));
            }
        }
        let seg: u64 = s.segments.values().sum();
        let mapped: u64 = s.reservations.values().map(Reservation::mapped_bytes).sum();
        let expect = seg + mapped;
        if expect != s.used {
            return Err(format!("used {} != segments {} + mapped {}", s.used, seg, mapped));
        }
        if s.used > self.config.capacity {
            return Err(format!("used {} > capacity {}", s.used, self.config.capacity));
        }
        Ok(())
    }
}
