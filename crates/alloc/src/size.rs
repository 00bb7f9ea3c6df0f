//! Byte sizes written by people: `150109880320`, `80GB` (10^9), `80GiB` (2^30), `512MiB`,
//! `1.5TiB`, `8G` (2^30). One parser for every interface: the CLI's size options, the Rust
//! API's device strings (`sim:8GiB`) and the Python package's `CUDAMEM_DEVICE=sim:<size>`.
//!
//! Units, in either case, with or without blanks before them:
//! - decimal: `B`, `KB`, `MB`, `GB`, `TB`, `PB`, `EB` (powers of 1000);
//! - binary: `KiB`, `MiB`, `GiB`, `TiB`, `PiB`, `EiB` and the short forms `K`, `M`, `G`, `T`,
//!   `P`, `E` (powers of 1024).
//!
//! A number is digits with at most one decimal point (`1.5`, `.5`, `2.`); a leading `+` is
//! allowed. The value is computed exactly in integers and rounded down to whole bytes (decimal
//! places past the 19th are ignored). The result is 1 byte to 2^64 − 1 bytes (16 EiB less a
//! byte); anything else is a [`SizeError`] whose message names the input. Parsing never panics.

use std::fmt;

/// What a size may be, in one sentence for error messages and help texts: every message of a
/// [`SizeError`] ends with it, and the command line's size options quote it.
pub const UNITS_HELP: &str = "a bare number is bytes; decimal units KB, MB, GB, TB, PB, EB are \
     powers of 1000 (1GB = 10^9 bytes); binary units KiB, MiB, GiB, TiB, PiB, EiB are powers of 1024 \
     (1GiB = 2^30 bytes), and K, M, G, T, P, E are short for them (8G = 8GiB); either case; \
     e.g. 80GiB, 141GB, 1073741824";

/// The units, lower-cased, and their multipliers.
const UNITS: [(&str, u64); 19] = [
    ("b", 1),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("pb", 1_000_000_000_000_000),
    ("eb", 1_000_000_000_000_000_000),
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
    ("pib", 1 << 50),
    ("eib", 1 << 60),
    ("k", 1 << 10),
    ("m", 1 << 20),
    ("g", 1 << 30),
    ("t", 1 << 40),
    ("p", 1 << 50),
    ("e", 1 << 60),
];

/// The most decimal places that count; later ones are ignored (they change the result by less
/// than a byte: 10^-19 of the largest unit, 2^60 bytes, is 0.12 bytes).
const MAX_DECIMALS: usize = 19;

/// Why a size was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeErrorKind {
    /// A minus sign.
    Negative,
    /// A unit that is not one of the module's units.
    UnknownUnit(String),
    /// Zero bytes, or more than 2^64 − 1.
    OutOfRange,
    /// No number, or not a number.
    NotASize,
}

/// A rejected size: the input and why. `Display` gives a message that names the input and
/// says what is accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeError {
    input: String,
    kind: SizeErrorKind,
}

impl SizeError {
    /// The text that was rejected, as given.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// Why it was rejected.
    pub fn kind(&self) -> &SizeErrorKind {
        &self.kind
    }
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.input;
        match &self.kind {
            SizeErrorKind::Negative => write!(f, "size '{s}' is negative"),
            SizeErrorKind::UnknownUnit(u) => write!(f, "unknown size unit '{u}' in '{s}'"),
            SizeErrorKind::OutOfRange => write!(f, "size '{s}' is out of range (1 byte to 16 EiB less one byte)"),
            SizeErrorKind::NotASize => write!(f, "'{s}' is not a size"),
        }?;
        write!(f, " ({UNITS_HELP})")
    }
}

impl std::error::Error for SizeError {}

/// Parses a size (see the [module documentation](self)): a number of bytes from 1 to
/// 2^64 − 1.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let err = |kind| SizeError {
        input: s.to_string(),
        kind,
    };
    let t = s.trim();
    if t.starts_with('-') {
        return Err(err(SizeErrorKind::Negative));
    }
    let t = t.strip_prefix('+').unwrap_or(t);
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(err(SizeErrorKind::NotASize));
    }
    let unit = unit.trim();
    let mult = match UNITS.iter().find(|(u, _)| unit.eq_ignore_ascii_case(u)) {
        Some(&(_, m)) => m,
        None if unit.is_empty() => 1,
        None => return Err(err(SizeErrorKind::UnknownUnit(unit.to_string()))),
    };
    // Only digits remain: the split above stopped at the first other character.
    let int: u128 = if int.is_empty() {
        0
    } else {
        match int.parse::<u64>() {
            Ok(v) => v.into(),
            Err(_) => return Err(err(SizeErrorKind::OutOfRange)),
        }
    };
    let frac = &frac[..frac.len().min(MAX_DECIMALS)];
    let frac_bytes = if frac.is_empty() {
        0
    } else {
        let digits: u128 = frac.parse().map_err(|_| err(SizeErrorKind::NotASize))?;
        // Below 10^19 · 2^60 < 2^124: no overflow.
        digits * u128::from(mult) / 10u128.pow(frac.len() as u32)
    };
    // int < 2^64 and mult ≤ 2^60: below 2^124.
    let bytes = int * u128::from(mult) + frac_bytes;
    match u64::try_from(bytes) {
        Ok(0) | Err(_) => Err(err(SizeErrorKind::OutOfRange)),
        Ok(v) => Ok(v),
    }
}

/// A size for people, in binary units with two decimals: `12.34 GiB`, `512 B`.
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

    fn msg(s: &str) -> String {
        parse_size(s).unwrap_err().to_string()
    }

    #[test]
    fn sizes_parse_and_bad_ones_are_named() {
        assert_eq!(parse_size("80GiB").unwrap(), 80 << 30);
        assert_eq!(parse_size("141GB").unwrap(), 141_000_000_000);
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size(" +8 GiB ").unwrap(), 8 << 30);
        assert!(msg("12XB").contains("unknown size unit 'XB' in '12XB'"));
        assert!(msg("abc").contains("'abc' is not a size"));
        // Every message says what a bare number means and which units are decimal.
        for bad in ["12XB", "abc", "0", "-1"] {
            let m = msg(bad);
            assert!(
                m.contains("a bare number is bytes") && m.contains("1GB = 10^9") && m.contains("8G = 8GiB"),
                "{m}"
            );
        }
        assert_eq!(parse_size("0").unwrap_err().kind(), &SizeErrorKind::OutOfRange);
        assert_eq!(human(3 << 30), "3.00 GiB");
        assert_eq!(human(512), "512 B");
    }

    #[test]
    fn units_are_case_insensitive_and_reach_eib() {
        assert_eq!(parse_size("8gb").unwrap(), 8_000_000_000);
        assert_eq!(parse_size("8Gb").unwrap(), 8_000_000_000);
        assert_eq!(parse_size("8gib").unwrap(), 8 << 30);
        assert_eq!(parse_size("8GIB").unwrap(), 8 << 30);
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("8 k").unwrap(), 8 << 10);
        assert_eq!(parse_size("2PiB").unwrap(), 2 << 50);
        assert_eq!(parse_size("1PB").unwrap(), 1_000_000_000_000_000);
        assert_eq!(parse_size("15EiB").unwrap(), 15 << 60);
        assert_eq!(parse_size("18EB").unwrap(), 18_000_000_000_000_000_000);
        assert_eq!(parse_size("512b").unwrap(), 512);
        assert_eq!(human(2 << 50), "2.00 PiB");
    }

    #[test]
    fn fractions_are_exact_and_round_down() {
        assert_eq!(parse_size("1.5 KiB").unwrap(), 1536);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size(".5GiB").unwrap(), 1 << 29);
        assert_eq!(parse_size("2.GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.9").unwrap(), 1);
        assert_eq!(parse_size("0.1KB").unwrap(), 100);
        // A float would round this one: 2^53 + 1 bytes.
        assert_eq!(parse_size("9007199254740993").unwrap(), 9007199254740993);
        assert_eq!(parse_size("15.999999999999999999999999EiB").unwrap(), u64::MAX);
    }

    #[test]
    fn the_ends_of_the_range() {
        assert_eq!(parse_size("1").unwrap(), 1);
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert!(msg("18446744073709551616").contains("out of range"));
        assert!(msg("99999999999999999999999999").contains("out of range"));
        assert!(msg("16EiB").contains("out of range"));
        assert!(msg("19EB").contains("out of range"));
        assert!(msg("99999999999999TiB").contains("out of range"));
        assert!(msg("0.5").contains("out of range"));
        assert!(msg("0GiB").contains("out of range"));
        assert!(msg("-1").contains("negative"));
        assert!(msg("-8GiB").contains("negative"));
        for bad in ["", " ", "GiB", ".", ".GiB", "1.2.3GiB", "+", "+-1", "1,5GiB", "0x10"] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
        assert!(msg("").contains("not a size"));
        assert!(msg("1.2.3GiB").contains("not a size"));
    }

    #[test]
    fn odd_inputs_never_panic() {
        for s in [
            "\u{1F600}",
            "1\u{1F600}",
            "8 GiB GiB",
            "1e9",
            "٣",
            "1.\u{a0}5",
            "9".repeat(400).as_str(),
        ] {
            let _ = parse_size(s);
        }
    }
}
