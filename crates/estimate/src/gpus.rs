//! Named GPUs for `--capacity`: the memory torch reports as the device's total (its
//! out-of-memory messages' "total capacity"), which is less than the board's nominal size.
//! A name is matched case-insensitively; anything else is parsed as a size (`80GiB`).

use cudamem_alloc::size::parse_size;

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
        Ok(0) => Err(format!("capacity '{s}': a GPU with no memory fits nothing")),
        Ok(b) => Ok(b),
        Err(e) => Err(format!(
            "capacity '{s}' is neither a size nor a known GPU ({e}); known GPUs: {}",
            GPUS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        )),
    }
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
}
