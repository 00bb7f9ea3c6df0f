//! # The composition hook: what an allocator built of several engines may use
//!
//! An [`Engine`] serves one device on its own. An allocator may instead split a device's streams
//! among several engines (each deciding for its own streams exactly as one engine would, since
//! PyTorch's rules never let a stream reuse another's blocks) and combine them. Such an
//! allocator needs four things of an engine, and this hook is all it gets:
//!
//! 1. **Hearing the stats.** The engine's `S:` [`StatSink`] is told every change of a per-pool
//!    value as it happens ([`Engine::sink`], [`Engine::sink_mut`]); the stats as kept are then
//!    exact and readable in place ([`Engine::kept_stats`]), with no copy.
//! 2. **A device-wide last resort.** PyTorch's last step on out of memory releases every cached
//!    block of the device, which a composing allocator must do across its engines:
//!    [`Engine::malloc_or_defer`] runs the fallback ladder but that step and says
//!    [`Attempt::NeedsDeviceRelease`]; the caller empties the other engines
//!    ([`Engine::empty_cache_uncounted`]) and calls [`Engine::malloc_after_device_release`].
//! 3. **The one synchronisation.** Emptying several engines of one device is one
//!    synchronisation of all streams: all but one of them are emptied uncounted.
//! 4. **Whether an engine holds anything** ([`Engine::has_segments`]).
//!
//! Guarantees: these are the engine's own steps, in the order [`Engine::malloc`] takes them, so
//! a composed allocator's decisions, device calls and counters equal a single engine's (the
//! sharded allocator's property test holds them to it). Every method is inlined into its
//! caller, so the hot path of a composed allocator is monomorphised like the engine's own.

use cudamem_device::StreamId;

pub use super::Attempt;
use super::Engine;
use crate::error::AllocError;
use crate::stats::{DeviceStats, StatSink};

impl<S: StatSink> Engine<S> {
    /// The sink that hears every change of a per-pool stat value.
    #[inline(always)]
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// The sink, mutable (to reset what it noted between operations).
    #[inline(always)]
    pub fn sink_mut(&mut self) -> &mut S {
        &mut self.sink
    }

    /// The stats as the engine keeps them, without a copy: for an engine whose sink hears
    /// ([`StatSink::HEARS`]), equal to [`Engine::stats`]; for one whose sink does not, some
    /// fields are stale (see [`Engine::stats`]).
    #[inline(always)]
    pub fn kept_stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// `malloc` without the last step of its fallback ladder (release every cached block of
    /// the device, retry): when everything short of that failed, `NeedsDeviceRelease`, and the
    /// caller, who owns the device's other caches, releases them and calls
    /// [`Engine::malloc_after_device_release`]. Allocates from the default pools (never a tag's).
    #[inline(always)]
    pub fn malloc_or_defer(&mut self, size: u64, stream: StreamId) -> Result<Attempt, AllocError> {
        self.try_malloc(size, stream, true)
    }

    /// The last step for a deferred [`Engine::malloc_or_defer`]: release this engine's cached
    /// blocks and retry (the caller released the device's other caches first). Out of memory
    /// is reported with this engine's totals.
    pub fn malloc_after_device_release(&mut self, size: u64, stream: StreamId) -> Result<u64, AllocError> {
        self.malloc_last_resort(size, stream)
    }

    /// [`Engine::empty_cache`], not counted in `num_sync_all_streams`: for the engines of a
    /// device-wide release but the one that counts the device's synchronisation.
    pub fn empty_cache_uncounted(&mut self) -> Result<(), AllocError> {
        self.empty_cache()?;
        self.stats.num_sync_all_streams -= 1;
        Ok(())
    }

    /// Whether the engine holds any segment (one with no page mapped included).
    #[inline]
    pub fn has_segments(&self) -> bool {
        self.segments.iter().next().is_some()
    }
}
