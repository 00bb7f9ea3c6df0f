//! The statistics and queries of the Python module: `memory_stats()` (PyTorch's 122 keys),
//! `memory_allocated` and the other single statistics, `memory_summary`, the resets of peaks
//! and accumulated counters, `mem_get_info`, and `info` (what cudamem runs on). They are
//! registered by `_cudamem` in lib.rs.
//!
//! Guarantees: the statistics of a device not used yet are all zero and reading them opens no
//! device; a bad ordinal is a `ValueError`.

use std::collections::BTreeMap;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use cudamem_alloc::StatsDict;

use crate::pyerr::{alloc_err, allocator, check_device};
use crate::{ffi, registry};

/// The stats of `device`; all zero (and no device opened) before its first use.
fn stats_dict(device: i32) -> PyResult<StatsDict> {
    check_device(device)?;
    Ok(match registry::get(device) {
        Some(a) => a.memory_stats(),
        None => {
            let mut d = cudamem_alloc::summary::zeroed_stats();
            let max_split = registry::effective_settings()
                .map(|(c, _)| c.max_split_size)
                .unwrap_or(u64::MAX);
            d.insert(
                "max_split_size".into(),
                if max_split == u64::MAX { -1 } else { max_split as i64 },
            );
            d
        }
    })
}

/// `memory_stats()`: the 122 statistics of PyTorch (a plain dict; the Python wrapper sorts it).
#[pyfunction]
#[pyo3(signature = (device=0))]
pub(crate) fn memory_stats(device: i32) -> PyResult<BTreeMap<String, i64>> {
    stats_dict(device)
}

fn stat(device: i32, key: &str) -> PyResult<i64> {
    Ok(stats_dict(device)?.get(key).copied().unwrap_or(0))
}

/// Bytes allocated to callers (rounded sizes).
#[pyfunction]
#[pyo3(signature = (device=0))]
pub(crate) fn memory_allocated(device: i32) -> PyResult<i64> {
    stat(device, "allocated_bytes.all.current")
}

/// Peak of `memory_allocated`.
#[pyfunction]
#[pyo3(signature = (device=0))]
pub(crate) fn max_memory_allocated(device: i32) -> PyResult<i64> {
    stat(device, "allocated_bytes.all.peak")
}

/// Bytes held from the device.
#[pyfunction]
#[pyo3(signature = (device=0))]
pub(crate) fn memory_reserved(device: i32) -> PyResult<i64> {
    stat(device, "reserved_bytes.all.current")
}

/// Peak of `memory_reserved`.
#[pyfunction]
#[pyo3(signature = (device=0))]
pub(crate) fn max_memory_reserved(device: i32) -> PyResult<i64> {
    stat(device, "reserved_bytes.all.peak")
}

/// PyTorch's `memory_summary()` table.
#[pyfunction]
#[pyo3(signature = (device=0, abbreviated=false))]
pub(crate) fn memory_summary(device: i32, abbreviated: bool) -> PyResult<String> {
    check_device(device)?;
    Ok(match registry::get(device) {
        Some(a) => a.memory_summary(abbreviated),
        None => cudamem_alloc::summary::memory_summary(&stats_dict(device)?, device, abbreviated),
    })
}

/// Sets every peak to its current value.
#[pyfunction]
#[pyo3(signature = (device=0))]
pub(crate) fn reset_peak_memory_stats(device: i32) -> PyResult<()> {
    check_device(device)?;
    if let Some(a) = registry::get(device) {
        a.reset_peak_memory_stats();
    }
    Ok(())
}

/// Zeroes the accumulated counters (allocated/freed totals, retries, OOMs, ...).
#[pyfunction]
#[pyo3(signature = (device=0))]
pub(crate) fn reset_accumulated_memory_stats(device: i32) -> PyResult<()> {
    check_device(device)?;
    if let Some(a) = registry::get(device) {
        a.reset_accumulated_memory_stats();
    }
    Ok(())
}

/// `(free, total)` bytes of the device, as `cudaMemGetInfo` reports them.
#[pyfunction]
#[pyo3(signature = (device=0))]
pub(crate) fn mem_get_info(py: Python<'_>, device: i32) -> PyResult<(u64, u64)> {
    allocator(py, device)?
        .mem_get_info()
        .map_err(|e| alloc_err(py, crate::guard::api_error(e)))
}

/// What cudamem runs on: device kind, policy and configuration for new allocators, and the
/// allocators that exist (ordinal -> {device, policy, config}).
#[pyfunction]
pub(crate) fn info(py: Python<'_>) -> PyResult<Py<PyDict>> {
    let d = PyDict::new(py);
    match registry::device_kind() {
        Ok(registry::DeviceKind::Cuda) => d.set_item("device_kind", "cuda")?,
        Ok(registry::DeviceKind::Sim(n)) => {
            d.set_item("device_kind", "sim")?;
            d.set_item("sim_capacity", n)?;
        }
        Err(e) => d.set_item("device_kind", format!("invalid: {e}"))?,
    }
    match registry::effective_settings() {
        Ok((c, p)) => {
            d.set_item("policy", p)?;
            d.set_item("config", c.settings)?;
        }
        Err(e) => d.set_item("settings_error", e.to_string())?,
    }
    let devs = PyDict::new(py);
    for (i, a) in registry::existing() {
        let e = PyDict::new(py);
        e.set_item("device", a.device().name())?;
        e.set_item(
            "policy",
            registry::policy_of(i).map_or_else(|| a.policy_name(), str::to_string),
        )?;
        e.set_item("config", a.config().settings)?;
        devs.set_item(i, e)?;
    }
    d.set_item("allocators", devs)?;
    d.set_item("error_mode", ffi::error_mode())?;
    d.set_item("unknown_frees", ffi::cudamem_unknown_frees())?;
    Ok(d.unbind())
}
