//! # Where a replay runs: the simulated GPU, or a real one
//!
//! [`new_allocator`] builds the device and the allocator of one replay. The simulated GPU
//! completes events when the replay says so; a real GPU (`cuda:N`, only with the `cuda`
//! feature, which the command line enables) maps each trace stream onto a stream of its own.
//! Without the feature a crate can replay on the simulated GPU with no CUDA code linked in (the
//! reports do), and asking for `cuda:N` is an error that says so.

use std::sync::Arc;

use cudamem_alloc::{AllocatorConfig, CachingAllocator};
use cudamem_device::sim::{EventMode, SimConfig, SimDevice};
use cudamem_device::{Device, StreamId};

use crate::options::ReplayOptions;
use crate::program::Program;

/// Where a replay runs.
#[derive(Clone, Debug)]
pub enum Target {
    /// The simulated GPU (events completed by the replay).
    Sim(Arc<SimDevice>),
    /// A real device; trace streams are mapped onto real streams.
    Real {
        /// The device.
        device: Arc<dyn Device>,
        /// Trace stream -> real stream.
        streams: Vec<(u64, StreamId)>,
    },
}

impl Target {
    /// The device behind the target.
    pub fn device(&self) -> Arc<dyn Device> {
        match self {
            Target::Sim(s) => s.clone(),
            Target::Real { device, .. } => device.clone(),
        }
    }
    #[inline]
    pub(crate) fn stream(&self, s: u64) -> StreamId {
        match self {
            Target::Sim(_) => StreamId(s),
            Target::Real { streams, .. } => streams.iter().find(|(t, _)| *t == s).map_or(StreamId(0), |x| x.1),
        }
    }
}

/// The real device `name` (`cuda` or `cuda:N`) for replaying `p`, its streams created.
#[cfg(feature = "cuda")]
fn open_real(name: &str, p: &Program) -> Result<Target, String> {
    use crate::program::Op;
    let ordinal = cuda_ordinal(name)?;
    let dev = cudamem_cuda::CudaDevice::new(ordinal + p.device.max(0)).map_err(|e| e.to_string())?;
    let mut streams = Vec::new();
    for op in &p.ops {
        if let Op::Malloc { stream, .. } = op {
            if !streams.iter().any(|(t, _)| t == stream) {
                let real = if *stream == 0 {
                    StreamId(0)
                } else {
                    dev.create_stream(true).map_err(|e| e.to_string())?
                };
                streams.push((*stream, real));
            }
        }
    }
    Ok(Target::Real {
        device: Arc::new(dev),
        streams,
    })
}

/// Without the `cuda` feature there is no real device to open.
#[cfg(not(feature = "cuda"))]
fn open_real(name: &str, _p: &Program) -> Result<Target, String> {
    cuda_ordinal(name)?;
    Err(format!(
        "device '{name}': this build replays on the simulated GPU only (cudamem-replay's `cuda` feature is off)"
    ))
}

/// The ordinal of `cuda` (0) or `cuda:N`.
fn cuda_ordinal(name: &str) -> Result<i32, String> {
    name.strip_prefix("cuda:")
        .or(if name == "cuda" { Some("0") } else { None })
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("unknown device '{name}' (use sim or cuda:N)"))
}

/// A fresh device and allocator for replaying `p` (benchmarks build their own runs from this
/// and [`crate::run_once`]).
pub fn new_allocator(
    p: &Program,
    cfg: &AllocatorConfig,
    opts: &ReplayOptions,
    plan: bool,
) -> Result<(Target, CachingAllocator), String> {
    let target = if opts.device == "sim" {
        let sim = Arc::new(SimDevice::new(SimConfig {
            index: p.device,
            capacity: opts.capacity,
            event_mode: EventMode::Manual,
            placement: opts.placement,
            ..SimConfig::default()
        }));
        if plan {
            sim.plan_addresses(p.segment_addresses.iter().copied());
        }
        Target::Sim(sim)
    } else {
        open_real(&opts.device, p)?
    };
    let alloc = CachingAllocator::with_policy(target.device(), cfg.clone(), &opts.policy).map_err(|e| e.to_string())?;
    Ok((target, alloc))
}
