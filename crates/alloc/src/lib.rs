//! # cudamem-alloc: a caching allocator for GPU memory with PyTorch's semantics
//!
//! [`CachingAllocator`] serves one device: it keeps freed device memory in a cache and hands it
//! out again, exactly as PyTorch's CUDA caching allocator does under its default policy, and
//! reports the same 122 statistics, the same `memory_summary()` table and the same out-of-memory
//! message.
//!
//! ## Where things are
//! | concern | module |
//! |---|---|
//! | vocabulary: blocks, pools, their invariants | `block.rs`, `segment.rs`, `ids.rs` |
//! | best fit in constant time | `free_index.rs` |
//! | address → block, for `free` and `record_stream` | `pointer_map.rs` |
//! | the algorithm (malloc, free, events, release, OOM retry) | `engine.rs` and `engine/` |
//! | the decisions (rounding, pools, fit, split, expandable) | [`policy`] — one file per policy |
//! | configuration (`PYTORCH_CUDA_ALLOC_CONF` syntax) | [`config`] |
//! | sizes written by people (`80GiB`, `141GB`), for every interface | [`size`] |
//! | statistics and the summary table | [`stats`], [`summary`], [`format`](mod@format) |
//! | history (PyTorch's memory trace) and snapshots | [`history`], [`snapshot`] |
//! | executable invariants | `invariants.rs` ([`check_engine`]) |
//! | what an allocator composed of several engines may use | [`hook`] |
//! | errors | [`error`] |
//!
//! ## What is public
//! [`CachingAllocator`] is the front door. The engine's own modules (blocks, segments, the free
//! index, the pointer map, the engine and its parts, the lock) are private; the items a caller
//! names are re-exported here: what a [`Policy`] sees ([`Block`], [`PoolId`]), the ids and
//! checkpoints of private pools, tags, IPC handles and trace observers, and [`Engine`] itself
//! for allocators composed of engines ([`hook`]) and for loops that hold the lock across many
//! calls ([`CachingAllocator::lock`]). The modules that stay public are what callers configure,
//! read and format.
//!
//! ## Locking
//! One mutex per device allocator guards all of its state (as PyTorch's per-device mutex does);
//! the device is called with the lock held. `CachingAllocator` is `Send + Sync`. An allocator
//! that gives groups of streams engines of their own (the `cudamem-sharded` crate) builds on
//! [`hook`] only.

#![warn(missing_docs)]

// The engine's own modules: private, reached through the items re-exported below.
mod block;
mod engine;
mod free_index;
mod ids;
mod invariants;
mod lock;
mod pointer_map;
mod segment;

// What callers configure, read and format: public modules.
pub mod config;
pub mod error;
pub mod format;
pub mod history;
pub mod policy;
pub mod size;
pub mod snapshot;
pub mod stats;
pub mod summary;

use std::sync::Arc;

use cudamem_device::{Device, DevicePtr, StreamId};

pub use block::{Block, PoolId};
pub use config::AllocatorConfig;
pub use engine::hook;
pub use engine::{sleep_annotation, Engine, SleepStats, TagId, TagInfo, MAX_TAG_LEN, ONE_EXABYTE};
pub use engine::{CheckpointDelta, MempoolId, PoolCheckpoint, PoolSlot, SegmentCheckpoint};
pub use engine::{Shared, TraceEvent, TraceObserver};
pub use error::{AllocError, OutOfMemory};
pub use history::{Frame, RecordContext};
pub use invariants::check as check_engine;
pub use lock::{EngineGuard, EngineLock};
pub use policy::Policy;
pub use stats::{DeviceStats, NoSink, StatSink};
pub use summary::StatsDict;

/// The caching allocator of one device. See the [crate documentation](crate).
#[derive(Debug)]
pub struct CachingAllocator {
    engine: EngineLock<Engine>,
}

impl CachingAllocator {
    /// An allocator for `device` with the given configuration and policy.
    pub fn new(device: Arc<dyn Device>, config: AllocatorConfig, policy: Box<dyn Policy>) -> Self {
        CachingAllocator {
            engine: EngineLock::new(Engine::new(device, config, policy)),
        }
    }

    /// An allocator for `device` with a policy named as on the command line (`pytorch`,
    /// `pytorch-expandable`, ...) and the configuration `config`.
    pub fn with_policy(device: Arc<dyn Device>, mut config: AllocatorConfig, policy: &str) -> Result<Self, AllocError> {
        let p = policy::by_name(policy, &mut config).map_err(AllocError::InvalidArgument)?;
        Ok(Self::new(device, config, p))
    }

    /// Exclusive access to the engine, for callers that batch many operations (trace replay) or
    /// inspect state (tests, reports).
    ///
    /// A panic under the lock means a bug already reported by that panic; the lock is given
    /// back and later callers are served (see [`EngineLock`]).
    #[inline]
    pub fn lock(&self) -> EngineGuard<'_, Engine> {
        self.engine.lock()
    }

    /// Allocates `size` bytes for use on `stream`. Size 0 returns address 0.
    pub fn malloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        self.lock().malloc(size, stream)
    }

    /// Frees an allocation (PyTorch's `raw_delete`).
    pub fn free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        self.lock().free(ptr)
    }

    /// PyTorch's `recordStream`: `ptr` is used on `stream` too.
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        self.lock().record_stream(ptr, stream)
    }

    /// Returns all unused cached memory to the device.
    pub fn empty_cache(&self) -> Result<(), AllocError> {
        self.lock().empty_cache()
    }

    /// The statistics.
    pub fn stats(&self) -> DeviceStats {
        self.lock().stats()
    }

    /// `memory_stats()`: the 122-key dict.
    pub fn memory_stats(&self) -> StatsDict {
        self.stats().to_dict()
    }

    /// `memory_summary(abbreviated)`: PyTorch's table, then cudamem's table of tags when the
    /// allocator has any ([`summary::tags_summary`]).
    pub fn memory_summary(&self, abbreviated: bool) -> String {
        let e = self.lock();
        let table = summary::memory_summary(&e.stats().to_dict(), e.device.index(), abbreviated);
        table + &summary::tags_summary(&e.tags())
    }

    /// `memory_allocated()`: bytes of live allocations (rounded sizes).
    pub fn memory_allocated(&self) -> u64 {
        self.stats().allocated_bytes.all().current as u64
    }
    /// `max_memory_allocated()`.
    pub fn max_memory_allocated(&self) -> u64 {
        self.stats().allocated_bytes.all().peak as u64
    }
    /// `memory_reserved()`: bytes held from the device.
    pub fn memory_reserved(&self) -> u64 {
        self.stats().reserved_bytes.all().current as u64
    }
    /// `max_memory_reserved()`.
    pub fn max_memory_reserved(&self) -> u64 {
        self.stats().reserved_bytes.all().peak as u64
    }
    /// `reset_peak_memory_stats()`.
    pub fn reset_peak_memory_stats(&self) {
        self.lock().reset_peak_stats();
    }
    /// `reset_accumulated_memory_stats()`.
    pub fn reset_accumulated_memory_stats(&self) {
        self.lock().reset_accumulated_stats();
    }
    /// `mem_get_info()`: `(free, total)` bytes of the device.
    pub fn mem_get_info(&self) -> Result<(u64, u64), AllocError> {
        Ok(self.lock().device.mem_get_info()?)
    }
    /// `set_per_process_memory_fraction(fraction)`.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), AllocError> {
        self.lock().set_memory_fraction(fraction)
    }
    /// Changes settings at run time, like `torch.cuda.memory._set_allocator_settings`.
    pub fn set_settings(&self, settings: &str) -> Result<(), AllocError> {
        let mut e = self.lock();
        let mut cfg = e.config.clone();
        cfg.apply(settings).map_err(AllocError::Config)?;
        e.stats.max_split_size = if cfg.max_split_size == u64::MAX {
            -1
        } else {
            cfg.max_split_size as i64
        };
        e.config = cfg;
        Ok(())
    }
    /// The configuration in force.
    pub fn config(&self) -> AllocatorConfig {
        self.lock().config.clone()
    }
    /// The policy's name.
    pub fn policy_name(&self) -> String {
        self.lock().policy.get().name().to_string()
    }
    /// The device this allocator serves.
    pub fn device(&self) -> Arc<dyn Device> {
        self.lock().device.clone()
    }
    /// `torch.cuda.memory._snapshot()`: state and history in PyTorch's schema.
    pub fn snapshot(&self) -> cudamem_trace_types::Trace {
        self.lock().snapshot()
    }
    /// `torch.cuda.memory._record_memory_history(enabled, context, ..., max_entries)`.
    pub fn record_memory_history(&self, enabled: bool, context: RecordContext, max_entries: usize) {
        self.lock().record_memory_history(enabled, context, max_entries)
    }
    /// Records a user annotation (`START`/`END` of a named region).
    pub fn annotate(&self, stage: &str, name: &str) {
        self.lock().annotate(stage, name)
    }
    /// Allocates with a caller-supplied stack recorded in the history (e.g. Python frames).
    pub fn malloc_with_stack(&self, size: u64, stream: StreamId, frames: Vec<Frame>) -> Result<DevicePtr, AllocError> {
        let mut e = self.lock();
        e.set_current_stack(Some(frames));
        let r = e.malloc(size, stream);
        e.set_current_stack(None);
        r
    }
    /// Makes `tag` current (created if new) or none, returning the tag current before: every
    /// allocation of this allocator goes to the current tag's pools, whichever thread makes it.
    pub fn set_tag(&self, tag: Option<&str>) -> Result<Option<String>, AllocError> {
        self.lock().set_tag(tag)
    }
    /// The current tag, if one is set.
    pub fn current_tag(&self) -> Option<String> {
        self.lock().current_tag().map(str::to_string)
    }
    /// Runs `f` with `tag` current, then makes the tag current before it current again (also
    /// when `f` panics).
    pub fn with_tag<R>(&self, tag: &str, f: impl FnOnce() -> R) -> Result<R, AllocError> {
        struct Restore<'a>(&'a CachingAllocator, Option<String>);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                // The tag was current before, so it exists: setting it cannot fail.
                let _ = self.0.set_tag(self.1.as_deref());
            }
        }
        let _restore = Restore(self, self.set_tag(Some(tag))?);
        Ok(f())
    }
    /// Allocates from `tag`'s pools (created if new), whichever tag is current.
    pub fn malloc_tagged(&self, size: u64, stream: StreamId, tag: &str) -> Result<DevicePtr, AllocError> {
        let mut e = self.lock();
        let t = e.tag_id(tag)?;
        e.malloc_in_tag(size, stream, t)
    }
    /// Gives the device memory of the tags named (all awake ones if none) back to the device,
    /// keeping their addresses; with `offload`, their bytes go to host memory first. See
    /// the engine's tags module (`engine/tags.rs`) for the rules.
    pub fn sleep(&self, tags: &[&str], offload: bool) -> Result<(), AllocError> {
        self.lock().sleep(tags, offload)
    }
    /// Maps memory for the tags named (all asleep ones if none) at their old addresses and
    /// restores offloaded bytes; on out of memory, everything stays asleep.
    pub fn wake(&self, tags: &[&str]) -> Result<(), AllocError> {
        self.lock().wake(tags)
    }
    /// The counters of sleeping memory.
    pub fn sleep_stats(&self) -> SleepStats {
        self.lock().sleep_stats()
    }
    /// Every tag's state.
    pub fn tags(&self) -> Vec<TagInfo> {
        self.lock().tags()
    }
    /// Checks every invariant (slow; for tests). See [`check_engine`].
    pub fn check_invariants(&self) -> Result<(), String> {
        invariants::check(&self.lock())
    }
}
