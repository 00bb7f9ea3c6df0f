//! A fixed number of cache-hit alloc+free pairs through the Rust API on the simulated device
//! (`gpu_bench`'s mixed loop, one thread, 400,000 pairs), for instruction counts under callgrind:
//! `valgrind --tool=callgrind target/release/examples/api_instr [CONFIG]`, e.g. CONFIG
//! `sharded:True` (a second stream is used first, so a sharded allocator checks its shard's
//! ceilings as it would beside another thread).
use cudamem::{Allocator, Buffer};

fn main() {
    let config = std::env::args().nth(1).unwrap_or_default();
    let a = Allocator::with_config("sim", &config, "cudamem").unwrap();
    // A second stream seen first puts a sharded allocator in its multi-shard regime.
    let other = a.create_stream().unwrap();
    drop(a.alloc(512, other).unwrap());
    let stream = a.create_stream().unwrap();
    const MIX: [usize; 8] = [512, 4 << 10, 64 << 10, 512 << 10, 1 << 20, 4 << 20, 16 << 20, 2 << 10];
    let mut live: Vec<Buffer> = Vec::with_capacity(4);
    let mut i = 1usize;
    for _ in 0..400_000 {
        live.push(a.alloc(MIX[i % MIX.len()], stream).unwrap());
        if live.len() == 4 {
            live.swap_remove(i % 4);
        }
        i = i.wrapping_mul(5).wrapping_add(1) % 1_000_003;
    }
}
