//! # The pointer map: which block an address a caller holds names
//!
//! Every `malloc` adds an entry and every `free` takes one out, so this map is on the hot path
//! twice per alloc+free pair. It is a hash table specialised to what it stores — device addresses
//! of live allocations, each naming a [`BlockId`]:
//!
//! * **Open addressing, linear probing**, one array of slots whose length is a power of two, at
//!   most a quarter full: a lookup reads one slot as a rule, so its loop exits where the branch
//!   predictor expects (fuller tables make longer probe runs, whose exits mispredict).
//! * **Eight-byte slots**: a slot holds the block's id and a 32-bit *tag* of the address (its
//!   bits 9 to 40; allocations are 512-byte aligned), not the address. The block record holds
//!   the address, so a lookup confirms a tag match against it through a closure the caller
//!   passes (`is`); the caller reads that record next anyway. Half the bytes of `(address, id)`
//!   slots: gpt2_train's table of 4,096 slots is 32 KiB instead of 64, and misses the L1 cache
//!   less — the more so when another hardware thread shares that cache.
//! * **Fibonacci hashing** of the tag: times 2⁶⁴/φ, top bits — one multiply and one shift.
//! * **No tombstones**: a removal shifts the later entries of its probe run back into the hole
//!   (when their home slot allows), so that a lookup can stop at the first empty slot and a
//!   table that sees a billion insert/remove pairs never degrades.
//!
//! Invariant: every entry is reachable from its home slot `h(tag)` through occupied slots only,
//! i.e. no empty slot lies cyclically between its home and its position. An empty slot has no
//! id. Two live addresses may share a tag (they would differ by a multiple of 2 TiB); both are
//! entered, and `is` tells them apart.
//!
//! It replaced `std`'s `HashMap` (hashbrown) with a multiplicative hash because it executes
//! fewer instructions per cache-hit alloc+free pair (count them with callgrind on a replay).

use crate::block::BlockId;

/// Slots of a table's first allocation (4 KiB): a typical working set without rehashing while a
/// program starts.
const FIRST_CAPACITY: usize = 512;

/// One slot: the tag of an address and the block it names (`None`: empty).
type Slot = (u32, Option<BlockId>);

/// The tag of an address: bits 9 to 40.
#[inline(always)]
fn tag(addr: u64) -> u32 {
    (addr >> 9) as u32
}

/// Map from device address (non-zero) to block. See the [module documentation](self).
#[derive(Debug, Clone, Default)]
pub struct PointerMap {
    /// Length 0 or a power of two.
    slots: Vec<Slot>,
    len: usize,
    /// `64 - log2(slots.len())`: the hash's top bits index the table.
    shift: u32,
}

impl PointerMap {
    /// The home slot of a tag.
    #[inline]
    fn home(&self, tag: u32) -> usize {
        ((tag as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// Slot `i`, unchecked. Every index used here is a home slot (the hash's top
    /// `log2(len)` bits: below `len`) or a probe step masked by [`PointerMap::mask`], and only
    /// while the table is not empty, so it is in bounds; debug builds still check. The checks
    /// would sit on every lookup of the hot path.
    #[inline(always)]
    fn slot(&self, i: usize) -> &Slot {
        debug_assert!(i < self.slots.len());
        // SAFETY: as said above, `i < self.slots.len()`.
        unsafe { self.slots.get_unchecked(i) }
    }

    #[inline(always)]
    fn slot_mut(&mut self, i: usize) -> &mut Slot {
        debug_assert!(i < self.slots.len());
        // SAFETY: as in `slot`.
        unsafe { self.slots.get_unchecked_mut(i) }
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The slot of `addr`, if any: the first slot of its probe run with its tag whose block
    /// `is` says has the address.
    #[inline]
    fn find(&self, addr: u64, is: impl Fn(BlockId) -> bool) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let (t, mask) = (tag(addr), self.mask());
        let mut i = self.home(t);
        loop {
            match *self.slot(i) {
                (_, None) => return None,
                (st, Some(id)) if st == t && is(id) => return Some(i),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Enters `addr → id`. The caller enters an address only while it names no other block
    /// (the engine: only when it hands the address out).
    #[inline]
    pub fn insert(&mut self, addr: u64, id: BlockId) {
        if 4 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        self.place(tag(addr), id);
        self.len += 1;
    }

    /// Puts an entry in the first empty slot of its probe run.
    #[inline(always)]
    fn place(&mut self, t: u32, id: BlockId) {
        let mask = self.mask();
        let mut i = self.home(t);
        while self.slot(i).1.is_some() {
            i = (i + 1) & mask;
        }
        *self.slot_mut(i) = (t, Some(id));
    }

    /// Takes `addr` out; returns the id it named. `is(id)`: whether block `id` has the address.
    #[inline]
    pub fn remove(&mut self, addr: u64, is: impl Fn(BlockId) -> bool) -> Option<BlockId> {
        let mut hole = self.find(addr, is)?;
        let id = self.slot(hole).1;
        let mask = self.mask();
        // Shift back every later entry of the run that may sit in the hole: one whose home is
        // not cyclically inside (hole, j].
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let (t, occupied) = *self.slot(j);
            if occupied.is_none() {
                break;
            }
            let home = self.home(t);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                *self.slot_mut(hole) = *self.slot(j);
                hole = j;
            }
        }
        self.slot_mut(hole).1 = None;
        self.len -= 1;
        id
    }

    /// The block `addr` names.
    #[inline]
    pub fn get(&self, addr: u64, is: impl Fn(BlockId) -> bool) -> Option<BlockId> {
        self.find(addr, is).and_then(|i| self.slot(i).1)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The id of every entry, in no particular order.
    pub fn ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.slots.iter().filter_map(|s| s.1)
    }

    /// Doubles the table (or makes the first one) and re-enters every entry.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let capacity = (2 * self.slots.len()).max(FIRST_CAPACITY);
        let old = std::mem::replace(&mut self.slots, vec![(0, None); capacity]);
        self.shift = 64 - capacity.trailing_zeros();
        for (t, id) in old {
            if let Some(id) = id {
                self.place(t, id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    /// Checks the module's invariant: no empty slot between an entry's home and its slot.
    fn reachable(m: &PointerMap) -> bool {
        let mask = m.mask();
        m.slots.iter().enumerate().filter(|(_, s)| s.1.is_some()).all(|(i, s)| {
            let mut k = m.home(s.0);
            while k != i {
                if m.slots[k].1.is_none() {
                    return false;
                }
                k = (k + 1) & mask;
            }
            true
        })
    }

    proptest! {
        #[test]
        fn answers_like_a_hashmap(ops in prop::collection::vec((1u64..2000, 0u64..3, any::<bool>()), 1..3000)) {
            // Few distinct addresses, many operations: long probe runs, wrap-around, regrowth
            // and removals in the middle of runs all happen. Addresses `k * 512 + h * 2 TiB`
            // share their tag for every `h`: tag collisions happen too. Block `id`'s address
            // is `addrs[id]`, as the engine's arena would say.
            let mut addrs: Vec<u64> = Vec::new();
            let (mut m, mut want) = (PointerMap::default(), HashMap::new());
            for (k, h, add) in ops {
                let addr = k * 512 + (h << 41);
                let is = |id: BlockId| addrs[id.index()] == addr;
                if add {
                    if want.contains_key(&addr) {
                        continue; // the engine enters an address only while it is free
                    }
                    let id = BlockId::new(addrs.len() as u32);
                    addrs.push(addr);
                    m.insert(addr, id);
                    want.insert(addr, id);
                } else {
                    prop_assert_eq!(m.remove(addr, is), want.remove(&addr));
                }
                prop_assert_eq!(m.len(), want.len());
            }
            prop_assert!(reachable(&m));
            for k in 0..2100u64 {
                for h in 0..3u64 {
                    let addr = k * 512 + (h << 41);
                    prop_assert_eq!(m.get(addr, |id| addrs[id.index()] == addr), want.get(&addr).copied());
                }
            }
            let mut got: Vec<_> = m.ids().collect();
            let mut all: Vec<_> = want.into_values().collect();
            got.sort();
            all.sort();
            prop_assert_eq!(got, all);
        }
    }

    #[test]
    fn a_full_cycle_of_inserts_and_removes_leaves_it_empty() {
        let at = |id: BlockId, round: u64| (id.index() as u64 + round) << 20;
        let mut m = PointerMap::default();
        for round in 0..3u64 {
            for k in 1..5000u32 {
                m.insert(at(BlockId::new(k), round), BlockId::new(k));
            }
            assert!(reachable(&m));
            for k in (1..5000u32).rev() {
                let addr = at(BlockId::new(k), round);
                assert_eq!(m.remove(addr, |id| at(id, round) == addr), Some(BlockId::new(k)));
            }
            assert!(m.len() == 0 && m.ids().next().is_none());
            assert_eq!(m.get(1 << 20, |_| true), None);
        }
        assert_eq!(m.remove(512, |_| true), None, "removing what is not there");
    }

    #[test]
    fn a_tag_match_is_not_enough() {
        // Two addresses 2 TiB apart share a tag; each lookup finds its own block.
        let (a, b) = (1u64 << 20, (1u64 << 20) + (1 << 41));
        let addr_of = |id: BlockId| if id == BlockId::new(1) { a } else { b };
        let mut m = PointerMap::default();
        m.insert(a, BlockId::new(1));
        assert_eq!(m.get(b, |id| addr_of(id) == b), None, "b is not entered");
        m.insert(b, BlockId::new(2));
        assert_eq!(m.get(b, |id| addr_of(id) == b), Some(BlockId::new(2)));
        assert_eq!(m.remove(a, |id| addr_of(id) == a), Some(BlockId::new(1)));
        assert_eq!(m.get(a, |id| addr_of(id) == a), None);
        assert_eq!(m.get(b, |id| addr_of(id) == b), Some(BlockId::new(2)));
        assert!(reachable(&m));
    }
}
