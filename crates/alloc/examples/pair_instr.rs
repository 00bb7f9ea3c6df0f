//! A fixed number of cache-hit alloc+free pairs, for instruction counts under callgrind:
//! `valgrind --tool=callgrind target/release/examples/pair_instr [policy]`.
use std::sync::Arc;

use cudamem_alloc::{AllocatorConfig, CachingAllocator};
use cudamem_device::sim::SimDevice;
use cudamem_device::StreamId;

fn main() {
    let policy = std::env::args().nth(1).unwrap_or_else(|| "cudamem".into());
    let a = CachingAllocator::with_policy(Arc::new(SimDevice::default()), AllocatorConfig::default(), &policy).unwrap();
    let mut e = a.lock();
    for size in [512u64, 64 << 10, 1 << 20, 16 << 20] {
        let p = e.malloc(size, StreamId(0)).unwrap();
        e.free(p).unwrap();
        for _ in 0..100_000 {
            let p = e.malloc(size, StreamId(0)).unwrap();
            e.free(p).unwrap();
        }
    }
}
