//! Sizes on the command line: `150109880320`, `80GB` (10^9), `80GiB` (2^30), `512MiB`, `1.5TiB`.
//! Units are case-insensitive (`gb` = `GB`, `gib` = `GiB`).

/// The units, lower-cased, and their multipliers.
const UNITS: [(&str, f64); 13] = [
    ("b", 1.0),
    ("kb", 1e3),
    ("mb", 1e6),
    ("gb", 1e9),
    ("tb", 1e12),
    ("pb", 1e15),
    ("eb", 1e18),
    ("kib", 1024.0),
    ("mib", 1048576.0),
    ("gib", 1073741824.0),
    ("tib", 1099511627776.0),
    ("pib", 1125899906842624.0),
    ("eib", 1152921504606846976.0),
];

/// Parses a size with an optional decimal (KB, MB, GB, TB, PB, EB) or binary (KiB, MiB, GiB,
/// TiB, PiB, EiB) unit, in either case. The result is 1 byte to 2^64 − 1 bytes (16 EiB less a
/// byte); anything else is an error that names the input.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!(
            "size '{s}' is negative: give a number of bytes of at least 1, with an optional unit (80GiB, 141GB, 1073741824)"
        ));
    }
    let t = t.strip_prefix('+').unwrap_or(t);
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let mult = match UNITS.iter().find(|(u, _)| *u == unit) {
        Some(&(_, m)) => m,
        None if unit.is_empty() => 1.0,
        None => {
            return Err(format!(
                "unknown size unit '{}' in '{s}' (use B, KB, MB, GB, TB, PB, EB, KiB, MiB, GiB, TiB, PiB or EiB, in either case)",
                unit_of(t, split)
            ))
        }
    };
    let out_of_range = || format!("size '{s}' is out of range (1 byte to 16 EiB less one byte)");
    // Whole byte counts are parsed exactly; a float would round the largest ones.
    if mult == 1.0 && !num.contains('.') {
        let v: u64 = match num.parse() {
            Ok(v) => v,
            Err(_) if !num.is_empty() && num.bytes().all(|b| b.is_ascii_digit()) => return Err(out_of_range()),
            Err(_) => return Err(not_a_size(s)),
        };
        return if v == 0 { Err(out_of_range()) } else { Ok(v) };
    }
    let v: f64 = num.parse().map_err(|_| not_a_size(s))?;
    let bytes = v * mult;
    // 2^64 as an f64 is exact; every f64 below it converts to a u64 without saturating.
    if !(1.0..18446744073709551616.0).contains(&bytes) {
        return Err(out_of_range());
    }
    Ok(bytes as u64)
}

fn unit_of(t: &str, split: usize) -> &str {
    t[split..].trim()
}

fn not_a_size(s: &str) -> String {
    format!("'{s}' is not a size (examples: 80GiB, 141GB, 1073741824)")
}

/// A size for people: `12.34 GiB`.
pub fn human(b: u64) -> String {
    const U: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
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

    #[test]
    fn units_are_case_insensitive_and_reach_eib() {
        assert_eq!(parse_size("8gb").unwrap(), 8_000_000_000);
        assert_eq!(parse_size("8Gb").unwrap(), 8_000_000_000);
        assert_eq!(parse_size("8gib").unwrap(), 8 << 30);
        assert_eq!(parse_size("8GIB").unwrap(), 8 << 30);
        assert_eq!(parse_size("2PiB").unwrap(), 2 << 50);
        assert_eq!(parse_size("1PB").unwrap(), 1_000_000_000_000_000);
        assert_eq!(parse_size("15EiB").unwrap(), 15 << 60);
        assert_eq!(parse_size("18EB").unwrap(), 18_000_000_000_000_000_000);
        assert_eq!(parse_size("1.5 KiB").unwrap(), 1536);
        assert_eq!(parse_size("512b").unwrap(), 512);
        assert_eq!(human(2 << 50), "2.00 PiB");
    }

    #[test]
    fn the_ends_of_the_range() {
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert!(parse_size("18446744073709551616").unwrap_err().contains("out of range"));
        assert!(parse_size("16EiB").unwrap_err().contains("out of range"));
        assert!(parse_size("19EB").unwrap_err().contains("out of range"));
        assert!(parse_size("0.5").unwrap_err().contains("out of range"));
        assert!(parse_size("0GiB").unwrap_err().contains("out of range"));
        assert!(parse_size("-1").unwrap_err().contains("negative"));
        assert!(parse_size("-8GiB").unwrap_err().contains("negative"));
        assert!(parse_size("").unwrap_err().contains("not a size"));
        assert!(parse_size("GiB").unwrap_err().contains("not a size"));
        assert!(parse_size("1.2.3GiB").unwrap_err().contains("not a size"));
    }
}
