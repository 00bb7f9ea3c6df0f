//! # The simulated GPU
//!
//! [`SimDevice`] behaves like one CUDA device for the allocator, with no GPU present:
//!
//! * **Capacity**: physical memory is a byte count (default: an H200's 150,109,880,320 bytes).
//!   `malloc` and `map` consume it, `free` and `unmap` return it; asking for more than is free is
//!   [`DeviceError::OutOfMemory`], exactly where `cudaMalloc` would fail.
//! * **Addresses** look like real ones (`0x7f..`), 2 MiB aligned, handed out first-fit from a
//!   virtual address space so freed ranges are reused as the driver does. A replay can
//!   [`plan`](SimDevice::plan_addresses) the addresses of the next `malloc`s, so that a trace's own
//!   segment addresses (and with them PyTorch's tie-breaks between equal-size blocks) are reproduced.
//! * **Events** complete when the caller says so ([`EventMode::Manual`]: [`SimDevice::complete_stream`],
//!   [`SimDevice::complete_all`]) or at once ([`EventMode::Immediate`], the default). A
//!   synchronisation completes what it waits for, as on hardware.
//! * **Faults**: a [`FaultPlan`] makes chosen or random `malloc`, `map`, event-query and copy
//!   calls fail.
//! * **Bytes**: memory holds bytes only where they were written ([`SimDevice::write`],
//!   [`Device::copy_from_host`]), stored sparsely in chunks of at most 4 KiB; unwritten bytes of
//!   backed memory read as zero. Freeing a segment or unmapping pages drops their bytes, so pages
//!   mapped anew read as zero, as fresh physical memory may on a GPU. Reads and writes must lie
//!   in backed memory (a live segment, or a contiguous run of mappings of one reservation).
//!
//! Invariants (checked by [`SimDevice::check`]): `used == sum(live segments) + mapped pages ×
//! granularity <= capacity`, no two live ranges (segments or reservations) overlap, and every
//! stored chunk of bytes lies in backed memory.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use crate::{Device, DeviceCounters, DeviceError, DevicePtr, EventId, StreamId};

/// An H200's memory as `cudaMemGetInfo` reports its total.
pub const H200_CAPACITY: u64 = 150_109_880_320;
/// The VMM granularity of an H200 (and of most CUDA GPUs).
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;
const VA_BASE: u64 = 0x7f00_0000_0000;
const VA_SIZE: u64 = 1 << 50; // 1 PiB of address space per device: thousands of expandable reservations

/// Device `index`'s address range starts here, 4 PiB apart, so that pointers of two simulated
/// devices never coincide (as under CUDA's unified addressing). Device 0 keeps the range real
/// traces use, so a replay can give segments their recorded addresses.
fn va_base(index: i32) -> u64 {
    VA_BASE + (index.clamp(0, 255) as u64) * (VA_SIZE << 2)
}
const MALLOC_ALIGN: u64 = 2 << 20;

/// When recorded events complete on a [`SimDevice`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EventMode {
    /// Every event is complete as soon as it is recorded (no kernels run on a simulated GPU).
    #[default]
    Immediate,
    /// Events stay pending until the caller completes their stream (tests, trace replay).
    Manual,
}

/// Device calls that a [`FaultPlan`] can make fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultOp {
    /// `malloc` (cudaMalloc).
    Malloc,
    /// `map` (cuMemCreate/cuMemMap).
    Map,
    /// `query_event` (cuEventQuery); the failure is reported as a driver error.
    QueryEvent,
    /// `copy_to_host` and `copy_from_host` (cuMemcpyDtoH/HtoD), counted together.
    Copy,
}

/// Which device calls fail on purpose.
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    /// Fail the calls with these 1-based ordinals, per operation (e.g. the 3rd malloc).
    pub nth: HashMap<FaultOpKey, Vec<u64>>,
    /// Fail this fraction of calls of each listed operation at random.
    pub fraction: f64,
    /// The operations `fraction` applies to.
    pub random_ops: Vec<FaultOp>,
    /// Seed of the random choice, so a failing run can be repeated.
    pub seed: u64,
}

/// Key of [`FaultPlan::nth`] (a `FaultOp`).
pub type FaultOpKey = FaultOp;

impl FaultPlan {
    /// Fails the `n`th (1-based) call of `op`.
    pub fn fail_nth(mut self, op: FaultOp, n: u64) -> Self {
        self.nth.entry(op).or_default().push(n);
        self
    }
    /// Fails a random `fraction` of the calls of `ops`, seeded.
    pub fn fail_fraction(mut self, ops: &[FaultOp], fraction: f64, seed: u64) -> Self {
        self.fraction = fraction;
        self.random_ops = ops.to_vec();
        self.seed = seed.max(1);
        self
    }
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
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            index: 0,
            capacity: H200_CAPACITY,
            granularity: DEFAULT_GRANULARITY,
            event_mode: EventMode::Immediate,
        }
    }
}

#[derive(Debug)]
struct Reservation {
    size: u64,
    /// Physical allocations mapped into the range: start -> size. One `map` call makes one,
    /// and (as with `cuMemCreate` handles) one can only be unmapped whole.
    mappings: Vec<(u64, u64)>, // sorted by start; growth appends at the end
}

impl Reservation {
    fn mapped_bytes(&self) -> u64 {
        self.mappings.iter().map(|m| m.1).sum()
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

    /// Installs a fault plan (replacing any earlier one) and resets the call ordinals.
    pub fn set_faults(&self, plan: FaultPlan) {
        let mut s = self.lock();
        s.rng = plan.seed.max(1);
        s.faults = plan;
        s.op_calls.clear();
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

    /// Bytes per stored chunk: 4 KiB, or less where the granularity is smaller, so that no
    /// chunk straddles two mappings.
    fn chunk(&self) -> u64 {
        1 << self.config.granularity.trailing_zeros().min(12)
    }

    /// Writes `src` at `ptr` (a test's stand-in for a kernel writing device memory).
    pub fn write(&self, ptr: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        let mut s = self.lock();
        self.store(&mut s, ptr, src)
    }

    /// Reads `len` bytes at `ptr`; unwritten bytes read as zero.
    pub fn read(&self, ptr: DevicePtr, len: u64) -> Result<Vec<u8>, DeviceError> {
        let len = usize::try_from(len).map_err(|_| DeviceError::InvalidArgument(format!("read of {len} bytes")))?;
        let mut out = vec![0; len];
        let s = self.lock();
        self.load(&s, ptr, &mut out)?;
        Ok(out)
    }

    /// Bytes held in stored chunks (what the sparse byte store costs).
    pub fn stored_bytes(&self) -> u64 {
        self.lock().bytes.len() as u64 * self.chunk()
    }

    /// Whether `[ptr, ptr+len)` is backed now: inside one live segment, or covered by a
    /// contiguous run of mappings of one reservation.
    fn backed(s: &SimState, ptr: DevicePtr, len: u64) -> Result<(), DeviceError> {
        let end = ptr
            .checked_add(len)
            .ok_or_else(|| DeviceError::InvalidArgument(format!("[{ptr:#x}, +{len}) wraps around")))?;
        if s.segments.iter().any(|(&a, &l)| a <= ptr && end <= a + l) {
            return Ok(());
        }
        if let Some((&base, r)) = s.reservations.range(..=ptr).next_back() {
            if end <= base + r.size {
                let mut at = ptr;
                let i = r.mappings.partition_point(|m| m.0 + m.1 <= ptr);
                for &(a, l) in &r.mappings[i..] {
                    if a > at || at >= end {
                        break;
                    }
                    at = a + l;
                }
                if at >= end {
                    return Ok(());
                }
            }
        }
        Err(DeviceError::InvalidArgument(format!(
            "[{ptr:#x}, +{len}) is not backed device memory of this device"
        )))
    }

    fn store(&self, s: &mut SimState, ptr: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        Self::backed(s, ptr, src.len() as u64)?;
        let c = self.chunk();
        let mut done = 0usize;
        while done < src.len() {
            let at = ptr + done as u64;
            let (key, off) = (at / c, (at % c) as usize);
            let n = (c as usize - off).min(src.len() - done);
            let chunk = s
                .bytes
                .entry(key)
                .or_insert_with(|| vec![0; c as usize].into_boxed_slice());
            chunk[off..off + n].copy_from_slice(&src[done..done + n]);
            done += n;
        }
        Ok(())
    }

    fn load(&self, s: &SimState, ptr: DevicePtr, dst: &mut [u8]) -> Result<(), DeviceError> {
        Self::backed(s, ptr, dst.len() as u64)?;
        let c = self.chunk();
        let mut done = 0usize;
        while done < dst.len() {
            let at = ptr + done as u64;
            let (key, off) = (at / c, (at % c) as usize);
            let n = (c as usize - off).min(dst.len() - done);
            match s.bytes.get(&key) {
                Some(chunk) => dst[done..done + n].copy_from_slice(&chunk[off..off + n]),
                None => dst[done..done + n].fill(0),
            }
            done += n;
        }
        Ok(())
    }

    /// Drops the stored bytes of `[ptr, ptr+len)` (its memory was released).
    fn forget(&self, s: &mut SimState, ptr: DevicePtr, len: u64) {
        let c = self.chunk();
        let keys: Vec<u64> = s
            .bytes
            .range(ptr / c..(ptr + len).div_ceil(c))
            .map(|(&k, _)| k)
            .collect();
        for k in keys {
            s.bytes.remove(&k);
        }
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

    fn inject(s: &mut SimState, op: FaultOp) -> bool {
        if s.faults.nth.is_empty() && s.faults.fraction <= 0.0 {
            return false; // no plan: nothing to count (set_faults resets the ordinals anyway)
        }
        let n = {
            let c = s.op_calls.entry(op).or_insert(0);
            *c += 1;
            *c
        };
        if s.faults.nth.get(&op).is_some_and(|v| v.contains(&n)) {
            return true;
        }
        if s.faults.fraction > 0.0 && s.faults.random_ops.contains(&op) {
            // xorshift64*: deterministic for a seed, no dependency.
            s.rng ^= s.rng << 13;
            s.rng ^= s.rng >> 7;
            s.rng ^= s.rng << 17;
            let x = (s.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
            return x < s.faults.fraction;
        }
        false
    }

    fn take_va(s: &mut SimState, size: u64, align: u64) -> Option<u64> {
        // A planned address first, where its range is free.
        while let Some(addr) = s.planned.pop_front() {
            if Self::carve(s, addr, size) {
                return Some(addr);
            }
        }
        let found = s.va_free.iter().find_map(|(&start, &len)| {
            let a = start.div_ceil(align) * align;
            (a + size <= start + len).then_some(a)
        })?;
        Self::carve(s, found, size).then_some(found)
    }

    /// Removes `[addr, addr+size)` from the free address space if it lies inside one free range.
    fn carve(s: &mut SimState, addr: u64, size: u64) -> bool {
        let Some((&start, &len)) = s.va_free.range(..=addr).next_back() else {
            return false;
        };
        if addr + size > start + len {
            return false;
        }
        s.va_free.remove(&start);
        if addr > start {
            s.va_free.insert(start, addr - start);
        }
        if start + len > addr + size {
            s.va_free.insert(addr + size, start + len - addr - size);
        }
        true
    }

    fn give_va(s: &mut SimState, addr: u64, size: u64) {
        let (mut start, mut len) = (addr, size);
        if let Some((&p, &pl)) = s.va_free.range(..addr).next_back() {
            if p + pl == addr {
                s.va_free.remove(&p);
                start = p;
                len += pl;
            }
        }
        if let Some(nl) = s.va_free.remove(&(addr + size)) {
            len += nl;
        }
        s.va_free.insert(start, len);
    }

    fn reservation_of(s: &mut SimState, ptr: u64, size: u64) -> Result<&mut Reservation, DeviceError> {
        let (&base, r) = s
            .reservations
            .range_mut(..=ptr)
            .next_back()
            .ok_or_else(|| DeviceError::InvalidArgument(format!("{ptr:#x} is in no reservation")))?;
        if ptr + size > base + r.size {
            return Err(DeviceError::InvalidArgument(format!(
                "[{ptr:#x}, +{size}) leaves the reservation at {base:#x}"
            )));
        }
        Ok(r)
    }
}

impl Device for SimDevice {
    fn index(&self) -> i32 {
        self.config.index
    }
    fn name(&self) -> String {
        "sim".to_string()
    }
    fn total_memory(&self) -> u64 {
        self.config.capacity
    }
    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        let s = self.lock();
        Ok((self.config.capacity - s.used, self.config.capacity))
    }

    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let mut s = self.lock();
        if Self::inject(&mut s, FaultOp::Malloc) {
            return Err(DeviceError::Injected { op: "malloc" });
        }
        if size == 0 || s.used.checked_add(size).is_none_or(|u| u > self.config.capacity) {
            return Err(DeviceError::OutOfMemory { requested: size });
        }
        let ptr = Self::take_va(&mut s, size, MALLOC_ALIGN).ok_or(DeviceError::OutOfMemory { requested: size })?;
        s.used += size;
        s.segments.insert(ptr, size);
        s.counters.mallocs += 1;
        Ok(ptr)
    }

    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let mut s = self.lock();
        match s.segments.get(&ptr) {
            Some(&sz) if sz == size => {}
            Some(&sz) => {
                return Err(DeviceError::InvalidArgument(format!(
                    "free of {ptr:#x} with size {size}, allocated with {sz}"
                )))
            }
            None => return Err(DeviceError::InvalidArgument(format!("free of unknown {ptr:#x}"))),
        }
        s.segments.remove(&ptr);
        s.used -= size;
        self.forget(&mut s, ptr, size);
        Self::give_va(&mut s, ptr, size);
        s.counters.frees += 1;
        Ok(())
    }

    fn granularity(&self) -> u64 {
        self.config.granularity
    }

    fn reserve(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let g = self.config.granularity;
        if size == 0 || !size.is_multiple_of(g) {
            return Err(DeviceError::InvalidArgument(format!(
                "reservation of {size} bytes is not a multiple of the granularity {g}"
            )));
        }
        let mut s = self.lock();
        let ptr = Self::take_va(&mut s, size, g).ok_or_else(|| DeviceError::Driver {
            call: "cuMemAddressReserve",
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        })?;
        s.reservations.insert(
            ptr,
            Reservation {
                size,
                mappings: Vec::new(),
            },
        );
        Ok(ptr)
    }

    fn release_reservation(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let mut s = self.lock();
        match s.reservations.get(&ptr) {
            Some(r) if r.size == size && r.mappings.is_empty() => {}
            Some(r) if !r.mappings.is_empty() => {
                return Err(DeviceError::InvalidArgument(format!(
                    "reservation {ptr:#x} still has {} mappings",
                    r.mappings.len()
                )))
            }
            _ => return Err(DeviceError::InvalidArgument(format!("no reservation {ptr:#x}+{size}"))),
        }
        s.reservations.remove(&ptr);
        Self::give_va(&mut s, ptr, size);
        Ok(())
    }

    fn map(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let g = self.config.granularity;
        if size == 0 || !size.is_multiple_of(g) || !ptr.is_multiple_of(g) {
            return Err(DeviceError::InvalidArgument(format!(
                "map of [{ptr:#x}, +{size}) is not aligned to the granularity {g}"
            )));
        }
        let mut s = self.lock();
        if Self::inject(&mut s, FaultOp::Map) {
            return Err(DeviceError::Injected { op: "map" });
        }
        if s.used.checked_add(size).is_none_or(|u| u > self.config.capacity) {
            return Err(DeviceError::OutOfMemory { requested: size });
        }
        let r = Self::reservation_of(&mut s, ptr, size)?;
        // The mapping starting before `ptr + size` with the highest start is the only one that
        // can overlap (mappings do not overlap each other).
        let i = r.mappings.partition_point(|m| m.0 < ptr + size);
        let overlap = i > 0 && r.mappings[i - 1].0 + r.mappings[i - 1].1 > ptr;
        if overlap {
            return Err(DeviceError::InvalidArgument(format!(
                "[{ptr:#x}, +{size}) overlaps a mapping"
            )));
        }
        r.mappings.insert(i, (ptr, size));
        s.used += size;
        s.counters.maps += 1;
        s.counters.pages_mapped += size / g;
        Ok(())
    }

    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let g = self.config.granularity;
        if size == 0 || !size.is_multiple_of(g) || !ptr.is_multiple_of(g) {
            return Err(DeviceError::InvalidArgument(format!(
                "unmap of [{ptr:#x}, +{size}) is not aligned to the granularity {g}"
            )));
        }
        let mut s = self.lock();
        let r = Self::reservation_of(&mut s, ptr, size)?;
        // The range must be exactly a run of whole mappings.
        let first = r.mappings.partition_point(|m| m.0 < ptr);
        let (mut at, mut k) = (ptr, first);
        while at < ptr + size {
            match r.mappings.get(k).filter(|m| m.0 == at) {
                Some(&(_, l)) => {
                    k += 1;
                    at += l;
                }
                None => {
                    return Err(DeviceError::InvalidArgument(format!(
                        "unmap of [{ptr:#x}, +{size}): no mapping starts at {at:#x} (mappings are unmapped whole)"
                    )))
                }
            }
        }
        if at != ptr + size {
            return Err(DeviceError::InvalidArgument(format!(
                "unmap of [{ptr:#x}, +{size}) ends inside the mapping that ends at {at:#x}"
            )));
        }
        r.mappings.drain(first..k);
        s.used -= size;
        self.forget(&mut s, ptr, size);
        s.counters.unmaps += 1;
        s.counters.pages_unmapped += size / g;
        Ok(())
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        let mut s = self.lock();
        s.next_event += 1;
        let id = EventId(s.next_event);
        let seq = {
            let r = s.stream_recorded.entry(stream).or_insert(0);
            *r += 1;
            *r
        };
        if self.config.event_mode == EventMode::Immediate {
            s.stream_completed.insert(stream, seq);
        }
        s.events.insert(id, (stream, seq));
        s.counters.events_recorded += 1;
        Ok(id)
    }

    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        let mut s = self.lock();
        if Self::inject(&mut s, FaultOp::QueryEvent) {
            return Err(DeviceError::Injected { op: "query_event" });
        }
        let (stream, seq) = *s
            .events
            .get(&event)
            .ok_or_else(|| DeviceError::InvalidArgument(format!("unknown event {}", event.0)))?;
        Ok(s.stream_completed.get(&stream).copied().unwrap_or(0) >= seq)
    }

    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError> {
        let mut s = self.lock();
        let (stream, seq) = *s
            .events
            .get(&event)
            .ok_or_else(|| DeviceError::InvalidArgument(format!("unknown event {}", event.0)))?;
        let c = s.stream_completed.entry(stream).or_insert(0);
        *c = (*c).max(seq);
        Ok(())
    }

    fn destroy_event(&self, event: EventId) {
        self.lock().events.remove(&event);
    }

    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        self.complete_stream(stream);
        Ok(())
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        self.complete_all();
        self.lock().counters.synchronizes += 1;
        Ok(())
    }

    fn counters(&self) -> DeviceCounters {
        self.lock().counters
    }

    fn copy_to_host(&self, ptr: DevicePtr, dst: &mut [u8]) -> Result<(), DeviceError> {
        let mut s = self.lock();
        if Self::inject(&mut s, FaultOp::Copy) {
            return Err(DeviceError::Injected { op: "copy" });
        }
        self.load(&s, ptr, dst)
    }

    fn copy_from_host(&self, ptr: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        let mut s = self.lock();
        if Self::inject(&mut s, FaultOp::Copy) {
            return Err(DeviceError::Injected { op: "copy" });
        }
        self.store(&mut s, ptr, src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_enforced_and_returned() {
        let d = SimDevice::with_capacity(10 << 20);
        let a = d.malloc(6 << 20).unwrap();
        assert!(d.malloc(6 << 20).unwrap_err().is_out_of_memory());
        d.free(a, 6 << 20).unwrap();
        let b = d.malloc(6 << 20).unwrap();
        assert_eq!(a, b, "freed address range is reused first-fit");
        assert_eq!(d.mem_get_info().unwrap(), (4 << 20, 10 << 20));
        d.check().unwrap();
    }

    #[test]
    fn bad_free_is_an_error_and_changes_nothing() {
        let d = SimDevice::default();
        let a = d.malloc(2 << 20).unwrap();
        assert!(d.free(a + 512, 2 << 20).is_err());
        assert!(d.free(a, 4 << 20).is_err());
        assert_eq!(d.used(), 2 << 20);
        d.free(a, 2 << 20).unwrap();
        assert_eq!(d.used(), 0);
    }

    #[test]
    fn planned_addresses_are_used_in_order() {
        let d = SimDevice::default();
        let want = VA_BASE + (64 << 20);
        d.plan_addresses([want]);
        assert_eq!(d.malloc(2 << 20).unwrap(), want);
        assert_ne!(d.malloc(2 << 20).unwrap(), want);
    }

    #[test]
    fn map_and_unmap_pages_inside_a_reservation() {
        let d = SimDevice::with_capacity(8 << 20);
        let g = d.granularity();
        let base = d.reserve(64 << 20).unwrap();
        d.map(base, 2 * g).unwrap();
        assert!(d.map(base + g, g).is_err(), "double map rejected");
        assert!(d.unmap(base, g).is_err(), "a mapping is unmapped whole");
        assert!(d.map(base + 2 * g, 4 * g).unwrap_err().is_out_of_memory());
        assert_eq!(d.used(), 2 * g);
        assert!(d.release_reservation(base, 64 << 20).is_err());
        d.unmap(base, 2 * g).unwrap();
        d.release_reservation(base, 64 << 20).unwrap();
        let c = d.counters();
        assert_eq!((c.maps, c.unmaps, c.pages_mapped, c.pages_unmapped), (1, 1, 2, 2));
        d.check().unwrap();
    }

    #[test]
    fn bytes_round_trip_and_die_with_their_memory() {
        let d = SimDevice::default();
        let g = d.granularity();
        let base = d.reserve(8 * g).unwrap();
        assert!(d.write(base, b"x").is_err(), "unmapped memory holds no bytes");
        d.map(base, g).unwrap();
        d.map(base + g, g).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let at = base + g - 5000; // straddles the two mappings
        d.write(at, &data).unwrap();
        assert_eq!(d.read(at, data.len() as u64).unwrap(), data);
        let mut out = vec![0; 100];
        d.copy_to_host(at, &mut out).unwrap();
        assert_eq!(out, data[..100]);
        assert_eq!(
            d.read(base + 2 * g - 8, 8).unwrap(),
            vec![0; 8],
            "unwritten bytes read as zero"
        );
        assert!(
            d.read(base + 2 * g - 8, 16).is_err(),
            "a read past the mappings is refused"
        );
        d.unmap(base + g, g).unwrap();
        d.map(base + g, g).unwrap();
        assert_eq!(d.read(base + g, 8).unwrap(), vec![0; 8], "new pages hold no old bytes");
        assert_eq!(d.read(at, 8).unwrap(), data[..8], "the other mapping keeps its bytes");
        let seg = d.malloc(1 << 20).unwrap();
        d.copy_from_host(seg + 7, b"abc").unwrap();
        assert_eq!(d.read(seg + 6, 5).unwrap(), b"\0abc\0");
        d.free(seg, 1 << 20).unwrap();
        d.unmap(base, 2 * g).unwrap();
        assert_eq!(d.stored_bytes(), 0);
        d.set_faults(FaultPlan::default().fail_nth(FaultOp::Copy, 1));
        d.map(base, g).unwrap();
        assert!(d.copy_from_host(base, b"a").is_err());
        d.copy_from_host(base, b"a").unwrap();
        d.check().unwrap();
    }

    #[test]
    fn manual_events_complete_when_told() {
        let d = SimDevice::new(SimConfig {
            event_mode: EventMode::Manual,
            ..SimConfig::default()
        });
        let s1 = StreamId(7);
        let e1 = d.record_event(s1).unwrap();
        let e2 = d.record_event(StreamId(8)).unwrap();
        assert!(!d.query_event(e1).unwrap());
        d.complete_stream(s1);
        assert!(d.query_event(e1).unwrap());
        assert!(!d.query_event(e2).unwrap());
        d.synchronize_event(e2).unwrap();
        assert!(d.query_event(e2).unwrap());
    }

    #[test]
    fn faults_fail_the_chosen_calls() {
        let d = SimDevice::default();
        d.set_faults(FaultPlan::default().fail_nth(FaultOp::Malloc, 2));
        assert!(d.malloc(2 << 20).is_ok());
        assert!(matches!(d.malloc(2 << 20), Err(DeviceError::Injected { .. })));
        assert!(d.malloc(2 << 20).is_ok());
        d.set_faults(FaultPlan::default().fail_fraction(&[FaultOp::Malloc], 0.5, 42));
        let fails = (0..200).filter(|_| d.malloc(512).is_err()).count();
        assert!((50..150).contains(&fails), "about half fail: {fails}");
    }
}
