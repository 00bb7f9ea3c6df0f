//! Replays one trace a fixed number of times on fresh simulated devices, for instruction counts
//! under callgrind (load and compile are outside `run_once`, so collect only inside it):
//! `valgrind --tool=callgrind --toggle-collect='*run_once*' target/release/examples/replay_instr TRACE [policy] [passes] [warm]`.
//! With `warm`, the passes after the first run on the first pass's allocator (its cache full,
//! as `replay --warm` times them); the warm cost of a pass is then the difference between
//! `passes` = N + 1 and `passes` = 1, divided by N.
use cudamem_replay::{effective_config, free_leftovers, new_allocator, run_once, Program, ReplayOptions};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: replay_instr TRACE [policy] [passes] [warm]");
    let policy = args.next().unwrap_or_else(|| "cudamem".into());
    let passes: usize = args.next().map_or(3, |s| s.parse().expect("passes: a number"));
    let warm = match args.next().as_deref() {
        None => false,
        Some("warm") => true,
        Some(other) => panic!("the fourth argument is `warm` or nothing, not '{other}'"),
    };
    let trace = cudamem_trace::read_path(std::path::Path::new(&path)).unwrap();
    let p = Program::compile(&trace.devices[0]);
    let opts = ReplayOptions {
        policy: policy.clone(),
        ..ReplayOptions::default()
    };
    let cfg = effective_config(&trace, &opts).unwrap();
    let mut slots = vec![0u64; p.slots as usize];
    let mut total = 0u64;
    let mut first = None;
    for _ in 0..passes {
        if !warm || first.is_none() {
            first = Some(
                new_allocator(
                    &p,
                    &cfg,
                    &opts,
                    cudamem_alloc::policy::registry::replays_recorded_decisions(&policy),
                )
                .unwrap(),
            );
        }
        let (target, alloc) = first.as_ref().unwrap();
        let mut e = alloc.lock();
        if warm {
            free_leftovers(&mut e, target, &mut slots); // as `replay --warm` does
        }
        total += run_once(&p, &mut e, target, &mut slots, false).0;
    }
    println!(
        "{} ops per pass, {:.1} ns/op",
        p.trace_ops,
        total as f64 / (passes as f64 * p.trace_ops as f64)
    );
}
