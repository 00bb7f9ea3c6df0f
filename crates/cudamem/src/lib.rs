//! # cudamem: PyTorch's CUDA caching allocator, in Rust
//!
//! This crate is the API a Rust GPU program uses. An [`Allocator`] owns one device's caching
//! allocator (the engine of `cudamem-alloc`, which keeps freed device memory in a cache and
//! hands it out again exactly as PyTorch's `CUDACachingAllocator` does) and hands out
//! [`Buffer`]s: owning handles to device memory that go back to the cache when dropped — the
//! Rust form of Python's `del tensor`.
//!
//! ```
//! use cudamem::{Allocator, Stream};
//!
//! # fn main() -> Result<(), cudamem::Error> {
//! // "auto" is cuda:0 when a GPU is present, else a simulated H200.
//! let alloc = Allocator::new("auto")?;
//! let buf = alloc.alloc(64 << 20, Stream::DEFAULT)?;
//! assert_eq!(alloc.memory_allocated(), 64 << 20);
//! drop(buf); // back to the cache: still reserved, not allocated
//! assert_eq!(alloc.memory_allocated(), 0);
//! assert!(alloc.memory_reserved() >= 64 << 20);
//! alloc.empty_cache()?; // give cached memory back to the device
//! assert_eq!(alloc.memory_reserved(), 0);
//! println!("{}", alloc.memory_summary(true));
//! # Ok(())
//! # }
//! ```
//!
//! A longer walk-through, with data written to and read from the GPU, is
//! `examples/quickstart.rs` (`cargo run -p cudamem --example quickstart [device]`; it runs on
//! the simulated device where there is no GPU).
//!
//! ## Devices
//!
//! [`Allocator::new`] takes a device string:
//!
//! | string | device |
//! |---|---|
//! | `sim` | a simulated H200 (150,109,880,320 bytes, 2 MiB pages) — no GPU needed |
//! | `sim:<capacity>` | a simulated GPU of that many bytes: `sim:8GiB`, `sim:80GB`, `sim:1073741824` |
//! | `cuda`, `cuda:N` | CUDA device N (0 by default) through the driver API |
//! | `auto` | `cuda:0` when a CUDA device is present, else `sim` |
//!
//! The simulated device ([`SimDevice`]) accounts for memory exactly as a GPU would (capacity,
//! out-of-memory, addresses, virtual-memory mappings) but stores no data, so the data calls of
//! a [`Buffer`] ([`copy_from_host`](Buffer::copy_from_host), [`fill`](Buffer::fill), …) are
//! [`Error::Unsupported`] there. [`Allocator::with_config`] adds a `PYTORCH_CUDA_ALLOC_CONF`
//! string and a policy name; [`Allocator::from_env`] reads both, and the device, from the
//! environment; [`Allocator::on_device`] takes a device the caller opened itself.
//!
//! ## Design
//!
//! * **One engine per device, behind one mutex** (as PyTorch's per-device mutex): every
//!   [`Allocator`] clone and every thread shares it. `Allocator` is `Clone + Send + Sync` (an
//!   `Arc` inside), and lives as long as any of its buffers. With the configuration key
//!   `sharded:True` each group of streams gets its own engine and mutex instead
//!   ([`ShardedAllocator`]: same decisions, exact device-wide statistics), so that threads on
//!   their own streams do not wait for each other; a per-process memory fraction and the
//!   history are then unavailable.
//! * **Buffers hold no reference count.** A buffer aliases its allocator without counting; the
//!   allocator keeps itself alive per shard while the shard has live allocations (taken when its
//!   count of live allocations leaves 0, given back when it returns to 0), so allocating and
//!   freeing on several threads writes no shared counter.
//! * **Stream-ordered, like PyTorch.** A buffer belongs to the [`Stream`] it was allocated on.
//!   When it is dropped its block may be handed out again at once *to work on the same stream*,
//!   which the stream orders after everything queued before the drop. A buffer that was also
//!   used on other streams must say so with [`Buffer::record_stream`]: its block is then reused
//!   only after the work queued on those streams at the time of the drop has completed
//!   (events), exactly as `tensor.record_stream(s)` in PyTorch.
//! * **Every PyTorch query is forwarded**: [`memory_stats`](Allocator::memory_stats) (the same
//!   122 keys), [`memory_summary`](Allocator::memory_summary) (the same table),
//!   [`memory_allocated`](Allocator::memory_allocated), [`empty_cache`](Allocator::empty_cache),
//!   [`set_per_process_memory_fraction`](Allocator::set_per_process_memory_fraction),
//!   [`set_settings`](Allocator::set_settings), … Out of memory is
//!   [`AllocError::OutOfMemory`] carrying PyTorch's message, character for character.
//! * **Narrow handles for PyTorch's allocator class**, so that the method list of [`Allocator`]
//!   stays short: [`Allocator::raw`] (raw addresses: [`Raw::malloc_with`] and
//!   [`Raw::free_with`] take one lock each, with the caller's stack and, when asked, the
//!   profiler's [`Usage`]; `recordStream`; IPC sharing), [`Allocator::inspect`],
//!   [`Allocator::private_pools`], [`Allocator::history`] and [`Allocator::sleep_tags`]. Each
//!   needs the one device-wide engine, and is an error that says so on a sharded allocator.
//! * **Dropping the last handle empties the cache**: when the last `Allocator` clone (and so the
//!   last `Buffer`) goes, every cached segment is returned to the device.
//!
//! ## Guarantees
//!
//! * **No double free, no use of a foreign pointer.** Only `Buffer`'s `Drop` (or
//!   [`Buffer::free`]) frees, exactly once; the engine refuses unknown pointers, and the CUDA
//!   device refuses to free or unmap anything it did not allocate.
//! * **Drop never panics**; a failure to free (which would be a bug) is ignored there, and
//!   [`Buffer::free`] reports it instead.
//! * **Streams are checked where it matters.** On a CUDA device, only streams known to be valid
//!   are passed to the driver: [`Stream::DEFAULT`], [`Stream::LEGACY`], [`Stream::PER_THREAD`],
//!   streams from [`Allocator::create_stream`] or [`Allocator::stream_from_cudarc`] (both kept
//!   alive for the rest of the process), and raw handles vouched for with the `unsafe`
//!   [`Stream::from_raw_cuda`]. Any other stream (such as [`Stream::from_raw`], which is safe,
//!   or a simulated stream) is [`Error::InvalidStream`] on CUDA; the simulated device takes any.
//! * **Invariants are executable**: [`Allocator::check_invariants`] checks every invariant of the
//!   engine (blocks tile segments, stats match blocks, pools hold exactly the free blocks, …).
//!
//! ## cudarc interop
//!
//! With a CUDA device, a buffer's memory can be used by [`cudarc`] kernels and copies without
//! copying it out: [`Buffer::cuda_slice`] (`unsafe`: the contents are not yet valid `T`s, as
//! with cudarc's own `CudaStream::alloc`) and [`Buffer::cuda_slice_zeroed`] (safe) return a
//! [`CudaSliceRef`], a borrowed typed view that implements cudarc's
//! [`DevicePtr`](cudarc::driver::DevicePtr) and [`DevicePtrMut`](cudarc::driver::DevicePtrMut)
//! (so `memcpy_htod`, `memcpy_dtoh`, `memcpy_dtod`, `memset_zeros` take it) and dereferences to
//! a `&CudaSlice<T>` (a kernel argument). See the [`interop`] module for why this is sound: the
//! view never owns the memory, and its streams are joined back to the buffer's stream.
//!
//! ## Limits
//!
//! * One device per allocator; create one `Allocator` per GPU.
//! * The pinned-host allocator of PyTorch is not offered. CUDA graphs' private pools and IPC
//!   sharing exist only at the level of raw addresses (the handles below), for PyTorch's
//!   allocator class; buffers do not capture graphs.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]
// `%` rather than `is_multiple_of`, which is newer than the workspace's rust-version.
#![allow(clippy::manual_is_multiple_of)]

mod allocator;
mod buffer;
mod device_spec;
mod error;
mod history;
mod inner;
mod inspect;
pub mod interop;
mod private_pools;
mod raw;
mod sleep;
mod stream;

pub use cudamem_alloc::config::ConfigError;
pub use cudamem_alloc::size::{parse_size, SizeError};
pub use cudamem_alloc::{AllocError, AllocatorConfig, CachingAllocator, DeviceStats, OutOfMemory, StatsDict};
pub use cudamem_alloc::{
    CheckpointDelta, Frame, MempoolId, PoolCheckpoint, PoolSlot, RecordContext, Shared, SleepStats, TagInfo,
    TraceEvent, TraceObserver,
};
pub use cudamem_cuda::{cudarc, CudaDevice};
pub use cudamem_device::sim::SimDevice;
pub use cudamem_device::{Device, DeviceCounters, DeviceError, DevicePtr, StreamId};
pub use cudamem_sharded::ShardedAllocator;
pub use cudamem_trace_types::Trace;
pub use interop::CudaSliceRef;

pub use allocator::{Allocator, OpenedDevice};
pub use buffer::Buffer;
pub use device_spec::DeviceSpec;
pub use error::Error;
pub use history::History;
pub use inspect::Inspect;
pub use private_pools::PrivatePools;
pub use raw::{Raw, Usage};
pub use sleep::SleepTags;
pub use stream::Stream;

use inner::Inner;
use stream::{cuda_stream_wait, keep_cudarc_stream};

/// The policy used when none is named.
pub const DEFAULT_POLICY: &str = "cudamem";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("8 gib"), Ok(8 << 30));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("80GB"), Ok(80_000_000_000));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_size("512b"), Ok(512));
        // The units the CLI has always taken: up to EiB, in either case.
        assert_eq!(parse_size("2PiB"), Ok(2 << 50));
        assert_eq!(parse_size("1eib"), Ok(1 << 60));
        assert_eq!(parse_size("8gb"), Ok(8_000_000_000));
        for bad in ["", "GiB", "8XB", "1.2.3", "-1", "0", "99999999999999TiB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn device_strings_parse() {
        assert_eq!(DeviceSpec::parse("sim").unwrap(), DeviceSpec::Sim { capacity: None });
        assert_eq!(
            DeviceSpec::parse(" SIM:8GiB ").unwrap(),
            DeviceSpec::Sim {
                capacity: Some(8 << 30)
            }
        );
        assert_eq!(DeviceSpec::parse("cuda").unwrap(), DeviceSpec::Cuda(0));
        assert_eq!(DeviceSpec::parse("cuda:3").unwrap(), DeviceSpec::Cuda(3));
        assert_eq!(DeviceSpec::parse("auto").unwrap(), DeviceSpec::Auto);
        assert_eq!(
            DeviceSpec::parse("sim:2pib").unwrap(),
            DeviceSpec::Sim {
                capacity: Some(2 << 50)
            }
        );
        for bad in ["", "gpu", "cuda:-1", "cuda:x", "sim:0", "sim:lots", "auto:1", "cpu:0"] {
            let e = DeviceSpec::parse(bad).unwrap_err();
            assert!(matches!(e, Error::BadDevice { .. }), "{bad}: {e}");
            assert!(e.to_string().contains(&format!("'{bad}'")), "{e}");
        }
        // The size parser's own message, with the unit as written.
        let e = DeviceSpec::parse("sim:8XB").unwrap_err().to_string();
        assert!(e.contains("unknown size unit 'XB'"), "{e}");
    }

    #[test]
    fn an_opened_device_is_the_one_served() {
        use cudamem_device::sim::SimConfig;
        use std::sync::Arc;
        let sim = Arc::new(SimDevice::new(SimConfig {
            index: 3,
            capacity: 64 << 20,
            ..SimConfig::default()
        }));
        let cfg = AllocatorConfig::parse("policy:pytorch").unwrap();
        let a = Allocator::on_device(OpenedDevice::Sim(sim.clone()), cfg.clone(), "").unwrap();
        assert_eq!(a.device_index(), 3);
        assert_eq!(a.policy_name(), "pytorch"); // an empty policy: the configuration's
        let b = a.alloc(1 << 20, Stream::DEFAULT).unwrap();
        assert_eq!(sim.counters().mallocs, 1, "the allocation reached the device given");
        drop(b);
        assert!(a.alloc(128 << 20, Stream::DEFAULT).unwrap_err().is_out_of_memory());
        let e = Allocator::on_device(OpenedDevice::Sim(sim), cfg, "no-such-policy").unwrap_err();
        assert!(e.to_string().contains("no-such-policy"), "{e}");
    }

    #[test]
    fn streams_compare_by_handle() {
        assert_eq!(Stream::from_raw(0), Stream::DEFAULT);
        assert!(Stream::from_raw(2).is_cuda_valid());
        assert!(!Stream::from_raw(0x1234).is_cuda_valid());
        // SAFETY: only compared, never given to an allocator.
        let s = unsafe { Stream::from_raw_cuda(0x1234) };
        assert_eq!(s, Stream::from_raw(0x1234));
        assert!(s.is_cuda_valid());
    }
}
