//! [`TraceError`]: what went wrong and where, for every reader and for [`crate::Trace::validate`].

use std::fmt;

/// What went wrong, broadly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The file could not be read.
    Io,
    /// The content matches none of the known formats.
    UnknownFormat,
    /// gzip decoding failed.
    Gzip,
    /// The pickle stream is malformed (the decoder's message is kept).
    Pickle,
    /// The pickle decoded but does not have the snapshot's shape or types.
    Schema,
    /// A line of an RMM CSV log is malformed.
    Csv,
    /// The compact file is malformed (bad magic, version, checksum, record).
    Compact,
    /// The input ends early (compact format: offset and expected length).
    Truncated,
    /// The input is larger or deeper than the reader accepts.
    TooLarge,
    /// A trace handed to a writer breaks the model's invariants.
    Invalid,
}

/// Where in the input an error is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// No particular place (or the place is part of the message).
    Whole,
    /// 1-based line number (CSV).
    Line(usize),
    /// Path of the entry, e.g. `device_traces[0][1234]` (pickle).
    Entry(String),
    /// Byte offset (compact format, pickle stream).
    Byte(u64),
}

/// An error of a reader or writer. `Display` names the file and the place:
/// `trace.csv:17: …`, `x.pickle: device_traces[0][1234]: field 'size' is a
/// str, expected int`, `x.cmt: truncated at byte 1234 of 5678`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceError {
    /// The file (or source name) being read.
    pub source: String,
    /// Broad category.
    pub kind: ErrorKind,
    /// Where.
    pub location: Location,
    /// What.
    pub message: String,
}

impl TraceError {
    /// Build an error.
    pub fn new(source: &str, kind: ErrorKind, location: Location, message: impl Into<String>) -> TraceError {
        TraceError {
            source: source.to_string(),
            kind,
            location,
            message: message.into(),
        }
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Location::Whole => write!(f, "{}: {}", self.source, self.message),
            Location::Line(n) => write!(f, "{}:{}: {}", self.source, n, self.message),
            Location::Entry(p) => write!(f, "{}: {}: {}", self.source, p, self.message),
            Location::Byte(_) if self.kind == ErrorKind::Truncated => {
                write!(f, "{}: {}", self.source, self.message)
            }
            Location::Byte(o) => write!(f, "{}: at byte {}: {}", self.source, o, self.message),
        }
    }
}

impl std::error::Error for TraceError {}
