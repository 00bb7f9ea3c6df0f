//! What taking the engine's lock costs a cache-hit pair (512 B, simulated device, another
//! allocation live so that the keep-alive never changes hands), one line per round:
//! * `engine`: the lock taken once around all the pairs (the engine alone);
//! * `std::sync::Mutex`: an engine behind `std::sync::Mutex`, locked per operation, the
//!   lock `CachingAllocator` had before `EngineLock` (given back with an atomic swap);
//! * `EngineLock`: `CachingAllocator::malloc` / `free`, locked per operation (given back with a
//!   plain store; see `cudamem_alloc::EngineLock`);
//! * `api`: `Allocator::alloc` and dropping the buffer (the Rust API, `gpu_bench`'s pair path).
//!
//! `cargo run --release -p cudamem --example lock_cost [ROUNDS]`
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudamem::{Allocator, Stream};
use cudamem_alloc::{AllocatorConfig, CachingAllocator, Engine};
use cudamem_device::{sim::SimDevice, StreamId};

const N: usize = 1_000_000;

fn ns_per_pair(f: impl FnMut()) -> f64 {
    let mut f = f;
    let t = Instant::now();
    for _ in 0..N {
        f();
    }
    t.elapsed().as_nanos() as f64 / N as f64
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(5, |s| s.parse().expect("ROUNDS: a number"));
    let s0 = StreamId(0);
    let c =
        CachingAllocator::with_policy(Arc::new(SimDevice::default()), AllocatorConfig::default(), "cudamem").unwrap();
    let mut cfg = AllocatorConfig::default();
    let policy = cudamem_alloc::policy::by_name("cudamem", &mut cfg).unwrap();
    let m: Mutex<Engine> = Mutex::new(Engine::new(Arc::new(SimDevice::default()), cfg, policy));
    let a = Allocator::with_config("sim", "", "cudamem").unwrap();
    let _live = (
        c.malloc(4096, s0).unwrap(),
        m.lock().unwrap().malloc(4096, s0).unwrap(),
        a.alloc(4096, Stream::DEFAULT).unwrap(),
    );
    println!("ns per 512 B cache-hit alloc+free pair, {N} pairs per cell");
    println!("| round | engine | std::sync::Mutex | EngineLock | api |");
    println!("|---:|---:|---:|---:|---:|");
    for r in 1..=rounds {
        let engine = {
            let mut e = c.lock();
            ns_per_pair(|| {
                let p = e.malloc(512, s0).unwrap();
                e.free(black_box(p)).unwrap();
            })
        };
        let std_mutex = ns_per_pair(|| {
            let p = m.lock().unwrap().malloc(512, s0).unwrap();
            m.lock().unwrap().free(black_box(p)).unwrap();
        });
        let engine_lock = ns_per_pair(|| {
            let p = c.malloc(512, s0).unwrap();
            c.free(black_box(p)).unwrap();
        });
        let api = ns_per_pair(|| drop(black_box(a.alloc(512, Stream::DEFAULT).unwrap())));
        println!("| {r} | {engine:.1} | {std_mutex:.1} | {engine_lock:.1} | {api:.1} |");
    }
}
