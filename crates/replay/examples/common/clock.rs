//! The clock probe that `replay_gpu` and `slow_state` share (included with `#[path]`).

/// The core's clock in GHz, estimated from `2^log2_n` dependent 64-bit multiplications at 3
/// cycles each (the latency of `imul` on current x86 cores). In assembly, so that the compiler
/// can neither fold nor reorder the chain.
#[cfg(target_arch = "x86_64")]
pub fn clock_ghz(log2_n: u32) -> f64 {
    let n: u64 = 1 << log2_n;
    let start = std::time::Instant::now();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..n / 8 {
        // SAFETY: register arithmetic only: no memory, stack or flags anyone relies on.
        unsafe {
            std::arch::asm!(
                "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}",
                "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}", "imul {x}, {x}",
                x = inout(reg) x,
                options(nomem, nostack, pure),
            );
        }
    }
    std::hint::black_box(x);
    (3 * n) as f64 / start.elapsed().as_nanos() as f64
}

#[cfg(not(target_arch = "x86_64"))]
pub fn clock_ghz(_log2_n: u32) -> f64 {
    f64::NAN
}
