//! No input makes a reader panic: truncated and corrupted copies of every
//! shared trace, in each format, give `Err` (or, rarely, a different `Ok`).
//!
//! A panic fails the test; so would a stack overflow or an allocation
//! failure, which abort the test binary.

mod common;

use common::{raw_pickle, shared, trace_path, Rng, TRACES};
use cudamem_trace::{read_bytes, read_compact, read_pickle, write_compact, ErrorKind};

/// ~50 cut points spread over `len`, plus the first few bytes.
fn cuts(len: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..50).map(|i| i * len / 50).collect();
    v.extend([1, 2, 3, 7, 8, 9, len.saturating_sub(1)]);
    v.sort_unstable();
    v.dedup();
    v.retain(|&c| c < len);
    v
}

/// Corrupt 1 to `max` random bytes.
fn flip(bytes: &[u8], rng: &mut Rng, max: usize) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for _ in 0..1 + rng.below(max) {
        let i = rng.below(b.len());
        b[i] ^= 1 << rng.below(8);
        if rng.below(4) == 0 {
            b[i] = rng.next() as u8;
        }
    }
    b
}

#[test]
fn truncated_and_corrupted_gzip_traces_never_panic() {
    let mut rng = Rng(0x5eed_0001);
    for name in TRACES {
        let gz = std::fs::read(trace_path(name)).unwrap();
        for c in cuts(gz.len()) {
            let r = read_bytes(&gz[..c], name);
            assert!(r.is_err(), "{name} cut at {c} should not load");
        }
        // Each flipped copy is decompressed in full before the CRC check, so
        // the big traces get fewer.
        let flips = if gz.len() > 150_000 { 4 } else { 40 };
        for _ in 0..flips {
            let _ = read_bytes(&flip(&gz, &mut rng, 3), name);
        }
    }
}

#[test]
fn truncated_and_corrupted_pickles_never_panic() {
    let mut rng = Rng(0x5eed_0002);
    for name in TRACES {
        let raw = raw_pickle(name);
        // Parsing stops at the cut, so cost grows with the cut: on the large
        // traces cut within the first 256 KiB; cut the small ones also just
        // before the STOP opcode.
        let span = raw.len().min(256 << 10);
        let mut points = cuts(span);
        if raw.len() < 2 << 20 {
            points.push(raw.len() - 1);
        }
        for c in points {
            let e = read_pickle(&raw[..c], name).unwrap_err();
            assert!(
                matches!(e.kind, ErrorKind::Pickle | ErrorKind::Schema),
                "{name} cut at {c}: {e}"
            );
        }
        // Whole-file flips cost a full parse each: many on the small traces,
        // none on the large ones (their head is fuzzed below).
        let flips = match raw.len() {
            n if n < 100_000 => 1500,
            n if n < 2_000_000 => 25,
            _ => 0,
        };
        for _ in 0..flips {
            let _ = read_pickle(&flip(raw, &mut rng, 4), name);
        }
    }
    // Flips concentrated in the first bytes of a big trace, where the
    // top-level structure is set up.
    let head = &raw_pickle("bert_varlen_infer")[..64 << 10];
    for _ in 0..150 {
        let mut b = head.to_vec();
        let i = rng.below(32 << 10);
        b[i] = rng.next() as u8;
        let _ = read_pickle(&b, "bert head");
    }
}

#[test]
fn truncated_and_corrupted_compact_files_never_panic() {
    let mut rng = Rng(0x5eed_0003);
    for name in TRACES {
        let mut bytes = Vec::new();
        write_compact(shared(name), &mut bytes).unwrap();
        for c in cuts(bytes.len()) {
            let e = read_compact(&bytes[..c], name).unwrap_err();
            if c >= 8 {
                assert_eq!(e.kind, ErrorKind::Truncated, "{name} cut at {c}: {e}");
                assert!(e.to_string().contains(&format!("truncated at byte {c} of")), "{e}");
            }
        }
        for _ in 0..50 {
            let r = read_compact(&flip(&bytes, &mut rng, 3), name);
            // The checksum catches every corruption of the body.
            assert!(r.is_err(), "{name}: corruption not detected");
        }
    }
}

#[test]
fn malformed_inputs_error_cleanly() {
    let cases: &[(&[u8], ErrorKind, &str)] = &[
        (b"", ErrorKind::UnknownFormat, "content is empty: not a trace"),
        (b"hello world", ErrorKind::UnknownFormat, "not a known trace format"),
        (b"\x1f\x8b\x08\x00", ErrorKind::Gzip, "gzip decode error"),
        (b"\x80\x04N.", ErrorKind::Schema, "snapshot is a None, expected dict"),
        (b"\x80\x04}\x94.", ErrorKind::Schema, ""), // empty dict: accepted? see below
        (
            b"\x80\x04\x8c\x08builtins\x94\x8c\x03set\x94\x93\x94)R.",
            ErrorKind::Pickle,
            "classes",
        ),
        (
            b"\x80\x04](K\x01e.",
            ErrorKind::Schema,
            "segments[0]: segment is a int, expected dict",
        ),
        (
            b"CUDAMEMT\x01\x00\x00\x00",
            ErrorKind::Truncated,
            "truncated at byte 12 of at least 32",
        ),
        (b"Thread,Time\n", ErrorKind::Csv, "lacks one of the columns"),
    ];
    for (input, kind, msg) in cases {
        match read_bytes(input, "case") {
            Ok(t) => {
                // Only the empty snapshot dict is a valid (empty) trace.
                assert_eq!(*input, &b"\x80\x04}\x94."[..]);
                assert_eq!(t.num_events(), 0);
            }
            Err(e) => {
                assert_eq!(e.kind, *kind, "{input:?}: {e}");
                assert!(e.to_string().contains(msg), "{input:?}: {e}");
                assert!(e.to_string().starts_with("case"), "{e}");
            }
        }
    }
}

#[test]
fn hostile_pickles_are_cheap() {
    // 2^200 copies if memo references were copied; shared here.
    // {'segments': l200} where l0 = [] and l(i+1) = [li, li].
    let mut p = vec![0x80, 4, b'}', 0x94, 0x8c, 8];
    p.extend_from_slice(b"segments");
    p.extend([0x94, b']', 0x94, b'0']);
    for i in 2..202u32 {
        p.push(b'(');
        p.push(b'j');
        p.extend_from_slice(&i.to_le_bytes());
        p.push(b'j');
        p.extend_from_slice(&i.to_le_bytes());
        p.extend([b'l', 0x94, b'0']);
    }
    p.push(b'j');
    p.extend_from_slice(&202u32.to_le_bytes());
    p.extend([b's', b'.']);
    let e = read_pickle(&p, "bomb").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Schema);
    // A million nested lists: no recursion anywhere.
    let mut p = vec![0x80, 4, b'}', 0x8c, 8];
    p.extend_from_slice(b"segments");
    p.resize(p.len() + 1_000_000, b']');
    p.resize(p.len() + 999_999, b'a');
    p.extend([b's', b'.']);
    let e = read_pickle(&p, "deep").unwrap_err();
    assert!(
        e.to_string().contains("segments[0]: segment is a list, expected dict"),
        "{e}"
    );
    // A list that contains itself, where a segment list is expected.
    let e = read_pickle(b"\x80\x04]\x94h\x00a.", "cycle").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Schema);
}
