//! What mapping physical memory costs on this GPU, through cudamem's CUDA device: N pages of
//! 2 MiB mapped one allocation each (`cuMemCreate`+`cuMemMap`+`cuMemSetAccess` per page) versus
//! one allocation of N × 2 MiB, and the unmaps; then the cold (first-pass, maps included) and
//! warm replay of each shared trace per policy on cuda:0, in ms per pass (medians of 3), and
//! what a policy's first pass costs beyond expandable segments' as a share of the workload: the
//! wall time the trace itself spans (its first to last `time_us`, as recorded on the H200).

use std::time::Instant;

use cudamem_device::Device;
use cudamem_replay::{replay, ReplayOptions};

fn main() {
    if !cudamem_cuda::is_available() {
        println!(
            "SKIPPED: no CUDA device ({})",
            cudamem_cuda::unavailable_reason().unwrap_or_default()
        );
        return;
    }
    let dev = cudamem_cuda::CudaDevice::new(0).expect("cuda:0");
    let g = dev.granularity();
    println!("granularity {g} B");
    println!("| pages (2 MiB) | per-page maps: total µs | per page µs | one mapping: µs | unmap per-page: total µs | unmap one: µs |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for n in [1u64, 10, 50, 250] {
        let va = dev.reserve(n * g * 2).unwrap();
        let t = Instant::now();
        for i in 0..n {
            dev.map(va + i * g, g).unwrap();
        }
        let per = t.elapsed().as_secs_f64() * 1e6;
        let t = Instant::now();
        for i in 0..n {
            dev.unmap(va + i * g, g).unwrap();
        }
        let unper = t.elapsed().as_secs_f64() * 1e6;
        let t = Instant::now();
        dev.map(va, n * g).unwrap();
        let one = t.elapsed().as_secs_f64() * 1e6;
        let t = Instant::now();
        dev.unmap(va, n * g).unwrap();
        let unone = t.elapsed().as_secs_f64() * 1e6;
        dev.release_reservation(va, n * g * 2).unwrap();
        println!(
            "| {n} | {per:.0} | {:.1} | {one:.0} | {unper:.0} | {unone:.0} |",
            per / n as f64
        );
    }
    println!();
    println!("| trace | policy | cold pass ms (maps included) | warm pass ms | device maps | ops | first pass beyond expandable, % of the trace's span |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for name in [
        "gpt2_train",
        "resnet50_train",
        "bert_varlen_infer",
        "multistream_prefetch",
    ] {
        let trace = cudamem_trace::read_path(std::path::Path::new(&format!("tests/data/{name}.pickle.gz"))).unwrap();
        let times = trace.devices.iter().flat_map(|d| d.events.iter().map(|e| e.time_us));
        let (first, last) = times.fold((i64::MAX, i64::MIN), |(a, b), t| (a.min(t), b.max(t)));
        let span_ms = (last - first).max(1) as f64 / 1e3;
        let mut expandable_cold = f64::NAN;
        for policy in ["pytorch", "pytorch-expandable", "cudamem", "cudamem-compact"] {
            let o = ReplayOptions {
                policy: policy.into(),
                device: "cuda:0".into(),
                repeats: 2, // fresh allocators: the median of 3 first passes
                deferred_frees: false,
                ..ReplayOptions::default()
            };
            let cold = replay(&trace, &o).unwrap();
            let warm = replay(
                &trace,
                &ReplayOptions {
                    repeats: 3,
                    warm: true,
                    ..o.clone()
                },
            )
            .unwrap();
            let d = &cold.devices[0];
            let cold_ms = d.replay_ns_per_op * d.ops as f64 / 1e6;
            if policy == "pytorch-expandable" {
                expandable_cold = cold_ms;
            }
            let extra = if policy.starts_with("cudamem") {
                format!(
                    "{:.2}% of {:.0} ms",
                    100.0 * (cold_ms - expandable_cold) / span_ms,
                    span_ms
                )
            } else {
                "–".into()
            };
            println!(
                "| {name} | {policy} | {cold_ms:.1} | {:.1} | {} | {} | {extra} |",
                warm.devices[0].replay_ns_per_op * d.ops as f64 / 1e6,
                d.device_calls.maps,
                d.ops
            );
        }
    }
}
