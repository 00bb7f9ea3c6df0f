//! Bytes decoded into a policy, settings, device capacity, fault plan and a sequence of
//! allocator calls on a simulated GPU; every invariant is checked after every call and, at the
//! end, every byte must go back to the device. See `cudamem_fuzz::run`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cudamem_fuzz::allocator_ops(data);
});
