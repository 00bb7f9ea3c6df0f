//! # One pass of a [`Program`] over an engine
//!
//! [`run_once`] is the timed loop of every replay: each [`Op`] becomes one engine call, the
//! addresses live in slots, and nothing else happens. [`run_observed`] is the same loop with an
//! [`Observer`] told of each op, for reports that need more than the numbers (the stacks on the
//! allocator's history, the block each allocation got). The loop is one generic function, so
//! the reports and the measurements replay a trace by the same rules; [`run_once`] instantiates
//! it with [`Quiet`], whose calls are empty and inlined away, so the timed loop has none of it.
//!
//! Rules (those of the crate documentation): a `Malloc` that fails for lack of memory is counted
//! and its slot stays 0, so its `Free` is skipped; a deferred `Free` first records its block on
//! its private replay stream (simulated device, deferred frees on), which its `Complete`
//! completes; `EmptyCache` releases the cache. Any other device failure panics: a simulated
//! device has none, and a real one's is a broken machine, not a result.

use std::time::Instant;

use cudamem_alloc::{DeviceStats, Engine};
use cudamem_device::StreamId;

use crate::program::{Op, Program};
use crate::target::Target;

/// Replay streams for deferred frees live far above real stream handles.
pub const DEFERRED_STREAM_BASE: u64 = 0xdef0_0000_0000_0000;

/// What a pass tells its caller, op by op. Every method does nothing by default.
pub trait Observer {
    /// Before op `i` of the program runs.
    #[inline(always)]
    fn before(&mut self, _i: usize, _e: &mut Engine) {}
    /// After op `i`, a `Malloc`: the address, or `None` when it ran out of memory.
    #[inline(always)]
    fn after_malloc(&mut self, _i: usize, _e: &Engine, _ptr: Option<u64>) {}
}

/// The observer of the timed loop: hears nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quiet;

impl Observer for Quiet {}

/// Runs the program once; returns (elapsed ns, ooms, stats at the reserved peak if `capture`).
/// `slots` must have `p.slots` entries; allocations still live at the end stay in `slots`.
#[inline(never)] // one call per pass; a symbol of its own for profilers (callgrind --toggle-collect)
pub fn run_once(
    p: &Program,
    e: &mut Engine,
    target: &Target,
    slots: &mut [u64],
    capture: bool,
) -> (u64, u64, Option<DeviceStats>) {
    run_observed(p, e, target, slots, capture, &mut Quiet)
}

/// [`run_once`], telling `obs` of every op (see the documentation of `pass.rs`).
#[inline(always)]
pub fn run_observed<O: Observer>(
    p: &Program,
    e: &mut Engine,
    target: &Target,
    slots: &mut [u64],
    capture: bool,
    obs: &mut O,
) -> (u64, u64, Option<DeviceStats>) {
    slots.iter_mut().for_each(|s| *s = 0);
    let sim = match target {
        Target::Sim(s) if p.deferred_frees => Some(&**s),
        _ => None,
    };
    let mut ooms = 0;
    let mut peak: Option<DeviceStats> = None;
    let mut best = -1i64;
    let t = Instant::now();
    for (i, op) in p.ops.iter().enumerate() {
        obs.before(i, e);
        match *op {
            Op::Malloc {
                size,
                stream,
                slot,
                shrink,
            } => match e.malloc(size, target.stream(stream)) {
                Ok(ptr) => {
                    slots[slot as usize] = ptr;
                    if capture && e.stats().reserved_bytes.all().current > best {
                        best = e.stats().reserved_bytes.all().current;
                        peak = Some(e.stats());
                    }
                    obs.after_malloc(i, e, Some(ptr));
                }
                Err(err) if err.is_out_of_memory() && shrink => {
                    let ptr = malloc_halving(e, size / 2, target.stream(stream));
                    slots[slot as usize] = ptr.unwrap_or(0);
                    obs.after_malloc(i, e, ptr);
                }
                Err(err) if err.is_out_of_memory() => {
                    ooms += 1;
                    obs.after_malloc(i, e, None);
                }
                Err(err) => panic!("replay: device failure: {err}"),
            },
            Op::Free { slot, deferred } => {
                let ptr = std::mem::take(&mut slots[slot as usize]);
                if ptr == 0 {
                    continue; // its allocation failed (or was size 0)
                }
                if let (Some(s), Some(_)) = (deferred, sim) {
                    let _ = e.record_stream(ptr, StreamId(DEFERRED_STREAM_BASE + s as u64));
                }
                e.free(ptr).expect("replay frees only what it allocated");
            }
            Op::Complete { stream } => {
                if let Some(sim) = sim {
                    sim.complete_stream(StreamId(DEFERRED_STREAM_BASE + stream as u64));
                }
            }
            Op::EmptyCache => e.empty_cache().expect("empty_cache during replay"),
        }
    }
    (t.elapsed().as_nanos() as u64, ooms, peak)
}

/// The first of `size`, `size / 2`, ... bytes that `e` can allocate on `stream`; `None` when
/// not even one byte fits (the caller then goes without).
#[cold]
fn malloc_halving(e: &mut Engine, mut size: u64, stream: StreamId) -> Option<u64> {
    while size > 0 {
        match e.malloc(size, stream) {
            Ok(ptr) => return Some(ptr),
            Err(err) if err.is_out_of_memory() => size /= 2,
            Err(err) => panic!("replay: device failure: {err}"),
        }
    }
    None
}

/// Frees what a pass left live and completes the work still pending on the simulated device
/// (untimed), so that a warm pass starts like the first one. A trace can end before the
/// `free_completed` of a deferred free (a `record_stream`ed block whose stream had not caught
/// up); a real program's streams would catch up before its next iteration, so the block's
/// events are completed here, and the block is free for the next pass instead of waiting for
/// ever (each warm pass would otherwise find less free memory than the one before).
pub fn free_leftovers(e: &mut Engine, target: &Target, slots: &mut [u64]) {
    for s in slots.iter_mut() {
        if *s != 0 {
            let _ = e.free(std::mem::take(s));
        }
    }
    if let Target::Sim(sim) = target {
        sim.complete_all();
    }
    e.process_events();
}
