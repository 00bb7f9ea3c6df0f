//! The simulated address space and reservations: virtual ranges per device, handed out first-fit
//! (so freed ranges are reused, as the driver does) or at seeded random places, addresses planned
//! by a replay, and the mappings made into each reservation.
//!
//! Guarantees: no two live ranges (segments or reservations) overlap; addresses of two simulated
//! devices never coincide; a mapping, like a `cuMemCreate` handle, can only be unmapped whole;
//! one seed gives one sequence of addresses for one sequence of calls.

use super::{SimDevice, SimState};
use crate::DeviceError;

pub(super) const VA_BASE: u64 = 0x7f00_0000_0000;
pub(super) const VA_SIZE: u64 = 1 << 50; // 1 PiB of address space per device: thousands of expandable reservations

/// Device `index`'s address range starts here, 4 PiB apart, so that pointers of two simulated
/// devices never coincide (as under CUDA's unified addressing). Device 0 keeps the range real
/// traces use, so a replay can give segments their recorded addresses.
pub(super) fn va_base(index: i32) -> u64 {
    VA_BASE + (index.clamp(0, 255) as u64) * (VA_SIZE << 2)
}
pub(super) const MALLOC_ALIGN: u64 = 2 << 20;

/// Where a [`SimDevice`] puts a new segment or reservation (a planned address comes first).
///
/// PyTorch's allocator breaks ties between free blocks of one size by address, so the order of
/// segments in the address space decides which block a request splits, and near a memory cap
/// whether the out-of-memory retry can release enough. The CUDA driver's order is not
/// predictable from the calls alone: it differs between two runs of one program. `Shuffled`
/// lets a caller try several orders.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// The lowest free range that fits: later segments mostly lie above earlier ones.
    #[default]
    LowestFree,
    /// The top of the highest free range that fits, as the CUDA driver places large segments:
    /// later segments mostly lie below earlier ones.
    HighestFree,
    /// A random free place drawn from this seed's generator, so segments lie in a random order.
    Shuffled(u64),
}

impl std::str::FromStr for Placement {
    type Err = String;

    /// `lowest`, `highest` or `shuffled:SEED` (SEED a non-negative integer).
    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            None if text == "lowest" => Ok(Placement::LowestFree),
            None if text == "highest" => Ok(Placement::HighestFree),
            Some(("shuffled", seed)) => seed
                .parse()
                .map(Placement::Shuffled)
                .map_err(|_| format!("placement '{text}': the seed must be a non-negative integer")),
            _ => Err(format!(
                "unknown placement '{text}' (use lowest, highest or shuffled:SEED)"
            )),
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::LowestFree => write!(f, "lowest"),
            Placement::HighestFree => write!(f, "highest"),
            Placement::Shuffled(seed) => write!(f, "shuffled:{seed}"),
        }
    }
}

/// Random draws of [`Placement::Shuffled`] before it falls back to the lowest free range.
const SHUFFLE_DRAWS: usize = 64;
/// The part of a device's address range `Shuffled` draws from (any segment fits many times).
const SHUFFLE_SPAN: u64 = 1 << 46;

/// splitmix64: small, fast, and the same on every platform.
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Debug)]
pub(super) struct Reservation {
    pub(super) size: u64,
    /// Physical allocations mapped into the range: start -> size. One `map` call makes one,
    /// and (as with `cuMemCreate` handles) one can only be unmapped whole.
    pub(super) mappings: Vec<(u64, u64)>, // sorted by start; growth appends at the end
}

impl Reservation {
    pub(super) fn mapped_bytes(&self) -> u64 {
        self.mappings.iter().map(|m| m.1).sum()
    }
}

impl SimDevice {
    pub(super) fn take_va(&self, s: &mut SimState, size: u64, align: u64) -> Option<u64> {
        // A planned address first, where its range is free.
        while let Some(addr) = s.planned.pop_front() {
            if Self::carve(s, addr, size) {
                return Some(addr);
            }
        }
        if let Placement::Shuffled(_) = self.config.placement {
            let base = va_base(self.config.index);
            let slots = SHUFFLE_SPAN.saturating_sub(size) / align;
            for _ in 0..SHUFFLE_DRAWS.min(slots as usize) {
                let addr = base + next_random(&mut s.placement_rng) % slots * align;
                if Self::carve(s, addr, size) {
                    return Some(addr);
                }
            }
        }
        if self.config.placement == Placement::HighestFree {
            let found = s.va_free.iter().rev().find_map(|(&start, &len)| {
                let a = (start + len).checked_sub(size)? / align * align;
                (a >= start).then_some(a)
            })?;
            return Self::carve(s, found, size).then_some(found);
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

    pub(super) fn give_va(s: &mut SimState, addr: u64, size: u64) {
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

    pub(super) fn reservation_of(s: &mut SimState, ptr: u64, size: u64) -> Result<&mut Reservation, DeviceError> {
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
