//! # Tags: allocations whose device memory can sleep and wake at the same addresses
//!
//! A *tag* is a short name (`"weights"`, `"kv_cache"`). An allocation made while a tag is
//! current ([`Engine::set_tag`]) or directed at it ([`Engine::malloc_in_tag`]) comes from that
//! tag's own engine pools, so the pages behind it hold nothing of any other tag or of the
//! default pools. [`Engine::sleep`] gives a tag's physical pages back to the device, keeping
//! their virtual addresses reserved; [`Engine::wake`] maps new pages at the same addresses and
//! copies offloaded bytes back. Pointers held by callers (tensors, CUDA graphs, NCCL
//! registrations) stay valid across a sleep and a wake.
//!
//! Rules:
//! * **Own pools, always expandable.** A tag owns one slot of private pools (see
//!   [`super::private_pools`]) under the reserved id `(TAG_POOL_ID, tag number)`, which no
//!   private-pool call accepts from a caller. Its pools grow by mapping pages of the device's
//!   granularity into reserved ranges whatever the policy says, because only a mapped range can
//!   be released and brought back at the same address. `empty_cache` releases the cache of awake
//!   tags as it does the default pools'.
//! * **The current tag is the engine's**, not a thread's: every `malloc` of the engine goes to it
//!   while it is set. An explicit private pool ([`Engine::malloc_in_pool`]) wins over it.
//! * **Sleep** (no capture or pool context may be open: it synchronises): waits for every pending
//!   event and for the whole device, releases the tag's cached free memory, copies each mapping
//!   still in the tag's segments to host memory if `offload` (all copies first: a failing copy
//!   leaves the tag awake), then unmaps it. Allocated blocks stay allocated (the caller still
//!   holds them; `allocated_bytes` keeps counting them) and keep their `mapped` mark: they are
//!   mapped again before anything may use them. The segments' mapping lists say what is really
//!   mapped, so `reserved_bytes` falls by exactly what was unmapped. Should an unmap fail (a
//!   driver error), the tag is asleep with the ranges unmapped so far, and the error is returned.
//!   Several tags sleep one after another; a failure stops there, the earlier ones asleep.
//! * **Wake** maps every slept range again, then restores the offloaded bytes and waits for the
//!   device; ranges that were slept without offload come back holding whatever the new pages
//!   hold. It is all or nothing
//!   over the tags named: if a map runs out of memory, what this wake mapped is unmapped, the
//!   default cache is released and the wake tried once more; failing again, it returns the OOM
//!   error and every tag stays asleep with its host copies intact. A memory fraction limits a
//!   wake as it limits growth.
//! * **While asleep:** allocating from the tag is an error naming it. Freeing a block of it is
//!   allowed: the block becomes free cache of the tag, its bytes are lost, and its pages are
//!   released when the tag wakes (a wake ends with the tag's whole free pages unmapped).
//!   Sleeping an asleep tag, waking an awake one and naming an unknown tag are errors; an empty
//!   list of names means every tag that can take the step. A failed call changes nothing
//!   except where said above.
//! * Sleeping is counted in [`SleepStats`], apart from [`crate::DeviceStats`] (which mirrors
//!   PyTorch's 122 values). The history tells a sleep and a wake in PyTorch's vocabulary:
//!   `segment_unmap`/`segment_map` entries of the ranges, bracketed by a `cudamem.sleep:<tag>`
//!   annotation (see `record`).
//!
//! Invariants (checked by [`crate::invariants::check`]): an awake tag holds no slept ranges;
//! every slept range lies in a live segment of its tag's pools and overlaps none of that
//! segment's mappings; a host copy has its range's size; the counters equal what the ranges sum
//! to; every segment of a tag's pools is expandable.

use cudamem_device::{Device, DeviceError, StreamId};

mod inspect;
mod record;
pub use inspect::TagInfo;
pub use record::sleep_annotation;

use super::{Attempt, Engine};
use crate::block::{PoolId, SegmentId};
use crate::error::AllocError;
use crate::segment::Backing;
use crate::stats::{Array, StatSink};

/// The first half of the private-pool id of every tag's pools; no caller may use it.
pub(crate) const TAG_POOL_ID: u64 = u64::MAX;
/// The longest tag name, in bytes.
pub const MAX_TAG_LEN: usize = 64;

/// A tag, as [`Engine::tag_id`] names it for [`Engine::malloc_in_tag`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TagId(pub u32);

/// One unmapped range of a sleeping tag.
#[derive(Debug)]
struct Slept {
    seg: SegmentId,
    addr: u64,
    size: u64,
    small: bool,
    /// The bytes, when offloaded.
    host: Option<Vec<u8>>,
}

#[derive(Debug)]
struct Tag {
    name: String,
    /// The private-pool slot that holds its pools.
    slot: u16,
    /// `Some` while asleep: what was unmapped, in unmapping order.
    asleep: Option<Vec<Slept>>,
}

/// Counters of sleeping memory ([`Engine::sleep_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SleepStats {
    /// Device bytes that sleeping tags gave back, now.
    pub sleeping_bytes: u64,
    /// The most `sleeping_bytes` ever were.
    pub peak_sleeping_bytes: u64,
    /// Host bytes holding offloaded copies, now.
    pub offloaded_bytes: u64,
    /// Block bytes still allocated in sleeping tags.
    pub sleeping_allocated_bytes: u64,
    /// Tags asleep now.
    pub sleeping_tags: u64,
    /// Tags known.
    pub tags: u64,
    /// Tags put to sleep, summed over calls.
    pub num_sleeps: u64,
    /// Tags woken, summed over calls.
    pub num_wakes: u64,
    /// Wakes refused for lack of device memory.
    pub num_wake_ooms: u64,
}

/// The engine's tags. See the [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct Tags {
    /// The policy's pool count (a slot's first engine pool is `base·(slot+1)`).
    base: u16,
    tags: Vec<Tag>,
    /// Tag number by private slot.
    by_slot: Vec<Option<u32>>,
    pub(crate) current: Option<u32>,
    stats: SleepStats,
}

impl Tags {
    pub(crate) fn new(base: usize) -> Self {
        Tags {
            base: base as u16,
            ..Default::default()
        }
    }

    /// Whether engine pool `p` belongs to a tag.
    #[inline]
    pub(crate) fn is_tagged(&self, p: PoolId) -> bool {
        self.tag_of_pool(p).is_some()
    }

    fn tag_of_pool(&self, p: PoolId) -> Option<u32> {
        if self.by_slot.is_empty() || p.0 < self.base {
            return None;
        }
        *self.by_slot.get((p.0 / self.base - 1) as usize)?
    }

    fn pools_of(&self, t: u32) -> std::ops::Range<u16> {
        let first = self.base * (self.tags[t as usize].slot + 1);
        first..first + self.base
    }

    fn find(&self, name: &str) -> Option<u32> {
        self.tags.iter().position(|t| t.name == name).map(|i| i as u32)
    }

    fn known(&self) -> String {
        match self.tags.len() {
            0 => "no tags exist".into(),
            _ => {
                let names: Vec<String> = self.tags.iter().map(|t| format!("\"{}\"", t.name)).collect();
                format!("tags: {}", names.join(", "))
            }
        }
    }

    /// The tags `names` names, checked to be awake (`asleep == false`) or asleep; an empty list
    /// means every tag in that state.
    fn resolve(&self, names: &[&str], asleep: bool) -> Result<Vec<u32>, AllocError> {
        if names.is_empty() {
            return Ok((0..self.tags.len() as u32)
                .filter(|&t| self.tags[t as usize].asleep.is_some() == asleep)
                .collect());
        }
        let mut ids = Vec::with_capacity(names.len());
        for &n in names {
            let t = self
                .find(n)
                .ok_or_else(|| AllocError::InvalidArgument(format!("no tag named \"{n}\" ({})", self.known())))?;
            match (self.tags[t as usize].asleep.is_some(), asleep) {
                (true, false) => return Err(AllocError::InvalidArgument(format!("tag \"{n}\" is asleep already"))),
                (false, true) => return Err(AllocError::InvalidArgument(format!("tag \"{n}\" is not asleep"))),
                _ => {}
            }
            if !ids.contains(&t) {
                ids.push(t);
            }
        }
        Ok(ids)
    }
}

fn check_name(name: &str) -> Result<(), AllocError> {
    if name.is_empty() || name.len() > MAX_TAG_LEN || name.chars().any(char::is_control) {
        return Err(AllocError::InvalidArgument(format!(
            "invalid tag name {name:?}: a tag is 1 to {MAX_TAG_LEN} bytes without control characters"
        )));
    }
    Ok(())
}

/// Why a wake's device work failed: out of memory (worth a retry) or anything else.
enum WakeFailure {
    OutOfMemory,
    Other(DeviceError),
}

/// Maps every range of `slept` and restores its host copy; on failure unmaps what it mapped.
/// `room` is how many more bytes a memory fraction allows.
fn map_all(dev: &dyn Device, slept: &[&Slept], room: Option<u64>) -> Result<(), WakeFailure> {
    let mut done: Vec<(u64, u64)> = Vec::with_capacity(slept.len());
    let mut run = || -> Result<(), WakeFailure> {
        let mut mapped = 0u64;
        for r in slept {
            if room.is_some_and(|room| mapped + r.size > room) {
                return Err(WakeFailure::OutOfMemory);
            }
            match dev.map(r.addr, r.size) {
                Ok(()) => {}
                Err(e) if e.is_out_of_memory() => return Err(WakeFailure::OutOfMemory),
                Err(e) => return Err(WakeFailure::Other(e)),
            }
            done.push((r.addr, r.size));
            mapped += r.size;
        }
        for r in slept {
            if let Some(h) = &r.host {
                dev.copy_from_host(r.addr, h).map_err(WakeFailure::Other)?;
            }
        }
        // A copy from pageable memory may return before its transfer lands, and streams that do
        // not wait for the default stream could run first: wait for the device.
        dev.synchronize().map_err(WakeFailure::Other)
    };
    let result = run();
    if result.is_err() {
        for &(a, l) in done.iter().rev() {
            // Nothing better can be done about an undo that fails; the first error is reported.
            let _ = dev.unmap(a, l);
        }
    }
    result
}

impl<S: StatSink> Engine<S> {
    /// The tag named `name`, created (with no memory) if new.
    pub fn tag_id(&mut self, name: &str) -> Result<TagId, AllocError> {
        if let Some(t) = self.tags.find(name) {
            return Ok(TagId(t));
        }
        check_name(name)?;
        let t = self.tags.tags.len() as u32;
        let slot = self.take_pool_slot((TAG_POOL_ID, t as u64))?.0;
        let by_slot = &mut self.tags.by_slot;
        if by_slot.len() <= slot as usize {
            by_slot.resize(slot as usize + 1, None);
        }
        by_slot[slot as usize] = Some(t);
        self.tags.tags.push(Tag {
            name: name.to_string(),
            slot,
            asleep: None,
        });
        self.tags.stats.tags += 1;
        Ok(TagId(t))
    }

    /// Makes `tag` current (created if new), or none; returns the one current before. Every
    /// `malloc` of this engine goes to the current tag's pools.
    pub fn set_tag(&mut self, tag: Option<&str>) -> Result<Option<String>, AllocError> {
        let next = tag.map(|n| self.tag_id(n)).transpose()?;
        let before = self.current_tag().map(str::to_string);
        self.tags.current = next.map(|t| t.0);
        Ok(before)
    }

    /// The current tag's name, if one is set.
    pub fn current_tag(&self) -> Option<&str> {
        self.tags.current.map(|t| self.tags.tags[t as usize].name.as_str())
    }

    /// The tag whose pools include `p` (for snapshots and reports), if any.
    pub fn pool_tag(&self, p: PoolId) -> Option<&str> {
        self.tags
            .tag_of_pool(p)
            .map(|t| self.tags.tags[t as usize].name.as_str())
    }

    /// The page size of a tag's pool: the device's granularity; `None` for any other pool.
    #[inline]
    pub(crate) fn tag_page_size(&self, p: PoolId) -> Option<u64> {
        self.tags.is_tagged(p).then(|| self.device.granularity())
    }

    /// `malloc` from the current tag's pools (the engine's `malloc` while a tag is set).
    #[cold]
    pub(crate) fn malloc_current_tag(&mut self, orig_size: u64, stream: StreamId) -> Result<u64, AllocError> {
        let t = self.tags.current.expect("called with a current tag");
        self.malloc_in_tag(orig_size, stream, TagId(t))
    }

    /// `malloc` from `tag`'s pools: the policy's rounding and pool choice, applied to them.
    pub fn malloc_in_tag(&mut self, orig_size: u64, stream: StreamId, tag: TagId) -> Result<u64, AllocError> {
        let Some(t) = self.tags.tags.get(tag.0 as usize) else {
            return Err(AllocError::InvalidArgument(format!("no tag number {}", tag.0)));
        };
        if t.asleep.is_some() {
            return Err(AllocError::InvalidArgument(format!(
                "tag \"{}\" is asleep: wake it before allocating from it",
                t.name
            )));
        }
        let offset = self.tags.pools_of(tag.0).start;
        match self.try_malloc_in(orig_size, stream, false, offset)? {
            Attempt::Done(p) => Ok(p),
            Attempt::NeedsDeviceRelease => unreachable!("the last resort is not deferred"),
        }
    }

    fn refuse_while_capturing(&self, what: &str) -> Result<(), AllocError> {
        if self.private.active > 0 {
            return Err(AllocError::InvalidArgument(format!(
                "cannot {what} tags while a CUDA graph capture or a memory-pool context is open \
                 (it synchronises and copies, which invalidates the capture)"
            )));
        }
        Ok(())
    }

    /// Releases the physical memory of `names` (every awake tag if empty), keeping their
    /// addresses; with `offload`, their bytes are kept in host memory first. See the module's
    /// rules.
    pub fn sleep(&mut self, names: &[&str], offload: bool) -> Result<(), AllocError> {
        self.refuse_while_capturing("sleep")?;
        let ids = self.tags.resolve(names, false)?;
        self.synchronize_and_free_events()?;
        self.device.synchronize()?;
        for t in ids {
            self.sleep_one(t, offload)?;
        }
        Ok(())
    }

    fn sleep_one(&mut self, t: u32, offload: bool) -> Result<(), AllocError> {
        let pools = self.tags.pools_of(t);
        for p in pools.clone() {
            self.release_blocks(PoolId(p))?;
        }
        let mut slept = Vec::new();
        for (seg, g) in self.segments.iter().filter(|(_, g)| pools.contains(&g.pool.0)) {
            let Backing::Expandable { mappings, .. } = &g.backing else {
                unreachable!("a tag's segments are expandable");
            };
            let small = self.pools[g.pool.0 as usize].is_small;
            for &(addr, size) in mappings {
                slept.push(Slept {
                    seg,
                    addr,
                    size,
                    small,
                    host: None,
                });
            }
        }
        if offload {
            for r in &mut slept {
                let mut h = Vec::new();
                h.try_reserve_exact(r.size as usize).map_err(|_| {
                    AllocError::InvalidArgument(format!(
                        "cannot offload tag \"{}\": no host memory for {} bytes",
                        self.tags.tags[t as usize].name, r.size
                    ))
                })?;
                h.resize(r.size as usize, 0);
                self.device.copy_to_host(r.addr, &mut h)?;
                r.host = Some(h);
            }
        }
        let mut unmapped = Vec::with_capacity(slept.len());
        let mut failure = None;
        for r in slept {
            if let Err(e) = self.device.unmap(r.addr, r.size) {
                failure = Some(e);
                break;
            }
            let Backing::Expandable { mappings, .. } = &mut self.segments[r.seg].backing else {
                unreachable!("a tag's segments are expandable");
            };
            if let Ok(i) = mappings.binary_search_by_key(&r.addr, |m| m.0) {
                mappings.remove(i);
            }
            self.total_allocated_memory -= r.size;
            self.stat_down(Array::ReservedBytes, r.small, r.size);
            let st = &mut self.tags.stats;
            st.sleeping_bytes += r.size;
            st.peak_sleeping_bytes = st.peak_sleeping_bytes.max(st.sleeping_bytes);
            st.offloaded_bytes += r.host.as_ref().map_or(0, |h| h.len() as u64);
            unmapped.push(r);
        }
        if failure.is_none() || !unmapped.is_empty() {
            self.record_sleep(TagId(t), &unmapped);
            self.tags.tags[t as usize].asleep = Some(unmapped);
            self.tags.stats.sleeping_tags += 1;
            self.tags.stats.num_sleeps += 1;
        }
        match failure {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Maps new pages for `names` (every asleep tag if empty) at their old addresses and
    /// restores offloaded bytes; all or nothing. See the module's rules.
    pub fn wake(&mut self, names: &[&str]) -> Result<(), AllocError> {
        self.refuse_while_capturing("wake")?;
        let ids = self.tags.resolve(names, true)?;
        let mut result = self.map_slept(&ids);
        if let Err(WakeFailure::OutOfMemory) = result {
            self.release_cached_blocks()?;
            result = self.map_slept(&ids);
        }
        if let Err(e) = result {
            if let WakeFailure::Other(e) = e {
                return Err(e.into());
            }
            self.tags.stats.num_wake_ooms += 1;
            let need: u64 = (ids.iter())
                .flat_map(|&t| self.tags.tags[t as usize].asleep.iter().flatten())
                .map(|r| r.size)
                .sum();
            return Err(self.out_of_memory_error(need, need, false));
        }
        for t in ids {
            let slept = self.tags.tags[t as usize].asleep.take().unwrap_or_default();
            self.record_wake(TagId(t), &slept);
            for r in slept {
                let Backing::Expandable { mappings, .. } = &mut self.segments[r.seg].backing else {
                    unreachable!("a tag's segments are expandable");
                };
                let i = mappings.partition_point(|m| m.0 < r.addr);
                mappings.insert(i, (r.addr, r.size));
                self.total_allocated_memory += r.size;
                self.stat_up(Array::ReservedBytes, r.small, r.size);
                let st = &mut self.tags.stats;
                st.sleeping_bytes -= r.size;
                st.offloaded_bytes -= r.host.as_ref().map_or(0, |h| h.len() as u64);
            }
            self.reclaim_watermark = self.reclaim_watermark.max(self.total_allocated_memory);
            self.tags.stats.sleeping_tags -= 1;
            self.tags.stats.num_wakes += 1;
            for p in self.tags.pools_of(t) {
                self.release_blocks(PoolId(p))?; // the pages of blocks freed while asleep
            }
        }
        Ok(())
    }

    fn map_slept(&self, ids: &[u32]) -> Result<(), WakeFailure> {
        let slept: Vec<&Slept> = (ids.iter())
            .flat_map(|&t| self.tags.tags[t as usize].asleep.iter().flatten())
            .collect();
        let room = (self.allowed_memory_maximum).map(|max| max.saturating_sub(self.total_allocated_memory));
        map_all(&*self.device, &slept, room)
    }

    /// Releases the cached memory of every awake tag (part of `empty_cache`).
    pub(crate) fn release_awake_tags(&mut self) -> Result<(), AllocError> {
        for t in 0..self.tags.tags.len() as u32 {
            if self.tags.tags[t as usize].asleep.is_none() {
                for p in self.tags.pools_of(t) {
                    self.release_blocks(PoolId(p))?;
                }
            }
        }
        Ok(())
    }
}
