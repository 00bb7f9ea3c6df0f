//! Workload loops that the benchmarks and examples share (not part of the allocator's API).

use cudamem_device::StreamId;

use cudamem_alloc::CachingAllocator;

use crate::ShardedAllocator;

/// The sizes of [`pairs_on_own_streams`], in turn.
pub const PAIR_SIZES: [u64; 4] = [512, 64 << 10, 1 << 20, 4 << 20];

/// `threads` threads, thread `k` on stream `100 + k`, each doing `per_thread` cache-hit
/// alloc+free pairs of [`PAIR_SIZES`] with nothing else live — through `sharded` if given,
/// else through `one`. Returns when every thread is done.
pub fn pairs_on_own_streams(
    one: &CachingAllocator,
    sharded: Option<&ShardedAllocator>,
    threads: usize,
    per_thread: usize,
) {
    std::thread::scope(|s| {
        for k in 0..threads {
            s.spawn(move || {
                let stream = StreamId(100 + k as u64);
                for i in 0..per_thread {
                    let size = PAIR_SIZES[i % PAIR_SIZES.len()];
                    match sharded {
                        Some(sh) => {
                            let p = sh.malloc(size, stream).unwrap();
                            sh.free(p, stream).unwrap();
                        }
                        None => {
                            let p = one.malloc(size, stream).unwrap();
                            one.free(p).unwrap();
                        }
                    }
                }
            });
        }
    });
}
