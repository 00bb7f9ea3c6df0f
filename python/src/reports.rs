//! # The reports of `cudamem-report`, for Python
//!
//! Thin bindings of [`cudamem_report`]: `summary`, `leaks`, `why` and `viz` over a trace given
//! as bytes (a snapshot pickle, plain or gzip'd, an RMM CSV log or a cudamem trace: the format
//! is read from the content). `cudamem/__init__.py` turns a snapshot dict or a path into those
//! bytes. Each report runs without the GIL; its errors are `ValueError`s naming the trace.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use cudamem_report::{leaks, summary, viz, viz_replay, why, At};
use cudamem_trace::Trace;

fn load(data: &[u8], source: &str) -> Result<Trace, String> {
    cudamem_trace::read_bytes(data, source).map_err(|e| e.to_string())
}

fn named(source: &str, e: String) -> String {
    if e.starts_with(source) {
        e
    } else {
        format!("{source}: {e}")
    }
}

/// `message` with the command line's flags (`--at`, `--config`) named as the Python arguments
/// they are here (`at`, `config`): a Python error names Python's argument.
pub(crate) fn python_names(message: String) -> String {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    ["--at", "--config"].into_iter().fold(message, |m, flag| {
        let mut out = String::with_capacity(m.len());
        let mut rest = m.as_str();
        while let Some(i) = rest.find(flag) {
            let end = i + flag.len();
            let whole = !rest[..i].ends_with(word) && !rest[end..].starts_with(word);
            out.push_str(&rest[..i]);
            out.push_str(if whole { &flag[2..] } else { flag });
            rest = &rest[end..];
        }
        out.push_str(rest);
        out
    })
}

fn json_text(v: serde_json::Value) -> Result<String, String> {
    serde_json::to_string(&v).map_err(|e| e.to_string())
}

/// `memory_summary()` tables at the end of the trace and at its reserved peak (text, or JSON
/// text with `as_json`).
#[pyfunction]
#[pyo3(signature = (data, source, as_json=false))]
pub fn _report_summary(py: Python<'_>, data: &[u8], source: &str, as_json: bool) -> PyResult<String> {
    py.allow_threads(|| {
        let t = load(data, source)?;
        let r = summary(&t).map_err(|e| named(source, e))?;
        if as_json {
            json_text(r.to_json())
        } else {
            Ok(r.to_string())
        }
    })
    .map_err(|e| PyValueError::new_err(python_names(e)))
}

/// What is still allocated at `at` (the end; an event index; `NAME`, `NAME@k`, `NAME@last` of
/// an annotation), grouped by allocating stack.
#[pyfunction]
#[pyo3(signature = (data, source, at=None, top=10, frames=12, as_json=false))]
pub fn _report_leaks(
    py: Python<'_>,
    data: &[u8],
    source: &str,
    at: Option<&str>,
    top: usize,
    frames: usize,
    as_json: bool,
) -> PyResult<String> {
    let at = at.map_or(At::End, At::parse);
    py.allow_threads(|| {
        let t = load(data, source)?;
        let r = leaks(&t, &at).map_err(|e| named(source, e))?;
        if as_json {
            json_text(r.to_json())
        } else {
            Ok(r.to_text(top, frames))
        }
    })
    .map_err(|e| PyValueError::new_err(python_names(e)))
}

/// Which reserved bytes `empty_cache()` would release, and which live blocks pin the rest.
#[pyfunction]
#[pyo3(signature = (data, source, top=10, blocks=5, frames=6, as_json=false))]
pub fn _report_why(
    py: Python<'_>,
    data: &[u8],
    source: &str,
    top: usize,
    blocks: usize,
    frames: usize,
    as_json: bool,
) -> PyResult<String> {
    py.allow_threads(|| {
        let t = load(data, source)?;
        let r = why(&t).map_err(|e| named(source, e))?;
        if as_json {
            json_text(r.to_json())
        } else {
            Ok(r.to_text(top, blocks, frames))
        }
    })
    .map_err(|e| PyValueError::new_err(python_names(e)))
}

/// The self-contained HTML viewer of the trace (or of its replay with `policy`).
#[pyfunction]
#[pyo3(signature = (data, source, title=None, policy=None, config=None))]
pub fn _report_viz(
    py: Python<'_>,
    data: &[u8],
    source: &str,
    title: Option<String>,
    policy: Option<String>,
    config: Option<String>,
) -> PyResult<String> {
    py.allow_threads(|| {
        let t = load(data, source)?;
        match policy {
            Some(p) => {
                let mut cfg = cudamem_alloc::AllocatorConfig::default();
                cudamem_alloc::policy::by_name(&p, &mut cfg).map_err(|e| format!("cudamem: {e}"))?;
                let title = title.unwrap_or_else(|| format!("{} replayed with {p}", t.source));
                viz_replay(&t, &p, config, &title).map_err(|e| named(source, e))
            }
            None => {
                if config.is_some() {
                    return Err("config= needs policy= (it configures the replay)".to_string());
                }
                let title = title.unwrap_or_else(|| t.source.clone());
                Ok(viz(&t, &title))
            }
        }
    })
    .map_err(|e| PyValueError::new_err(python_names(e)))
}

/// Registers the report functions in the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_report_summary, m)?)?;
    m.add_function(wrap_pyfunction!(_report_leaks, m)?)?;
    m.add_function(wrap_pyfunction!(_report_why, m)?)?;
    m.add_function(wrap_pyfunction!(_report_viz, m)?)?;
    Ok(())
}
