//! Shared helpers: where the shared traces are, and a per-binary cache so
//! that each (large) trace is decoded once per test binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudamem_trace::Trace;

/// The shared traces, smallest first.
pub const TRACES: [&str; 5] = [
    "seed_example",
    "resnet50_train",
    "gpt2_train",
    "multistream_prefetch",
    "bert_varlen_infer",
];

/// `tests/data` at the repository root.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data")
}

pub fn trace_path(name: &str) -> PathBuf {
    data_dir().join(format!("{name}.pickle.gz"))
}

/// The shared trace `name`, read once.
pub fn shared(name: &str) -> &'static Trace {
    static CACHE: [OnceLock<Trace>; 5] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    let i = TRACES.iter().position(|n| *n == name).expect("known trace");
    CACHE[i].get_or_init(|| {
        cudamem_trace::read_path(&trace_path(name)).unwrap_or_else(|e| panic!("cannot read {name}: {e}"))
    })
}

/// The gunzipped pickle bytes of `name`, read once.
pub fn raw_pickle(name: &str) -> &'static [u8] {
    static CACHE: [OnceLock<Vec<u8>>; 5] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    let i = TRACES.iter().position(|n| *n == name).expect("known trace");
    CACHE[i].get_or_init(|| {
        let gz = std::fs::read(trace_path(name)).unwrap();
        cudamem_trace::gunzip(&gz, name).unwrap()
    })
}

/// A number from a flat stats JSON file (`"key": 123`), without a JSON crate.
pub fn stat(name: &str, key: &str) -> u64 {
    let path = data_dir().join(format!("{name}.native.stats.json"));
    let text = std::fs::read_to_string(&path).unwrap();
    let pat = format!("\"{key}\":");
    let at = text
        .find(&pat)
        .unwrap_or_else(|| panic!("{key} not in {}", path.display()))
        + pat.len();
    let digits: String = text[at..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().unwrap()
}

/// Deterministic xorshift64* for fuzzing.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}
