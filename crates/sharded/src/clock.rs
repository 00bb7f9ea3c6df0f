//! # The timestamp of an operation, taken under its shard's lock
//!
//! The CPU's invariant time-stamp counter (`rdtscp`) where the kernel's clocksource is `tsc`
//! (Linux checked that it is synchronised across cores), otherwise a shared counter: either way
//! one order of all logged operations consistent with real time (see the crate documentation).

use super::*;

static FALLBACK: AtomicU64 = AtomicU64::new(0);

/// Whether the time-stamp counter orders events across cores on this machine.
fn tsc_is_reliable() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        cfg!(target_arch = "x86_64")
            && std::env::var_os("CUDAMEM_SHARD_CLOCK").is_none_or(|v| v != "counter")
            && std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
                .is_ok_and(|s| s.trim() == "tsc")
    })
}

/// What orders the operations: `"tsc"` or `"counter"`.
pub fn kind() -> &'static str {
    if tsc_is_reliable() {
        "tsc"
    } else {
        "counter"
    }
}

#[inline]
pub fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    if tsc_is_reliable() {
        let mut aux = 0u32;
        // SAFETY: `rdtscp` exists on every x86-64 CPU whose kernel uses the TSC as its
        // clocksource; it reads a counter and writes `aux`, nothing else. It waits for the
        // instructions before it, so the stamp follows the operation's state changes.
        return unsafe { core::arch::x86_64::__rdtscp(&mut aux) };
    }
    FALLBACK.fetch_add(1, Ordering::SeqCst)
}
