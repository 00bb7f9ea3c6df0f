//! # The free index: best fit in constant time, per stream
//!
//! A pool's free blocks must be found in PyTorch's order — `(stream, size, address)` — because
//! best fit is "the first block at or after `(stream, size, 0)`": the smallest free block on the
//! caller's stream that is large enough, the lowest address among equals. A `BTreeSet` gives that
//! order in O(log n) with a pointer chase per level; this index gives the same answers with
//! segregated size classes, as TLSF does:
//!
//! * Each stream has its own [`StreamBins`].
//! * Sizes map to **size classes**: exact classes of 512 bytes up to 32 KiB, then 32 classes per
//!   power of two (a class spans ≤ 3% of its sizes). Each class is a small vector kept sorted by
//!   `(size, address)`, **largest first**, and a two-level **occupancy bitmap** says which
//!   classes are non-empty.
//! * Best fit for `size`: search `size`'s own class for the smallest entry ≥ `(size, 0)` (a
//!   scan of short classes, a binary search of long ones); if none, the smallest entry of the
//!   next non-empty class (one `trailing_zeros` per bitmap level). Every entry of a later class
//!   is larger than every entry of an earlier one, so this is exactly the `BTreeSet` answer.
//! * Largest first, because the block a best fit takes is then at the end of its vector as a
//!   rule (the smallest of its class), and taking it shifts nothing. Ascending, that take
//!   shifted the whole class: classes of many equal blocks (48 cached 96 MiB blocks in
//!   gpt2_train) made `memmove` 3% of a replayed operation.
//!
//! Invariant: an entry is in the class of its size, each class vector is sorted descending and
//! duplicate-free, and a class's bitmap bit is set iff its vector is non-empty. A [`Position`]
//! is an index into a class vector, so "next larger" is the index before it.

use cudamem_device::StreamId;

use crate::ids::{BlockId, SizeKey};

const EXACT_UNITS: u64 = 64; // sizes below 64 × 512 B get one class per 512 B
const SUB: u32 = 5; // 2^5 = 32 classes per power of two above that
/// Classes: every u64 size has one below 1664 (u64::MAX's); a power of two lets `class_of` say
/// so with one `and`, and the class vector's bounds check goes away.
const CLASSES: usize = 2048;
const WORDS: usize = CLASSES.div_ceil(64);

/// The size class of a size.
#[inline]
fn class_of(size: u64) -> usize {
    let units = size >> 9;
    // The log-spaced formula, from 32 units up (where it gives `units` too), chosen without a
    // branch: small and large sizes come mixed, and a branch here missed a quarter of the time.
    let u = units.max(EXACT_UNITS / 2);
    let e = 63 - u.leading_zeros(); // floor(log2(u)) >= 5
    let m = (u >> (e - SUB)) & ((1 << SUB) - 1);
    let logarithmic = (EXACT_UNITS as usize) + (e as usize) * (1 << SUB) + m as usize - 6 * (1 << SUB);
    std::hint::select_unpredictable(units < EXACT_UNITS, units as usize, logarithmic) & (CLASSES - 1)
}

/// `(size, addr)` as one number with the same order: one 128-bit comparison (two instructions)
/// where the tuple's took a branch per field.
#[inline(always)]
fn key(size: u64, addr: u64) -> u128 {
    ((size as u128) << 64) | addr as u128
}

/// The number of entries ≥ `(size, addr)` in a class vector (sorted descending): they come
/// first, so the smallest of them, if any, is at the result minus one, and the largest entry
/// below the key at the result. Classes hold a few entries as a rule (a class spans ≤ 3% of
/// sizes), where a scan beats a binary search.
#[inline]
fn at_or_above(v: &[(u64, u64, BlockId)], size: u64, addr: u64) -> usize {
    if v.len() <= 8 {
        v.iter().take_while(|e| key(e.0, e.1) >= key(size, addr)).count()
    } else {
        v.partition_point(|e| key(e.0, e.1) >= key(size, addr))
    }
}

/// `Vec::insert` without a call to `memmove` for the short tails of class vectors.
#[inline]
fn insert_at(v: &mut Vec<(u64, u64, BlockId)>, i: usize, e: (u64, u64, BlockId)) {
    if v.len() - i > 4 {
        return v.insert(i, e);
    }
    v.push(e);
    for j in (i + 1..v.len()).rev() {
        v.swap(j, j - 1);
    }
}

/// `Vec::remove` likewise.
#[inline]
fn remove_at(v: &mut Vec<(u64, u64, BlockId)>, i: usize) {
    if v.len() - i > 5 {
        v.remove(i);
        return;
    }
    for j in i + 1..v.len() {
        v.swap(j - 1, j);
    }
    v.pop();
}

/// The free blocks of one stream in one pool.
#[derive(Debug, Clone)]
pub struct StreamBins {
    classes: Box<[Vec<(u64, u64, BlockId)>; CLASSES]>,
    words: [u64; WORDS],
    summary: u64, // bit i: words[i] != 0 (WORDS <= 64)
}

impl Default for StreamBins {
    fn default() -> Self {
        StreamBins {
            classes: vec![Vec::new(); CLASSES]
                .into_boxed_slice()
                .try_into()
                .expect("CLASSES entries"),
            words: [0; WORDS],
            summary: 0,
        }
    }
}

impl StreamBins {
    #[inline]
    fn mark(&mut self, c: usize, on: bool) {
        let (w, b) = (c / 64, c % 64);
        if on {
            self.words[w] |= 1 << b;
            self.summary |= 1 << w;
        } else {
            self.words[w] &= !(1 << b);
            if self.words[w] == 0 {
                self.summary &= !(1 << w);
            }
        }
    }

    /// The first non-empty class at or after `c`.
    #[inline]
    fn next_class(&self, c: usize) -> Option<usize> {
        if c >= CLASSES {
            return None;
        }
        let (w, b) = (c / 64, c % 64);
        let here = self.words[w] & (!0u64 << b);
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        let later = if w + 1 >= 64 {
            0
        } else {
            self.summary & (!0u64 << (w + 1))
        };
        if later == 0 {
            return None;
        }
        let w2 = later.trailing_zeros() as usize;
        Some(w2 * 64 + self.words[w2].trailing_zeros() as usize)
    }

    /// The last non-empty class at or before `c`.
    fn prev_class(&self, c: usize) -> Option<usize> {
        let mut c = c as isize;
        while c >= 0 {
            let (w, b) = (c as usize / 64, c as usize % 64);
            let here = self.words[w] & (!0u64 >> (63 - b));
            if here != 0 {
                return Some(w * 64 + 63 - here.leading_zeros() as usize);
            }
            c = (w as isize) * 64 - 1;
        }
        None
    }

    #[inline]
    fn insert(&mut self, size: u64, addr: u64, id: BlockId) -> bool {
        let c = class_of(size);
        let v = &mut self.classes[c];
        if v.is_empty() {
            // Two inserts in three land in an empty class (gpt2_train): nothing to search.
            v.push((size, addr, id));
            self.mark(c, true);
            return true;
        }
        let i = at_or_above(v, size, addr);
        if i > 0 && (v[i - 1].0, v[i - 1].1) == (size, addr) {
            return false;
        }
        insert_at(v, i, (size, addr, id)); // the class was marked already
        true
    }

    #[inline]
    fn remove(&mut self, size: u64, addr: u64) -> bool {
        let c = class_of(size);
        let v = &mut self.classes[c];
        if let [only] = v.as_slice() {
            // Most removals take a class's only entry (inserts mostly fill empty classes).
            if (only.0, only.1) != (size, addr) {
                return false;
            }
            v.clear();
            self.mark(c, false);
            return true;
        }
        let i = at_or_above(v, size, addr);
        if i == 0 || (v[i - 1].0, v[i - 1].1) != (size, addr) {
            return false;
        }
        // The same steps as `StreamBins::remove_at`, written out: calling it here changes how
        // LLVM inlines the hot path around it.
        remove_at(v, i - 1);
        if v.is_empty() {
            self.mark(c, false);
        }
        true
    }

    /// The smallest entry of a non-empty class: its last.
    #[inline]
    fn smallest(&self, c: usize) -> (usize, usize) {
        (c, self.classes[c].len() - 1)
    }

    /// Position of the smallest entry ≥ `(size, addr)`.
    #[inline]
    fn lower_bound(&self, size: u64, addr: u64) -> Option<(usize, usize)> {
        let c = class_of(size);
        let i = at_or_above(&self.classes[c], size, addr);
        if i > 0 {
            return Some((c, i - 1));
        }
        self.next_class(c + 1).map(|c| self.smallest(c))
    }

    /// Position of the largest entry < `(size, addr)`.
    fn below(&self, size: u64, addr: u64) -> Option<(usize, usize)> {
        let c = class_of(size);
        let v = &self.classes[c];
        let i = at_or_above(v, size, addr);
        if i < v.len() {
            return Some((c, i));
        }
        let pc = self.prev_class(c.checked_sub(1)?)?;
        Some((pc, 0))
    }

    /// The next larger entry.
    fn advance(&self, (c, i): (usize, usize)) -> Option<(usize, usize)> {
        if i > 0 {
            Some((c, i - 1))
        } else {
            self.next_class(c + 1).map(|c| self.smallest(c))
        }
    }

    /// The next smaller entry.
    fn retreat(&self, (c, i): (usize, usize)) -> Option<(usize, usize)> {
        if i + 1 < self.classes[c].len() {
            Some((c, i + 1))
        } else {
            let pc = self.prev_class(c.checked_sub(1)?)?;
            Some((pc, 0))
        }
    }

    #[inline]
    fn at(&self, (c, i): (usize, usize)) -> (u64, u64, BlockId) {
        self.classes[c][i]
    }

    #[inline]
    fn remove_at(&mut self, (c, i): (usize, usize)) {
        let v = &mut self.classes[c];
        remove_at(v, i);
        if v.is_empty() {
            self.mark(c, false);
        }
    }
}

/// Where a free block sits in a [`FreeIndex`]: valid until the index next changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    stream: usize,
    at: (usize, usize),
}

/// A pool's free blocks, ordered as `(stream, size, address)`. See the
/// [module documentation](self).
#[derive(Debug, Clone, Default)]
pub struct FreeIndex {
    streams: Vec<(StreamId, StreamBins)>, // sorted by stream
    len: usize,
}

impl FreeIndex {
    #[inline]
    fn stream(&self, s: StreamId) -> Option<&StreamBins> {
        self.streams.iter().find(|(k, _)| *k == s).map(|(_, b)| b)
    }

    /// Adds a free block; false if it was there.
    #[inline]
    pub fn insert(&mut self, k: SizeKey) -> bool {
        let bins = match self.streams.iter_mut().find(|(s, _)| *s == k.0) {
            Some((_, b)) => b,
            None => {
                let p = self.add_stream(k.0);
                &mut self.streams[p].1
            }
        };
        let added = bins.insert(k.1, k.2, k.3);
        self.len += added as usize;
        added
    }

    /// A stream's first free block: its bins, in stream order (out of line: it happens once).
    #[cold]
    #[inline(never)]
    fn add_stream(&mut self, s: StreamId) -> usize {
        let p = self.streams.partition_point(|(k, _)| *k < s);
        self.streams.insert(p, (s, StreamBins::default()));
        p
    }

    /// Removes a free block; false if it was not there.
    #[inline]
    pub fn remove(&mut self, k: &SizeKey) -> bool {
        let Some(b) = self.streams.iter_mut().find(|(s, _)| *s == k.0) else {
            return false;
        };
        let removed = b.1.remove(k.1, k.2);
        self.len -= removed as usize;
        removed
    }

    /// The best fit's position: the first block of `stream` at or after `(size, 0)`.
    #[inline]
    pub fn first_fit(&self, stream: StreamId, size: u64) -> Option<Position> {
        let s = self.streams.iter().position(|(k, _)| *k == stream)?;
        let at = self.streams[s].1.lower_bound(size, 0)?;
        Some(Position { stream: s, at })
    }

    /// The block at a position.
    #[inline]
    pub fn key_at(&self, p: Position) -> SizeKey {
        let (stream, bins) = &self.streams[p.stream];
        let (sz, a, id) = bins.at(p.at);
        (*stream, sz, a, id)
    }

    /// The next block of the same stream in `(size, address)` order.
    #[inline]
    pub fn next_position(&self, p: Position) -> Option<Position> {
        let at = self.streams[p.stream].1.advance(p.at)?;
        Some(Position { stream: p.stream, at })
    }

    /// Removes the block at a position (no second search, unlike [`FreeIndex::remove`]).
    #[inline]
    pub fn remove_at(&mut self, p: Position) {
        self.streams[p.stream].1.remove_at(p.at);
        self.len -= 1;
    }

    /// Number of free blocks.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The blocks of `stream` from the first at or after `(size, 0)`, ascending.
    pub fn from_size(&self, stream: StreamId, size: u64) -> impl Iterator<Item = SizeKey> + '_ {
        let mut pos = self.first_fit(stream, size);
        std::iter::from_fn(move || {
            let p = pos?;
            pos = self.next_position(p);
            Some(self.key_at(p))
        })
    }

    /// The blocks of `stream` before `(size, 0)`, descending.
    pub fn below_size(&self, stream: StreamId, size: u64) -> impl Iterator<Item = SizeKey> + '_ {
        let bins = self.stream(stream);
        let mut pos = bins.and_then(|b| b.below(size, 0));
        std::iter::from_fn(move || {
            let b = bins?;
            let p = pos?;
            pos = b.retreat(p);
            let (sz, a, id) = b.at(p);
            Some((stream, sz, a, id))
        })
    }

    /// The last key below `k` in `(stream, size, address)` order, across streams.
    pub fn prev_key(&self, k: Option<SizeKey>) -> Option<SizeKey> {
        let start = match k {
            None => self.streams.len(),
            Some(k) => {
                let p = self.streams.partition_point(|(s, _)| *s < k.0);
                if let Some((s, b)) = self.streams.get(p).filter(|(s, _)| *s == k.0) {
                    if let Some(pos) = b.below(k.1, k.2) {
                        let (sz, a, id) = b.at(pos);
                        return Some((*s, sz, a, id));
                    }
                }
                p
            }
        };
        self.streams[..start].iter().rev().find_map(|(s, b)| {
            let c = b.prev_class(CLASSES - 1)?;
            let (sz, a, id) = *b.classes[c].first()?;
            Some((*s, sz, a, id))
        })
    }

    /// Every free block, ascending by `(stream, size, address)`.
    pub fn iter(&self) -> impl Iterator<Item = SizeKey> + '_ {
        self.streams.iter().flat_map(|(s, b)| {
            let s = *s;
            b.classes
                .iter()
                .flat_map(move |v| v.iter().rev().map(move |&(sz, a, id)| (s, sz, a, id)))
        })
    }

    /// The largest free block size.
    pub fn max_size(&self) -> Option<u64> {
        self.streams
            .iter()
            .filter_map(|(_, b)| {
                b.prev_class(CLASSES - 1)
                    .and_then(|c| b.classes[c].first().map(|e| e.0))
            })
            .max()
    }
}

#[cfg(test)]
mod tests;
