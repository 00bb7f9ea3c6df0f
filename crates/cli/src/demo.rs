//! `cudamem demo`: the seeds' examples on a simulated GPU — caching, `empty_cache`, stats,
//! `memory_summary()` and an out-of-memory error with its diagnosis.

use std::sync::Arc;

use cudamem_alloc::size::human;
use cudamem_alloc::{AllocatorConfig, CachingAllocator};
use cudamem_device::sim::SimDevice;
use cudamem_device::{Device, StreamId};

fn line(a: &CachingAllocator, what: &str) -> crate::CliResult {
    let s = a.stats();
    outln!(
        "{what:<58} allocated {:>10}  reserved {:>10}  device allocs {}",
        human(s.allocated_bytes.all().current as u64),
        human(s.reserved_bytes.all().current as u64),
        s.num_device_alloc
    );
    Ok(())
}

/// Runs the demonstration on a simulated GPU of `capacity` bytes.
pub fn run(capacity: u64) -> crate::CliResult {
    let dev: Arc<dyn Device> = Arc::new(SimDevice::with_capacity(capacity));
    let a = CachingAllocator::with_policy(
        dev,
        AllocatorConfig::default(),
        cudamem_alloc::policy::registry::PYTORCH,
    )
    .map_err(|e| e.to_string())?;
    let s = StreamId(0);
    let e = |r: Result<u64, cudamem_alloc::AllocError>| r.map_err(|e| e.to_string());
    outln!(
        "cudamem demo on a simulated GPU of {} (policy pytorch)\n",
        human(capacity)
    );

    let x = e(a.malloc(12, s))?; // torch.tensor([1., 2., 3.]).cuda()
    line(&a, "x = torch.tensor([1.,2.,3.]).cuda()  (12 bytes)")?;
    a.free(x).map_err(|e| e.to_string())?;
    line(&a, "del x: the block returns to the cache")?;
    let y = e(a.malloc(12, s))?;
    line(&a, "y = same size again: served from the cache")?;
    a.free(y).map_err(|e| e.to_string())?;
    a.empty_cache().map_err(|e| e.to_string())?;
    line(&a, "torch.cuda.empty_cache(): the 2 MiB segment goes back")?;

    // nn.Linear(1000, 1000).cuda(): weight and bias, then a forward pass of a batch of 1000.
    let w = e(a.malloc(4_000_000, s))?;
    let b = e(a.malloc(4_000, s))?;
    line(&a, "nn.Linear(1000, 1000).cuda(): weight 4 MB, bias 4 KB")?;
    let input = e(a.malloc(4_000_000, s))?;
    let out = e(a.malloc(4_000_000, s))?;
    line(&a, "forward under no_grad: input and output")?;
    a.free(input).map_err(|e| e.to_string())?;
    let peak_no_grad = a.max_memory_allocated();
    a.reset_peak_memory_stats();
    let input = e(a.malloc(4_000_000, s))?;
    let out2 = e(a.malloc(4_000_000, s))?;
    let grads = [
        e(a.malloc(4_000_000, s))?,
        e(a.malloc(4_000, s))?,
        e(a.malloc(4_000_000, s))?,
    ];
    line(&a, "forward + backward with grad: activations and gradients")?;
    outln!(
        "\npeak allocated under no_grad {}, with grad {}\n",
        human(peak_no_grad),
        human(a.max_memory_allocated())
    );
    for p in [input, out, out2].into_iter().chain(grads) {
        a.free(p).map_err(|e| e.to_string())?;
    }
    line(&a, "del activations and gradients: memory stays reserved")?;
    outln!("\n{}", a.memory_summary(false));

    outln!("An allocation larger than the GPU:");
    match a.malloc(capacity, s) {
        Err(err) => outln!("  {err}\n"),
        Ok(_) => return Err("the oversized allocation unexpectedly succeeded".into()),
    }
    for p in [w, b] {
        a.free(p).map_err(|e| e.to_string())?;
    }
    a.empty_cache().map_err(|e| e.to_string())?;
    line(&a, "del model; empty_cache()")?;
    a.check_invariants()?;
    Ok(())
}
