//! The simulated address space and reservations: first-fit virtual ranges per device (so freed
//! ranges are reused, as the driver does), addresses planned by a replay, and the mappings made
//! into each reservation.
//!
//! Guarantees: no two live ranges (segments or reservations) overlap; addresses of two simulated
//! devices never coincide; a mapping, like a `cuMemCreate` handle, can only be unmapped whole.

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
    pub(super) fn take_va(s: &mut SimState, size: u64, align: u64) -> Option<u64> {
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
