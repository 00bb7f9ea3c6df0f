//! # `cudamem._cudamem`: the native half of the Python package `cudamem`
//!
//! One shared library carries three interfaces to the same process-global allocators:
//!
//! * **Python functions** (pyo3, this file), wrapped by `cudamem/__init__.py` which resolves
//!   `device=None` the way PyTorch does and builds the `OrderedDict` of `memory_stats()`;
//! * **a C ABI** ([`ffi`]): `cudamem_malloc`, `cudamem_free`, `cudamem_empty_cache`,
//!   `cudamem_set_memory_fraction`, `cudamem_record_stream`, `cudamem_malloc_or_error`, ...,
//!   which PyTorch's `CUDAPluggableAllocator` (directly, or through the C++ shim that
//!   `cudamem.torch.install()` compiles) calls for every CUDA tensor;
//! * **the native class's function table** ([`native`]), through which the C++ allocator class
//!   that `cudamem.torch.install()` compiles reaches the engine.
//!
//! All three allocate and free through the same two bodies ([`entry`]), under the same panic
//! guard ([`guard`]); the C side's declarations are generated from [`abi`]. Python exceptions
//! come from one mapping (`pyerr`). Modules depend on each other without cycles: the leaves are
//! [`abi`], [`recording`] (each device's history flags) and the reports.
//!
//! Memory history and snapshots ([`history`]: `record_memory_history`, `snapshot`, `annotate`)
//! and the reports of `cudamem-report` (`_report_*`) are Python functions too.
//!
//! Both reach the allocators of [`registry`]: one `cudamem::Allocator` per device ordinal, created
//! on first use (a CUDA device, or a simulated one with `CUDAMEM_DEVICE=sim`). So a tensor that
//! PyTorch allocated through the C ABI shows up in `cudamem.memory_allocated()`, and
//! `cudamem.empty_cache()` releases what PyTorch's frees left cached.
//!
//! ## Errors seen from Python
//!
//! | cause | exception |
//! |---|---|
//! | out of memory | `cudamem.OutOfMemoryError` (a `RuntimeError`; also a `torch.OutOfMemoryError` when torch is imported), with PyTorch's message and cudamem's diagnosis |
//! | argument of the wrong type (size, pointer, stream, fraction) | `TypeError` naming the argument and the type given |
//! | bad argument value (size, device, pointer, fraction) | `ValueError` naming the argument |
//! | bad configuration string, policy or `CUDAMEM_DEVICE` | `ValueError` with the parser's text |
//! | settings changed after first use | `RuntimeError` |
//! | device failure (no driver, CUDA error) | `RuntimeError` |
//!
//! Long calls (malloc, free, empty_cache) release the GIL, so PyTorch threads allocating through
//! the C ABI are never blocked behind the interpreter.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod entry;
mod estimate;
pub mod ffi;
pub mod guard;
pub mod history;
pub mod ipc;
pub mod native;
mod native_pools;
mod native_snapshot;
pub mod pool_allocator;
mod pyerr;
mod pyser;
pub mod recording;
pub mod registry;
mod reports;
mod sleep;
mod stats;
pub mod trackers;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt};

use cudamem_alloc::RecordContext;
use cudamem_device::StreamId;

use pyerr::{alloc_err, allocator, arg_u64, c_err, check_device, reg_err};

/// Allocates `size` bytes on `device` for use on `stream` (a raw `cudaStream_t` value; 0 is the
/// default stream) and returns the device address (0 for size 0).
#[pyfunction]
#[pyo3(signature = (size, device=0, stream=None))]
fn malloc(py: Python<'_>, size: &Bound<'_, PyAny>, device: i32, stream: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
    let size = arg_u64(size, "size")?;
    let stream = match stream {
        Some(s) => arg_u64(s, "stream")?,
        None => 0,
    };
    allocator(py, device)?;
    // With history and stacks on (after allocator(): a new one gets the setting of
    // device=None), the caller's Python stack, gathered with the GIL this call holds.
    let frames = if recording::stack_mode(device) != recording::STACKS_NONE {
        history::frames_of_current_thread(py)
    } else {
        None
    };
    let stack = entry::StackSource::Given(frames);
    py.allow_threads(|| entry::malloc(device, size, StreamId(stream), None, stack, None))
        .map_err(|e| c_err(py, e))
}

/// Frees an address returned by `malloc` on `device`.
#[pyfunction]
#[pyo3(signature = (ptr, device=0))]
fn free(py: Python<'_>, ptr: &Bound<'_, PyAny>, device: i32) -> PyResult<()> {
    let ptr = arg_u64(ptr, "ptr")?;
    check_device(device)?;
    let frames = if recording::stack_mode(device) == recording::STACKS_ALL {
        history::frames_of_current_thread(py)
    } else {
        None
    };
    let stack = entry::StackSource::Given(frames);
    py.allow_threads(|| entry::free(ptr, entry::Owner::Device(device), stack, None))
        .map(|_| ())
        .map_err(|e| c_err(py, e))
}

/// Marks the allocation at `ptr` as used on `stream` too (PyTorch's `record_stream`).
#[pyfunction]
#[pyo3(signature = (ptr, stream, device=0))]
fn record_stream(py: Python<'_>, ptr: &Bound<'_, PyAny>, stream: &Bound<'_, PyAny>, device: i32) -> PyResult<()> {
    let ptr = arg_u64(ptr, "ptr")?;
    let stream = arg_u64(stream, "stream")?;
    check_device(device)?;
    match registry::get(device) {
        Some(a) => a
            .raw()
            .and_then(|r| r.record_stream(ptr, StreamId(stream)))
            .map_err(|e| alloc_err(py, entry::on_device(e, device))),
        None => Err(PyValueError::new_err(format!(
            "invalid device pointer: {ptr:#x} (cudamem has no allocator on device {device})"
        ))),
    }
}

/// Returns unused cached memory to the device: of `device`, or of every device when None.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn empty_cache(py: Python<'_>, device: Option<i32>) -> PyResult<()> {
    let targets: Vec<_> = match device {
        Some(d) => {
            check_device(d)?;
            registry::get(d).into_iter().collect()
        }
        None => registry::existing().map(|(_, a)| a).collect(),
    };
    for a in targets {
        py.allow_threads(|| a.empty_cache())
            .map_err(|e| alloc_err(py, guard::api_error(e)))?;
    }
    Ok(())
}

/// Limits the allocator of `device` to `fraction` of the device's memory.
#[pyfunction]
#[pyo3(signature = (fraction, device=0))]
fn set_per_process_memory_fraction(py: Python<'_>, fraction: &Bound<'_, PyAny>, device: i32) -> PyResult<()> {
    if !(fraction.is_instance_of::<PyFloat>() || fraction.is_instance_of::<PyInt>())
        || fraction.is_instance_of::<PyBool>()
    {
        let got = fraction.get_type().name()?;
        return Err(PyTypeError::new_err(format!("fraction must be a float, got {got}")));
    }
    let f = fraction.extract::<f64>().ok();
    let Some(f) = f.filter(|f| (0.0..=1.0).contains(f)) else {
        return Err(PyValueError::new_err(format!(
            "fraction must be a float in [0, 1], got {}",
            fraction.repr()?
        )));
    };
    allocator(py, device)?
        .set_per_process_memory_fraction(f)
        .map_err(|e| alloc_err(py, guard::api_error(e)))
}

/// Sets the policy (`cudamem`, `pytorch`, `pytorch-expandable`) and/or the configuration string
/// (`PYTORCH_CUDA_ALLOC_CONF` syntax) of the allocators still to be created. Bad values raise
/// ValueError; changing them after the first allocation raises RuntimeError.
#[pyfunction]
#[pyo3(signature = (policy=None, config=None))]
fn configure(py: Python<'_>, policy: Option<&str>, config: Option<&str>) -> PyResult<()> {
    registry::configure(policy, config).map_err(|e| reg_err(py, e))
}

/// Applies a `PYTORCH_CUDA_ALLOC_CONF`-style string at run time to every allocator, existing
/// and to come (torch's `_set_allocator_settings`). A bad string raises ValueError and changes
/// nothing.
#[pyfunction]
fn set_allocator_settings(py: Python<'_>, settings: &str) -> PyResult<()> {
    registry::set_settings_everywhere(settings).map_err(|e| reg_err(py, e))
}

/// Sets the callable that returns the exception class raised for out-of-memory.
#[pyfunction]
fn _set_oom_class_factory(factory: Py<PyAny>) {
    pyerr::set_oom_class_factory(factory);
}

/// Sets how the C function `cudamem_malloc` reports failures (0 print + NULL, 1 throw, 2 abort)
/// and returns the previous mode.
#[pyfunction]
fn set_error_mode(mode: i32) -> PyResult<i32> {
    match ffi::cudamem_set_error_mode(mode) {
        -1 => Err(PyValueError::new_err(format!("mode must be 0, 1 or 2, got {mode}"))),
        prev => Ok(prev),
    }
}

/// Sets the function (an address) that `cudamem_malloc` calls to throw in error mode 1: it must
/// have the signature of `c10::detail::torchCheckFail(const char*, const char*, uint32_t, const
/// char*)` and stay loaded. 0 removes it.
#[pyfunction]
fn _set_error_thrower(address: u64) {
    // SAFETY: the contract is documented for the (private) caller, cudamem.torch, which passes
    // the address of c10::detail::torchCheckFail from the loaded libc10.
    unsafe { ffi::cudamem_set_error_thrower(address as usize as *const std::ffi::c_void) }
}

/// The calling thread's last C-ABI error: (kind, message).
#[pyfunction]
fn last_error() -> (i32, String) {
    guard::last_error()
}

/// How many frees through the C ABI named a pointer cudamem did not hand out.
#[pyfunction]
fn unknown_frees() -> u64 {
    ffi::cudamem_unknown_frees()
}

// ---------------------------------------------------------------------------------------------
// Memory history and snapshots (torch.cuda.memory._record_memory_history, _snapshot, ...)
// ---------------------------------------------------------------------------------------------

/// Starts or stops recording the memory history of `device` (None: every device, existing and
/// created later), with PyTorch's arguments: `enabled` "all" | "state" | None (off), `context`
/// "all" | "alloc" | "state" | None, `stacks` "python" | "all" (both record Python frames; C++
/// frames are not gathered), `max_entries` (the ring size; forced to 1 unless enabled is
/// "all"), `clear_history` (empty the ring first).
#[pyfunction]
#[pyo3(signature = (enabled=Some("all"), context=Some("all"), stacks="python", max_entries=None, device=None, clear_history=false))]
fn record_memory_history(
    py: Python<'_>,
    enabled: Option<&str>,
    context: Option<&str>,
    stacks: &str,
    max_entries: Option<&Bound<'_, PyAny>>,
    device: Option<i32>,
    clear_history: bool,
) -> PyResult<()> {
    if let Some(e) = enabled {
        if e != "all" && e != "state" {
            return Err(PyValueError::new_err(format!(
                "enabled must be 'all', 'state' or None, got {e:?}"
            )));
        }
    }
    let context = match context {
        None => RecordContext::Never,
        Some("state") => RecordContext::State,
        Some("alloc") => RecordContext::Alloc,
        Some("all") => RecordContext::All,
        Some(c) => {
            return Err(PyValueError::new_err(format!(
                "context must be 'all', 'alloc', 'state' or None, got {c:?}"
            )))
        }
    };
    if stacks != "python" && stacks != "all" {
        return Err(PyValueError::new_err(format!(
            "stacks must be 'python' or 'all', got {stacks:?}"
        )));
    }
    let max_entries = match max_entries {
        Some(m) => usize::try_from(arg_u64(m, "max_entries")?).unwrap_or(usize::MAX),
        None => usize::MAX,
    };
    if let Some(d) = device {
        check_device(d)?;
    }
    let settings = recording::HistorySettings {
        enabled: enabled.is_some(),
        context: if enabled.is_some() {
            context
        } else {
            RecordContext::Never
        },
        // PyTorch (memory_snapshot.cpp): max_entries is forced to 1 unless enabled == "all".
        max_entries: if enabled == Some("all") { max_entries.max(1) } else { 1 },
    };
    history::set_history(device, settings, clear_history).map_err(|e| reg_err(py, e))
}

/// `_snapshot()`: the state and history of `device` (None: every device) in PyTorch's schema,
/// as a dict.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn snapshot(py: Python<'_>, device: Option<i32>) -> PyResult<Bound<'_, PyDict>> {
    let t = py
        .allow_threads(|| history::snapshot_trace(device))
        .map_err(|e| reg_err(py, e))?;
    history::trace_to_py(py, &t)
}

fn pickle_of(t: &cudamem_trace::Trace) -> PyResult<Vec<u8>> {
    let mut out = Vec::new();
    cudamem_trace::write_snapshot_pickle(t, &mut out).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    Ok(out)
}

/// The snapshot as pickle bytes written by cudamem's Rust writer (`pickle.loads` gives what
/// `snapshot()` returns, frames unshared).
#[pyfunction]
#[pyo3(signature = (device=None))]
fn _snapshot_pickle(py: Python<'_>, device: Option<i32>) -> PyResult<Py<PyBytes>> {
    let t = py
        .allow_threads(|| history::snapshot_trace(device))
        .map_err(|e| reg_err(py, e))?;
    let bytes = py.allow_threads(|| pickle_of(&t))?;
    Ok(PyBytes::new(py, &bytes).unbind())
}

/// Reads a trace (snapshot pickle, gzip'd or not, RMM CSV, cudamem trace) with cudamem's Rust
/// reader and writes it back as a snapshot pickle (for tests of the reader and the writer).
#[pyfunction]
#[pyo3(signature = (data, source="<bytes>"))]
fn _trace_roundtrip(py: Python<'_>, data: &[u8], source: &str) -> PyResult<Py<PyBytes>> {
    let bytes = py.allow_threads(|| {
        let t = cudamem_trace::read_bytes(data, source).map_err(|e| PyValueError::new_err(e.to_string()))?;
        pickle_of(&t)
    })?;
    Ok(PyBytes::new(py, &bytes).unbind())
}

/// Records an annotation (`stage` "START" or "END" of the region `name`) in the history of
/// `device` (None: every device), when it records.
#[pyfunction]
#[pyo3(signature = (name, stage="START", device=None))]
fn annotate(name: &str, stage: &str, device: Option<i32>) -> PyResult<()> {
    match device {
        Some(d) => {
            check_device(d)?;
            if let Some(h) = registry::get(d).and_then(|a| a.history().ok()) {
                h.annotate(stage, name);
            }
        }
        None => {
            for h in registry::existing().filter_map(|(_, a)| a.history().ok()) {
                h.annotate(stage, name);
            }
        }
    }
    Ok(())
}

/// Whether allocations on `device` gather Python stacks: 0 no, 1 allocations, 2 allocations
/// and frees.
#[pyfunction]
fn _stack_mode(device: i32) -> u8 {
    recording::stack_mode(device)
}

/// The calling thread's Python stack as cudamem records it: [(name, filename, line)], innermost
/// first.
#[pyfunction]
fn _python_frames(py: Python<'_>) -> Vec<(String, String, i64)> {
    history::frames_of_current_thread(py)
        .unwrap_or_default()
        .into_iter()
        .map(|f| (f.name, f.filename, f.line))
        .collect()
}

/// Whether any device records cudamem's own history (`record_memory_history`).
#[pyfunction]
fn _recording() -> bool {
    history::any_recording()
}

/// Called at interpreter exit (atexit): stop gathering Python stacks.
#[pyfunction]
fn _at_exit() {
    recording::stop_gathering();
}

#[pymodule]
fn _cudamem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MAX_DEVICES", registry::MAX_DEVICES)?;
    m.add("ERR_NONE", guard::ERR_NONE)?;
    m.add("ERR_OOM", guard::ERR_OOM)?;
    m.add("ERR_INVALID", guard::ERR_INVALID)?;
    m.add("ERR_DEVICE", guard::ERR_DEVICE)?;
    m.add("ERR_INTERNAL", guard::ERR_INTERNAL)?;
    m.add("MODE_RETURN_NULL", ffi::MODE_RETURN_NULL)?;
    m.add("MODE_THROW", ffi::MODE_THROW)?;
    m.add("MODE_ABORT", ffi::MODE_ABORT)?;
    m.add_function(wrap_pyfunction!(malloc, m)?)?;
    m.add_function(wrap_pyfunction!(set_allocator_settings, m)?)?;
    sleep::register(m)?;
    m.add_function(wrap_pyfunction!(free, m)?)?;
    m.add_function(wrap_pyfunction!(record_stream, m)?)?;
    m.add_function(wrap_pyfunction!(stats::memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(stats::memory_allocated, m)?)?;
    m.add_function(wrap_pyfunction!(stats::max_memory_allocated, m)?)?;
    m.add_function(wrap_pyfunction!(stats::memory_reserved, m)?)?;
    m.add_function(wrap_pyfunction!(stats::max_memory_reserved, m)?)?;
    m.add_function(wrap_pyfunction!(stats::memory_summary, m)?)?;
    m.add_function(wrap_pyfunction!(stats::reset_peak_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(stats::reset_accumulated_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(stats::mem_get_info, m)?)?;
    m.add_function(wrap_pyfunction!(set_per_process_memory_fraction, m)?)?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(stats::info, m)?)?;
    m.add_function(wrap_pyfunction!(_set_oom_class_factory, m)?)?;
    m.add_function(wrap_pyfunction!(set_error_mode, m)?)?;
    m.add_function(wrap_pyfunction!(_set_error_thrower, m)?)?;
    m.add_function(wrap_pyfunction!(last_error, m)?)?;
    m.add_function(wrap_pyfunction!(unknown_frees, m)?)?;
    m.add_function(wrap_pyfunction!(record_memory_history, m)?)?;
    m.add_function(wrap_pyfunction!(snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(_snapshot_pickle, m)?)?;
    m.add_function(wrap_pyfunction!(_trace_roundtrip, m)?)?;
    m.add_function(wrap_pyfunction!(annotate, m)?)?;
    m.add_function(wrap_pyfunction!(_stack_mode, m)?)?;
    m.add_function(wrap_pyfunction!(_python_frames, m)?)?;
    m.add_function(wrap_pyfunction!(_at_exit, m)?)?;
    m.add_function(wrap_pyfunction!(_recording, m)?)?;
    m.add("MAX_FRAMES", history::MAX_FRAMES)?;
    reports::register(m)?;
    estimate::register(m)?;
    Ok(())
}
