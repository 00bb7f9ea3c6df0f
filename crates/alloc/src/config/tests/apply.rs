//! Using a parsed configuration: `apply` at run time (atomic on error, what it resets and keeps,
//! the backend fixed), the environment's priority, size rounding (PyTorch's buckets and
//! divisions, no overflow, monotone), the settings map, and odd inputs that must never panic.

use super::*;

#[test]
fn apply_sets_keys_the_base_configuration_had() {
    // Layering: each string may set a key once, whatever the strings under it set.
    let mut c = parse("max_split_size_mb:100,expandable_segments:True,policy:a");
    c.apply("max_split_size_mb:200,expandable_segments:False").unwrap();
    assert_eq!(c.max_split_size, 200 * MIB);
    assert!(!c.expandable_segments);
    c.apply("max_split_size_mb:300,policy:b").unwrap();
    assert_eq!(c.max_split_size, 300 * MIB);
    assert_eq!(c.policy.as_deref(), Some("b"));
}

#[test]
fn apply_resets_three_fields_and_keeps_the_rest() {
    let mut c = parse(
        "max_split_size_mb:64,garbage_collection_threshold:0.6,roundup_power2_divisions:4,\
         max_non_split_rounding_mb:40,expandable_segments:True,policy:cudamem,\
         pinned_num_register_threads:2,large_segment_size_mb:32",
    );
    c.apply("pinned_num_register_threads:4").unwrap();
    assert_eq!(c.max_split_size, u64::MAX);
    assert_eq!(c.garbage_collection_threshold, 0.0);
    assert_eq!(c.roundup_power2_divisions, [0; 16]);
    // max_non_split_rounding goes back to the large segment size, which stays.
    assert_eq!(c.large_segment_size, 32 * MIB);
    assert_eq!(c.max_non_split_rounding, 32 * MIB);
    assert!(c.expandable_segments);
    assert_eq!(c.policy.as_deref(), Some("cudamem"));
    assert_eq!(c.pinned_num_register_threads, 4);
    assert_eq!(c.settings, "pinned_num_register_threads:4");

    c.apply("").unwrap();
    assert_eq!(c.settings, "");
    assert!(c.expandable_segments);
    c.apply("expandable_segments:False").unwrap();
    assert!(!c.expandable_segments);
}

#[test]
fn apply_is_atomic_on_error() {
    let mut c = parse("max_split_size_mb:64,expandable_segments:True");
    let before = c.clone();
    // The first key is valid, the second not: nothing may change.
    let e = c.apply("expandable_segments:False,max_split_size_mb:1").unwrap_err();
    assert_eq!(e.key(), "max_split_size_mb");
    assert_eq!(c, before);
    assert!(c.apply("expandable_segments:False,nope:1").is_err());
    assert_eq!(c, before);
    assert!(c.apply("expandable_segments:False,").is_ok());
    assert!(!c.expandable_segments);
}

#[test]
fn backend_cannot_change_at_runtime() {
    let mut c = AllocatorConfig::default();
    assert_eq!(
        c.apply("backend:cudaMallocAsync").unwrap_err().to_string(),
        "backend: 'cudaMallocAsync' differs from the backend chosen at startup, 'native'; \
         the backend cannot change at runtime"
    );
    c.apply("backend:native").unwrap();
    let mut c = parse("backend:cudaMallocAsync");
    c.apply("backend:cudaMallocAsync,expandable_segments:True").unwrap();
    assert!(c.apply("backend:native").is_err());
    assert_eq!(c.backend, Backend::CudaMallocAsync);
}

#[test]
fn from_env_priority() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |var: &str| pairs.iter().find(|(k, _)| *k == var).map(|(_, v)| v.to_string())
    };
    assert_eq!(
        AllocatorConfig::from_env_with(env(&[])).unwrap(),
        AllocatorConfig::default()
    );
    let c = AllocatorConfig::from_env_with(env(&[("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")])).unwrap();
    assert_eq!(c.max_split_size, 64 * MIB);
    assert_eq!(c.settings, "max_split_size_mb:64");
    let c = AllocatorConfig::from_env_with(env(&[
        ("PYTORCH_ALLOC_CONF", "max_split_size_mb:64"),
        ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:32"),
    ]))
    .unwrap();
    assert_eq!(c.max_split_size, 32 * MIB);
    let c = AllocatorConfig::from_env_with(env(&[
        ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:32"),
        ("CUDAMEM_ALLOC_CONF", "policy:cudamem"),
    ]))
    .unwrap();
    assert_eq!((c.max_split_size, c.policy.as_deref()), (u64::MAX, Some("cudamem")));
    // Set but empty still wins, giving the defaults.
    let c = AllocatorConfig::from_env_with(env(&[
        ("PYTORCH_CUDA_ALLOC_CONF", ""),
        ("PYTORCH_ALLOC_CONF", "expandable_segments:True"),
    ]))
    .unwrap();
    assert_eq!(c, AllocatorConfig::default());
    // At startup the backend may be chosen; errors come through.
    let c = AllocatorConfig::from_env_with(env(&[("PYTORCH_HIP_ALLOC_CONF", "backend:cudaMallocAsync")])).unwrap();
    assert_eq!(c.backend, Backend::CudaMallocAsync);
    assert!(AllocatorConfig::from_env_with(env(&[("CUDAMEM_ALLOC_CONF", "x:1")])).is_err());
}

#[test]
fn from_env_errors_name_the_variable_they_come_from() {
    for var in ENV_VARS {
        let e = AllocatorConfig::from_env_with(|v: &str| (v == var).then(|| "max_split_size_mb:banana".to_string()))
            .unwrap_err();
        assert!(e.message().starts_with(&format!("{var}: ")), "{e}");
        assert!(e.message().contains("banana"), "{e}");
        assert_eq!(e.key(), "max_split_size_mb");
        assert_eq!(e.to_string(), e.message());
    }
    // The variable that wins is the one named, not one it hides.
    let e = AllocatorConfig::from_env_with(|v: &str| match v {
        "PYTORCH_CUDA_ALLOC_CONF" => Some("x:1".to_string()),
        "PYTORCH_ALLOC_CONF" => Some("y:1".to_string()),
        _ => None,
    })
    .unwrap_err();
    assert!(e.message().starts_with("PYTORCH_CUDA_ALLOC_CONF: "), "{e}");
    // parse() names no variable.
    assert!(!AllocatorConfig::parse("x:1")
        .unwrap_err()
        .message()
        .contains("ALLOC_CONF"));
}

#[test]
fn roundup_bucket_layout() {
    let b = AllocatorConfig::roundup_power2_bucket;
    assert_eq!(b(0), 0);
    assert_eq!(b(1), 0);
    assert_eq!(b(MIB), 0);
    assert_eq!(b(2 * MIB - 1), 0);
    assert_eq!(b(2 * MIB), 1);
    assert_eq!(b(256 * MIB), 8);
    assert_eq!(b(16 << 30), 14);
    assert_eq!(b(32 << 30), 15);
    assert_eq!(b(64 << 30), 15);
    assert_eq!(b(u64::MAX), 15);
    let mut c = AllocatorConfig::default();
    for (i, d) in c.roundup_power2_divisions.iter_mut().enumerate() {
        *d = i as u64 + 100;
    }
    assert_eq!(c.roundup_power2_divisions_for(3 * MIB), 101);
    assert_eq!(c.roundup_power2_divisions_for(100), 100);
}

#[test]
fn round_size_default_is_512_multiples() {
    let c = AllocatorConfig::default();
    assert_eq!(c.round_size(0), 512);
    assert_eq!(c.round_size(1), 512);
    assert_eq!(c.round_size(511), 512);
    assert_eq!(c.round_size(512), 512);
    assert_eq!(c.round_size(513), 1024);
    assert_eq!(c.round_size(1200), 1536);
    assert_eq!(c.round_size(MIB + 1), MIB + 512);
    assert_eq!(c.round_size(5 * MIB + 1), 5 * MIB + 512);
}

#[test]
fn roundup_power2_next_division_examples() {
    // The reference's example: 1200 with 4 divisions is 1280.
    assert_eq!(roundup_power2_next_division(1200, 4), 1280);
    assert_eq!(roundup_power2_next_division(1024, 4), 1024);
    assert_eq!(roundup_power2_next_division(1280, 4), 1280);
    assert_eq!(roundup_power2_next_division(1281, 4), 1536);
    assert_eq!(roundup_power2_next_division(1800, 2), 2048);
    assert_eq!(roundup_power2_next_division(5 * MIB + 1, 4), 6 * MIB);
    // A step of 0 (more divisions than bytes in the interval) doubles the floor.
    assert_eq!(roundup_power2_next_division(1000, 1 << 20), 1024);
}

#[test]
fn round_size_with_divisions() {
    let c = parse("roundup_power2_divisions:4");
    // Only sizes above 512 * divisions use the divisions: 1200 <= 2048.
    assert_eq!(c.round_size(1200), 1536);
    assert_eq!(c.round_size(2049), 2560);
    assert_eq!(c.round_size(5 * MIB + 1), 6 * MIB);
    assert_eq!(c.round_size(4 * MIB), 4 * MIB);
    assert_eq!(c.round_size(300 * MIB), 320 * MIB);

    let c = parse("roundup_power2_divisions:[1:8,256:4,>:1]");
    assert_eq!(c.round_size(MIB + MIB / 2 + 1), MIB + MIB / 2 + MIB / 8);
    // Bucket 1 was never named: plain 512 rounding.
    assert_eq!(c.round_size(2 * MIB + 1), 2 * MIB + 512);
    assert_eq!(c.round_size(300 * MIB), 320 * MIB);
    // Buckets filled with 1 by '>': plain rounding.
    assert_eq!(c.round_size(600 * MIB + 1), 600 * MIB + 512);
}

#[test]
fn round_size_never_overflows() {
    let plain = AllocatorConfig::default();
    assert_eq!(plain.round_size(u64::MAX), u64::MAX);
    assert_eq!(plain.round_size(u64::MAX - 511), u64::MAX - 511);
    assert_eq!(plain.round_size(u64::MAX - 512), u64::MAX - 511);
    assert_eq!(plain.round_size(u64::MAX - 510), u64::MAX);

    let four = parse("roundup_power2_divisions:4");
    assert_eq!(four.round_size(u64::MAX), u64::MAX);
    assert_eq!(four.round_size(1 << 63), 1 << 63);
    assert_eq!(four.round_size((1 << 63) + 1), (1 << 63) + (1 << 61));

    // Absurd divisions set through the public field: no panic, and the
    // result is never below the request.
    for d in [3, 1 << 54, 1 << 55, 1 << 60, 1 << 63, u64::MAX] {
        let c = AllocatorConfig {
            roundup_power2_divisions: [d; 16],
            ..AllocatorConfig::default()
        };
        for size in [
            0,
            1,
            512,
            1000,
            4097,
            1 << 40,
            (1 << 62) + 1,
            (1 << 63) + 1,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let r = c.round_size(size);
            assert!(r >= size, "divisions {d}, size {size}: {r}");
        }
    }
}

#[test]
fn round_size_is_monotone_and_covers_the_request() {
    let configs = [
        AllocatorConfig::default(),
        parse("roundup_power2_divisions:2"),
        parse("roundup_power2_divisions:16"),
        parse("roundup_power2_divisions:[1:8,256:4,>:1]"),
    ];
    for c in &configs {
        let mut prev = 0;
        let mut size = 1u64;
        while size < (1 << 40) {
            let r = c.round_size(size);
            assert!(r >= size && r % 512 == 0, "{size} -> {r}");
            assert!(r >= prev, "not monotone at {size}");
            prev = r;
            size += 1 + size / 7;
        }
    }
}

#[test]
fn settings_map_matches_pytorchs_keys_and_order() {
    let map = AllocatorConfig::default().to_settings_map();
    let keys: Vec<&str> = map.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "PYTORCH_CUDA_ALLOC_CONF",
            "max_split_size",
            "garbage_collection_threshold",
            "expandable_segments",
            "pinned_num_register_threads",
            "release_lock_on_cudamalloc",
            "pinned_use_cuda_host_register",
            "graph_capture_record_stream_reuse",
            "roundup_power2_divisions",
        ]
    );
    assert_eq!(map[0].1, SettingValue::Str(String::new()));
    assert_eq!(map[1].1, SettingValue::Int(-1));
    assert_eq!(map[2].1, SettingValue::Float(0.0));
    assert_eq!(map[4].1, SettingValue::Int(1));

    let s = "max_split_size_mb:64,roundup_power2_divisions:[1:8,256:4,>:1],expandable_segments:True";
    let map = parse(s).to_settings_map();
    assert_eq!(map[0].1, SettingValue::Str(s.into()));
    assert_eq!(map[1].1, SettingValue::Int(64 << 20));
    assert_eq!(map[3].1, SettingValue::Bool(true));
    let SettingValue::Map(roundup) = &map[8].1 else {
        panic!("not a map")
    };
    assert_eq!(roundup.len(), 16);
    assert_eq!(roundup[0], ("1".to_string(), 8));
    assert_eq!(roundup[8], ("256".to_string(), 4));
    assert_eq!(roundup[15], ("32768".to_string(), 1));
}

/// A few thousand random and odd strings: parsing and applying must
/// return, never panic, and a failed apply changes nothing.
#[test]
fn odd_inputs_never_panic() {
    const PIECES: &[&str] = &[
        "max_split_size_mb",
        "max_non_split_rounding_mb",
        "garbage_collection_threshold",
        "roundup_power2_divisions",
        "expandable_segments",
        "release_lock_on_cudamalloc",
        "pinned_use_cuda_host_register",
        "pinned_num_register_threads",
        "backend",
        "policy",
        "pinned_use_background_threads",
        "pinned_reserve_segment_size_mb",
        "large_segment_size_mb",
        "graph_capture_record_stream_reuse",
        "per_process_memory_fraction",
        "release_lock_on_hipmalloc",
        ":",
        ",",
        "[",
        "]",
        ">",
        " ",
        "\t",
        "True",
        "False",
        "0",
        "1",
        "2",
        "3",
        "20",
        "64",
        "256",
        "0.5",
        "-1",
        "1e308",
        "nan",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999",
        "cudaMallocAsync",
        "native",
        "é",
        "\u{0}",
        "\u{1F600}",
        "\u{a0}",
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut base = parse("expandable_segments:True,max_split_size_mb:64");
    let mut accepted = 0;
    for _ in 0..3000 {
        let mut s = String::new();
        for _ in 0..(next() % 12) {
            if next() % 5 == 0 {
                s.push(char::from_u32((next() % 0x300) as u32).unwrap_or('?'));
            } else {
                s.push_str(PIECES[(next() % PIECES.len() as u64) as usize]);
            }
        }
        match AllocatorConfig::parse(&s) {
            Ok(_) => accepted += 1,
            Err(e) => assert!(!e.to_string().is_empty()),
        }
        let before = base.clone();
        if base.apply(&s).is_err() {
            assert_eq!(base, before, "failed apply of {s:?} changed the config");
        }
    }
    // The generator must reach the accepting paths too.
    assert!(accepted > 10, "only {accepted} strings accepted");
}
