//! What the allocator's keep-alive costs a cache-hit pair when the pair is the only live
//! buffer of its shard (with `sharded:True` its count goes 0 → 1 → 0 every time: a keep-alive
//! count is taken and given back; without sharding none is taken while a handle exists, so
//! the two figures should match), against the same pair with another buffer kept live.
//! `cargo run --release -p cudamem --example keepalive_cost`
use std::time::Instant;

use cudamem::{Allocator, Stream};

fn pairs(a: &Allocator, n: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        drop(a.alloc(512, Stream::DEFAULT).unwrap());
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    for config in ["", "sharded:True"] {
        let a = Allocator::with_config("sim", config, "cudamem").unwrap();
        pairs(&a, 100_000);
        let alone = pairs(&a, 1_000_000);
        let keep = a.alloc(4096, Stream::DEFAULT).unwrap();
        pairs(&a, 100_000);
        let with_other = pairs(&a, 1_000_000);
        drop(keep);
        println!("[{config:>12}] ns per 512 B pair: only live buffer {alone:.0}, with another live {with_other:.0}");
    }
}
