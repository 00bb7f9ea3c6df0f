//! # What each device records in its memory history
//!
//! The per-device flags of `record_memory_history`, read on every allocation and free and so
//! kept apart from everything else: whether a device records its history, and whether its
//! allocations (and frees) carry the Python stack of the calling thread ([`stack_mode`]: one
//! relaxed atomic load, the only cost of history on the allocation path when recording is
//! off). Also the setting of `device=None`, which the registry applies to each allocator it
//! creates ([`on_new_allocator`], called under its creation lock), and the end of gathering at
//! interpreter exit ([`stop_gathering`]).
//!
//! A leaf module: the registry calls it, and [`crate::history`] turns `record_memory_history`
//! into [`apply`] calls on the registry's allocators.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Mutex;

use cudamem::{AllocError, Allocator, RecordContext};

/// The number of device ordinals served (0 .. MAX_DEVICES): the registry's slots, each with
/// its flags here.
pub const MAX_DEVICES: usize = 64;

/// No stacks are gathered on this device.
pub const STACKS_NONE: u8 = 0;
/// Allocations carry stacks (context `"state"` or `"alloc"`).
pub const STACKS_ALLOC: u8 = 1;
/// Allocations and frees carry stacks (context `"all"`).
pub const STACKS_ALL: u8 = 2;

static STACK_MODE: [AtomicU8; MAX_DEVICES] = [const { AtomicU8::new(STACKS_NONE) }; MAX_DEVICES];
static FINALIZING: AtomicBool = AtomicBool::new(false);
/// Whether each device records its history (with stacks or without).
static RECORDING: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
/// The setting for allocators created from now on (`device=None`).
static DEFAULT: Mutex<Option<HistorySettings>> = Mutex::new(None);

/// What `record_memory_history` asked for, in the engine's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistorySettings {
    /// Recording on.
    pub enabled: bool,
    /// Which events carry stacks.
    pub context: RecordContext,
    /// Ring size (already forced to 1 unless `enabled == "all"`).
    pub max_entries: usize,
}

impl HistorySettings {
    fn stack_mode(&self) -> u8 {
        if !self.enabled {
            return STACKS_NONE;
        }
        match self.context {
            RecordContext::Never => STACKS_NONE,
            RecordContext::State | RecordContext::Alloc => STACKS_ALLOC,
            RecordContext::All => STACKS_ALL,
        }
    }
}

/// The stack mode of `device` ([`STACKS_NONE`], [`STACKS_ALLOC`], [`STACKS_ALL`]): one relaxed
/// atomic load, the only cost of history on the allocation path when recording is off.
#[inline]
pub fn stack_mode(device: i32) -> u8 {
    match usize::try_from(device).ok().and_then(|i| STACK_MODE.get(i)) {
        Some(m) => m.load(Ordering::Relaxed),
        None => STACKS_NONE,
    }
}

/// Whether `device` records its memory history.
pub fn is_recording(device: i32) -> bool {
    usize::try_from(device)
        .ok()
        .and_then(|i| RECORDING.get(i))
        .is_some_and(|r| r.load(Ordering::Relaxed))
}

/// Applies `s` to `device`, whose allocator is `alloc`; `clear` empties the ring first.
pub fn apply(device: i32, alloc: &Allocator, s: HistorySettings, clear: bool) -> Result<(), AllocError> {
    let history = alloc.history()?;
    if clear && s.enabled {
        // The engine clears its ring when recording stops.
        history.record_memory_history(false, RecordContext::Never, 1);
    }
    history.record_memory_history(s.enabled, s.context, s.max_entries);
    if let Some(r) = usize::try_from(device).ok().and_then(|i| RECORDING.get(i)) {
        r.store(s.enabled, Ordering::Relaxed);
    }
    if let Some(m) = usize::try_from(device).ok().and_then(|i| STACK_MODE.get(i)) {
        let mode = if FINALIZING.load(Ordering::Relaxed) {
            STACKS_NONE
        } else {
            s.stack_mode()
        };
        m.store(mode, Ordering::Relaxed);
    }
    Ok(())
}

/// Called by the registry, under its creation lock, for each new allocator: applies the
/// setting of the last `record_memory_history(device=None)`.
pub fn on_new_allocator(device: i32, alloc: &Allocator) -> Result<(), AllocError> {
    let s = *DEFAULT.lock().unwrap_or_else(|e| e.into_inner());
    match s {
        Some(s) => apply(device, alloc, s, false),
        None => Ok(()),
    }
}

/// Makes `s` (or, with `None`, nothing) the setting of allocators created from now on. The
/// caller holds the registry's creation lock.
pub fn set_default(s: Option<HistorySettings>) {
    *DEFAULT.lock().unwrap_or_else(|e| e.into_inner()) = s;
}

/// Whether the interpreter is shutting down (no stack is gathered any more).
pub fn is_finalizing() -> bool {
    FINALIZING.load(Ordering::Relaxed)
}

/// The interpreter is shutting down (the package's `atexit` hook): gather no more stacks.
pub fn stop_gathering() {
    FINALIZING.store(true, Ordering::Relaxed);
    for m in &STACK_MODE {
        m.store(STACKS_NONE, Ordering::Relaxed);
    }
}
