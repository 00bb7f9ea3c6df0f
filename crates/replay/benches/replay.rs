//! Replay speed: ns per trace operation (alloc or free) of each shared trace, per policy, load
//! and compile excluded; the cache-hit alloc+free pair on the simulated device; and the same
//! pairs from 1 and 2 threads on their own streams, with one lock and with `sharded:True`
//! (`threads` group: time per pair of all threads together, so lower is more throughput).
//! Run: `cargo bench -p cudamem-replay --bench replay`.

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use cudamem_alloc::policy::registry;
use cudamem_alloc::{AllocatorConfig, CachingAllocator};
use cudamem_device::sim::SimDevice;
use cudamem_device::{Device, StreamId};
use cudamem_replay::{effective_config, new_allocator, run_once, Program, ReplayOptions};
use cudamem_sharded::workload::pairs_on_own_streams;
use cudamem_sharded::ShardedAllocator;

const TRACES: &[&str] = &[
    "gpt2_train",
    "resnet50_train",
    "bert_varlen_infer",
    "multistream_prefetch",
];

fn replay(c: &mut Criterion) {
    let mut g = c.benchmark_group("replay");
    g.sample_size(20);
    for name in TRACES {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data")
            .join(format!("{name}.pickle.gz"));
        let trace = cudamem_trace::read_path(&path).unwrap();
        let p = Program::compile(&trace.devices[0]);
        g.throughput(Throughput::Elements(p.trace_ops));
        for policy in registry::default_policies().split(',') {
            let opts = ReplayOptions {
                policy: policy.into(),
                ..ReplayOptions::default()
            };
            let cfg = effective_config(&trace, &opts).unwrap();
            let mut slots = vec![0u64; p.slots as usize];
            g.bench_function(format!("{name}/{policy}"), |b| {
                b.iter_batched(
                    || new_allocator(&p, &cfg, &opts, registry::replays_recorded_decisions(policy)).unwrap(),
                    |(target, alloc)| {
                        let mut e = alloc.lock();
                        run_once(&p, &mut e, &target, &mut slots, false)
                    },
                    BatchSize::LargeInput,
                )
            });
        }
    }
    g.finish();
}

fn pair(c: &mut Criterion) {
    let mut g = c.benchmark_group("cache_hit_pair");
    for (label, size) in [
        ("512B", 512u64),
        ("64KiB", 64 << 10),
        ("1MiB", 1 << 20),
        ("16MiB", 16 << 20),
        ("64MiB", 64 << 20),
    ] {
        for &policy in cudamem_alloc::policy::POLICY_NAMES {
            let dev: std::sync::Arc<dyn Device> = std::sync::Arc::new(SimDevice::default());
            let a = CachingAllocator::with_policy(dev, AllocatorConfig::default(), policy).unwrap();
            let p = a.malloc(size, StreamId(0)).unwrap();
            a.free(p).unwrap();
            g.bench_function(format!("{label}/{policy}"), |b| {
                b.iter(|| {
                    let p = a.malloc(size, StreamId(0)).unwrap();
                    a.free(p).unwrap();
                })
            });
        }
    }
    g.finish();
}

/// What recording history costs: the cache-hit pair with history off, on without stacks, and
/// on with a 3-frame stack per allocation (the Python package passes Python frames this way).
fn history(c: &mut Criterion) {
    use cudamem_alloc::{Frame, RecordContext};
    let mut g = c.benchmark_group("history");
    for mode in ["off", "on", "on+stack"] {
        let dev: std::sync::Arc<dyn Device> = std::sync::Arc::new(SimDevice::default());
        let a = CachingAllocator::with_policy(dev, AllocatorConfig::default(), "pytorch").unwrap();
        if mode != "off" {
            a.record_memory_history(true, RecordContext::All, 100_000);
        }
        let frames: Vec<Frame> = (0..3)
            .map(|i| Frame {
                name: format!("f{i}"),
                filename: "model.py".into(),
                line: 10 + i,
            })
            .collect();
        g.bench_function(format!("512B_pair/{mode}"), |b| {
            b.iter(|| {
                let p = if mode == "on+stack" {
                    a.malloc_with_stack(512, StreamId(0), frames.clone()).unwrap()
                } else {
                    a.malloc(512, StreamId(0)).unwrap()
                };
                a.free(p).unwrap();
            })
        });
    }
    g.finish();
}

/// Pairs of mixed sizes from `threads` threads, each on its own stream, through one lock or
/// through shards; criterion times `iters` pairs of all threads together.
fn threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("threads");
    for n in [1usize, 2] {
        for sharded in [false, true] {
            let dev = || -> std::sync::Arc<dyn Device> { std::sync::Arc::new(SimDevice::default()) };
            let one = CachingAllocator::with_policy(dev(), AllocatorConfig::default(), "cudamem").unwrap();
            let sh = ShardedAllocator::new(dev(), AllocatorConfig::default(), "cudamem").unwrap();
            let label = format!("{n}_threads/{}", if sharded { "sharded" } else { "one_lock" });
            g.bench_function(label, |b| {
                b.iter_custom(|iters| {
                    let per = (iters as usize).div_ceil(n);
                    let start = std::time::Instant::now();
                    pairs_on_own_streams(&one, sharded.then_some(&sh), n, per);
                    start.elapsed()
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, replay, pair, history, threads);
criterion_main!(benches);
