//! Property tests: random sequences of alloc / free / record_stream / empty_cache / event
//! completion, under several configurations and with random device failures, with every
//! invariant checked after every step (see `cudamem_alloc::invariants`).

use std::sync::Arc;

use cudamem_alloc::{AllocatorConfig, CachingAllocator};
use cudamem_device::sim::{EventMode, FaultOp, FaultPlan, SimConfig, SimDevice};
use cudamem_device::{Device, StreamId};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Step {
    Alloc { size: u64, stream: u8 },
    Free { pick: usize },
    RecordStream { pick: usize, stream: u8 },
    CompleteStream { stream: u8 },
    EmptyCache,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..4096,
        4 => 4096u64..(1 << 20) + 1,
        3 => (1u64 << 20)..(12 << 20),
        1 => (12u64 << 20)..(90 << 20),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (size(), 0u8..3).prop_map(|(size, stream)| Step::Alloc { size, stream }),
        5 => any::<usize>().prop_map(|pick| Step::Free { pick }),
        1 => (any::<usize>(), 0u8..3).prop_map(|(pick, stream)| Step::RecordStream { pick, stream }),
        1 => (0u8..3).prop_map(|stream| Step::CompleteStream { stream }),
        1 => Just(Step::EmptyCache),
    ]
}

/// (policy, settings) pairs the properties are checked under.
const CONFIGS: &[(&str, &str)] = &[
    ("pytorch", ""),
    ("pytorch", "expandable_segments:True"),
    ("pytorch", "max_split_size_mb:24"),
    ("pytorch", "roundup_power2_divisions:4"),
    ("pytorch", "garbage_collection_threshold:0.6"),
    ("cudamem", ""),
    ("cudamem", "max_split_size_mb:24"),
    ("cudamem-compact", ""),
];

fn run(
    steps: &[Step],
    (policy, cfg): (&str, &str),
    capacity: u64,
    fault_seed: Option<u64>,
) -> Result<(), TestCaseError> {
    let sim = Arc::new(SimDevice::new(SimConfig {
        capacity,
        event_mode: EventMode::Manual,
        ..SimConfig::default()
    }));
    let dev: Arc<dyn Device> = sim.clone();
    let a = CachingAllocator::with_policy(dev, AllocatorConfig::parse(cfg).unwrap(), policy).unwrap();
    if cfg.contains("garbage") {
        a.set_memory_fraction(0.8).unwrap();
    }
    if let Some(seed) = fault_seed {
        sim.set_faults(FaultPlan::default().fail_fraction(
            &[FaultOp::Malloc, FaultOp::Map, FaultOp::QueryEvent],
            0.2,
            seed,
        ));
    }
    let mut live: Vec<(u64, u64)> = Vec::new();
    for s in steps {
        match *s {
            Step::Alloc { size, stream } => match a.malloc(size, StreamId(stream as u64)) {
                Ok(p) => {
                    for &(q, qs) in &live {
                        prop_assert!(p + size <= q || q + qs <= p, "new block overlaps a live one");
                    }
                    live.push((p, size));
                }
                Err(e) => prop_assert!(e.is_out_of_memory(), "unexpected error {e}"),
            },
            Step::Free { pick } if !live.is_empty() => {
                let (p, _) = live.swap_remove(pick % live.len());
                a.free(p).unwrap();
            }
            Step::RecordStream { pick, stream } if !live.is_empty() => {
                a.record_stream(live[pick % live.len()].0, StreamId(stream as u64))
                    .unwrap();
            }
            Step::CompleteStream { stream } => sim.complete_stream(StreamId(stream as u64)),
            Step::EmptyCache => a.empty_cache().unwrap(),
            _ => {}
        }
        if let Err(e) = a.check_invariants() {
            return Err(TestCaseError::fail(format!("after {s:?}: {e}")));
        }
        prop_assert!(sim.check().is_ok());
        prop_assert_eq!(a.memory_reserved(), sim.used(), "reserved equals what the device holds");
    }
    sim.set_faults(FaultPlan::default());
    for (p, _) in live {
        a.free(p).unwrap();
    }
    a.empty_cache().unwrap();
    a.check_invariants().map_err(TestCaseError::fail)?;
    prop_assert_eq!(a.memory_reserved(), 0);
    prop_assert_eq!(sim.used(), 0);
    prop_assert_eq!(a.memory_allocated(), 0);
    prop_assert_eq!(sim.live_events(), 0, "every event was destroyed");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_for_every_config(steps in prop::collection::vec(step(), 1..160), c in 0..CONFIGS.len()) {
        run(&steps, CONFIGS[c], 80 << 30, None)?;
    }

    #[test]
    fn invariants_hold_under_memory_pressure(steps in prop::collection::vec(step(), 1..160), c in 0..CONFIGS.len()) {
        run(&steps, CONFIGS[c], 160 << 20, None)?;
    }

    #[test]
    fn nothing_leaks_when_device_calls_fail_at_random(steps in prop::collection::vec(step(), 1..160), c in 0..CONFIGS.len(), seed in 1u64..u64::MAX) {
        run(&steps, CONFIGS[c], 200 << 20, Some(seed))?;
    }
}
