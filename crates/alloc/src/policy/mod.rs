//! # Policies: the rules, apart from the bookkeeping
//!
//! The engine (`crate::engine`) owns the mechanisms every caching allocator needs: blocks,
//! segments, pools, splitting, merging, stream events, expandable mappings, stats and history.
//! A [`Policy`] makes the decisions: how a request is rounded, which pool serves it, how much
//! device memory to get when the cache has no fit, whether a cached block is acceptable, whether
//! to split, and whether a pool grows by mapping pages. Adding a policy means adding a file in
//! this folder and a row in [`registry::REGISTRY`], from which every list of names, the parsing
//! and the help texts are derived.
//!
//! Policies are stateless: every decision is a pure function of the configuration and sizes, so
//! the engine can call them under its lock without surprises.
//!
//! The engine calls a policy through `dyn Policy`, except the policies of this folder, which it
//! holds by value ([`Builtin`], `Dispatch`) so that the decisions of every `malloc` are inlined.
//! A new policy works either way; making it a [`Builtin`] (a variant and a `builtin()` method) is
//! only for speed. A property test checks that both ways decide the same.

mod cudamem;
mod pytorch;
pub mod registry;

use std::fmt;

pub use cudamem::{
    CudamemPolicy, Reclaim, LARGE_GROWTH, MAP_CHUNK, PAGE, PAGE_MAPPING_HEADROOM, RECLAIM_CHUNK, WHOLE_GROWTH_HEADROOM,
};
pub use pytorch::PytorchPolicy;
pub use registry::{by_name, PolicyEntry, POLICY_NAMES, REGISTRY};

use crate::block::{Block, PoolId};
use crate::config::AllocatorConfig;

/// What a pool is, as a policy declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    /// Its blocks count as `small_pool` in the stats (else `large_pool`).
    pub is_small: bool,
}

/// The decisions of a caching allocator. See the [module documentation](self).
pub trait Policy: Send + Sync + fmt::Debug {
    /// The policy's name, as given to `--policy`.
    fn name(&self) -> &str;
    /// The pools this policy uses; `PoolId(i)` is the i-th.
    fn pools(&self) -> Vec<PoolSpec>;
    /// The block size for a request of `size` bytes (≥ 1).
    fn round_size(&self, cfg: &AllocatorConfig, size: u64) -> u64;
    /// The pool that serves a block of `rounded` bytes.
    fn pool_for(&self, cfg: &AllocatorConfig, rounded: u64) -> PoolId;
    /// `round_size` and then `pool_for`, in one call: the engine asks on every `malloc`, and
    /// through `dyn Policy` two calls cost more than one. Policies implement the other two.
    #[inline]
    fn place(&self, cfg: &AllocatorConfig, size: u64) -> (u64, PoolId) {
        let rounded = self.round_size(cfg, size);
        (rounded, self.pool_for(cfg, rounded))
    }
    /// Bytes of new device memory to obtain when no cached block fits `rounded`.
    fn allocation_size(&self, cfg: &AllocatorConfig, rounded: u64) -> u64;
    /// `Some(page size)` if the pool grows by mapping pages into an expandable segment,
    /// `None` if it allocates whole segments.
    fn expandable_page_size(&self, cfg: &AllocatorConfig, pool: PoolId) -> Option<u64>;
    /// Whether the best-fitting cached block of `candidate` bytes may serve `rounded`.
    fn accepts_cached(&self, cfg: &AllocatorConfig, rounded: u64, candidate: u64) -> bool;
    /// Whether to split `block` when it serves `rounded` bytes, returning the rest to the pool.
    fn should_split(&self, cfg: &AllocatorConfig, block: &Block, rounded: u64, small_pool: bool) -> bool;
    /// Whether, before mapping `need` new bytes that would take the reserved total past the
    /// most it ever was, the engine unmaps the wholly free mappings that lie in holes of the
    /// pool's expandable segments, so that growth reuses physical memory instead of adding to
    /// it. A growth this returns true for is mapped in pieces, never as one mapping, so that
    /// what it leaves free can be reclaimed in turn.
    fn reclaim_before_growth(&self, _need: u64) -> bool {
        false
    }
    /// The most bytes one mapping of a growth that [`Policy::reclaim_before_growth`] is true for
    /// may hold while memory is plentiful (see [`Policy::whole_growth_headroom`]); `None`: the
    /// pool's [`Policy::map_chunk`]. Larger pieces make fewer driver calls, smaller ones leave
    /// more to reclaim.
    fn reclaim_chunk(&self, _cfg: &AllocatorConfig, _pool: PoolId) -> Option<u64> {
        None
    }
    /// For an expandable pool, the most bytes one device mapping may hold when the pool grows:
    /// `None` maps one page per mapping, as PyTorch does. Larger mappings cost fewer driver calls
    /// (one `cuMemCreate`+`cuMemMap` per mapping) but are unmapped only when wholly free.
    fn map_chunk(&self, _cfg: &AllocatorConfig, _pool: PoolId) -> Option<u64> {
        None
    }
    /// For an expandable pool with a `map_chunk`: while at least this share of the memory the
    /// allocator may use (the device's, or the memory fraction's limit) stays unreserved after
    /// a growth, the growth is one device mapping instead of `map_chunk`-sized ones. Each
    /// mapping costs about one `cudaMalloc`, so this makes the first iteration's growths as
    /// cheap as possible while memory is plentiful; when it is not, small mappings keep what
    /// the out-of-memory retry can give back. `None`: always `map_chunk`.
    fn whole_growth_headroom(&self, _cfg: &AllocatorConfig, _pool: PoolId) -> Option<f64> {
        None
    }
    /// For an expandable pool with a `map_chunk`: while less than this share of the memory the
    /// allocator may use stays unreserved after a growth, the growth is mapped one page per
    /// mapping, so that every free page it leaves can later be unmapped on its own
    /// ([`Policy::reclaim_at_limit`]). `None`: never below `map_chunk`.
    fn page_mapping_headroom(&self, _cfg: &AllocatorConfig, _pool: PoolId) -> Option<f64> {
        None
    }
    /// Whether, when the device or the memory fraction refuses a growth, the engine first
    /// unmaps the wholly free mappings inside the free blocks of the default pools (largest
    /// first, only as much as the request lacks) and grows again, before PyTorch's ladder
    /// (release the oversize cached blocks, then synchronise and release the whole cache).
    /// Never while a private pool is being allocated to (a CUDA-graph capture).
    fn reclaim_at_limit(&self) -> bool {
        false
    }

    /// Whether this policy decides exactly as PyTorch's native allocator under the same
    /// settings: a replay with it and a trace's own settings can then reproduce the trace's
    /// recorded addresses.
    fn reproduces_pytorch(&self) -> bool {
        false
    }

    /// This policy as a [`Builtin`], if it is one. The engine then calls its hot decisions
    /// directly, inlined, instead of through `dyn Policy`. Only this crate can implement it
    /// (the token's type cannot be named outside): a policy elsewhere that claimed to be a
    /// built-in one would have the engine make its hot decisions with another policy's rules.
    fn builtin(&self, _: sealed::Token) -> Option<Builtin> {
        None
    }
}

mod sealed {
    /// Makes [`super::Policy::builtin`] implementable only in this crate: outside it the token
    /// cannot be named, so no other implementation of the method can be written.
    ///
    /// ```compile_fail
    /// fn builtin(_: cudamem_alloc::policy::sealed::Token) {}
    /// ```
    #[derive(Clone, Copy, Debug)]
    pub struct Token;
}

/// Whether the engine calls `policy`'s hot decisions directly (a [`Builtin`]) rather than
/// through `dyn Policy`.
pub fn is_builtin(policy: &dyn Policy) -> bool {
    policy.builtin(sealed::Token).is_some()
}

/// The policies of this folder, by value. Through `dyn Policy`, the three decisions of every
/// `malloc` (`place`, `accepts_cached`, `should_split`) would be three indirect calls on the hot
/// path; the engine calls these directly, so they inline.
#[derive(Clone, Copy, Debug)]
pub enum Builtin {
    /// [`PytorchPolicy`].
    Pytorch(PytorchPolicy),
    /// [`CudamemPolicy`].
    Cudamem(CudamemPolicy),
}

/// How the engine holds its policy: a built-in one by value, any other behind `dyn Policy`.
/// Every decision goes to the same policy methods either way; this only chooses how they are
/// called.
#[derive(Debug)]
pub(crate) enum Dispatch {
    Builtin(Builtin, Box<dyn Policy>),
    Other(Box<dyn Policy>),
}

/// Calls `$method` on the policy, directly for a built-in one.
macro_rules! dispatch {
    ($self:expr, $method:ident($($arg:expr),*)) => {
        match $self {
            Dispatch::Builtin(Builtin::Pytorch(p), _) => p.$method($($arg),*),
            Dispatch::Builtin(Builtin::Cudamem(p), _) => p.$method($($arg),*),
            Dispatch::Other(p) => p.$method($($arg),*),
        }
    };
}

impl Dispatch {
    pub(crate) fn new(policy: Box<dyn Policy>) -> Dispatch {
        match policy.builtin(sealed::Token) {
            Some(b) => Dispatch::Builtin(b, policy),
            None => Dispatch::Other(policy),
        }
    }

    /// The policy, for the decisions off the hot path.
    #[inline]
    pub(crate) fn get(&self) -> &dyn Policy {
        match self {
            Dispatch::Builtin(_, p) | Dispatch::Other(p) => &**p,
        }
    }

    #[inline(always)]
    pub(crate) fn place(&self, cfg: &AllocatorConfig, size: u64) -> (u64, PoolId) {
        dispatch!(self, place(cfg, size))
    }

    #[inline(always)]
    pub(crate) fn accepts_cached(&self, cfg: &AllocatorConfig, rounded: u64, candidate: u64) -> bool {
        dispatch!(self, accepts_cached(cfg, rounded, candidate))
    }

    #[inline(always)]
    pub(crate) fn should_split(&self, cfg: &AllocatorConfig, block: &Block, rounded: u64, small: bool) -> bool {
        dispatch!(self, should_split(cfg, block, rounded, small))
    }

    #[inline(always)]
    pub(crate) fn expandable_page_size(&self, cfg: &AllocatorConfig, pool: PoolId) -> Option<u64> {
        dispatch!(self, expandable_page_size(cfg, pool))
    }
}
