//! [`Inspect`], read-only questions about one allocator's addresses and limits that PyTorch's
//! `CUDAAllocator` answers beyond the statistics: which allocator owns an address, the
//! segment under it (`getBaseAllocation`), the largest block it could hand out, its memory
//! fraction, and its allocated and reserved totals read together.
//!
//! Guarantees: each call takes the engine's lock once and changes nothing. Only an allocator
//! with one device-wide engine offers this handle: with `sharded:True`,
//! [`Allocator::inspect`](crate::Allocator::inspect) is an error that says so.

use cudamem_alloc::{AllocError, CachingAllocator};

/// Read-only questions about one allocator, from
/// [`Allocator::inspect`](crate::Allocator::inspect).
#[derive(Clone, Copy)]
pub struct Inspect<'a> {
    pub(crate) engine: &'a CachingAllocator,
}

impl Inspect<'_> {
    /// Whether `ptr` is a live allocation of this allocator.
    pub fn owns(&self, ptr: u64) -> bool {
        self.engine.lock().owns(ptr)
    }
    /// The size of the block handed out at `ptr` (the rounded size), if `ptr` is live here.
    pub fn allocation_size(&self, ptr: u64) -> Option<u64> {
        self.engine.lock().allocation_size(ptr)
    }
    /// PyTorch's `getBaseAllocation`: the start and size of the segment (or expandable
    /// mapping) holding `ptr`; `None` when `ptr` is in no segment of this allocator.
    pub fn base_allocation(&self, ptr: u64) -> Result<Option<(u64, u64)>, AllocError> {
        self.engine.lock().base_allocation(ptr)
    }
    /// The largest block this allocator could hand out without asking the device for more.
    pub fn largest_free_block(&self) -> u64 {
        self.engine.lock().largest_free_block()
    }
    /// The per-process memory fraction in force (1 when none was set).
    pub fn memory_fraction(&self) -> f64 {
        self.engine.lock().memory_fraction()
    }
    /// The bytes allocated and reserved, read under one lock (a consistent pair).
    pub fn allocated_and_reserved(&self) -> (u64, u64) {
        self.engine.lock().allocated_and_reserved()
    }
}
