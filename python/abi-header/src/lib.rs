//! # The generated C++ header of cudamem's C interface to torch
//!
//! `python/src/abi.rs` defines, once, what the C++ side shares with the Rust side: the error
//! kinds, the native class's function table and its records and callbacks, and the types of
//! the pluggable path's C functions. cbindgen turns it into
//! `python/cudamem/_shim/cudamem_abi.h`, which the native class and the shim include. The header
//! is checked in, because `cudamem.torch.install()` compiles the C++ on the user's machine from
//! the wheel, without Rust tools.
//!
//! This crate holds only the test that keeps the two in step (`tests/header.rs`): it generates
//! the header and fails, with the difference, when the checked-in one is not the same;
//! `CUDAMEM_WRITE_HEADER=1 cargo test -p cudamem-abi-header` rewrites it. It is a crate of its
//! own so that the check needs neither Python nor the extension module's build.
