//! # Errors of the C entry points, and the one panic guard
//!
//! Every C entry point, of the pluggable path ([`crate::ffi`]) and of the native class's table
//! ([`crate::native`]), and the Python functions that share their bodies ([`crate::entry`]),
//! report failures the same way:
//!
//! * a failure is a [`CError`]: an error kind (`ERR_*`, 0 for success) and a message;
//! * **no panic crosses the boundary**: [`guarded`] runs a body under `catch_unwind` and turns a
//!   panic (a bug) into an [`ERR_INTERNAL`] error whose message keeps the panic's text;
//! * a C caller learns the message from the calling thread's *last error* ([`set_last_error`],
//!   read back with `cudamem_last_error`); [`run`] is [`guarded`] plus that, returning the kind.

use std::cell::RefCell;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudamem_alloc::AllocError;

use crate::registry::RegistryError;

pub use crate::abi::{ERR_DEVICE, ERR_INTERNAL, ERR_INVALID, ERR_NONE, ERR_OOM};

thread_local! {
    static LAST_ERROR: RefCell<(c_int, String)> = const { RefCell::new((ERR_NONE, String::new())) };
}

/// An error of a C entry point: kind and message.
#[derive(Debug)]
pub struct CError {
    pub kind: c_int,
    pub message: String,
}

impl CError {
    /// An [`ERR_INVALID`] error with `message`.
    pub fn invalid(message: String) -> Self {
        CError {
            kind: ERR_INVALID,
            message,
        }
    }
}

impl From<RegistryError> for CError {
    fn from(e: RegistryError) -> Self {
        let kind = match &e {
            RegistryError::Alloc(a) => return alloc_error(a),
            RegistryError::Device(_) => ERR_DEVICE,
            RegistryError::BadDevice(_) | RegistryError::BadSetting(_) | RegistryError::InUse(_) => ERR_INVALID,
        };
        CError {
            kind,
            message: e.to_string(),
        }
    }
}

impl From<AllocError> for CError {
    fn from(e: AllocError) -> Self {
        alloc_error(&e)
    }
}

impl From<cudamem::Error> for CError {
    fn from(e: cudamem::Error) -> Self {
        alloc_error(&api_error(e))
    }
}

/// The allocator error inside an error of the Rust API (the calls this package makes on an
/// open allocator fail only with one); any other is an invalid argument carrying its message.
pub fn api_error(e: cudamem::Error) -> AllocError {
    match e {
        cudamem::Error::Alloc(a) => a,
        other => AllocError::InvalidArgument(other.to_string()),
    }
}

/// The kind and message of an allocator error.
pub fn alloc_error(e: &AllocError) -> CError {
    let kind = match e {
        AllocError::OutOfMemory(_) => ERR_OOM,
        AllocError::Device(_) => ERR_DEVICE,
        _ => ERR_INVALID,
    };
    CError {
        kind,
        message: e.to_string(),
    }
}

/// Runs `f`, turning a panic into an [`ERR_INTERNAL`] error that names `what` and keeps the
/// panic's message.
#[inline]
pub fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, CError>) -> Result<T, CError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let why = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(CError {
                kind: ERR_INTERNAL,
                message: format!("cudamem: internal error in {what}: {why}"),
            })
        }
    }
}

/// [`guarded`] for a C entry point that returns an error kind: a failure becomes the thread's
/// last error and its kind is returned ([`ERR_NONE`] on success).
pub fn run(what: &str, f: impl FnOnce() -> Result<(), CError>) -> c_int {
    match guarded(what, f) {
        Ok(()) => ERR_NONE,
        Err(e) => fail(&e),
    }
}

/// Makes `e` the thread's last error and returns its kind.
pub fn fail(e: &CError) -> c_int {
    set_last_error(e.kind, &e.message);
    e.kind
}

/// Sets the calling thread's last error (never panics, even while the thread exits).
pub fn set_last_error(kind: c_int, message: &str) {
    let _ = LAST_ERROR.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.0 = kind;
            l.1.clear();
            l.1.push_str(message);
        }
    });
}

/// The calling thread's last error (kind, message).
pub fn last_error() -> (c_int, String) {
    LAST_ERROR
        .try_with(|l| l.borrow().clone())
        .unwrap_or((ERR_NONE, String::new()))
}
