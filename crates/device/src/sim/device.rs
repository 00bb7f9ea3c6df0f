//! The [`Device`] implementation of [`SimDevice`]: capacity accounting, segments, reservations
//! and mappings, events and streams, host copies.
//!
//! Guarantees: asking for more than is free is [`DeviceError::OutOfMemory`], exactly where
//! `cudaMalloc` would fail; a call that fails (an injected fault included) changes nothing;
//! `used == sum(live segments) + mapped pages x granularity <= capacity` after every call; a
//! synchronisation completes what it waits for, as on hardware.

use super::faults::FaultOp;
use super::vmm::{Reservation, MALLOC_ALIGN};
use super::{EventMode, SimDevice};
use crate::{Device, DeviceCounters, DeviceError, DevicePtr, EventId, StreamId};

impl Device for SimDevice {
    fn handed_out(&self) -> Option<u64> {
        Some(self.used())
    }
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
        let ptr = self
            .take_va(&mut s, size, MALLOC_ALIGN)
            .ok_or(DeviceError::OutOfMemory { requested: size })?;
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
        let ptr = self.take_va(&mut s, size, g).ok_or_else(|| DeviceError::Driver {
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
