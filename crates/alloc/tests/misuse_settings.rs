//! Misuse of the allocator's settings: bad configuration strings and policies, at construction
//! and at run time, and invalid memory fractions. As in `misuse.rs`, each case asserts the exact
//! error (naming the key or the value) and that the allocator is intact afterwards.

use cudamem_alloc::{AllocError, AllocatorConfig, CachingAllocator};

mod support;

use support::*;

// ------------------------------------------------------------------------------------------
// bad configurations
// ------------------------------------------------------------------------------------------

/// `(settings, key, message)`: each rejected by `parse` and by `set_settings`, naming the key.
const BAD_CONFIGS: &[(&str, &str, &str)] = &[
    (
        "max_split_size_mb:abc",
        "max_split_size_mb",
        "max_split_size_mb: expected a non-negative integer, got 'abc'",
    ),
    (
        "max_split_size_mb:-1",
        "max_split_size_mb",
        "max_split_size_mb: expected a non-negative integer, got '-1'",
    ),
    (
        "max_split_size_mb:5",
        "max_split_size_mb",
        "max_split_size_mb: '5' is below the minimum of 20 MiB",
    ),
    (
        "max_split_size_mb:99999999999999999999",
        "max_split_size_mb",
        "max_split_size_mb: '99999999999999999999' is too large (the maximum is 18446744073709551615)",
    ),
    (
        "max_non_split_rounding_mb:1",
        "max_non_split_rounding_mb",
        "max_non_split_rounding_mb: '1' is below the minimum of 20 MiB",
    ),
    (
        "garbage_collection_threshold:1.5",
        "garbage_collection_threshold",
        "garbage_collection_threshold: '1.5' must be greater than 0.0 and less than 1.0",
    ),
    (
        "garbage_collection_threshold:nan",
        "garbage_collection_threshold",
        "garbage_collection_threshold: 'nan' must be greater than 0.0 and less than 1.0",
    ),
    (
        "garbage_collection_threshold:x",
        "garbage_collection_threshold",
        "garbage_collection_threshold: expected a number, got 'x'",
    ),
    (
        "roundup_power2_divisions:3",
        "roundup_power2_divisions",
        "roundup_power2_divisions: '3' must be a power of two",
    ),
    (
        "roundup_power2_divisions:[3:4]",
        "roundup_power2_divisions",
        "roundup_power2_divisions: interval '3' must be a power of two (a size in MiB) or '>'",
    ),
    (
        "roundup_power2_divisions:[1:3]",
        "roundup_power2_divisions",
        "roundup_power2_divisions: divisions '3' for interval '1' must be a power of two or 0",
    ),
    (
        "expandable_segments:yes",
        "expandable_segments",
        "expandable_segments: expected True or False, got 'yes'",
    ),
    (
        "expandable_segments:true",
        "expandable_segments",
        "expandable_segments: expected True or False, got 'true'",
    ),
    (
        "release_lock_on_cudamalloc:1",
        "release_lock_on_cudamalloc",
        "release_lock_on_cudamalloc: expected True or False, got '1'",
    ),
    (
        "pinned_num_register_threads:3",
        "pinned_num_register_threads",
        "pinned_num_register_threads: '3' must be a power of two",
    ),
    (
        "pinned_num_register_threads:256",
        "pinned_num_register_threads",
        "pinned_num_register_threads: '256' exceeds the maximum of 128",
    ),
    (
        "pinned_reserve_segment_size_mb:0",
        "pinned_reserve_segment_size_mb",
        "pinned_reserve_segment_size_mb: '0' must be greater than 0",
    ),
    (
        "large_segment_size_mb:10",
        "large_segment_size_mb",
        "large_segment_size_mb: '10' must be greater than 10 MiB",
    ),
    (
        "per_process_memory_fraction:1.5",
        "per_process_memory_fraction",
        "per_process_memory_fraction: '1.5' must be between 0.0 and 1.0",
    ),
    (
        "backend:foo",
        "backend",
        "backend: unknown backend 'foo', expected native or cudaMallocAsync",
    ),
    (
        "bogus_key:1",
        "bogus_key",
        "unrecognized key 'bogus_key' in allocator config 'bogus_key:1'",
    ),
    (
        "expandable_segments:True,max_split_size_mb:1",
        "max_split_size_mb",
        "max_split_size_mb: '1' is below the minimum of 20 MiB",
    ),
];

#[test]
fn bad_configs_are_rejected_naming_the_key() {
    for &(s, key, msg) in BAD_CONFIGS {
        let e = AllocatorConfig::parse(s).unwrap_err();
        assert_eq!(e.key(), key, "{s}");
        assert_eq!(e.to_string(), msg, "{s}");
        assert!(e.to_string().contains(key));
    }
}

#[test]
fn bad_configs_at_runtime_change_nothing() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        a.set_settings("max_split_size_mb:64,garbage_collection_threshold:0.5")
            .unwrap();
        let live = a.malloc(3 * MIB, S0).unwrap();
        for &(s, key, msg) in BAD_CONFIGS.iter().chain(&[(
            "backend:cudaMallocAsync",
            "backend",
            "backend: 'cudaMallocAsync' differs from the backend chosen at startup, 'native'; the backend cannot change at runtime",
        )]) {
            let config = a.config();
            let before = a.memory_stats();
            match a.set_settings(s) {
                Err(AllocError::Config(e)) => {
                    assert_eq!((e.key(), e.to_string().as_str()), (key, msg), "{policy}: {s}");
                }
                other => panic!("{policy}: set_settings({s}): expected a config error, got {other:?}"),
            }
            assert_eq!(a.config(), config, "{policy}: {s} changed the config");
            assert_eq!(a.memory_stats(), before, "{policy}: {s} changed the stats");
            a.check_invariants().unwrap();
        }
        assert_eq!(a.config().max_split_size, 64 * MIB);
        assert_usable(&a, &sim, policy);
        drain(&a, &sim, &[live]);
    }
}

#[test]
fn an_unknown_policy_is_rejected_naming_the_known_ones() {
    let sim = device(0);
    let e = CachingAllocator::with_policy(sim, AllocatorConfig::default(), "fastest").unwrap_err();
    let m = e.to_string();
    assert!(m.starts_with("unknown policy 'fastest' (known: "), "{m}");
    for p in POLICIES {
        assert!(m.contains(p), "{m}");
    }
}

// ------------------------------------------------------------------------------------------
// memory fraction
// ------------------------------------------------------------------------------------------

#[test]
fn invalid_memory_fractions_are_rejected_and_keep_the_limit() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        a.set_memory_fraction(0.5).unwrap();
        for (f, text) in [
            (-0.1, "-0.1"),
            (1.1, "1.1"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
            (-0.0001, "-0.0001"),
        ] {
            let before = a.memory_stats();
            match a.set_memory_fraction(f) {
                Err(AllocError::InvalidArgument(m)) => {
                    assert_eq!(
                        m,
                        format!("invalid memory fraction {text}: set it within [0, 1]"),
                        "{policy}"
                    )
                }
                other => panic!("{policy}: fraction {f}: expected InvalidArgument, got {other:?}"),
            }
            assert_eq!(a.memory_stats(), before);
        }
        // The limit of 0.5 is still in force.
        let o = oom(a.malloc(600 * MIB, S0));
        assert_eq!(o.allowed, Some(500 * MIB), "{policy}");
        assert!(o.pytorch_message().contains("500.00 MiB allowed; "), "{policy}");
        assert_usable(&a, &sim, policy);
    }
}

#[test]
fn memory_fraction_zero_allows_no_new_device_memory() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        a.set_memory_fraction(0.0).unwrap();
        for size in [1u64, 512, MIB, 30 * MIB] {
            let o = oom(a.malloc(size, S0));
            assert_eq!(o.allowed, Some(0), "{policy}");
            assert!(o
                .pytorch_message()
                .contains("this process has 0 bytes memory in use. 0 bytes allowed; Of the allocated"));
        }
        assert_eq!(a.malloc(0, S0).unwrap(), 0, "size 0 needs no memory");
        assert_eq!(sim.used(), 0);
        assert_eq!(a.memory_stats()["num_ooms"], 4);
        a.check_invariants().unwrap();
        // Raising it again serves as before.
        a.set_memory_fraction(1.0).unwrap();
        assert_usable(&a, &sim, policy);
    }
}

#[test]
fn memory_fraction_zero_still_serves_from_the_cache() {
    // As in PyTorch, the limit applies to new device memory: cached blocks stay usable.
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        let p = a.malloc(3 * MIB, S0).unwrap();
        a.free(p).unwrap();
        a.set_memory_fraction(0.0).unwrap();
        assert_eq!(a.malloc(3 * MIB, S0).unwrap(), p, "{policy}");
        a.free(p).unwrap();
        a.set_memory_fraction(1.0).unwrap();
        drain(&a, &sim, &[]);
    }
}

#[test]
fn memory_fraction_one_allows_the_whole_device() {
    for &policy in POLICIES {
        let (sim, a) = setup(policy);
        a.set_memory_fraction(1.0).unwrap();
        let p = a.malloc(CAPACITY, S0).unwrap();
        assert_eq!(sim.used(), CAPACITY, "{policy}");
        let o = oom(a.malloc(1, S0));
        assert_eq!(o.allowed, Some(CAPACITY));
        drain(&a, &sim, &[p]);
    }
}
