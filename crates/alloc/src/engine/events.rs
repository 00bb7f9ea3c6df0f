//! # Streams and events: when a block used on other streams may be reused
//!
//! A freed block with uses on other streams gets one event per stream; it is reused only once
//! all have completed. Queries never block; a failing query counts as "not yet".

#[allow(unused_imports)]
use super::*;

impl<S: StatSink> Engine<S> {
    /// Marks an allocation as used on `stream` too: it will not be reused before the work queued
    /// on `stream` at its free has completed. Uses on its own stream need nothing.
    pub fn record_stream(&mut self, ptr: u64, stream: StreamId) -> Result<(), AllocError> {
        let Some(id) = self.allocated.get(ptr, |id| self.blocks[id].addr == ptr) else {
            return Err(self.invalid_pointer(ptr));
        };
        let b = &mut self.blocks[id];
        if stream != b.stream {
            let uses = b.stream_uses.get_or_insert_with(Default::default);
            if !uses.contains(&stream) {
                uses.push(stream);
            }
        }
        Ok(())
    }

    pub(super) fn insert_events(&mut self, id: BlockId) {
        let streams = self.blocks[id].stream_uses.take().map_or_else(Vec::new, |v| *v);
        for s in streams {
            match self.device.record_event(s) {
                Ok(ev) => {
                    self.blocks[id].event_count += 1;
                    match self.events.iter_mut().find(|(st, _)| *st == s) {
                        Some((_, q)) => q.push_back((ev, id)),
                        None => self.events.push((s, VecDeque::from([(ev, id)]))),
                    }
                }
                // No event, no way to know when the stream is done: wait for it now instead.
                Err(_) => {
                    let _ = self.device.synchronize_stream(s);
                }
            }
        }
        if self.blocks[id].event_count == 0 {
            self.free_block(id);
        }
    }

    /// Frees the blocks whose events have all completed (PyTorch `process_events`). A failing
    /// query counts as "not yet": the block stays pending until a later query or a sync.
    #[inline(never)]
    pub fn process_events(&mut self) {
        if self.events.is_empty() {
            return;
        }
        let mut si = 0;
        while si < self.events.len() {
            while let Some(&(ev, block)) = self.events[si].1.front() {
                if !matches!(self.device.query_event(ev), Ok(true)) {
                    break;
                }
                self.events[si].1.pop_front();
                self.device.destroy_event(ev);
                self.event_done(block);
            }
            if self.events[si].1.is_empty() {
                self.events.swap_remove(si);
            } else {
                si += 1;
            }
        }
    }

    pub(super) fn event_done(&mut self, block: BlockId) {
        let b = &mut self.blocks[block];
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(block);
        }
    }

    /// Waits for every outstanding event and frees its block (PyTorch
    /// `synchronize_and_free_events`).
    pub(super) fn synchronize_and_free_events(&mut self) -> Result<(), AllocError> {
        self.stats.num_sync_all_streams += 1;
        let all = std::mem::take(&mut self.events);
        for (_, q) in all {
            for (ev, block) in q {
                if self.device.synchronize_event(ev).is_err() {
                    self.device.synchronize()?;
                }
                self.device.destroy_event(ev);
                self.event_done(block);
            }
        }
        Ok(())
    }

    /// Number of blocks waiting for events.
    pub fn pending_frees(&self) -> usize {
        self.events.iter().map(|(_, q)| q.len()).sum()
    }
}
