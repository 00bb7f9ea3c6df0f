//! Sizes on the command line: `150109880320`, `80GB` (10^9), `80GiB` (2^30), `512MiB`, `1.5TiB`.

/// Parses a size with an optional decimal (KB, MB, GB, TB) or binary (KiB, MiB, GiB, TiB) unit.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024f64.powi(2),
        "GiB" => 1024f64.powi(3),
        "TiB" => 1024f64.powi(4),
        u => {
            return Err(format!(
                "unknown size unit '{u}' in '{s}' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)"
            ))
        }
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 80GiB, 141GB, 1073741824)"))?;
    let bytes = v * mult;
    if !(1.0..=1.8e19).contains(&bytes) {
        return Err(format!("size '{s}' is out of range (1 byte to 16 EiB)"));
    }
    Ok(bytes as u64)
}

/// A size for people: `12.34 GiB`.
pub fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut i) = (b as f64, 0);
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_bad_ones_are_named() {
        assert_eq!(parse_size("80GiB").unwrap(), 80 << 30);
        assert_eq!(parse_size("141GB").unwrap(), 141_000_000_000);
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert!(parse_size("12XB").unwrap_err().contains("XB"));
        assert!(parse_size("abc").unwrap_err().contains("abc"));
        assert!(parse_size("0").is_err());
        assert_eq!(human(3 << 30), "3.00 GiB");
    }
}
