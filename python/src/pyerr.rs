//! # Python exceptions and arguments of the extension module
//!
//! The one mapping from cudamem's errors to Python exceptions (the table in the crate's
//! documentation): out of memory is the class `cudamem/__init__.py` names (a `RuntimeError`, and
//! a `torch.OutOfMemoryError` when torch is imported), a bad argument or setting a `ValueError`,
//! a device failure or a setting changed too late a `RuntimeError`. And the checks of the
//! arguments every function shares (device ordinals, non-negative integers), which name the
//! argument and what was given.

use std::sync::Mutex;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyType};

use cudamem_alloc::AllocError;

use crate::guard::{CError, ERR_INVALID, ERR_OOM};
use crate::registry::{self, RegistryError};

/// A Python callable returning the class to raise for out-of-memory (set by `cudamem/__init__.py`).
static OOM_CLASS_FACTORY: Mutex<Option<Py<PyAny>>> = Mutex::new(None);

/// `message` as the out-of-memory class the factory names (a `RuntimeError` without one).
fn oom_error(py: Python<'_>, message: String) -> PyErr {
    let factory = OOM_CLASS_FACTORY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|f| f.clone_ref(py));
    if let Some(f) = factory {
        if let Ok(cls) = f.call0(py) {
            if let Ok(ty) = cls.into_bound(py).downcast_into::<PyType>() {
                return PyErr::from_type(ty, message);
            }
        }
    }
    PyRuntimeError::new_err(message)
}

/// The Python exception for an allocator error.
pub(crate) fn alloc_err(py: Python<'_>, e: AllocError) -> PyErr {
    match e {
        AllocError::OutOfMemory(_) => oom_error(py, e.to_string()),
        AllocError::InvalidPointer { .. } | AllocError::InvalidArgument(_) | AllocError::Config(_) => {
            PyValueError::new_err(e.to_string())
        }
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

/// The Python exception for a registry error.
pub(crate) fn reg_err(py: Python<'_>, e: RegistryError) -> PyErr {
    match e {
        RegistryError::Alloc(a) => alloc_err(py, a),
        RegistryError::BadDevice(m) | RegistryError::BadSetting(m) => PyValueError::new_err(m),
        RegistryError::InUse(m) => PyRuntimeError::new_err(m),
        e @ RegistryError::Device(_) => PyRuntimeError::new_err(e.to_string()),
    }
}

/// The Python exception for an error of the shared bodies ([`crate::entry`]).
pub(crate) fn c_err(py: Python<'_>, e: CError) -> PyErr {
    match e.kind {
        ERR_OOM => oom_error(py, e.message),
        ERR_INVALID => PyValueError::new_err(e.message),
        _ => PyRuntimeError::new_err(e.message),
    }
}

/// A non-negative integer argument: TypeError naming it and the type given when it is not an
/// int (bool is not; an object with `__index__` is), ValueError when outside [0, 2**64).
pub(crate) fn arg_u64(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    let int = if obj.is_instance_of::<PyBool>() {
        None
    } else if obj.is_instance_of::<PyInt>() {
        Some(obj.clone())
    } else {
        obj.call_method0("__index__")
            .ok()
            .filter(|v| v.is_instance_of::<PyInt>())
    };
    let Some(int) = int else {
        let got = obj.get_type().name()?;
        return Err(PyTypeError::new_err(format!("{name} must be an int, got {got}")));
    };
    int.extract::<u64>()
        .map_err(|_| PyValueError::new_err(format!("{name} must be an int in [0, 2**64), got {int}")))
}

/// The allocator of `device` (created on first use), or the Python exception.
pub(crate) fn allocator(py: Python<'_>, device: i32) -> PyResult<&'static cudamem::Allocator> {
    registry::get_or_create(device).map_err(|e| reg_err(py, e))
}

/// Checks the ordinal without creating an allocator.
pub(crate) fn check_device(device: i32) -> PyResult<()> {
    registry::slot_index(device)
        .map(|_| ())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Sets the callable that returns the class raised for out-of-memory.
pub(crate) fn set_oom_class_factory(factory: Py<PyAny>) {
    *OOM_CLASS_FACTORY.lock().unwrap_or_else(|e| e.into_inner()) = Some(factory);
}
