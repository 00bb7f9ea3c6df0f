//! # What sleep and wake leave in the history
//!
//! PyTorch's trace has no action for a sleep or a wake, so they are told in its existing
//! vocabulary, where every reader of a snapshot already understands them:
//!
//! * a sleep is an annotation (`external_annotations`, and an `annotate` entry in the ring)
//!   with stage `START` and name `cudamem.sleep:<tag>`, then one `segment_unmap` entry per range
//!   it unmapped, with the range's address and bytes and its segment's stream;
//! * a wake is one `segment_map` entry per range it mapped again, then the annotation with
//!   stage `END` and the same name, so that the pair brackets the time the tag slept.
//!
//! The entries go through [`Engine::trace`] like every growth and release, so a trace observer
//! hears them too (a communicator that registers mapped ranges learns that they went and came
//! back). Entries are made only for what really happened: a sleep that fails before unmapping
//! anything and a wake that fails record nothing.

use super::{Slept, TagId};
use crate::engine::Engine;
use crate::history::Action;
use crate::stats::StatSink;

/// The annotation name of a tag's sleep.
pub fn sleep_annotation(tag: &str) -> String {
    format!("cudamem.sleep:{tag}")
}

impl<S: StatSink> Engine<S> {
    /// Records that tag `t` went to sleep, giving back `unmapped`.
    pub(super) fn record_sleep(&mut self, t: TagId, unmapped: &[Slept]) {
        let name = sleep_annotation(&self.tags.tags[t.0 as usize].name);
        self.annotate("START", &name);
        for r in unmapped {
            let stream = self.segments[r.seg].stream;
            self.trace(Action::SegmentUnmap, r.addr, r.size, stream, self.current_stack);
        }
    }

    /// Records that tag `t` woke, mapping `mapped` again.
    pub(super) fn record_wake(&mut self, t: TagId, mapped: &[Slept]) {
        for r in mapped {
            let stream = self.segments[r.seg].stream;
            self.trace(Action::SegmentMap, r.addr, r.size, stream, self.current_stack);
        }
        let name = sleep_annotation(&self.tags.tags[t.0 as usize].name);
        self.annotate("END", &name);
    }
}
