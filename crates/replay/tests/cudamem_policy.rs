//! The `cudamem` policy's targets on every shared trace (issue: lower fragmentation than
//! expandable segments): peak reserved / peak requested at most the better of PyTorch's native
//! and expandable policies and at most 1.03, and the smallest GPU that fits is the smallest of
//! the three policies.

use std::path::PathBuf;

use cudamem_replay::{fit, replay, ReplayOptions};

const TRACES: &[&str] = &[
    "gpt2_train",
    "resnet50_train",
    "bert_varlen_infer",
    "multistream_prefetch",
];

fn trace(name: &str) -> cudamem_trace::Trace {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(format!("{name}.pickle.gz"));
    cudamem_trace::read_path(&p).unwrap()
}

fn ratio(t: &cudamem_trace::Trace, policy: &str) -> (f64, u64) {
    let r = replay(
        t,
        &ReplayOptions {
            policy: policy.into(),
            repeats: 0,
            ..ReplayOptions::default()
        },
    )
    .unwrap();
    let d = &r.devices[0];
    assert_eq!(d.ooms, 0);
    (
        d.peak_reserved_bytes as f64 / d.peak_requested_bytes as f64,
        d.device_calls.maps + d.device_calls.unmaps,
    )
}

#[test]
fn cudamem_reserves_less_than_native_and_expandable() {
    for name in TRACES {
        let t = trace(name);
        let (native, _) = ratio(&t, "pytorch");
        let (expandable, _) = ratio(&t, "pytorch-expandable");
        let (ours, calls) = ratio(&t, "cudamem");
        eprintln!("{name}: native {native:.4} expandable {expandable:.4} cudamem {ours:.4} ({calls} map/unmap calls)");
        assert!(
            ours <= native.min(expandable),
            "{name}: {ours} vs {native} / {expandable}"
        );
    }
}

#[test]
fn cudamem_compact_stays_within_3_percent_of_the_requested_peak() {
    for name in TRACES {
        let t = trace(name);
        let (expandable, _) = ratio(&t, "pytorch-expandable");
        let (ours, calls) = ratio(&t, "cudamem-compact");
        eprintln!("{name}: cudamem-compact {ours:.4} ({calls} map/unmap calls)");
        assert!(ours <= expandable && ours <= 1.03, "{name}: {ours}");
    }
}

#[test]
fn cudamem_fits_the_smallest_gpu() {
    for name in TRACES {
        let t = trace(name);
        let f = |p: &str| {
            fit(
                &t,
                &ReplayOptions {
                    policy: p.into(),
                    repeats: 0,
                    ..ReplayOptions::default()
                },
            )
            .unwrap()
        };
        let (native, expandable, ours, compact) = (
            f("pytorch"),
            f("pytorch-expandable"),
            f("cudamem"),
            f("cudamem-compact"),
        );
        eprintln!("{name}: fit native {native} expandable {expandable} cudamem {ours} cudamem-compact {compact}");
        assert!(ours <= native.min(expandable), "{name}");
        assert!(compact <= native.min(expandable), "{name}");
    }
}
