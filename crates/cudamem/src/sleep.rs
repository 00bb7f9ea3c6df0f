//! [`SleepTags`], one allocator's tags and sleep mode: allocations go to the current tag's
//! pools; a tag's memory can be given back to the device while its addresses are kept
//! ([`sleep`](SleepTags::sleep), optionally offloading its bytes to the host) and mapped again
//! at the same addresses ([`wake`](SleepTags::wake)). The rules are the engine's (its tags
//! module).
//!
//! Guarantees: each call takes the engine's lock once; a wake that runs out of memory leaves
//! everything asleep. Only an allocator with one device-wide engine offers this handle: with
//! `sharded:True`, [`Allocator::sleep_tags`](crate::Allocator::sleep_tags) is an error that says
//! so.

use cudamem_alloc::{AllocError, CachingAllocator, SleepStats, TagInfo};

/// One allocator's tags and sleep mode, from
/// [`Allocator::sleep_tags`](crate::Allocator::sleep_tags).
#[derive(Clone, Copy)]
pub struct SleepTags<'a> {
    pub(crate) engine: &'a CachingAllocator,
}

impl SleepTags<'_> {
    /// Makes `tag` current (created if new) or none; returns the tag current before.
    pub fn set(&self, tag: Option<&str>) -> Result<Option<String>, AllocError> {
        self.engine.set_tag(tag)
    }
    /// The current tag, if one is set.
    pub fn current(&self) -> Option<String> {
        self.engine.current_tag()
    }
    /// Gives the device memory of the tags named (all awake ones if none) back, keeping their
    /// addresses; with `offload`, their bytes go to host memory first.
    pub fn sleep(&self, tags: &[&str], offload: bool) -> Result<(), AllocError> {
        self.engine.sleep(tags, offload)
    }
    /// Maps memory again for the tags named (all asleep ones if none) at their old addresses.
    pub fn wake(&self, tags: &[&str]) -> Result<(), AllocError> {
        self.engine.wake(tags)
    }
    /// The counters of sleeping memory.
    pub fn stats(&self) -> SleepStats {
        self.engine.sleep_stats()
    }
    /// Every tag's state.
    pub fn list(&self) -> Vec<TagInfo> {
        self.engine.tags()
    }
}
