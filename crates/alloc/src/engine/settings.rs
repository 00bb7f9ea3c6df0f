//! # Limits, settings and read-only views of the engine
//!
//! The memory fraction, the stats as callers see them (`all` summed, `active` mirrored; see
//! [`Engine::stats`]), resets, and lookups that change nothing.

#[allow(unused_imports)]
use super::*;

impl<S: StatSink> Engine<S> {
    /// Limits this process to `fraction` of the device's memory (cached bytes count).
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), AllocError> {
        if !(0.0..=1.0).contains(&fraction) || fraction.is_nan() {
            return Err(AllocError::InvalidArgument(format!(
                "invalid memory fraction {fraction}: set it within [0, 1]"
            )));
        }
        let (_, total) = self.device.mem_get_info()?;
        self.allowed_memory_maximum = Some((fraction * total as f64) as u64);
        self.config.per_process_memory_fraction = fraction;
        Ok(())
    }

    /// The memory fraction in force (1 when none was set).
    pub fn memory_fraction(&self) -> f64 {
        match self.allowed_memory_maximum {
            Some(_) => self.config.per_process_memory_fraction,
            None => 1.0,
        }
    }

    /// The block size of allocation `ptr`, if it is one.
    #[inline]
    pub fn allocation_size(&self, ptr: u64) -> Option<u64> {
        let id = self.allocated.get(ptr, |id| self.blocks[id].addr == ptr)?;
        Some(self.blocks[id].size)
    }

    /// `allocated_bytes` and `reserved_bytes` of all pools, now (what PyTorch reports to its
    /// profiler with every allocation and free).
    pub fn allocated_and_reserved(&self) -> (u64, u64) {
        let s = &self.stats;
        let sum = |a: &crate::stats::StatArray| (a.small_pool().current + a.large_pool().current) as u64;
        (sum(&s.allocated_bytes), sum(&s.reserved_bytes))
    }

    /// The segment holding `ptr` (address, size), if it is a whole device segment: the base
    /// allocation PyTorch shares between processes. `Err` for memory of an expandable segment.
    pub fn base_allocation(&self, ptr: u64) -> Result<Option<(u64, u64)>, AllocError> {
        let Some((_, seg)) = self
            .segments
            .iter()
            .find(|(_, g)| g.base <= ptr && ptr < g.base + g.size)
        else {
            return Ok(None);
        };
        if seg.is_expandable() {
            return Err(AllocError::InvalidArgument(format!(
                "{ptr:#x} lies in an expandable segment, which has no base allocation to share between \
                 processes; allocate tensors to be shared with expandable_segments:False"
            )));
        }
        Ok(Some((seg.base, seg.size)))
    }

    /// The statistics.
    ///
    /// An engine whose sink hears nothing keeps each array's `all` `current`, `allocated`
    /// and `freed` as the sums of the pools' (it updates only the pool's value and `all`'s
    /// peak, against the pools' sum: two read-modify-writes of memory fewer a change, about
    /// twelve a pair); they are
    /// summed here. A hearing sink is told `all`'s value at every change, so that engine
    /// keeps `all` up to date.
    #[inline]
    pub fn stats(&self) -> DeviceStats {
        let mut s = self.stats;
        if self.active_is_allocation {
            s.active = s.allocation;
            s.active_bytes = s.allocated_bytes;
        }
        if !S::HEARS {
            s.sum_all();
        }
        s
    }

    /// `reset_peak_memory_stats()`: every peak becomes its current value.
    pub fn reset_peak_stats(&mut self) {
        if !S::HEARS {
            self.stats.sum_all(); // `all`'s current, for its peak
        }
        self.stats.reset_peak();
    }

    /// `reset_accumulated_memory_stats()`: every `allocated` and `freed` becomes 0.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// The configuration in force.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// The policy.
    pub fn policy(&self) -> &dyn Policy {
        self.policy.get()
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// Bytes obtained from the device.
    pub fn total_allocated_memory(&self) -> u64 {
        self.total_allocated_memory
    }
}
