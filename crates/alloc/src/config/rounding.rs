//! # PyTorch's `round_size`: the first rounding of every request
//!
//! Driven by `roundup_power2_divisions`, so it lives with the configuration. Guarantees: never
//! panics or wraps for any `u64`; a rounded size beyond `u64::MAX` saturates to `u64::MAX` (no
//! device can serve it, so it ends in an out-of-memory error).

use super::*;

impl AllocatorConfig {
    /// The bucket of `roundup_power2_divisions` that applies to `size`:
    /// `floor(log2(size)) - 20`, clamped to 0..=15 (sizes below 2 MiB use
    /// bucket 0, sizes from 32 GiB bucket 15).
    pub fn roundup_power2_bucket(size: u64) -> usize {
        let log_size = size.checked_ilog2().unwrap_or(0) as usize;
        log_size.saturating_sub(20).min(ROUNDUP_POWER2_INTERVALS - 1)
    }

    /// PyTorch's `roundup_power2_divisions(size)`: the divisions configured
    /// for the bucket of `size` (0 when not configured).
    pub fn roundup_power2_divisions_for(&self, size: u64) -> u64 {
        self.roundup_power2_divisions[Self::roundup_power2_bucket(size)]
    }

    /// PyTorch's `round_size(size)`, the block size a request is served
    /// with:
    ///
    /// - below 512 bytes: 512;
    /// - if the bucket's divisions `d` exceed 1 and `size > 512 * d`: round
    ///   up to the next of `d` equal steps between the surrounding powers of
    ///   two (`roundup_power2_next_division`; a power of two is kept);
    /// - otherwise round up to a multiple of 512.
    ///
    /// `512 * d` wraps as PyTorch's `size_t` product does (only for
    /// `d >= 2^55`); a result above `u64::MAX` saturates to `u64::MAX`.
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK_SIZE {
            return MIN_BLOCK_SIZE;
        }
        let divisions = self.roundup_power2_divisions_for(size);
        if divisions > 1 && size > MIN_BLOCK_SIZE.wrapping_mul(divisions) {
            roundup_power2_next_division(size, divisions)
        } else {
            round_up_saturating(size, MIN_BLOCK_SIZE)
        }
    }
}

/// PyTorch's `roundup_power2_next_division(size, divisions)`: a power of
/// two is returned unchanged; otherwise the interval
/// `[2^k, 2^(k+1))` holding `size` is cut into `divisions` equal steps and
/// `size` rounds up to the next step (e.g. 1200 with 4 divisions: steps of
/// 256 above 1024, so 1280). Saturates instead of wrapping.
pub(super) fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    // size >= 512 and divisions >= 2 here (see round_size).
    let floor = 1u64 << size.ilog2();
    let step = floor >> divisions.ilog2();
    if step == 0 {
        // PyTorch returns `floor << 1`, which wraps to 0 at 2^63.
        return floor.saturating_mul(2);
    }
    let rounded_down = size & !(step - 1);
    if rounded_down == size {
        size
    } else {
        rounded_down.saturating_add(step)
    }
}

/// `size` rounded up to a multiple of `unit` (a power of two), or
/// `u64::MAX` when that multiple does not fit.
fn round_up_saturating(size: u64, unit: u64) -> u64 {
    match size.checked_add(unit - 1) {
        Some(v) => v & !(unit - 1),
        None => u64::MAX,
    }
}
