//! Reading a trace file with bounds, before and after its format is known.
//!
//! Every command reads its traces through [`read_path`] or [`read_path_limited`], so the bounds
//! here hold for all of them. A path can name something that never ends (`/dev/zero`, a pipe, a
//! FIFO) or a file far larger than any trace, so the file is never read whole on trust:
//!
//! 1. A regular file longer than the limit is refused before a byte is read.
//! 2. The first [`SNIFF_BYTES`] (or fewer, at end of file) are read and the format is detected
//!    from them ([`crate::detect_format`]). Content of no known format is refused at once, so an
//!    endless stream of anything else (zeros, random bytes, text) costs one small read.
//! 3. The rest is read up to the limit; one byte more is an error. The same limit bounds what
//!    gzip content may expand to, so neither the raw nor the decompressed bytes of one trace can
//!    exceed it.
//!
//! What a trace *claims* (device ordinals, stack ids, lengths in headers) is bounded by each
//! reader and by `Trace::validate`; memory use is linear in the bytes these limits admit.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::{detect_format, ErrorKind, Format, Location, Trace, TraceError};

/// Most bytes one trace may have, as read from its file and after gunzip (4 GiB), unless the
/// caller gives another limit ([`read_path_limited`]). Real snapshots are far smaller: a large
/// training job's gzip'd snapshot is tens of MiB.
pub const MAX_TRACE_BYTES: u64 = 4 << 30;

/// How many leading bytes decide the format before the rest is read.
pub const SNIFF_BYTES: usize = 4096;

/// Read a trace file within [`MAX_TRACE_BYTES`], choosing the format by content.
/// [`Trace::source`] is the file name (without directories).
pub fn read_path(path: &Path) -> Result<Trace, TraceError> {
    read_path_limited(path, MAX_TRACE_BYTES)
}

/// [`read_path`] with `max_bytes` as the limit on the bytes read and on what gzip content
/// expands to (see the module docs).
pub fn read_path_limited(path: &Path, max_bytes: u64) -> Result<Trace, TraceError> {
    let source = path
        .file_name()
        .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let bytes = read_bounded(path, &source, max_bytes)?;
    crate::read_bytes_within(&bytes, &source, max_bytes)
}

/// The error for input past `max_bytes`.
pub(crate) fn too_large(source: &str, what: &str, max_bytes: u64) -> TraceError {
    TraceError::new(
        source,
        ErrorKind::TooLarge,
        Location::Whole,
        format!("{what} is larger than the limit on one trace ({max_bytes} bytes)"),
    )
}

/// The file's bytes: the format sniffed first, then the rest up to `max_bytes`.
fn read_bounded(path: &Path, source: &str, max_bytes: u64) -> Result<Vec<u8>, TraceError> {
    let io = |e: std::io::Error| {
        // The source is the file name; the message names the path only where it says more.
        let msg = if path.as_os_str() == source {
            e.to_string()
        } else {
            format!("cannot read {}: {e}", path.display())
        };
        TraceError::new(source, ErrorKind::Io, Location::Whole, msg)
    };
    let mut file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if meta.is_dir() {
        return Err(TraceError::new(
            source,
            ErrorKind::Io,
            Location::Whole,
            "is a directory, not a trace file",
        ));
    }
    if meta.is_file() && meta.len() > max_bytes {
        return Err(too_large(source, "the file", max_bytes));
    }
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    (&mut file)
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(io)?;
    let Some(format) = detect_format(&head) else {
        return Err(crate::unknown(source, &head, "the file"));
    };
    // Fewer bytes than asked for: the head is the whole file, and reading it whole says the rest.
    let mut room = (max_bytes + 1).saturating_sub(head.len() as u64);
    if head.len() == SNIFF_BYTES {
        if let Some(len) = check_head(format, &head, source, max_bytes)? {
            room = room.min((len + 1).saturating_sub(head.len() as u64));
        }
    }
    let mut bytes = head;
    if meta.is_file() {
        bytes.reserve(meta.len().saturating_sub(bytes.len() as u64).min(max_bytes) as usize);
    }
    file.take(room).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large(source, "the input", max_bytes));
    }
    Ok(bytes)
}

/// Refuses a file from its first bytes `head` (not the whole file) where the rest cannot make
/// it a trace: a pickle or compact prefix that fails for a reason other than its end, gzip that
/// fails to decode or expands to no known format. Returns the length a compact header declares,
/// which bounds what is worth reading.
fn check_head(format: Format, head: &[u8], source: &str, max_bytes: u64) -> Result<Option<u64>, TraceError> {
    match format {
        Format::Pickle => {
            // Decoding is sequential, so an error other than running out of input is the same
            // error the whole file gives.
            if let Err(e) = crate::pickle_vm::decode(head) {
                if !e.message.starts_with("pickle truncated") {
                    return Err(TraceError::new(
                        source,
                        ErrorKind::Pickle,
                        Location::Byte(e.offset),
                        format!("pickle decode error: {}", e.message),
                    ));
                }
            }
            Ok(None)
        }
        Format::Compact => {
            if let Err(e) = crate::read_compact(head, source) {
                if e.kind != ErrorKind::Truncated {
                    return Err(e);
                }
            }
            let len = u64::from_le_bytes(head[16..24].try_into().expect("the head holds the header"));
            if len > max_bytes {
                return Err(too_large(source, "the file (by its header)", max_bytes));
            }
            Ok(Some(len))
        }
        Format::Gzip => {
            let mut inner = Vec::with_capacity(SNIFF_BYTES);
            let dec = flate2::read::MultiGzDecoder::new(head);
            if let Err(e) = dec.take(SNIFF_BYTES as u64).read_to_end(&mut inner) {
                if e.kind() != std::io::ErrorKind::UnexpectedEof {
                    return Err(TraceError::new(
                        source,
                        ErrorKind::Gzip,
                        Location::Whole,
                        format!("gzip decode error: {e}"),
                    ));
                }
            }
            // A shorter prefix may still be the start of a text header or magic.
            match detect_format(&inner) {
                None if inner.len() == SNIFF_BYTES => Err(crate::unknown(source, &inner, "gzip content")),
                Some(Format::Pickle) if inner.len() == SNIFF_BYTES => {
                    check_head(Format::Pickle, &inner, source, max_bytes).map(|_| None)
                }
                _ => Ok(None),
            }
        }
        Format::RmmCsv => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("cudamem-input-{}-{name}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn endless_zeros_are_refused_from_the_first_bytes() {
        let e = read_path(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownFormat, "{e}");
        assert!(e.to_string().contains("first bytes: 00 00"), "{e}");
    }

    #[test]
    fn a_file_over_the_limit_is_refused_before_reading() {
        let p = temp(
            "big.csv",
            &[b"Thread,Time,Action,Pointer,Size,Stream\n".as_slice(); 100].concat(),
        );
        let e = read_path_limited(&p, 1000).unwrap_err();
        assert_eq!(e.kind, ErrorKind::TooLarge, "{e}");
        assert!(e.to_string().contains("1000 bytes"), "{e}");
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn gzip_content_is_bounded_by_the_same_limit() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(b"Thread,Time,Action,Pointer,Size,Stream\n").unwrap();
        for _ in 0..1000 {
            gz.write_all(b"1,1,allocate,0x10,16,0x0\n").unwrap();
        }
        let p = temp("small.csv.gz", &gz.finish().unwrap());
        let e = read_path_limited(&p, 4096).unwrap_err();
        assert_eq!(e.kind, ErrorKind::TooLarge, "{e}");
        assert_eq!(read_path(&p).unwrap().devices[0].events.len(), 1000);
        std::fs::remove_file(p).unwrap();
    }

    /// An endless stream that starts like a trace, read through a FIFO by a thread of its own.
    fn fifo(name: &str, head: &'static [u8], filler: u8) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("cudamem-input-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let ok = std::process::Command::new("mkfifo").arg(&p).status().unwrap().success();
        assert!(ok, "mkfifo");
        let w = p.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().write(true).open(&w).unwrap();
            let _ = f.write_all(head);
            let block = [filler; 1 << 16];
            while f.write_all(&block).is_ok() {}
        });
        p
    }

    #[test]
    fn endless_streams_that_start_like_a_trace_end_in_an_error() {
        // A pickle of protocol 4 followed by opcodes no snapshot has: refused from the head.
        let p = fifo("pickle", b"\x80\x04}", 0xff);
        let e = read_path(&p).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Pickle, "{e}");
        std::fs::remove_file(p).unwrap();
        // An RMM header and endless blank lines: read up to the limit, then refused.
        let p = fifo("csv", b"Thread,Time,Action,Pointer,Size,Stream\n", b'\n');
        let e = read_path_limited(&p, 1 << 20).unwrap_err();
        assert_eq!(e.kind, ErrorKind::TooLarge, "{e}");
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn a_cut_gzip_or_pickle_head_is_not_refused() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut x = 1u64;
        let mut raw = b"Thread,Time,Action,Pointer,Size,Stream\n".to_vec();
        for _ in 0..10_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            raw.extend_from_slice(format!("1,{},allocate,0x{:x},16,0x0\n", x >> 40, x >> 8).as_bytes());
        }
        gz.write_all(&raw).unwrap();
        let gz = gz.finish().unwrap();
        assert!(gz.len() > SNIFF_BYTES);
        assert_eq!(
            check_head(Format::Gzip, &gz[..SNIFF_BYTES], "t", MAX_TRACE_BYTES).unwrap(),
            None
        );
        let pickle = [&b"\x80\x04]"[..], &[b'K', 7].repeat(SNIFF_BYTES)].concat();
        assert!(check_head(Format::Pickle, &pickle[..SNIFF_BYTES], "t", MAX_TRACE_BYTES).is_ok());
    }

    #[test]
    fn empty_files_and_directories_say_what_they_are() {
        let p = temp("empty", b"");
        let e = read_path(&p).unwrap_err();
        assert!(e.to_string().ends_with("is empty: not a trace"), "{e}");
        std::fs::remove_file(p).unwrap();
        let e = read_path(&std::env::temp_dir()).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
    }

    #[test]
    fn a_missing_file_names_itself_once() {
        let e = read_path(Path::new("nosuch.pickle.gz")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Io);
        assert_eq!(e.to_string().matches("nosuch.pickle.gz").count(), 1, "{e}");
    }
}
