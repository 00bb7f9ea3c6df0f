//! `read_pickle` and `read_bytes` (format detection, gzip, pickle, compact, RMM CSV) on arbitrary
//! bytes: no panic, and an accepted trace validates and round-trips through both writers.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cudamem_fuzz::pickle(data);
});
