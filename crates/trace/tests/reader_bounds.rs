//! The readers stay within bounds on adversarial input: whatever bytes a file holds, reading it
//! through the one entry point every command uses (`read_path_limited`) returns — an error or a
//! trace, never a panic — and allocates memory in proportion to the bytes admitted, however large
//! the lengths, counts and sizes the input claims.
//!
//! How: a counting global allocator records the peak of live heap bytes during each read;
//! proptest generates inputs of several shapes — random bytes; the first bytes of each real
//! format (a gzip header, a pickle protocol header, an RMM CSV header, a compact trace) followed
//! by noise; pickle opcodes that claim huge strings, lists or memo indices; real traces cut and
//! corrupted — each written to a file and read with a small byte limit. The bound checked is
//! `PEAK_PER_BYTE` times the limit plus a constant, the "linear in what the limits admit"
//! promise of `cudamem_trace::input`.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use proptest::prelude::*;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            if new_size >= layout.size() {
                let now = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size - layout.size();
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The limit on one trace's bytes in these reads.
const LIMIT: u64 = 256 << 10;
/// Heap bytes a read may hold at its peak per byte admitted, beyond [`BASE`]: decoded traces are
/// larger than their bytes (a few dozen bytes of structs per event), never by orders of magnitude.
const PEAK_PER_BYTE: usize = 64;
const BASE: usize = 8 << 20;

/// One read at a time, so that the peak belongs to it (tests run on several threads).
static ONE: Mutex<()> = Mutex::new(());
static FILES: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to a fresh file, reads it, and returns the peak of live heap bytes above what
/// was live before the read, and whether it read.
fn read_peak(bytes: &[u8]) -> (usize, bool) {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("cudamem-reader-bounds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join(format!("input-{}", FILES.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&path, bytes).unwrap();
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let result = cudamem_trace::read_path_limited(&path, LIMIT);
    let ok = result.is_ok();
    drop(result);
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    std::fs::remove_file(&path).ok();
    (peak, ok)
}

fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let (peak, _) = read_peak(bytes);
    let bound = PEAK_PER_BYTE * LIMIT as usize + BASE;
    prop_assert!(
        peak <= bound,
        "{} input bytes: the read peaked at {peak} heap bytes (bound {bound})",
        bytes.len()
    );
    Ok(())
}

/// The first bytes of each format a trace file can have.
fn heads() -> Vec<Vec<u8>> {
    let gz = std::fs::read(common::trace_path("seed_example")).unwrap();
    vec![
        gz[..10].to_vec(),                                    // a gzip member header
        vec![0x80, 0x04, 0x95],                               // pickle protocol 4, a frame
        vec![0x80, 0x02],                                     // pickle protocol 2
        b"Thread,Time,Action,Pointer,Size,Stream\n".to_vec(), // RMM's log header
        b"CUDAMEMT".to_vec(),                                 // the compact format's magic
    ]
}

/// Pickle opcodes that claim much and deliver little: long strings and bytes, big frames,
/// memo lookups, deep nesting.
fn claims() -> impl Strategy<Value = Vec<u8>> {
    let op = prop_oneof![
        any::<u32>().prop_map(|n| [&[0x8d_u8][..], &(n as u64).to_le_bytes()].concat()), // BINUNICODE8
        any::<u32>().prop_map(|n| [&[0x8e_u8][..], &(n as u64).to_le_bytes()].concat()), // BINBYTES8
        any::<u32>().prop_map(|n| [&[0x58_u8][..], &n.to_le_bytes()].concat()),          // BINUNICODE
        any::<u32>().prop_map(|n| [&[0x95_u8][..], &(n as u64).to_le_bytes()].concat()), // FRAME
        any::<u32>().prop_map(|n| [&[0x6a_u8][..], &n.to_le_bytes()].concat()),          // LONG_BINGET
        Just(vec![0x28]),                                                                // MARK
        Just(vec![0x5d]),                                                                // EMPTY_LIST
        Just(vec![0x7d]),                                                                // EMPTY_DICT
        Just(vec![0x65]),                                                                // APPENDS
        Just(vec![0x94]),                                                                // MEMOIZE
    ];
    proptest::collection::vec(op, 1..64).prop_map(|ops| [vec![0x80, 0x04], ops.concat()].concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..(64 << 10))) {
        check(&bytes)?;
    }

    #[test]
    fn a_known_head_then_noise(which in 0..5usize, noise in proptest::collection::vec(any::<u8>(), 0..(64 << 10))) {
        let head = &heads()[which];
        check(&[head.as_slice(), &noise].concat())?;
    }

    #[test]
    fn pickles_that_claim_huge_things(bytes in claims()) {
        check(&bytes)?;
    }

    #[test]
    fn a_real_trace_cut_and_corrupted(cut in 0.0f64..1.0, flips in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 0..16)) {
        let mut bytes = common::raw_pickle("seed_example").to_vec();
        bytes.truncate(((bytes.len() as f64) * cut) as usize);
        let len = bytes.len();
        for (at, v) in flips {
            if len > 0 {
                bytes[((len as f64) * at) as usize % len] = v;
            }
        }
        check(&bytes)?;
    }
}

/// Past the limit nothing more is read: an input twice the limit is refused as too large, and
/// the read's peak stays within the bound.
#[test]
fn input_past_the_limit_is_refused_within_the_bound() {
    let mut bytes = b"Thread,Time,Action,Pointer,Size,Stream\n".to_vec();
    while bytes.len() < 2 * LIMIT as usize {
        bytes.extend_from_slice(b"1,2,allocate,0x7f0000000000,512,0x0\n");
    }
    let (peak, ok) = read_peak(&bytes);
    assert!(!ok, "an input past the limit is refused");
    assert!(peak <= PEAK_PER_BYTE * LIMIT as usize + BASE, "peak {peak}");
}

/// A gzip bomb: a small file that expands past the limit is refused within the bound.
#[test]
fn a_gzip_bomb_is_refused_within_the_bound() {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let mut plain = vec![0x80_u8, 0x04];
    plain.resize(16 * LIMIT as usize, b'N');
    enc.write_all(&plain).unwrap();
    let gz = enc.finish().unwrap();
    assert!((gz.len() as u64) < LIMIT, "the bomb itself is within the limit");
    let (peak, ok) = read_peak(&gz);
    assert!(!ok, "what it expands to is past the limit");
    assert!(peak <= PEAK_PER_BYTE * LIMIT as usize + BASE, "peak {peak}");
}

/// The bound is not vacuous: reading a real trace within the limit allocates, and that is counted.
#[test]
fn the_counter_sees_a_real_read() {
    let bytes = std::fs::read(common::trace_path("seed_example")).unwrap();
    assert!((bytes.len() as u64) < LIMIT, "the seed trace fits the test's limit");
    let (peak, ok) = read_peak(&bytes);
    assert!(ok, "the seed trace reads");
    assert!(peak > bytes.len(), "peak {peak} for {} bytes", bytes.len());
}
