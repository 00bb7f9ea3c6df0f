//! Replays every shared trace on the simulated GPU and on `cuda:0` with each policy, side by
//! side: peak reserved and device allocations must agree between the two devices; the real
//! device's warm replay gives ns per allocator operation through the CUDA device.
//! Usage: `replay_gpu [TRACE...]` (default: tests/data/*.pickle.gz). Without a GPU it says so
//! and replays on the simulated device only. The warm figure is the median of `REPEATS` passes
//! (environment; default 21, 5 until 2026-12-01): a pass of the shortest trace takes about a
//! millisecond, and on the GPU machine's shared CPUs a few slow passes weigh less in a median
//! of more.

use std::path::PathBuf;

use cudamem_replay::{replay, ReplayOptions};

fn main() {
    let mut paths: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    if paths.is_empty() {
        for n in [
            "gpt2_train",
            "resnet50_train",
            "bert_varlen_infer",
            "multistream_prefetch",
        ] {
            paths.push(PathBuf::from(format!("tests/data/{n}.pickle.gz")));
        }
    }
    let repeats: usize = match std::env::var("REPEATS") {
        Ok(v) => match v.parse() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("replay_gpu: REPEATS={v}: expected a number of warm passes, 1 or more");
                std::process::exit(2);
            }
        },
        Err(_) => 21,
    };
    let gpu = cudamem_cuda::is_available();
    if !gpu {
        println!(
            "SKIPPED cuda:0 columns: no CUDA device ({})",
            cudamem_cuda::unavailable_reason().unwrap_or_default()
        );
    }
    println!("warm ns/op: median of {repeats} passes");
    println!("| trace | policy | sim peak reserved | cuda:0 peak reserved | sim dev allocs | cuda:0 dev allocs | agree | sim ns/op (warm) | cuda:0 ns/op (warm) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut disagreements = 0;
    for path in &paths {
        let trace = cudamem_trace::read_path(path).expect("trace loads");
        let name = path.file_name().unwrap().to_string_lossy().replace(".pickle.gz", "");
        for policy in ["pytorch", "pytorch-expandable", "cudamem", "cudamem-compact"] {
            // Deferred frees off on both sides: a real device cannot hold a stream back until a
            // trace's free_completed, so both replay such frees at once.
            let base = ReplayOptions {
                policy: policy.into(),
                repeats,
                warm: true,
                plan_addresses: Some(false),
                deferred_frees: false,
                ..ReplayOptions::default()
            };
            let s = replay(&trace, &base).expect("sim replay");
            let sd = &s.devices[0];
            let (cp, ca, cns, agree) = if gpu {
                let c = replay(
                    &trace,
                    &ReplayOptions {
                        device: "cuda:0".into(),
                        ..base.clone()
                    },
                )
                .expect("cuda replay");
                let cd = &c.devices[0];
                let agree = cd.peak_reserved_bytes == sd.peak_reserved_bytes
                    && cd.device_allocs == sd.device_allocs
                    && cd.ooms == 0;
                if !agree {
                    disagreements += 1;
                }
                (
                    cd.peak_reserved_bytes.to_string(),
                    cd.device_allocs.to_string(),
                    format!("{:.1}", cd.replay_ns_per_op),
                    agree.to_string(),
                )
            } else {
                ("n/a".into(), "n/a".into(), "n/a".into(), "n/a".into())
            };
            println!(
                "| {name} | {policy} | {} | {cp} | {} | {ca} | {agree} | {:.1} | {cns} |",
                sd.peak_reserved_bytes, sd.device_allocs, sd.replay_ns_per_op
            );
        }
    }
    println!("disagreements: {disagreements}");
    if disagreements > 0 {
        std::process::exit(1);
    }
}
