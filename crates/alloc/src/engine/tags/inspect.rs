//! # Inspecting tags: their state, the sleep counters and the rules
//!
//! Read-only views of [`super`]'s state: what each tag holds ([`Engine::tags`]), the counters
//! ([`Engine::sleep_stats`]) and the executable form of the rules of the tags module
//! ([`Engine::check_tags`], run by [`crate::invariants::check`]). Nothing here changes state;
//! each call walks the blocks or segments once, so none belongs on an allocation's path.

use super::{Backing, SleepStats};
use crate::engine::Engine;
use crate::stats::StatSink;

/// One tag's state ([`Engine::tags`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagInfo {
    /// Its name.
    pub name: String,
    /// Asleep now.
    pub asleep: bool,
    /// Block bytes allocated in it (asleep or not).
    pub allocated_bytes: u64,
    /// Device bytes mapped for it now.
    pub reserved_bytes: u64,
    /// Device bytes it gave back by sleeping.
    pub sleeping_bytes: u64,
    /// Host bytes holding its offloaded copies.
    pub offloaded_bytes: u64,
}

impl<S: StatSink> Engine<S> {
    /// The counters of sleeping memory.
    pub fn sleep_stats(&self) -> SleepStats {
        let mut s = self.tags.stats;
        s.sleeping_allocated_bytes = (self.blocks.iter())
            .filter(|(_, b)| b.allocated)
            .filter(|(_, b)| {
                (self.tags.tag_of_pool(b.pool)).is_some_and(|t| self.tags.tags[t as usize].asleep.is_some())
            })
            .map(|(_, b)| b.size)
            .sum();
        s
    }

    /// The tag owning engine pool `p` and whether it is asleep (for snapshots), if any.
    pub fn pool_tag_state(&self, p: crate::block::PoolId) -> Option<(&str, bool)> {
        let t = &self.tags.tags[self.tags.tag_of_pool(p)? as usize];
        Some((t.name.as_str(), t.asleep.is_some()))
    }

    /// Every tag's state, in the order the tags were made.
    pub fn tags(&self) -> Vec<TagInfo> {
        let mut v: Vec<TagInfo> = (self.tags.tags.iter())
            .map(|t| {
                let slept = t.asleep.iter().flatten();
                TagInfo {
                    name: t.name.clone(),
                    asleep: t.asleep.is_some(),
                    allocated_bytes: 0,
                    reserved_bytes: 0,
                    sleeping_bytes: slept.clone().map(|r| r.size).sum(),
                    offloaded_bytes: slept.map(|r| r.host.as_ref().map_or(0, |h| h.len() as u64)).sum(),
                }
            })
            .collect();
        for (_, b) in self.blocks.iter().filter(|(_, b)| b.allocated) {
            if let Some(t) = self.tags.tag_of_pool(b.pool) {
                v[t as usize].allocated_bytes += b.size;
            }
        }
        for (_, g) in self.segments.iter() {
            if let Some(t) = self.tags.tag_of_pool(g.pool) {
                v[t as usize].reserved_bytes += g.mapped_bytes();
            }
        }
        v
    }

    /// Checks the rules of the [module documentation](self); the first broken one is returned.
    pub(crate) fn check_tags(&self) -> Result<(), String> {
        let (mut sleeping, mut host, mut asleep) = (0, 0, 0);
        for (i, t) in self.tags.tags.iter().enumerate() {
            let pools = self.tags.pools_of(i as u32);
            for r in t.asleep.iter().flatten() {
                let Some((_, g)) = self.segments.iter().find(|(id, _)| *id == r.seg) else {
                    return Err(format!(
                        "tag \"{}\": slept range {:#x} in a dead segment",
                        t.name, r.addr
                    ));
                };
                let Backing::Expandable { mappings, .. } = &g.backing else {
                    return Err(format!("tag \"{}\": slept range in a malloc segment", t.name));
                };
                let overlaps = mappings.iter().any(|&(a, l)| a < r.addr + r.size && r.addr < a + l);
                if !pools.contains(&g.pool.0) || r.addr < g.base || r.addr + r.size > g.base + g.size || overlaps {
                    return Err(format!("tag \"{}\": slept range {:#x} is misplaced", t.name, r.addr));
                }
                if r.host.as_ref().is_some_and(|h| h.len() as u64 != r.size) {
                    return Err(format!(
                        "tag \"{}\": host copy of {:#x} has the wrong size",
                        t.name, r.addr
                    ));
                }
                sleeping += r.size;
                host += r.host.as_ref().map_or(0, |h| h.len() as u64);
            }
            asleep += t.asleep.is_some() as u64;
        }
        let st = &self.tags.stats;
        if (st.sleeping_bytes, st.offloaded_bytes, st.sleeping_tags) != (sleeping, host, asleep) {
            return Err(format!(
                "sleep stats ({}, {}, {}) != what the tags hold ({sleeping}, {host}, {asleep})",
                st.sleeping_bytes, st.offloaded_bytes, st.sleeping_tags
            ));
        }
        if let Some((_, g)) = (self.segments.iter()).find(|(_, g)| self.tags.is_tagged(g.pool) && !g.is_expandable()) {
            return Err(format!("tagged segment {:#x} is not expandable", g.base));
        }
        Ok(())
    }
}
