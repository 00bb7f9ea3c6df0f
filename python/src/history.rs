//! # Memory history with Python stacks, and snapshots as Python objects
//!
//! PyTorch's `torch.cuda.memory._record_memory_history(...)` / `_snapshot()` /
//! `_dump_snapshot()`, for cudamem's allocators:
//!
//! * [`set_history`] turns recording on or off on one device, or on every device — those that
//!   exist and those created later (`device=None`, PyTorch's meaning: its setting is global).
//!   The engine keeps the ring of entries ([`cudamem::History::record_memory_history`]).
//! * **Python stacks.** Each allocation made while recording with a context (`"state"`,
//!   `"alloc"` or `"all"`) carries the Python stack of the thread that allocates, innermost frame
//!   first, as PyTorch's `stacks="python"` does; with context `"all"` frees carry the stack of
//!   the thread that frees. Whether to gather is one relaxed atomic load per call
//!   ([`crate::recording::stack_mode`]), so with recording off (or without a context) the
//!   allocation path is unchanged.
//! * **Gathering** ([`gather_python_frames`]) happens *before* the device's allocator is
//!   locked, never under it, so a thread holding the GIL and waiting for the allocator lock can
//!   never deadlock with one holding that lock and waiting for the GIL. PyTorch calls the C
//!   alloc function with or without the GIL (autograd's engine threads have no Python thread
//!   state); the GIL is taken with `PyGILState_Ensure` (re-entrant when the thread holds it
//!   already), exactly as PyTorch's own `CapturedTraceback` gathering does. Nothing is gathered
//!   once the interpreter is finalizing (an `atexit` hook of the package clears every flag; the
//!   check of `Py_IsInitialized` covers the rest). A thread already waiting for the GIL when
//!   finalization starts is ended by CPython with `pthread_exit`; that forced unwind passes
//!   through cudamem's frames (no `catch_unwind` around the gathering, `extern "C-unwind"`
//!   entry points), as it passes through PyTorch's allocator, instead of aborting the process.
//!   A pending Python exception (an object freed while one propagates) is saved and restored
//!   around the walk. Code objects' names and files, and the line of each instruction offset,
//!   are cached (the cache holds a reference to each code object).
//! * [`snapshot_trace`] merges the allocators' snapshots (one device, or all of them as
//!   PyTorch's `_snapshot()` returns), and [`trace_to_py`] turns it into PyTorch's schema as
//!   Python objects with the pickle writer's own schema (`cudamem_trace::pickle`, through
//!   [`crate::pyser`]), sharing one list per recorded stack and one dict per distinct frame, as
//!   PyTorch's own snapshot does, so that `pickle.dump` writes each frame once.

use std::collections::HashMap;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use pyo3::{ffi, intern};

use cudamem::Allocator;
use cudamem_alloc::{AllocatorConfig, Frame};
use cudamem_trace::{AllocatorSettings, DeviceTrace, Trace};

use crate::recording::{self, HistorySettings};
use crate::registry;

/// The most frames kept of one stack (innermost first); deeper frames are dropped.
pub const MAX_FRAMES: usize = 256;

/// Applies `s` to `device`'s allocator (created if needed), or with `None` to every allocator,
/// existing or created later. `clear` empties the ring first (PyTorch's `clear_history`).
pub fn set_history(device: Option<i32>, s: HistorySettings, clear: bool) -> Result<(), registry::RegistryError> {
    // One setting at a time, so that a device's ring and its stack flag come from one call.
    static SETTING: Mutex<()> = Mutex::new(());
    let _one = SETTING.lock().unwrap_or_else(|e| e.into_inner());
    match device {
        Some(d) => {
            let a = registry::get_or_create(d)?;
            recording::apply(d, a, s, clear)?;
        }
        None => registry::with_creation_locked(|| {
            recording::set_default(if s.enabled { Some(s) } else { None });
            registry::existing().try_for_each(|(d, a)| recording::apply(d, a, s, clear))
        })?,
    }
    Ok(())
}

/// Whether any device records cudamem's own history.
pub fn any_recording() -> bool {
    registry::existing().any(|(d, _)| recording::is_recording(d))
}

/// The Python stack of the calling thread, innermost frame first, for a call from C (PyTorch's
/// alloc and free functions) that may or may not hold the GIL. `None` when the thread runs no
/// Python code (an autograd engine thread), or the interpreter is gone or going.
pub fn gather_python_frames() -> Option<Vec<Frame>> {
    if recording::is_finalizing() {
        return None;
    }
    // SAFETY: Py_IsInitialized may be called at any time, with or without the GIL.
    if unsafe { ffi::Py_IsInitialized() } == 0 {
        return None;
    }
    Python::with_gil(frames_of_current_thread)
}

/// The Python stack of the calling thread, which holds the GIL (see [`gather_python_frames`]).
pub fn frames_of_current_thread(py: Python<'_>) -> Option<Vec<Frame>> {
    // A pending exception (this may run while one propagates and frees objects) must survive
    // the attribute lookups below.
    let (mut ptype, mut pvalue, mut ptb) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the GIL is held; PyErr_Fetch moves the error indicator (possibly empty) into the
    // three owned references, which PyErr_Restore takes back below.
    #[allow(deprecated)]
    unsafe {
        ffi::PyErr_Fetch(&mut ptype, &mut pvalue, &mut ptb)
    };
    let frames = walk_frames(py);
    // SAFETY: the GIL is held; restores exactly what was fetched (and drops any error the walk
    // left, which there is none of: every lookup's error was taken into a PyErr and dropped).
    #[allow(deprecated)]
    unsafe {
        ffi::PyErr_Restore(ptype, pvalue, ptb)
    };
    frames.filter(|f| !f.is_empty())
}

/// A code object's name and file, and the line of each instruction offset seen, cached by the
/// code object's address. The entry holds a reference to the code object, so the address
/// cannot be reused while it is cached.
struct CodeInfo {
    _code: Py<PyAny>,
    name: Box<str>,
    filename: Box<str>,
    /// `f_lasti` -> line (computing a line from the line table is the costly part of a frame).
    lines: HashMap<i64, i64>,
}

/// Entries kept before the cache starts over (code objects made by `exec` in a loop would
/// otherwise make it grow without end).
const CODE_CACHE_MAX: usize = 65_536;

/// Only touched with the GIL held, and never locked across a call into Python (which could
/// free a tensor, whose free could gather a stack and lock it again).
static CODE_CACHE: Mutex<Option<HashMap<usize, CodeInfo>>> = Mutex::new(None);

fn code_cache() -> std::sync::MutexGuard<'static, Option<HashMap<usize, CodeInfo>>> {
    CODE_CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

fn py_str(obj: &Bound<'_, PyAny>) -> Option<Box<str>> {
    Some(obj.downcast::<PyString>().ok()?.to_cow().ok()?.into())
}

/// One frame: its code object's name and file (cached), and its line.
fn frame_info(py: Python<'_>, frame: &Bound<'_, PyAny>) -> Option<Frame> {
    let code = frame.getattr(intern!(py, "f_code")).ok()?;
    let lasti: Option<i64> = frame
        .getattr(intern!(py, "f_lasti"))
        .ok()
        .and_then(|v| v.extract().ok());
    let key = code.as_ptr() as usize;
    let mut cached_line = None;
    let known = {
        let guard = code_cache();
        guard.as_ref().and_then(|m| m.get(&key)).map(|c| {
            cached_line = lasti.and_then(|i| c.lines.get(&i).copied());
            (c.name.to_string(), c.filename.to_string())
        })
    };
    let line = match cached_line {
        Some(l) => l,
        // SAFETY: `frame` is a frame object and the GIL is held.
        None => i64::from(unsafe { ffi::PyFrame_GetLineNumber(frame.as_ptr().cast()) }),
    };
    let (name, filename) = match known {
        Some(k) => {
            if cached_line.is_none() {
                if let (Some(i), Some(c)) = (lasti, code_cache().as_mut().and_then(|m| m.get_mut(&key))) {
                    c.lines.insert(i, line);
                }
            }
            k
        }
        None => {
            let name = py_str(&code.getattr(intern!(py, "co_name")).ok()?)?;
            let filename = py_str(&code.getattr(intern!(py, "co_filename")).ok()?)?;
            let out = (name.to_string(), filename.to_string());
            let mut lines = HashMap::new();
            if let Some(i) = lasti {
                lines.insert(i, line);
            }
            let info = CodeInfo {
                _code: code.clone().unbind(),
                name,
                filename,
                lines,
            };
            let evicted = {
                let mut guard = code_cache();
                let map = guard.get_or_insert_with(HashMap::new);
                let evicted = if map.len() >= CODE_CACHE_MAX {
                    Some(std::mem::take(map))
                } else {
                    None
                };
                map.insert(key, info);
                evicted
            };
            drop(evicted); // outside the lock: dropping code objects may run Python code (weakrefs)
            out
        }
    };
    Some(Frame { name, filename, line })
}

fn walk_frames(py: Python<'_>) -> Option<Vec<Frame>> {
    // SAFETY: the GIL is held. PyEval_GetFrame returns a borrowed reference to the thread's
    // current frame, or NULL when it executes no Python code.
    let top = unsafe { ffi::PyEval_GetFrame() };
    if top.is_null() {
        return None;
    }
    // SAFETY: `top` is a valid, non-NULL borrowed reference (just checked); from_borrowed_ptr
    // takes a new strong reference.
    let mut frame: Bound<'_, PyAny> = unsafe { Bound::from_borrowed_ptr(py, top.cast::<ffi::PyObject>()) };
    let mut out = Vec::with_capacity(32);
    while out.len() < MAX_FRAMES {
        out.push(frame_info(py, &frame)?);
        let back = frame.getattr(intern!(py, "f_back")).ok()?;
        if back.is_none() {
            break;
        }
        frame = back;
    }
    Some(out)
}

// ---------------------------------------------------------------------------------------------
// Snapshots
// ---------------------------------------------------------------------------------------------

fn settings_of(cfg: &AllocatorConfig) -> AllocatorSettings {
    cudamem_alloc::snapshot::settings_of(cfg)
}

/// The snapshot of `device`, or of every allocator (`None`), as one trace: segments of all
/// devices in device order, one event list per device, stacks renumbered into one table,
/// annotations of all devices. A device without an allocator contributes an empty event list
/// (`Some(d)`) or nothing (`None`); with no allocator at all, the settings are those new
/// allocators would get.
pub fn snapshot_trace(device: Option<i32>) -> Result<Trace, registry::RegistryError> {
    let allocs: Vec<(i32, &'static Allocator)> = match device {
        Some(d) => {
            registry::slot_index(d)?;
            registry::get(d).map(|a| (d, a)).into_iter().collect()
        }
        None => registry::existing().collect(),
    };
    let mut out = Trace::new("cudamem snapshot");
    let mut have_settings = false;
    for (_, a) in allocs {
        let t = a.history()?.snapshot();
        let off = out.stacks.len() as u32;
        let re = |s: Option<u32>| s.map(|i| i + off);
        out.stacks.extend(t.stacks);
        for mut d in t.devices {
            for e in &mut d.events {
                e.stack = re(e.stack);
            }
            out.devices.push(d);
        }
        for mut s in t.segments {
            s.stack = re(s.stack);
            for b in &mut s.blocks {
                b.stack = re(b.stack);
            }
            out.segments.push(s);
        }
        out.annotations.extend(t.annotations);
        if !have_settings {
            out.settings = t.settings;
            have_settings = true;
        }
    }
    if let Some(d) = device {
        if out.devices.is_empty() {
            out.devices.push(DeviceTrace {
                device: d,
                events: Vec::new(),
            });
        }
    }
    if !have_settings {
        if let Ok((cfg, _)) = registry::effective_settings() {
            out.settings = settings_of(&cfg);
        }
    }
    out.devices.sort_by_key(|d| d.device);
    Ok(out)
}

/// `trace` in PyTorch's snapshot schema as Python objects: a dict with `segments`,
/// `device_traces`, `allocator_settings` and `external_annotations`, written by the same schema
/// as `cudamem_trace::write_snapshot_pickle` (so `pickle.loads` of that writer's output compares
/// equal), with one list per recorded stack and one dict per distinct frame (see
/// [`crate::pyser`]).
pub fn trace_to_py<'py>(py: Python<'py>, trace: &Trace) -> PyResult<Bound<'py, PyDict>> {
    let snapshot = crate::pyser::to_py(py, &cudamem_trace::pickle::snapshot_schema(trace))?;
    Ok(snapshot.downcast_into::<PyDict>()?)
}
