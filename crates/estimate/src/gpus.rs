//! Named GPUs for `--capacity`: the memory torch reports as the device's total (its
//! out-of-memory messages' "total capacity"), which is less than the board's nominal size.
//! A name is matched case-insensitively; anything else is parsed as a size (`80GiB`) by the
//! one size parser ([`parse_size`], whose unit table every command shares). Every command that
//! takes a GPU's memory reads it here, so a name that works for one works for all.
//!
//! A capacity under [`MIN_CAPACITY`] is refused: no GPU is that small, and such a number is
//! almost always a size written without its unit (`8` for `8GiB`, since a bare number is bytes).

use cudamem_alloc::size::{human, parse_size};

/// The smallest capacity a `--capacity` accepts.
pub const MIN_CAPACITY: u64 = 1 << 20;

const GIB: f64 = (1u64 << 30) as f64;

/// (name, bytes) of the GPUs known by name.
pub const GPUS: &[(&str, u64)] = &[
    ("h200", 150_109_880_320),
    ("h100-80gb", (79.11 * GIB) as u64),
    ("a100-80gb", (79.15 * GIB) as u64),
    ("a100-40gb", (39.39 * GIB) as u64),
    ("l40s", (44.39 * GIB) as u64),
    ("rtx4090", (23.65 * GIB) as u64),
    ("rtx3090", (23.69 * GIB) as u64),
    ("a10g", (22.19 * GIB) as u64),
    ("v100-32gb", (31.74 * GIB) as u64),
    ("v100-16gb", (15.77 * GIB) as u64),
    ("t4", (14.75 * GIB) as u64),
];

/// The capacity a `--capacity` value names: a GPU of [`GPUS`] or a size.
pub fn gpu_capacity(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    if let Some((_, b)) = GPUS.iter().find(|(n, _)| *n == t) {
        return Ok(*b);
    }
    match parse_size(s) {
        Ok(b) => check_capacity(s, b),
        Err(e) => Err(format!(
            "capacity '{s}' is neither a size nor a known GPU (known GPUs: {}): {e}",
            gpu_names()
        )),
    }
}

/// `bytes` (written `s`) as a GPU's memory: refused under [`MIN_CAPACITY`].
pub fn check_capacity(s: &str, bytes: u64) -> Result<u64, String> {
    if bytes < MIN_CAPACITY {
        return Err(format!(
            "capacity '{s}' is {}, less than 1 MiB: no GPU is that small. A bare number is bytes; \
             give a unit (8GiB, 80GB) or a GPU name ({})",
            human(bytes),
            gpu_names()
        ));
    }
    Ok(bytes)
}

/// The names of [`GPUS`], comma-separated.
pub fn gpu_names() -> String {
    GPUS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_sizes() {
        assert_eq!(gpu_capacity("H200").unwrap(), 150_109_880_320);
        assert_eq!(gpu_capacity("80GiB").unwrap(), 80 << 30);
        let e = gpu_capacity("h300").unwrap_err();
        assert!(e.contains("h100-80gb"), "{e}");
        assert!(gpu_capacity("0").is_err());
    }

    #[test]
    fn a_capacity_under_a_mebibyte_is_refused_with_the_units() {
        let e = gpu_capacity("8").unwrap_err();
        assert!(
            e.contains("8 B") && e.contains("bare number is bytes") && e.contains("h200"),
            "{e}"
        );
        assert!(gpu_capacity("1023KiB").is_err());
        assert_eq!(gpu_capacity("1MiB").unwrap(), 1 << 20);
        let e = gpu_capacity("8XB").unwrap_err();
        assert!(e.contains("known GPU") && e.contains("1GB = 10^9"), "{e}");
    }
}
