//! # Tags, sleep and wake, for Python
//!
//! `cudamem.tag`, `cudamem.sleep`, `cudamem.wake_up` and `cudamem.sleep_stats` (see
//! `cudamem/__init__.py`) over the engine's tags (`cudamem_alloc::engine` tags module: the
//! rules live there). A tag is an allocator's, not a thread's: `set_tag` with `device=None`
//! sets it on every allocator that exists, and on the current device's (created if needed).
//! Sleep and wake wait for the device, so they release the GIL.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use cudamem::SleepTags;

use crate::registry;

fn targets(device: Option<i32>) -> PyResult<Vec<SleepTags<'static>>> {
    let allocs: Vec<_> = match device {
        Some(d) => {
            crate::pyerr::check_device(d)?;
            vec![registry::get_or_create(d).map_err(|e| Python::with_gil(|py| crate::pyerr::reg_err(py, e)))?]
        }
        None => registry::existing().map(|(_, a)| a).collect(),
    };
    allocs
        .into_iter()
        .map(|a| {
            a.sleep_tags()
                .map_err(|e| Python::with_gil(|py| crate::pyerr::alloc_err(py, e)))
        })
        .collect()
}

/// Makes `tag` current (or none) on `device`, or on every existing allocator when None;
/// returns the tag current before (on the first of them).
#[pyfunction]
#[pyo3(signature = (tag, device=None))]
fn _set_tag(py: Python<'_>, tag: Option<&str>, device: Option<i32>) -> PyResult<Option<String>> {
    let mut before = None;
    for (i, a) in targets(device)?.into_iter().enumerate() {
        let b = a.set(tag).map_err(|e| crate::pyerr::alloc_err(py, e))?;
        if i == 0 {
            before = b;
        }
    }
    Ok(before)
}

/// Sleeps the tags named (all awake ones when empty) on `device`, or on every allocator.
#[pyfunction]
#[pyo3(signature = (tags, offload, device=None))]
fn _sleep(py: Python<'_>, tags: Vec<String>, offload: bool, device: Option<i32>) -> PyResult<()> {
    let names: Vec<&str> = tags.iter().map(String::as_str).collect();
    for a in targets(device)? {
        py.allow_threads(|| a.sleep(&names, offload))
            .map_err(|e| crate::pyerr::alloc_err(py, e))?;
    }
    Ok(())
}

/// Wakes the tags named (all asleep ones when empty) on `device`, or on every allocator.
#[pyfunction]
#[pyo3(signature = (tags, device=None))]
fn _wake(py: Python<'_>, tags: Vec<String>, device: Option<i32>) -> PyResult<()> {
    let names: Vec<&str> = tags.iter().map(String::as_str).collect();
    for a in targets(device)? {
        py.allow_threads(|| a.wake(&names))
            .map_err(|e| crate::pyerr::alloc_err(py, e))?;
    }
    Ok(())
}

/// The sleep counters and every tag's state of `device`'s allocator (zeros if it has none).
#[pyfunction]
fn _sleep_stats(py: Python<'_>, device: i32) -> PyResult<Py<PyDict>> {
    crate::pyerr::check_device(device)?;
    let d = PyDict::new(py);
    let Some(a) = registry::get(device) else {
        return Ok(d.unbind());
    };
    let a = a.sleep_tags().map_err(|e| crate::pyerr::alloc_err(py, e))?;
    let s = a.stats();
    d.set_item("sleeping_bytes", s.sleeping_bytes)?;
    d.set_item("peak_sleeping_bytes", s.peak_sleeping_bytes)?;
    d.set_item("offloaded_bytes", s.offloaded_bytes)?;
    d.set_item("sleeping_allocated_bytes", s.sleeping_allocated_bytes)?;
    d.set_item("sleeping_tags", s.sleeping_tags)?;
    d.set_item("num_sleeps", s.num_sleeps)?;
    d.set_item("num_wakes", s.num_wakes)?;
    let tags = PyDict::new(py);
    for t in a.list() {
        let e = PyDict::new(py);
        e.set_item("asleep", t.asleep)?;
        e.set_item("allocated_bytes", t.allocated_bytes)?;
        e.set_item("reserved_bytes", t.reserved_bytes)?;
        e.set_item("sleeping_bytes", t.sleeping_bytes)?;
        e.set_item("offloaded_bytes", t.offloaded_bytes)?;
        tags.set_item(t.name, e)?;
    }
    d.set_item("tags", tags)?;
    Ok(d.unbind())
}

/// Adds this module's functions to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_set_tag, m)?)?;
    m.add_function(wrap_pyfunction!(_sleep, m)?)?;
    m.add_function(wrap_pyfunction!(_wake, m)?)?;
    m.add_function(wrap_pyfunction!(_sleep_stats, m)?)?;
    Ok(())
}
