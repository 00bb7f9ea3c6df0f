//! The files a command reads and writes, with the rules every command shares:
//!
//! * traces are read through [`load`], within `cudamem_trace`'s bounds (content of no known
//!   format is refused from its first bytes; no trace is read past a size limit, which
//!   `CUDAMEM_MAX_TRACE_BYTES` raises or lowers);
//! * an output path is resolved by [`output`]: `-` means stdout, and a path that is one of the
//!   command's inputs (the same file, by identity, whatever the spelling or link) is refused
//!   before anything is read or written.

use std::path::{Path, PathBuf};

use cudamem_alloc::size::parse_size;
use cudamem_trace::{ErrorKind, Trace};

/// The environment variable that sets the most bytes one trace may have.
pub const MAX_TRACE_BYTES_VAR: &str = "CUDAMEM_MAX_TRACE_BYTES";

/// The limit on one trace's bytes: `CUDAMEM_MAX_TRACE_BYTES` if set, else the reader's default.
fn max_trace_bytes() -> Result<u64, String> {
    match std::env::var(MAX_TRACE_BYTES_VAR) {
        Ok(v) => parse_size(&v).map_err(|e| format!("{MAX_TRACE_BYTES_VAR}={v}: {e}")),
        Err(std::env::VarError::NotPresent) => Ok(cudamem_trace::MAX_TRACE_BYTES),
        Err(e) => Err(format!("{MAX_TRACE_BYTES_VAR}: {e}")),
    }
}

/// Reads one trace; the error names the file.
pub fn load(path: &Path) -> Result<Trace, String> {
    cudamem_trace::read_path_limited(path, max_trace_bytes()?).map_err(|e| {
        if e.kind == ErrorKind::TooLarge {
            format!("{e}; set {MAX_TRACE_BYTES_VAR} (e.g. 16GiB) to read a larger one")
        } else {
            e.to_string()
        }
    })
}

/// Where a command's output goes.
pub enum Output {
    /// Standard output (the path `-`).
    Stdout,
    /// A file, created or replaced.
    File(PathBuf),
}

/// Resolves the output path `path` of option `flag`: `-` is stdout; a path that is the same file
/// as one of `inputs` is refused.
pub fn output(flag: &str, path: &Path, inputs: &[PathBuf]) -> Result<Output, String> {
    if path.as_os_str() == "-" {
        return Ok(Output::Stdout);
    }
    if let Some(input) = inputs.iter().find(|i| same_file(path, i)) {
        return Err(format!(
            "{flag} {} is the input {}: refusing to overwrite it; give another output file",
            path.display(),
            input.display()
        ));
    }
    Ok(Output::File(path.to_path_buf()))
}

/// Whether `a` and `b` name the same existing file (a path that does not exist is no input).
fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        ma.dev() == mb.dev() && ma.ino() == mb.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (ma, mb);
        matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_file_under_another_spelling_is_refused() {
        let dir = std::env::temp_dir().join(format!("cudamem-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("t.pickle");
        std::fs::write(&input, b"x").unwrap();
        let other = dir.join(".").join("t.pickle");
        assert!(output("-o", &other, std::slice::from_ref(&input)).is_err());
        #[cfg(unix)]
        {
            let link = dir.join("link.pickle");
            std::os::unix::fs::symlink(&input, &link).unwrap();
            assert!(output("-o", &link, std::slice::from_ref(&input)).is_err());
        }
        assert!(matches!(
            output("-o", &dir.join("new.html"), std::slice::from_ref(&input)),
            Ok(Output::File(_))
        ));
        assert!(matches!(output("-o", Path::new("-"), &[input]), Ok(Output::Stdout)));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
