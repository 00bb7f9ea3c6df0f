//! What the binary tests share: a shipped trace's path, and the `cudamem` binary run with
//! arguments.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// A file of `tests/data`, as an argument.
pub fn data(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// The `cudamem` binary run with `args`, its output captured.
pub fn cudamem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cudamem"))
        .args(args)
        .output()
        .expect("the cudamem binary runs")
}
