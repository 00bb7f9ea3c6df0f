//! # free: an allocation back to its pool
//!
//! The block stops counting as allocated at once. If other streams used it (`record_stream`),
//! it waits for their events (or, while a capture is open, for the capture's end, or with
//! `graph_capture_record_stream_reuse` until the caller finds in the capture's graph that its
//! uses are over: [`Engine::release_deferred`]); then it is merged with free neighbours and
//! returned to its pool.

#[allow(unused_imports)]
use super::*;

impl<S: StatSink> Engine<S> {
    /// Frees an allocation. Unknown, interior or already-freed pointers are an error and change
    /// nothing. Address 0 (a zero-size allocation) is accepted and ignored.
    pub fn free(&mut self, ptr: u64) -> Result<(), AllocError> {
        if ptr == 0 {
            return Ok(());
        }
        let blocks = &self.blocks;
        let Some(id) = self.allocated.remove(ptr, |id| blocks[id].addr == ptr) else {
            return Err(self.invalid_pointer(ptr));
        };
        if self.active_is_allocation && self.blocks[id].stream_uses.is_some() {
            // This block stays active after it stops being allocated: from now on `active`
            // is its own count.
            self.stats.active = self.stats.allocation;
            self.stats.active_bytes = self.stats.allocated_bytes;
            self.active_is_allocation = false;
        }
        let small = self.is_small(self.blocks[id].pool);
        let b = &mut self.blocks[id];
        b.allocated = false;
        let (size, requested, stream, stack) = (b.size, b.requested, b.stream, b.stack);
        self.stat_down(Array::Allocation, small, 1);
        self.stat_down(Array::AllocatedBytes, small, size);
        if self.history.enabled || self.observer.0.is_some() {
            let free_stack = if self.history.context >= crate::history::RecordContext::All {
                self.current_stack
            } else {
                stack
            };
            self.trace(Action::FreeRequested, ptr, requested, stream, free_stack.or(stack));
        }
        if std::mem::take(&mut self.blocks[id].oversize) {
            self.oversize_change(OVERSIZE_ALLOCATIONS, false);
        }
        if self.blocks[id].stream_uses.is_none() {
            self.free_block_of(id, small);
        } else if self.private.active > 0 {
            // No event may be recorded during a capture: the block waits, unreused, until the
            // last capture or pool context ends (see `private_pools`).
            self.private.deferred.push(id);
        } else {
            self.insert_events(id);
        }
        Ok(())
    }

    /// With `graph_capture_record_stream_reuse`, the streams of the block at `ptr` if it is
    /// waiting, freed during a capture, for the uses other streams made of it: its allocation
    /// stream first, then those. `None` for any other pointer, or with the setting off.
    pub fn deferred_streams(&self, ptr: u64) -> Option<Vec<StreamId>> {
        if !self.config.graph_capture_record_stream_reuse {
            return None;
        }
        let id = self
            .private
            .deferred
            .iter()
            .copied()
            .find(|&id| self.blocks[id].addr == ptr)?;
        let b = &self.blocks[id];
        let mut streams = vec![b.stream];
        streams.extend(b.stream_uses.as_deref().into_iter().flatten().copied());
        Some(streams)
    }

    /// Returns the deferred block at `ptr` (see [`Engine::deferred_streams`]) to its pool now,
    /// with no event: PyTorch's `free_safe_blocks_in_capture`.
    ///
    /// Requires that the caller has found, in the capture's graph, that everything captured
    /// from now on runs after the block's last use on each of its streams (every stream's free
    /// marker precedes every current terminal node of the capture).
    pub fn release_deferred(&mut self, ptr: u64) -> Result<(), AllocError> {
        let blocks = &self.blocks;
        let Some(i) = self.private.deferred.iter().position(|&id| blocks[id].addr == ptr) else {
            return Err(AllocError::InvalidArgument(format!(
                "{ptr:#x} is not a block freed during a capture and waiting for other streams"
            )));
        };
        let id = self.private.deferred.swap_remove(i);
        self.blocks[id].stream_uses = None;
        let small = self.is_small(self.blocks[id].pool);
        self.free_block_of(id, small);
        Ok(())
    }

    /// Whether `ptr` is an allocation of this engine (one `free` would accept).
    pub fn owns(&self, ptr: u64) -> bool {
        self.allocated.get(ptr, |id| self.blocks[id].addr == ptr).is_some()
    }

    #[cold]
    pub(super) fn invalid_pointer(&self, ptr: u64) -> AllocError {
        let containing = self.blocks.iter().find(|(_, b)| b.addr <= ptr && ptr < b.addr + b.size);
        let reason = match containing {
            Some((_, b)) if b.addr == ptr && !b.allocated => {
                "not allocated: freed already (double free?) or never handed out".to_string()
            }
            Some((_, b)) => format!(
                "inside the {} block at {:#x} (+{} bytes); only the start of an allocation can be freed",
                if b.allocated { "allocated" } else { "free" },
                b.addr,
                ptr - b.addr
            ),
            None => format!("not allocated by this allocator (device {})", self.device.name()),
        };
        AllocError::InvalidPointer { ptr, reason }
    }

    /// Returns a block whose uses are over to its pool (PyTorch `free_block`).
    pub(super) fn free_block(&mut self, id: BlockId) {
        let small = self.is_small(self.blocks[id].pool);
        self.free_block_of(id, small);
    }

    /// [`Engine::free_block`] for a block of the small pool (`small`) or a large one.
    #[inline(always)]
    pub(super) fn free_block_of(&mut self, id: BlockId, small: bool) {
        let (addr, requested, stream, stack, original_size, expandable) = {
            let b = &self.blocks[id];
            debug_assert!(b.is_free());
            (b.addr, b.requested, b.stream, b.stack, b.size, b.expandable)
        };
        self.trace(Action::FreeCompleted, addr, requested, stream, stack);
        self.blocks[id].stack = None;
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for cand in [self.blocks[id].prev, self.blocks[id].next] {
            let subsumed = self.try_merge_blocks(id, cand);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        self.insert_free(id);
        let b = &self.blocks[id];
        if b.is_split() {
            net_blocks += 1;
            net_bytes += b.size as i64;
        }
        // A free that merged nothing and left a whole segment changes neither (half the frees
        // of a training step): skip the two no-op updates of four values each.
        if !expandable && net_blocks != 0 {
            self.stat_change(Array::InactiveSplit, small, net_blocks);
        }
        if !expandable && net_bytes != 0 {
            self.stat_change(Array::InactiveSplitBytes, small, net_bytes);
        }
        if !self.active_is_allocation {
            self.stat_down(Array::Active, small, 1);
            self.stat_down(Array::ActiveBytes, small, original_size);
        }
        self.stat_down(Array::RequestedBytes, small, requested);
    }

    /// Merges the free neighbour `src` into `dst` (PyTorch `try_merge_blocks`); returns the bytes
    /// gained, 0 when `src` is absent, busy or differently mapped. `dst` must not be in a set.
    #[inline(always)]
    pub(super) fn try_merge_blocks(&mut self, dst: BlockId, src: Option<BlockId>) -> u64 {
        let Some(src) = src else { return 0 };
        {
            let s = &self.blocks[src];
            if !s.is_free() || s.mapped != self.blocks[dst].mapped {
                return 0;
            }
        }
        self.remove_free(src);
        let s = self.blocks.remove(src);
        let d = &mut self.blocks[dst];
        if d.prev == Some(src) {
            d.addr = s.addr;
            d.prev = s.prev;
            if let Some(p) = s.prev {
                self.blocks[p].next = Some(dst);
            }
        } else {
            d.next = s.next;
            if let Some(n) = s.next {
                self.blocks[n].prev = Some(dst);
            }
        }
        self.blocks[dst].size += s.size;
        s.size
    }
}
