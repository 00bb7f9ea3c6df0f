//! # The pointer map: which block an address a caller holds names
//!
//! Every `malloc` adds an entry and every `free` takes one out, so this map is on the hot path
//! twice per alloc+free pair. It is a hash table specialised to what it stores — device addresses
//! of live allocations, each naming a [`BlockId`]:
//!
//! * **Open addressing, linear probing**, one array of `(address, id)` slots whose length is a
//!   power of two, at most a quarter full: a lookup reads one slot as a rule, so its loop
//!   exits where the branch predictor expects (at half full, a replayed operation
//!   mispredicted 0.5 branches more here, 10% of all its mispredictions).
//! * **Fibonacci hashing**: the address divided by 512 (allocations are 512-byte aligned),
//!   times 2⁶⁴/φ, top bits — one multiply and one shift.
//! * **No tombstones**: a removal shifts the later entries of its probe run back into the hole
//!   (when their home slot allows), so that a lookup can stop at the first empty slot and a
//!   table that sees a billion insert/remove pairs never degrades.
//!
//! Invariant: every entry is reachable from its home slot `h(address)` through occupied slots
//! only, i.e. no empty slot lies cyclically between its home and its position. Address 0 marks
//! an empty slot; the engine never enters it (a zero-size allocation is not a block).
//!
//! Against the `std` `HashMap` (hashbrown) with a multiplicative hash that it replaced: 1,136 →
//! 1,088 instructions per cache-hit alloc+free pair, 618 → 596 per replayed operation of
//! gpt2_train (callgrind, `pytorch` policy, 2026-12-01).

use crate::block::BlockId;

/// Slots of a table's first allocation (8 KiB): a typical working set without rehashing while a
/// program starts.
const FIRST_CAPACITY: usize = 512;

/// Map from device address (non-zero) to block. See the [module documentation](self).
#[derive(Debug, Clone, Default)]
pub struct PointerMap {
    /// `(address, id)`; address 0: empty (its id means nothing). Length 0 or a power of two.
    slots: Vec<(u64, BlockId)>,
    len: usize,
    /// `64 - log2(slots.len())`: the hash's top bits index the table.
    shift: u32,
}

impl PointerMap {
    /// The home slot of `addr`.
    #[inline]
    fn home(&self, addr: u64) -> usize {
        ((addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// Slot `i`, unchecked. Every index used here is a home slot (the hash's top
    /// `log2(len)` bits: below `len`) or a probe step masked by [`PointerMap::mask`], and only
    /// while the table is not empty, so it is in bounds; debug builds still check. The checks
    /// were 5 instructions of a replayed operation's 480 (callgrind).
    #[inline(always)]
    fn slot(&self, i: usize) -> &(u64, BlockId) {
        debug_assert!(i < self.slots.len());
        // SAFETY: as said above, `i < self.slots.len()`.
        unsafe { self.slots.get_unchecked(i) }
    }

    #[inline(always)]
    fn slot_mut(&mut self, i: usize) -> &mut (u64, BlockId) {
        debug_assert!(i < self.slots.len());
        // SAFETY: as in `slot`.
        unsafe { self.slots.get_unchecked_mut(i) }
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The slot holding `addr`, if any.
    #[inline]
    fn find(&self, addr: u64) -> Option<usize> {
        if self.slots.is_empty() || addr == 0 {
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            match self.slot(i).0 {
                a if a == addr => return Some(i),
                0 => return None,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Enters `addr → id`; returns the id it named before, if any.
    ///
    /// # Panics
    /// If `addr` is 0 (it marks empty slots; no allocation has that address).
    #[inline]
    pub fn insert(&mut self, addr: u64, id: BlockId) -> Option<BlockId> {
        assert!(addr != 0, "the pointer map cannot hold address 0");
        if 4 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let slot = self.slot_mut(i);
            if slot.0 == 0 {
                *slot = (addr, id);
                self.len += 1;
                return None;
            }
            if slot.0 == addr {
                return Some(std::mem::replace(&mut slot.1, id));
            }
            i = (i + 1) & mask;
        }
    }

    /// Takes `addr` out; returns the id it named.
    #[inline]
    pub fn remove(&mut self, addr: u64) -> Option<BlockId> {
        let mut hole = self.find(addr)?;
        let id = self.slot(hole).1;
        let mask = self.mask();
        // Shift back every later entry of the run that may sit in the hole: one whose home is
        // not cyclically inside (hole, j].
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let a = self.slot(j).0;
            if a == 0 {
                break;
            }
            let home = self.home(a);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                *self.slot_mut(hole) = *self.slot(j);
                hole = j;
            }
        }
        self.slot_mut(hole).0 = 0;
        self.len -= 1;
        Some(id)
    }

    /// The block `addr` names.
    #[inline]
    pub fn get(&self, addr: u64) -> Option<BlockId> {
        self.find(addr).map(|i| self.slot(i).1)
    }

    /// Whether `addr` is in the map.
    pub fn contains_key(&self, addr: u64) -> bool {
        self.find(addr).is_some()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.slots.iter().copied().filter(|&(a, _)| a != 0)
    }

    /// Doubles the table (or makes the first one) and re-enters every entry.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let capacity = (2 * self.slots.len()).max(FIRST_CAPACITY);
        let old = std::mem::replace(&mut self.slots, vec![(0, BlockId::MIN); capacity]);
        self.shift = 64 - capacity.trailing_zeros();
        self.len = 0;
        for (a, id) in old {
            if a != 0 {
                self.insert(a, id);
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
        m.slots.iter().enumerate().filter(|(_, s)| s.0 != 0).all(|(i, s)| {
            let mut k = m.home(s.0);
            while k != i {
                if m.slots[k].0 == 0 {
                    return false;
                }
                k = (k + 1) & mask;
            }
            true
        })
    }

    proptest! {
        #[test]
        fn answers_like_a_hashmap(ops in prop::collection::vec((1u64..2000, any::<bool>(), 1u32..1000), 1..3000)) {
            // Few distinct addresses, many operations: long probe runs, wrap-around, regrowth
            // and removals in the middle of runs all happen.
            let (mut m, mut want) = (PointerMap::default(), HashMap::new());
            for (k, add, id) in ops {
                let addr = k * 512;
                if add {
                    prop_assert_eq!(m.insert(addr, BlockId::new(id)), want.insert(addr, BlockId::new(id)));
                } else {
                    prop_assert_eq!(m.remove(addr), want.remove(&addr));
                }
                prop_assert_eq!(m.len(), want.len());
            }
            prop_assert!(reachable(&m));
            for k in 0..2100u64 {
                prop_assert_eq!(m.get(k * 512), want.get(&(k * 512)).copied());
                prop_assert_eq!(m.contains_key(k * 512), want.contains_key(&(k * 512)));
            }
            let mut got: Vec<_> = m.iter().collect();
            let mut all: Vec<_> = want.into_iter().collect();
            got.sort();
            all.sort();
            prop_assert_eq!(got, all);
        }
    }

    #[test]
    fn a_full_cycle_of_inserts_and_removes_leaves_it_empty() {
        let mut m = PointerMap::default();
        for round in 0..3u64 {
            for k in 1..5000u64 {
                assert_eq!(m.insert((k + round) << 20, BlockId::new(k as u32)), None);
            }
            assert!(reachable(&m));
            for k in (1..5000u64).rev() {
                assert_eq!(m.remove((k + round) << 20), Some(BlockId::new(k as u32)));
            }
            assert!(m.is_empty() && m.iter().next().is_none());
            assert_eq!(m.get(1 << 20), None);
        }
        assert_eq!(m.remove(512), None, "removing what is not there");
        assert_eq!(m.get(0), None);
    }

    #[test]
    #[should_panic(expected = "address 0")]
    fn address_zero_is_refused() {
        PointerMap::default().insert(0, BlockId::new(0));
    }
}
