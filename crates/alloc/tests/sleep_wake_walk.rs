//! A seeded random walk over tags, sleep and wake on the simulated device, with device faults,
//! checking every rule after every step (the scripted cases are in `sleep_wake.rs`).

use std::sync::Arc;

use cudamem_alloc::{AllocatorConfig, CachingAllocator};
use cudamem_device::sim::{FaultOp, FaultPlan, SimConfig, SimDevice};
use cudamem_device::{Device, StreamId};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId(0);
const POLICIES: &[&str] = cudamem_alloc::policy::POLICY_NAMES;

fn setup(policy: &str, capacity: u64) -> (Arc<SimDevice>, CachingAllocator) {
    let sim = Arc::new(SimDevice::new(SimConfig {
        capacity,
        ..SimConfig::default()
    }));
    let dev: Arc<dyn Device> = sim.clone();
    let a = CachingAllocator::with_policy(dev, AllocatorConfig::default(), policy).unwrap();
    (sim, a)
}

fn check(sim: &SimDevice, a: &CachingAllocator) {
    a.check_invariants().unwrap();
    sim.check().unwrap();
}

/// A pattern of `len` bytes that differs with `seed` and contains no zero byte.
fn pattern(len: u64, seed: u64) -> Vec<u8> {
    (0..len).map(|i| ((i * 7 + seed * 13) % 255 + 1) as u8).collect()
}

/// A seeded random walk over tagged and untagged allocations, frees, sleeps (with and without
/// offload), wakes, `empty_cache` and device faults, checking the invariants and the bytes of
/// every awake block after every step.
#[test]
fn random_walk_keeps_every_rule() {
    const TAGS: [&str; 3] = ["weights", "kv", "opt"];
    for &policy in POLICIES {
        for seed in 1..4u64 {
            let (sim, a) = setup(policy, 256 * MIB);
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut next = |n: u64| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % n
            };
            // (pointer, bytes written, tag, expected bytes)
            let mut live: Vec<(u64, u64, Option<usize>, Vec<u8>)> = Vec::new();
            let mut asleep = [false; 3];
            for step in 0..300u64 {
                let what = next(10);
                let tag = next(3) as usize;
                let ctx = format!("{policy} seed {seed} step {step} op {what}");
                match what {
                    0..=3 => {
                        let size = [512, 300 << 10, 3 * MIB, 9 * MIB][next(4) as usize];
                        let tagged = what < 3;
                        let r = if tagged {
                            a.malloc_tagged(size, S0, TAGS[tag])
                        } else {
                            a.malloc(size, S0)
                        };
                        match r {
                            Ok(p) => {
                                let n = size.min(4096);
                                let bytes = pattern(n, step);
                                sim.write(p, &bytes).unwrap();
                                live.push((p, n, tagged.then_some(tag), bytes));
                            }
                            Err(e) if tagged && asleep[tag] => assert!(e.to_string().contains(TAGS[tag]), "{ctx}"),
                            Err(e) => assert!(e.is_out_of_memory(), "{ctx}: {e}"),
                        }
                    }
                    4 | 5 if !live.is_empty() => {
                        let i = next(live.len() as u64) as usize;
                        a.free(live.swap_remove(i).0).unwrap();
                    }
                    6 => {
                        let offload = next(2) == 0;
                        match a.sleep(&[TAGS[tag]], offload) {
                            Ok(()) => {
                                assert!(!asleep[tag], "{ctx}");
                                asleep[tag] = true;
                                for b in live.iter_mut().filter(|b| b.2 == Some(tag) && !offload) {
                                    b.3 = vec![0; b.1 as usize];
                                }
                            }
                            Err(e) => assert!(
                                asleep[tag] || a.tags().iter().all(|t| t.name != TAGS[tag]),
                                "{ctx}: {e}"
                            ),
                        }
                    }
                    7 | 8 => {
                        if next(4) == 0 {
                            sim.set_faults(FaultPlan::default().fail_fraction(
                                &[FaultOp::Map, FaultOp::Copy],
                                0.3,
                                step,
                            ));
                        }
                        match a.wake(&[TAGS[tag]]) {
                            Ok(()) => asleep[tag] = false,
                            Err(_) => assert!(
                                !asleep[tag] || a.tags().iter().any(|t| t.name == TAGS[tag] && t.asleep),
                                "{ctx}: a failed wake left the tag awake"
                            ),
                        }
                        sim.set_faults(FaultPlan::default());
                    }
                    _ => {
                        let _ = a.empty_cache();
                    }
                }
                check(&sim, &a);
                for (p, n, t, bytes) in &live {
                    if t.is_none_or(|t| !asleep[t]) {
                        assert!(sim.read(*p, *n).unwrap() == *bytes, "{ctx}: bytes of {p:#x}");
                    }
                }
                let slept: u64 = a.tags().iter().map(|t| t.sleeping_bytes).sum();
                assert_eq!(a.sleep_stats().sleeping_bytes, slept, "{ctx}");
            }
            let _ = a.wake(&[]);
            for (p, ..) in live {
                a.free(p).unwrap();
            }
            a.empty_cache().unwrap();
            check(&sim, &a);
            assert_eq!(sim.used(), 0, "{policy} seed {seed}: everything went back");
        }
    }
}
