//! Device strings (`sim`, `sim:<capacity>`, `cuda`, `cuda:N`, `auto`), parsed into a
//! [`DeviceSpec`]; the table of what each names is in the [crate documentation](crate).
//!
//! Guarantees: parsing touches no device; a string that names no device is an
//! [`Error`](crate::Error), never a panic.

use crate::{parse_size, Error};

/// A parsed device string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The simulated GPU, with this capacity (default: an H200's).
    Sim {
        /// Bytes of device memory; `None` for an H200's.
        capacity: Option<u64>,
    },
    /// CUDA device N.
    Cuda(i32),
    /// `cuda:0` if a CUDA device is present, else `sim`.
    Auto,
}

impl DeviceSpec {
    /// Parses `sim`, `sim:<capacity>`, `cuda`, `cuda:N` or `auto` (case-insensitive,
    /// surrounding blanks ignored). A capacity is a byte count of at least 1 with an optional
    /// unit in either case, parsed by [`parse_size`]: `KiB`/`K` … `EiB`/`E` (powers of 1024) or
    /// `B`, `KB` … `EB` (powers of 1000), e.g. `sim:8GiB`, `sim:1.5G`, `sim:80GB`,
    /// `sim:1073741824`.
    pub fn parse(spec: &str) -> Result<DeviceSpec, Error> {
        let bad = |reason: String| Error::BadDevice {
            spec: spec.to_string(),
            reason,
        };
        let s = spec.trim();
        if s.is_empty() {
            return Err(bad("the device string is empty".into()));
        }
        // The kind in either case; the argument as written, for messages.
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k.trim().to_ascii_lowercase(), Some(a.trim())),
            None => (s.to_ascii_lowercase(), None),
        };
        match (kind.as_str(), arg) {
            ("sim", None) => Ok(DeviceSpec::Sim { capacity: None }),
            ("sim", Some(c)) => match parse_size(c) {
                Ok(n) => Ok(DeviceSpec::Sim { capacity: Some(n) }),
                Err(e) => Err(bad(format!("bad capacity: {e}"))),
            },
            ("cuda", None) => Ok(DeviceSpec::Cuda(0)),
            ("cuda", Some(n)) => match n.parse::<i32>() {
                Ok(i) if i >= 0 => Ok(DeviceSpec::Cuda(i)),
                _ => Err(bad(format!("'{n}' is not a device ordinal (0, 1, ...)"))),
            },
            ("auto", None) => Ok(DeviceSpec::Auto),
            ("auto", Some(_)) => Err(bad("'auto' takes no argument".into())),
            (k, _) => Err(bad(format!("unknown device kind '{k}'"))),
        }
    }
}
