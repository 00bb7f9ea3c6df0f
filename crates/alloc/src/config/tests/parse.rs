//! Parsing `PYTORCH_CUDA_ALLOC_CONF` strings: defaults, each key's accepted values, bounds and
//! error messages, and the syntax (separators, trailing commas, keys given twice). An error
//! must name the key and the text it rejected.

use super::*;

#[test]
fn defaults_are_pytorchs() {
    let c = AllocatorConfig::default();
    assert_eq!(c.max_split_size, u64::MAX);
    assert_eq!(c.max_non_split_rounding, 20 * MIB);
    assert_eq!(c.roundup_power2_divisions, [0; 16]);
    assert_eq!(c.garbage_collection_threshold, 0.0);
    assert!(!c.expandable_segments);
    assert!(!c.release_lock_on_cudamalloc);
    assert!(!c.pinned_use_cuda_host_register);
    assert_eq!(c.pinned_num_register_threads, 1);
    assert!(!c.pinned_use_background_threads);
    assert_eq!(c.pinned_reserve_segment_size_mb, 0);
    assert!(!c.graph_capture_record_stream_reuse);
    assert_eq!(c.large_segment_size, 20 * MIB);
    assert_eq!(c.per_process_memory_fraction, 1.0);
    assert_eq!(c.backend, Backend::Native);
    assert_eq!(c.policy, None);
    assert_eq!(c.settings, "");
}

#[test]
fn empty_and_blank_strings_give_defaults() {
    assert_eq!(parse(""), AllocatorConfig::default());
    let blank = parse(" \t\n ");
    assert_eq!(blank.settings, " \t\n ");
    assert_eq!(
        AllocatorConfig {
            settings: String::new(),
            ..blank
        },
        AllocatorConfig::default()
    );
    assert_eq!("".parse::<AllocatorConfig>().unwrap(), AllocatorConfig::default());
}

#[test]
fn settings_string_is_kept_verbatim() {
    let s = " expandable_segments : True , max_split_size_mb:64 ";
    let c = parse(s);
    assert_eq!(c.settings, s);
    assert!(c.expandable_segments);
    assert_eq!(c.max_split_size, 64 * MIB);
}

#[test]
fn max_split_size_mb() {
    assert_eq!(parse("max_split_size_mb:128").max_split_size, 128 * MIB);
    assert_eq!(parse("max_split_size_mb:20").max_split_size, 20 * MIB);
    assert_eq!(
        error("max_split_size_mb:19"),
        "max_split_size_mb: '19' is below the minimum of 20 MiB"
    );
    assert_eq!(
        error("max_split_size_mb:10"),
        "max_split_size_mb: '10' is below the minimum of 20 MiB"
    );
    // PyTorch clamps the MiB count to SIZE_MAX / 1 MiB.
    assert_eq!(
        parse("max_split_size_mb:99999999999999999").max_split_size,
        (u64::MAX / MIB) * MIB
    );
    for bad in ["abc", "-1", "20abc", "2.5", "0x20", "+20"] {
        assert_eq!(
            error(&format!("max_split_size_mb:{bad}")),
            format!("max_split_size_mb: expected a non-negative integer, got '{bad}'")
        );
    }
    assert!(error("max_split_size_mb:99999999999999999999999").contains("'99999999999999999999999' is too large"));
}

#[test]
fn max_non_split_rounding_mb() {
    assert_eq!(parse("max_non_split_rounding_mb:64").max_non_split_rounding, 64 * MIB);
    assert_eq!(parse("max_non_split_rounding_mb:20").max_non_split_rounding, 20 * MIB);
    assert_eq!(
        error("max_non_split_rounding_mb:19"),
        "max_non_split_rounding_mb: '19' is below the minimum of 20 MiB"
    );
}

#[test]
fn large_segment_size_mb_bounds_the_split_sizes_wherever_it_appears() {
    let c = parse("large_segment_size_mb:40");
    assert_eq!(c.large_segment_size, 40 * MIB);
    assert_eq!(c.max_non_split_rounding, 40 * MIB);
    assert_eq!(parse("large_segment_size_mb:11").large_segment_size, 11 * MIB);
    assert_eq!(
        error("large_segment_size_mb:10"),
        "large_segment_size_mb: '10' must be greater than 10 MiB"
    );
    assert_eq!(
        error("max_split_size_mb:30,large_segment_size_mb:40"),
        "max_split_size_mb: '30' is below the minimum of 40 MiB"
    );
    assert_eq!(
        error("large_segment_size_mb:40,max_non_split_rounding_mb:30"),
        "max_non_split_rounding_mb: '30' is below the minimum of 40 MiB"
    );
    let c = parse("max_split_size_mb:12,large_segment_size_mb:12,max_non_split_rounding_mb:16");
    assert_eq!((c.max_split_size, c.max_non_split_rounding), (12 * MIB, 16 * MIB));
}

#[test]
fn garbage_collection_threshold() {
    assert_eq!(
        parse("garbage_collection_threshold:0.6").garbage_collection_threshold,
        0.6
    );
    assert_eq!(
        parse("garbage_collection_threshold:.5").garbage_collection_threshold,
        0.5
    );
    for bad in ["0", "0.0", "1", "1.0", "1.5", "-0.5", "nan", "inf"] {
        assert_eq!(
            error(&format!("garbage_collection_threshold:{bad}")),
            format!("garbage_collection_threshold: '{bad}' must be greater than 0.0 and less than 1.0")
        );
    }
    assert_eq!(
        error("garbage_collection_threshold:half"),
        "garbage_collection_threshold: expected a number, got 'half'"
    );
}

#[test]
fn per_process_memory_fraction() {
    assert_eq!(parse("per_process_memory_fraction:0").per_process_memory_fraction, 0.0);
    assert_eq!(parse("per_process_memory_fraction:1").per_process_memory_fraction, 1.0);
    assert_eq!(
        parse("per_process_memory_fraction:0.25").per_process_memory_fraction,
        0.25
    );
    for bad in ["1.5", "-0.1", "NaN"] {
        assert_eq!(
            error(&format!("per_process_memory_fraction:{bad}")),
            format!("per_process_memory_fraction: '{bad}' must be between 0.0 and 1.0")
        );
    }
}

#[test]
fn roundup_power2_divisions_single_value() {
    assert_eq!(parse("roundup_power2_divisions:4").roundup_power2_divisions, [4; 16]);
    assert_eq!(parse("roundup_power2_divisions:1").roundup_power2_divisions, [1; 16]);
    // A single value must be a power of two: 0 is refused here (but not
    // in the list form), as in PyTorch.
    assert_eq!(
        error("roundup_power2_divisions:0"),
        "roundup_power2_divisions: '0' must be a power of two"
    );
    assert_eq!(
        error("roundup_power2_divisions:3"),
        "roundup_power2_divisions: '3' must be a power of two"
    );
}

#[test]
fn roundup_power2_divisions_list() {
    // Bucket 0 (1 MiB) gets 8, bucket 8 (256 MiB) 4, '>' fills 9..=15;
    // buckets 1..=7 are never named and keep 0.
    assert_eq!(
        parse("roundup_power2_divisions:[1:8,256:4,>:1]").roundup_power2_divisions,
        [8, 0, 0, 0, 0, 0, 0, 0, 4, 1, 1, 1, 1, 1, 1, 1]
    );
    // PyTorch's documented example: the first value fills lower buckets.
    assert_eq!(
        parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").roundup_power2_divisions,
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8]
    );
    assert_eq!(
        parse("roundup_power2_divisions: [ 64 : 8 , 128 : 2 ]").roundup_power2_divisions,
        [8, 8, 8, 8, 8, 8, 8, 2, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    // Intervals past 32 GiB clamp to the last bucket.
    assert_eq!(
        parse("roundup_power2_divisions:[65536:2]").roundup_power2_divisions,
        [2; 16]
    );
    // '>' alone starts after bucket 0.
    let mut expected = [2; 16];
    expected[0] = 0;
    assert_eq!(
        parse("roundup_power2_divisions:[>:2]").roundup_power2_divisions,
        expected
    );
    // 0 disables a bucket; an empty list and a trailing comma are fine.
    assert_eq!(
        parse("roundup_power2_divisions:[1:0]").roundup_power2_divisions,
        [0; 16]
    );
    assert_eq!(parse("roundup_power2_divisions:[]").roundup_power2_divisions, [0; 16]);
    assert_eq!(parse("roundup_power2_divisions:[1:4,]").roundup_power2_divisions[0], 4);
    // Later entries override earlier ones.
    assert_eq!(
        parse("roundup_power2_divisions:[1:4,1:2]").roundup_power2_divisions[0],
        2
    );
}

#[test]
fn roundup_power2_divisions_list_errors() {
    assert_eq!(
        error("roundup_power2_divisions:[3:2]"),
        "roundup_power2_divisions: interval '3' must be a power of two (a size in MiB) or '>'"
    );
    assert_eq!(
        error("roundup_power2_divisions:[0:2]"),
        "roundup_power2_divisions: interval '0' must be a power of two (a size in MiB) or '>'"
    );
    assert_eq!(
        error("roundup_power2_divisions:[256:3]"),
        "roundup_power2_divisions: divisions '3' for interval '256' must be a power of two or 0"
    );
    assert_eq!(
        error("roundup_power2_divisions:[a:2]"),
        "roundup_power2_divisions: expected a non-negative integer, got 'a'"
    );
    assert_eq!(
        error("roundup_power2_divisions:[1:2:3]"),
        "roundup_power2_divisions: expected 'interval:divisions' in the list, got '1:2:3'"
    );
    assert_eq!(
        error("roundup_power2_divisions:[1]"),
        "roundup_power2_divisions: expected 'interval:divisions' in the list, got '1'"
    );
    assert_eq!(
        error("roundup_power2_divisions:[1:8"),
        "roundup_power2_divisions: missing ']' at the end of the list in allocator config \
         'roundup_power2_divisions:[1:8'"
    );
    assert!(error("roundup_power2_divisions:[1:8,,2:4]").contains("empty item in the list"));
    assert!(error("roundup_power2_divisions:[1:[2]]").contains("'[' inside a list"));
}

#[test]
fn boolean_keys_take_exactly_true_or_false() {
    type Get = fn(&AllocatorConfig) -> bool;
    let keys: [(&str, Get); 7] = [
        ("expandable_segments", |c| c.expandable_segments),
        ("release_lock_on_cudamalloc", |c| c.release_lock_on_cudamalloc),
        ("release_lock_on_hipmalloc", |c| c.release_lock_on_cudamalloc),
        ("pinned_use_cuda_host_register", |c| c.pinned_use_cuda_host_register),
        ("pinned_use_hip_host_register", |c| c.pinned_use_cuda_host_register),
        ("pinned_use_background_threads", |c| c.pinned_use_background_threads),
        ("graph_capture_record_stream_reuse", |c| {
            c.graph_capture_record_stream_reuse
        }),
    ];
    for (key, get) in keys {
        assert!(get(&parse(&format!("{key}:True"))), "{key}");
        assert!(!get(&parse(&format!("{key}:False"))), "{key}");
        assert!(
            error(&format!("{key}:True,{key}:False")).contains("given twice"),
            "{key}"
        );
        for bad in ["true", "false", "1", "0", "TRUE", "yes"] {
            let e = AllocatorConfig::parse(&format!("{key}:{bad}")).unwrap_err();
            assert_eq!(e.to_string(), format!("{key}: expected True or False, got '{bad}'"));
            assert_eq!(e.key(), key);
        }
    }
}

#[test]
fn pinned_num_register_threads() {
    assert_eq!(parse("pinned_num_register_threads:8").pinned_num_register_threads, 8);
    assert_eq!(parse("pinned_num_register_threads:1").pinned_num_register_threads, 1);
    assert_eq!(
        parse("pinned_num_register_threads:128").pinned_num_register_threads,
        128
    );
    assert_eq!(
        error("pinned_num_register_threads:256"),
        "pinned_num_register_threads: '256' exceeds the maximum of 128"
    );
    assert_eq!(
        error("pinned_num_register_threads:3"),
        "pinned_num_register_threads: '3' must be a power of two"
    );
    assert_eq!(
        error("pinned_num_register_threads:0"),
        "pinned_num_register_threads: '0' must be a power of two"
    );
}

#[test]
fn pinned_reserve_segment_size_mb() {
    assert_eq!(
        parse("pinned_reserve_segment_size_mb:64").pinned_reserve_segment_size_mb,
        64
    );
    assert_eq!(
        error("pinned_reserve_segment_size_mb:0"),
        "pinned_reserve_segment_size_mb: '0' must be greater than 0"
    );
}

#[test]
fn backend_and_policy() {
    assert_eq!(parse("backend:native").backend, Backend::Native);
    assert_eq!(parse("backend:cudaMallocAsync").backend, Backend::CudaMallocAsync);
    assert_eq!(Backend::CudaMallocAsync.to_string(), "cudaMallocAsync");
    assert_eq!(
        error("backend:hipMallocAsync"),
        "backend: unknown backend 'hipMallocAsync', expected native or cudaMallocAsync"
    );
    assert_eq!(parse("policy:cudamem").policy.as_deref(), Some("cudamem"));
    assert!(parse("sharded:True").sharded && !parse("sharded:False").sharded && !parse("").sharded);
    assert!(error("sharded:yes").starts_with("sharded:"), "{}", error("sharded:yes"));
    assert_eq!(
        parse("policy: cudamem-compact ").policy.as_deref(),
        Some("cudamem-compact")
    );
    assert_eq!(
        error("policy:[a:b]"),
        "policy: expected a single value, got the list '[a:b]'"
    );
}

#[test]
fn syntax_errors_name_the_key_and_the_text() {
    let e = AllocatorConfig::parse("foo:1").unwrap_err();
    assert_eq!(e.to_string(), "unrecognized key 'foo' in allocator config 'foo:1'");
    assert_eq!(e.key(), "foo");
    // Keys are case-sensitive, and newer PyTorch keys cudamem lacks are refused.
    assert!(error("Expandable_Segments:True").starts_with("unrecognized key 'Expandable_Segments'"));
    assert!(error("throw_on_cudamalloc_oom:True").starts_with("unrecognized key"));
    assert_eq!(
        error(",expandable_segments:True"),
        "empty key before ',' in allocator config ',expandable_segments:True'"
    );
    assert_eq!(
        error("expandable_segments:True,,policy:x"),
        "empty key before ',' in allocator config 'expandable_segments:True,,policy:x'"
    );
    assert_eq!(error(":True"), "empty key before ':' in allocator config ':True'");
    assert_eq!(error("[1:2]"), "expected a key, got '[' in allocator config '[1:2]'");
    assert_eq!(
        error("expandable_segments"),
        "expandable_segments: expected ':' after the key, got the end in allocator config \
         'expandable_segments'"
    );
    assert_eq!(
        error("expandable_segments,True"),
        "expandable_segments: expected ':' after the key, got ',' in allocator config \
         'expandable_segments,True'"
    );
    assert_eq!(
        error("expandable_segments:"),
        "expandable_segments: missing value in allocator config 'expandable_segments:'"
    );
    assert_eq!(
        error("expandable_segments:,policy:x"),
        "expandable_segments: missing value before ',' in allocator config \
         'expandable_segments:,policy:x'"
    );
    // Whitespace is dropped, so a missing comma glues tokens together.
    assert_eq!(
        error("expandable_segments:True max_split_size_mb:30"),
        "expandable_segments: expected ',' after the value 'Truemax_split_size_mb', got ':' \
         in allocator config 'expandable_segments:True max_split_size_mb:30'"
    );
    assert_eq!(
        error("expandable_segments:[True]"),
        "expandable_segments: expected a single value, got the list '[True]'"
    );
    // A later syntax error stops earlier keys from being applied too.
    assert!(error("expandable_segments:True,bogus").contains("bogus"));
}

#[test]
fn trailing_comma_accepted() {
    let c = parse("max_split_size_mb:64,expandable_segments:True,");
    assert_eq!(c.max_split_size, 64 * MIB);
    assert!(c.expandable_segments);
}

#[test]
fn a_key_given_twice_in_one_string_is_an_error_naming_it() {
    let e = AllocatorConfig::parse("max_split_size_mb:100,max_split_size_mb:200").unwrap_err();
    assert_eq!(e.key(), "max_split_size_mb");
    assert!(
        e.to_string().starts_with("max_split_size_mb: the key is given twice"),
        "{e}"
    );
    assert!(error("policy:a,expandable_segments:True,policy:b").contains("policy: the key is given twice"));
    // Even with the same value, and through a HIP alias.
    assert!(error("sharded:True,sharded:True").contains("given twice"));
    let e = AllocatorConfig::parse("release_lock_on_cudamalloc:True,release_lock_on_hipmalloc:False").unwrap_err();
    assert_eq!(e.key(), "release_lock_on_hipmalloc");
    assert!(e.to_string().contains("(as 'release_lock_on_cudamalloc')"), "{e}");
    // Nothing of a rejected string is applied at run time either.
    let mut c = parse("expandable_segments:True");
    assert!(c.apply("expandable_segments:False,expandable_segments:False").is_err());
    assert!(c.expandable_segments);
}
