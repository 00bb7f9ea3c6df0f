//! # How to replay: the options of one replay
//!
//! [`ReplayOptions`] is read by every part of a replay (the device it runs on, the loop, the
//! whole-trace runs), so it lives apart from all of them.

use cudamem_device::sim::{Placement, H200_CAPACITY};

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Policy name (`pytorch`, `pytorch-expandable`, ...).
    pub policy: String,
    /// Allocator settings in `PYTORCH_CUDA_ALLOC_CONF` syntax, applied over the trace's own
    /// settings (which are used when this is `None` or empty).
    pub config: Option<String>,
    /// Simulated device memory in bytes.
    pub capacity: u64,
    /// Timed repetitions; the reported ns/op is their median. 0 = only the measured run.
    pub repeats: usize,
    /// Give new segments the trace's recorded addresses (default: when the policy is `pytorch`
    /// with the trace's own settings, the only case where they mean the same thing).
    pub plan_addresses: Option<bool>,
    /// `sim` (default) or `cuda:N`: the real GPU. On a real GPU each trace stream becomes a
    /// stream of its own, and a free that waited for other streams (`record_stream`) is freed
    /// at once, since no kernels run.
    pub device: String,
    /// Time warm passes: the timed repeats run on the allocator of the first pass, whose cache
    /// is full, instead of on fresh ones (what a training loop's second step sees).
    pub warm: bool,
    /// Keep a block whose free waited on other streams unavailable until its `free_completed`
    /// (default). A real device cannot hold a stream back until then, so there such frees take
    /// effect at once; turn this off to replay the simulated device the same way.
    pub deferred_frees: bool,
    /// Where the simulated GPU puts segments that have no planned address.
    pub placement: Placement,
    /// Allocations whose innermost frame has one of these names shrink by halves when they do
    /// not fit instead of failing ([`Op::Malloc`](crate::Op::Malloc)'s `shrink`): callers that
    /// catch the out-of-memory error and ask for less.
    pub shrink_on_oom: Vec<String>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            policy: cudamem_alloc::policy::registry::PYTORCH.into(),
            config: None,
            capacity: H200_CAPACITY,
            repeats: 3,
            plan_addresses: None,
            device: "sim".into(),
            warm: false,
            deferred_frees: true,
            placement: Placement::LowestFree,
            shrink_on_oom: Vec::new(),
        }
    }
}
