//! cudamem in one page: allocate on the GPU (or on the simulated H200 when there is none), look
//! at PyTorch's memory summary, drop a buffer, empty the cache, and watch reserved memory go
//! down.
//!
//! ```text
//! cargo run -p cudamem --example quickstart            # cuda:0 if present, else sim
//! cargo run -p cudamem --example quickstart -- sim:8GiB
//! ```

use cudamem::{Allocator, Stream};

const MIB: usize = 1 << 20;

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

fn main() {
    if let Err(e) = run() {
        // The message (`Display`), not the `Debug` dump `main() -> Result` would print.
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), cudamem::Error> {
    let device = std::env::args().nth(1).unwrap_or_else(|| "auto".to_string());
    let alloc = Allocator::new(&device)?;
    println!(
        "device {} ({}), policy {}",
        alloc.device_name(),
        if alloc.is_cuda() {
            "a real GPU"
        } else {
            "simulated: no CUDA device here"
        },
        alloc.policy_name()
    );

    // Three buffers on the default stream: 256 MiB, 20 MiB and 4 KiB.
    let mut big = alloc.alloc(256 * MIB, Stream::DEFAULT)?;
    let mid = alloc.alloc(20 * MIB, Stream::DEFAULT)?;
    let small = alloc.alloc(4096, Stream::DEFAULT)?;
    if alloc.is_cuda() {
        // Real memory: write it and read a little back.
        big.fill(0xab)?;
        let mut head = [0u8; 8];
        big.copy_to_host(0, &mut head)?;
        println!("first bytes of the 256 MiB buffer after fill(0xab): {head:02x?}");
    }
    println!(
        "allocated {}, reserved {}",
        mib(alloc.memory_allocated()),
        mib(alloc.memory_reserved())
    );
    print!("{}", alloc.memory_summary(true));

    // Dropping a buffer gives its block back to the cache, not to the device.
    drop(big);
    println!(
        "after drop(big):    allocated {}, reserved {}",
        mib(alloc.memory_allocated()),
        mib(alloc.memory_reserved())
    );
    // The cached block is handed out again without asking the device.
    let mallocs = alloc.device_counters().mallocs;
    let again = alloc.alloc(200 * MIB, Stream::DEFAULT)?;
    println!(
        "alloc(200 MiB) reused the cached 256 MiB block: {} (device mallocs {} -> {})",
        alloc.device_counters().mallocs == mallocs,
        mallocs,
        alloc.device_counters().mallocs
    );
    drop(again);

    // empty_cache returns unused cached segments to the device.
    let (free_before, total) = alloc.mem_get_info()?;
    let reserved_before = alloc.memory_reserved();
    alloc.empty_cache()?;
    let (free_after, _) = alloc.mem_get_info()?;
    println!(
        "after empty_cache(): reserved {} -> {}; device free {} -> {} of {}",
        mib(reserved_before),
        mib(alloc.memory_reserved()),
        mib(free_before),
        mib(free_after),
        mib(total)
    );
    assert!(alloc.memory_reserved() < reserved_before, "reserved memory went down");

    drop((mid, small));
    alloc.empty_cache()?;
    println!("all dropped and emptied: reserved {}", mib(alloc.memory_reserved()));
    Ok(())
}
