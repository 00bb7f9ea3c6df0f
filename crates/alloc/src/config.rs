//! The allocator configuration, parsed from PyTorch's `PYTORCH_CUDA_ALLOC_CONF`
//! syntax.
//!
//! A configuration string is a comma-separated list of `key:value` pairs;
//! a value is one token or a bracketed list (`roundup_power2_divisions:
//! [1:8,256:4,>:1]`). As in PyTorch's `ConfigTokenizer`, every whitespace
//! character is dropped before tokenizing (also inside tokens), a trailing
//! comma is accepted. Booleans are exactly `True` or `False`.
//!
//! [`AllocatorConfig`] holds PyTorch's defaults and keys (those of
//! `AcceleratorAllocatorConfig` and `CUDAAllocatorConfig`, with the HIP
//! aliases `release_lock_on_hipmalloc` and `pinned_use_hip_host_register`),
//! plus two keys of cudamem's own, `policy` and `sharded`. It also implements PyTorch's
//! `round_size`, the first rounding of every request, because that rounding
//! is driven by `roundup_power2_divisions`.
//!
//! Guarantees:
//! - Parsing never panics, whatever the input; every rejection is a
//!   [`ConfigError`] whose message names the key and the offending value.
//! - Values PyTorch accepts are accepted with PyTorch's meaning, limits and
//!   clamping (e.g. `max_split_size_mb` at least `large_segment_size_mb`,
//!   huge MiB counts clamped instead of overflowing). cudamem is stricter in
//!   in two ways: a number must be all digits, where C++'s `stoull` would
//!   accept `20abc` as 20 or `-1` as 2^64-1; and a key may appear only once
//!   in one string (a HIP alias counts as its CUDA key), where PyTorch lets
//!   the last one win. [`AllocatorConfig::apply`] still sets keys that the
//!   configuration it applies to was parsed with: the rule is per string.
//! - [`AllocatorConfig::apply`] has PyTorch's runtime semantics
//!   (`torch._C._accelerator_setAllocatorSettings`) and is atomic: on error
//!   the configuration is unchanged.
//! - [`AllocatorConfig::round_size`] never panics or wraps for any `u64`:
//!   a rounded size that would exceed `u64::MAX` saturates to `u64::MAX`
//!   (no device can satisfy it, so it ends in an out-of-memory error).
//!
//! Where each part lives: this file, the configuration, its errors, the entry points (`parse`,
//! `from_env`, `apply`) and PyTorch's `allocator_settings` view; `config/syntax.rs`, the
//! tokenizer and the entries of a string; `config/apply.rs`, each key's meaning and limits;
//! `config/rounding.rs`, `round_size`.

use std::fmt;
use std::str::FromStr;

mod apply;
mod rounding;
mod syntax;

use apply::*;
#[cfg(test)]
use rounding::roundup_power2_next_division;
use syntax::*;

/// One MiB, the unit of every `*_mb` key.
pub const MIB: u64 = 1 << 20;
/// PyTorch's `kMinBlockSize`: every block size is a multiple of 512 bytes.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// PyTorch's `kLargeBuffer`: default large segment size, 20 MiB.
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// PyTorch's `kMinLargeAlloc`: `large_segment_size_mb` must exceed this.
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Number of `roundup_power2_divisions` buckets, covering 1 MiB to 64 GiB.
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;
/// PyTorch's `pinned_max_register_threads()`.
pub const MAX_REGISTER_THREADS: u64 = 128;

/// Environment variables [`AllocatorConfig::from_env`] reads, in priority
/// order: cudamem's own, then PyTorch's (`PYTORCH_CUDA_ALLOC_CONF`, its HIP
/// spelling, then the unified `PYTORCH_ALLOC_CONF`, PyTorch's own order).
pub const ENV_VARS: [&str; 4] = [
    "CUDAMEM_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
];

/// Which allocator serves device memory (`backend` key).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The caching allocator (`backend:native`), the default.
    #[default]
    Native,
    /// CUDA's stream-ordered allocator (`backend:cudaMallocAsync`); PyTorch
    /// ignores the native-only options under it.
    CudaMallocAsync,
}

impl Backend {
    /// The name PyTorch uses in the config and in `get_allocator_backend()`.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Native => "native",
            Backend::CudaMallocAsync => "cudaMallocAsync",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The allocator configuration. Field defaults are PyTorch's.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    /// Largest block size that may be split, in bytes (`max_split_size_mb`).
    /// `u64::MAX` means unlimited (the default).
    pub max_split_size: u64,
    /// How far above the request an unsplittable cached block may be and
    /// still be used, in bytes (`max_non_split_rounding_mb`; default
    /// 20 MiB, i.e. `large_segment_size`).
    pub max_non_split_rounding: u64,
    /// Divisions per power-of-two interval for `round_size`; bucket `i`
    /// covers sizes in `[2^(20+i), 2^(21+i))`, bucket 0 also everything
    /// below 1 MiB and bucket 15 everything from 32 GiB. 0 or 1 means plain
    /// 512-byte rounding (the default).
    pub roundup_power2_divisions: [u64; ROUNDUP_POWER2_INTERVALS],
    /// Fraction of the allowed memory above which cached blocks are freed,
    /// oldest first (`garbage_collection_threshold`). 0.0 (default) is off;
    /// PyTorch only acts on it when a memory fraction limit is set.
    pub garbage_collection_threshold: f64,
    /// Grow segments by mapping pages instead of allocating new ones
    /// (`expandable_segments`).
    pub expandable_segments: bool,
    /// Drop the allocator lock around `cudaMalloc`
    /// (`release_lock_on_cudamalloc`, alias `release_lock_on_hipmalloc`).
    pub release_lock_on_cudamalloc: bool,
    /// Pinned host memory via `malloc` + `cudaHostRegister`
    /// (`pinned_use_cuda_host_register`, alias `pinned_use_hip_host_register`).
    pub pinned_use_cuda_host_register: bool,
    /// Threads registering pinned pages; a power of two up to 128, default 1.
    pub pinned_num_register_threads: u64,
    /// Process pinned-memory events on a background thread
    /// (`pinned_use_background_threads`).
    pub pinned_use_background_threads: bool,
    /// Size of the pinned reserve segment in MiB
    /// (`pinned_reserve_segment_size_mb`); 0 (default) means none, a set
    /// value must be greater than 0.
    pub pinned_reserve_segment_size_mb: u64,
    /// Let a graph capture reuse blocks freed on other streams
    /// (`graph_capture_record_stream_reuse`).
    pub graph_capture_record_stream_reuse: bool,
    /// Segment size for requests between 1 and 10 MiB, in bytes
    /// (`large_segment_size_mb`, must be greater than 10; default 20 MiB).
    pub large_segment_size: u64,
    /// Fraction of device memory the process may use, in [0, 1]
    /// (`per_process_memory_fraction`, default 1.0 = no limit).
    pub per_process_memory_fraction: f64,
    /// The allocator backend (`backend`), fixed when the process starts.
    pub backend: Backend,
    /// cudamem only: the name of the allocation policy to run (`policy`),
    /// e.g. `pytorch`, `pytorch-expandable` or `cudamem`. Only the name is
    /// stored here; the engine validates it when it builds the allocator.
    /// `None` (default) lets the engine choose.
    pub policy: Option<String>,
    /// cudamem only (`sharded:True`): give each group of streams its own engine and lock
    /// (the `cudamem-sharded` crate), so that threads on their own streams do not wait for each other.
    /// Read when an allocator is built (the Rust API); default false.
    pub sharded: bool,
    /// The last settings string, exactly as given, whitespace included;
    /// PyTorch reports it as `allocator_settings["PYTORCH_CUDA_ALLOC_CONF"]`.
    pub settings: String,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_POWER2_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            pinned_reserve_segment_size_mb: 0,
            graph_capture_record_stream_reuse: false,
            large_segment_size: LARGE_BUFFER,
            per_process_memory_fraction: 1.0,
            backend: Backend::Native,
            policy: None,
            sharded: false,
            settings: String::new(),
        }
    }
}

/// A rejected configuration string. The message always names the key (or,
/// for syntax errors, the whole string) and the offending value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    key: String,
    message: String,
}

impl ConfigError {
    fn new(key: &str, message: String) -> Self {
        ConfigError {
            key: key.to_string(),
            message,
        }
    }

    /// The key the error is about, as written (an alias stays an alias);
    /// empty for syntax errors not tied to a key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The full message, the same text as `Display`.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A value of PyTorch's `allocator_settings` dict (see
/// [`AllocatorConfig::to_settings_map`]).
#[derive(Clone, Debug, PartialEq)]
pub enum SettingValue {
    /// A Python `str`.
    Str(String),
    /// A Python `int`.
    Int(i64),
    /// A Python `float`.
    Float(f64),
    /// A Python `bool`.
    Bool(bool),
    /// A Python `dict` of `str` to `int`, in insertion order.
    Map(Vec<(String, i64)>),
}

impl FromStr for AllocatorConfig {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AllocatorConfig::parse(s)
    }
}

impl AllocatorConfig {
    /// Parses a configuration string on top of the defaults, as PyTorch does
    /// with its environment variable when the process starts (so `backend`
    /// may be chosen here). An empty string gives the defaults.
    pub fn parse(s: &str) -> Result<AllocatorConfig, ConfigError> {
        let mut config = AllocatorConfig::default();
        config.apply_inner(s, true)?;
        Ok(config)
    }

    /// Reads the first of [`ENV_VARS`] that is set (`CUDAMEM_ALLOC_CONF`,
    /// `PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_HIP_ALLOC_CONF`,
    /// `PYTORCH_ALLOC_CONF`) and parses it. As in PyTorch, a variable that is
    /// set but empty still wins and gives the defaults; none set gives the
    /// defaults. An error's message starts with the variable's name.
    pub fn from_env() -> Result<AllocatorConfig, ConfigError> {
        for var in ENV_VARS {
            if let Some(value) = std::env::var_os(var) {
                let text = value
                    .to_str()
                    .ok_or_else(|| ConfigError::new(var, format!("{var}: value {value:?} is not valid UTF-8")))?;
                return AllocatorConfig::parse_var(var, text);
            }
        }
        Ok(AllocatorConfig::default())
    }

    /// [`from_env`](Self::from_env) with the environment given as a lookup
    /// function, for callers (and tests) that must not touch the process
    /// environment.
    pub fn from_env_with(mut lookup: impl FnMut(&str) -> Option<String>) -> Result<AllocatorConfig, ConfigError> {
        for var in ENV_VARS {
            if let Some(value) = lookup(var) {
                return AllocatorConfig::parse_var(var, &value);
            }
        }
        Ok(AllocatorConfig::default())
    }

    /// [`parse`](Self::parse) of the value of the environment variable `var`:
    /// an error's message starts with the variable's name; its key is the
    /// parser's.
    fn parse_var(var: &str, value: &str) -> Result<AllocatorConfig, ConfigError> {
        AllocatorConfig::parse(value).map_err(|e| ConfigError {
            message: format!("{var}: {}", e.message),
            key: e.key,
        })
    }

    /// Applies a settings string at runtime, as PyTorch's
    /// `torch._C._accelerator_setAllocatorSettings` (formerly
    /// `torch.cuda.memory._set_allocator_settings`) does:
    ///
    /// - `max_split_size`, `roundup_power2_divisions` and
    ///   `garbage_collection_threshold` first go back to their defaults, and
    ///   `max_non_split_rounding` to `large_segment_size` (PyTorch resets it
    ///   too, since `large_segment_size_mb` became a key); every other field
    ///   keeps its value unless the string sets it;
    /// - `large_segment_size_mb` is applied before the other keys, wherever
    ///   it appears, because it is the minimum of `max_split_size_mb` and
    ///   `max_non_split_rounding_mb`;
    /// - `settings` becomes `s`;
    /// - `backend` cannot change at runtime: naming another backend than the
    ///   current one is an error (PyTorch asserts the same).
    ///
    /// On error nothing changes.
    pub fn apply(&mut self, s: &str) -> Result<(), ConfigError> {
        let mut next = self.clone();
        next.apply_inner(s, false)?;
        *self = next;
        Ok(())
    }

    /// Applies the keys of `s` over this configuration, leaving every other field (and the
    /// `settings` string) as it is: the settings a policy name implies (see
    /// [`crate::policy::registry`]).
    pub(crate) fn apply_over(&mut self, s: &str) -> Result<(), ConfigError> {
        let mut next = self.clone();
        for entry in &parse_entries(s)? {
            next.apply_entry(entry, false)?;
        }
        *self = next;
        Ok(())
    }

    fn apply_inner(&mut self, s: &str, at_startup: bool) -> Result<(), ConfigError> {
        let entries = parse_entries(s)?;

        self.max_split_size = u64::MAX;
        self.roundup_power2_divisions = [0; ROUNDUP_POWER2_INTERVALS];
        self.garbage_collection_threshold = 0.0;
        self.settings = s.to_string();

        // PyTorch's first pass: the large segment size bounds other keys.
        for entry in entries.iter().filter(|e| e.key == "large_segment_size_mb") {
            let mb = entry.scalar()?;
            let val = parse_u64(&entry.key, mb)?;
            if val <= MIN_LARGE_ALLOC / MIB {
                return Err(entry.error(format!("'{mb}' must be greater than {} MiB", MIN_LARGE_ALLOC / MIB)));
            }
            self.large_segment_size = mib_to_bytes_clamped(val);
        }
        self.max_non_split_rounding = self.large_segment_size;

        for entry in &entries {
            self.apply_entry(entry, at_startup)?;
        }
        Ok(())
    }

    /// PyTorch's `allocator_settings` dict (from `torch.cuda.memory._snapshot()`),
    /// in PyTorch's order: `PYTORCH_CUDA_ALLOC_CONF` (the last settings
    /// string), `max_split_size` (-1 when unlimited: PyTorch casts `SIZE_MAX`
    /// to `int64_t`), `garbage_collection_threshold`, `expandable_segments`,
    /// `pinned_num_register_threads`, `release_lock_on_cudamalloc`,
    /// `pinned_use_cuda_host_register`, `graph_capture_record_stream_reuse`
    /// and `roundup_power2_divisions`, a map from each bucket's first size in
    /// MiB ("1", "2", ..., "32768") to its divisions.
    pub fn to_settings_map(&self) -> Vec<(String, SettingValue)> {
        let roundup = self
            .roundup_power2_divisions
            .iter()
            .enumerate()
            .map(|(i, &d)| ((1u64 << i).to_string(), d as i64))
            .collect();
        vec![
            (
                "PYTORCH_CUDA_ALLOC_CONF".into(),
                SettingValue::Str(self.settings.clone()),
            ),
            // `as` wraps like C++'s static_cast<int64_t>: u64::MAX is -1.
            ("max_split_size".into(), SettingValue::Int(self.max_split_size as i64)),
            (
                "garbage_collection_threshold".into(),
                SettingValue::Float(self.garbage_collection_threshold),
            ),
            (
                "expandable_segments".into(),
                SettingValue::Bool(self.expandable_segments),
            ),
            (
                "pinned_num_register_threads".into(),
                SettingValue::Int(self.pinned_num_register_threads as i64),
            ),
            (
                "release_lock_on_cudamalloc".into(),
                SettingValue::Bool(self.release_lock_on_cudamalloc),
            ),
            (
                "pinned_use_cuda_host_register".into(),
                SettingValue::Bool(self.pinned_use_cuda_host_register),
            ),
            (
                "graph_capture_record_stream_reuse".into(),
                SettingValue::Bool(self.graph_capture_record_stream_reuse),
            ),
            ("roundup_power2_divisions".into(), SettingValue::Map(roundup)),
        ]
    }
}

#[cfg(test)]
mod tests;
