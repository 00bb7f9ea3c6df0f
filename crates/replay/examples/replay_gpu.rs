//! Replays every shared trace on the simulated GPU and on `cuda:0` with each policy, side by
//! side: peak reserved and device allocations must agree between the two devices; the real
//! device's warm replay gives ns per allocator operation through the CUDA device.
//! Usage: `replay_gpu [TRACE...]` (default: tests/data/*.pickle.gz). Without a GPU it says so
//! and replays on the simulated device only. The warm figure is the median of `REPEATS` passes
//! (environment; default 21): a pass of the shortest trace takes about a millisecond, and on a
//! machine with shared CPUs a few slow passes weigh less in a median of more.
//!
//! The whole table is measured `ROUNDS` times (environment; default 5) and each ns/op cell is
//! the median of its rounds, with their range beside it. A machine that switches between two
//! speeds within a second (as the H200 host does, `docs/bench/README.md`) gives one row's
//! passes, a few tens of milliseconds, a single speed; a median over rounds spread across the
//! run samples both. Peaks and device allocations must agree in every round.
//!
//! Beside each row, a clock probe: a chain of dependent multiplications timed right before the
//! row, converted to GHz at 3 cycles each (the latency of `imul` on current x86 cores). It
//! tells a slower clock (the probe slows as much as the replay) from a busy neighbour on the same
//! core or cache (the replay slows, the probe barely). The rounds' rows follow the table.

#[path = "common/clock.rs"]
mod clock;

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
    let repeats = count_from_env("REPEATS", 21, "warm passes");
    let rounds = count_from_env("ROUNDS", 5, "rounds");
    let gpu = cudamem_cuda::is_available();
    if !gpu {
        println!(
            "SKIPPED cuda:0 columns: no CUDA device ({})",
            cudamem_cuda::unavailable_reason().unwrap_or_default()
        );
    }
    let traces: Vec<(String, _)> = paths
        .iter()
        .map(|path| {
            let trace = cudamem_trace::read_path(path).expect("trace loads");
            let name = path.file_name().unwrap().to_string_lossy().replace(".pickle.gz", "");
            (name, trace)
        })
        .collect();
    const POLICIES: [&str; 4] = ["pytorch", "pytorch-expandable", "cudamem", "cudamem-compact"];
    // rows[trace × policy]: the first round's peaks and allocations, and every round's ns/op.
    let mut rows: Vec<Row> = Vec::new();
    let mut disagreements = 0;
    for round in 0..rounds {
        for (t, (_, trace)) in traces.iter().enumerate() {
            for (p, policy) in POLICIES.iter().enumerate() {
                // Deferred frees off on both sides: a real device cannot hold a stream back
                // until a trace's free_completed, so both replay such frees at once.
                let base = ReplayOptions {
                    policy: (*policy).into(),
                    repeats,
                    warm: true,
                    plan_addresses: Some(false),
                    deferred_frees: false,
                    ..ReplayOptions::default()
                };
                let ghz = clock::clock_ghz(21);
                let s = replay(trace, &base).expect("sim replay");
                let sd = &s.devices[0];
                let cuda = gpu.then(|| {
                    let c = replay(
                        trace,
                        &ReplayOptions {
                            device: "cuda:0".into(),
                            ..base.clone()
                        },
                    )
                    .expect("cuda replay");
                    c.devices[0].clone()
                });
                if round == 0 {
                    rows.push(Row {
                        sim_peak: sd.peak_reserved_bytes,
                        sim_allocs: sd.device_allocs,
                        cuda_peak: cuda.as_ref().map(|c| c.peak_reserved_bytes),
                        cuda_allocs: cuda.as_ref().map(|c| c.device_allocs),
                        agree: true,
                        sim_ns: Vec::new(),
                        ghz: Vec::new(),
                        cuda_ns: Vec::new(),
                    });
                }
                let row = &mut rows[t * POLICIES.len() + p];
                // Every round must give the first round's figures, and the real device the
                // simulated one's.
                let same_sim = sd.peak_reserved_bytes == row.sim_peak && sd.device_allocs == row.sim_allocs;
                let same_cuda = cuda.as_ref().is_none_or(|c| {
                    c.peak_reserved_bytes == row.sim_peak && c.device_allocs == row.sim_allocs && c.ooms == 0
                });
                if row.agree && !(same_sim && same_cuda) {
                    row.agree = false;
                    disagreements += 1;
                }
                row.sim_ns.push(sd.replay_ns_per_op);
                row.ghz.push(ghz);
                if let Some(c) = &cuda {
                    row.cuda_ns.push(c.replay_ns_per_op);
                }
            }
        }
    }
    println!("warm ns/op: median of {rounds} rounds (range in brackets), each the median of {repeats} passes");
    println!("| trace | policy | sim peak reserved | cuda:0 peak reserved | sim dev allocs | cuda:0 dev allocs | agree | sim ns/op (warm) | cuda:0 ns/op (warm) | clock probe, GHz |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (t, (name, _)) in traces.iter().enumerate() {
        for (p, policy) in POLICIES.iter().enumerate() {
            let row = &rows[t * POLICIES.len() + p];
            let na = || "n/a".to_string();
            println!(
                "| {name} | {policy} | {} | {} | {} | {} | {} | {} | {} | {} |",
                row.sim_peak,
                row.cuda_peak.map_or_else(na, |v| v.to_string()),
                row.sim_allocs,
                row.cuda_allocs.map_or_else(na, |v| v.to_string()),
                if gpu { row.agree.to_string() } else { na() },
                summary(&row.sim_ns),
                if gpu { summary(&row.cuda_ns) } else { na() },
                summary(&row.ghz),
            );
        }
    }
    if rounds > 1 {
        println!();
        println!("rounds: clock probe GHz / sim ns/op / cuda:0 ns/op, round by round");
        let heads: Vec<String> = (1..=rounds).map(|r| format!("round {r}")).collect();
        println!("| trace | policy | {} |", heads.join(" | "));
        println!("|---|---|{}", "---|".repeat(rounds));
        for (t, (name, _)) in traces.iter().enumerate() {
            for (p, policy) in POLICIES.iter().enumerate() {
                let row = &rows[t * POLICIES.len() + p];
                let cells: Vec<String> = (0..rounds)
                    .map(|r| {
                        let cuda = row.cuda_ns.get(r).map_or("n/a".into(), |v| format!("{v:.1}"));
                        format!("{:.2} / {:.1} / {cuda}", row.ghz[r], row.sim_ns[r])
                    })
                    .collect();
                println!("| {name} | {policy} | {} |", cells.join(" | "));
            }
        }
    }
    println!("disagreements: {disagreements}");
    if disagreements > 0 {
        std::process::exit(1);
    }
}

/// One table row: a trace replayed with one policy.
struct Row {
    sim_peak: u64,
    sim_allocs: u64,
    cuda_peak: Option<u64>,
    cuda_allocs: Option<u64>,
    agree: bool,
    sim_ns: Vec<f64>,
    /// The clock probe before each round's replays.
    ghz: Vec<f64>,
    cuda_ns: Vec<f64>,
}

/// "median [min–max]" of per-round figures; just the figure for one round.
fn summary(v: &[f64]) -> String {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let median = v[v.len() / 2];
    if v.len() == 1 {
        format!("{median:.1}")
    } else {
        format!("{median:.1} [{:.1}–{:.1}]", v[0], v[v.len() - 1])
    }
}

/// A count of 1 or more from the environment variable `var`, `default` when unset; anything
/// else ends the program with a message (exit 2).
fn count_from_env(var: &str, default: usize, what: &str) -> usize {
    match std::env::var(var) {
        Ok(v) => match v.parse() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("replay_gpu: {var}={v}: expected a number of {what}, 1 or more");
                std::process::exit(2);
            }
        },
        Err(_) => default,
    }
}
