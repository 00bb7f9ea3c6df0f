//! The out-of-memory message, character for character against torch 2.11's on an H200
//! (`tests/data/goldens.json`: `oom_huge`, `oom_fraction`, `oom_fraction2`), with the numbers
//! PyTorch had at the time.

use cudamem_alloc::OutOfMemory;

fn goldens() -> serde_json::Value {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/goldens.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

const TOTAL: u64 = 150_109_880_320; // an H200, as cudaMemGetInfo reports it
const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

fn oom(tried: u64, free: f64, process: f64, allowed: Option<u64>, allocated: f64, unallocated: f64) -> OutOfMemory {
    let allocated = (allocated * MIB) as u64;
    OutOfMemory {
        device: 0,
        requested: tried,
        tried,
        total: TOTAL,
        free: (free * GIB) as u64,
        process_used: (process * GIB) as u64,
        allowed,
        allocated,
        reserved: allocated + (unallocated * MIB) as u64,
        largest_free_block: 0,
        over_one_exabyte: false,
        not_moved_during_capture: false,
    }
}

#[test]
fn messages_match_pytorchs() {
    let g = goldens();
    let huge = oom(400 << 30, 138.73, 1.06, None, 282.73, 45.27);
    assert_eq!(huge.pytorch_message(), g["oom_huge.message"].as_str().unwrap());
    let allowed = Some((0.05 * TOTAL as f64) as u64);
    let frac = oom(10 << 30, 138.73, 1.06, allowed, 282.73, 45.27);
    assert_eq!(frac.pytorch_message(), g["oom_fraction.message"].as_str().unwrap());
    let frac2 = oom(512 << 20, 132.23, 7.56, allowed, 6.78 * 1024.0, 45.27);
    assert_eq!(frac2.pytorch_message(), g["oom_fraction2.message"].as_str().unwrap());
}

#[test]
fn the_display_adds_cudamems_diagnosis_after_pytorchs_text() {
    let mut o = oom(400 << 30, 138.73, 1.06, None, 282.73, 45.27);
    o.largest_free_block = 20 << 20;
    let s = o.to_string();
    assert!(s.starts_with(&o.pytorch_message()));
    assert!(s.contains("largest free cached block 20.00 MiB"), "{s}");
    assert!((o.fragmentation() - (1.0 - 20.0 / 45.27)).abs() < 0.01);
}
