//! Fragmentation of the default policy on every trace of `tests/data`, pinned: its peak
//! reserved over peak requested and the driver calls of a warm pass (the same trace replayed
//! again on the allocator the first pass filled, its leftovers freed) where memory is
//! plentiful (the simulated H200, and 141 GB), and the smallest GPU it fits (`cudamem fit`).
//! A change that reserves more than a trace's pinned ratio, that makes a warm pass call the
//! driver more often than pinned, or that needs a larger GPU fails here; so does a change that
//! makes `cudamem-compact16` reserve more or remap more in a warm pass than pinned.
//!
//! `cargo test -p cudamem-replay --test fragmentation -- --nocapture` prints every registered
//! policy's figures (the table of `docs/design/fragmentation.md`).

use std::path::PathBuf;

use cudamem_alloc::policy::registry::{DEFAULT, POLICY_NAMES};
use cudamem_device::DeviceCounters;
use cudamem_replay::{effective_config, free_leftovers, new_allocator, run_once, Program, ReplayOptions};

/// A trace (`tests/data/<name>.pickle.gz`) and what the default policy may not exceed on it:
/// peak reserved / peak requested (cold pass and warm pass alike), the driver calls of a warm
/// pass (maps + unmaps + mallocs + frees), and the mappings of the cold pass on the simulated
/// H200 (the first iteration's driver cost). The ratios are today's, rounded up at the third
/// decimal; the goal is 1.03 and zero calls (`docs/design/fragmentation.md` says where the
/// default stands against it). Lower a pin when the default improves.
const PINNED: &[(&str, f64, u64, u64)] = &[
    ("gpt2_train", 1.024, 0, 350),
    ("resnet50_train", 1.013, 0, 150),
    ("bert_varlen_infer", 1.207, 0, 86),
    ("multistream_prefetch", 1.038, 0, 91),
    ("seed_example", 1.023, 0, 8),
    ("est/generate_b2", 1.033, 0, 63),
    ("est/generate_b4", 1.044, 0, 67),
    ("est/ckpt_b1", 1.008, 0, 235),
    ("est/ckpt_b2", 1.142, 0, 162),
    ("est/bert_b4", 1.012, 0, 55),
    ("est/bert_b8", 1.445, 0, 56),
];

/// `cudamem-compact16` on every trace: (name, peak reserved / peak requested of either pass,
/// driver calls of the warm pass), today's figures rounded up at the third decimal. Its claim
/// is the training loops' silent warm pass at a lower peak than the default's.
const PINNED_COMPACT16: &[(&str, f64, u64)] = &[
    ("gpt2_train", 1.011, 0),
    ("resnet50_train", 1.014, 0),
    ("bert_varlen_infer", 1.139, 516),
    ("multistream_prefetch", 1.040, 391),
    ("seed_example", 1.023, 0),
    ("est/generate_b2", 1.033, 0),
    ("est/generate_b4", 1.044, 0),
    ("est/ckpt_b1", 1.014, 0),
    ("est/ckpt_b2", 1.064, 55),
    ("est/bert_b4", 1.012, 0),
    ("est/bert_b8", 1.063, 18),
];

/// The goal of the default policy on every trace.
const GOAL_RATIO: f64 = 1.03;

/// The default's smallest GPU (`cudamem fit`) over peak requested, on every trace of
/// `tests/data` (`capped/` included): today's figures rounded up at the third decimal. The goal
/// (1.03) holds on all; a change that needs a larger GPU fails here.
const PINNED_FIT: &[(&str, f64)] = &[
    ("gpt2_train", 1.006),
    ("resnet50_train", 1.006),
    ("bert_varlen_infer", 1.019),
    ("multistream_prefetch", 1.012),
    ("seed_example", 1.023),
    ("est/generate_b2", 1.004),
    ("est/generate_b4", 1.004),
    ("est/ckpt_b1", 1.008),
    ("est/ckpt_b2", 1.016),
    ("est/bert_b4", 1.005),
    ("est/bert_b8", 1.005),
    ("capped/bert_b1066_cap40gib", 1.001),
    ("capped/bert_b1067_cap40gib", 1.001),
];

/// A capacity where memory is plentiful for every trace but below the simulated H200's: the
/// H200's advertised 141 GB. The warm pass must make no driver call there either.
const H200_ADVERTISED: u64 = 141_000_000_000;

fn trace(name: &str) -> cudamem_trace::Trace {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(format!("{name}.pickle.gz"));
    cudamem_trace::read_path(&p).unwrap()
}

/// One policy on one trace: two passes on one allocator.
#[derive(Debug)]
struct Figures {
    ratio: f64,
    cold: DeviceCounters,
    warm: DeviceCounters,
    warm_ratio: f64,
}

fn delta(a: &DeviceCounters, b: &DeviceCounters) -> DeviceCounters {
    DeviceCounters {
        mallocs: b.mallocs - a.mallocs,
        frees: b.frees - a.frees,
        maps: b.maps - a.maps,
        unmaps: b.unmaps - a.unmaps,
        pages_mapped: b.pages_mapped - a.pages_mapped,
        pages_unmapped: b.pages_unmapped - a.pages_unmapped,
        events_recorded: b.events_recorded - a.events_recorded,
        synchronizes: b.synchronizes - a.synchronizes,
    }
}

fn measure(name: &str, policy: &str) -> Figures {
    measure_at(name, policy, ReplayOptions::default().capacity)
}

/// [`measure`] on a simulated GPU of `capacity` bytes.
fn measure_at(name: &str, policy: &str, capacity: u64) -> Figures {
    let t = trace(name);
    let opts = ReplayOptions {
        policy: policy.into(),
        repeats: 0,
        capacity,
        ..ReplayOptions::default()
    };
    let cfg = effective_config(&t, &opts).unwrap();
    let p = Program::compile(&t.devices[0]);
    let (target, alloc) = new_allocator(&p, &cfg, &opts, false).unwrap();
    let mut slots = vec![0u64; p.slots as usize];
    let (_, ooms, _) = run_once(&p, &mut alloc.lock(), &target, &mut slots, false);
    assert_eq!(ooms, 0, "{name} under {policy}");
    let s = alloc.stats();
    let ratio = s.reserved_bytes.all().peak as f64 / s.requested_bytes.all().peak as f64;
    free_leftovers(&mut alloc.lock(), &target, &mut slots);
    let cold = target.device().counters();
    alloc.reset_peak_memory_stats();
    let (_, ooms, _) = run_once(&p, &mut alloc.lock(), &target, &mut slots, false);
    assert_eq!(ooms, 0, "{name} under {policy}, warm");
    let s = alloc.stats();
    let warm_ratio = s.reserved_bytes.all().peak as f64 / s.requested_bytes.all().peak as f64;
    let warm = delta(&cold, &target.device().counters());
    Figures {
        ratio,
        cold,
        warm,
        warm_ratio,
    }
}

#[test]
fn default_policy_keeps_its_pinned_fragmentation_and_warm_pass() {
    let mut off_goal = Vec::new();
    for &(name, pin, warm_calls, cold_maps) in PINNED {
        let f = measure(name, DEFAULT);
        let w = &f.warm;
        eprintln!(
            "{name}: {DEFAULT} ratio {:.4} warm {:.4}, warm driver calls {w:?}",
            f.ratio, f.warm_ratio
        );
        assert!(
            f.ratio <= pin,
            "{name}: peak reserved / peak requested {:.4} > pinned {pin}",
            f.ratio
        );
        assert!(
            f.warm_ratio <= pin,
            "{name}: warm pass {:.4} > pinned {pin}",
            f.warm_ratio
        );
        let calls = w.maps + w.unmaps + w.mallocs + w.frees;
        assert!(
            calls <= warm_calls,
            "{name}: the warm pass called the driver {calls} times (pinned {warm_calls}): {w:?}"
        );
        assert!(
            f.cold.maps <= cold_maps,
            "{name}: the cold pass made {} mappings (pinned {cold_maps})",
            f.cold.maps
        );
        if f.ratio > GOAL_RATIO || calls > 0 {
            off_goal.push(name);
        }
    }
    eprintln!("off the goal ({GOAL_RATIO}, no warm driver calls): {off_goal:?}");
}

/// At another plentiful capacity the default's figures are the same pins.
#[test]
fn default_policy_keeps_them_at_141_gb_too() {
    for &(name, pin, warm_calls, cold_maps) in PINNED {
        let f = measure_at(name, DEFAULT, H200_ADVERTISED);
        let w = &f.warm;
        let calls = w.maps + w.unmaps + w.mallocs + w.frees;
        assert!(
            f.ratio.max(f.warm_ratio) <= pin,
            "{name}: {:.4} > pinned {pin}",
            f.ratio
        );
        assert!(
            calls <= warm_calls,
            "{name}: the warm pass called the driver {calls} times: {w:?}"
        );
        assert!(f.cold.maps <= cold_maps, "{name}: {} cold mappings", f.cold.maps);
    }
}

/// The default's smallest GPU stays within its pin, and within 3% of peak requested, on every
/// trace: at the limit it moves free pages from holes to where a request needs them.
#[test]
fn default_policy_fits_within_its_pinned_gpu() {
    for &(name, pin) in PINNED_FIT {
        let t = trace(name);
        let opts = ReplayOptions {
            policy: DEFAULT.into(),
            repeats: 0,
            ..ReplayOptions::default()
        };
        let smallest = cudamem_replay::fit(&t, &opts).unwrap();
        let peak = cudamem_replay::replay(
            &t,
            &ReplayOptions {
                plan_addresses: Some(false),
                ..opts
            },
        )
        .unwrap()
        .max(|d| d.peak_requested_bytes);
        let ratio = smallest as f64 / peak as f64;
        eprintln!("{name}: smallest GPU {smallest} bytes, {ratio:.4} x peak requested");
        assert!(
            ratio <= pin,
            "{name}: smallest GPU {ratio:.4} x peak requested > pinned {pin}"
        );
        assert!(ratio <= GOAL_RATIO, "{name}: {ratio:.4} > the goal {GOAL_RATIO}");
    }
}

#[test]
fn compact16_keeps_its_pinned_fragmentation_and_warm_pass() {
    let policy = "cudamem-compact16";
    for &(name, pin, warm_calls) in PINNED_COMPACT16 {
        let f = measure(name, policy);
        let w = &f.warm;
        let worst = f.ratio.max(f.warm_ratio);
        assert!(
            worst <= pin,
            "{name}: {policy} peak reserved / peak requested {worst:.4} > pinned {pin}"
        );
        let calls = w.maps + w.unmaps + w.mallocs + w.frees;
        assert!(
            calls <= warm_calls,
            "{name}: {policy}'s warm pass called the driver {calls} times (pinned {warm_calls}): {w:?}"
        );
    }
}

/// Every policy's figures, for the design note (prints; asserts nothing but no OOM).
#[test]
#[ignore]
fn table() {
    for &(name, _, _, _) in PINNED {
        for &policy in POLICY_NAMES {
            let f = measure(name, policy);
            let c = &f.cold;
            let w = &f.warm;
            eprintln!(
                "{name:22} {policy:20} ratio {:.4} warm {:.4} | cold maps+unmaps {:6} mallocs+frees {:4} | warm maps+unmaps {:6} mallocs+frees {:4}",
                f.ratio,
                f.warm_ratio,
                c.maps + c.unmaps,
                c.mallocs + c.frees,
                w.maps + w.unmaps,
                w.mallocs + w.frees
            );
        }
    }
}

/// The default's figures by capacity (prints): the capacities in bytes, comma-separated, in
/// `CAPS` (default: the simulated H200, 141 GB, 128 GiB and 80 GiB).
#[test]
#[ignore]
fn by_capacity() {
    let caps = std::env::var("CAPS").unwrap_or("150109880320,141000000000,137438953472,85899345920".into());
    let caps: Vec<u64> = (caps.split(','))
        .map(|c| {
            c.trim()
                .parse()
                .unwrap_or_else(|_| panic!("CAPS: {c:?} is not a number of bytes"))
        })
        .collect();
    for &(name, _, _, _) in PINNED {
        for &c in &caps {
            let f = measure_at(name, DEFAULT, c);
            let (k, w) = (&f.cold, &f.warm);
            eprintln!(
                "{name:22} {c:>14} ratio {:.4} warm {:.4} | cold maps {:6} unmaps {:5} | warm maps {:6} unmaps {:5}",
                f.ratio, f.warm_ratio, k.maps, k.unmaps, w.maps, w.unmaps
            );
        }
    }
}
