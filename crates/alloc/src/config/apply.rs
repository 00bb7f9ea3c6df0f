//! # Applying one key: PyTorch's meaning, limits and clamping for each
//!
//! [`AllocatorConfig::apply_entry`] sets the field of one `key:value` entry, with the checks and
//! clamping PyTorch's `CUDAAllocatorConfig` applies (so a value PyTorch accepts means the same
//! here), and the number parsers it uses. Guarantees: no input panics; every rejection is a
//! [`ConfigError`] naming the key and the value.

use super::*;

impl AllocatorConfig {
    pub(super) fn apply_entry(&mut self, entry: &Entry, at_startup: bool) -> Result<(), ConfigError> {
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
}

/// `mb` MiB in bytes, clamped as PyTorch clamps (`min(val, SIZE_MAX / kMB)`).
pub(super) fn mib_to_bytes_clamped(mb: u64) -> u64 {
    mb.min(u64::MAX / MIB) * MIB
}

pub(super) fn parse_u64(key: &str, text: &str) -> Result<u64, ConfigError> {
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

pub(super) fn parse_f64(key: &str, text: &str) -> Result<f64, ConfigError> {
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
pub(super) fn parse_roundup(entry: &Entry) -> Result<[u64; ROUNDUP_POWER2_INTERVALS], ConfigError> {
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
