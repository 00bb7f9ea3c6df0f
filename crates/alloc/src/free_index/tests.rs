//! Unit tests of `free_index`: they use its private items.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

#[test]
fn classes_are_monotone() {
    let mut last = 0;
    for s in (0..(1u64 << 26)).step_by(512).chain([1 << 30, 1 << 40, u64::MAX]) {
        let c = class_of(s);
        assert!(c >= last && c < CLASSES, "{s}");
        last = c;
    }
}

/// The branch-free `class_of` against its definition: one class per 512 B below 64 units,
/// then 32 per power of two.
#[test]
fn classes_follow_their_definition() {
    let reference = |size: u64| {
        let units = size >> 9;
        if units < EXACT_UNITS {
            return units as usize;
        }
        let e = 63 - units.leading_zeros();
        let m = (units >> (e - SUB)) & ((1 << SUB) - 1);
        (EXACT_UNITS as usize) + ((e - 6) as usize) * (1 << SUB) + m as usize
    };
    let edges = (0..64).flat_map(|b| {
        let p = 1u64 << b;
        [p - 1, p, p + 1, p | (p >> 1), p + 511]
    });
    for s in (0..(1u64 << 24)).step_by(173).chain(edges).chain([u64::MAX]) {
        assert_eq!(class_of(s), reference(s), "{s}");
    }
}

proptest! {
    #[test]
    fn answers_like_a_btreeset(ops in prop::collection::vec((0u64..3, 1u64..200_000, 0u64..64, any::<bool>()), 1..300), q in 1u64..300_000) {
        let mut idx = FreeIndex::default();
        let mut set = BTreeSet::new();
        for (s, sz, a, add) in ops {
            let k = (StreamId(s), sz * 512, a * 4096, BlockId::new(a as u32));
            if add { prop_assert_eq!(idx.insert(k), set.insert(k)); } else { prop_assert_eq!(idx.remove(&k), set.remove(&k)); }
        }
        prop_assert_eq!(idx.len(), set.len());
        prop_assert_eq!(idx.iter().collect::<Vec<_>>(), set.iter().copied().collect::<Vec<_>>());
        for s in 0..3 {
            let st = StreamId(s);
            let want: Vec<_> = set.range((st, q * 512, 0, BlockId::MIN)..).take_while(|k| k.0 == st).copied().collect();
            prop_assert_eq!(idx.from_size(st, q * 512).collect::<Vec<_>>(), want);
            let want: Vec<_> = set.range(..(st, q * 512, 0, BlockId::MIN)).rev().take_while(|k| k.0 == st).copied().collect();
            prop_assert_eq!(idx.below_size(st, q * 512).collect::<Vec<_>>(), want);
        }
        let mut cur = None;
        let mut down = Vec::new();
        while let Some(k) = idx.prev_key(cur) { down.push(k); cur = Some(k); }
        prop_assert_eq!(down, set.iter().rev().copied().collect::<Vec<_>>());
        prop_assert_eq!(idx.max_size(), set.iter().map(|k| k.1).max());
        // Taking best fits by position removes what the ordered set's range gives.
        for s in 0..3 {
            let st = StreamId(s);
            let want = set.range((st, q * 512, 0, BlockId::MIN)..).find(|k| k.0 == st).copied();
            let got = idx.first_fit(st, q * 512);
            prop_assert_eq!(got.map(|p| idx.key_at(p)), want);
            if let (Some(p), Some(k)) = (got, want) {
                if let Some(n) = idx.next_position(p) {
                    let after = set.range((st, k.1, k.2 + 1, BlockId::MIN)..).find(|x| x.0 == st).copied();
                    prop_assert_eq!(Some(idx.key_at(n)), after);
                }
                idx.remove_at(p);
                set.remove(&k);
                prop_assert_eq!(idx.len(), set.len());
                prop_assert_eq!(idx.iter().collect::<Vec<_>>(), set.iter().copied().collect::<Vec<_>>());
            }
        }
    }
}
