//! `cudamem._cudamem._estimate_*`: the scaling prediction and the multi-policy replay of
//! `cudamem-estimate`, for `cudamem/estimate.py`. Traces come in as bytes (any format the trace
//! readers recognise) and answers go out as JSON text; the GIL is released while replaying.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use cudamem_estimate::{gpu_capacity, replay_report, scale_report, ScaleRequest, LIKELY_SHARE, ORDERS};

fn traces(data: Vec<(Vec<u8>, String)>) -> PyResult<Vec<cudamem_trace::Trace>> {
    data.iter()
        .map(|(b, s)| cudamem_trace::read_bytes(b, s).map_err(|e| PyValueError::new_err(e.to_string())))
        .collect()
}

/// Bytes of a capacity given as a size string, a GPU name (`h100-80gb`) or a number of bytes.
#[pyfunction]
fn _estimate_capacity(capacity: &str) -> PyResult<u64> {
    gpu_capacity(capacity).map_err(PyValueError::new_err)
}

/// `cudamem scale --json` on traces given as [(bytes, name)].
#[pyfunction]
#[pyo3(signature = (data, batches, at, capacity, policies, config, degree, limit))]
#[allow(clippy::too_many_arguments)]
fn _estimate_scale(
    py: Python<'_>,
    data: Vec<(Vec<u8>, String)>,
    batches: Vec<u64>,
    at: Option<u64>,
    capacity: Option<u64>,
    policies: Vec<String>,
    config: Option<String>,
    degree: usize,
    limit: u64,
) -> PyResult<String> {
    let ts = traces(data)?;
    let r = ScaleRequest {
        batches,
        at,
        capacity,
        policies,
        config,
        degree,
        limit,
    };
    let v = py
        .allow_threads(|| scale_report(&ts, &r))
        .map_err(|e| PyValueError::new_err(crate::reports::python_names(e)))?;
    Ok(v.to_string())
}

/// The trace (bytes, name) replayed with each policy on a simulated GPU of `capacity` bytes;
/// with `orders` > 0 also in that many shuffled segment orders.
#[pyfunction]
#[pyo3(signature = (data, source, policies, capacity, config=None, orders=0))]
fn _estimate_replay(
    py: Python<'_>,
    data: Vec<u8>,
    source: String,
    policies: Vec<String>,
    capacity: u64,
    config: Option<String>,
    orders: u32,
) -> PyResult<String> {
    let t = traces(vec![(data, source)])?.remove(0);
    let v = py
        .allow_threads(|| replay_report(&t, &policies, capacity, config, orders))
        .map_err(|e| PyValueError::new_err(crate::reports::python_names(e)))?;
    Ok(v.to_string())
}

/// The shuffled segment orders an estimate replays in, and the share it must fit in.
#[pyfunction]
fn _estimate_orders() -> (u32, f64) {
    (ORDERS, LIKELY_SHARE)
}

/// Adds the functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_estimate_capacity, m)?)?;
    m.add_function(wrap_pyfunction!(_estimate_scale, m)?)?;
    m.add_function(wrap_pyfunction!(_estimate_replay, m)?)?;
    m.add_function(wrap_pyfunction!(_estimate_orders, m)?)?;
    Ok(())
}
