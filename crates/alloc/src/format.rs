//! Byte-size text as PyTorch's C++ allocator writes it.
//!
//! [`format_size`] reproduces `format_size` from
//! `c10/cuda/CUDACachingAllocator.cpp`, the helper behind every number in the
//! CUDA out-of-memory message ("Tried to allocate 2.00 MiB. GPU 0 has a total
//! capacity of 139.80 GiB ..."). The C++ code is:
//!
//! ```text
//! os.precision(2); os << std::fixed;
//! if (size <= 1024)             os << size << " bytes";
//! else if (size <= 1048576)     os << size / 1024.0       << " KiB";
//! else if (size <= 1073741824)  os << size / 1048576.0    << " MiB";
//! else                          os << size / 1073741824.0 << " GiB";
//! ```
//!
//! Guarantees: the output is identical to that code for every `u64`,
//! including the boundaries (1024 is "1024 bytes", 1 MiB is "1024.00 KiB",
//! 1 GiB is "1024.00 MiB"), the conversion of sizes above 2^53 to `double`,
//! and the round-half-to-even rule glibc applies to exact ties such as
//! 1152 bytes = 1.125 KiB, written "1.12 KiB". Units stop at GiB, as in
//! PyTorch, so 1 TiB is "1024.00 GiB". It never panics.

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * 1024 * 1024;

/// Formats `bytes` exactly as PyTorch's C++ `format_size` does: "N bytes" up
/// to and including 1024, then KiB, MiB or GiB with two decimals, each unit
/// used up to and including 1024 of it.
///
/// ```
/// use cudamem_alloc::format::format_size;
/// assert_eq!(format_size(1024), "1024 bytes");
/// assert_eq!(format_size(2 << 20), "2.00 MiB");
/// assert_eq!(format_size(150_109_880_320), "139.80 GiB");
/// ```
pub fn format_size(bytes: u64) -> String {
    let (shift, unit) = if bytes <= KIB {
        return format!("{bytes} bytes");
    } else if bytes <= MIB {
        (10, "KiB")
    } else if bytes <= GIB {
        (20, "MiB")
    } else {
        (30, "GiB")
    };
    format!("{} {unit}", fixed2_of_scaled(bytes, shift))
}

/// `std::fixed` with precision 2 of `(double)bytes / 2^shift`, computed with
/// integers so that it is exact whatever Rust's float formatting does.
///
/// C++ first converts `bytes` to `double` (rounding to nearest even above
/// 2^53); the division by a power of two is then exact, so the printed value
/// is exactly `m / 2^shift` with `m` that rounded integer. glibc prints the
/// exact binary value rounded to nearest, ties to even.
fn fixed2_of_scaled(bytes: u64, shift: u32) -> String {
    // `as f64` rounds to nearest even like the C++ conversion; the result is
    // an integer no larger than 2^64, so it converts back to u128 exactly.
    let m = bytes as f64 as u128;
    let denom = 1u128 << shift;
    let scaled = m * 100; // < 2^71: cannot overflow u128
    let mut hundredths = scaled / denom;
    let rem = scaled % denom;
    let twice = rem * 2;
    if twice > denom || (twice == denom && hundredths % 2 == 1) {
        hundredths += 1;
    }
    format!("{}.{:02}", hundredths / 100, hundredths % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size printed in the real PyTorch 2.11 OOM messages of
    /// tests/data/goldens.json whose exact byte count is known.
    #[test]
    fn golden_oom_message_sizes() {
        // oom_huge: torch.empty of 400 GiB.
        assert_eq!(format_size(400 * GIB), "400.00 GiB");
        // oom_fraction: 10 GiB request.
        assert_eq!(format_size(10 * GIB), "10.00 GiB");
        // oom_fraction2: 512 MiB request (exactly 2^29, still MiB).
        assert_eq!(format_size(512 * MIB), "512.00 MiB");
        // mem_get_info total and free of the H200.
        assert_eq!(format_size(150_109_880_320), "139.80 GiB");
        assert_eq!(format_size(148_957_691_904), "138.73 GiB");
        // allocated_bytes.all.current after empty_cache.
        assert_eq!(format_size(296_465_408), "282.73 MiB");
        // reserved - allocated after empty_cache: 343932928 - 296465408.
        assert_eq!(format_size(343_932_928 - 296_465_408), "45.27 MiB");
        // "6.99 GiB allowed": fraction 0.05 of the 139.80 GiB total.
        assert_eq!(format_size((0.05f64 * 150_109_880_320f64) as u64), "6.99 GiB");
    }

    #[test]
    fn unit_boundaries_are_inclusive() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1), "1 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1025), "1.00 KiB");
        assert_eq!(format_size(MIB), "1024.00 KiB");
        assert_eq!(format_size(MIB + 1), "1.00 MiB");
        assert_eq!(format_size(GIB), "1024.00 MiB");
        assert_eq!(format_size(GIB + 1), "1.00 GiB");
        assert_eq!(format_size(1024 * GIB), "1024.00 GiB");
    }

    #[test]
    fn rounding_is_to_nearest_with_ties_to_even() {
        // 1.125 KiB and 1.375 KiB are exact binary ties.
        assert_eq!(format_size(1152), "1.12 KiB");
        assert_eq!(format_size(1408), "1.38 KiB");
        assert_eq!(format_size(1153), "1.13 KiB");
        // 1.005 is not representable: the nearest double rules.
        assert_eq!(format_size(2047), "2.00 KiB");
        assert_eq!(format_size(20 * MIB), "20.00 MiB");
        assert_eq!(format_size(2 * MIB), "2.00 MiB");
    }

    #[test]
    fn huge_sizes_do_not_overflow() {
        // u64::MAX converts to 2^64 as a double: 2^34 GiB.
        assert_eq!(format_size(u64::MAX), "17179869184.00 GiB");
        assert_eq!(format_size(1u64 << 60), "1073741824.00 GiB");
    }
}
