//! The error type of the crate: what an [`Allocator`](crate::Allocator) or a
//! [`Buffer`](crate::Buffer) call can fail with.
//!
//! Guarantees: no failure is swallowed; out of memory is [`Error::Alloc`] carrying the engine's
//! [`AllocError::OutOfMemory`], whose message is PyTorch's, character for character
//! ([`Error::is_out_of_memory`], [`Error::out_of_memory`] find it), and every error keeps its
//! cause as [`std::error::Error::source`].

use std::fmt;

use crate::{AllocError, ConfigError, DeviceError, OutOfMemory};

/// What can go wrong with the API of this crate.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A device string that is not `sim`, `sim:<capacity>`, `cuda`, `cuda:N` or `auto`.
    BadDevice {
        /// The string given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The device string was understood but the device could not be opened (no CUDA driver,
    /// no such ordinal, a driver failure).
    DeviceUnavailable {
        /// The string given.
        spec: String,
        /// The device's error.
        source: DeviceError,
    },
    /// The allocator configuration string (`PYTORCH_CUDA_ALLOC_CONF` syntax) was rejected.
    Config(ConfigError),
    /// An allocator call failed: out of memory ([`AllocError::OutOfMemory`], with PyTorch's
    /// message), an unknown pointer, a bad argument or a device failure.
    Alloc(AllocError),
    /// A stream that may not be passed to this allocator's device (see [`Stream`](crate::Stream)).
    InvalidStream {
        /// The raw handle.
        raw: u64,
        /// The device it was given to.
        device: String,
    },
    /// An operation this device does not offer (data access on the simulated device), or a
    /// misuse of the cudarc interop (a stream of another context, a misaligned element type).
    Unsupported(String),
}

impl Error {
    /// True for out-of-memory errors of the allocator.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::Alloc(e) if e.is_out_of_memory())
    }

    /// The allocator's error, if this is one.
    pub fn as_alloc_error(&self) -> Option<&AllocError> {
        match self {
            Error::Alloc(e) => Some(e),
            _ => None,
        }
    }

    /// The out-of-memory report, if this is an out-of-memory error.
    pub fn out_of_memory(&self) -> Option<&OutOfMemory> {
        match self {
            Error::Alloc(AllocError::OutOfMemory(o)) => Some(o),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadDevice { spec, reason } => write!(
                f,
                "invalid device '{spec}': {reason} (expected sim, sim:<capacity> such as sim:8GiB, \
                 cuda, cuda:N or auto)"
            ),
            Error::DeviceUnavailable { spec, source } => {
                write!(f, "cannot open device '{spec}': {source}")
            }
            Error::Config(e) => write!(f, "invalid allocator configuration: {e}"),
            Error::Alloc(e) => e.fmt(f),
            Error::InvalidStream { raw, device } => write!(
                f,
                "stream {raw:#x} may not be used on {device}: use Stream::DEFAULT, \
                 Allocator::create_stream, Allocator::stream_from_cudarc or the unsafe \
                 Stream::from_raw_cuda"
            ),
            Error::Unsupported(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::DeviceUnavailable { source, .. } => Some(source),
            Error::Config(e) => Some(e),
            Error::Alloc(e) => Some(e),
            _ => None,
        }
    }
}

impl From<AllocError> for Error {
    fn from(e: AllocError) -> Self {
        Error::Alloc(e)
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}

impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Self {
        Error::Alloc(AllocError::Device(e))
    }
}
