//! `AllocatorConfig::parse` and `apply` on arbitrary strings: no panic; a rejection names a key
//! or the string and leaves the configuration unchanged; an accepted string can be applied at
//! runtime to an allocator.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cudamem_fuzz::config(data);
});
