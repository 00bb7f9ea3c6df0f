//! The public API on the simulated device: RAII, stats pass-through, device strings, errors,
//! configuration, and use from many threads. Runs anywhere (no GPU needed).

// `%` rather than `is_multiple_of`, which is newer than the workspace's rust-version.
#![allow(clippy::manual_is_multiple_of)]

use std::sync::Arc;
use std::thread;

use cudamem::{AllocError, Allocator, Buffer, Error, Stream};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: u64 = 1 << 30;

/// A simulated device with PyTorch's policy: these tests count `cudaMalloc`-style segments.
/// (The default policy, `cudamem`, maps pages instead; `auto_and_plain_sim_open` checks it.)
fn sim(capacity: &str) -> Allocator {
    Allocator::with_config(&format!("sim:{capacity}"), "", "pytorch").expect("a simulated device")
}

#[test]
fn types_are_send_sync_and_clone() {
    fn check<T: Send + Sync>() {}
    check::<Allocator>();
    check::<Buffer>();
    check::<Stream>();
    check::<Error>();
    let a = sim("1GiB");
    let b = a.clone();
    let buf = a.alloc(MIB, Stream::DEFAULT).unwrap();
    assert_eq!(b.memory_allocated(), MIB as u64, "clones share one cache");
    drop(buf);
}

#[test]
fn dropping_a_buffer_returns_it_to_the_cache_and_empty_cache_releases_it() {
    let a = sim("8GiB");
    assert_eq!(a.device_name(), "sim");
    assert!(!a.is_cuda());
    let big = a.alloc(64 * MIB, Stream::DEFAULT).unwrap();
    let small = a.alloc(3 * KIB, Stream::DEFAULT).unwrap();
    assert_eq!(big.len(), 64 * MIB);
    assert_ne!(big.device_ptr(), 0);
    assert_eq!(big.stream(), Stream::DEFAULT);
    assert_eq!(a.memory_allocated(), (64 * MIB + 3 * KIB) as u64);
    let reserved = a.memory_reserved();
    assert_eq!(
        reserved,
        (64 * MIB + 2 * MIB) as u64,
        "a 64 MiB segment and a 2 MiB small segment"
    );
    let (free_before, total) = a.mem_get_info().unwrap();
    assert_eq!(total, 8 * GIB);
    assert_eq!(free_before, total - reserved);

    let ptr = big.device_ptr();
    drop(big);
    drop(small);
    assert_eq!(a.memory_allocated(), 0, "drop frees");
    assert_eq!(a.memory_reserved(), reserved, "freed memory stays cached");
    assert_eq!(
        a.mem_get_info().unwrap().0,
        free_before,
        "the device does not see the free"
    );
    let again = a.alloc(64 * MIB, Stream::DEFAULT).unwrap();
    assert_eq!(again.device_ptr(), ptr, "the cached block is reused");
    assert_eq!(a.device_counters().mallocs, 2, "no new device allocation for the reuse");
    drop(again);

    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0, "empty_cache returns everything");
    assert_eq!(a.mem_get_info().unwrap().0, total);
    assert_eq!(a.device_counters().frees, 2);
    a.check_invariants().unwrap();
}

#[test]
fn explicit_free_and_empty_buffers() {
    let a = sim("1GiB");
    let b = a.alloc(0, Stream::DEFAULT).unwrap();
    assert!(b.is_empty());
    assert_eq!(b.device_ptr(), 0);
    b.record_stream(Stream::from_raw(7)).unwrap();
    drop(b);
    let b = a.alloc(1000, Stream::DEFAULT).unwrap();
    assert_eq!(a.memory_allocated(), 1024, "rounded to 512 bytes as in PyTorch");
    b.free().unwrap();
    assert_eq!(a.memory_allocated(), 0);
    a.check_invariants().unwrap();
}

#[test]
fn stats_and_summary_pass_through() {
    let a = sim("8GiB");
    let bufs: Vec<Buffer> = [512, 4 * KIB, 2 * MIB, 30 * MIB]
        .iter()
        .map(|&s| a.alloc(s, Stream::DEFAULT).unwrap())
        .collect();
    let stats = a.memory_stats();
    assert_eq!(stats.len(), 122, "PyTorch's 122 keys");
    assert_eq!(stats["allocated_bytes.all.current"] as u64, a.memory_allocated());
    assert_eq!(stats["reserved_bytes.all.current"] as u64, a.memory_reserved());
    assert_eq!(stats["allocation.all.current"], 4);
    assert_eq!(stats["num_device_alloc"] as u64, a.device_counters().mallocs);
    assert_eq!(a.stats().allocation.all().current, 4);

    let summary = a.memory_summary(false);
    assert!(
        summary.contains("PyTorch CUDA memory summary, device ID 0"),
        "{summary}"
    );
    assert!(summary.contains("Allocated memory"));
    assert!(summary.contains("from large pool"));
    assert!(!a.memory_summary(true).contains("from large pool"), "abbreviated");

    let peak = a.max_memory_allocated();
    assert_eq!(peak, a.memory_allocated());
    drop(bufs);
    assert_eq!(a.max_memory_allocated(), peak, "the peak stays");
    a.reset_peak_memory_stats();
    assert_eq!(a.max_memory_allocated(), 0);
    assert_eq!(a.max_memory_reserved(), a.memory_reserved());
    assert!(a.memory_stats()["allocation.all.allocated"] > 0);
    a.reset_accumulated_memory_stats();
    assert_eq!(a.memory_stats()["allocation.all.allocated"], 0);
    a.check_invariants().unwrap();
}

#[test]
fn out_of_memory_is_typed_with_pytorchs_message_and_the_allocator_recovers() {
    let a = sim("1GiB");
    let keep = a.alloc(600 * MIB, Stream::DEFAULT).unwrap();
    let err = a.alloc(600 * MIB, Stream::DEFAULT).unwrap_err();
    assert!(err.is_out_of_memory());
    let Error::Alloc(AllocError::OutOfMemory(o)) = &err else {
        panic!("expected AllocError::OutOfMemory, got {err:?}")
    };
    let msg = o.pytorch_message();
    assert!(
        msg.starts_with("CUDA out of memory. Tried to allocate 600.00 MiB. GPU 0 has a total capacity of 1024.00 MiB"),
        "{msg}"
    );
    assert!(err.to_string().starts_with(&msg), "Display is PyTorch's message first");
    assert_eq!(a.memory_stats()["num_ooms"], 1);
    drop(keep);
    let b = a.alloc(600 * MIB, Stream::DEFAULT).expect("works again after freeing");
    drop(b);
    a.check_invariants().unwrap();
}

#[test]
fn bad_device_strings_are_rejected_naming_the_string() {
    for bad in [
        "", "gpu", "cuda:x", "cuda:-1", "sim:0", "sim:many", "sim:8XB", "auto:0", "tpu:0",
    ] {
        match Allocator::new(bad) {
            Err(e @ Error::BadDevice { .. }) => {
                let m = e.to_string();
                assert!(m.contains(&format!("'{bad}'")), "{m}");
                assert!(m.contains("sim:<capacity>"), "says what is expected: {m}");
            }
            other => panic!("{bad:?}: expected BadDevice, got {other:?}"),
        }
    }
    // A well-formed CUDA ordinal that does not exist here.
    match Allocator::new("cuda:99") {
        Err(e @ Error::DeviceUnavailable { .. }) => {
            assert!(e.to_string().contains("'cuda:99'"), "{e}");
        }
        other => panic!("expected DeviceUnavailable, got {other:?}"),
    }
    match Allocator::with_config("sim", "expandable_segments:Maybe", "") {
        Err(e @ Error::Config(_)) => assert!(e.to_string().contains("expandable_segments"), "{e}"),
        other => panic!("expected Config, got {other:?}"),
    }
    match Allocator::with_config("sim", "", "no-such-policy") {
        Err(e) => assert!(e.to_string().contains("no-such-policy"), "{e}"),
        Ok(_) => panic!("an unknown policy is refused"),
    }
}

#[test]
fn auto_and_plain_sim_open() {
    let a = Allocator::new("auto").unwrap();
    assert_eq!(a.is_cuda(), cudamem_cuda_available());
    let s = Allocator::new("sim").unwrap();
    assert_eq!(s.mem_get_info().unwrap().1, 150_109_880_320, "an H200");
    assert_eq!(s.policy_name(), "cudamem");
}

fn cudamem_cuda_available() -> bool {
    // The facade re-exports the CUDA device; availability is the device crate's answer.
    cudamem::CudaDevice::new(0).is_ok()
}

#[test]
fn configuration_policy_and_runtime_settings() {
    let a = Allocator::with_config("sim:4GiB", "expandable_segments:True", "").unwrap();
    assert!(a.config().expandable_segments);
    let b = a.alloc(30 * MIB, Stream::DEFAULT).unwrap();
    let c = a.device_counters();
    assert!(c.maps >= 1 && c.mallocs == 0, "expandable segments map pages: {c:?}");
    drop(b);
    a.empty_cache().unwrap();
    assert!(a.device_counters().unmaps >= 1);
    assert_eq!(a.memory_reserved(), 0);
    a.check_invariants().unwrap();

    let p = Allocator::with_config("sim", "", "pytorch-expandable").unwrap();
    assert!(p.config().expandable_segments, "the policy implies the setting");

    let s = sim("4GiB");
    s.set_settings("max_split_size_mb:64").unwrap();
    assert_eq!(s.config().max_split_size, 64 << 20);
    assert!(matches!(
        s.set_settings("bogus_key:1"),
        Err(Error::Alloc(AllocError::Config(_)))
    ));

    s.set_per_process_memory_fraction(0.25).unwrap();
    let err = s.alloc(2 * GIB as usize, Stream::DEFAULT).unwrap_err();
    let o = err.out_of_memory().expect("over the fraction is out of memory");
    assert_eq!(o.allowed, Some(GIB));
    assert!(
        o.pytorch_message().contains("1024.00 MiB allowed"),
        "{}",
        o.pytorch_message()
    );
    assert!(s.set_per_process_memory_fraction(1.5).is_err());
}

#[test]
fn from_env_reads_device_config_and_policy() {
    // The only test that touches these variables.
    std::env::set_var("CUDAMEM_DEVICE", "sim:2GiB");
    std::env::set_var("CUDAMEM_ALLOC_CONF", "max_split_size_mb:32");
    std::env::set_var("CUDAMEM_POLICY", "pytorch-expandable");
    let a = Allocator::from_env().unwrap();
    assert_eq!(a.mem_get_info().unwrap().1, 2 * GIB);
    assert_eq!(a.config().max_split_size, 32 << 20);
    assert!(a.config().expandable_segments);
    std::env::set_var("CUDAMEM_DEVICE", "sim:nope");
    assert!(matches!(Allocator::from_env(), Err(Error::BadDevice { .. })));
    std::env::remove_var("CUDAMEM_DEVICE");
    std::env::remove_var("CUDAMEM_ALLOC_CONF");
    std::env::remove_var("CUDAMEM_POLICY");
}

#[test]
fn data_calls_and_cudarc_views_are_unsupported_on_the_simulator() {
    let a = sim("1GiB");
    let mut b = a.alloc(4096, Stream::DEFAULT).unwrap();
    assert!(matches!(b.copy_from_host(0, &[1, 2, 3]), Err(Error::Unsupported(_))));
    assert!(matches!(b.to_vec(), Err(Error::Unsupported(_))));
    assert!(matches!(b.fill(0), Err(Error::Unsupported(_))));
    assert!(matches!(a.cuda_context(), Err(Error::Unsupported(_))));
    // Streams: any number is a stream on the simulator; create_stream gives fresh ones.
    let s1 = a.create_stream().unwrap();
    let s2 = a.create_stream().unwrap();
    assert_ne!(s1, s2);
    b.record_stream(s1).unwrap();
    a.stream_wait(s1, s2).unwrap();
    a.synchronize_stream(s1).unwrap();
    a.synchronize().unwrap();
}

#[test]
fn streams_keep_their_own_cached_blocks() {
    let a = sim("4GiB");
    let s = a.create_stream().unwrap();
    let x = a.alloc(8 * MIB, s).unwrap();
    let px = x.device_ptr();
    drop(x);
    let y = a.alloc(8 * MIB, Stream::DEFAULT).unwrap();
    assert_ne!(
        y.device_ptr(),
        px,
        "a block freed on one stream is not reused on another"
    );
    let z = a.alloc(8 * MIB, s).unwrap();
    assert_eq!(z.device_ptr(), px, "but is on its own");
    drop((y, z));
    a.check_invariants().unwrap();
}

#[test]
fn eight_threads_allocating_and_dropping_keep_the_invariants() {
    for config in ["", "sharded:True"] {
        eight_threads(Allocator::with_config("sim:16GiB", config, "").unwrap());
    }
}

fn eight_threads(a: Allocator) {
    const THREADS: usize = 8;
    const ITERS: usize = 2_000;
    let sizes = [512, 3 * KIB, 100 * KIB, MIB, 3 * MIB, 12 * MIB, 25 * MIB];
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let a = a.clone();
            thread::spawn(move || {
                let own = a.create_stream().unwrap();
                let mut live: Vec<Buffer> = Vec::new();
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                for i in 0..ITERS {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let stream = if x % 5 == 0 { Stream::DEFAULT } else { own };
                    let size = sizes[(x >> 8) as usize % sizes.len()];
                    let b = a.alloc(size, stream).unwrap();
                    if x % 7 == 0 {
                        b.record_stream(Stream::DEFAULT).unwrap();
                    }
                    live.push(b);
                    if live.len() > 6 || x % 3 == 0 {
                        let k = (x >> 20) as usize % live.len();
                        drop(live.swap_remove(k));
                    }
                    if i % 500 == 0 {
                        a.check_invariants().unwrap();
                    }
                }
                drop(live);
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread");
    }
    a.check_invariants().unwrap();
    assert_eq!(a.memory_allocated(), 0, "every buffer was dropped");
    let stats = a.memory_stats();
    assert_eq!(stats["allocation.all.current"], 0);
    assert_eq!(
        stats["allocation.all.allocated"],
        (THREADS * ITERS) as i64,
        "every allocation was counted once"
    );
    assert!(a.memory_reserved() > 0);
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    a.check_invariants().unwrap();
}

#[test]
fn the_last_handle_returns_all_memory_to_the_device() {
    for config in ["", "sharded:True"] {
        let a = Allocator::with_config("sim:2GiB", config, "").unwrap();
        assert_eq!(a.is_sharded(), !config.is_empty());
        let sim_dev = Arc::clone(a.sim_device().unwrap());
        let other = a.create_stream().unwrap();
        let b = a.alloc(100 * MIB, Stream::DEFAULT).unwrap();
        let c = a.alloc(10 * MIB, other).unwrap();
        let empty = a.alloc(0, other).unwrap();
        drop(a);
        assert!(sim_dev.used() > 0, "live buffers keep the allocator alive ({config})");
        drop(b);
        assert!(sim_dev.used() > 0, "one live buffer still keeps it alive ({config})");
        assert_eq!(c.allocator().memory_allocated(), 10 * MIB as u64);
        c.free().unwrap();
        assert!(sim_dev.used() > 0, "an empty buffer keeps it alive too ({config})");
        assert_eq!(empty.allocator().memory_allocated(), 0);
        drop(empty);
        assert_eq!(
            sim_dev.used(),
            0,
            "dropping the last buffer released the cache ({config})"
        );
    }
}

#[test]
fn sharded_allocator_through_the_api() {
    let a = Allocator::with_config("sim:4GiB", "sharded:True", "cudamem").unwrap();
    let s1 = a.create_stream().unwrap();
    let s2 = a.create_stream().unwrap();
    let x = a.alloc(64 * MIB, s1).unwrap();
    drop(x);
    let y = a.alloc(64 * MIB, s2).unwrap();
    // Stream 2 could not reuse stream 1's block: 128 MiB reserved, 64 MiB peak allocated.
    assert_eq!(a.memory_reserved(), 128 * MIB as u64);
    assert_eq!(a.max_memory_allocated(), 64 * MIB as u64);
    y.record_stream(s1).unwrap();
    drop(y);
    a.synchronize().unwrap();
    let e = a.set_per_process_memory_fraction(0.5).unwrap_err();
    assert!(e.to_string().contains("sharded"), "{e}");
    assert!(a.memory_summary(false).contains("PyTorch CUDA memory summary"));
    a.reset_peak_memory_stats();
    assert_eq!(a.max_memory_allocated(), 0);
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    a.check_invariants().unwrap();
}

/// Buffers outliving every `Allocator` handle, freed on other threads while the last handle
/// goes away: the allocator stays alive exactly as long as a shard has live buffers. Small
/// enough to run under Miri (`cargo +nightly miri test -p cudamem --test api keepalive`), which
/// checks the uncounted buffer-to-allocator alias for use after free and data races.
#[test]
fn keepalive_across_threads() {
    for config in ["", "sharded:True"] {
        let a = Allocator::with_config("sim:1GiB", config, "").unwrap();
        let sim_dev = Arc::clone(a.sim_device().unwrap());
        let streams: Vec<Stream> = (0..3).map(|_| a.create_stream().unwrap()).collect();
        let bufs: Vec<Vec<Buffer>> = streams
            .iter()
            .map(|&s| (0..3).map(|k| a.alloc((k + 1) * 4096, s).unwrap()).collect())
            .collect();
        drop(a);
        let hs: Vec<_> = bufs
            .into_iter()
            .map(|mut v| {
                thread::spawn(move || {
                    let last = v.pop().unwrap();
                    let again = last.allocator().alloc(512, last.stream()).unwrap();
                    drop(v);
                    drop(again);
                    drop(last);
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(
            sim_dev.used(),
            0,
            "the last buffer's drop released the allocator ({config})"
        );
    }
}

/// The last handle goes while other threads free their buffers (the race between the last
/// handle's look at the live allocations and the frees), and handles come back through a
/// buffer's allocator after the last one went. Every ordering ends with the allocator released
/// exactly when nothing holds it; Miri checks for use after free as above.
#[test]
fn keepalive_when_the_last_handle_races_the_frees() {
    for config in ["", "sharded:True"] {
        for round in 0..4 {
            let a = Allocator::with_config("sim:1GiB", config, "").unwrap();
            let sim_dev = Arc::clone(a.sim_device().unwrap());
            let s = a.create_stream().unwrap();
            let bufs: Vec<Buffer> = (0..4).map(|k| a.alloc((k + 1) * 4096, s).unwrap()).collect();
            let go = Arc::new(std::sync::Barrier::new(bufs.len() + 1));
            let hs: Vec<_> = bufs
                .into_iter()
                .map(|b| {
                    let go = Arc::clone(&go);
                    thread::spawn(move || {
                        go.wait();
                        if round % 2 == 1 {
                            // A handle again, from the buffer, after the last one may have gone.
                            let h = b.allocator().clone();
                            drop(b);
                            drop(h.alloc(512, s).unwrap());
                        } else {
                            drop(b);
                        }
                    })
                })
                .collect();
            go.wait();
            drop(a);
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(sim_dev.used(), 0, "released ({config}, round {round})");
        }
        // Everything freed before the last handle goes: its drop releases the allocator.
        let a = Allocator::with_config("sim:1GiB", config, "").unwrap();
        let sim_dev = Arc::clone(a.sim_device().unwrap());
        drop(a.alloc(4096, Stream::DEFAULT).unwrap());
        assert!(sim_dev.used() > 0, "cached");
        drop(a);
        assert_eq!(sim_dev.used(), 0, "released by the last handle ({config})");
    }
}
