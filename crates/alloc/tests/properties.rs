//! Property tests: random sequences of alloc / free / record_stream / empty_cache / event
//! completion, under several configurations and with random device failures, with every
//! invariant checked after every step (see `cudamem_alloc::check_engine`).

use std::sync::Arc;

use cudamem_alloc::policy::{self, PoolSpec};
use cudamem_alloc::{AllocatorConfig, CachingAllocator, Engine, NoSink, Policy, StatSink};
use cudamem_alloc::{Block, PoolId};
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
    ("cudamem-compact16", ""),
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

/// A policy from outside the crate: every decision forwarded to a built-in policy, which it does
/// not claim to be (`builtin()` keeps its default), so the engine asks it through `dyn Policy`.
#[derive(Debug)]
struct Outside(Box<dyn Policy>);

impl Policy for Outside {
    fn name(&self) -> &str {
        "outside"
    }
    fn pools(&self) -> Vec<PoolSpec> {
        self.0.pools()
    }
    fn round_size(&self, cfg: &AllocatorConfig, size: u64) -> u64 {
        self.0.round_size(cfg, size)
    }
    fn pool_for(&self, cfg: &AllocatorConfig, rounded: u64) -> PoolId {
        self.0.pool_for(cfg, rounded)
    }
    fn allocation_size(&self, cfg: &AllocatorConfig, rounded: u64) -> u64 {
        self.0.allocation_size(cfg, rounded)
    }
    fn expandable_page_size(&self, cfg: &AllocatorConfig, pool: PoolId) -> Option<u64> {
        self.0.expandable_page_size(cfg, pool)
    }
    fn accepts_cached(&self, cfg: &AllocatorConfig, rounded: u64, candidate: u64) -> bool {
        self.0.accepts_cached(cfg, rounded, candidate)
    }
    fn should_split(&self, cfg: &AllocatorConfig, block: &Block, rounded: u64, small_pool: bool) -> bool {
        self.0.should_split(cfg, block, rounded, small_pool)
    }
    fn reclaim_before_growth(&self, need: u64) -> bool {
        self.0.reclaim_before_growth(need)
    }
    fn reclaim_chunk(&self, cfg: &AllocatorConfig, pool: PoolId) -> Option<u64> {
        self.0.reclaim_chunk(cfg, pool)
    }
    fn map_chunk(&self, cfg: &AllocatorConfig, pool: PoolId) -> Option<u64> {
        self.0.map_chunk(cfg, pool)
    }
    fn whole_growth_headroom(&self, cfg: &AllocatorConfig, pool: PoolId) -> Option<f64> {
        self.0.whole_growth_headroom(cfg, pool)
    }
    fn page_mapping_headroom(&self, cfg: &AllocatorConfig, pool: PoolId) -> Option<f64> {
        self.0.page_mapping_headroom(cfg, pool)
    }
    fn reclaim_at_limit(&self) -> bool {
        self.0.reclaim_at_limit()
    }
}

/// A 400 MiB simulated device whose events complete when told, and the named policy with the
/// config its name implies: one side of a differential test.
fn differential_setup(name: &str, settings: &str) -> (Arc<SimDevice>, AllocatorConfig, Box<dyn Policy>) {
    let sim = Arc::new(SimDevice::new(SimConfig {
        capacity: 400 << 20,
        event_mode: EventMode::Manual,
        ..SimConfig::default()
    }));
    let mut cfg = AllocatorConfig::parse(settings).unwrap();
    let p = policy::by_name(name, &mut cfg).unwrap();
    (sim, cfg, p)
}

/// The same steps on a built-in policy (called directly by the engine) and on [`Outside`]
/// wrapping it (called through `dyn Policy`): every address, error and stat must agree.
fn same_through_dyn(steps: &[Step], (name, settings): (&str, &str)) -> Result<(), TestCaseError> {
    let mut pair = Vec::new();
    for outside in [false, true] {
        let (sim, cfg, p) = differential_setup(name, settings);
        prop_assert!(policy::is_builtin(&*p), "{} is built in", name);
        let p: Box<dyn Policy> = if outside { Box::new(Outside(p)) } else { p };
        prop_assert_eq!(
            policy::is_builtin(&*p),
            !outside,
            "only the built-in side is called directly"
        );
        pair.push((sim.clone(), CachingAllocator::new(sim, cfg, p)));
    }
    let mut live: Vec<u64> = Vec::new();
    for s in steps {
        match *s {
            Step::Alloc { size, stream } => {
                let r: Vec<_> = pair
                    .iter()
                    .map(|(_, a)| a.malloc(size, StreamId(stream as u64)).map_err(|e| e.to_string()))
                    .collect();
                prop_assert_eq!(&r[0], &r[1], "malloc({}) after {:?}", size, s);
                if let Ok(p) = r[0] {
                    live.push(p);
                }
            }
            Step::Free { pick } if !live.is_empty() => {
                let p = live.swap_remove(pick % live.len());
                for (_, a) in &pair {
                    a.free(p).unwrap();
                }
            }
            Step::RecordStream { pick, stream } if !live.is_empty() => {
                for (_, a) in &pair {
                    a.record_stream(live[pick % live.len()], StreamId(stream as u64))
                        .unwrap();
                }
            }
            Step::CompleteStream { stream } => {
                for (sim, _) in &pair {
                    sim.complete_stream(StreamId(stream as u64));
                }
            }
            Step::EmptyCache => {
                for (_, a) in &pair {
                    a.empty_cache().unwrap();
                }
            }
            _ => {}
        }
        prop_assert_eq!(pair[0].1.stats(), pair[1].1.stats(), "stats after {:?}", s);
    }
    Ok(())
}

/// A sink that hears (and ignores) every change: an engine with it updates `active` and
/// `active_bytes` itself on every change, where one without a hearing sink lets them mirror
/// `allocation` and `allocated_bytes` until a block first waits for events.
#[derive(Debug, Default)]
struct Hears;

impl StatSink for Hears {
    fn rose(&mut self, _: usize, _: i64, _: i64, _: i64) {}
    fn fell(&mut self, _: usize, _: i64) {}
}

/// The same steps on both engines, with peak and accumulated resets among them: every stat
/// agrees after every step, before and after the first block waits for events.
fn active_mirror_is_exact(steps: &[Step], (name, settings): (&str, &str)) -> Result<(), TestCaseError> {
    fn engine<S: StatSink>(name: &str, settings: &str) -> (Arc<SimDevice>, Engine<S>) {
        let (sim, cfg, p) = differential_setup(name, settings);
        (sim.clone(), Engine::new(sim, cfg, p))
    }
    let (sim_m, mut mirror) = engine::<NoSink>(name, settings);
    let (sim_h, mut hears) = engine::<Hears>(name, settings);
    let mut live: Vec<u64> = Vec::new();
    for (k, s) in steps.iter().enumerate() {
        match *s {
            Step::Alloc { size, stream } => {
                let a = mirror.malloc(size, StreamId(stream as u64)).map_err(|e| e.to_string());
                let b = hears.malloc(size, StreamId(stream as u64)).map_err(|e| e.to_string());
                prop_assert_eq!(&a, &b);
                if let Ok(p) = a {
                    live.push(p);
                }
            }
            Step::Free { pick } if !live.is_empty() => {
                let p = live.swap_remove(pick % live.len());
                mirror.free(p).unwrap();
                hears.free(p).unwrap();
            }
            Step::RecordStream { pick, stream } if !live.is_empty() => {
                let p = live[pick % live.len()];
                mirror.record_stream(p, StreamId(stream as u64)).unwrap();
                hears.record_stream(p, StreamId(stream as u64)).unwrap();
            }
            Step::CompleteStream { stream } => {
                sim_m.complete_stream(StreamId(stream as u64));
                sim_h.complete_stream(StreamId(stream as u64));
            }
            Step::EmptyCache => {
                mirror.empty_cache().unwrap();
                hears.empty_cache().unwrap();
            }
            _ => {}
        }
        if k % 7 == 3 {
            mirror.reset_peak_stats();
            hears.reset_peak_stats();
        }
        if k % 11 == 5 {
            mirror.reset_accumulated_stats();
            hears.reset_accumulated_stats();
        }
        prop_assert_eq!(mirror.stats(), hears.stats(), "stats after step {}: {:?}", k, s);
    }
    Ok(())
}

// Two differential properties: each runs the same steps on two engines that must agree.
proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_builtin_policy_decides_the_same_called_directly_or_through_dyn(steps in prop::collection::vec(step(), 1..200), c in 0..CONFIGS.len()) {
        same_through_dyn(&steps, CONFIGS[c])?;
    }

    #[test]
    fn active_stats_mirror_allocation_exactly(steps in prop::collection::vec(step(), 1..200), c in 0..CONFIGS.len()) {
        active_mirror_is_exact(&steps, CONFIGS[c])?;
    }
}
