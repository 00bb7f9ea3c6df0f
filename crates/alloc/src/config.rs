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

use std::fmt;
use std::str::FromStr;

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
    /// defaults.
    pub fn from_env() -> Result<AllocatorConfig, ConfigError> {
        for var in ENV_VARS {
            if let Some(value) = std::env::var_os(var) {
                let text = value
                    .to_str()
                    .ok_or_else(|| ConfigError::new(var, format!("{var}: value {value:?} is not valid UTF-8")))?;
                return AllocatorConfig::parse(text);
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
                return AllocatorConfig::parse(&value);
            }
        }
        Ok(AllocatorConfig::default())
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

    fn apply_entry(&mut self, entry: &Entry, at_startup: bool) -> Result<(), ConfigError> {
        let key = entry.key.as_str();
        match key {
            "large_segment_size_mb" => {} // applied in the first pass
            "max_split_size_mb" | "max_non_split_rounding_mb" => {
                let mb = entry.scalar()?;
                let val = parse_u64(key, mb)?;
                let min_mb = self.large_segment_size / MIB;
                if val < min_mb {
                    return Err(entry.error(format!("'{mb}' is below the minimum of {min_mb} MiB")));
                }
                let bytes = mib_to_bytes_clamped(val);
                if key == "max_split_size_mb" {
                    self.max_split_size = bytes;
                } else {
                    self.max_non_split_rounding = bytes;
                }
            }
            "garbage_collection_threshold" => {
                let text = entry.scalar()?;
                let val = parse_f64(key, text)?;
                // Written so that NaN fails too.
                if !(val > 0.0 && val < 1.0) {
                    return Err(entry.error(format!("'{text}' must be greater than 0.0 and less than 1.0")));
                }
                self.garbage_collection_threshold = val;
            }
            "per_process_memory_fraction" => {
                let text = entry.scalar()?;
                let val = parse_f64(key, text)?;
                if !(0.0..=1.0).contains(&val) {
                    return Err(entry.error(format!("'{text}' must be between 0.0 and 1.0")));
                }
                self.per_process_memory_fraction = val;
            }
            "roundup_power2_divisions" => {
                self.roundup_power2_divisions = parse_roundup(entry)?;
            }
            "expandable_segments" => self.expandable_segments = entry.boolean()?,
            "pinned_use_background_threads" => self.pinned_use_background_threads = entry.boolean()?,
            "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                self.release_lock_on_cudamalloc = entry.boolean()?
            }
            "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                self.pinned_use_cuda_host_register = entry.boolean()?
            }
            "graph_capture_record_stream_reuse" => self.graph_capture_record_stream_reuse = entry.boolean()?,
            "pinned_num_register_threads" => {
                let text = entry.scalar()?;
                let val = parse_u64(key, text)?;
                if !val.is_power_of_two() {
                    return Err(entry.error(format!("'{text}' must be a power of two")));
                }
                if val > MAX_REGISTER_THREADS {
                    return Err(entry.error(format!("'{text}' exceeds the maximum of {MAX_REGISTER_THREADS}")));
                }
                self.pinned_num_register_threads = val;
            }
            "pinned_reserve_segment_size_mb" => {
                let text = entry.scalar()?;
                let val = parse_u64(key, text)?;
                if val == 0 {
                    return Err(entry.error(format!("'{text}' must be greater than 0")));
                }
                self.pinned_reserve_segment_size_mb = val;
            }
            "backend" => {
                let text = entry.scalar()?;
                let backend = match text {
                    "native" => Backend::Native,
                    "cudaMallocAsync" => Backend::CudaMallocAsync,
                    _ => {
                        return Err(entry.error(format!("unknown backend '{text}', expected native or cudaMallocAsync")))
                    }
                };
                if !at_startup && backend != self.backend {
                    return Err(entry.error(format!(
                        "'{text}' differs from the backend chosen at startup, '{}'; \
                         the backend cannot change at runtime",
                        self.backend
                    )));
                }
                self.backend = backend;
            }
            "policy" => self.policy = Some(entry.scalar()?.to_string()),
            "sharded" => self.sharded = entry.boolean()?,
            _ => {
                return Err(ConfigError::new(
                    key,
                    format!("unrecognized key '{key}' in allocator config '{}'", entry.source),
                ))
            }
        }
        Ok(())
    }

    /// The bucket of `roundup_power2_divisions` that applies to `size`:
    /// `floor(log2(size)) - 20`, clamped to 0..=15 (sizes below 2 MiB use
    /// bucket 0, sizes from 32 GiB bucket 15).
    pub fn roundup_power2_bucket(size: u64) -> usize {
        let log_size = size.checked_ilog2().unwrap_or(0) as usize;
        log_size.saturating_sub(20).min(ROUNDUP_POWER2_INTERVALS - 1)
    }

    /// PyTorch's `roundup_power2_divisions(size)`: the divisions configured
    /// for the bucket of `size` (0 when not configured).
    pub fn roundup_power2_divisions_for(&self, size: u64) -> u64 {
        self.roundup_power2_divisions[Self::roundup_power2_bucket(size)]
    }

    /// PyTorch's `round_size(size)`, the block size a request is served
    /// with:
    ///
    /// - below 512 bytes: 512;
    /// - if the bucket's divisions `d` exceed 1 and `size > 512 * d`: round
    ///   up to the next of `d` equal steps between the surrounding powers of
    ///   two (`roundup_power2_next_division`; a power of two is kept);
    /// - otherwise round up to a multiple of 512.
    ///
    /// `512 * d` wraps as PyTorch's `size_t` product does (only for
    /// `d >= 2^55`); a result above `u64::MAX` saturates to `u64::MAX`.
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK_SIZE {
            return MIN_BLOCK_SIZE;
        }
        let divisions = self.roundup_power2_divisions_for(size);
        if divisions > 1 && size > MIN_BLOCK_SIZE.wrapping_mul(divisions) {
            roundup_power2_next_division(size, divisions)
        } else {
            round_up_saturating(size, MIN_BLOCK_SIZE)
        }
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

/// PyTorch's `roundup_power2_next_division(size, divisions)`: a power of
/// two is returned unchanged; otherwise the interval
/// `[2^k, 2^(k+1))` holding `size` is cut into `divisions` equal steps and
/// `size` rounds up to the next step (e.g. 1200 with 4 divisions: steps of
/// 256 above 1024, so 1280). Saturates instead of wrapping.
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    // size >= 512 and divisions >= 2 here (see round_size).
    let floor = 1u64 << size.ilog2();
    let step = floor >> divisions.ilog2();
    if step == 0 {
        // PyTorch returns `floor << 1`, which wraps to 0 at 2^63.
        return floor.saturating_mul(2);
    }
    let rounded_down = size & !(step - 1);
    if rounded_down == size {
        size
    } else {
        rounded_down.saturating_add(step)
    }
}

/// `size` rounded up to a multiple of `unit` (a power of two), or
/// `u64::MAX` when that multiple does not fit.
fn round_up_saturating(size: u64, unit: u64) -> u64 {
    match size.checked_add(unit - 1) {
        Some(v) => v & !(unit - 1),
        None => u64::MAX,
    }
}

/// `mb` MiB in bytes, clamped as PyTorch clamps (`min(val, SIZE_MAX / kMB)`).
fn mib_to_bytes_clamped(mb: u64) -> u64 {
    mb.min(u64::MAX / MIB) * MIB
}

fn parse_u64(key: &str, text: &str) -> Result<u64, ConfigError> {
    let digits_only = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    match text.parse::<u64>() {
        Ok(v) if digits_only => Ok(v),
        _ if digits_only => Err(ConfigError::new(
            key,
            format!("{key}: '{text}' is too large (the maximum is {})", u64::MAX),
        )),
        _ => Err(ConfigError::new(
            key,
            format!("{key}: expected a non-negative integer, got '{text}'"),
        )),
    }
}

fn parse_f64(key: &str, text: &str) -> Result<f64, ConfigError> {
    text.parse::<f64>()
        .map_err(|_| ConfigError::new(key, format!("{key}: expected a number, got '{text}'")))
}

/// `roundup_power2_divisions:N` or `roundup_power2_divisions:[a:n,b:m,>:k]`,
/// with PyTorch's rules:
/// - `N` must be a power of two and fills every bucket;
/// - in a list, an interval start `a` (in MiB) must be a power of two and
///   names bucket `log2(a)` (clamped to 15); a division must be a power of
///   two or 0; the first entry's value also fills every bucket below its
///   own; `>` fills every bucket after the last one named (after bucket 0
///   when none is named yet); buckets never named keep 0.
fn parse_roundup(entry: &Entry) -> Result<[u64; ROUNDUP_POWER2_INTERVALS], ConfigError> {
    let key = entry.key.as_str();
    let mut buckets = [0u64; ROUNDUP_POWER2_INTERVALS];
    match &entry.value {
        Value::Scalar(text) => {
            let val = parse_u64(key, text)?;
            if !val.is_power_of_two() {
                return Err(entry.error(format!("'{text}' must be a power of two")));
            }
            buckets = [val; ROUNDUP_POWER2_INTERVALS];
        }
        Value::List(items) => {
            let mut first_value = true;
            let mut last_index = 0usize;
            for item in items {
                let (interval, divisions) = match item.as_slice() {
                    [a, colon, b] if colon == ":" && b != ":" && a != ":" => (a, b),
                    _ => {
                        return Err(entry.error(format!(
                            "expected 'interval:divisions' in the list, got '{}'",
                            item.concat()
                        )))
                    }
                };
                let val = parse_u64(key, divisions)?;
                if val != 0 && !val.is_power_of_two() {
                    return Err(entry.error(format!(
                        "divisions '{divisions}' for interval '{interval}' must be a power of two or 0"
                    )));
                }
                if interval == ">" {
                    for b in buckets.iter_mut().skip(last_index + 1) {
                        *b = val;
                    }
                    continue;
                }
                let start = parse_u64(key, interval)?;
                if !start.is_power_of_two() {
                    return Err(entry.error(format!(
                        "interval '{interval}' must be a power of two (a size in MiB) or '>'"
                    )));
                }
                let index = (start.ilog2() as usize).min(ROUNDUP_POWER2_INTERVALS - 1);
                if first_value {
                    for b in &mut buckets[..index] {
                        *b = val;
                    }
                    first_value = false;
                }
                buckets[index] = val;
                last_index = index;
            }
        }
    }
    Ok(buckets)
}

/// A parsed value: one token, or a bracketed list of `a:b` pairs.
#[derive(Debug)]
enum Value {
    Scalar(String),
    /// Each item is the tokens between two commas, e.g. `["256", ":", "4"]`.
    List(Vec<Vec<String>>),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Scalar(s) => f.write_str(s),
            Value::List(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(&item.concat())?;
                }
                f.write_str("]")
            }
        }
    }
}

/// One `key:value` pair of a settings string.
#[derive(Debug)]
struct Entry<'s> {
    key: String,
    value: Value,
    /// The whole settings string, for messages.
    source: &'s str,
}

impl Entry<'_> {
    fn error(&self, detail: String) -> ConfigError {
        ConfigError::new(&self.key, format!("{}: {detail}", self.key))
    }

    fn scalar(&self) -> Result<&str, ConfigError> {
        match &self.value {
            Value::Scalar(s) => Ok(s),
            list => Err(self.error(format!("expected a single value, got the list '{list}'"))),
        }
    }

    fn boolean(&self) -> Result<bool, ConfigError> {
        match self.scalar()? {
            "True" => Ok(true),
            "False" => Ok(false),
            other => Err(self.error(format!("expected True or False, got '{other}'"))),
        }
    }
}

/// PyTorch's `ConfigTokenizer`: `,` `:` `[` `]` are tokens of their own,
/// whitespace (C's `isspace`) is dropped everywhere, the rest accumulates.
fn tokenize(s: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut buf = String::new();
    for ch in s.chars() {
        match ch {
            ',' | ':' | '[' | ']' => {
                if !buf.is_empty() {
                    tokens.push(std::mem::take(&mut buf));
                }
                tokens.push(ch.to_string());
            }
            ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r' => {}
            _ => buf.push(ch),
        }
    }
    if !buf.is_empty() {
        tokens.push(buf);
    }
    tokens
}

/// The key a HIP alias stands for; every other key is itself.
fn canonical_key(key: &str) -> &str {
    match key {
        "release_lock_on_hipmalloc" => "release_lock_on_cudamalloc",
        "pinned_use_hip_host_register" => "pinned_use_cuda_host_register",
        k => k,
    }
}

fn is_separator(tok: &str) -> bool {
    matches!(tok, "," | ":" | "[" | "]")
}

/// Checks the syntax of the whole string and splits it into entries, so
/// that no key is applied from a string that is malformed further on.
fn parse_entries(s: &str) -> Result<Vec<Entry<'_>>, ConfigError> {
    let toks = tokenize(s);
    let at = |i: usize| toks.get(i).map(String::as_str);
    let found = |i: usize| match toks.get(i) {
        Some(t) => format!("'{t}'"),
        None => "the end".to_string(),
    };
    let mut entries: Vec<Entry> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let key = toks[i].as_str();
        if is_separator(key) {
            let message = if matches!(key, "," | ":") {
                format!("empty key before '{key}' in allocator config '{s}'")
            } else {
                format!("expected a key, got '{key}' in allocator config '{s}'")
            };
            return Err(ConfigError::new("", message));
        }
        let err = |detail: String| ConfigError::new(key, format!("{key}: {detail} in allocator config '{s}'"));
        if at(i + 1) != Some(":") {
            return Err(err(format!("expected ':' after the key, got {}", found(i + 1))));
        }
        let value = match at(i + 2) {
            None => return Err(err("missing value".into())),
            Some("[") => {
                // Items are the token runs between commas; PyTorch accepts a
                // trailing comma before ']'.
                let mut items: Vec<Vec<String>> = Vec::new();
                let mut item: Vec<String> = Vec::new();
                let mut j = i + 3;
                loop {
                    match at(j) {
                        None => return Err(err("missing ']' at the end of the list".into())),
                        Some("]") => {
                            if !item.is_empty() {
                                items.push(std::mem::take(&mut item));
                            }
                            break;
                        }
                        Some(",") => {
                            if item.is_empty() {
                                return Err(err(format!("empty item in the list, at {}", found(j))));
                            }
                            items.push(std::mem::take(&mut item));
                        }
                        Some("[") => return Err(err("'[' inside a list".into())),
                        Some(t) => item.push(t.to_string()),
                    }
                    j += 1;
                }
                i = j; // at the closing ']'
                Value::List(items)
            }
            Some(v) if is_separator(v) => {
                return Err(err(format!("missing value before '{v}'")));
            }
            Some(v) => {
                i += 2;
                Value::Scalar(v.to_string())
            }
        };
        if let Some(first) = entries.iter().find(|e| canonical_key(&e.key) == canonical_key(key)) {
            let also = if first.key == key {
                String::new()
            } else {
                format!(" (as '{}')", first.key)
            };
            return Err(ConfigError::new(
                key,
                format!("{key}: the key is given twice{also} in allocator config '{s}'; give each key once"),
            ));
        }
        entries.push(Entry {
            key: key.to_string(),
            value,
            source: s,
        });
        // `i` is at the value's last token; a ',' must follow unless done.
        match at(i + 1) {
            None => i += 1,
            Some(",") => i += 2,
            Some(_) => {
                let value_text = entries.last().map(|e| e.value.to_string()).unwrap_or_default();
                return Err(err(format!(
                    "expected ',' after the value '{value_text}', got {}",
                    found(i + 1)
                )));
            }
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests;
