//! `read_rmm_csv` on arbitrary text (bytes that are not UTF-8 go through `read_bytes`): no
//! panic, and an accepted trace validates and round-trips through the compact format.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cudamem_fuzz::rmm_csv(data);
});
