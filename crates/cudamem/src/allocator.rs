//! [`Allocator`], the caching allocator of one device: construction from a device string and a
//! configuration, allocation of [`Buffer`](crate::Buffer)s, streams, and every PyTorch query
//! forwarded to the engine (`memory_stats`, `memory_summary`, `empty_cache`, ...).
//!
//! Guarantees: one engine per device behind one mutex (or, with `sharded:True`, one per group
//! of streams, with the same decisions and exact device-wide statistics); `Allocator` is
//! `Clone + Send + Sync`; a stream is checked before it reaches a CUDA driver.

use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use cudamem_cuda::cudarc::driver::CudaStream;

use crate::{
    cuda_stream_wait, cudarc, keep_cudarc_stream, AllocError, AllocatorConfig, Buffer, CachingAllocator, CudaDevice,
    Device, DeviceCounters, DeviceSpec, DeviceStats, Error, History, Inner, Inspect, PrivatePools, Raw,
    ShardedAllocator, SimDevice, SleepTags, StatsDict, Stream, DEFAULT_POLICY,
};

/// A caching allocator of one device. See the [crate documentation](crate).
///
/// Cloning is cheap (an `Arc`); every clone, and every [`Buffer`], shares the same cache.
pub struct Allocator {
    pub(crate) inner: Arc<Inner>,
}

impl Clone for Allocator {
    fn clone(&self) -> Self {
        self.inner.handles.fetch_add(1, Ordering::Relaxed);
        Allocator {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        // Buffers' aliases are never dropped (`ManuallyDrop`), so only handles count here.
        if self.inner.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.last_handle_gone();
        }
    }
}

impl fmt::Debug for Allocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocator")
            .field("device", &self.device_name())
            .field("policy", &self.policy_name())
            .field("allocated", &self.memory_allocated())
            .field("reserved", &self.memory_reserved())
            .finish()
    }
}

/// A device opened for [`Allocator::on_device`].
#[derive(Clone, Debug)]
pub enum OpenedDevice {
    /// A simulated GPU.
    Sim(Arc<SimDevice>),
    /// A CUDA device through the driver API.
    Cuda(Arc<CudaDevice>),
}

/// Synthetic stream handles of the simulated device, from [`Allocator::create_stream`].
static NEXT_SIM_STREAM: AtomicU64 = AtomicU64::new(0x5157_0000_0000);

impl Allocator {
    /// An allocator with PyTorch's default configuration and policy on `device` (`sim`,
    /// `sim:<capacity>`, `cuda`, `cuda:N` or `auto`; see the [crate documentation](crate)).
    pub fn new(device: &str) -> Result<Allocator, Error> {
        Self::with_allocator_config(device, AllocatorConfig::default(), DEFAULT_POLICY)
    }

    /// An allocator on `device` with a configuration in `PYTORCH_CUDA_ALLOC_CONF` syntax (e.g.
    /// `"expandable_segments:True,max_split_size_mb:128"`; empty for the defaults) and a policy
    /// (a name of the policy registry, [`POLICY_NAMES`](cudamem_alloc::policy::POLICY_NAMES);
    /// empty for the configuration's `policy:` key, else the registry's default).
    pub fn with_config(device: &str, config: &str, policy: &str) -> Result<Allocator, Error> {
        let cfg = AllocatorConfig::parse(config)?;
        Self::with_allocator_config(device, cfg, policy)
    }

    /// As [`with_config`](Self::with_config), with the configuration already parsed.
    pub fn with_allocator_config(device: &str, config: AllocatorConfig, policy: &str) -> Result<Allocator, Error> {
        let spec = DeviceSpec::parse(device)?;
        let unavailable = |source| Error::DeviceUnavailable {
            spec: device.to_string(),
            source,
        };
        let sim = |capacity: Option<u64>| {
            OpenedDevice::Sim(Arc::new(match capacity {
                Some(c) => SimDevice::with_capacity(c),
                None => SimDevice::default(),
            }))
        };
        let opened = match spec {
            DeviceSpec::Sim { capacity } => sim(capacity),
            DeviceSpec::Cuda(i) => OpenedDevice::Cuda(Arc::new(CudaDevice::new(i).map_err(unavailable)?)),
            DeviceSpec::Auto if cudamem_cuda::is_available() => {
                OpenedDevice::Cuda(Arc::new(CudaDevice::new(0).map_err(unavailable)?))
            }
            DeviceSpec::Auto => sim(None),
        };
        Self::on_device(opened, config, policy)
    }

    /// An allocator on a device the caller opened (for callers that choose devices by rules of
    /// their own, such as the Python package's allocator per torch device ordinal). `policy` as
    /// in [`with_config`](Self::with_config).
    pub fn on_device(device: OpenedDevice, config: AllocatorConfig, policy: &str) -> Result<Allocator, Error> {
        let policy = if policy.trim().is_empty() {
            config.policy.clone().unwrap_or_else(|| DEFAULT_POLICY.to_string())
        } else {
            policy.trim().to_string()
        };
        let (dev, cuda, sim): (Arc<dyn Device>, _, _) = match device {
            OpenedDevice::Sim(s) => (s.clone(), None, Some(s)),
            OpenedDevice::Cuda(c) => (c.clone(), Some(c), None),
        };
        let sharded = if config.sharded {
            Some(ShardedAllocator::new(dev.clone(), config.clone(), &policy)?)
        } else {
            None
        };
        let engine = CachingAllocator::with_policy(dev.clone(), config, &policy)?;
        Ok(Allocator {
            inner: Arc::new(Inner {
                engine,
                handles: AtomicUsize::new(1),
                kept: AtomicBool::new(false),
                sharded,
                device: dev,
                cuda,
                sim,
            }),
        })
    }

    /// An allocator configured by the environment, as a PyTorch process is:
    /// * `CUDAMEM_DEVICE`: the device string (default `auto`);
    /// * `CUDAMEM_ALLOC_CONF`, else `PYTORCH_CUDA_ALLOC_CONF` (and PyTorch's other names): the
    ///   configuration ([`AllocatorConfig::from_env`]);
    /// * `CUDAMEM_POLICY`: the policy (default: the configuration's `policy:` key, else
    ///   `pytorch`).
    pub fn from_env() -> Result<Allocator, Error> {
        let device = std::env::var("CUDAMEM_DEVICE").unwrap_or_else(|_| "auto".to_string());
        let config = AllocatorConfig::from_env()?;
        let policy = std::env::var("CUDAMEM_POLICY").unwrap_or_default();
        Self::with_allocator_config(&device, config, &policy)
    }

    pub(crate) fn check_stream(&self, stream: Stream) -> Result<(), Error> {
        if self.inner.cuda.is_some() && !stream.cuda_ok {
            return Err(Error::InvalidStream {
                raw: stream.raw,
                device: self.device_name(),
            });
        }
        Ok(())
    }

    /// Allocates `size` bytes for use on `stream` (PyTorch's `malloc`). A size of 0 gives an
    /// empty buffer at address 0. Out of memory (after freeing the cache and retrying, as
    /// PyTorch does) is [`AllocError::OutOfMemory`], whose `Display` is PyTorch's message.
    pub fn alloc(&self, size: usize, stream: Stream) -> Result<Buffer, Error> {
        self.check_stream(stream)?;
        let (ptr, first) = self.inner.malloc(size as u64, stream.id())?;
        if first.is_some() {
            self.inner.hold();
        }
        let (alloc, counted) = if ptr == 0 {
            // No allocation keeps the allocator alive for an empty buffer: it holds a handle.
            (ManuallyDrop::new(self.clone()), true)
        } else {
            // SAFETY: an uncounted alias of this allocator's `Arc`, never dropped (it is a
            // `ManuallyDrop` that `Buffer::drop` leaves alone when `counted` is false). The
            // `Inner` outlives it: the allocation at `ptr` stays live until the buffer is
            // dropped or freed, and while it is live its shard's keep-alive holds a counted
            // handle (taken just above if this is the shard's first live allocation).
            let alias = unsafe { Arc::from_raw(Arc::as_ptr(&self.inner)) };
            (ManuallyDrop::new(Allocator { inner: alias }), false)
        };
        Ok(Buffer {
            alloc,
            counted,
            ptr,
            len: size,
            stream,
            live: true,
        })
    }

    /// A new stream for this device: on CUDA a non-blocking stream (`cuStreamCreate` with
    /// `CU_STREAM_NON_BLOCKING`), which — like the streams of PyTorch's pool — is never
    /// destroyed, so that its handle stays valid wherever it went; on the simulated device a
    /// fresh stream number.
    pub fn create_stream(&self) -> Result<Stream, Error> {
        match &self.inner.cuda {
            Some(c) => {
                let s = c.create_stream(true)?;
                Ok(Stream {
                    raw: s.0,
                    cuda_ok: true,
                })
            }
            None => Ok(Stream::from_raw(NEXT_SIM_STREAM.fetch_add(1, Ordering::Relaxed))),
        }
    }

    /// The [`Stream`] of a cudarc stream, for use with this allocator. The cudarc stream must
    /// belong to this device's primary context (`CudaContext::new(ordinal)` gives it); it is kept
    /// alive until the process exits, so that its handle stays valid.
    pub fn stream_from_cudarc(&self, stream: &Arc<CudaStream>) -> Result<Stream, Error> {
        let cuda = self.require_cuda("stream_from_cudarc")?;
        if stream.context().cu_ctx() != cuda.context() {
            return Err(Error::Unsupported(format!(
                "the cudarc stream belongs to another context than {}'s primary context",
                self.device_name()
            )));
        }
        keep_cudarc_stream(stream);
        Ok(Stream {
            raw: stream.cu_stream() as u64,
            cuda_ok: true,
        })
    }

    /// A cudarc context for this device: its primary context, the one this allocator uses
    /// (`CudaContext::new(ordinal)`). [`Error::Unsupported`] on the simulated device.
    pub fn cuda_context(&self) -> Result<Arc<cudarc::driver::CudaContext>, Error> {
        let cuda = self.require_cuda("cuda_context")?;
        cudarc::driver::CudaContext::new(cuda.index() as usize)
            .map_err(|e| Error::Unsupported(format!("cudarc CudaContext::new failed: {e:?}")))
    }

    pub(crate) fn require_cuda(&self, what: &str) -> Result<&Arc<CudaDevice>, Error> {
        self.inner.cuda.as_ref().ok_or_else(|| {
            Error::Unsupported(format!(
                "{what} needs a CUDA device; this allocator runs on {}",
                self.device_name()
            ))
        })
    }

    /// Makes `waiter` wait (on the device, without blocking the host) for the work queued on
    /// `on` so far — PyTorch's `waiter.wait_stream(on)`. If no event can be recorded, blocks
    /// until `on` is idle instead. A no-op on the simulated device.
    pub fn stream_wait(&self, waiter: Stream, on: Stream) -> Result<(), Error> {
        self.check_stream(waiter)?;
        self.check_stream(on)?;
        match &self.inner.cuda {
            Some(c) => Ok(cuda_stream_wait(c, waiter.id(), on.id())?),
            None => Ok(()),
        }
    }

    /// Waits until the work queued on `stream` has completed (`cuStreamSynchronize`).
    pub fn synchronize_stream(&self, stream: Stream) -> Result<(), Error> {
        self.check_stream(stream)?;
        Ok(self.inner.device.synchronize_stream(stream.id())?)
    }

    /// Waits until all work on the device has completed (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<(), Error> {
        Ok(self.inner.device.synchronize()?)
    }

    // --- PyTorch's queries and controls -------------------------------------------------------

    /// `torch.cuda.memory_stats()`: the 122 keys, PyTorch's names.
    pub fn memory_stats(&self) -> StatsDict {
        match &self.inner.sharded {
            Some(s) => s.memory_stats(),
            None => self.inner.engine.memory_stats(),
        }
    }
    /// The statistics as a struct.
    pub fn stats(&self) -> DeviceStats {
        match &self.inner.sharded {
            Some(s) => s.stats(),
            None => self.inner.engine.stats(),
        }
    }
    /// `torch.cuda.memory_summary(abbreviated=...)`: PyTorch's table.
    pub fn memory_summary(&self, abbreviated: bool) -> String {
        match &self.inner.sharded {
            Some(s) => s.memory_summary(abbreviated),
            None => self.inner.engine.memory_summary(abbreviated),
        }
    }
    /// `torch.cuda.memory_allocated()`: bytes of live buffers (rounded sizes).
    pub fn memory_allocated(&self) -> u64 {
        self.stats().allocated_bytes.all().current as u64
    }
    /// `torch.cuda.max_memory_allocated()`.
    pub fn max_memory_allocated(&self) -> u64 {
        self.stats().allocated_bytes.all().peak as u64
    }
    /// `torch.cuda.memory_reserved()`: bytes held from the device (cached or in use).
    pub fn memory_reserved(&self) -> u64 {
        self.stats().reserved_bytes.all().current as u64
    }
    /// `torch.cuda.max_memory_reserved()`.
    pub fn max_memory_reserved(&self) -> u64 {
        self.stats().reserved_bytes.all().peak as u64
    }
    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak_memory_stats(&self) {
        match &self.inner.sharded {
            Some(s) => s.reset_peak_memory_stats(),
            None => self.inner.engine.reset_peak_memory_stats(),
        }
    }
    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated_memory_stats(&self) {
        match &self.inner.sharded {
            Some(s) => s.reset_accumulated_memory_stats(),
            None => self.inner.engine.reset_accumulated_memory_stats(),
        }
    }
    /// `torch.cuda.empty_cache()`: waits for pending frees, then returns every cached segment
    /// (and every free page of expandable segments) to the device.
    pub fn empty_cache(&self) -> Result<(), Error> {
        if let Some(s) = &self.inner.sharded {
            s.empty_cache()?;
        }
        Ok(self.inner.engine.empty_cache()?)
    }
    /// `torch.cuda.mem_get_info()`: `(free, total)` bytes of the device.
    pub fn mem_get_info(&self) -> Result<(u64, u64), Error> {
        Ok(self.inner.engine.mem_get_info()?)
    }
    /// `torch.cuda.set_per_process_memory_fraction(fraction)`: limits the memory this allocator
    /// may hold to `fraction` (in [0, 1]) of the device's.
    pub fn set_per_process_memory_fraction(&self, fraction: f64) -> Result<(), Error> {
        self.not_sharded("set_per_process_memory_fraction")?;
        Ok(self.inner.engine.set_memory_fraction(fraction)?)
    }
    /// `torch.cuda.memory._set_allocator_settings(settings)`: changes settings at run time.
    pub fn set_settings(&self, settings: &str) -> Result<(), Error> {
        self.not_sharded("set_settings")?;
        Ok(self.inner.engine.set_settings(settings)?)
    }
    /// The configuration in force.
    pub fn config(&self) -> AllocatorConfig {
        self.inner.engine.config()
    }
    /// The policy's name.
    pub fn policy_name(&self) -> String {
        self.inner.engine.policy_name()
    }
    /// Checks every invariant of the engine (slow; for tests). `Err` describes the first broken
    /// one.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.inner.engine.check_invariants()?;
        if let Some(s) = &self.inner.sharded {
            s.check_invariants()?;
        }
        if let Some(s) = &self.inner.sim {
            s.check()?;
        }
        Ok(())
    }

    // --- the device ---------------------------------------------------------------------------

    /// The device's name: `"sim"` or `"cuda:N"`.
    pub fn device_name(&self) -> String {
        self.inner.device.name()
    }
    /// The device ordinal.
    pub fn device_index(&self) -> i32 {
        self.inner.device.index()
    }
    /// Whether this allocator runs on a real CUDA device.
    pub fn is_cuda(&self) -> bool {
        self.inner.cuda.is_some()
    }
    /// The device.
    pub fn device(&self) -> Arc<dyn Device> {
        self.inner.device.clone()
    }
    /// Counters of the device calls made so far (mallocs, frees, maps, events, ...).
    pub fn device_counters(&self) -> DeviceCounters {
        self.inner.device.counters()
    }
    /// The CUDA device, when this allocator runs on one (for raw driver calls).
    pub fn cuda_device(&self) -> Option<&Arc<CudaDevice>> {
        self.inner.cuda.as_ref()
    }
    /// The simulated device, when this allocator runs on one (to inspect or inject faults).
    pub fn sim_device(&self) -> Option<&Arc<SimDevice>> {
        self.inner.sim.as_ref()
    }
    /// Whether allocations go to per-stream shards (`sharded:True`).
    pub fn is_sharded(&self) -> bool {
        self.inner.sharded.is_some()
    }
    /// The sharded allocator, with `sharded:True`.
    pub fn sharded_allocator(&self) -> Option<&ShardedAllocator> {
        self.inner.sharded.as_ref()
    }
    fn not_sharded(&self, what: &str) -> Result<(), Error> {
        if self.inner.sharded.is_some() {
            return Err(Error::Alloc(AllocError::InvalidArgument(format!(
                "{what} needs one device-wide view, which a sharded allocator (sharded:True) does not have"
            ))));
        }
        Ok(())
    }
    /// The engine, for calls this facade does not forward (locking for batches, tests). With
    /// `sharded:True` it serves no allocation (they go to the shards). Prefer the narrow
    /// handles below, which say clearly what a sharded allocator cannot do.
    pub fn caching_allocator(&self) -> &CachingAllocator {
        &self.inner.engine
    }

    // --- narrow handles for what PyTorch's allocator class does beyond buffers -----------------

    /// The one device-wide engine, or why `what` is not available (`sharded:True`).
    /// Inlined into every handle's constructor (`raw()` is on the hot path of each raw malloc
    /// and free); the message is built out of line.
    #[inline]
    fn single_engine(&self, what: &str) -> Result<&CachingAllocator, AllocError> {
        if self.inner.sharded.is_some() {
            return Err(sharded_has_no_single_engine(what));
        }
        Ok(&self.inner.engine)
    }
    /// The pointer-level interface (PyTorch's raw alloc and delete, `recordStream`, IPC
    /// sharing): see [`Raw`].
    #[inline]
    pub fn raw(&self) -> Result<Raw<'_>, AllocError> {
        self.single_engine("raw allocation").map(|engine| Raw { engine })
    }
    /// Read-only questions about addresses and limits: see [`Inspect`].
    pub fn inspect(&self) -> Result<Inspect<'_>, AllocError> {
        self.single_engine("inspection").map(|engine| Inspect { engine })
    }
    /// The private pools of CUDA graphs and `MemPool`s: see [`PrivatePools`].
    pub fn private_pools(&self) -> Result<PrivatePools<'_>, AllocError> {
        self.single_engine("private pools")
            .map(|engine| PrivatePools { engine })
    }
    /// The memory history, snapshots and the event observer: see [`History`].
    pub fn history(&self) -> Result<History<'_>, AllocError> {
        self.single_engine("the memory history")
            .map(|engine| History { engine })
    }
    /// Tags and sleep mode: see [`SleepTags`].
    pub fn sleep_tags(&self) -> Result<SleepTags<'_>, AllocError> {
        self.single_engine("tags and sleep mode")
            .map(|engine| SleepTags { engine })
    }
}

#[cold]
#[inline(never)]
fn sharded_has_no_single_engine(what: &str) -> AllocError {
    AllocError::InvalidArgument(format!(
        "{what} needs one device-wide engine, which a sharded allocator (sharded:True) does not have"
    ))
}
